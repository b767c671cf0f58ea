"""Tokens to the host as rounds commit them, from inside the jitted decode loop.

A decoding call runs as one program: prefill, then a `lax.while_loop` of rounds.
To show text while it is being made (`jspec chat`), a program built with a
`DecodeConfig.stream` callback ends every round with an ordered host callback:

    callback(channel, tokens [B, S], lengths [B], prompt_lengths [B])

The callback is static (part of the compiled program), so it should be one
long-lived function shared by every call; `channel` is a traced int32 scalar that
tells the calls apart, so one compiled program serves every call and several
streaming calls can run at once. The engine keeps no listener: the host side
(`jspec.planner.streams`) maps channels to the listeners of the calls in flight.
"""

from __future__ import annotations

from typing import Callable

import jax

# callback(channel [] int32, tokens [B, S] int32, lengths [B], prompt_lengths [B]) on the host
Callback = Callable[..., None]


def emit(callback: Callback, channel: jax.Array, tokens: jax.Array, lengths: jax.Array,
         prompt_lengths: jax.Array) -> None:
  """Inside a jitted loop: send the token buffer [B, S], committed lengths [B] and
  prompt lengths [B] to `callback` on the host, in program order, tagged `channel`."""
  jax.debug.callback(callback, channel, tokens, lengths, prompt_lengths, ordered=True)
