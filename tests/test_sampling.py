"""Processed distributions (temperature, top-k, top-p, greedy) against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.core import sampling
from reference import processed_probs


def _params(t, k, p):
  return sampling.SamplingParams(temperature=jnp.asarray(t, jnp.float32),
                                 top_k=jnp.asarray(k, jnp.int32),
                                 top_p=jnp.asarray(p, jnp.float32))


@pytest.mark.parametrize("vocab", [11, 64])
def test_probabilities_match_reference(vocab):
  rng = np.random.default_rng(vocab)
  settings = [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.6), (0.5, 5, 0.8),
              (1.0, vocab + 5, 1.0), (2.0, 1, 1.0), (1.0, 0, 1e-6)]
  t, k, p = map(list, zip(*settings))
  logits = rng.normal(size=(len(settings), 3, vocab)).astype(np.float32) * 2
  got = np.asarray(jax.jit(sampling.probabilities)(jnp.asarray(logits), _params(t, k, p)))
  for b, (tb, kb, pb) in enumerate(settings):
    for n in range(3):
      want = processed_probs(logits[b, n], tb, kb, pb)
      np.testing.assert_allclose(got[b, n], want, atol=2e-6, err_msg=f"row {settings[b]}")
      assert np.all(got[b, n][want == 0] == 0)


def test_unfiltered_batch_skips_sort_but_agrees():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 1, 11)).astype(np.float32)
  got = np.asarray(sampling.probabilities(jnp.asarray(logits), _params([1.0, 0.5], [0, 0], [1.0, 1.0])))
  for b, t in enumerate([1.0, 0.5]):
    np.testing.assert_allclose(got[b, 0], processed_probs(logits[b, 0], t), atol=2e-6)


def test_sample_never_draws_zero_probability():
  probs = np.zeros((4000, 7), np.float32)
  probs[:, [1, 4]] = [0.25, 0.75]
  keys = sampling.row_keys(jnp.arange(4000, dtype=jnp.int32))
  draws = np.asarray(sampling.sample(keys, jnp.asarray(probs)))
  assert set(np.unique(draws)) == {1, 4}
  assert abs(np.mean(draws == 4) - 0.75) < 6 * np.sqrt(0.75 * 0.25 / 4000)


def test_static_greedy_params_none_is_one_hot():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 2, 11)).astype(np.float32)
  logits[0, 0, [2, 7]] = 9.0  # a tie: the lowest id, as with per-row temperature 0
  got = np.asarray(jax.jit(sampling.probabilities)(jnp.asarray(logits), None))
  np.testing.assert_array_equal(got, np.eye(11, dtype=np.float32)[np.argmax(logits, axis=-1)])
  per_row = sampling.probabilities(jnp.asarray(logits), _params([0.0] * 3, [0] * 3, [1.0] * 3))
  np.testing.assert_array_equal(got, per_row)
  assert got[0, 0, 2] == 1.0
