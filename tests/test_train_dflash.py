"""DFlash training (`jspec.training.train_dflash`): the training pass is the drafter's own
block pass (its logits equal `DFlash.block_logits` after a prefill), the objective weighs and
masks slots as specified, a short run lowers the held-out loss and raises the accepted
length, a run resumed from its checkpoint ends with the params of an uninterrupted one, and
the trained drafter exports to speculators' layout and loads back the same."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import tiny_config
from jspec.core.drafter import DraftContext
from jspec.drafters import dflash as DF
from jspec.io import drafter_layouts as PD
from jspec.training import train_dflash as TD

V, BS, T = 16, 4, 24


@pytest.fixture(scope="module")
def target():
  return jspec.models.init(tiny_config(vocab_size=V, layers=3, hidden=32, heads=4, kv_heads=2),
                           seed=3)


def make_dflash(target, seed=0, scale=1.0):
  c = target.config
  config = DF.DFlashConfig(hidden_size=c.hidden_size, vocab_size=V, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8, intermediate_size=48, num_layers=1,
                           block_size=BS, mask_token_id=V - 1, feature_layers=(0, 1),
                           initializer_range=0.3 * scale)
  return jspec.DFlash.from_target(target, DF.init_params(config, jax.random.key(seed)), config)


def windows(target, n, seed):
  """n greedy continuations of random 4-token prompts, T tokens each, the prompt masked out:
  the target's own text, which a drafter can learn."""
  rng = np.random.default_rng(seed)
  prompts = rng.integers(0, V - 1, size=(n, 4)).tolist()
  out = jspec.generate(target, prompts, max_new_tokens=T - 4, eos_id=())
  tokens = np.concatenate([np.asarray(prompts), np.asarray(out.tokens)[:, :T - 4]], axis=1)
  mask = np.zeros((n, T), bool)
  mask[:, 4:] = True
  return tokens.astype(np.int32), mask


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_training_blocks_are_the_drafting_blocks(target):
  """Block logits of the training pass, for anchors 5 and 11, equal what the drafter computes
  when it drafts after a prefill of the tokens before the anchor."""
  drafter = make_dflash(target)
  tokens, _ = windows(target, 2, seed=0)
  features, _ = TD.target_outputs(target, drafter, jnp.asarray(tokens))
  anchors = jnp.asarray([[5, 11], [11, 5]], jnp.int32)
  got = np.asarray(TD.block_scores(drafter, drafter.params, jnp.asarray(tokens), features,
                                   anchors))  # [B, A, bs, V]
  for b in range(2):
    for j in range(2):
      a = int(anchors[b, j])
      row = jnp.asarray(tokens[b:b + 1, :a + 1])
      cache = drafter.init(row, jnp.asarray([a + 1]), 32, features[b:b + 1, :a])
      ctx = DraftContext(tokens=jnp.zeros((1, 32), jnp.int32).at[:, :a + 1].set(row),
                         lengths=jnp.asarray([a + 1], jnp.int32))
      want = np.asarray(drafter.block_logits(cache, ctx, BS - 1))[0]
      np.testing.assert_allclose(got[b, j, 1:], want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_the_loss_weighs_and_masks_slots_as_specified(target):
  """The loss by hand: KL at slots 1..bs-1 against the target's distribution one position
  earlier, decayed by exp(-(i-1)/gamma), only where the predicted position is in the mask."""
  drafter = make_dflash(target)
  tokens, mask = windows(target, 1, seed=1)
  mask[0, 14:] = False  # a block at anchor 12 has slots 13 (scored) and 14, 15 (not)
  features, logits = TD.target_outputs(target, drafter, jnp.asarray(tokens))
  key = jax.random.key(7)
  loss, metrics = TD.dflash_loss(drafter.params, drafter, jnp.asarray(tokens), jnp.asarray(mask),
                                 features, logits, key, 3, 2.0)
  anchors, valid = TD.draw_anchors(key, jnp.asarray(mask), 3, BS)
  assert bool(np.all(valid)) and np.all(np.asarray(anchors) <= 12)
  scores = np.asarray(TD.block_scores(drafter, drafter.params, jnp.asarray(tokens), features,
                                      anchors), np.float64)
  lg = np.asarray(logits, np.float64)[0]
  total, count = 0.0, 0
  for j, a in enumerate(np.asarray(anchors)[0]):
    for i in range(1, BS):
      if a + i >= T or not mask[0, a + i]:
        continue
      p = np.exp(lg[a + i - 1] - lg[a + i - 1].max())
      p /= p.sum()
      s = scores[0, j, i]
      log_q = s - s.max() - np.log(np.exp(s - s.max()).sum())
      total += np.exp(-(i - 1) / 2.0) * np.sum(p * (np.log(p) - log_q))
      count += 1
  assert count > 0
  np.testing.assert_allclose(float(loss), total / count, rtol=1e-4)
  assert 1.0 <= float(metrics["accepted_length"]) <= BS


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_a_short_run_learns_and_resumes_exactly(target, tmp_path):
  drafter = make_dflash(target, scale=0.1)
  data, masks = windows(target, 24, seed=2)
  held, held_masks = windows(target, 8, seed=3)
  cfg = TD.DFlashTrainConfig(steps=60, batch_size=4, seq_len=T, anchors=6, learning_rate=3e-3,
                             warmup_steps=5, checkpoint_every=30)

  def batch_fn(step):
    rows = np.random.default_rng(step).choice(len(data), cfg.batch_size, replace=False)
    return data[rows], masks[rows]

  before = TD.evaluate(drafter, target, held, held_masks)
  trained, run = TD.train_dflash(target, drafter, cfg, batch_fn, progress=False,
                                 checkpoint_dir=str(tmp_path / "full"))
  after = TD.evaluate(trained, target, held, held_masks)
  assert after["kl"] < 0.7 * before["kl"], (before, after)
  assert after["accepted_length"] > before["accepted_length"] + 0.1, (before, after)
  # A run killed at step 40 (its last checkpoint: step 30) and started again resumes at 30
  # and ends with the params of the uninterrupted run.
  class Killed(Exception):
    pass

  def dies_at_40(step):
    if step == 40:
      raise Killed
    return batch_fn(step)

  with pytest.raises(Killed):
    TD.train_dflash(target, drafter, cfg, dies_at_40, progress=False,
                    checkpoint_dir=str(tmp_path / "split"))
  with pytest.raises(ValueError, match="different run"):  # the settings are part of the run
    TD.train_dflash(target, drafter, dataclasses.replace(cfg, gamma=2.0), batch_fn,
                    progress=False, checkpoint_dir=str(tmp_path / "split"))
  resumed, run2 = TD.train_dflash(target, drafter, cfg, batch_fn, progress=False,
                                  checkpoint_dir=str(tmp_path / "split"))
  assert run2.start == 30
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         resumed.params, trained.params)
  # The trained drafter is exact and exports for the engines that serve DFlash.
  prompts = [[1, 2, 3, 4], [5, 6]]
  ref = jspec.generate(target, prompts, max_new_tokens=12, eos_id=())
  out = jspec.speculative_generate(target, trained, prompts, num_draft_tokens=BS - 1,
                                   max_new_tokens=12, eos_id=())
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  back = jspec.load_drafter(PD.export_drafter(trained, tmp_path / "out", "speculators"), target)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
                         back.params, trained.params)


def test_bad_settings_are_clear_errors(target):
  with pytest.raises(ValueError, match="anchors must be an integer >= 1"):
    TD.DFlashTrainConfig(anchors=0)
  with pytest.raises(ValueError, match="gamma must be > 0"):
    TD.DFlashTrainConfig(gamma=0.0)
  with pytest.raises(ValueError, match="at least block_size \\+ 1 = 5"):
    TD.train_dflash(target, make_dflash(target), TD.DFlashTrainConfig(seq_len=4),
                    lambda s: None, progress=False)
  with pytest.raises(TypeError, match="trains a jspec.DFlash"):
    TD.check_fits(object(), TD.DFlashTrainConfig())


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_stored_labels_give_the_one_hot_objective(target):
  """With the target's argmax ids as targets (stored labels, no target pass while training),
  the loss is the KL against one-hot distributions: the logits objective on peaked logits."""
  drafter = make_dflash(target)
  tokens, mask = windows(target, 2, seed=4)
  features, logits = TD.target_outputs(target, drafter, jnp.asarray(tokens))
  key = jax.random.key(3)
  args = (jnp.asarray(tokens), jnp.asarray(mask), features)
  hard, m_hard = TD.dflash_loss(drafter.params, drafter, *args, jnp.argmax(logits, -1), key,
                                4, 4.0)
  soft, m_soft = TD.dflash_loss(drafter.params, drafter, *args, logits * 1e4, key, 4, 4.0)
  np.testing.assert_allclose(float(hard), float(soft), rtol=1e-4)
  assert float(m_hard["accepted_length"]) == float(m_soft["accepted_length"])
