"""What `generate` and `speculative_generate` return, cut from the program's outputs."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jspec.core import decode


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """What `generate` and `speculative_generate` return: new tokens, lengths, statistics."""

  tokens: jax.Array  # [B, max_new_tokens] int32; -1 after each row's end
  lengths: jax.Array  # [B] int32 new tokens per row, EOS included when emitted
  stats: decode.DecodeStats
  # num_draft_tokens="auto": rounds run at each K, {K: rounds}; None for a fixed K.
  rounds_by_k: dict | None = None
  # return_logprobs (`jspec.core.logprobs`): log p of each new token, 0 after a row's end,
  # so a row's sum is the log-probability of its sequence. None when not asked for.
  logprobs: jax.Array | None = None  # [B, max_new_tokens] f32
  top_ids: jax.Array | None = None  # [B, max_new_tokens, n] int32 (Logprobs(top=n)); -1 after the end
  top_logprobs: jax.Array | None = None  # [B, max_new_tokens, n] f32
  # A `RememberingDrafter`'s memory after the call (`jspec.TokenRecycling`: its adjacency
  # matrix [V, k] int32), for the next call's drafter; None for other drafters.
  memory: Any = None
  # return_features (`generate`): the recorded decoder layers' outputs at every slot of
  # each row's prompt + output, filled for slots 0..prompt_length + length - 2.
  features: jax.Array | None = None  # [B, S, len(layers) * D]


def collect(out, lengths, stats, records, width: int, rounds_by_k: dict | None,
            memory: Any = None, features=None) -> GenerateOutput:
  """The output of a call whose longest row asked for `width` new tokens.

  out [B, S], lengths [B], stats, records (`logprobs.output`, or None) and memory (a
  `RememberingDrafter`'s, or None) as the program returned them."""
  extra = {}
  if records is not None:
    extra = dict(logprobs=records.chosen[:, :width],
                 top_ids=None if records.top_ids is None else records.top_ids[:, :width],
                 top_logprobs=None if records.top_values is None else records.top_values[:, :width])
  return GenerateOutput(tokens=out[:, :width], lengths=lengths, stats=stats,
                        rounds_by_k=rounds_by_k, memory=memory, features=features, **extra)


def rounds_by_k(choices, rounds) -> dict[int, int]:
  """{K: rounds run at K} of an `"auto"` program."""
  return {k: int(r) for k, r in zip(choices, np.asarray(rounds))}
