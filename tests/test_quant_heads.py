"""Drafters that share the target's output head over an int8 target.

Medusa heads, EAGLE-1 and EAGLE-3 heads, MTP modules, DFlash and the reduced-vocabulary
drafters (`Eagle.reduced`, `DFlash.reduced`, `DraftModel.reduced`) read the target's token
embedding and LM head through `Model.head()`, which for a model quantized by
`quantize_model(target, "int8")` hands them the int8 head as the target holds it
(`models/transformer.py`, `output_head`). Checked here, with tiny random targets made int8:

  - every such drafter holds that int8 head itself (the target's own arrays: no float copy
    of a [V, D] table), its reduced rows are the dequantized head's rows (q * scale), and
    it computes the int8 target's own logits from the target's hidden state (so the drafts
    are the int8 model's, not its float original's);
  - greedy speculative decoding with each drafter over the int8 target returns the int8
    target's own greedy output (plain decoding of the int8 model; the near-tie rule of
    docs/architecture.md), for chains over K and batch, static trees and EAGLE-2 dynamic
    trees, untied and tied embeddings, and a bf16 int8 target (slow lane); drafts are
    accepted in every run that asserts it, so the rewinds and the feature hand-over run;
  - sampled (T = 1): whole-sequence counts against the int8 target's enumerated
    distribution (test_distribution's helpers) with an EAGLE chain and a Medusa tree
    (slow lane).

The drafters are built as their own tests build them (test_medusa's `random_heads`,
test_eagle's and test_eagle3's configs, test_dflash's `make_dflash`, test_mtp's
`mtp_config` and `mtp_dir`), over the int8 copy of the targets those tests use.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import assert_greedy_match, jit_apply, numpy_drawn_target, tiny_config
from jspec.core import quant
from jspec.drafters import eagle as E
from jspec.drafters import medusa
from jspec.drafters import vocab_subset
from jspec.drafters.medusa import Medusa
from jspec.drafters.mtp import MTP, mtp_config
from jspec.models import transformer
from test_dflash import make_dflash
from test_medusa import random_heads

# test_eagle's prompts: ragged, one of length 1 (no feature yet), tokens < 16 (every vocabulary
# here; DFlash's mask token is V - 1 = 15).
PROMPTS = [[3, 1, 4, 1, 5], [9], [2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
# Batch 1: the length-1 prompt, the row whose drafts the heads here get right now and then.
BATCHES = {1: [PROMPTS[1]], 3: PROMPTS}
NEW = 24
TREE = jspec.Tree.from_paths([(0, 0, 0), (0, 1), (1, 0), (2,)])  # test_medusa's, test_dflash's
EAGLE_TREE = jspec.Tree(parents=(-1, 0, 0, 1, 1, 2, 3), ranks=(0, 0, 1, 0, 1, 0, 0))
DYNAMIC = jspec.DynamicTree(depth=3, top_k=2, nodes=6)  # test_mtp's
SLOW = pytest.mark.slow


def _int8(model):
  """`model` quantized by `quantize_model(model, "int8")`, checked to be int8."""
  q = transformer.quantize_model(model, "int8")
  assert quant.is_quantized(q.params) and not quant.is_quantized(model.params)
  return q


def _tied(model):
  """`model`'s weights with tied embeddings (no lm_head), as test_medusa's `tied_target`."""
  params = {k: v for k, v in model.params.items() if k != "lm_head"}
  return jspec.models.make_model(dataclasses.replace(model.config, tie_word_embeddings=True),
                                 params)


def _bf16(model):
  return jspec.models.make_model(model.config, jax.tree_util.tree_map(
      lambda x: x.astype(jnp.bfloat16), model.params))


@pytest.fixture(scope="module")
def targets(target):
  """name -> (float target, its int8 copy), made on first use:
  "zoo"    the suite's tiny decoder (V 64, D 32; conftest `target`), Medusa's tests' target
  "tied"   the same weights with tied embeddings
  "drawn"  test_eagle's NumPy-drawn decoder (V 48, D 32): EAGLE, EAGLE-3
  "mtp"    test_mtp's NumPy-drawn decoder (V 40, D 32): MTP
  "small"  test_dflash's decoder (V 16): DFlash
  "bf16"   "drawn" in bfloat16"""
  makers = {
      "zoo": lambda: target,
      "tied": lambda: _tied(target),
      "drawn": lambda: numpy_drawn_target(48),
      "mtp": lambda: numpy_drawn_target(40),
      "small": lambda: jspec.models.init(tiny_config(vocab_size=16, layers=2, hidden=32,
                                                     heads=4, kv_heads=2), seed=3),
      "bf16": lambda: _bf16(numpy_drawn_target(48)),
  }
  made = {}

  def get(name):
    if name not in made:
      model = makers[name]()
      made[name] = (model, _int8(model))
    return made[name]

  return get


@pytest.fixture(scope="module")
def greedy():
  """(int8 target, batch) -> the int8 target's own greedy tokens, NEW of them per row."""
  done = {}

  def get(int8, batch):
    key = (id(int8), batch)
    if key not in done:
      done[key] = np.asarray(jspec.generate(int8, BATCHES[batch], max_new_tokens=NEW,
                                            eos_id=()).tokens)
    return done[key]

  return get


def _speculative(int8, drafter, batch, want, accepts=True, **shape):
  """Speculative decoding over the int8 target equals `want` (its plain greedy output);
  with `accepts`, some drafts were accepted (the test is not vacuous). Returns the stats."""
  prompts = BATCHES[batch]
  out = jspec.speculative_generate(int8, drafter, prompts, max_new_tokens=NEW, eos_id=(),
                                   **shape)
  got = np.asarray(out.tokens)
  assert got.shape == want.shape and np.all(np.asarray(out.lengths) == NEW)
  assert_greedy_match(int8, prompts, want, got)
  accepted = int(np.sum(np.asarray(out.stats.accepted)))
  if accepts:
    assert accepted > 0, f"no draft accepted ({shape}): the run checks verification only"
  return out.stats


# ----------------------------------------------------------------------------- drafters


def medusa_over(int8, heads=4):
  # test_medusa's "trained_like" heads (random, pulled towards the untrained W = 0), 4 of them
  return Medusa.from_target(int8, random_heads(heads, seed=10, scale=0.05))


def eagle_over(int8, feature_layers=()):
  # test_eagle's (EAGLE-1) and test_eagle3's (fused (0, 1, 1)) heads
  config = E.EagleConfig.for_target(int8.config, initializer_range=0.3,
                                    feature_layers=feature_layers)
  params = E.init_params(config, jax.random.key(1), dtype=int8.dtype)
  return E.Eagle.from_target(int8, params, config)


def mtp_over(int8):
  config = mtp_config(int8.config, qk_norm=True)
  return MTP.from_target(int8, E.init_params(config, jax.random.key(0)), config)


@pytest.fixture(scope="module")
def loaded_mtp(targets, tmp_path_factory):
  """test_mtp's module (speculators' MTP layout, written with NumPy) loaded by
  `jspec.load_drafter` against the int8 copy of test_mtp's target (V 40)."""
  from test_mtp import mtp_dir
  _, int8 = targets("mtp")
  module = jspec.load_drafter(mtp_dir(tmp_path_factory.mktemp("mtp") / "m"), int8)
  assert isinstance(module, MTP)
  assert _shares(module.embed, int8.params["embed"])
  assert _shares(module.lm_head, int8.params["lm_head"])
  return int8, module


IDS = np.arange(0, 48, 2, dtype=np.int32)  # half the drawn target's vocabulary


# ----------------------------------------------------------------------------- the shared head


def _plain(x):
  return np.asarray(x, np.float32)


def _shares(held, weight) -> bool:
  """Whether `held` is the quantized `weight` itself: the same arrays, no copy."""
  leaves = lambda x: jax.tree_util.tree_leaves(x)  # noqa: E731
  return (quant.is_quant_weight(held) and len(leaves(held)) == len(leaves(weight))
          and all(a is b for a, b in zip(leaves(held), leaves(weight))))


def _float_tables(drafter, V, D) -> list:
  """The float leaves of `drafter`, its own trained weights aside (`params`, Medusa's
  `heads`: an EAGLE head's fc is [2D, D], here V = 2D), shaped like the target's [V, D]
  or [D, V] tables."""
  own = "heads" if isinstance(drafter, Medusa) else "params"
  rest = dataclasses.replace(drafter, **{own: None})
  return [x.shape for x in jax.tree_util.tree_leaves(rest)
          if jnp.issubdtype(x.dtype, jnp.floating) and tuple(x.shape) in ((V, D), (D, V))]


@pytest.mark.parametrize("name", ["zoo", "tied"])
def test_head_sharing_drafters_hold_the_int8_targets_own_head(targets, name):
  """What every head-sharing drafter holds is the int8 head itself, the target's own
  arrays (no float copy of a [V, D] table beside the target); its rows and `dense()` are
  bit for bit `quant.dequantize` of the int8 params, not the float target's weights; and
  that head turns the int8 target's hidden state into the int8 target's logits (so
  untrained drafts are the int8 model's next tokens)."""
  model, int8 = targets(name)
  tied = name == "tied"
  embed = _plain(quant.dequantize(int8.params["embed"]))
  lm_head = None if tied else _plain(quant.dequantize(int8.params["lm_head"]))
  assert quant.is_quantized(int8.params["embed"])
  head = int8.head()
  assert _shares(head.embed, int8.params["embed"])
  np.testing.assert_array_equal(_plain(head.dense().embed), embed)
  assert (head.lm_head is None) == tied
  if not tied:
    assert _shares(head.lm_head, int8.params["lm_head"])
    np.testing.assert_array_equal(_plain(head.dense().lm_head), lm_head)
  # The rounding is real: the shared head is not the float target's.
  assert not np.array_equal(embed, _plain(model.params["embed"]))
  assert np.allclose(embed, _plain(model.params["embed"]), atol=0.01 * np.abs(embed).max())

  ids = IDS[IDS < int8.vocab_size]
  rows = _plain(vocab_subset.head_rows(head.embed, head.lm_head, jnp.asarray(ids)))
  np.testing.assert_array_equal(rows, embed[ids] if tied else lm_head[:, ids].T)
  med = medusa_over(int8)
  eagle = eagle_over(int8)
  eagle3 = eagle_over(int8, (0, 1, 1))
  mtp = mtp_over(int8)
  dflash = make_dflash(int8)
  assert _shares(med.lm_head, int8.params["embed" if tied else "lm_head"])
  assert med.tied == tied
  for d in (eagle, eagle3, mtp, dflash):
    assert _shares(d.embed, int8.params["embed"]), type(d).__name__
    assert (d.lm_head is None) == tied
    if not tied:
      assert _shares(d.lm_head, int8.params["lm_head"]), type(d).__name__
  reduced = [eagle.reduced(ids), eagle3.reduced(ids), dflash.reduced(ids)]
  for d in reduced:
    np.testing.assert_array_equal(_plain(d.rows), rows, err_msg=type(d).__name__)
  V, D = int8.vocab_size, int8.config.hidden_size
  for d in (med, eagle, eagle3, mtp, dflash, *reduced):
    assert _float_tables(d, V, D) == [], type(d).__name__
  draft = jspec.DraftModel.reduced(int8, ids).prepared()  # the int8 model as its own draft
  np.testing.assert_array_equal(_plain(draft.rows), rows)

  # The head, as the drafters apply it, gives the int8 target's logits from its hidden state
  # (and not the float target's: the int8 model's argmaxes differ at some positions here).
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, int8.vocab_size, (2, 48)), jnp.int32)
  logits, hidden, _ = jit_apply(int8, tokens, None, jnp.zeros((2,), jnp.int32))
  logits = np.asarray(logits)
  for what, got in (("eagle", eagle.logits(hidden)), ("dflash", dflash.scores(hidden)),
                    ("medusa", quant.einsum("btd,vd->btv" if tied else "btd,dv->btv", hidden,
                                            med.lm_head))):
    np.testing.assert_allclose(np.asarray(got), logits, rtol=0,
                               atol=1e-5 * np.abs(logits).max(), err_msg=what)
  floats = np.asarray(model.logits(tokens))
  assert np.mean(np.argmax(floats, -1) != np.argmax(logits, -1)) > 0
  # Untrained Medusa heads propose the int8 target's own next token (test_medusa's property).
  untrained = Medusa.from_target(int8, medusa.init_heads(2, int8.config.hidden_size))
  np.testing.assert_array_equal(np.argmax(np.asarray(untrained.logits(hidden)), -1),
                                np.repeat(np.argmax(logits, -1)[..., None], 2, -1))


# ----------------------------------------------------------------------------- greedy exactness


@pytest.mark.parametrize("batch", [3, pytest.param(1, marks=SLOW)])
@pytest.mark.parametrize("k", [4, pytest.param(2, marks=SLOW)])
def test_medusa_chain_over_an_int8_target_is_its_greedy_output(targets, greedy, k, batch):
  _, int8 = targets("zoo")
  _speculative(int8, medusa_over(int8), batch, greedy(int8, batch), num_draft_tokens=k)


@pytest.mark.parametrize("name", ["zoo", pytest.param("tied", marks=SLOW)])
def test_medusa_tree_over_an_int8_target_is_its_greedy_output(targets, greedy, name):
  _, int8 = targets(name)
  _speculative(int8, medusa_over(int8), 3, greedy(int8, 3), tree=TREE)


@pytest.mark.parametrize("batch", [3, pytest.param(1, marks=SLOW)])
@pytest.mark.parametrize("k", [2, pytest.param(4, marks=SLOW)])
def test_eagle_chain_over_an_int8_target_is_its_greedy_output(targets, greedy, k, batch):
  _, int8 = targets("drawn")
  _speculative(int8, eagle_over(int8), batch, greedy(int8, batch), num_draft_tokens=k)


@pytest.mark.parametrize("shape", ["static", pytest.param("dynamic", marks=SLOW)])
def test_eagle_trees_over_an_int8_target_are_its_greedy_output(targets, greedy, shape):
  _, int8 = targets("drawn")
  tree = EAGLE_TREE if shape == "static" else DYNAMIC
  _speculative(int8, eagle_over(int8), 3, greedy(int8, 3), tree=tree)


@SLOW
def test_tied_eagle_over_an_int8_target_is_its_greedy_output(targets, greedy):
  """A tied int8 embedding is both the head's input table and its LM head."""
  _, int8 = targets("tied")
  _speculative(int8, eagle_over(int8), 3, greedy(int8, 3), num_draft_tokens=3)


def test_eagle3_over_an_int8_target_is_its_greedy_output(targets, greedy):
  """EAGLE-3 fuses the int8 target's layer outputs (its `features_fn`) besides the head."""
  _, int8 = targets("drawn")
  _speculative(int8, eagle_over(int8, (0, 1, 1)), 3, greedy(int8, 3), num_draft_tokens=3)


@SLOW
def test_eagle3_tree_over_an_int8_target_is_its_greedy_output(targets, greedy):
  _, int8 = targets("drawn")
  _speculative(int8, eagle_over(int8, (0, 1, 1)), 3, greedy(int8, 3), tree=EAGLE_TREE)


@pytest.mark.parametrize("shape", ["chain", pytest.param("dynamic", marks=SLOW)])
def test_mtp_over_an_int8_target_is_its_greedy_output(loaded_mtp, greedy, shape):
  """A published-layout MTP module loaded against the int8 target (`load_drafter` checks
  it against the int8 head's shapes) drafts for it exactly."""
  int8, module = loaded_mtp
  extra = dict(num_draft_tokens=3) if shape == "chain" else dict(tree=DYNAMIC)
  _speculative(int8, module, 3, greedy(int8, 3), **extra)


@pytest.mark.parametrize("shape", ["chain", pytest.param("tree", marks=SLOW)])
def test_dflash_over_an_int8_target_is_its_greedy_output(targets, greedy, shape):
  _, int8 = targets("small")
  extra = dict(num_draft_tokens=3) if shape == "chain" else dict(tree=TREE)
  _speculative(int8, make_dflash(int8), 3, greedy(int8, 3), **extra)


@pytest.mark.parametrize("kind", ["eagle", pytest.param("dflash", marks=SLOW)])
def test_reduced_vocabulary_heads_over_an_int8_target_are_its_greedy_output(targets, greedy,
                                                                            kind):
  """The int8 head's rows for half the ids (FR-Spec): drafts in the set, output exact."""
  if kind == "eagle":
    _, int8 = targets("drawn")
    drafter = eagle_over(int8).reduced(IDS)
  else:
    _, int8 = targets("small")
    drafter = make_dflash(int8).reduced(np.arange(0, 16, 2))
  _speculative(int8, drafter, 3, greedy(int8, 3), num_draft_tokens=3)


def test_the_int8_target_over_half_its_vocabulary_drafts_for_itself(targets, greedy):
  """`DraftModel.reduced` reads the draft's head: the int8 target drafting for itself over
  the even ids proposes the target's own argmax whenever it is even, so most drafts are
  accepted and the output is exact."""
  _, int8 = targets("drawn")
  want = greedy(int8, 3)
  stats = _speculative(int8, jspec.DraftModel.reduced(int8, IDS), 3, want, num_draft_tokens=3)
  # An accepted draft is an emitted even token, so the accepted count is at most the even
  # tokens emitted; most of those are accepted drafts (the others: a round's bonus token
  # after all its drafts were accepted, or the first token). Measured: 39 of 42.
  even = int(np.sum(want % 2 == 0))
  accepted = int(np.sum(np.asarray(stats.accepted)))
  assert even // 2 <= accepted <= even, (accepted, even)


@SLOW
@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_head_drafters_over_a_bf16_int8_target_are_its_greedy_output(targets, greedy, kind):
  """bf16 scales: the dequantized head is q * scale rounded to bf16, the drafters' dtype."""
  _, int8 = targets("bf16")
  assert int8.dtype == jnp.bfloat16 and int8.head().embed.dtype == jnp.bfloat16
  drafter = medusa_over(int8) if kind == "medusa" else eagle_over(int8)
  _speculative(int8, drafter, 3, greedy(int8, 3), num_draft_tokens=3)


# ----------------------------------------------------------------------------- sampled exactness


@SLOW  # 20,000 sampled rows and the enumeration each (test_distribution's sizes)
@pytest.mark.parametrize("kind", ["eagle-chain", "medusa-tree"])
def test_sampled_head_drafting_follows_the_int8_targets_distribution(kind):
  """Whole-sequence counts against the int8 target's own probabilities, enumerated from its
  full forward passes: an EAGLE chain (q from the dequantized head, peaked heads, often
  wrong) and a Medusa tree (ranked candidates of each head)."""
  from test_distribution import NEW as N, PROMPT, ROWS, V, assert_exact_counts
  from test_distribution import exact_distribution

  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  int8 = _int8(jspec.models.init(config, seed=21))
  exact = exact_distribution(int8, 1.0, 0)
  if kind == "eagle-chain":
    head_config = E.EagleConfig.for_target(int8.config)
    params = jax.tree_util.tree_map(lambda x: x * 3.0,
                                    E.init_params(head_config, jax.random.key(3)))
    drafter, shape = E.Eagle.from_target(int8, params, head_config), dict(num_draft_tokens=2)
  else:
    kw, kb = jax.random.split(jax.random.key(5))
    heads = {"w": 0.3 * jax.random.normal(kw, (2, 16, 16), jnp.float32),
             "b": 0.3 * jax.random.normal(kb, (2, 16), jnp.float32)}
    drafter = Medusa.from_target(int8, heads)
    shape = dict(tree=jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0), (2,)]))
  spec = jspec.speculative_generate(int8, drafter, [PROMPT] * ROWS, max_new_tokens=N,
                                    temperature=1.0, seed=2032, **shape)
  assert_exact_counts(spec, exact, f"int8 target, {kind}")
