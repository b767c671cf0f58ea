"""The acceptance kernel's statistics against exact values (DESIGN.md)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec import acceptance, sampling
from reference import assert_counts_match, chi_square_ok

N = 200_000
V = 6
K = 3


def _distributions(seed):
  rng = np.random.default_rng(seed)
  p = rng.dirichlet(np.ones(V), size=K + 1)
  p[:, 5] = 0.0  # the target never emits token 5
  p[1, 2] = 0.0
  p /= p.sum(axis=1, keepdims=True)
  q = rng.dirichlet(np.ones(V), size=K)
  q[0, 0] = 0.0  # the draft never proposes token 0 first
  q /= q.sum(axis=1, keepdims=True)
  return p.astype(np.float32), q.astype(np.float32)


def _run_kernel(p, q, drafts, seed):
  n = drafts.shape[0]
  pb = jnp.broadcast_to(jnp.asarray(p)[None], (n,) + p.shape)
  qb = jnp.broadcast_to(jnp.asarray(q)[None], (n,) + q.shape)
  keys = sampling.row_keys(jnp.arange(n, dtype=jnp.int32) + seed)
  accepted, nxt = jax.jit(acceptance.accept_chain)(pb, qb, jnp.asarray(drafts), keys)
  return np.asarray(accepted), np.asarray(nxt)


@pytest.mark.parametrize("seed", [0, 1])
def test_accepted_count_and_stop_token_distributions(seed):
  p, q = _distributions(seed)
  rng = np.random.default_rng(100 + seed)
  drafts = np.stack([rng.choice(V, size=N, p=q[i].astype(np.float64) / q[i].astype(np.float64).sum())
                     for i in range(K)], axis=1).astype(np.int32)
  n, nxt = _run_kernel(p, q, drafts, seed * N)

  # Accepted count: [1-a0, a0(1-a1), a0 a1 (1-a2), a0 a1 a2] with a_i = sum min(p_i, q_i).
  a = np.minimum(p[:K], q).sum(axis=1).astype(np.float64)
  expected_n = np.array([np.prod(a[:i]) * (1 - a[i]) for i in range(K)] + [np.prod(a)])
  assert_counts_match(np.bincount(n, minlength=K + 1), expected_n, "accepted count")

  # Token at the stop position follows the normalised residual max(p_n - q_n, 0),
  # and the bonus (n = K) follows p_K.
  for i in range(K + 1):
    if i < K:
      resid = np.maximum(p[i].astype(np.float64) - q[i], 0)
      resid /= resid.sum()
    else:
      resid = p[K].astype(np.float64) / p[K].sum()
    assert_counts_match(np.bincount(nxt[n == i], minlength=V), resid, f"stop token at n={i}")

  # Zero-probability tokens are never emitted, as drafts or as the extra token.
  assert not np.any(nxt == 5)
  emitted_first = np.where(n > 0, drafts[:, 0], nxt)
  # The first emitted token follows the target's p_0 exactly (the point of it all).
  assert_counts_match(np.bincount(emitted_first, minlength=V), p[0].astype(np.float64) / p[0].sum(),
                      "first emitted token")
  # And the test has power: the draft's own q_0 is clearly rejected as that distribution.
  assert not chi_square_ok(np.bincount(emitted_first, minlength=V), q[0])


def test_greedy_one_hot_accepts_exact_prefix():
  rng = np.random.default_rng(3)
  B = 512
  argmax = rng.integers(0, V, size=(B, K + 1))
  drafts = np.where(rng.random((B, K)) < 0.7, argmax[:, :K], rng.integers(0, V, size=(B, K)))
  p = jax.nn.one_hot(argmax, V, dtype=jnp.float32)
  q = jax.nn.one_hot(drafts, V, dtype=jnp.float32)
  keys = sampling.row_keys(jnp.arange(B, dtype=jnp.int32))
  n, nxt = acceptance.accept_chain(p, q, jnp.asarray(drafts, jnp.int32), keys)
  match = drafts == argmax[:, :K]
  want_n = np.cumprod(match, axis=1).sum(axis=1)
  np.testing.assert_array_equal(n, want_n)
  np.testing.assert_array_equal(nxt, argmax[np.arange(B), want_n])


def test_zero_drafts_is_plain_sampling():
  rng = np.random.default_rng(4)
  p = rng.dirichlet(np.ones(V)).astype(np.float32)
  p[3] = 0
  p /= p.sum()
  B = 50_000
  pb = jnp.broadcast_to(jnp.asarray(p)[None, None], (B, 1, V))
  keys = sampling.row_keys(jnp.arange(B, dtype=jnp.int32))
  n, nxt = acceptance.accept_chain(pb, jnp.zeros((B, 0, V)), jnp.zeros((B, 0), jnp.int32), keys)
  assert np.all(np.asarray(n) == 0)
  assert_counts_match(np.bincount(np.asarray(nxt), minlength=V), p.astype(np.float64), "K=0")
