"""Drafting over a subset of the vocabulary (FR-Spec, Zhao et al. 2025).

A drafter that scores only N of the V token ids (the most frequent in its training
data) skips most of its output layer: FR-Spec measured about 75% less output-layer
cost from scoring a quarter of a 128k vocabulary, at a small loss of acceptance.
Its drafts lie in the subset and its q is zero outside it; acceptance stays exact,
since the target reaches any other token through the residual max(p - q, 0),
which keeps all of p's mass there. `DraftModel.reduced` and `Eagle.reduced` use
these helpers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import quant


def check_ids(ids, vocab_size: int) -> jax.Array:
  """`ids` as int32 [N] after checking them: distinct token ids in [0, V), N >= 1."""
  ids = np.asarray(ids)
  if ids.ndim != 1 or ids.size < 1 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"ids must be a non-empty 1-D array of token ids, got shape {ids.shape} "
                     f"of {ids.dtype}")
  if ids.min() < 0 or ids.max() >= vocab_size:
    raise ValueError(f"ids must lie in [0, {vocab_size}) (the draft's vocabulary), got "
                     f"[{ids.min()}, {ids.max()}]")
  if np.unique(ids).size != ids.size:
    raise ValueError("ids must be distinct: a token listed twice would get two shares of q")
  return jnp.asarray(ids, jnp.int32)


def head_rows(embed, lm_head, ids: jax.Array) -> jax.Array:
  """The output-head rows of `ids`: [N, D] from embed [V, D] (tied) or lm_head [D, V],
  plain arrays or quantized (`quant.take`: the N rows dequantized, not the table)."""
  if lm_head is None:
    return quant.take(embed, ids, axis=0)
  return quant.take(lm_head, ids, axis=1).T


def scores(hidden: jax.Array, rows: jax.Array, softcap: float | None) -> jax.Array:
  """f32 logits over the subset: hidden [..., D] x rows [N, D] -> [..., N]."""
  out = jnp.einsum("...d,nd->...n", hidden.astype(rows.dtype), rows,
                   preferred_element_type=jnp.float32)
  return jnp.tanh(out / softcap) * softcap if softcap else out


def token_ids(ids: jax.Array, index: jax.Array) -> jax.Array:
  """Token ids of positions in the subset (any shape)."""
  return jnp.take(ids, index).astype(jnp.int32)


def spread(ids: jax.Array, q: jax.Array, vocab_size: int) -> jax.Array:
  """q [..., N] over the subset as [..., V], zero elsewhere."""
  return jnp.zeros(q.shape[:-1] + (vocab_size,), q.dtype).at[..., ids].set(q)


def frequent_tokens(tokens, count: int, vocab_size: int) -> np.ndarray:
  """The `count` most frequent ids of a token stream (ties to the lower id), ascending:
  the subset FR-Spec drafts over."""
  tokens = np.asarray(tokens).reshape(-1)
  if not 1 <= count <= vocab_size:
    raise ValueError(f"count must lie in [1, {vocab_size}], got {count}")
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    raise ValueError(f"token ids must lie in [0, {vocab_size})")
  freq = np.bincount(tokens.astype(np.int64), minlength=vocab_size)
  order = np.lexsort((np.arange(vocab_size), -freq))  # by count, then by id
  return np.sort(order[:count]).astype(np.int32)
