"""Retrieval drafting: n-gram lookup in a fixed, shared token buffer as well as the row.

`Datastore` drafts like `NGram` (same matcher, same schedule, same placeholder;
see jspec/drafters/ngram.py for the rules and why it is exact) but also looks the row's
suffix up in a 1-D buffer of tokens shared by every row (REST-style retrieval:
concatenated documentation, code, earlier answers). The buffer is a traced pytree
leaf, so a new datastore of the same length reuses the compiled program.

Which match wins, per row:

  1. the longer match, wherever it is: a match of length n+1 contains one of
     length n, so it is the more specific evidence. Otherwise, with min_ngram 1,
     any row whose last token had appeared before (nearly every row after a few
     tokens) would ignore a three-token hit in the datastore;
  2. at equal length, the row's own context (its text predicts its own
     continuation better than a shared corpus);
  3. within a source, the most recent occurrence (largest index; in the
     datastore, later documents win).

A datastore match ending at index e proposes tokens[e+1], tokens[e+2], ... up to
the buffer's end (a match ending at the last index has nothing to propose and is
skipped); positions past the end, or past the adaptive cap, get the placeholder.
Documents are concatenated as they are (optionally with a separator token
between them), so windows and continuations may run across a boundary; a
separator id that the model never emits keeps continuations from crossing it
usefully.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jspec.drafters import lookup_tree, ngram
from jspec.core.drafter import DraftContext


def _static(default=dataclasses.MISSING):
  return dataclasses.field(default=default, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Datastore(lookup_tree.LookupProposals):
  """Drafts by n-gram lookup in each row's context and in a shared token buffer."""

  tokens: jax.Array  # [N] int32 the shared buffer (traced: a new one of length N reuses code)
  vocab_size: int = _static()
  max_ngram: int = _static(3)
  min_ngram: int = _static(1)
  drafts_per_ngram: int | None = _static(2)  # a_n = drafts_per_ngram * n; None: always K

  def __post_init__(self):
    ngram.check_ngram_settings(self.vocab_size, self.max_ngram, self.min_ngram,
                               self.drafts_per_ngram)
    tokens = self.tokens
    if isinstance(tokens, (list, tuple, np.ndarray)):
      tokens = np.asarray(tokens)
      if tokens.size == 0:
        raise ValueError("the datastore is empty: give it at least one token")
      _check_ids(tokens, self.vocab_size)
      object.__setattr__(self, "tokens", jnp.asarray(tokens, jnp.int32))
    shape = getattr(self.tokens, "shape", None)  # unflattening may pass placeholders
    if shape is not None and len(shape) != 1:
      raise ValueError(f"datastore tokens must be a 1-D array, got shape {tuple(shape)}")

  @classmethod
  def from_sequences(cls, sequences: Sequence[Sequence[int]], vocab_size: int,
                     separator: int | None = None, **settings) -> "Datastore":
    """A datastore of documents (token-id lists) laid end to end, with `separator`
    between consecutive documents when given. `settings`: max_ngram, min_ngram,
    drafts_per_ngram."""
    if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Sequence):
      raise TypeError(f"sequences must be a list of token-id lists, got {type(sequences).__name__}")
    if separator is not None:
      _check_ids(np.asarray([separator]), vocab_size, what="separator")
    parts = []
    for i, seq in enumerate(sequences):
      if isinstance(seq, (str, bytes)):
        raise TypeError(f"sequence {i} is a string: the datastore holds token ids")
      if i > 0 and separator is not None:
        parts.append(np.asarray([separator], np.int64))
      arr = np.asarray(seq).reshape(-1)
      parts.append(arr.astype(np.int64) if arr.size == 0 else arr)
    tokens = np.concatenate(parts) if parts else np.zeros((0,), np.int64)
    if tokens.size == 0:
      raise ValueError("the datastore is empty: give at least one non-empty sequence")
    return cls(tokens=tokens, vocab_size=vocab_size, **settings)

  def lookup(self, context: DraftContext, num_drafts: int):
    """drafts [B, K] int32 and count [B] int32 of proposed (non-placeholder) drafts."""
    own_drafts, own_count, own_n = ngram.context_drafts(
        context, num_drafts, self.max_ngram, self.min_ngram, self.drafts_per_ngram)

    store = self.tokens.astype(jnp.int32)[None, :]  # [1, N]
    N = store.shape[1]
    L = context.lengths
    B = L.shape[0]
    suffix = ngram.suffix_tokens(context.tokens, L, self.max_ngram)
    # A window ending at N-1 has no continuation: the last usable end is N-2.
    n, end = ngram.longest_recent_match(store, suffix, L, jnp.full((B,), N - 2, jnp.int32),
                                        self.min_ngram, self.max_ngram)
    j = jnp.arange(num_drafts, dtype=jnp.int32)[None, :]  # [1, K]
    index = jnp.clip(end[:, None] + 1 + j, 0, N - 1)  # [B, K]
    continuation = store[0][index]
    available = jnp.where(n > 0, N - 1 - end, 0)  # [B] tokens after the window
    placeholder = ngram.last_token(context.tokens, L)
    store_drafts, store_count = ngram.finish_drafts(continuation, available, n, placeholder,
                                                    num_drafts, self.drafts_per_ngram)
    use_store = n > own_n  # longer wins; at equal length the row's own context wins
    drafts = jnp.where(use_store[:, None], store_drafts, own_drafts)
    count = jnp.where(use_store, store_count, own_count)
    return drafts, count

  def propose_tree(self, state, context: DraftContext, tree, params, keys):
    """`TreeDrafter.propose_tree`: the continuations of every occurrence of the longest
    matching suffix in the row and the buffer together, node i the ranks[i]-th most
    frequent after its path (`jspec.drafters.lookup_tree`); state unchanged."""
    del params, keys
    tokens, L = context.tokens, context.lengths
    hay = lookup_tree.row_haystack(tokens, L, self.tokens)
    occurs = lookup_tree.occurrences(hay, ngram.suffix_tokens(tokens, L, self.max_ngram), L,
                                     tokens.shape[1], self.min_ngram, self.max_ngram)
    return lookup_tree.frequency_tree(hay, occurs, tree, ngram.last_token(tokens, L),
                                      self.vocab_size), state


def _check_ids(tokens: np.ndarray, vocab_size, what="datastore token ids") -> None:
  if not np.issubdtype(tokens.dtype, np.integer):
    raise TypeError(f"{what} must be integers, got dtype {tokens.dtype}")
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    raise ValueError(f"{what} must lie in [0, {vocab_size}); got min {tokens.min()}, "
                     f"max {tokens.max()}")
