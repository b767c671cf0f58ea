"""A per-row pool of n-grams in a fixed-size ring, keyed by their first token.

Lookahead decoding (`jspec.drafters.lookahead`) collects n-grams from the target's
Jacobi iterations and from the committed text, and verifies the ones that start
with the row's last committed token. The pool is what holds them between rounds,
inside the decode state, under static shapes:

    keys   [B, P]         first token of each entry, -1 where the slot is empty
    grams  [B, P, G]      the G = n - 1 tokens that followed it
    write  [B]            entries written so far; the next goes to slot write % P

Entries are unique per row: inserting an n-gram already present frees the old
slot and writes it again as the newest, so a lookup ranks by how recently an
n-gram was seen (the least-recently-seen policy of LookaheadDecoding's pool,
Fu et al. 2024). When more than P entries are written the oldest are overwritten.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NGramPool:
  """The n-grams of each row (see the module docstring)."""

  keys: jax.Array  # [B, P] int32; -1: empty
  grams: jax.Array  # [B, P, G] int32
  write: jax.Array  # [B] int32 entries written so far

  @classmethod
  def empty(cls, batch: int, size: int, gram: int) -> "NGramPool":
    """B rows of P empty slots for n-grams of n = gram + 1 tokens."""
    return cls(keys=jnp.full((batch, size), -1, jnp.int32),
               grams=jnp.zeros((batch, size, gram), jnp.int32),
               write=jnp.zeros((batch,), jnp.int32))

  @property
  def size(self) -> int:
    """P, the slots per row."""
    return self.keys.shape[1]


def insert(pool: NGramPool, keys: jax.Array, grams: jax.Array, valid: jax.Array) -> NGramPool:
  """Add R candidate n-grams per row, in order (the last is the newest).

  keys [B, R] int32, grams [B, R, G] int32, valid [B, R] bool (invalid ones are
  skipped). A repeat of an earlier candidate or of a pooled entry is written once,
  as the newest; only the newest P survive when R > P.
  """
  P = pool.size
  R = keys.shape[1]
  new = jnp.concatenate([keys[..., None], grams], axis=-1).astype(jnp.int32)  # [B, R, n]
  same = jnp.all(new[:, :, None, :] == new[:, None, :, :], axis=-1)  # [B, R, R]
  later = jnp.triu(jnp.ones((R, R), bool), k=1)  # [r, r'] with r' > r
  # A candidate repeated later in the same batch is dropped here: the later copy
  # is the one written, so the n-gram lands at its newest position.
  repeated = jnp.any(same & later[None] & valid[:, None, :], axis=-1)
  keep = valid & ~repeated
  rank = jnp.cumsum(keep.astype(jnp.int32), axis=1)  # 1-based among kept
  total = rank[:, -1:]
  keep = keep & (rank > total - P)  # the newest P at most
  rank = rank - jnp.maximum(total - P, 0)
  old = jnp.concatenate([pool.keys[..., None], pool.grams], axis=-1)  # [B, P, n]
  stale = jnp.any(jnp.all(old[:, :, None, :] == new[:, None, :, :], axis=-1) & keep[:, None, :],
                  axis=-1)  # [B, P]: pooled entries written again below
  pool_keys = jnp.where(stale, -1, pool.keys)
  slots = jnp.where(keep, (pool.write[:, None] + rank - 1) % P, P)  # P: dropped

  def row(k, g, s, nk, ng):
    return k.at[s].set(nk, mode="drop"), g.at[s].set(ng, mode="drop")

  new_keys, new_grams = jax.vmap(row)(pool_keys, pool.grams, slots, keys.astype(jnp.int32),
                                      grams.astype(jnp.int32))
  written = jnp.sum(keep.astype(jnp.int32), axis=1)
  return NGramPool(keys=new_keys, grams=new_grams, write=pool.write + written)


def newest(pool: NGramPool, key: jax.Array, count: int) -> tuple[jax.Array, jax.Array]:
  """The `count` most recently written n-grams that start with key [B].

  Returns grams [B, count, G] (zeros where fewer exist) and found [B, count] bool.
  """
  P = pool.size
  slot = jnp.arange(P, dtype=jnp.int32)[None, :]
  age = (pool.write[:, None] - 1 - slot) % P  # 0: the newest entry
  score = jnp.where(pool.keys == key[:, None], age, P)  # [B, P]
  picked, found = [], []
  for _ in range(count):  # a few argmin passes: `count` is small and static
    i = jnp.argmin(score, axis=1)
    found.append(jnp.take_along_axis(score, i[:, None], axis=1)[:, 0] < P)
    picked.append(i)
    score = jnp.where(slot == i[:, None], P, score)
  idx = jnp.stack(picked, axis=1)  # [B, count]
  grams = jnp.take_along_axis(pool.grams, idx[:, :, None], axis=1)
  ok = jnp.stack(found, axis=1)
  return jnp.where(ok[..., None], grams, 0), ok


def ngrams_of(tokens: jax.Array, starts: jax.Array, gram: int, valid: jax.Array):
  """The n-grams starting at positions starts [B, R] of tokens [B, S]: keys [B, R],
  grams [B, R, gram], and valid [B, R] unchanged (positions are clipped to the row;
  callers mark the ones that run past the committed tokens invalid)."""
  S = tokens.shape[1]
  pos = starts[:, :, None] + jnp.arange(gram + 1, dtype=jnp.int32)[None, None, :]
  seq = jax.vmap(lambda row, p: row[p])(tokens, jnp.clip(pos, 0, S - 1))  # [B, R, n]
  return seq[:, :, 0], seq[:, :, 1:], valid
