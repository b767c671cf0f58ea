"""The acceptance kernel's statistics against exact values (docs/architecture.md)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.core import acceptance, sampling
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


def _random_chain(seed, B, K, V):
  """Peaked random p (some rows exactly one-hot, some entries zero) and drafts that
  often hit p's likely tokens, so that every accepted count n occurs."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(B, K + 1, V)) * 3.0
  p = np.exp(logits - logits.max(axis=-1, keepdims=True))
  p[rng.random((B, K + 1, V)) < 0.2] = 0.0
  p[:, :, 0] += 1e-3  # no all-zero rows
  one_hot_rows = rng.random((B, K + 1)) < 0.2
  p[one_hot_rows] = np.eye(V)[np.argmax(p[one_hot_rows], axis=-1)]
  p = (p / p.sum(axis=-1, keepdims=True)).astype(np.float32)
  likely = np.argmax(p[:, :K], axis=-1)
  drafts = np.where(rng.random((B, K)) < 0.75, likely, rng.integers(0, V, size=(B, K)))
  keys = sampling.row_keys(jnp.asarray(rng.integers(0, 2**31 - 1, size=B), jnp.int32))
  return jnp.asarray(p), jnp.asarray(drafts, jnp.int32), keys


@pytest.mark.parametrize("B,K,V", [(1, 1, 7)] + [
    pytest.param(*c, marks=pytest.mark.slow)
    for c in ((5, 0, 7), (16, 3, 64), (64, 4, 300), (9, 8, 33))])
def test_implicit_one_hot_q_equals_materialised(B, K, V):
  """q = None (one-hot at the drafts, never built) draws the very same tokens as a
  materialised one-hot q for the same keys: same uniforms, same residual."""
  p, drafts, keys = _random_chain(B * 100 + K, B, K, V)
  q = jax.nn.one_hot(drafts, V, dtype=jnp.float32)
  n_ref, next_ref = jax.jit(acceptance.accept_chain)(p, q, drafts, keys)
  n, nxt = jax.jit(acceptance.accept_chain)(p, None, drafts, keys)
  np.testing.assert_array_equal(n, n_ref)
  np.testing.assert_array_equal(nxt, next_ref)
  if K > 0 and B >= 16:  # the comparison covered rejections and full acceptance alike
    counts = np.bincount(np.asarray(n), minlength=K + 1)
    assert counts[0] > 0 and counts[K] > 0 and counts[1:K].sum() > 0, counts
  # The stop token is never the rejected draft (its residual entry is zeroed).
  n, nxt, d = np.asarray(n), np.asarray(nxt), np.asarray(drafts)
  stopped = n < K
  assert not np.any(nxt[stopped] == d[stopped, n[stopped]])


def test_implicit_one_hot_q_distribution():
  """q = None against exact values: accepted count [1-a0, a0(1-a1), ...] with
  a_i = p_i(d_i), stop token from p_n with d_n removed, bonus from p_K."""
  rng = np.random.default_rng(5)
  p = rng.dirichlet(np.ones(V), size=K + 1).astype(np.float32)
  p[:, 5] = 0.0
  p /= p.sum(axis=1, keepdims=True)
  drafts = np.array([1, 5, 2], np.int32)  # d_2 = 5 has p = 0: always rejected there
  pb = jnp.broadcast_to(jnp.asarray(p)[None], (N,) + p.shape)
  db = jnp.broadcast_to(jnp.asarray(drafts)[None], (N, K))
  keys = sampling.row_keys(jnp.arange(N, dtype=jnp.int32) + 7)
  n, nxt = jax.jit(acceptance.accept_chain)(pb, None, db, keys)
  n, nxt = np.asarray(n), np.asarray(nxt)
  a = p[np.arange(K), drafts].astype(np.float64)
  expected_n = np.array([np.prod(a[:i]) * (1 - a[i]) for i in range(K)] + [np.prod(a)])
  assert_counts_match(np.bincount(n, minlength=K + 1), expected_n, "accepted count, q=None")
  for i in range(2):
    resid = p[i].astype(np.float64).copy()
    resid[drafts[i]] = 0.0
    assert_counts_match(np.bincount(nxt[n == i], minlength=V), resid / resid.sum(),
                        f"stop token at n={i}, q=None")
  assert not np.any(nxt == 5)


@pytest.mark.parametrize("q_kind", ["none", pytest.param("one_hot", marks=pytest.mark.slow),
                                    pytest.param("dense", marks=pytest.mark.slow)])
def test_accept_greedy_equals_one_hot_p(q_kind):
  """The static greedy rule (argmax only) is `accept_chain` with one-hot p, whatever q."""
  rng = np.random.default_rng(6)
  B, K, V = 256, 4, 12
  logits = rng.normal(size=(B, K + 1, V)).astype(np.float32)
  logits[:8] = np.round(logits[:8])  # exact ties: both paths take the lowest id
  argmax = np.argmax(logits, axis=-1)
  drafts = np.where(rng.random((B, K)) < 0.7, argmax[:, :K], rng.integers(0, V, size=(B, K)))
  drafts = jnp.asarray(drafts, jnp.int32)
  q = {"none": None, "one_hot": jax.nn.one_hot(drafts, V, dtype=jnp.float32),
       "dense": jnp.asarray(rng.dirichlet(np.ones(V), size=(B, K)), jnp.float32)}[q_kind]
  p = sampling.probabilities(jnp.asarray(logits), None)
  keys = sampling.row_keys(jnp.arange(B, dtype=jnp.int32))
  n_ref, next_ref = acceptance.accept_chain(p, q, drafts, keys)
  n, nxt = acceptance.accept_greedy(jnp.asarray(logits), drafts)
  np.testing.assert_array_equal(n, n_ref)
  np.testing.assert_array_equal(nxt, next_ref)
  assert 0 < int(np.sum(n)) < B * K
