"""examples/rl_rollouts.py on tiny sizes: one compiled step across weight updates,
recorded log-probabilities equal to a fresh forward, and exact speculative rollouts."""


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
  return example.Settings(steps=STEPS, batch_size=8, max_new_tokens=10, num_draft_tokens=3,
                          seed=0, refresh_drafter=3)


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


def test_greedy_rollout_equals_plain_greedy_decoding(example, settings, history):
  """The speculative rollout with a drifted policy and its stale drafter, at
  temperature 0, gives the policy's own greedy tokens (`jspec.generate`)."""
  policy = history[-1]["policy"]
  drafter = jspec.DraftModel(jspec.models.init(example.policy_config(settings),
                                               seed=settings.seed))
  prompts, lengths = example.make_prompts(settings, 99)
  seeds = jnp.arange(settings.batch_size, dtype=jnp.int32)
  sample = jax.jit(example.sample, static_argnames="s")
  tokens, logprobs, new = sample(policy, drafter, prompts, lengths, seeds, 0.0, s=settings)
  N = settings.max_new_tokens
  assert np.asarray(new).tolist() == [N] * settings.batch_size
  rows = [p[:n].tolist() for p, n in zip(np.asarray(prompts), np.asarray(lengths))]
  base = jspec.generate(policy, rows, max_new_tokens=N, temperature=0.0, eos_id=())
  assert_greedy_match(policy, rows, np.asarray(base.tokens).tolist(),
                      np.asarray(tokens)[:, :N])
  # Greedy rows draw the argmax with certainty: the processed log-probability is 0.
  np.testing.assert_array_equal(np.asarray(logprobs)[:, :N], 0.0)
