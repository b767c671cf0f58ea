"""DFlash (`jspec.DFlash`): block drafting from the target's fused features.

A random DFlash over a tiny target: greedy speculative output equals plain greedy output for
chains of every K the block allows and for a static tree, over ragged batches, with
log-probabilities and with a constraint; the drafter's context cache holds, at every slot
the rounds have written, what the target's own features give, through drafting rounds and
"auto"'s plain ones (`observe`); the speculators and z-lab layouts round-trip; every bad
input fails with a clear error before tracing. Slow lane: whole-sequence enumeration at
T = 1 and T = 0.7 with top-3, chain and tree (the engine's exactness with DFlash's
per-position q), and "auto" end to end.
"""

import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import assert_greedy_match, ragged_prompts, tiny_config
from jspec.core import dynamic, schedule
from jspec.core.drafter import (BlockDrafter, BoundedDrafter, FeatureDrafter, ObservingDrafter,
                                TreeCheckingDrafter, TreeDrafter, target_for)
from jspec.drafters import dflash as DF
from jspec.io import drafter_layouts as PD
from jspec.io import layout_dflash as LD

V, BS, MASK = 16, 4, 15
TREE = jspec.Tree.from_paths([(0, 0, 0), (0, 1), (1, 0), (2,)])


def dflash_config(target, **overrides):
  c = target.config
  fields = dict(hidden_size=c.hidden_size, vocab_size=c.vocab_size, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, intermediate_size=48, num_layers=2,
                block_size=BS, mask_token_id=c.vocab_size - 1, feature_layers=(0, 1),
                initializer_range=0.3)
  fields.update(overrides)
  return DF.DFlashConfig(**fields)


def make_dflash(target, seed=0, scale=1.0, **overrides):
  config = dflash_config(target, **overrides)
  params = DF.init_params(config, jax.random.key(seed))
  if scale != 1.0:
    params = jax.tree_util.tree_map(lambda x: x * scale, params)
  return jspec.DFlash.from_target(target, params, config)


@pytest.fixture(scope="module")
def target():
  return jspec.models.init(tiny_config(vocab_size=V, layers=2, hidden=32, heads=4, kv_heads=2),
                           seed=3)


@pytest.fixture(scope="module")
def drafter(target):
  return make_dflash(target)


def test_capabilities(drafter):
  for protocol in (FeatureDrafter, ObservingDrafter, TreeDrafter, TreeCheckingDrafter,
                   BoundedDrafter, BlockDrafter):
    assert isinstance(drafter, protocol), protocol.__name__
  assert drafter.max_draft_tokens == BS - 1 and drafter.feature_layers == (0, 1)
  leaves = jax.tree_util.tree_leaves(drafter)
  assert any(x is drafter.embed for x in leaves)  # the target's table, a leaf (not copied)


def test_auto_prices_one_pass_whatever_k(target, drafter):
  """"auto"'s prior: a DFlash round is one pass of its block (`BlockDrafter`), the same at
  every K, where a head drafting one token a pass costs K passes."""
  from jspec.planner import cost_model
  rates = cost_model.DeviceRates(bandwidth=1e10, rows=(1, 512), compute=(1e10, 1e12))
  times = [cost_model.drafter_time(drafter, 2, k, 64, rates) for k in (1, 2, 3)]
  assert times[0] > 0 and times[0] == times[1] == times[2]
  costs = cost_model.prior_costs(target, drafter, 2, 64, (0, 1, 3), rates)
  assert costs[2] > costs[1] > costs[0] > 0  # the verify still grows with K


@pytest.mark.parametrize("k", [1, pytest.param(2, marks=pytest.mark.slow), 3])
def test_greedy_chain_equals_generate(target, drafter, k):
  prompts = ragged_prompts(4, V, seed=5, min_len=1, max_len=9)
  kw = dict(max_new_tokens=24, eos_id=())
  base = jspec.generate(target, prompts, **kw)
  out = jspec.speculative_generate(target, drafter, prompts, num_draft_tokens=k, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))
  hist = np.asarray(out.stats.accept_hist)
  assert hist[1:].sum() > 0, f"no draft was ever accepted: {hist}"


def test_greedy_tree_equals_generate(target, drafter):
  prompts = ragged_prompts(3, V, seed=7, min_len=1, max_len=9)
  kw = dict(max_new_tokens=20, eos_id=())
  base = jspec.generate(target, prompts, **kw)
  out = jspec.speculative_generate(target, drafter, prompts, tree=TREE, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_tree_candidates_are_the_block_slots_ranks(target, drafter):
  """Node i is the ranks[i]-th best token of block slot depths[i], as in a chain's logits."""
  B, S = 2, 32
  prompts = jnp.asarray(np.random.default_rng(2).integers(0, V, size=(B, 9)), jnp.int32)
  lengths = jnp.asarray([9, 5], jnp.int32)
  feats = target_for(target, drafter).apply(prompts, None, jnp.zeros((B,), jnp.int32))[1]
  cache = drafter.init(prompts[:, :1], lengths, S, feats[:, :0])
  ctx = jspec.core.drafter.DraftContext(
      tokens=jnp.zeros((B, S), jnp.int32).at[:, :9].set(prompts), lengths=lengths,
      features=feats, feature_start=jnp.zeros((B,), jnp.int32))
  cands, cache = drafter.propose_tree(cache, ctx, TREE)
  logits = np.asarray(drafter.block_logits(cache, ctx, TREE.max_depth))  # [B, 3, V]
  order = np.argsort(-logits, axis=-1, kind="stable")
  want = np.stack([order[:, d - 1, r] for d, r in zip(TREE.depths[1:], TREE.ranks[1:])], 1)
  np.testing.assert_array_equal(np.asarray(cands), want)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_logprobs_and_constraint(target, drafter):
  """Greedy: the same tokens and log-probabilities as plain decoding, with and without a
  regex constraint (DFlash ignores it; verification rejects what it forbids)."""
  prompts = ragged_prompts(3, V, seed=9, min_len=2, max_len=7)
  request = jspec.Logprobs(raw=True, top=2)
  base = jspec.generate(target, prompts, max_new_tokens=10, return_logprobs=request)
  spec = jspec.speculative_generate(target, drafter, prompts, num_draft_tokens=3,
                                    max_new_tokens=10, return_logprobs=request)
  np.testing.assert_array_equal(base.tokens, spec.tokens)
  np.testing.assert_allclose(base.logprobs, spec.logprobs, atol=1e-5)
  np.testing.assert_array_equal(base.top_ids, spec.top_ids)
  vocab = ["a", "b", "c", "-", "0", "1", "2", "3", "x", "y", "ab", "12", "z", "q", "w", "<e>"]
  regex = jspec.Constraint.from_regex(r"[a-c]{1,3}-[0-9]{2}", vocab, eos_ids=[V - 1])
  kw = dict(max_new_tokens=10, eos_id=[V - 1], constraint=regex)
  base = jspec.generate(target, prompts, **kw)
  spec = jspec.speculative_generate(target, drafter, prompts, num_draft_tokens=2, **kw)
  np.testing.assert_array_equal(base.tokens, spec.tokens)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_context_cache_stays_true_through_plain_rounds(target, drafter):
  """After drafting and plain rounds in any order ("auto"), the drafter's context K/V at
  every slot before the state's feature_start equal those of the target's own features
  over the committed tokens: `observe` keeps them so in rounds that do not draft."""
  from jspec.core import decode
  auto = schedule.AutoK(choices=(0, 2), costs=(1.0, 1.5))
  B, S = 2, 64
  tokens = jnp.asarray(np.random.default_rng(6).integers(0, V, size=(B, 12)), jnp.int32)
  lengths = jnp.asarray([12, 7], jnp.int32)
  config = decode.DecodeConfig(auto.max_k, S)

  @jax.jit
  def run(target, drafter, tokens, lengths):
    state = dynamic.init_state(target, drafter, tokens, lengths, jnp.full((B,), 30, jnp.int32),
                               None, jnp.zeros((0,), jnp.int32), jnp.arange(B, dtype=jnp.int32),
                               auto.costs, config, auto)
    for index in (1, 0, 0, 1, 0):  # K = 2, 0, 0, 2, 0
      state = dynamic.fixed_round(target, drafter, state, config, auto, index)
    return state.decode

  s = run(target, drafter, tokens, lengths)
  L, fs = np.asarray(s.lengths), np.asarray(s.feature_start)
  committed = s.tokens[:, :int(L.max())]
  feats = target_for(target, drafter).apply(committed, None, jnp.zeros((B,), jnp.int32))[1]
  positions = jnp.broadcast_to(jnp.arange(committed.shape[1], dtype=jnp.int32), committed.shape)
  k, v = DF.context_kv(drafter.config, drafter.params, feats, positions)
  for b in range(B):
    assert fs[b] > lengths[b]  # rounds of both kinds have run past the prompt
    for name, want in (("k", k), ("v", v)):
      np.testing.assert_allclose(np.asarray(s.drafter_state[name][:, b, :, :fs[b]]),
                                 np.asarray(want[:, b, :, :fs[b]]), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- layouts


def test_layouts_round_trip(target, tmp_path):
  """speculators export -> load gives the same drafter (full and reduced vocabulary); a z-lab
  directory of the same tensors loads to it too."""
  deep = jspec.models.init(tiny_config(vocab_size=V, layers=3, hidden=32), seed=4)
  drafter = make_dflash(deep)
  reduced = drafter.reduced([0, 2, 3, 5, 8, 13])
  for name, d in (("full", drafter), ("reduced", reduced)):
    out = PD.export_drafter(d, tmp_path / name, "speculators", verifier="tiny")
    assert PD.detect_layout(out) == LD.SPECULATORS
    back = jspec.load_drafter(out, deep, dtype="float32")
    assert back.config == d.config and back.layout == LD.SPECULATORS
    for a, b in zip(jax.tree_util.tree_leaves(d.params), jax.tree_util.tree_leaves(back.params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    if d.ids is not None:
      np.testing.assert_array_equal(np.asarray(back.ids), np.asarray(d.ids))
      np.testing.assert_array_equal(np.asarray(back.rows), np.asarray(d.rows))
    with open(os.path.join(out, "config.json")) as f:
      cfg = json.load(f)
    assert cfg["aux_hidden_state_layer_ids"] == [1, 2] and cfg["block_size"] == BS
  zlab = tmp_path / "zlab"
  zlab.mkdir()
  shutil.copy(tmp_path / "full" / "model.safetensors", zlab)
  with open(tmp_path / "full" / "config.json") as f:
    layer = json.load(f)["transformer_layer_config"]
  (zlab / "config.json").write_text(json.dumps(dict(
      layer, architectures=["DFlashDraftModel"], block_size=BS, num_target_layers=2,
      dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 1]})))
  # jspec's own numbering; the target has 2 layers, so layer 1's output is the final normed
  # state in the reference's hidden_states: refused
  with pytest.raises(ValueError, match=r"ids must lie in \[0, 0\]: id 1 reads the final"):
    jspec.load_drafter(zlab, target)
  back = jspec.load_drafter(zlab, deep)
  assert back.layout == LD.ZLAB and back.feature_layers == (0, 1) and back.ids is None
  # What z-lab's code reads that jspec's DFlash does not run is refused, not ignored: DFlash 2
  # (its convolutions and candidate selector), scaled embeddings or logits, causal layers.
  base = json.loads((zlab / "config.json").read_text())
  for change, message in [
      (dict(architectures=["DFlash2DraftModel"]), "DFlash 2 drafter"),
      (dict(dflash_config=dict(base["dflash_config"], conv_kernel_size=4)),
       r"DFlash 2 drafter \(conv_kernel_size"),
      (dict(selector_rank=8), r"DFlash 2 drafter \(selector_rank"),
      (dict(dflash_config=dict(base["dflash_config"], input_embedding_scale=2.0)),
       "input_embedding_scale 2.0 is not supported"),
      (dict(output_multiplier=0.5), "output_multiplier 0.5 is not supported"),
      (dict(final_logit_softcapping=30.0), "final_logit_softcapping is not supported"),
      (dict(is_causal=True), "is_causal=true is not supported"),
      # as z-lab's code reads them: dflash_config's value first, then the config's
      (dict(dflash_config=dict(base["dflash_config"], block_size=1)),
       "block_size must be an integer >= 2"),
      (dict(dflash_config={"target_layer_ids": [0, 1]}), "mask_token_id missing")]:
    (zlab / "config.json").write_text(json.dumps(dict(base, **change)))
    with pytest.raises(ValueError, match=message):
      jspec.load_drafter(zlab, deep)


def _layout_dir(drafter, tmp_path, name="d", edit=None):
  out = PD.export_drafter(drafter, tmp_path / name, "speculators")
  if edit is not None:
    file = os.path.join(out, "config.json")
    with open(file) as f:
      cfg = json.load(f)
    edit(cfg)
    with open(file, "w") as f:
      json.dump(cfg, f)
  return out


def test_bad_input_is_a_clear_error(target, drafter, tmp_path):
  deep = jspec.models.init(tiny_config(vocab_size=V, layers=4, hidden=32), seed=4)
  d = make_dflash(deep)
  wide = jspec.models.init(tiny_config(vocab_size=V, layers=4, hidden=48), seed=4)
  other_vocab = jspec.models.init(tiny_config(vocab_size=V + 1, layers=4, hidden=32), seed=4)
  good = _layout_dir(d, tmp_path, "good")
  with pytest.raises(ValueError, match=r"config.json: hidden size 32, but the target's is 48"):
    jspec.load_drafter(good, wide)
  with pytest.raises(ValueError, match=r"vocabulary size 16, but the target's is 17"):
    jspec.load_drafter(good, other_vocab)

  def edit(**fields):
    return lambda cfg: cfg.update(fields)

  def layer(**fields):
    return lambda cfg: cfg["transformer_layer_config"].update(fields)

  for i, (change, message) in enumerate([
      (edit(aux_hidden_state_layer_ids=[1, 4]), r"auxiliary layer ids \[1, 4\] do not fit the "
       r"target's 4 layers \(this layout's ids must lie in \[1, 3\]: id 0 is the embeddings"),
      (edit(aux_hidden_state_layer_ids=[1]), r"tensor fc.weight has shape \(32, 64\), but "),
      (edit(sample_from_anchor=True), "sample_from_anchor=true is not supported"),
      (edit(mask_token_id=None), "mask_token_id missing"),
      (edit(block_size=1), "block_size must be an integer >= 2"),
      (edit(target_hidden_size=64), "target_hidden_size 64 differs"),
      (layer(layer_types=["sliding_attention", "full_attention"], sliding_window=8),
       "sliding-window layers are not supported"),
      (layer(num_hidden_layers=3), r"tensor layers.2.input_layernorm.weight is missing"),
  ]):
    with pytest.raises(ValueError, match=message):
      jspec.load_drafter(_layout_dir(d, tmp_path, f"e{i}", change), deep)
  # d2t outside the vocabulary, misshapen and truncated tensors
  reduced = _layout_dir(d.reduced([1, 2, 3]), tmp_path, "reduced")
  from jspec.io import layout_tensors as T
  tensors = {n: T.open_tensors(reduced).get(n) for n in T.open_tensors(reduced).names}
  tensors["d2t"] = np.asarray([0, 0, 30], np.int64)
  T.write_safetensors(os.path.join(reduced, "model.safetensors"), tensors)
  with pytest.raises(ValueError, match=r"model.safetensors: d2t maps draft id 2 to target id 32, "
                                       r"outside the target's vocabulary of 16"):
    jspec.load_drafter(reduced, deep)
  tensors["norm.weight"] = np.ones((31,), np.float32)
  T.write_safetensors(os.path.join(reduced, "model.safetensors"), tensors)
  with pytest.raises(ValueError, match=r"model.safetensors: tensor norm.weight has shape \(31,\), "
                                       r"but .*hidden 32"):
    jspec.load_drafter(reduced, deep)
  file = os.path.join(good, "model.safetensors")
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) - 100)
  with pytest.raises(ValueError, match=r"model.safetensors is truncated: tensor"):
    jspec.load_drafter(good, deep)
  with pytest.raises(ValueError, match="writes .* not 'specforge'|speculators layout"):
    PD.export_drafter(d, tmp_path / "sf", "specforge")


def test_bad_drafts_are_refused_before_tracing(target, drafter):
  prompts = [[1, 2, 3]]
  run = functools.partial(jspec.speculative_generate, max_new_tokens=4)
  with pytest.raises(ValueError, match="num_draft_tokens=4, but DFlash drafts at most 3"):
    run(target, drafter, prompts, num_draft_tokens=4)
  with pytest.raises(ValueError, match=r"\"auto\" may draft up to 6, but DFlash drafts at most 3"):
    run(target, drafter, prompts, num_draft_tokens="auto")
  with pytest.raises(ValueError, match="the tree is 4 deep, but this DFlash drafter's block"):
    run(target, drafter, prompts, tree=jspec.Tree.from_paths([(0, 0, 0, 0)]))
  with pytest.raises(ValueError, match="tree rank 2 is outside the drafter's vocabulary of 2"):
    run(target, drafter.reduced([3, 4]), prompts, tree=jspec.Tree.from_paths([(2,)]))


def test_config_and_params_errors(target, drafter):
  with pytest.raises(ValueError, match="block_size must be an integer >= 2"):
    dflash_config(target, block_size=1)
  with pytest.raises(ValueError, match=r"mask_token_id 16 is outside the vocabulary \[0, 16\)"):
    dflash_config(target, mask_token_id=16)
  with pytest.raises(ValueError, match="feature_layers must be a non-empty tuple"):
    dflash_config(target, feature_layers=())
  config = dflash_config(target)
  with pytest.raises(ValueError, match=r"does not fit the target \(hidden 32, vocab 16\)"):
    jspec.DFlash.from_target(target, drafter.params, dflash_config(target, vocab_size=17))
  with pytest.raises(ValueError, match="feature layer|layer"):
    jspec.DFlash.from_target(target, drafter.params, dflash_config(target, feature_layers=(0, 5)))
  bad = dict(drafter.params, fc={"kernel": jnp.zeros((32, 32))})
  with pytest.raises(ValueError, match=r"tensor \['fc'\]\['kernel'\] has shape \(32, 32\)"):
    jspec.DFlash.from_target(target, bad, config)
  with pytest.raises(ValueError, match="rows must be"):
    drafter.reduced([1, 2], rows=jnp.zeros((3, 32)))


# ----------------------------------------------------------------------------- slow lane


@pytest.mark.slow
def test_auto_greedy_equals_generate(target, drafter):
  prompts = ragged_prompts(3, V, seed=44)
  kw = dict(max_new_tokens=30, eos_id=())
  base = jspec.generate(target, prompts, **kw)
  auto = jspec.AutoK(choices=(0, 1, 3), costs=(1.0, 1.05, 1.1), probe_every=2)
  out = jspec.speculative_generate(target, drafter, prompts, num_draft_tokens=auto, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_whole_sequence_distribution(temperature, top_k, shape):
  """A random DFlash (peaked, often wrong) on the enumeration pair's target: chains sample
  their drafts per block slot and pass each slot's q; trees take ranked candidates. Every
  emitted 3-token sequence follows the target's processed distribution."""
  import test_distribution as E
  config = tiny_config(vocab_size=E.V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  target = jspec.models.init(config, seed=21)
  d = make_dflash(target, seed=5, scale=3.0, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=8, intermediate_size=32, num_layers=1, block_size=3,
                  mask_token_id=E.V - 1, feature_layers=(0,))
  exact = E.exact_distribution(target, temperature, top_k)
  kw = (dict(num_draft_tokens=2) if shape == "chain"
        else dict(tree=jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0)])))
  spec = jspec.speculative_generate(target, d, [E.PROMPT] * E.ROWS, max_new_tokens=E.NEW,
                                    temperature=temperature, top_k=top_k, seed=2031, **kw)
  E.assert_exact_counts(spec, exact, f"DFlash {shape}")


@pytest.mark.slow
def test_profile_times_rounds_of_a_fused_feature_drafter(target, drafter, tmp_path):
  """`jspec profile` times plain rounds with the features the drafter reads (its fused width),
  then "auto" decodes with the saved costs: greedy output equals the baseline."""
  from jspec.tools.profile import profile_auto
  auto = profile_auto(target, drafter, 2, 64, auto=jspec.AutoK(choices=(0, 1, 3)),
                      cache_dir=str(tmp_path), calls=2, repeats=1)
  assert len(auto.costs) == 3 and all(c > 0 for c in auto.costs)
  prompts = [[1, 2, 3], [4, 5]]
  base = jspec.generate(target, prompts, max_new_tokens=12, eos_id=())
  out = jspec.speculative_generate(target, drafter, prompts, num_draft_tokens=auto,
                                   max_new_tokens=12, eos_id=())
  np.testing.assert_array_equal(np.asarray(base.tokens), np.asarray(out.tokens))
