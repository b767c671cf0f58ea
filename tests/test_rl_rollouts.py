"""examples/rl_rollouts.py on tiny sizes: one compiled step across weight updates and
drawn rollout lengths, recorded log-probabilities equal to a fresh forward, and exact
speculative rollouts through the slot queue (more rollouts than slots)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import assert_greedy_match, load_example

pytestmark = pytest.mark.slow  # the RL example's rollouts

STEPS = 5


@pytest.fixture(scope="module")
def example():
  return load_example("rl_rollouts")


@pytest.fixture(scope="module")
def settings(example):
  # 12 rollouts through 4 slots: every slot is reused, by rollouts of other lengths.
  return example.Settings(steps=STEPS, rollouts=12, slots=4, max_new_tokens=10,
                          num_draft_tokens=3, seed=0, refresh_drafter=3)


@pytest.fixture(scope="module")
def history(example, settings):
  return example.run(settings, log=None)


def test_the_step_compiles_once_across_weight_updates(history):
  assert [e["step"] for e in history] == list(range(STEPS))
  assert history[-1]["traces"] == 1, [e["traces"] for e in history]


def test_the_policy_changes_and_the_metrics_are_sane(example, settings, history):
  initial = jspec.models.init(example.policy_config(settings), seed=settings.seed)
  final = history[-1]["policy"]
  moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                                 initial.params, final.params)
  assert max(jax.tree_util.tree_leaves(moved)) > 1e-3
  for e in history:
    assert np.isfinite(e["reward"]) and 0.0 <= e["reward"] <= 1.0, e
    assert np.isfinite(e["loss"]) and e["logprob"] < 0.0, e
    assert 0.0 <= e["alpha"] <= 1.0 and 1.0 <= e["tau"] <= settings.num_draft_tokens + 1, e
  # Steps 0 and 3 draft with the policy itself (the drafter is refreshed at step 3):
  # p == q up to float error, so all but a handful of draws accept; in between, the
  # stale drafter is accepted less.
  assert history[0]["alpha"] > 0.95 and history[3]["alpha"] > 0.95, history
  assert history[2]["alpha"] < history[3]["alpha"]


def test_rollout_logprobs_equal_a_fresh_forward(history):
  # Measured inside the first step, with the params that sampled, before the update.
  assert history[0]["logprob_err"] < 1e-4, history[0]["logprob_err"]


def test_the_drawn_lengths_are_long_tailed_and_traced(example, settings, history):
  # Lengths differ within a step and across steps, yet the step compiled once (above).
  drawn = [np.asarray(example.make_prompts(settings, step)[2]) for step in range(STEPS)]
  assert all(d.min() >= 2 and d.max() <= settings.max_new_tokens for d in drawn), drawn
  assert all(len(set(d.tolist())) > 1 for d in drawn), drawn
  assert len({tuple(d.tolist()) for d in drawn}) == STEPS, drawn


def test_greedy_rollouts_through_the_queue_equal_plain_greedy_decoding(example, settings,
                                                                       history):
  """The queued speculative rollouts with a drifted policy and its stale drafter, at
  temperature 0, give each prompt's own greedy tokens (`jspec.generate` on the prompt
  alone, for that rollout's length): a rollout does not depend on its slot, on the
  rollouts that held the slot before it or on its neighbours."""
  policy = history[-1]["policy"]
  drafter = jspec.DraftModel(jspec.models.init(example.policy_config(settings),
                                               seed=settings.seed))
  prompts, lengths, max_new = example.make_prompts(settings, 99)
  seeds = jnp.arange(settings.rollouts, dtype=jnp.int32)
  rollout = jax.jit(example.rollout, static_argnames="s")
  results = rollout(policy, drafter, prompts, lengths, max_new, seeds, 0.0, s=settings)
  news = np.asarray(max_new).tolist()
  assert np.asarray(results.lengths).tolist() == news
  tokens = np.asarray(results.tokens)
  rows = [p[:n].tolist() for p, n in zip(np.asarray(prompts), np.asarray(lengths))]
  expected, got = [], []
  for row, n, out in zip(rows, news, tokens):
    alone = jspec.generate(policy, [row], max_new_tokens=n, temperature=0.0, eos_id=())
    expected.append(np.asarray(alone.tokens)[0, :n].tolist())
    got.append(out[:n].tolist())
    assert (out[n:] == -1).all(), out  # nothing past the rollout's own length
  assert_greedy_match(policy, rows, expected, got)
  # Greedy rows draw the argmax with certainty: the processed log-probability is 0.
  chosen = np.asarray(results.logprobs.chosen)
  for b, n in enumerate(news):
    np.testing.assert_array_equal(chosen[b, :n], 0.0)
