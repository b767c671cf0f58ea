"""Listeners of streaming calls: the host side of `jspec.core.streaming`.

A call with `stream=listener` opens a channel here for as long as it runs; its
program sends every round's tokens to `deliver` tagged with the channel, and
`deliver` passes each row's newly committed ids to that call's listener. One
compiled program serves every streaming call (the callback, `deliver`, is the same
function for all of them), and calls on different threads stream side by side.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Callable

import numpy as np

# listener(rows): rows[b] the ids row b committed since the last round (may be empty)
Listener = Callable[[list[list[int]]], None]


class _Channel:
  def __init__(self, listener: Listener):
    self.listener = listener
    self.seen: np.ndarray | None = None  # [B] committed length already told


_LOCK = threading.Lock()
_OPEN: dict[int, _Channel] = {}
_NUMBERS = itertools.count(1)


@contextlib.contextmanager
def channel(listener: Listener):
  """A channel number routed to `listener` until the block ends."""
  if not callable(listener):
    raise TypeError(f"stream must be a callable, got {type(listener).__name__}")
  with _LOCK:
    number = next(_NUMBERS) % (2**31 - 1)
    _OPEN[number] = _Channel(listener)
  try:
    yield number
  finally:
    with _LOCK:
      _OPEN.pop(number, None)


def deliver(number, tokens, lengths, prompt_lengths) -> None:
  """The programs' per-round callback: the tokens each row committed since the last."""
  with _LOCK:
    open_channel = _OPEN.get(int(number))
  if open_channel is None:  # a program run outside `channel`: nobody to tell
    return
  if open_channel.seen is None:  # first round of the call: nothing before the prompt's end
    open_channel.seen = np.asarray(prompt_lengths, np.int64).copy()
  seen = open_channel.seen
  tokens, lengths = np.asarray(tokens), np.asarray(lengths)
  rows = [tokens[b, seen[b]:lengths[b]].tolist() if lengths[b] > seen[b] else []
          for b in range(tokens.shape[0])]
  seen[:] = np.maximum(seen, lengths)
  if any(rows):
    open_channel.listener(rows)
