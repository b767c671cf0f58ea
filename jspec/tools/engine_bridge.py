"""From the server's event loop to `jspec.Engine` and back.

`Engine.submit` blocks briefly (checks and placement on the host), and the engine's worker
thread hands tokens over. Each submitted choice registers a listener on its handle
(`Handle.on_update`): the worker thread only schedules a drain on the event loop
(`call_soon_threadsafe`), and the drain, on the loop, reads what is new (`Handle.read`) and
posts it onto the request's asyncio queue. No thread per request, and the loop never waits
on the engine. Every request ends: the engine answers, cancels, or fails each one it
accepted, and its listener hears it.

Events on the queue, as tuples:

    ("token", choice, id, logprob, top)   top: [(id, logprob)] or None without logprobs
    ("done", choice, RequestOutput)
    ("error", choice, exception)
"""

from __future__ import annotations

import asyncio
import dataclasses

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
    and listen to them. All or none: when one is refused (`QueueFull`, `EngineClosed`,
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
      self._listen(s, loop, queue)
    return done

  def _listen(self, s: Submitted, loop, queue) -> None:
    seen = 0  # tokens posted so far
    finished = False

    def drain():  # on the event loop
      nonlocal seen, finished
      if finished:
        return
      tokens, logprobs, tops, output, error = s.handle.read(seen)
      for j, token in enumerate(tokens):
        self._metrics.tokens(1)
        logprob = top = None
        if self._logprobs and j < len(logprobs):
          logprob = float(logprobs[j])
          top = [(int(t), float(lp)) for t, lp in tops[j]] if j < len(tops) else []
        queue.put_nowait(("token", s.index, int(token), logprob, top))
      seen += len(tokens)
      if error is not None:
        finished = True
        queue.put_nowait(("error", s.index, error))
      elif output is not None:
        finished = True
        queue.put_nowait(("done", s.index, output))

    def listener():  # on the engine's worker thread: schedule, never wait
      try:
        loop.call_soon_threadsafe(drain)
      except RuntimeError:  # the loop has closed: the server is gone, nobody listens
        s.handle.cancel()

    s.handle.on_update(listener)
