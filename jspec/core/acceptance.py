"""Exact, vectorised acceptance of a chain of K drafts (Leviathan et al. 2022,
Chen et al. 2023).

    accept_i = u_i * q_i(d_i) < p_i(d_i)          i.e. u_i < min(1, p/q)
    n        = sum(cumprod(accept))                accepted drafts per row, 0..K
    residual = max(p_n - q_n, 0), with q_K := 0     at n = K this is p_K (the bonus)
    next     = sample(normalise(residual))            (K = 0: a plain draw from p_0)

The emitted tokens (d_1 .. d_n, next) follow the target's processed distribution
exactly, whatever q is, as long as each d_i was drawn from q_i. Deterministic
drafters pass q = None, which means one-hot at the drafts: then q_i(d_i) = 1 and
max(p_i - q_i, 0) is p_i with the entry d_i zeroed (p <= 1), so the rule needs
no [B, K, V] array at all. Greedy rows pass one-hot p and q, which reduces the rule
to "accept while d_i is the target's argmax; then emit the argmax" (a statically
all-greedy batch skips this function: see `jspec.core.decode`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jspec.core import sampling


def accept_chain(p: jax.Array, q: jax.Array | None, drafts: jax.Array, keys: jax.Array,
                 caps: jax.Array | None = None):
  """Vectorised rejection sampling over a batch of draft chains.

  Args:
    p: [B, K+1, V] f32 target distributions after each committed/draft token.
    q: [B, K, V] f32 draft distributions the drafts were sampled from, or None
      for deterministic drafts (one-hot at each d_i). Both give the same tokens
      for the same keys: the uniforms are the same and so is the residual.
    drafts: [B, K] int32 draft tokens d_1..d_K.
    keys: [B] typed PRNG keys, one per row for this round.
    caps: optional [B] int32: row b judges only its first caps[b] drafts; those past it
      count as not proposed (a request that opted out of speculation, or capped K): the
      token at caps[b] is drawn from p itself there, as at position K (q := 0).

  Returns:
    n: [B] int32 accepted drafts.
    next_token: [B] int32 the token emitted after the accepted run.
  """
  B, K1, V = p.shape
  K = K1 - 1
  u_keys, r_keys = sampling.split_rows(keys)
  if K == 0:  # plain sampling: the bonus is p_0 itself, no gather, no residual
    return jnp.zeros((B,), jnp.int32), sampling.sample(r_keys, p[:, 0])
  u = jax.vmap(lambda k: jax.random.uniform(k, (K,), jnp.float32))(u_keys)  # [B, K]

  p_d = jnp.take_along_axis(p[:, :K], drafts[:, :, None], axis=-1)[..., 0]  # [B, K]
  if q is None:
    accepted = u < p_d  # q_i(d_i) = 1
  else:
    q_d = jnp.take_along_axis(q, drafts[:, :, None], axis=-1)[..., 0]  # [B, K]
    accepted = u * q_d < p_d
  if caps is not None:
    accepted = accepted & (jnp.arange(K)[None, :] < caps[:, None])
  n = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
  # A row stopped by its cap (n == caps) has no draft at n: its residual is p_n itself.
  capped = None if caps is None else n == caps

  # Residual at the stop position; q_K := 0 makes position K the plain bonus p_K.
  p_n = jnp.take_along_axis(p, n[:, None, None], axis=1)[:, 0]  # [B, V]
  if q is None:
    # max(p_n - one_hot(d_n), 0) is p_n with d_n zeroed; -1 at position K matches no id.
    d_padded = jnp.concatenate([drafts.astype(jnp.int32), jnp.full((B, 1), -1, jnp.int32)],
                               axis=1)  # [B, K+1]
    d_n = jnp.take_along_axis(d_padded, n[:, None], axis=1)  # [B, 1]
    if capped is not None:
      d_n = jnp.where(capped[:, None], -1, d_n)
    ids = jnp.arange(V, dtype=jnp.int32)[None, :]  # [1, V]
    residual = jnp.where(ids == d_n, 0.0, p_n)
  else:
    q_padded = jnp.concatenate([q, jnp.zeros((B, 1, V), q.dtype)], axis=1)  # [B, K+1, V]
    q_n = jnp.take_along_axis(q_padded, n[:, None, None], axis=1)[:, 0]  # [B, V]
    if capped is not None:
      q_n = jnp.where(capped[:, None], 0.0, q_n)
    residual = jnp.maximum(p_n - q_n, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  # p == q (up to rounding) leaves no residual mass: then p itself is the answer.
  # `sample` normalises as it draws.
  next_token = sampling.sample(r_keys, jnp.where(mass > 0.0, residual, p_n))
  return n, next_token


def accept_greedy(logits: jax.Array, drafts: jax.Array, caps: jax.Array | None = None):
  """The chain rule for statically all-greedy rows, from logits: no probabilities,
  no random numbers.

  logits [B, K+1, V], drafts [B, K] int32 -> n [B] int32 (leading drafts equal to
  the target's argmax), next_token [B] int32 (the argmax at position n). This is
  what `accept_chain` draws with one-hot p at the argmax, for any q. caps: optional [B]
  int32, the drafts each row judges (`accept_chain`).
  """
  K = drafts.shape[1]
  target_tokens = sampling.greedy_tokens(logits)  # [B, K+1]
  matches = (drafts == target_tokens[:, :K]).astype(jnp.int32)  # [B, K]
  n = jnp.sum(jnp.cumprod(matches, axis=1), axis=1).astype(jnp.int32)
  if caps is not None:
    n = jnp.minimum(n, caps).astype(jnp.int32)
  next_token = jnp.take_along_axis(target_tokens, n[:, None], axis=1)[:, 0]
  return n, next_token
