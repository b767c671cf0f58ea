"""EAGLE head: shapes, the cache invariant, drafts against a plain recompute, trees,
training, save/load, bad inputs, and greedy equality through the decode loop."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core.drafter import DraftContext, FeatureDrafter
from jspec.core.tree import Tree
from jspec.drafters import eagle as E
from jspec.training import train_eagle as TE
from conftest import numpy_drawn_target

K = 3
S = 48  # cache slots of the hand-run rounds


# ----------------------------------------------------------------------------- fixtures


def make_context(**fields):
  return DraftContext(**fields)


@pytest.fixture(scope="module")
def target():
  """A random tiny decoder, drawn with NumPy (no random-number program to compile)."""
  return numpy_drawn_target(48)


@pytest.fixture(scope="module")
def eagle(target):
  # Larger weights than a trained head's make drafts depend visibly on every input.
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3)
  return E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config)


@pytest.fixture(scope="module")
def sequences(target):
  """Committed token rows [B, T] and the target's features h [B, T, D] over them."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, target.vocab_size, size=(3, 40)).astype(np.int32)
  hidden, _ = jax.jit(TE.target_features)(target, jnp.asarray(tokens))
  return tokens, np.asarray(hidden)


_init = jax.jit(lambda e, t, l, f: e.init(t, l, S, f))
_propose = jax.jit(lambda e, st, ctx, params, keys, k: e.propose(st, ctx, k, params, keys),
                   static_argnums=5)
_propose_tree = jax.jit(lambda e, st, ctx, tree: e.propose_tree(st, ctx, tree, None, None),
                        static_argnums=3)


def context(tokens, hidden, L, fs, F, rng):
  """The context the loop builds: committed tokens then junk; features at fs..fs+F-1,
  junk where an entry is not valid (beyond L-2 or before slot 0)."""
  B, T = tokens.shape
  D = hidden.shape[2]
  buf = rng.integers(0, 48, size=(B, S)).astype(np.int32)
  feats = rng.normal(size=(B, F, D)).astype(np.float32) * 3
  for b in range(B):
    buf[b, :L[b]] = tokens[b, :L[b]]
    for j in range(F):
      slot = fs[b] + j
      if 0 <= slot <= L[b] - 2:
        feats[b, j] = hidden[b, slot]
  return make_context(tokens=jnp.asarray(buf), lengths=jnp.asarray(L, jnp.int32),
                      features=jnp.asarray(feats), feature_start=jnp.asarray(fs, jnp.int32))


def start_state(eagle, tokens, hidden, lengths, rng):
  """init on right-padded prompts (junk past each row's length; one padded width)."""
  P = 16
  B = tokens.shape[0]
  prompt = rng.integers(0, 48, size=(B, P)).astype(np.int32)
  feats = rng.normal(size=(B, P - 1, hidden.shape[2])).astype(np.float32)
  for b in range(B):
    prompt[b, :lengths[b]] = tokens[b, :lengths[b]]
    feats[b, :lengths[b] - 1] = hidden[b, :lengths[b] - 1]
  return _init(eagle, jnp.asarray(prompt), jnp.asarray(lengths, jnp.int32), jnp.asarray(feats))


def assert_cache_matches_prefill(eagle, state, tokens, hidden, L):
  """Committed slots (< L) equal a fresh prefill of the same pairs (of whole rows:
  slot j depends on pairs <= j only)."""
  T = tokens.shape[1]
  fresh = _init(eagle, jnp.asarray(tokens), jnp.full((tokens.shape[0],), T, jnp.int32),
                jnp.asarray(hidden[:, :T - 1]))
  for b in range(tokens.shape[0]):
    n = int(L[b])
    # k [B, Hkv, Dh, S], v [B, Hkv, S, Dh]
    np.testing.assert_allclose(np.asarray(state["k"][b, :, :, :n]),
                               np.asarray(fresh["k"][b, :, :, :n]), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(state["v"][b, :, :n]), np.asarray(fresh["v"][b, :, :n]),
                               atol=2e-5, rtol=1e-5)


@jax.jit
def _reference_pass(eagle, feats, toks):
  T = toks.shape[1]
  pos = jnp.arange(T, dtype=jnp.int32)[None]
  vis = jnp.tril(jnp.ones((T, T), bool))[None]
  out, _ = eagle.forward(eagle.params, feats, toks, None, pos, pos, vis)
  return out[0]


def reference_features(eagle, feats, toks, width=64):
  """Plain cache-free pass: pairs (feats[j], toks[j]) at positions 0..n-1 -> f^ [n, D].
  Padded to a fixed width (causal attention: padding after n changes nothing), so one
  compiled program serves every length."""
  n = len(toks)
  f = np.zeros((1, width, feats[0].shape[0]), np.float32)
  f[0, :n] = np.stack(feats)
  t = np.zeros((1, width), np.int32)
  t[0, :n] = toks
  return _reference_pass(eagle, jnp.asarray(f), jnp.asarray(t))[:n]


def reference_chain(eagle, tokens_row, hidden_row, L, k, drafts=None):
  """Drafts (argmax unless `drafts` are given) and the logits each came from, by full
  recompute: committed pairs (h_{j-1}, t_j), then (f^ previous, d_i)."""
  D = hidden_row.shape[1]
  feats = [np.zeros(D, np.float32)] + [hidden_row[j - 1] for j in range(1, L)]
  toks = list(tokens_row[:L])
  out, all_logits = [], []
  for i in range(k):
    f = np.asarray(reference_features(eagle, feats, toks))[-1]
    logits = np.asarray(eagle.logits(jnp.asarray(f)[None, None]))[0, 0]
    d = int(np.argmax(logits)) if drafts is None else int(drafts[i])
    out.append(d)
    all_logits.append(logits)
    feats.append(f)
    toks.append(d)
  return out, all_logits


# ----------------------------------------------------------------------------- tests


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_shapes_and_protocol(eagle, target, sequences):
  tokens, hidden = sequences
  rng = np.random.default_rng(1)
  assert isinstance(eagle, FeatureDrafter) and eagle.vocab_size == target.vocab_size
  L = np.array([1, 4, 7])
  state = start_state(eagle, tokens, hidden, L, rng)
  c = eagle.config
  assert state["k"].shape == (3, c.num_key_value_heads, c.head_dim, S)
  assert state["v"].shape == (3, c.num_key_value_heads, S, c.head_dim)
  ctx = context(tokens, hidden, L, L - 1 - (K + 1), K + 1, rng)
  drafts, q, new = _propose(eagle, state, ctx, None, None, K)
  assert drafts.shape == (3, K) and drafts.dtype == jnp.int32 and q is None
  assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(state)
  params = jspec.SamplingParams(temperature=jnp.ones((3,)), top_k=jnp.zeros((3,), jnp.int32),
                                top_p=jnp.ones((3,)))
  keys = jspec.core.sampling.row_keys(jnp.arange(3, dtype=jnp.int32))
  drafts, q, _ = _propose(eagle, state, ctx, params, keys, K)
  assert q.shape == (3, K, target.vocab_size) and q.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(q.sum(-1)), 1.0, atol=1e-5)
  chosen = np.take_along_axis(np.asarray(q), np.asarray(drafts)[:, :, None], axis=2)
  assert np.all(chosen > 0)


def test_chain_rounds_keep_the_invariant_and_match_a_plain_recompute(eagle, sequences):
  """Rounds with random accepted counts and junk in every invalid entry: committed
  slots always equal a fresh prefill, and drafts equal the cache-free reference."""
  tokens, hidden = sequences
  rng = np.random.default_rng(2)
  F = K + 1
  L = np.array([1, 2, 9])  # a length-1 prompt, one with negative feature slots, a long one
  state = start_state(eagle, tokens, hidden, L, rng)
  fs = L - 1 - F
  for _ in range(5):
    ctx = context(tokens, hidden, L, fs, F, rng)
    drafts, _, state = _propose(eagle, state, ctx, None, None, K)
    assert_cache_matches_prefill(eagle, state, tokens, hidden, L)
    for b in range(3):
      want, _ = reference_chain(eagle, tokens[b], hidden[b], int(L[b]), K)
      assert np.asarray(drafts[b]).tolist() == want, f"row {b} at L={L[b]}"
    n = rng.integers(0, K + 1, size=3)
    fs, L = L - 1, L + n + 1


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_sampled_drafts_come_with_their_distributions(eagle, sequences):
  tokens, hidden = sequences
  rng = np.random.default_rng(3)
  L = np.array([3, 6, 10])
  state = start_state(eagle, tokens, hidden, L, rng)
  ctx = context(tokens, hidden, L, L - 1 - (K + 1), K + 1, rng)
  params = jspec.SamplingParams(temperature=jnp.array([1.0, 0.7, 0.0]),
                                top_k=jnp.array([0, 5, 0], jnp.int32), top_p=jnp.ones((3,)))
  keys = jspec.core.sampling.row_keys(jnp.array([5, 6, 7], jnp.int32))
  drafts, q, _ = _propose(eagle, state, ctx, params, keys, K)
  for b in range(3):
    _, logits = reference_chain(eagle, tokens[b], hidden[b], int(L[b]), K,
                                drafts=np.asarray(drafts[b]))
    row = jax.tree_util.tree_map(lambda x: x[b:b + 1], params)
    want = jspec.core.sampling.probabilities(jnp.asarray(np.stack(logits))[None], row)[0]
    np.testing.assert_allclose(np.asarray(q[b]), np.asarray(want), atol=1e-5)
  greedy_row, _ = reference_chain(eagle, tokens[2], hidden[2], int(L[2]), K)
  assert np.asarray(drafts[2]).tolist() == greedy_row  # temperature 0: the argmax


def test_tree_candidates_follow_the_ranks_of_each_parent(eagle, sequences):
  tokens, hidden = sequences
  rng = np.random.default_rng(4)
  #        0
  #     1    2        (ranks 0, 1)
  #   3  4    5       (3, 4 under 1 with ranks 0, 2; 5 under 2)
  #   6               (under 3)
  tree = Tree(parents=(-1, 0, 0, 1, 1, 2, 3), ranks=(0, 0, 1, 0, 2, 0, 0))
  F = tree.max_depth + 1
  L = np.array([1, 5, 8])
  state = start_state(eagle, tokens, hidden, L, rng)
  fs = L - 1 - F
  parents, ranks = tree.parents, tree.ranks
  for _ in range(2):
    ctx = context(tokens, hidden, L, fs, F, rng)
    candidates, state = _propose_tree(eagle, state, ctx, tree)
    assert candidates.shape == (3, tree.num_nodes - 1) and candidates.dtype == jnp.int32
    assert_cache_matches_prefill(eagle, state, tokens, hidden, L)
    cand = np.asarray(candidates)
    for b in range(3):

      def dist_at(node):  # the draft logits at a node: the chain of its path's tokens
        path = []
        while node > 0:
          path.append(int(cand[b, node - 1]))
          node = parents[node]
        drafts = path[::-1] + [0]
        return reference_chain(eagle, tokens[b], hidden[b], int(L[b]), len(drafts), drafts)[1][-1]

      for i in range(1, tree.num_nodes):
        order = np.argsort(-dist_at(parents[i]), kind="stable")
        assert cand[b, i - 1] == order[ranks[i]], f"row {b} node {i}"
    # Level 1: the top ranks of the first draft distribution (what a chain's d_1 comes from).
    for b in range(3):
      first = reference_chain(eagle, tokens[b], hidden[b], int(L[b]), 1)[1][0]
      assert cand[b, :2].tolist() == np.argsort(-first, kind="stable")[:2].tolist()
    fs, L = L - 1, L + rng.integers(0, tree.max_depth + 1, size=3) + 1


@pytest.mark.slow
def test_training_lowers_the_loss(target):
  cfg = TE.EagleTrainConfig(steps=20, batch_size=4, seq_len=16, learning_rate=3e-3,
                            warmup_steps=3, checkpoint_every=1000, feature_noise=0.05)
  rng = np.random.default_rng(0)
  batch = rng.integers(0, target.vocab_size, size=(4, 16)).astype(np.int32)
  result = TE.train_eagle(target, cfg, lambda step: batch, heldout=batch, progress=False)
  losses = [h["loss"] for h in result.history]
  assert [h["step"] for h in result.history] == [20] and np.isfinite(losses[0])
  config = E.EagleConfig.for_target(target.config)
  initial = TE.evaluate(E.Eagle.from_target(target, E.init_params(config, jax.random.key(0)),
                                            config), target, batch)
  assert result.heldout["feature_loss"] < initial["feature_loss"]
  assert result.heldout["ce"] < initial["ce"]


@pytest.mark.slow
def test_training_resumes_from_its_checkpoint(target, tmp_path):
  rng = np.random.default_rng(1)
  data = rng.integers(0, target.vocab_size, size=(4, 2, 8)).astype(np.int32)
  cfg = TE.EagleTrainConfig(steps=4, batch_size=2, seq_len=8, warmup_steps=1,
                            checkpoint_every=2)
  whole = TE.train_eagle(target, cfg, lambda s: data[s], progress=False)

  def interrupted(step):
    if step == 2:
      raise KeyboardInterrupt
    return data[step]

  with pytest.raises(KeyboardInterrupt):
    TE.train_eagle(target, cfg, interrupted, checkpoint_dir=str(tmp_path), progress=False)
  resumed = TE.train_eagle(target, cfg, lambda s: data[s], checkpoint_dir=str(tmp_path),
                           progress=False)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                         whole.eagle.params, resumed.eagle.params)
  assert [h["step"] for h in resumed.history] == [4]
  with pytest.raises(ValueError, match="different run"):
    TE.train_eagle(target, dataclasses.replace(cfg, learning_rate=1e-4), lambda s: data[s],
                   checkpoint_dir=str(tmp_path), progress=False)


def test_save_load_round_trip(eagle, target, tmp_path):
  E.save_eagle(eagle, tmp_path / "f32", {"note": "test"})
  back = E.load_eagle(tmp_path / "f32", target)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                         eagle.params, back.params)
  assert back.config == eagle.config
  assert E.read_config(tmp_path / "f32")[1] == {"note": "test"}
  E.save_eagle(eagle.params, tmp_path / "bf16", config=eagle.config, dtype="bfloat16")
  half = E.load_eagle(tmp_path / "bf16", target)
  leaf = half.params["layer"]["wq"]
  assert leaf.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(leaf), np.asarray(eagle.params["layer"]["wq"]),
                             rtol=1e-2, atol=1e-3)


def test_bad_inputs(eagle, target, tmp_path):
  with pytest.raises(FileNotFoundError, match="no EAGLE head directory"):
    E.load_eagle(tmp_path / "missing", target)
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="eagle_config.json"):
    E.load_eagle(tmp_path / "empty", target)
  E.save_eagle(eagle, tmp_path / "ok")
  with pytest.raises(FileExistsError):
    E.save_eagle(eagle, tmp_path / "ok")
  # A target of another width or vocabulary (the check reads the target's output head,
  # `Model.head_fn`, and the head's config; no tensor is read).
  def with_embed(v, d):
    return dataclasses.replace(target, params={**target.params, "embed": jnp.zeros((v, d))})
  wider = with_embed(target.vocab_size, 64)
  with pytest.raises(ValueError, match="hidden size 32"):
    E.load_eagle(tmp_path / "ok", wider)
  other_vocab = with_embed(40, 32)
  with pytest.raises(ValueError, match="vocab 48"):
    E.load_eagle(tmp_path / "ok", other_vocab)
  # Truncated config, wrong tensor shapes, corrupt params.
  import shutil
  shutil.copytree(tmp_path / "ok", tmp_path / "trunc")
  with open(tmp_path / "trunc" / E.CONFIG_FILE, "w") as f:
    f.write('{"format": "jspec-eag')
  with pytest.raises(ValueError, match="not valid JSON"):
    E.load_eagle(tmp_path / "trunc", target)
  shutil.copytree(tmp_path / "ok", tmp_path / "shape")
  path = tmp_path / "shape" / E.CONFIG_FILE
  meta = json.loads(path.read_text())
  meta["config"]["intermediate_size"] += 8
  path.write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="w_down.*has shape"):
    E.load_eagle(tmp_path / "shape", target)
  shutil.copytree(tmp_path / "ok", tmp_path / "corrupt")
  for root, _, files in os.walk(tmp_path / "corrupt" / E.PARAMS_DIR):
    for name in files:
      if name != "_CHECKPOINT_METADATA":
        os.remove(os.path.join(root, name))
  with pytest.raises(ValueError, match="corrupt"):
    E.load_eagle(tmp_path / "corrupt", target)
  # In memory: wrong params, a non-transformer target, a bare dict without config.
  bad = jax.tree_util.tree_map(lambda x: x, eagle.params)
  bad["layer"]["wq"] = jnp.zeros((3, 3, 3))
  with pytest.raises(ValueError, match="wq"):
    E.Eagle.from_target(target, bad, eagle.config)
  with pytest.raises(ValueError, match="missing tensors"):
    E.Eagle.from_target(target, {"fc": eagle.params["fc"]}, eagle.config)
  with pytest.raises(TypeError, match="no head_fn"):
    E.Eagle.from_target(dataclasses.replace(target, head_fn=None), eagle.params)
  with pytest.raises(TypeError, match=r"has no \['hidden_size'"):
    E.EagleConfig.for_target(object())
  with pytest.raises(ValueError, match="config="):
    E.save_eagle(eagle.params, tmp_path / "noconfig")
  with pytest.raises(ValueError, match="feature_start"):
    eagle.propose(eagle.init_cache(1, S), jspec.core.drafter.DraftContext(
        tokens=jnp.zeros((1, S), jnp.int32), lengths=jnp.ones((1,), jnp.int32)), K, None, None)
  with pytest.raises(ValueError, match="features must be"):
    eagle.init(jnp.zeros((2, 5), jnp.int32), jnp.full((2,), 5, jnp.int32), S,
               jnp.zeros((2, 5, 32)))
  with pytest.raises(ValueError, match="num_attention_heads"):
    E.EagleConfig(hidden_size=8, vocab_size=8, num_attention_heads=3, num_key_value_heads=2,
                  head_dim=4, intermediate_size=8)


@pytest.mark.slow
def test_greedy_equality_through_the_decode_loop(target, eagle):
  """Chains and trees: greedy output equals the target's own. With a vocabulary of 48
  the head's drafts are sometimes right, so rounds accept drafts and the loop's
  rewinds and feature hand-over are exercised; a sampled run completes."""
  from jspec.core.tree import Tree

  prompts = [[3, 1, 4, 1, 5], [9], [2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
  ref = jspec.generate(target, prompts, max_new_tokens=24, eos_id=())
  out = jspec.speculative_generate(target, eagle, prompts, num_draft_tokens=K,
                                   max_new_tokens=24, eos_id=())
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  tree = Tree(parents=(-1, 0, 0, 1, 1, 2, 3), ranks=(0, 0, 1, 0, 1, 0, 0))
  out_tree = jspec.speculative_generate(target, eagle, prompts, tree=tree, max_new_tokens=24,
                                        eos_id=())
  np.testing.assert_array_equal(np.asarray(out_tree.tokens), np.asarray(ref.tokens))
  assert int(np.sum(np.asarray(out.stats.accepted))) > 0
  assert int(np.sum(np.asarray(out_tree.stats.accepted))) > 0
  sampled = jspec.speculative_generate(target, eagle, prompts, num_draft_tokens=K,
                                       max_new_tokens=24, eos_id=(), temperature=1.0, seed=3)
  assert np.all(np.asarray(sampled.lengths) == 24)
  toks = np.asarray(sampled.tokens)
  assert toks.min() >= 0 and toks.max() < target.vocab_size


def test_shipped_head_loads_and_agrees_with_its_target():
  """checkpoints/code-eagle (it ships) is what its manifest says it is: config, parameter
  count, stored dtype, training length; its held-out figures: the slow test below."""
  from jspec.io import shipped

  here = os.path.join(shipped.checkpoints_dir(), shipped.EAGLE)
  manifest = shipped.manifest(shipped.EAGLE)
  target = shipped.load()
  stored = E.load_eagle(here, target, dtype=None)
  assert {str(x.dtype) for x in jax.tree_util.tree_leaves(stored.params)} == {
      manifest["stored_dtype"]}
  head = E.load_eagle(here, target)
  assert head.params["fc"]["kernel"].dtype == jnp.float32
  config = head.config.to_dict()
  assert not config.pop("feature_layers", None)  # EAGLE-1 (written before the field was)
  assert config == manifest["config"]
  assert sum(x.size for x in jax.tree_util.tree_leaves(head.params)) == manifest["parameters"]
  cfg = manifest["train_config"]
  assert manifest["steps"] == cfg["steps"] == manifest["history"][-1]["step"]
  assert manifest["tokens_seen"] == cfg["steps"] * cfg["batch_size"] * cfg["seq_len"]
  windows = shipped.heldout()["windows"][:2, :64]
  metrics = TE.evaluate(head, target, windows)
  assert metrics["top1"] > 0.4, metrics  # teacher-forced agreement with the target's argmax


@pytest.mark.slow  # 64 windows of 256 tokens through the target and the head
def test_shipped_head_reproduces_its_heldout_metrics():
  """The held-out figures of code-eagle's manifest, evaluated again on the same windows of
  heldout.npz (teacher forced: cross-entropy, feature loss, top-1 agreement)."""
  from jspec.io import shipped

  target = shipped.load()
  head = E.load_eagle(os.path.join(shipped.checkpoints_dir(), shipped.EAGLE), target)
  want = shipped.manifest(shipped.EAGLE)["heldout"]
  windows = shipped.heldout()["windows"]
  assert windows.shape[0] == want["windows"]
  metrics = TE.evaluate(head, target, windows[:, :want["tokens_per_window"]])
  for key in ("ce", "feature_loss", "top1"):
    assert metrics[key] == pytest.approx(want[key], rel=0.01, abs=2e-3), (key, metrics, want)
