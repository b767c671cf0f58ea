"""Occurrences and their continuations, shared by the lookup drafters (n-gram, datastore,
suffix): where a row's suffix occurs in a haystack, and the frequency tree of what
followed it, walked as a chain (`Suffix.lookup`) or expanded into a static tree.

    haystack  [B, H] int32: each row's committed tokens (-1 from L on), then, for
              drafters with a shared buffer, -1 and that buffer; -1 is never a token
    occurs    [B, H] bool: windows ending at e that equal the row's longest matching
              suffix (n tokens); a window in the row itself must end by L-2, strictly
              before the suffix it matches
    next(j)   [B, H]: the token j after each window end, haystack[e + j] (-1: none)

A tree node at depth d whose path from the root is t_1..t_{d-1} keeps the
occurrences whose continuations read t_1..t_{d-1}; its children are their most
frequent next tokens in order: child of rank r is the (r+1)-th most frequent one,
the placeholder when fewer than r+1 distinct tokens follow. Placeholders and
duplicate siblings leave the drafts deterministic, so tree acceptance with one-hot
q stays exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


class LookupProposals:
  """`Drafter.init` and `Drafter.propose` of a lookup drafter: no per-row state, and the
  drafts of its own `lookup(context, K)`, with q None (one-hot at each draft: the drafts are
  deterministic, so acceptance stays exact at every temperature)."""

  def init(self, tokens, prompt_lengths, cache_length: int):
    """`Drafter.init`: no per-row state (returns None); the context is all it reads."""
    del tokens, prompt_lengths, cache_length
    return None

  def propose(self, state, context, num_drafts: int, params, keys):
    """`Drafter.propose`: drafts [B, K] from `lookup`, q None, state unchanged."""
    del params, keys  # deterministic: the same drafts at every temperature
    drafts, _ = self.lookup(context, num_drafts)
    return drafts, None, state


def row_haystack(tokens: jax.Array, lengths: jax.Array, shared: jax.Array | None = None):
  """[B, H] haystack of each row's committed tokens, then -1 and `shared` [M] if given."""
  B, S = tokens.shape
  own = jnp.where(jnp.arange(S, dtype=jnp.int32)[None, :] < lengths[:, None], tokens, -1)
  if shared is None:
    return own
  shared = jnp.broadcast_to(shared.astype(jnp.int32)[None, :], (B, shared.shape[0]))
  return jnp.concatenate([own, jnp.full((B, 1), -1, jnp.int32), shared], axis=1)


def occurrences(hay: jax.Array, suffix: jax.Array, lengths: jax.Array, row_width: int,
                min_ngram: int, max_ngram: int) -> jax.Array:
  """occurs [B, H]: every window equal to the longest suffix (newest-first `suffix`
  [B, max_ngram]) of length min_ngram..max_ngram found anywhere; the row's own part
  (indices < row_width) only up to end L-2."""
  B, H = hay.shape
  ends = jnp.arange(H, dtype=jnp.int32)[None, :]
  usable = (ends <= (lengths - 2)[:, None]) | (ends >= row_width)
  match = jnp.ones((B, H), bool)
  occurs = jnp.zeros((B, H), bool)
  for n in range(1, max_ngram + 1):
    shifted = jnp.pad(hay, ((0, 0), (n - 1, 0)), constant_values=-1)[:, :H]
    match = match & (shifted == suffix[:, n - 1:n]) & (shifted >= 0)
    if n < min_ngram:
      continue
    ok = match & usable & (n <= lengths)[:, None]
    occurs = jnp.where(jnp.any(ok, axis=1, keepdims=True), ok, occurs)  # longer wins
  return occurs


def following(hay: jax.Array, j: int) -> jax.Array:
  """[B, H]: haystack[e + j] for every window end e, -1 past the end."""
  return jnp.pad(hay, ((0, 0), (0, j)), constant_values=-1)[:, j:]


def votes(nxt: jax.Array, alive: jax.Array, vocab_size: int) -> jax.Array:
  """[B, V] f32: how many live occurrences continue with each token."""
  B = nxt.shape[0]
  live = alive & (nxt >= 0)
  return jnp.zeros((B, vocab_size), jnp.float32).at[
      jnp.arange(B)[:, None], jnp.maximum(nxt, 0)].add(live.astype(jnp.float32))


def frequency_tree(hay: jax.Array, occurs: jax.Array, tree, placeholder: jax.Array,
                   vocab_size: int) -> jax.Array:
  """candidates [B, N-1] int32 for a static `jspec.Tree` (module docstring)."""
  parents, ranks, depths = (np.asarray(tree.parents), np.asarray(tree.ranks),
                            np.asarray(tree.depths))
  N = len(parents)
  alive = [occurs] + [None] * (N - 1)  # per node: occurrences consistent with its path
  tokens = [None] * N
  for d in range(1, tree.max_depth + 1):
    nxt = following(hay, d)
    level = [i for i in range(N) if depths[i] == d]
    for p in sorted({int(parents[i]) for i in level}):
      children = [i for i in level if parents[i] == p]
      width = int(max(ranks[i] for i in children)) + 1
      count, best = lax.top_k(votes(nxt, alive[p], vocab_size), width)  # [B, width]
      for i in children:
        r = int(ranks[i])
        found = count[:, r] > 0
        tokens[i] = jnp.where(found, best[:, r], placeholder).astype(jnp.int32)
        alive[i] = alive[p] & (nxt == tokens[i][:, None]) & found[:, None]
  return jnp.stack(tokens[1:], axis=1)
