"""From the server's event loop to `jspec.Engine` and back.

`Engine.submit` and a `Handle`'s token iterator block (the engine's worker thread hands
tokens over under a condition variable), and the server answers many requests on one
asyncio loop. So each submitted choice gets a pump thread that iterates its handle and
posts every token, then the result, onto the request's asyncio queue with
`call_soon_threadsafe`; the loop never waits on the engine. A pump ends when its
request does (finished, stopped, cancelled, or failed with the engine), and every
request ends: the engine answers, cancels, or fails each one it accepted.

Events on the queue, as tuples:

    ("token", choice, id, logprob, top)   top: [(id, logprob)] or None without logprobs
    ("done", choice, RequestOutput)
    ("error", choice, exception)
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from jspec.planner import engine as engine_lib


@dataclasses.dataclass(frozen=True)
class Submitted:
  """One choice in the engine."""

  index: int  # the choice's index in the answer
  handle: engine_lib.Handle
  prompt_length: int


class Bridge:
  """Submits choices to an `Engine` and carries their tokens onto an event loop."""

  def __init__(self, engine: engine_lib.Engine, metrics, logprobs: bool = False):
    self.engine = engine
    self._metrics = metrics
    self._logprobs = logprobs  # the engine gives each token's logprob and top alternatives

  def submit(self, choices, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue
             ) -> list[Submitted]:
    """Submit every (index, prompt ids, `Engine.submit` keywords) of `choices`, in order,
    and start their pumps. All or none: when one is refused (`QueueFull`, `EngineClosed`,
    bad input) the ones already in are cancelled and the error is raised. Blocks briefly
    (checking and placing each request on the host): call it off the event loop."""
    done: list[Submitted] = []
    try:
      for index, prompt, kwargs in choices:
        handle = self.engine.submit(list(prompt), **kwargs)
        done.append(Submitted(index, handle, len(prompt)))
    except BaseException:
      for s in done:
        s.handle.cancel()
      raise
    for s in done:
      threading.Thread(target=self._pump, args=(s, loop, queue), daemon=True,
                       name=f"jspec-serve-{s.handle.id}").start()
    return done

  def _pump(self, s: Submitted, loop, queue) -> None:
    def post(event) -> bool:
      try:
        loop.call_soon_threadsafe(queue.put_nowait, event)
        return True
      except RuntimeError:  # the loop has closed: the server is gone, nobody listens
        s.handle.cancel()
        return False

    try:
      for i, token in enumerate(s.handle):
        self._metrics.tokens(1)
        logprob, top = self._logprob_of(s.handle, i)
        if not post(("token", s.index, int(token), logprob, top)):
          return
      post(("done", s.index, s.handle.result()))
    except BaseException as e:  # the engine failed: the request hears why
      post(("error", s.index, e))

  def _logprob_of(self, handle, i: int):
    if not self._logprobs:
      return None, None
    # The engine appends a token's logprob and alternatives with the token itself (no
    # alternatives when it was built with logprobs=0).
    top = handle.top_logprobs[i] if i < len(handle.top_logprobs) else []
    return float(handle.logprobs[i]), [(int(t), float(lp)) for t, lp in top]
