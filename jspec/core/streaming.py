"""Tokens to the host as rounds commit them, from inside the jitted decode loop.

A decoding call runs as one program: prefill, then a `lax.while_loop` of rounds.
To show text while it is being made (`jspec chat`), a program built with
`DecodeConfig.stream` ends every round with an ordered host callback carrying the
token buffer and each row's committed length. The callback is one module-level
function, so programs compiled for streaming are shared between calls; which
listener hears it is set on the host for the duration of one call:

    out = jspec.speculative_generate(..., stream=print_new_tokens)
    # api wraps the call in `with listening(print_new_tokens): ...`

A listener gets, per round, a list with each row's newly committed token ids
(empty for rows that committed nothing). A round commits 1 to K + 1 tokens per row,
so speculation shows up as text arriving in bursts.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import jax
import numpy as np

Listener = Callable[[list[list[int]]], None]

_LOCK = threading.Lock()
_STATE: dict = {"listener": None, "seen": None}


@contextlib.contextmanager
def listening(listener: Listener):
  """Route the rounds of the calls made inside this block to `listener`.

  One listener at a time: a stream belongs to one call.
  """
  with _LOCK:
    if _STATE["listener"] is not None:
      raise RuntimeError("another streaming call is in progress")
    _STATE["listener"] = listener
    _STATE["seen"] = None
  try:
    yield
  finally:
    with _LOCK:
      _STATE["listener"], _STATE["seen"] = None, None


def _emit(tokens, lengths, prompt_lengths) -> None:
  """Host side of the per-round callback: the tokens committed since the last round."""
  listener = _STATE["listener"]
  if listener is None:  # a streaming program run outside `listening`: nobody to tell
    return
  if _STATE["seen"] is None:  # first round of the call: nothing before the prompt's end
    _STATE["seen"] = np.asarray(prompt_lengths, np.int64).copy()
  seen = _STATE["seen"]
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  rows = [tokens[b, seen[b]:lengths[b]].tolist() if lengths[b] > seen[b] else []
          for b in range(tokens.shape[0])]
  seen[:] = np.maximum(seen, lengths)
  if any(rows):
    listener(rows)


def emit(tokens: jax.Array, lengths: jax.Array, prompt_lengths: jax.Array) -> None:
  """Inside a jitted loop: send the token buffer [B, S], committed lengths [B] and
  prompt lengths [B] to the host, in program order."""
  jax.debug.callback(_emit, tokens, lengths, prompt_lengths, ordered=True)
