"""Medusa heads (`jspec.drafters.medusa`) and their training (`jspec.training.train_medusa`).

The drafting rule is checked against a NumPy reading of the heads (h + SiLU(h W + b),
then the target's LM head) at the newest feature h_{L-2}, picked out of feature
windows whose invalid entries hold noise; tree candidates against NumPy ranks. Then:
untrained heads propose the target's own next token, a few training steps lower the
self-distillation loss, a training run saves, reports and resumes, save/load round
trips, and every bad input fails with a clear error. End to end (once the engine
feeds features to drafters): greedy speculative output equals greedy output.
"""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import assert_greedy_match, jit_apply, ragged_prompts
from jspec.drafters import medusa
from jspec.core.drafter import DraftContext, FeatureDrafter
from jspec.core.tree import Tree
from jspec.drafters.medusa import Medusa
from jspec.training import train_medusa as TM

V, D = 64, 32

@pytest.fixture(scope="module")
def tied_target(target):
  """The target's weights with tied embeddings (no lm_head): LM head = embed [V, D]."""
  params = {k: v for k, v in target.params.items() if k != "lm_head"}
  config = dataclasses.replace(target.config, tie_word_embeddings=True)
  return jspec.models.make_model(config, params)


def random_heads(K, seed, scale=0.3):
  kw, kb = jax.random.split(jax.random.key(seed))
  return {"w": scale * jax.random.normal(kw, (K, D, D), jnp.float32),
          "b": scale * jax.random.normal(kb, (K, D), jnp.float32)}


def make_context(target, lengths, F, seed=0, S=16):
  """Tokens, the target's hidden states and a feature window per row: entries
  feature_start + j for j < F, valid ones holding h, the rest noise."""
  rng = np.random.default_rng(seed)
  B = len(lengths)
  tokens = jnp.asarray(rng.integers(0, V, (B, S)), jnp.int32)
  _, hidden, _ = jit_apply(target, tokens, None, jnp.zeros((B,), jnp.int32))
  hidden = np.asarray(hidden)
  lengths = np.asarray(lengths, np.int32)
  # Rows differ in where their window starts: after prefill (L-1-F, maybe negative) or
  # after a verify round that accepted n of F-1 drafts (L-2-n).
  starts = np.array([L - 1 - F if b % 2 == 0 else L - 2 - (b % F) for b, L in enumerate(lengths)],
                    np.int32)
  features = rng.normal(size=(B, F, D)).astype(np.float32) * 5
  for b in range(B):
    for j in range(F):
      slot = starts[b] + j
      if 0 <= slot <= lengths[b] - 2:
        features[b, j] = hidden[b, slot]
  ctx = DraftContext(tokens, jnp.asarray(lengths), jnp.asarray(features), jnp.asarray(starts))
  return ctx, hidden


def reference_logits(target, heads, h):
  """NumPy heads: h [B, D] -> [B, K, V]."""
  h = np.asarray(h, np.float64)
  w, b = np.asarray(heads["w"], np.float64), np.asarray(heads["b"], np.float64)
  z = np.einsum("bd,kde->bke", h, w) + b[None]
  x = h[:, None] + z / (1 + np.exp(-z))
  params = target.params
  lm = (np.asarray(params["embed"]).T if target.config.tie_word_embeddings
        else np.asarray(params["lm_head"]))
  return x @ lm.astype(np.float64)


@pytest.mark.parametrize("tied", [False, True])
def test_propose_follows_the_heads_at_the_newest_feature(target, tied_target, tied):
  model = tied_target if tied else target
  heads = random_heads(4, seed=2)
  drafter = Medusa.from_target(model, heads)
  assert isinstance(drafter, FeatureDrafter) and drafter.vocab_size == V and drafter.num_heads == 4
  lengths = [2, 5, 9, 16, 7]
  ctx, hidden = make_context(model, lengths, F=4, seed=3)
  propose = jax.jit(lambda d, c, params: d.propose(None, c, 3, params, None))
  drafts, q, state = propose(drafter, ctx, None)
  assert drafts.shape == (5, 3) and drafts.dtype == jnp.int32 and q is None and state is None
  h = np.stack([hidden[b, L - 2] for b, L in enumerate(lengths)])
  want = np.argmax(reference_logits(model, heads, h)[:, :3], axis=-1)
  np.testing.assert_array_equal(np.asarray(drafts), want)
  # Sampled rows get the same deterministic drafts, still with q None (one-hot).
  params = jspec.SamplingParams(temperature=jnp.ones((5,), jnp.float32),
                                 top_k=jnp.zeros((5,), jnp.int32), top_p=jnp.ones((5,), jnp.float32))
  drafts_t, q_t, _ = propose(drafter, ctx, params)
  assert q_t is None
  np.testing.assert_array_equal(np.asarray(drafts_t), want)


def test_untrained_heads_propose_the_targets_next_token(target):
  drafter = Medusa.from_target(target, medusa.init_heads(3, D))
  lengths = [1, 3, 8, 12]
  ctx, _ = make_context(target, lengths, F=4, seed=4)
  drafts, _, _ = drafter.propose(drafter.init(ctx.tokens, ctx.lengths, 16, ctx.features), ctx, 3,
                                 None, None)
  logits, _, _ = jit_apply(target, ctx.tokens, None, jnp.zeros((4,), jnp.int32))
  for b, L in enumerate(lengths):
    if L >= 2:  # h_{L-2}'s own head predicts t_{L-1}; an untrained head k repeats it
      assert np.all(np.asarray(drafts[b]) == int(jnp.argmax(logits[b, L - 2])))
  # Rows with L = 1 have no feature: any tokens in range will do (exactness holds).
  assert np.all((np.asarray(drafts) >= 0) & (np.asarray(drafts) < V))


def test_too_many_drafts_is_a_clear_error(target):
  drafter = Medusa.from_target(target, medusa.init_heads(2, D))
  ctx, _ = make_context(target, [4, 6], F=4)
  with pytest.raises(ValueError, match="num_drafts = 3 needs 3 Medusa heads, but this drafter "
                                       "has 2"):
    drafter.propose(None, ctx, 3, None, None)
  drafts, _, _ = drafter.propose(None, ctx, 0, None, None)
  assert drafts.shape == (2, 0)


def test_propose_tree_picks_ranked_tokens_of_each_head(target):
  heads = random_heads(3, seed=5)
  drafter = Medusa.from_target(target, heads)
  #         root; depth 1: ranks 0 1 2; depth 2 under node 1: ranks 0 1, under 2: 0; depth 3: 0, 3
  tree = Tree(parents=(-1, 0, 0, 0, 1, 1, 2, 4, 4), ranks=(0, 0, 1, 2, 0, 1, 0, 0, 3))
  lengths = [3, 10, 16]
  ctx, hidden = make_context(target, lengths, F=tree.max_depth + 1, seed=6)
  candidates, state = jax.jit(
      lambda d, c: d.propose_tree(None, c, tree, None, None))(drafter, ctx)
  assert candidates.shape == (3, tree.num_nodes - 1) and candidates.dtype == jnp.int32
  assert state is None
  h = np.stack([hidden[b, L - 2] for b, L in enumerate(lengths)])
  order = np.argsort(-reference_logits(target, heads, h), axis=-1, kind="stable")  # [B, K, V]
  depths = tree.depths
  for i in range(1, tree.num_nodes):
    np.testing.assert_array_equal(np.asarray(candidates[:, i - 1]),
                                  order[:, depths[i] - 1, tree.ranks[i]], err_msg=f"node {i}")
  deep = Tree(parents=(-1, 0, 1, 2, 3), ranks=(0, 0, 0, 0, 0))
  with pytest.raises(ValueError, match="tree depth = 4 needs 4 Medusa heads"):
    drafter.propose_tree(None, ctx, deep, None, None)


def test_bad_targets_and_heads(target):
  other = dataclasses.replace(target, head_fn=None)  # a model that exposes no output head
  with pytest.raises(TypeError, match="no head_fn"):
    Medusa.from_target(other, medusa.init_heads(2, D))
  with pytest.raises(ValueError, match="hidden size 16, but the target's hidden size is 32"):
    Medusa.from_target(target, medusa.init_heads(2, 16))
  with pytest.raises(ValueError, match="dict with keys 'w'"):
    Medusa.from_target(target, {"w": jnp.zeros((2, D, D))})
  with pytest.raises(ValueError, match="'b' must be"):
    Medusa.from_target(target, {"w": jnp.zeros((2, D, D)), "b": jnp.zeros((3, D))})
  with pytest.raises(TypeError, match="jspec.Model"):
    Medusa.from_target("model", medusa.init_heads(2, D))


# ----------------------------------------------------------------------------- training


@pytest.mark.slow
def test_a_few_training_steps_lower_the_loss(target):
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, V, (4, 24)), jnp.int32)
  optimizer = TM.make_optimizer(1e-2, steps=12, warmup=2)
  heads = medusa.init_heads(3, D)
  opt_state = optimizer.init(heads)
  step = TM.make_train_step(optimizer)
  losses = []
  for _ in range(13):  # a step reports the loss of the heads it was given
    heads, opt_state, loss, per_head = step(heads, opt_state, target, tokens)
    losses.append(float(loss))
  assert per_head.shape == (3,)
  assert losses[-1] < losses[0] - 0.05, losses
  assert not np.allclose(np.asarray(heads["w"]), 0)


@pytest.mark.slow
def test_train_medusa_saves_reports_and_resumes(target, tmp_path):
  rng = np.random.default_rng(1)
  data = (rng.integers(0, V, 4000).astype(np.uint16), rng.integers(0, V, 800).astype(np.uint16))
  kwargs = dict(steps=4, batch=2, seq_len=16, lr=3e-3, num_heads=2, seed=0, warmup=1, data=data,
                work=str(tmp_path / "work"), checkpoint_every=2, eval_windows=4, progress=False,
                log_every=1, command="test", target_name="tiny")
  out = tmp_path / "heads"
  first = TM.train_medusa(target, out=str(out), **kwargs)
  assert isinstance(first.drafter, Medusa) and first.manifest["training"]["steps"] == 4
  with open(out / "manifest.json") as f:
    manifest = json.load(f)
  assert manifest["training"]["tokens_seen"] == 4 * 2 * 16
  assert manifest["training"]["steps"] == 4 and len(manifest["training"]["history"]) == 4
  held = manifest["heldout"]
  assert len(held["top1"]) == 2 and len(held["top5"]) == 2
  assert all(0 <= a <= b <= 1 for a, b in zip(held["top1"], held["top5"]))
  assert held["positions_per_head"] == [4 * 15, 4 * 14]
  assert manifest["seconds"]["total"] > 0 and "untrained_heads" in held
  loaded = medusa.load_medusa(out, target)
  assert loaded.heads["w"].dtype == jnp.float32  # stored bf16, loaded f32
  np.testing.assert_allclose(np.asarray(loaded.heads["w"]),
                             np.asarray(first.drafter.heads["w"]), atol=1e-6)
  # A rerun finds the finished state in the work directory and trains no further.
  again = TM.train_medusa(target, out=str(out), **kwargs)
  assert again.manifest["training"]["resumed_from_step"] == 4
  np.testing.assert_array_equal(np.asarray(again.drafter.heads["w"]),
                                np.asarray(loaded.heads["w"]))
  with pytest.raises(ValueError, match="different run"):
    TM.train_medusa(target, out=str(out), **dict(kwargs, lr=1e-3))
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("keep me")
  with pytest.raises(FileExistsError, match="holds no Medusa heads"):
    TM.train_medusa(target, out=str(tmp_path / "other"), **kwargs)


# ----------------------------------------------------------------------------- save / load


@pytest.fixture(scope="module")
def saved(target, tmp_path_factory):
  heads = random_heads(3, seed=8)
  path = tmp_path_factory.mktemp("medusa") / "heads"
  medusa.save_medusa(Medusa.from_target(target, heads), path, meta={"note": "test"})
  return heads, path


def copy_heads(src, dst):
  shutil.copytree(src, dst)
  return dst


def test_round_trip(target, saved, tmp_path):
  heads, path = saved
  loaded = medusa.load_medusa(path, target)
  for name in ("w", "b"):
    np.testing.assert_array_equal(np.asarray(loaded.heads[name]), np.asarray(heads[name]))
  config = medusa.read_medusa_config(path)
  assert (config["num_heads"], config["hidden_size"], config["vocab_size"]) == (3, D, V)
  assert config["meta"] == {"note": "test"}
  ctx, _ = make_context(target, [4, 9], F=4, seed=9)
  a, _, _ = Medusa.from_target(target, heads).propose(None, ctx, 3, None, None)
  b, _, _ = loaded.propose(None, ctx, 3, None, None)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # bf16 on disk, f32 (default) or bf16 on load.
  medusa.save_medusa(heads, tmp_path / "bf16", vocab_size=V, dtype="bfloat16")
  assert medusa.read_medusa_config(tmp_path / "bf16")["stored_dtype"] == "bfloat16"
  as_f32 = medusa.load_medusa(tmp_path / "bf16", target)
  assert as_f32.heads["w"].dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(as_f32.heads["w"]), np.asarray(heads["w"]), rtol=1e-2)
  kept, _ = medusa.load_heads(tmp_path / "bf16", dtype=None)
  assert kept["w"].dtype == jnp.bfloat16


def edit_config(path, **changes):
  config_path = os.path.join(path, medusa.CONFIG_FILE)
  with open(config_path) as f:
    config = json.load(f)
  config.update(changes)
  with open(config_path, "w") as f:
    json.dump(config, f)


def test_load_errors(target, saved, tmp_path):
  heads, path = saved
  with pytest.raises(FileNotFoundError, match="no Medusa heads directory"):
    medusa.load_medusa(tmp_path / "missing", target)
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="has no medusa_config.json"):
    medusa.load_medusa(tmp_path / "empty", target)
  corrupt = copy_heads(path, tmp_path / "corrupt")
  (corrupt / medusa.CONFIG_FILE).write_text('{"format": "jspec-me')
  with pytest.raises(ValueError, match="is not valid JSON"):
    medusa.load_medusa(corrupt, target)
  foreign = copy_heads(path, tmp_path / "foreign")
  edit_config(foreign, format="jspec")
  with pytest.raises(ValueError, match="is not a Medusa heads config"):
    medusa.load_medusa(foreign, target)
  future = copy_heads(path, tmp_path / "future")
  edit_config(future, version=99)
  with pytest.raises(ValueError, match="format version 99 is not supported"):
    medusa.load_medusa(future, target)
  shapes = copy_heads(path, tmp_path / "shapes")
  edit_config(shapes, num_heads=4)
  with pytest.raises(ValueError, match=r"tensor \['[bw]'\] .* has shape \(3, (32, )?32\), "
                                       r"but medusa_config.json \(num_heads 4"):
    medusa.load_medusa(shapes, target)
  missing = copy_heads(path, tmp_path / "no_arrays")
  shutil.rmtree(missing / medusa.HEADS_DIR)
  with pytest.raises(FileNotFoundError, match="heads directory missing"):
    medusa.load_medusa(missing, target)
  # Targets are checked by their output heads (`Model.head_fn`) and configs, before any
  # array of the heads is read.
  V = target.vocab_size
  wide = dataclasses.replace(target, params={**target.params, "embed": jnp.zeros((V, 48)),
                                             "lm_head": jnp.zeros((48, V))})
  with pytest.raises(ValueError, match="trained for hidden size 32, but the target's is 48"):
    medusa.load_medusa(path, wide)
  bigger = dataclasses.replace(target, config=dataclasses.replace(target.config, vocab_size=96))
  with pytest.raises(ValueError, match="trained for vocabulary size 64, but the target's is 96"):
    medusa.load_medusa(path, bigger)


def test_save_errors(saved, tmp_path):
  heads, path = saved
  with pytest.raises(FileExistsError, match="not an empty directory"):
    medusa.save_medusa(heads, path, vocab_size=V)
  with pytest.raises(ValueError, match="needs the target's vocab_size"):
    medusa.save_medusa(heads, tmp_path / "x")
  with pytest.raises(ValueError, match="dtype must be floating point"):
    medusa.save_medusa(heads, tmp_path / "y", vocab_size=V, dtype="int32")
  assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def trained_like(target):
  """Heads that agree with the target often but not always: random heads pulled
  towards the untrained (W = 0) ones."""
  return Medusa.from_target(target, random_heads(3, seed=10, scale=0.05))


@pytest.fixture(scope="module")
def greedy_reference(target):
  prompts = ragged_prompts(4, V, seed=11, min_len=1, max_len=9)
  return prompts, jspec.generate(target, prompts, max_new_tokens=20)


def test_greedy_chain_output_equals_greedy_output(target, trained_like, greedy_reference):
  prompts, reference = greedy_reference
  out = jspec.speculative_generate(target, trained_like, prompts, num_draft_tokens=3,
                                   max_new_tokens=20)
  assert_greedy_match(target, prompts, np.asarray(reference.tokens), np.asarray(out.tokens))
  with pytest.raises(ValueError, match="needs 4 Medusa heads"):
    jspec.speculative_generate(target, trained_like, prompts, num_draft_tokens=4,
                               max_new_tokens=4)


def test_greedy_tree_output_equals_greedy_output(target, trained_like, greedy_reference):
  from jspec.core.tree import Tree

  prompts, reference = greedy_reference
  tree = Tree.from_paths([(0, 0, 0), (0, 1), (1, 0), (2,)])
  out = jspec.speculative_generate(target, trained_like, prompts, tree=tree, max_new_tokens=20)
  assert_greedy_match(target, prompts, np.asarray(reference.tokens), np.asarray(out.tokens))
