"""Repetition, presence and frequency penalties and a logit bias, exact under speculation.

Per row, in vLLM's order, before temperature and the filters (`sampling`):

    logit bias          l += bias[v]
    repetition penalty  for v seen in the prompt or the output: l / r if l > 0, else l * r
    frequency           l -= frequency * count[v]        (output tokens only)
    presence            l -= presence * (count[v] > 0)   (output tokens only)

(transformers' repetition penalty is the same; the presence and frequency penalties are
OpenAI's, counting the output only, as vLLM does.) Greedy rows take the argmax of the
penalised logits.

The counts live in the decode state (`Seen`) and grow as tokens commit. At verify
time the position after draft d_i must see d_1 .. d_i as output tokens too, so that
every position's distribution is the one plain decoding would use after the same
tokens: `block_counts` adds to the committed counts the drafts on the path to each
position (the drafts before it in a chain, its ancestors in a tree), kept sparse (the
counts at the path's ids, never a [B, W, V] array). The acceptance rule then runs on
those distributions and stays exact. Drafters propose from their own, unpenalised
distributions (their drafts are judged against the penalised target all the same).

Which settings are on is known when tracing: each of them is an array or None in
`SamplingParams` (part of the pytree structure), so a call without penalties runs no
extra work and keeps no counts.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec.core.sampling import SamplingParams


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Seen:
  """What each row has seen so far: the penalties' state."""

  counts: jax.Array  # [B, V] int32 occurrences of each id among the output tokens
  prompt: jax.Array  # [B, V] bool ids in the prompt


def active(params: SamplingParams | None) -> bool:
  """Static: whether these settings change any logits (penalties or a logit bias)."""
  return params is not None and (params.penalized or params.logit_bias is not None)


def init(params: SamplingParams | None, tokens: jax.Array, prompt_lengths: jax.Array,
         vocab_size: int) -> Seen | None:
  """The state before any output: tokens [B, P] int32 right-padded prompts,
  prompt_lengths [B]. None when no row is penalised (static)."""
  if params is None or not params.penalized:
    return None
  B, P = tokens.shape
  valid = jnp.arange(P, dtype=jnp.int32)[None, :] < prompt_lengths[:, None]  # [B, P]
  rows = jnp.arange(B, dtype=jnp.int32)[:, None]
  prompt = jnp.zeros((B, vocab_size), bool).at[rows, tokens].max(valid)
  return Seen(counts=jnp.zeros((B, vocab_size), jnp.int32), prompt=prompt)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockCounts:
  """The drafts each verify position counts as output, kept sparse: per position, the
  counts at the ids of the drafts on its path, never a [B, W, V] array. A position's
  count of any other id is the committed one (`Seen.counts`)."""

  ids: jax.Array  # [B, M] int32 the block's drafts (M = W - 1)
  on_path: jax.Array  # [B, W, M] bool draft m is on the path to position n
  extra: jax.Array  # [B, W, M] f32 how often ids[m] occurs among position n's path drafts


def block_counts(block: jax.Array, ancestors: jax.Array) -> BlockCounts | None:
  """What each verify position adds to the committed output counts (`BlockCounts`), or
  None for a block without drafts (plain decoding: the committed counts alone).

  block [B, W] int32: the verify block, its first token the last committed one (already
  counted); ancestors [W, W] or [B, W, W] bool, ancestors[n, m] when block token m is on
  the path to position n (n itself included): lower-triangular for a chain, the tree's
  ancestor mask for a tree. The arrays are [B, W, W - 1]: at the 81-node token-recycling
  tree and V = 49,152 the dense [B, W, V] counts were 49,152 / 80 times larger."""
  B, W = block.shape
  if W == 1:  # plain decoding: no drafts
    return None
  ids = block[:, 1:]  # [B, M]
  on_path = jnp.broadcast_to(ancestors, (B, W, W))[:, :, 1:].astype(bool)  # [B, W, M]
  same = (ids[:, :, None] == ids[:, None, :]).astype(jnp.float32)  # [B, M, M]
  # Zeros and ones summed at most W at a time: exact at any matmul precision (bf16, TF32).
  extra = jnp.einsum("bnk,bmk->bnm", on_path.astype(jnp.float32), same)  # [B, W, M]
  return BlockCounts(ids=ids, on_path=on_path, extra=extra)


def apply(logits: jax.Array, params: SamplingParams, seen: Seen | None,
          counts: BlockCounts | None = None) -> jax.Array:
  """The logits after bias and penalties: logits [B, W, V] f32; counts the drafts each
  position counts as output besides seen's (`block_counts`; None: seen's, at every one).

  Every id off a position's path is penalised with the committed counts, broadcast over
  the positions; the ids on its path are then recomputed with their counts and written
  over those, by the same formula (so the values are bit for bit those of a dense
  [B, W, V] count)."""
  if params.logit_bias is not None:
    logits = logits + params.logit_bias[:, None, :].astype(logits.dtype)
  if seen is None:
    return logits
  committed = seen.counts[:, None, :].astype(jnp.float32)  # [B, 1, V]
  out = _penalize(logits, params, seen.prompt[:, None, :], committed)
  if counts is None:
    return out
  B, W, V = logits.shape
  M = counts.ids.shape[1]
  at = jnp.broadcast_to(counts.ids[:, None, :], (B, W, M))  # [B, W, M]
  path_logits = jnp.take_along_axis(logits, at, axis=-1)
  path_counts = (jnp.take_along_axis(seen.counts, counts.ids, axis=-1)[:, None, :]
                 .astype(jnp.float32) + counts.extra)
  path_prompt = jnp.take_along_axis(seen.prompt, counts.ids, axis=-1)[:, None, :]
  fixed = _penalize(path_logits, params, path_prompt, path_counts)
  # Off-path entries go out of range and are dropped; an id on the path twice gets the
  # same value from both of its entries.
  column = jnp.where(counts.on_path, at, V)
  rows = jnp.arange(B, dtype=jnp.int32)[:, None, None]
  positions = jnp.arange(W, dtype=jnp.int32)[None, :, None]
  return out.at[rows, positions, column].set(fixed, mode="drop")


def _penalize(logits, params: SamplingParams, prompt, counts):
  """vLLM's penalties on logits [B, W, X] (after the bias), with prompt [B, 1 or W, X]
  bool and counts [B, 1 or W, X] f32 the output counts at the same ids."""
  in_output = counts > 0.0
  if params.repetition_penalty is not None:
    r = params.repetition_penalty[:, None, None]
    repeated = prompt | in_output
    logits = jnp.where(repeated, jnp.where(logits > 0.0, logits / r, logits * r), logits)
  if params.frequency_penalty is not None:
    logits = logits - params.frequency_penalty[:, None, None] * counts
  if params.presence_penalty is not None:
    logits = logits - jnp.where(in_output, params.presence_penalty[:, None, None], 0.0)
  return logits


def after_commit(seen: Seen | None, emitted: jax.Array, count: jax.Array) -> Seen | None:
  """Counts with each row's first count[b] tokens of emitted [B, W] added."""
  if seen is None:
    return None
  W = emitted.shape[1]
  committed = (jnp.arange(W, dtype=jnp.int32)[None, :] < count[:, None]).astype(jnp.int32)
  rows = jnp.arange(emitted.shape[0], dtype=jnp.int32)[:, None]
  return dataclasses.replace(seen, counts=seen.counts.at[rows, emitted].add(committed))
