"""The choices of one request to `jspec serve`, as their engine events arrive.

Each event from `engine_bridge` (a token, the end, an engine failure) becomes the pieces
of text to send: a choice's text goes through its `stop_text.StopText`, which cuts it at
a stop string, and then the choice's engine request is cancelled at once so its slot
frees at the next step (tokens already decoded past the stop are dropped). The same
pieces make a streamed answer (one chunk each) and a whole one (joined), so the two
cannot disagree. A choice the engine cancels without being asked (the server is closing
without draining) or fails raises `Aborted` with the error to send.
"""

from __future__ import annotations

import dataclasses

from jspec.planner import engine as engine_lib
from jspec.tools import engine_bridge, stop_text
from jspec.tools import openai_protocol as proto


@dataclasses.dataclass
class ChoiceState:
  """One choice so far: its ids, logprobs and text, and whether its last piece is out."""

  submitted: engine_bridge.Submitted
  text: stop_text.StopText
  ids: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  top: list = dataclasses.field(default_factory=list)
  shown: int = 0  # tokens whose logprobs were sent (streaming)
  finish: str | None = None  # set once the choice's last piece is out
  output: engine_lib.RequestOutput | None = None


@dataclasses.dataclass(frozen=True)
class Piece:
  """Text of one choice to send, its logprobs' token range and, last, its finish reason."""

  index: int
  text: str
  finish: str | None
  tokens: tuple[int, int]  # [start, end) of the choice's tokens this piece carries


class Aborted(Exception):
  """A choice the engine cancelled without being asked (the server shuts down without
  draining, or the engine failed)."""

  def __init__(self, error: proto.ProtocolError):
    super().__init__(error.message)
    self.error = error


class Run:
  """The choices of one HTTP request, as their engine events arrive."""

  def __init__(self, submitted, tokenizer, end_ids, metrics, stop=()):
    """end_ids: ids that end an answer and are no text (EOS, the request's stop ids)."""
    self.metrics = metrics
    self.choices = {s.index: ChoiceState(s, stop_text.StopText(tokenizer, stop, end_ids))
                    for s in submitted}
    self.waiting = set(self.choices)  # choices whose engine request has not ended

  @property
  def over(self) -> bool:
    return not self.waiting

  def on(self, event) -> list[Piece]:
    """The pieces to send after one bridge event."""
    kind, index = event[0], event[1]
    c = self.choices[index]
    if kind == "error":
      raise Aborted(proto.ProtocolError(f"the engine failed: {event[2]}", status=500,
                                         type="server_error", code="engine_error"))
    if kind == "token":
      if c.finish is not None:  # past a stop string: decoded before the cancel landed
        return []
      _, _, token, logprob, top = event
      c.ids.append(token)
      if logprob is not None:
        c.logprobs.append(logprob)
        c.top.append(top)
      delta = c.text.push(token)
      if c.text.stopped:  # free the slot now; the engine's "done" follows
        c.submitted.handle.cancel()
        return [self._last(c, delta, "stop")]
      if not delta:
        return []
      start, c.shown = c.shown, len(c.ids)
      return [Piece(index, delta, None, (start, c.shown))]
    output = event[2]  # "done"
    c.output = output
    self.waiting.discard(index)
    if c.finish is not None:
      self.metrics.choice("stop", output)
      return []
    if output.finish_reason == "cancelled":  # not asked for: the engine is closing
      self.metrics.choice("cancelled", output)
      raise Aborted(proto.closing_error("the request was cancelled"))
    rest = c.text.finish()
    reason = "stop" if c.text.stopped else output.finish_reason
    self.metrics.choice(reason, output)
    return [self._last(c, rest, reason)]

  def _last(self, c: ChoiceState, text: str, reason: str) -> Piece:
    c.finish = reason
    start, c.shown = c.shown, c.text.tokens
    return Piece(c.submitted.index, text, reason, (start, max(start, c.shown)))

  def cancel(self) -> None:
    """Cancel every choice still in the engine (the client left, or the answer failed)."""
    for index in list(self.waiting):
      c = self.choices[index]
      if c.submitted.handle.cancel() and c.finish is None:
        self.metrics.choice("cancelled")
      self.waiting.discard(index)

  def token_ids(self, index: int) -> tuple[int, ...]:
    c = self.choices[index]
    return tuple(c.ids[:c.text.tokens])

  def usage(self, prompts: list[list[int]]) -> proto.Usage:
    outs = [c.output for c in self.choices.values() if c.output is not None]
    return proto.Usage(prompt_tokens=sum(len(p) for p in prompts),
                       completion_tokens=sum(c.text.tokens for c in self.choices.values()),
                       accepted_draft_tokens=sum(int(o.accepted) for o in outs),
                       target_calls=sum(int(o.target_calls) for o in outs))
