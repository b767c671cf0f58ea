"""EAGLE-3 heads: target features from chosen layers (the contract's `features_fn`),
the fused head against a hand-run drafting recompute, the training-time-test mask and
unroll, training, save/load, and greedy equality through the decode loop."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jspec
from jspec.core import nn as layers
from jspec.core.drafter import target_for
from jspec.drafters import eagle as E
from jspec.training import train_eagle as TE
from conftest import assert_reproduces_chat_manifest, numpy_drawn_target, smollm2_and_shipped

LAYERS = (0, 1, 1)  # low, middle, high of a 2-layer target (a layer may repeat)


@pytest.fixture(scope="module")
def target():
  """A random tiny 2-layer decoder drawn with NumPy, logits peaked enough to matter."""
  return numpy_drawn_target(40)


@pytest.fixture(scope="module")
def eagle3(target):
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3, feature_layers=LAYERS)
  return E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config)


def test_target_features_from_chosen_layers(target):
  """hidden is the chosen layers' residual streams concatenated, the same in the
  cache-free (scanned) pass and in cached decoding (unrolled, block by block); the
  last layer's stream, normed, is the model's own final hidden state."""
  D = target.config.hidden_size
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, size=(2, 9)), jnp.int32)
  start = jnp.zeros((2,), jnp.int32)
  logits, final, _ = jax.jit(lambda m, t: m.apply(t, None, start))(target, tokens)
  fused = target.with_features(LAYERS)
  f_logits, feats, _ = jax.jit(lambda m, t: m.apply(t, None, start))(fused, tokens)
  assert feats.shape == (2, 9, 3 * D)
  np.testing.assert_array_equal(np.asarray(f_logits), np.asarray(logits))
  np.testing.assert_array_equal(np.asarray(feats[..., D:2 * D]), np.asarray(feats[..., 2 * D:]))
  normed = layers.RMSNorm()(feats[..., 2 * D:], target.params["final_norm"],
                            target.config.rms_norm_eps)
  np.testing.assert_allclose(np.asarray(normed), np.asarray(final), atol=2e-5)
  assert not np.allclose(np.asarray(feats[..., :D]), np.asarray(feats[..., D:2 * D]))

  @jax.jit
  def cached(model, tokens):  # two blocks through a cache, in decoding form
    model = model.prepared()
    cache = model.init_cache(2, 16)
    _, a, cache = model.apply(tokens[:, :5], cache, start)
    _, b, _ = model.apply(tokens[:, 5:], cache, start + 5)
    return jnp.concatenate([a, b], axis=1)

  np.testing.assert_allclose(np.asarray(cached(fused, tokens)), np.asarray(feats), rtol=1e-4,
                             atol=1e-4)


def test_feature_errors(target, eagle3):
  with pytest.raises(ValueError, match="feature_layers"):
    target.with_features((0, 2))
  bare = jspec.Model(params=target.params, config=target.config, apply_fn=target.apply_fn,
                     init_cache_fn=target.init_cache_fn, head_fn=target.head_fn)
  with pytest.raises(TypeError, match="features_fn"):
    bare.with_features((0,))
  with pytest.raises(TypeError, match="features_fn"):
    E.Eagle.from_target(bare, eagle3.params, eagle3.config)
  assert target.with_features(()) is target
  assert target_for(target, eagle3).config.feature_layers == LAYERS
  assert target_for(target, None) is target
  with pytest.raises(ValueError, match=r"features must be \[B, P-1, n \* D\]"):
    eagle3.init(jnp.zeros((1, 4), jnp.int32), jnp.full((1,), 4, jnp.int32), 16,
                jnp.zeros((1, 3, target.config.hidden_size)))


def test_ttt_mask_on_hand_values():
  """T = 4, three steps: step 0 is causal over the true pairs; step 2 at position 3
  sees true pairs 0..1, its step-1 pair at 2 and itself (step 2's slot 3)."""
  m = np.asarray(TE.ttt_mask(4, 0, 3))
  np.testing.assert_array_equal(m[:, :4], np.tril(np.ones((4, 4), bool)))
  assert not m[:, 4:].any()
  m = np.asarray(TE.ttt_mask(4, 2, 3))
  assert np.flatnonzero(m[3]).tolist() == [0, 1, 4 + 2, 8 + 3]
  assert np.flatnonzero(m[2]).tolist() == [0, 4 + 1, 8 + 2]
  assert np.flatnonzero(m[0]).tolist() == [8]  # j < s stands for no real round: itself only


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_ttt_unroll_equals_drafting_by_hand(target, eagle3):
  """Training-time test step s at position j is what drafting computes when a catch-up
  ends at j - s and the head then feeds its own outputs s times with the true tokens."""
  T, steps = 8, 3
  forward = jax.jit(eagle3.forward)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 40, size=(1, T)), jnp.int32)
  feats, _ = TE.target_features(target_for(target, eagle3), tokens)
  outs = TE.ttt_features(eagle3, eagle3.params, feats, tokens, steps)
  fused = eagle3.fuse(eagle3.params, feats)
  D = eagle3.config.hidden_size
  for s in range(steps):
    for j in range(s, T):
      c = j - s  # the catch-up ends here
      prev = jnp.concatenate([jnp.zeros((1, 1, D)), fused[:, :c]], axis=1)  # [1, c+1, D]
      slots = jnp.arange(c + 1, dtype=jnp.int32)[None]
      cache = eagle3.init_cache(1, T)
      visible = slots[:, :, None] >= jnp.arange(T)[None, None, :]
      out, cache = forward(eagle3.params, prev, tokens[:, :c + 1], cache, slots, slots, visible)
      f = out[:, -1]
      for r in range(1, s + 1):
        slot = jnp.asarray([[c + r]], jnp.int32)
        out, cache = forward(eagle3.params, f[:, None], tokens[:, c + r:c + r + 1], cache,
                             slot, slot, jnp.arange(T)[None, None, :] <= c + r)
        f = out[:, 0]
      np.testing.assert_allclose(np.asarray(outs[s][:, j]), np.asarray(f), rtol=1e-5, atol=1e-4,
                                 err_msg=f"step {s} position {j}")


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_greedy_equality_through_the_decode_loop(target, eagle3):
  """Chains (K 1 and 3) and a tree, full and reduced vocabulary: greedy output equals
  the target's own, ragged prompts including a length-1 one; a sampled run completes."""
  prompts = [[3, 1, 4, 1, 5], [9], [2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
  ref = np.asarray(jspec.generate(target, prompts, max_new_tokens=20, eos_id=()).tokens)
  tree = jspec.Tree(parents=(-1, 0, 0, 1, 1, 2, 3), ranks=(0, 0, 1, 0, 1, 0, 0))
  reduced = eagle3.reduced(np.arange(0, 40, 2))
  for drafter, shape in ((eagle3, dict(num_draft_tokens=3)), (eagle3, dict(num_draft_tokens=1)),
                         (eagle3, dict(tree=tree)), (reduced, dict(num_draft_tokens=3))):
    out = jspec.speculative_generate(target, drafter, prompts, max_new_tokens=20, eos_id=(),
                                     **shape)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref, err_msg=str(shape))
  sampled = jspec.speculative_generate(target, eagle3, prompts, num_draft_tokens=3,
                                       max_new_tokens=20, eos_id=(), temperature=1.0, seed=3)
  assert np.all(np.asarray(sampled.lengths) == 20)


def test_save_load_round_trip(target, eagle3, tmp_path):
  E.save_eagle(eagle3, tmp_path / "head", {"note": "eagle3"})
  back = E.load_eagle(tmp_path / "head", target)
  assert back.config == eagle3.config and back.feature_layers == LAYERS
  jax.tree_util.tree_map(np.testing.assert_array_equal, back.params, eagle3.params)
  assert back.ids is None
  reduced = eagle3.reduced([0, 3, 5, 39])
  E.save_eagle(reduced, tmp_path / "reduced")
  back = E.load_eagle(tmp_path / "reduced", target)  # drafts over the saved ids again
  assert np.asarray(back.ids).tolist() == [0, 3, 5, 39]
  from jspec.bench.methods import from_folder

  assert from_folder(str(tmp_path / "reduced"), target).feature_layers == LAYERS


@pytest.mark.slow
def test_training_lowers_the_loss_and_raises_acceptance():
  """An EAGLE-3 head trained with a three-step training-time test on the target's own
  greedy text: held-out cross-entropy falls, top-1 agreement of the last unrolled step
  rises, and greedy acceptance through the engine rises. The target is close to a
  bigram model (small attention and MLP outputs), so a few dozen steps can learn it."""
  target = numpy_drawn_target(40, output_scale=0.02)
  prompts = np.random.default_rng(3).integers(0, 40, size=(48, 4)).astype(np.int32)
  text = np.asarray(jspec.generate(target, prompts.tolist(), max_new_tokens=28,
                                   eos_id=()).tokens)
  windows = np.concatenate([prompts, text], axis=1)  # [48, 32]: 40 to train on, 8 held out
  head = E.EagleConfig.for_target(target.config, feature_layers=LAYERS)
  cfg = TE.EagleTrainConfig(steps=40, batch_size=8, seq_len=32, learning_rate=2e-2,
                            warmup_steps=5, checkpoint_every=1000, feature_noise=0.0,
                            ttt_steps=3)
  order = np.random.default_rng(4)
  batch = lambda step: windows[order.permutation(40)[:8]]
  initial = E.Eagle.from_target(target, E.init_params(head, jax.random.key(0)), head)
  result = TE.train_eagle(target, cfg, batch, config=head, progress=False)
  before = TE.evaluate(initial, target, windows[40:])
  after = TE.evaluate(result.eagle, target, windows[40:])
  assert after["ce"] < before["ce"] - 1.0, (before, after)
  assert after["top1_last"] > before["top1_last"] + 0.1, (before, after)
  tau = [TE.engine_acceptance(target, e, prompts[40:], k=3, new_tokens=24)["tau"]
         for e in (initial, result.eagle)]
  assert tau[1] > tau[0] + 0.15, tau


@pytest.mark.slow  # a benchmark or recipe end to end: tens of seconds on 2 cores
def test_bench_of_saved_heads(target, eagle3, tmp_path):
  """`jspec.bench.heads_real` on a tiny target: a saved head as a chain and as a dynamic
  tree beside n-gram lookup through the harness's runner, streamed, every answer equal to
  plain decoding's."""
  from jspec.bench import heads_real, lookahead, metrics as M, workloads

  E.save_eagle(eagle3, tmp_path / "h3")
  heads = heads_real.build_heads(target, [str(tmp_path / "h3")], 3, "6,3,2")
  assert sorted(heads) == ["h3@k=3", "h3@tree=6,3,2"]
  assert heads["h3@k=3"].k == 3 and heads["h3@tree=6,3,2"].tree == jspec.DynamicTree(6, 3, 2)
  methods = lookahead.build_methods(target, ["ngram"]) | heads
  ran = lookahead.run(target, methods, [workloads.from_ids("toy", [[3, 1, 4, 1, 5], [2, 7]])],
                      max_new_tokens=8, repeats=1, study=heads_real.STUDY, progress=False)
  assert ran.mismatches == []
  by = M.group(ran.records, "method")
  assert sorted(by) == ["h3@k=3", "h3@tree=6,3,2", "ngram", "plain"]
  for name, recs in by.items():
    assert [r.tokens for r in recs] == [8, 8] and M.tau(recs) >= 1.0
    assert all(r.equal is (None if name == "plain" else True) for r in recs)
    assert sum(n for repeat in recs[0].extra["arrivals"] for _, n in repeat) == 8
  assert len(M.inter_token(by["plain"])) == 14  # 7 waits after the first token, 2 prompts
  table = lookahead.tables(ran.records)["inter-token latency p50 / p99, ms"]
  assert "| `h3@tree=6,3,2` |" in table and "| `plain` |" in table


@pytest.mark.slow  # a benchmark end to end
def test_eagle_trees_study_on_a_saved_head(target, eagle3, tmp_path):
  """`jspec.bench.eagle_trees`: the head as a chain and as dynamic trees over one ragged
  batch, every answer equal to plain greedy's; its records render the docs' table."""
  from jspec.bench import eagle_trees, report, workloads

  E.save_eagle(eagle3, tmp_path / "h3")
  vs = eagle_trees.variants(target, str(tmp_path / "h3"), ["6,3,2", "8,2,4"], k=3)
  assert [v.name for v in vs] == ["plain", "h3@k=3", "h3@tree=6,3,2", "h3@tree=8,2,4"]
  ran = eagle_trees.run(target, vs, workloads.from_ids("toy", [[3, 1, 4, 1, 5], [2, 7]]),
                        new=8, progress=False)
  assert ran.mismatches == []
  shapes = [r for r in ran.records if r.method != "plain"]
  assert [r.equal for r in shapes] == [True] * 3 and all(r.tokens == 16 for r in shapes)
  assert [(r.axes["verify_tokens"], r.extra["head_passes_per_round"]) for r in shapes] == [
      (4, 3), (6, 3), (8, 2)]
  table = report.eagle_trees_shapes({}, shapes).splitlines()
  assert table[2].startswith("| chain K=3 | 4 | 3 |")
  assert table[4].startswith("| tree 8 nodes, depth 2, top-4 | 8 | 2 |")


@pytest.mark.slow  # the CLI: test_measure stays fast
def test_measure_cli_with_a_saved_head(tmp_path):
  """`jspec measure --drafter DIR` with an EAGLE-3 head folder (random, reduced to 512
  ids) for the shipped code target: rows carry k, tau, alpha, and the speculative output
  equals the baseline's."""
  import json

  from jspec.io import shipped
  from jspec.tools import cli

  target = shipped.load(shipped.TARGET)
  config = E.EagleConfig.for_target(target.config, feature_layers=(0, 2, 3))
  head = E.Eagle.from_target(target, E.init_params(config, jax.random.key(0)), config)
  E.save_eagle(head.reduced(np.arange(512)), tmp_path / "head")
  (tmp_path / "prompts.txt").write_text("def add(a, b):\n---\nclass Stack:\n")
  rc = cli.main(["measure", "--drafter", str(tmp_path / "head"), "--prompts",
                 str(tmp_path / "prompts.txt"), "--k", "2", "--max-new-tokens", "8",
                 "--repeats", "1", "--json", str(tmp_path / "out.json")])
  assert rc == 0
  rows = json.loads((tmp_path / "out.json").read_text())["rows"]
  assert [r["k"] for r in rows] == [2]
  assert rows[0]["tau"] >= 1.0 and 0.0 <= rows[0]["alpha"] <= 1.0
  assert rows[0]["equal_to_baseline"] is True and rows[0]["t_draft_round_ms"] > 0


@pytest.mark.slow  # the real model
def test_shipped_smollm2_head_reproduces_its_manifest():
  """checkpoints/smollm2-eagle3 loads for SmolLM2-135M-Instruct and reproduces the
  held-out chat tau of its manifest (K = 4 chain, greedy, batch 1) within 3% per prompt
  kind, with outputs equal to plain greedy. Skipped without the real model."""
  from jspec.io import shipped

  target, folder, manifest = smollm2_and_shipped(shipped.SMOLLM2_EAGLE3)
  head = E.load_eagle(folder, target)
  assert head.feature_layers == tuple(manifest["config"]["feature_layers"])
  assert int(head.ids.shape[0]) == manifest["draft_vocab"]
  assert_reproduces_chat_manifest(target, head, manifest)
