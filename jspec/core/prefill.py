"""Prefill: write a batch of right-padded prompts into a model's cache, in chunks.

Prompts are padded to a bucket (`inputs.prompt_bucket`, powers of two) so that calls of
similar length share one compiled program. Fed in one call, the padding costs as much
as the prompt: a 40-token question in a 256 bucket pays for 255 tokens. `prefill`
feeds the prompt in chunks of `CHUNK` tokens inside a `lax.while_loop` that stops after
the last chunk holding a real token of the longest row, so the work follows the real
prompt lengths while every shape stays static.

    slots   0 ........ 63 | 64 ....... 127 | 128 ... (P - 2)
    chunk         0       |        1       |   2 (skipped when no row reaches it)

The last chunk starts at P - 1 - CHUNK at the latest (it may overlap the one before and
rewrite those slots with the same tokens at the same positions), so no slot past P - 2
is ever written, however short the cache is. Slots past a row's own prompt hold the
padding's K/V, as a one-call prefill leaves them; rounds overwrite them before any
query can see them (docs/architecture.md, the decode-state invariant).

On SmolLM2-135M on the 2-core CPU, one call on T tokens cost 2.8 ms per token at
T = 64, 2.9 at 128 and 2.7 at 256, against 3.8 at T = 32 and 5.2 at T = 16 (in-loop,
medians of three): 64-token chunks lose little to one long call and skip the padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jspec.core.model import Model

CHUNK = 64  # tokens per prefill call


def prefill(model: Model, tokens, prompt_lengths, cache, hidden: bool = False):
  """Run `model` over every prompt token but the last, writing its K/V into `cache`.

  tokens [B, P] int32 right-padded prompts, P >= 2; prompt_lengths [B] int32 in 1..P;
  cache the model's cache pytree (slots 0..P-2 are written). Returns (cache, hidden):
  hidden [B, P-1, D], the final hidden state at every prefilled slot, when `hidden`
  (drafters that read target features need it), else None. Entries past a row's own
  prompt are not meaningful, as with one call over the padded block.
  """
  cache, h, _ = observed(model, tokens, prompt_lengths, cache, hidden, 0)
  return cache, h


def observed(model: Model, tokens, prompt_lengths, cache, hidden: bool, top_k: int):
  """`prefill`, and with top_k > 0 also top_ids [B, P-1, top_k] int32: the ids of the
  top_k largest logits at every prefilled slot, best first (for a
  `PromptObservingDrafter`; None when top_k is 0, and then XLA drops the LM head of
  the prefill, whose logits nothing reads). Returns (cache, hidden, top_ids)."""
  B, P = tokens.shape
  n = P - 1  # slots to fill
  small = _prompt_sized(model, cache, B, n)
  if small is not None:  # attend over the prompt's n slots, not the whole cache's S
    small, h, ids = observed(model, tokens, prompt_lengths, small, hidden, top_k)
    return _merged(cache, small), h, ids

  def top(logits):
    return lax.top_k(logits, top_k)[1].astype(jnp.int32) if top_k else None

  C = min(CHUNK, n)
  if C == n:  # one call covers it (static)
    logits, h, cache = model.apply(tokens[:, :n], cache, jnp.zeros((B,), jnp.int32))
    return cache, (h if hidden else None), top(logits)
  body_tokens = tokens[:, :n]
  # Chunks that hold a real token of some row: slots 0 .. max(L) - 2.
  needed = (jnp.max(prompt_lengths).astype(jnp.int32) - 2) // C + 1

  def chunk(carry):
    i, cache, h_all, ids_all = carry
    at = jnp.minimum(i * C, n - C)  # the last chunk ends at slot n - 1
    block = lax.dynamic_slice_in_dim(body_tokens, at, C, axis=1)  # [B, C]
    logits, h, cache = model.apply(block, cache, jnp.full((B,), at, jnp.int32))
    if h_all is not None:
      h_all = lax.dynamic_update_slice_in_dim(h_all, h.astype(h_all.dtype), at, axis=1)
    if ids_all is not None:
      ids_all = lax.dynamic_update_slice_in_dim(ids_all, top(logits), at, axis=1)
    return i + 1, cache, h_all, ids_all

  h_all = None
  if hidden:
    D = jax.eval_shape(lambda c: model.apply(body_tokens[:, :C], c, jnp.zeros((B,), jnp.int32)),
                       cache)[1]
    h_all = jnp.zeros((B, n) + D.shape[2:], D.dtype)  # [B, P-1, D]
  ids_all = jnp.zeros((B, n, top_k), jnp.int32) if top_k else None  # [B, P-1, k]
  _, cache, h_all, ids_all = lax.while_loop(lambda c: c[0] < needed, chunk,
                                            (jnp.zeros((), jnp.int32), cache, h_all, ids_all))
  return cache, h_all, ids_all


def _prompt_sized(model: Model, cache, B: int, n: int):
  """A fresh cache of n slots shaped like `cache` of S > n slots, or None.

  A prefill chunk's attention reads every slot of the cache it is given, though none
  past the prompt is visible to it: on SmolLM2 a 64-token chunk cost 1.25x as much
  against 384 slots as against 128. So the prompt goes into a cache of its own size,
  copied into the big one after. None (prefill the big cache itself) when S == n or
  when the two caches differ other than by one axis per buffer, the slot axis, so
  the copy is certain to land where a direct prefill would have written.
  """
  leaves = jax.tree_util.tree_leaves(cache)
  dtype = leaves[0].dtype if leaves else None
  small = jax.eval_shape(lambda: model.init_cache(B, n, dtype))
  if jax.tree_util.tree_structure(small) != jax.tree_util.tree_structure(cache):
    return None
  differing = 0
  for a, b in zip(jax.tree_util.tree_leaves(small), leaves):
    if a.ndim != b.ndim or a.dtype != b.dtype:
      return None
    axes = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
    if len(axes) > 1 or (axes and (a.shape[axes[0]], b.shape[axes[0]]) != (n, b.shape[axes[0]])):
      return None
    differing += len(axes)
  if differing == 0:
    return None
  return model.init_cache(B, n, dtype)


def _merged(cache, small):
  """`cache` with `small` (same buffers, n <= S slots) written over its first n slots."""
  def put(big, part):
    if big.shape == part.shape:
      return part
    return lax.dynamic_update_slice(big, part.astype(big.dtype), (0,) * big.ndim)
  return jax.tree_util.tree_map(put, cache, small)
