"""Log-probabilities of the emitted tokens, recorded as rounds commit them.

Every emitted token, whether an accepted draft, a correction drawn from the
residual or the bonus, is distributed exactly as the target's processed
distribution p at its position (that is what exact acceptance guarantees). So the
log-probability recorded for a token is log p(token) at that position, read from
the verify call's logits: the same number baseline decoding records for the same
token after the same prefix, up to float error. Two choices of p:

    processed (default)  after the constraint's mask (`constraint=`), temperature,
                         top-k and top-p: the distribution the token is drawn
                         from; greedy rows draw the argmax with certainty, so
                         they record 0 (log 1).
    raw                  the model's own log_softmax of its unprocessed logits
                         (temperature 1, no filtering, and no constraint mask),
                         whatever the row's sampling settings and constraint.

Optionally the `top` most likely ids at each position and their log-probabilities
under the same distribution. A greedy row's top ids are the ids of its largest
logits (after the constraint's mask, the logit bias and the penalties: the logits
its argmax is taken over) in order, with log-probabilities 0 for
the first and -inf after: the same whether the batch is all greedy or mixed, so a
row's records never depend on the rows beside it. Ties among a sampled row's
equal probabilities come in an order of XLA's choosing.

The buffers live beside the token buffer, slot for slot: entry s of a row is the
log-probability of `tokens[s]`, written when slot s is committed.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
from jax import lax


@dataclasses.dataclass(frozen=True)
class Logprobs:
  """What to record (static: part of the compiled program).

  raw=False records log p under the processed distribution the token is drawn from:
  the constraint's mask (`constraint=`), then temperature, top-k and top-p. raw=True
  records the model's own log_softmax, before all of those, the mask included.
  """

  raw: bool = False  # True: the model's own log_softmax (unprocessed, unmasked)
  top: int = 0  # also the `top` most likely ids per position and their log-probabilities

  def __post_init__(self):
    if not isinstance(self.raw, bool):
      raise TypeError(f"Logprobs.raw must be a bool, got {self.raw!r}")
    if isinstance(self.top, bool) or not isinstance(self.top, numbers.Integral) or self.top < 0:
      raise ValueError(f"Logprobs.top must be an integer >= 0, got {self.top!r}")


def as_spec(value) -> Logprobs | None:
  """`return_logprobs` as given to `generate`: False/None, True, or a `Logprobs`."""
  if value is None or value is False:
    return None
  if value is True:
    return Logprobs()
  if isinstance(value, Logprobs):
    return value
  raise TypeError(f"return_logprobs must be a bool or a jspec.Logprobs, got {value!r}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LogprobBuffers:
  """Per-slot records, aligned with `DecodeState.tokens`."""

  chosen: jax.Array  # [B, S] f32 log p of the token at each slot (0 where nothing is recorded)
  top_ids: jax.Array | None  # [B, S, n] int32, or None when top = 0
  top_values: jax.Array | None  # [B, S, n] f32


def init_buffers(spec: Logprobs, B: int, S: int) -> LogprobBuffers:
  """Empty buffers for B rows of S slots (a decode state's, `decode.init_state`)."""
  n = spec.top
  return LogprobBuffers(
      chosen=jnp.zeros((B, S), jnp.float32),
      top_ids=jnp.zeros((B, S, n), jnp.int32) if n else None,
      top_values=jnp.zeros((B, S, n), jnp.float32) if n else None)


def of_round(spec: Logprobs, logits: jax.Array, p: jax.Array | None, emitted: jax.Array,
             greedy: jax.Array | None = None):
  """The round's records at each block position.

  logits [B, W, V]: the verify logits that predict emitted[:, j] (for a tree, those
  of the accepted path's nodes): for `spec.raw` the model's own, before any
  constraint mask, otherwise the ones p was computed from (after the constraint mask,
  the logit bias and the penalties); p [B, W, V] the
  processed distributions, or None for a statically all-greedy round (p is then
  the one-hot at the argmax); greedy [B] bool, the rows with temperature 0 when p
  is given; emitted [B, W] int32. Returns (chosen [B, W], top_ids [B, W, n] | None,
  top_values [B, W, n] | None).
  """
  logits = logits.astype(jnp.float32)
  n = spec.top
  top_ids = top_values = None
  if spec.raw:
    # log_softmax at the chosen ids only: the [B, W, V] array is never formed.
    lse = jax.nn.logsumexp(logits, axis=-1)  # [B, W]
    chosen = jnp.take_along_axis(logits, emitted[:, :, None], axis=-1)[..., 0] - lse
    if n:
      top_values, top_ids = lax.top_k(logits, n)
      top_values = top_values - lse[:, :, None]
  elif p is None:
    # All rows greedy: every emitted token is the argmax, drawn with probability 1.
    chosen = jnp.zeros(emitted.shape, jnp.float32)
    if n:
      top_ids, top_values = _greedy_top(logits, n)
  else:
    # log of the processed p (softmax in f32): tokens it gives 0 are never emitted.
    chosen = jnp.log(jnp.take_along_axis(p, emitted[:, :, None], axis=-1)[..., 0])
    if n:
      top_p, top_ids = lax.top_k(p, n)
      top_values = jnp.log(top_p)
      if greedy is not None:
        # A greedy row's one-hot p ties every id but the argmax at 0, and top_k would
        # fill the list with the lowest ids: ranked by the logits instead, as when the
        # batch is all greedy, so the row's records do not depend on its neighbours.
        g_ids, g_values = _greedy_top(logits, n)
        g = greedy[:, None, None]
        top_ids = jnp.where(g, g_ids, top_ids)
        top_values = jnp.where(g, g_values, top_values)
  if top_ids is not None:
    top_ids = top_ids.astype(jnp.int32)
  return chosen, top_ids, top_values


def _greedy_top(logits: jax.Array, n: int):
  """A greedy position's top n: the ids of the n largest logits, log p 0 for the first
  (the argmax, drawn with certainty) and -inf for the others."""
  _, top_ids = lax.top_k(logits, n)
  first = jnp.arange(n)[None, None, :] == 0
  top_values = jnp.broadcast_to(jnp.where(first, 0.0, -jnp.inf), top_ids.shape)
  return top_ids, top_values


def write(buffers: LogprobBuffers, positions: jax.Array, records) -> LogprobBuffers:
  """Scatter a round's records at positions [B, W] (S = out of range, dropped)."""
  chosen, top_ids, top_values = records

  def put(buffer, values):
    return jax.vmap(lambda row, pos, val: row.at[pos].set(val, mode="drop"))(
        buffer, positions, values)

  return LogprobBuffers(
      chosen=put(buffers.chosen, chosen),
      top_ids=None if top_ids is None else put(buffers.top_ids, top_ids),
      top_values=None if top_values is None else put(buffers.top_values, top_values))


def output(buffers: LogprobBuffers, prompt_lengths: jax.Array, lengths: jax.Array):
  """The new tokens' records, left-aligned like `decode.output_tokens`: chosen
  [B, S] with 0 past each row's end (so a row's sum is its sequence log-probability),
  top ids -1 and top values 0 there."""
  B, S = buffers.chosen.shape
  j = jnp.arange(S, dtype=jnp.int32)[None, :]
  valid = j < (lengths - prompt_lengths)[:, None]  # [B, S]
  idx = jnp.minimum(prompt_lengths[:, None] + j, S - 1)

  def gather(buffer, fill):
    index = idx if buffer.ndim == 2 else idx[:, :, None]
    mask = valid if buffer.ndim == 2 else valid[:, :, None]
    return jnp.where(mask, jnp.take_along_axis(buffer, index, axis=1), fill)

  return LogprobBuffers(
      chosen=gather(buffers.chosen, 0.0),
      top_ids=None if buffers.top_ids is None else gather(buffers.top_ids, -1),
      top_values=None if buffers.top_values is None else gather(buffers.top_values, 0.0))
