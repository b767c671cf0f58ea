"""N-gram lookup drafting: propose what followed the last time the context said this.

No draft model: the drafter looks up the longest suffix of a row's committed
tokens t_0..t_{L-1} earlier in the same row and proposes the tokens that came
after that occurrence ("prompt lookup decoding"). It pays off wherever output
restates its input (code edits, summaries with quotes, retrieval answers) and
wherever greedy decoding falls into a loop.

    committed:   ... a b c x y ... a b | c ?        L = index of ? ; suffix "a b" (n = 2)
    match:           ^^^ ends at e, the most recent e <= L-2 (strictly earlier)
    drafts:          c x y ...   t_{e+1}, t_{e+2}, ...

Matching (one row; vectorised over the batch and over every window end at once):

  * suffix lengths n = max_ngram .. min_ngram, longest first; among windows of
    that length, the most recent (largest end e). The window must lie wholly in
    the committed tokens and end at e <= L-2, so the match is strictly earlier
    than the suffix itself. Scratch slots >= L are never read.
  * continuation: draft j (0-based) is t_{e+1+(j mod P)} with P = L-1-e. For
    j < P that is the plain continuation t_{e+1+j}. Past it the continuation
    would be the tokens about to be generated; if the copy goes on, they repeat
    the same P tokens, so the drafter proposes them again. Every proposal is
    thus a committed token (index e+1..L-1), and a period-P loop is drafted in
    full whatever K is.
  * adaptive length: a match of length n earns a_n = drafts_per_ngram * n
    proposals (default 2n: 2, 4, 6 for n = 1, 2, 3), capped at K; a longer match
    is stronger evidence that the copy continues. None proposes K for any match.
  * not proposed (nothing matches, or j >= a_n): the placeholder t_{L-1}.

Why this stays exact: the drafter is deterministic given the committed tokens,
so each draft is "drawn" from the one-hot q at itself (`propose` returns q =
None, which the acceptance rule reads as exactly that), and the chain rule with a
one-hot q accepts d with probability p(d) and otherwise samples the residual
p with d removed: the emitted token follows p whatever d was. The engine verifies
a static K per round and has no per-row "not proposed" mark, so positions past
a_n carry the placeholder with a one-hot q like any other draft: still an exact
rejection sampler (a placeholder may even be accepted by chance), never a
forced rejection. The cap therefore costs no compute here and can only lower
acceptance; it exists so that `lookup`'s per-row count can drive a round length
chosen in-graph (docs/architecture.md, the acceptance rule), where capped positions are
truly not proposed.

`context_drafts` and the helpers below it are shared with `jspec.drafters.datastore`.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp

from jspec.core.drafter import DraftContext
from jspec.drafters import lookup_tree


def _static(default=dataclasses.MISSING):
  return dataclasses.field(default=default, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NGram(lookup_tree.LookupProposals):
  """Drafts by n-gram lookup in each row's own committed tokens. No params, no state."""

  vocab_size: int = _static()
  max_ngram: int = _static(3)
  min_ngram: int = _static(1)
  drafts_per_ngram: int | None = _static(2)  # a_n = drafts_per_ngram * n; None: always K

  def __post_init__(self):
    check_ngram_settings(self.vocab_size, self.max_ngram, self.min_ngram, self.drafts_per_ngram)

  def lookup(self, context: DraftContext, num_drafts: int):
    """drafts [B, K] int32 and count [B] int32: how many leading drafts were proposed
    (the rest are placeholders)."""
    drafts, count, _ = context_drafts(context, num_drafts, self.max_ngram, self.min_ngram,
                                      self.drafts_per_ngram)
    return drafts, count

  def propose_tree(self, state, context: DraftContext, tree, params, keys):
    """`TreeDrafter.propose_tree`: the continuations of every occurrence of the longest
    matching suffix, node i the ranks[i]-th most frequent after its path
    (`jspec.drafters.lookup_tree`); candidates [B, N-1], state unchanged."""
    del params, keys
    tokens, L = context.tokens, context.lengths
    hay = lookup_tree.row_haystack(tokens, L)
    occurs = lookup_tree.occurrences(hay, suffix_tokens(tokens, L, self.max_ngram), L,
                                     tokens.shape[1], self.min_ngram, self.max_ngram)
    return lookup_tree.frequency_tree(hay, occurs, tree, last_token(tokens, L),
                                      self.vocab_size), state


# ----------------------------------------------------------------------------- shared helpers


def check_ngram_settings(vocab_size, max_ngram, min_ngram, drafts_per_ngram) -> None:
  """Raise ValueError unless vocab_size, max_ngram >= min_ngram >= 1 are integers >= 1
  and drafts_per_ngram is an integer >= 1 or None."""
  for name, value in (("vocab_size", vocab_size), ("max_ngram", max_ngram),
                      ("min_ngram", min_ngram)):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
  if max_ngram < min_ngram:
    raise ValueError(f"max_ngram ({max_ngram}) must be >= min_ngram ({min_ngram})")
  if drafts_per_ngram is not None and (
      isinstance(drafts_per_ngram, bool) or not isinstance(drafts_per_ngram, numbers.Integral)
      or drafts_per_ngram < 1):
    raise ValueError(f"drafts_per_ngram must be an integer >= 1 or None, got {drafts_per_ngram!r}")


def context_drafts(context: DraftContext, num_drafts: int, max_ngram: int, min_ngram: int,
                   drafts_per_ngram: int | None):
  """`NGram.lookup` plus the matched length: drafts [B, K], count [B], n [B] (0: no match)."""
  tokens, L = context.tokens, context.lengths
  suffix = suffix_tokens(tokens, L, max_ngram)
  n, end = longest_recent_match(tokens, suffix, L, L - 2, min_ngram, max_ngram)
  # Period of the match: the continuation t_{e+1}..t_{L-1} repeats (see module docstring).
  period = jnp.maximum(L - 1 - end, 1)  # [B]
  j = jnp.arange(num_drafts, dtype=jnp.int32)[None, :]  # [1, K]
  index = end[:, None] + 1 + j % period[:, None]  # [B, K] in e+1..L-1 when n > 0
  index = jnp.clip(index, 0, tokens.shape[1] - 1)
  continuation = jnp.take_along_axis(tokens, index, axis=1)  # [B, K]
  available = jnp.full(n.shape, num_drafts, jnp.int32)
  drafts, count = finish_drafts(continuation, available, n, last_token(tokens, L), num_drafts,
                                drafts_per_ngram)
  return drafts, count, n


def suffix_tokens(tokens: jax.Array, lengths: jax.Array, max_ngram: int) -> jax.Array:
  """The last max_ngram committed tokens, newest first: [B, max_ngram], column o = t_{L-1-o}.

  Columns with L-1-o < 0 hold junk (clamped); `longest_recent_match` ignores them.
  """
  o = jnp.arange(max_ngram, dtype=jnp.int32)[None, :]  # [1, N]
  index = jnp.maximum(lengths[:, None] - 1 - o, 0)  # [B, N]
  return jnp.take_along_axis(tokens, index, axis=1)


def last_token(tokens: jax.Array, lengths: jax.Array) -> jax.Array:
  """t_{L-1} per row: [B] int32, the placeholder draft."""
  return jnp.take_along_axis(tokens, jnp.maximum(lengths - 1, 0)[:, None], axis=1)[:, 0]


def longest_recent_match(haystack: jax.Array, suffix: jax.Array, suffix_length: jax.Array,
                         last_end: jax.Array, min_ngram: int, max_ngram: int):
  """Longest, then most recent, occurrence of each row's suffix in a token buffer.

  Args:
    haystack: [B, M] per-row buffers, or [1, M] one buffer shared by every row.
    suffix: [B, max_ngram] int32, newest first (`suffix_tokens`).
    suffix_length: [B] how many suffix tokens exist (L): n > L never matches.
    last_end: [B] largest window end allowed (inclusive); windows also start at >= 0.
    min_ngram, max_ngram: static range of n.

  Returns:
    n [B] int32 matched length, 0 when nothing matches; end [B] int32 the index of
    the window's last token (-1 when n = 0).

  Cost O(max_ngram * B * M) compares: window ends are all tested at once, and the
  match for n + 1 is the match for n and one more shifted compare.
  """
  B = suffix.shape[0]
  M = haystack.shape[1]
  ends = jnp.arange(M, dtype=jnp.int32)[None, :]  # [1, M]
  in_range = ends <= last_end[:, None]  # [B, M]
  match = jnp.ones((B, M), bool)
  best_n = jnp.zeros((B,), jnp.int32)
  best_end = jnp.full((B,), -1, jnp.int32)
  for n in range(1, max_ngram + 1):
    o = n - 1
    # shifted[:, e] = haystack[:, e - o]; -1 (never a token id) before the start, so a
    # window that would begin before index 0 never matches.
    shifted = jnp.pad(haystack, ((0, 0), (o, 0)), constant_values=-1)[:, :M]
    match = match & (shifted == suffix[:, o:o + 1])  # [B, M]
    if n < min_ngram:
      continue
    ok = match & in_range & (n <= suffix_length)[:, None]
    end = jnp.max(jnp.where(ok, ends, -1), axis=1)  # [B] most recent
    found = end >= 0
    best_n = jnp.where(found, n, best_n)  # later (longer) n override shorter ones
    best_end = jnp.where(found, end, best_end)
  return best_n, best_end


def allowed_drafts(n: jax.Array, num_drafts: int, drafts_per_ngram: int | None) -> jax.Array:
  """The adaptive length: min(K, drafts_per_ngram * n), 0 when n = 0. [B] int32."""
  if drafts_per_ngram is None:
    return jnp.where(n > 0, num_drafts, 0).astype(jnp.int32)
  return jnp.minimum(drafts_per_ngram * n, num_drafts).astype(jnp.int32)


def finish_drafts(continuation: jax.Array, available: jax.Array, n: jax.Array,
                  placeholder: jax.Array, num_drafts: int, drafts_per_ngram: int | None):
  """Keep the first min(available, a_n) continuation tokens, placeholder after.

  continuation [B, K], available [B] (continuation tokens that exist), n [B],
  placeholder [B] -> drafts [B, K] int32, count [B] int32.
  """
  count = jnp.minimum(allowed_drafts(n, num_drafts, drafts_per_ngram), available)
  j = jnp.arange(num_drafts, dtype=jnp.int32)[None, :]  # [1, K]
  drafts = jnp.where(j < count[:, None], continuation, placeholder[:, None])
  return drafts.astype(jnp.int32), count.astype(jnp.int32)
