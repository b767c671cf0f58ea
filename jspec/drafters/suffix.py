"""Suffix drafting: continue the way this context continued most often before, in the
row itself and in a memory of earlier calls' outputs (SuffixDecoding, Oliaro et al.
2024, as shipped in ArcticInference).

Where `NGram` proposes what followed the single most recent occurrence of the
row's suffix, `Suffix` looks at every occurrence of it, in the row's committed
tokens and in a memory buffer, and walks their continuations as a frequency tree:

    occurrences of the longest matched suffix (n tokens), in row and memory
    draft j     the most frequent next token among occurrences that agree with
                drafts 1..j-1;  p_j = its count / their count
    length      stop when the running product p_1 * .. * p_j falls below
                `min_prob`, or when no occurrence continues (the ArcticInference
                rule: a draft is only as long as the evidence for it)

Positions past that length carry the placeholder t_{L-1} like `NGram`'s, and
`lookup` returns the count so that `"auto"` drafts only what was found.

Memory across calls is a pytree, `SuffixMemory` (a token buffer of fixed length M,
newest at the end, -1 between documents and where it was never written). It is
a traced field of the drafter: `Suffix(V, memory=m)` with a new `m` of the same M
reuses the compiled program. After a call, `remember(m, out.tokens, out.lengths)`
(a pure, jittable function) returns the memory with the new outputs appended and
the oldest tokens dropped; pass it to the next call. An empty memory (all -1)
drafts exactly as no memory.

Exactness is `NGram`'s: drafts are deterministic given the committed tokens and the
memory, so q is one-hot at them (`propose` returns q = None) and the chain rule
keeps the target's distribution whatever is proposed.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

from jspec.core.drafter import DraftContext
from jspec.drafters import lookup_tree, ngram


def _static(default=dataclasses.MISSING):
  return dataclasses.field(default=default, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SuffixMemory:
  """Earlier outputs, newest last; -1 separates documents and fills unwritten slots."""

  tokens: jax.Array  # [M] int32

  @classmethod
  def empty(cls, size: int) -> "SuffixMemory":
    """A memory of `size` slots holding nothing."""
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 2:
      raise ValueError(f"memory size must be an integer >= 2, got {size!r}")
    return cls(tokens=jnp.full((int(size),), -1, jnp.int32))


def remember(memory: SuffixMemory, tokens: jax.Array, lengths: jax.Array) -> SuffixMemory:
  """The memory with each row's first lengths[b] tokens appended, one -1 after each,
  oldest tokens dropped to keep M. tokens [B, T] int32 (a call's `out.tokens`),
  lengths [B]. Pure and jittable."""
  M = memory.tokens.shape[0]
  tokens = jnp.asarray(tokens, jnp.int32)
  B, T = tokens.shape
  j = jnp.arange(T + 1, dtype=jnp.int32)[None, :]
  lengths = jnp.minimum(jnp.asarray(lengths, jnp.int32), T)[:, None]
  rows = jnp.concatenate([tokens, jnp.full((B, 1), -1, jnp.int32)], axis=1)  # [B, T+1]
  rows = jnp.where(j == lengths, -1, rows)  # the separator right after each row's tokens
  keep = (j <= lengths).reshape(-1)  # tokens, then one separator
  flat = rows.reshape(-1)
  count = jnp.sum(keep.astype(jnp.int32))
  # Stable compaction: kept entries first, in order.
  order = jnp.argsort(~keep, stable=True)
  packed = flat[order]  # [B*(T+1)], kept ones first
  both = jnp.concatenate([memory.tokens, packed])
  return SuffixMemory(tokens=jax.lax.dynamic_slice_in_dim(both, count, M))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Suffix(lookup_tree.LookupProposals):
  """Drafts by frequency-weighted suffix matching in the row and in a cross-call memory."""

  vocab_size: int = _static()
  memory: SuffixMemory | None = None  # traced; None: the row's own tokens only
  max_ngram: int = _static(4)
  min_ngram: int = _static(1)
  min_prob: float = _static(0.1)  # stop drafting when the path's estimated probability drops below

  def __post_init__(self):
    ngram.check_ngram_settings(self.vocab_size, self.max_ngram, self.min_ngram, None)
    if not isinstance(self.min_prob, numbers.Real) or not 0.0 <= self.min_prob < 1.0:
      raise ValueError(f"min_prob must lie in [0, 1), got {self.min_prob!r}")
    memory = self.memory
    if memory is not None and not isinstance(memory, SuffixMemory):
      raise TypeError(f"memory must be a SuffixMemory, got {type(memory).__name__}")
    shape = getattr(getattr(memory, "tokens", None), "shape", None)
    if shape is not None and len(shape) != 1:
      raise ValueError(f"memory tokens must be 1-D, got shape {tuple(shape)}")

  def lookup(self, context: DraftContext, num_drafts: int):
    """drafts [B, K] int32 and count [B] int32 of proposed (non-placeholder) drafts."""
    hay, occurs, placeholder = self._occurrences(context)
    B = hay.shape[0]
    # Walk the continuations as a frequency tree, one draft at a time.
    alive = occurs
    path_prob = jnp.ones((B,), jnp.float32)
    going = jnp.any(occurs, axis=1)
    count = jnp.zeros((B,), jnp.int32)
    drafts = []
    for j in range(num_drafts):
      nxt = lookup_tree.following(hay, j + 1)
      counts = lookup_tree.votes(nxt, alive, self.vocab_size)  # [B, V]
      best = jnp.argmax(counts, axis=1).astype(jnp.int32)
      agree = jnp.take_along_axis(counts, best[:, None], axis=1)[:, 0]
      path_prob = path_prob * agree / jnp.maximum(jnp.sum(counts, axis=1), 1.0)
      going = going & (agree > 0) & (path_prob >= self.min_prob)
      drafts.append(jnp.where(going, best, placeholder))
      count = count + going.astype(jnp.int32)
      alive = alive & (nxt == best[:, None])
    return jnp.stack(drafts, axis=1).astype(jnp.int32), count

  def propose_tree(self, state, context: DraftContext, tree, params, keys):
    """`TreeDrafter.propose_tree`: node i is the ranks[i]-th most frequent continuation
    of its path (`jspec.drafters.lookup_tree`); candidates [B, N-1], state unchanged."""
    del params, keys
    hay, occurs, placeholder = self._occurrences(context)
    return lookup_tree.frequency_tree(hay, occurs, tree, placeholder, self.vocab_size), state

  def _occurrences(self, context: DraftContext):
    """The row-plus-memory haystack [B, H], occurrences of the longest matching suffix
    [B, H] and the placeholder t_{L-1} [B]."""
    tokens, L = context.tokens, context.lengths
    hay = lookup_tree.row_haystack(tokens, L, None if self.memory is None
                                   else self.memory.tokens)
    suffix = ngram.suffix_tokens(tokens, L, self.max_ngram)
    occurs = lookup_tree.occurrences(hay, suffix, L, tokens.shape[1], self.min_ngram,
                                     self.max_ngram)
    return hay, occurs, ngram.last_token(tokens, L)
