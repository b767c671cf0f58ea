"""Host-side checks and shapes of `generate`'s inputs: prompts to a padded array,
per-row settings, EOS ids, seeds, and the buckets that keep compiled programs stable.
Everything here runs on NumPy before any tracing and raises clear errors; `request`
gathers one call's inputs into a `Request`."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Sequence

import jax
import numpy as np

PROMPT_BUCKET_MIN = 16
CACHE_BUCKET = 128
EOS_BUCKET = 4


def prompts_to_array(prompts, prompt_lengths, vocab_size):
  """Ragged id lists, or [B, P] with prompt_lengths, to int32 [B, bucket] right-padded
  with zeros and int32 [B] lengths; every id checked against the vocabulary."""
  if prompt_lengths is None:
    if isinstance(prompts, (np.ndarray, jax.Array)):
      arr = np.asarray(prompts)
      if arr.ndim != 2:
        raise ValueError(f"a prompt array must be [B, P], got shape {arr.shape}")
      rows = [list(r) for r in arr]
    elif isinstance(prompts, Sequence) and not isinstance(prompts, (str, bytes)):
      rows = [list(np.asarray(r).reshape(-1)) if not isinstance(r, (str, bytes)) else None
              for r in prompts]
      if any(r is None for r in rows):
        raise TypeError("prompts must hold token ids, not strings")
    else:
      raise TypeError(f"prompts must be a list of token-id lists or an int array, "
                      f"got {type(prompts).__name__}")
    if not rows:
      raise ValueError("prompts is empty: give at least one prompt")
    lengths = np.array([len(r) for r in rows], np.int32)
    if np.any(lengths == 0):
      raise ValueError(f"empty prompt in row(s) {np.flatnonzero(lengths == 0).tolist()}: every "
                       f"prompt needs at least one token (e.g. a BOS id)")
    P = prompt_bucket(int(lengths.max()))
    tokens = np.zeros((len(rows), P), np.int64)
    for b, r in enumerate(rows):
      tokens[b, :len(r)] = r
  else:
    tokens = np.asarray(prompts)
    lengths = np.asarray(prompt_lengths).astype(np.int64).reshape(-1)
    if tokens.ndim != 2 or lengths.shape[0] != tokens.shape[0]:
      raise ValueError(f"prompts must be [B, P] with prompt_lengths [B]; got {tokens.shape} "
                       f"and {lengths.shape}")
    if np.any(lengths < 1) or np.any(lengths > tokens.shape[1]):
      raise ValueError(f"prompt_lengths must lie in [1, {tokens.shape[1]}] (empty prompts are "
                       f"not allowed), got {lengths.tolist()}")
    P = prompt_bucket(tokens.shape[1])
    tokens = np.pad(tokens, ((0, 0), (0, P - tokens.shape[1])))
    # Padding beyond each row's length is never attended to; zero it so ids check cleanly.
    tokens = np.where(np.arange(P)[None, :] < lengths[:, None], tokens, 0)
  if not np.issubdtype(tokens.dtype, np.integer):
    raise TypeError(f"token ids must be integers, got dtype {tokens.dtype}")
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    raise ValueError(f"token ids must lie in [0, {vocab_size}); got min {tokens.min()}, "
                     f"max {tokens.max()}")
  return tokens.astype(np.int32), lengths.astype(np.int32)


def per_row(value, B, name, dtype):
  """A scalar broadcast to [B], or a per-row array checked to be [B]."""
  arr = np.asarray(value)
  if arr.ndim == 0:
    arr = np.full((B,), arr)
  if arr.shape != (B,):
    raise ValueError(f"{name} must be a scalar or one value per row ({B}), got shape {arr.shape}")
  return arr


def per_row_float(value, B, name):
  """Finite f32 [B] from a scalar or one number per row."""
  arr = per_row(value, B, name, np.float32)
  if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
    raise TypeError(f"{name} must be numeric, got {value!r}")
  arr = arr.astype(np.float32)
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} must be finite, got {value!r}")
  return arr


def per_row_int(value, B, name, minimum):
  """int32 [B] >= minimum from an int or one int per row (bools refused)."""
  arr = per_row(value, B, name, np.int32)
  if not np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
    raise TypeError(f"{name} must be an integer (or one per row), got {value!r}")
  if np.any(arr < minimum):
    raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
  return arr.astype(np.int32)


def eos_array(eos_id, vocab_size):
  """EOS ids as int32 [E], E a multiple of EOS_BUCKET, padded with -1 (matches no id)."""
  ids = [] if eos_id is None else np.asarray(eos_id).reshape(-1).tolist()
  for i in ids:
    if not isinstance(i, numbers.Integral) or not 0 <= i < vocab_size:
      raise ValueError(f"eos_id must be ids in [0, {vocab_size}), got {eos_id!r}")
  width = round_up(max(len(ids), 1), EOS_BUCKET)
  return np.array(ids + [-1] * (width - len(ids)), np.int32)


def row_seeds(seed, B):
  """int32 [B] seeds: one int gives row b the stream (seed, b); per-row ints are kept."""
  arr = np.asarray(seed)
  if not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f"seed must be an int or one int per row, got {seed!r}")
  if arr.ndim == 0:
    # One stream per row index: (seed, b) hashed into a 31-bit seed.
    return np.array([mix(int(arr), b) for b in range(B)], np.int32)
  if arr.shape != (B,):
    raise ValueError(f"seed must be an int or one per row ({B}), got shape {arr.shape}")
  return (arr.astype(np.int64) & 0x7FFFFFFF).astype(np.int32)


def mix(seed: int, row: int) -> int:
  """A 31-bit hash of (seed, row)."""
  x = (seed * 0x9E3779B1 + row * 0x85EBCA77 + 0x632BE5AB) & 0xFFFFFFFF
  x ^= x >> 15
  x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
  x ^= x >> 12
  return x & 0x7FFFFFFF


def prompt_bucket(P: int) -> int:
  """The padded prompt width: a power of two, at least PROMPT_BUCKET_MIN."""
  return max(PROMPT_BUCKET_MIN, 1 << (P - 1).bit_length())


def round_up(x: int, m: int) -> int:
  """x rounded up to a multiple of m."""
  return -(-x // m) * m


def cache_bucket(slots: int) -> int:
  """The cache length `generate` picks when `slots` are needed (a multiple of
  CACHE_BUCKET): calls in the same bucket share a compiled program."""
  return round_up(slots, CACHE_BUCKET)


@dataclasses.dataclass(frozen=True)
class Request:
  """One call's inputs, checked, as host NumPy arrays (placed on devices later)."""

  tokens: np.ndarray  # [B, P] int32 right-padded prompts (P a bucket, never past the cache)
  lengths: np.ndarray  # [B] int32 prompt lengths
  max_new: np.ndarray  # [B] int32 >= 1
  seeds: np.ndarray  # [B] int32
  temperature: np.ndarray  # [B] f32 >= 0 (0: greedy)
  top_k: np.ndarray  # [B] int32 >= 0 (0: off)
  top_p: np.ndarray  # [B] f32 in (0, 1]
  min_p: np.ndarray  # [B] f32 in [0, 1] (0: off)
  repetition_penalty: np.ndarray  # [B] f32 > 0 (1: off)
  presence_penalty: np.ndarray  # [B] f32 (0: off)
  frequency_penalty: np.ndarray  # [B] f32 (0: off)
  logit_bias: np.ndarray | None  # [B, V] f32, or None: no bias
  eos_ids: np.ndarray  # [E] int32, -1 padded
  cache_length: int  # S slots per row

  @property
  def batch(self) -> int:
    """B, the rows of the call."""
    return int(self.tokens.shape[0])

  @property
  def greedy(self) -> bool:
    """Every row greedy on the model's own logits: the static argmax-only program."""
    return bool(np.all(self.temperature == 0)) and not self.penalized and self.logit_bias is None

  @property
  def penalized(self) -> bool:
    """Some row has a repetition, presence or frequency penalty (the loop then counts
    each row's tokens)."""
    return bool(np.any(self.repetition_penalty != 1.0) | np.any(self.presence_penalty != 0.0)
                | np.any(self.frequency_penalty != 0.0))

  @property
  def filtered(self) -> bool:
    """Some row keeps a top-k, top-p or min-p set (a round then costs more)."""
    return bool(np.any((self.top_k > 0) | (self.top_p < 1.0) | (self.min_p > 0.0)))


def logit_bias_array(logit_bias, B: int, vocab_size: int) -> np.ndarray | None:
  """f32 [B, V] from None, a dict {id: bias} for every row, a list of B such dicts (or
  None), or an array [V] or [B, V]; ids checked against the vocabulary, biases finite."""
  if logit_bias is None:
    return None
  per_row_dicts = (isinstance(logit_bias, (list, tuple)) and len(logit_bias) > 0
                   and all(d is None or isinstance(d, dict) for d in logit_bias))
  if isinstance(logit_bias, dict) or per_row_dicts:
    rows = [logit_bias] * B if isinstance(logit_bias, dict) else list(logit_bias)
    if len(rows) != B:
      raise ValueError(f"logit_bias must be one dict for every row or one per row ({B}), got "
                       f"{len(rows)}")
    out = np.zeros((B, vocab_size), np.float32)
    for b, row in enumerate(rows):
      for i, bias in (row or {}).items():
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < vocab_size:
          raise ValueError(f"logit_bias ids must lie in [0, {vocab_size}), got {i!r} in row {b}")
        if not isinstance(bias, numbers.Real) or not np.isfinite(bias):
          raise ValueError(f"logit_bias values must be finite numbers, got {bias!r} for id {i} "
                           f"in row {b}")
        out[b, i] = bias
    return out
  arr = np.asarray(logit_bias)
  if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
    raise TypeError(f"logit_bias must be a dict, one dict per row or an array, got {logit_bias!r}")
  if arr.shape == (vocab_size,):
    arr = np.broadcast_to(arr, (B, vocab_size))
  if arr.shape != (B, vocab_size):
    raise ValueError(f"a logit_bias array must be [V] or [B, V] = [{B}, {vocab_size}], got shape "
                     f"{arr.shape}")
  if not np.all(np.isfinite(arr)):
    raise ValueError("logit_bias values must be finite")
  return arr.astype(np.float32)


def request(target, prompts, prompt_lengths, max_new_tokens, temperature, top_k, top_p, eos_id,
            seed, cache_length, block: int, min_p=0.0, repetition_penalty=1.0,
            presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None) -> Request:
  """Every per-call input of `generate` checked and shaped, before any tracing.

  block: slots one verify call needs past the longest row (K + 1, or a tree's nodes)."""
  tokens, lengths = prompts_to_array(prompts, prompt_lengths, target.vocab_size)
  B = tokens.shape[0]
  max_new = per_row_int(max_new_tokens, B, "max_new_tokens", minimum=1)
  temps = per_row_float(temperature, B, "temperature")
  top_ks = per_row_int(top_k, B, "top_k", minimum=0)
  top_ps = per_row_float(top_p, B, "top_p")
  if np.any(temps < 0):
    raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature!r}")
  if np.any(~((top_ps > 0) & (top_ps <= 1))):
    raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
  min_ps = per_row_float(min_p, B, "min_p")
  if np.any(~((min_ps >= 0) & (min_ps <= 1))):
    raise ValueError(f"min_p must lie in [0, 1], got {min_p!r}")
  repetition = per_row_float(repetition_penalty, B, "repetition_penalty")
  if np.any(repetition <= 0):
    raise ValueError(f"repetition_penalty must be > 0 (1 is none), got {repetition_penalty!r}")
  presence = per_row_float(presence_penalty, B, "presence_penalty")
  frequency = per_row_float(frequency_penalty, B, "frequency_penalty")
  bias = logit_bias_array(logit_bias, B, target.vocab_size)
  eos = eos_array(target.eos_ids if eos_id is None else eos_id, target.vocab_size)
  seeds = row_seeds(seed, B)
  longest, most_new = int(lengths.max()), int(max_new.max())
  if target.max_length is not None and longest + most_new > target.max_length:
    raise ValueError(
        f"longest prompt ({longest}) + max_new_tokens ({most_new}) exceeds the model's "
        f"max_position_embeddings ({target.max_length})")
  needed = longest + most_new + block
  if cache_length is None:
    S = cache_bucket(needed)
  else:
    S = int(cache_length)
    if S < needed:
      raise ValueError(
          f"cache_length {S} is too small: the longest prompt ({longest}) + max_new_tokens "
          f"({most_new}) + a verify block of {block} = {needed} slots are needed")
  # The prompt bucket never outgrows the cache; what is cut here is padding only.
  return Request(tokens=tokens[:, :S], lengths=lengths, max_new=max_new, seeds=seeds,
                 temperature=temps, top_k=top_ks, top_p=top_ps, min_p=min_ps,
                 repetition_penalty=repetition, presence_penalty=presence,
                 frequency_penalty=frequency, logit_bias=bias, eos_ids=eos, cache_length=S)
