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
position (the drafts before it in a chain, its ancestors in a tree). The acceptance
rule then runs on those distributions and stays exact. Drafters propose from their
own, unpenalised distributions (their drafts are judged against the penalised target
all the same).

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


def block_counts(seen: Seen, block: jax.Array, ancestors: jax.Array) -> jax.Array:
  """Output counts each verify position sees: f32 [B, W, V].

  block [B, W] int32: the verify block, its first token the last committed one (already
  counted); ancestors [W, W] or [B, W, W] bool, ancestors[n, m] when block token m is on
  the path to position n (n itself included): lower-triangular for a chain, the tree's
  ancestor mask for a tree. Counts are small integers, exact in f32."""
  B, W = block.shape
  V = seen.counts.shape[-1]
  counts = seen.counts[:, None, :].astype(jnp.float32)
  if W == 1:  # plain decoding: no drafts
    return counts
  ancestors = jnp.broadcast_to(ancestors, (B, W, W)).astype(jnp.float32)
  drafts = jax.nn.one_hot(block[:, 1:], V, dtype=jnp.float32)  # [B, W-1, V]
  # Zeros and ones summed W at a time: exact at any matmul precision (bf16, TF32 too).
  return counts + jnp.einsum("bnm,bmv->bnv", ancestors[:, :, 1:], drafts)  # [B, W, V]


def apply(logits: jax.Array, params: SamplingParams, seen: Seen | None,
          counts: jax.Array | None = None) -> jax.Array:
  """The logits after bias and penalties: logits [B, W, V] f32; counts [B, W, V] (f32,
  `block_counts`) the output counts at each position (None: seen's, at every one)."""
  if params.logit_bias is not None:
    logits = logits + params.logit_bias[:, None, :].astype(logits.dtype)
  if seen is None:
    return logits
  if counts is None:
    counts = seen.counts[:, None, :].astype(jnp.float32)
  in_output = counts > 0.0
  if params.repetition_penalty is not None:
    r = params.repetition_penalty[:, None, None]
    repeated = seen.prompt[:, None, :] | in_output
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
