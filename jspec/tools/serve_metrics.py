"""`jspec serve`'s /metrics: the server's and the engine's counters in Prometheus' text format.

The server counts what only it sees (HTTP statuses, choices by finish reason, tokens as
they reach clients, accepted drafts by position from each finished request); the rest
is read from the `Engine` at scrape time (queue, active rows, batch, its own totals), so
nothing is counted twice. Names (all prefixed `jspec_`) are listed in docs/serving.md.
"""

from __future__ import annotations

import collections
import threading
import time

RATE_WINDOW = 10.0  # seconds of token arrivals that tokens/s is measured over


class Metrics:
  """Counters one server keeps; safe from any thread."""

  def __init__(self, clock=time.monotonic):
    self._clock = clock
    self._lock = threading.Lock()
    self.requests: collections.Counter = collections.Counter()  # (endpoint, status) -> count
    self.finished: collections.Counter = collections.Counter()  # finish reason -> choices
    self.accepted_by_position: list[int] = []  # drafts accepted at position 1, 2, ...
    self.judged_by_position: list[int] = []  # drafts judged at position 1, 2, ...
    self.accepted = 0
    self.target_calls = 0
    self.streamed_tokens = 0
    self.first_token_seconds = 0.0  # sum over choices, with first_token_count
    self.first_token_count = 0
    self._arrivals: collections.deque = collections.deque()  # (time, tokens)

  def request(self, endpoint: str, status: int) -> None:
    """An HTTP answer (its status once sent)."""
    with self._lock:
      self.requests[(endpoint, int(status))] += 1

  def tokens(self, count: int) -> None:
    """`count` tokens reached the server from the engine now."""
    now = self._clock()
    with self._lock:
      self.streamed_tokens += count
      self._arrivals.append((now, count))
      self._trim(now)

  def choice(self, reason: str, output=None) -> None:
    """A choice ended with finish reason `reason`; `output` its `RequestOutput` (None when
    it never reached the engine's result, e.g. its submit was refused)."""
    with self._lock:
      self.finished[reason] += 1
      if output is None:
        return
      self.accepted += int(output.accepted)
      self.target_calls += int(output.target_calls)
      for name, values in (("accepted_by_position", output.position_accepted),
                           ("judged_by_position", output.position_judged)):
        counts = getattr(self, name)
        counts.extend([0] * (len(values) - len(counts)))
        for i, v in enumerate(values):
          counts[i] += int(v)
      ttft = output.time_to_first_token
      if ttft is not None:
        self.first_token_seconds += float(ttft)
        self.first_token_count += 1

  def tokens_per_second(self) -> float:
    """Tokens that reached the server over the last RATE_WINDOW seconds, per second."""
    now = self._clock()
    with self._lock:
      self._trim(now)
      return sum(n for _, n in self._arrivals) / RATE_WINDOW

  def _trim(self, now: float) -> None:
    while self._arrivals and self._arrivals[0][0] < now - RATE_WINDOW:
      self._arrivals.popleft()

  def render(self, engine) -> str:
    """The Prometheus text exposition of these counters and `engine`'s."""
    rate = self.tokens_per_second()
    with self._lock:
      requests = sorted(self.requests.items())
      finished = sorted(self.finished.items())
      accepted_at, judged_at = list(self.accepted_by_position), list(self.judged_by_position)
      accepted, calls = self.accepted, self.target_calls
      streamed = self.streamed_tokens
      ttft_sum, ttft_count = self.first_token_seconds, self.first_token_count
    out = _Exposition()
    out.family("jspec_requests_total", "counter", "HTTP requests answered, by endpoint and status",
               [({"endpoint": e, "status": str(s)}, n) for (e, s), n in requests])
    out.family("jspec_choices_total", "counter", "choices (engine requests) ended, by finish "
               "reason (stop, length, cancelled: the client left or the server shut down, "
               "refused: the queue was full)", [({"reason": r}, n) for r, n in finished])
    out.family("jspec_queue_length", "gauge", "requests waiting for a slot",
               [({}, engine.queued)])
    out.family("jspec_active_requests", "gauge", "requests in a slot", [({}, engine.active)])
    out.family("jspec_batch_size", "gauge", "the batch the engine runs at now",
               [({}, engine.batch)])
    out.family("jspec_slots", "gauge", "the most requests decoded at once", [({}, engine.slots)])
    out.family("jspec_generated_tokens_total", "counter", "tokens of requests the engine "
               "finished", [({}, engine.generated_tokens)])
    out.family("jspec_streamed_tokens_total", "counter", "tokens that reached the server from "
               "the engine", [({}, streamed)])
    out.family("jspec_tokens_per_second", "gauge", f"tokens that reached the server over the "
               f"last {RATE_WINDOW:g} s, per second", [({}, rate)])
    out.family("jspec_target_calls_total", "counter", "target (verify) calls of finished "
               "requests, summed over requests", [({}, engine.target_calls)])
    out.family("jspec_accepted_drafts_total", "counter", "drafts accepted over finished "
               "choices", [({}, accepted)])
    out.family("jspec_accepted_drafts_by_position_total", "counter", "drafts accepted at each "
               "draft position (1 is the first draft of a round)",
               [({"position": str(i + 1)}, n) for i, n in enumerate(accepted_at)])
    out.family("jspec_judged_drafts_by_position_total", "counter", "drafts judged at each "
               "draft position", [({"position": str(i + 1)}, n) for i, n in enumerate(judged_at)])
    out.family("jspec_rounds_by_k_total", "counter", 'rounds run at each K (num_draft_tokens '
               '"auto" only)', [({"k": str(k)}, n) for k, n in sorted(dict(
                   engine.rounds_by_k).items())])
    out.family("jspec_runs_by_batch_total", "counter", "engine runs (of up to R rounds) at each "
               "batch size", [({"batch": str(b)}, n) for b, n in sorted(dict(
                   engine.runs_by_batch).items())])
    out.family("jspec_completed_requests_total", "counter", "requests the engine finished",
               [({}, engine.completed)])
    out.family("jspec_time_to_first_token_seconds", "summary", "seconds from submit to the "
               "first token, over finished choices", [])
    out.sample("jspec_time_to_first_token_seconds_sum", {}, ttft_sum)
    out.sample("jspec_time_to_first_token_seconds_count", {}, ttft_count)
    return out.text()


class _Exposition:
  """Lines of the Prometheus text format (version 0.0.4)."""

  def __init__(self):
    self.lines: list[str] = []

  def family(self, name: str, kind: str, help_text: str, samples) -> None:
    self.lines.append(f"# HELP {name} {help_text}")
    self.lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
      self.sample(name, labels, value)

  def sample(self, name: str, labels: dict, value) -> None:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    value = float(value)
    shown = repr(int(value)) if value.is_integer() else repr(value)
    self.lines.append(f"{name}{{{inner}}} {shown}" if inner else f"{name} {shown}")

  def text(self) -> str:
    return "\n".join(self.lines) + "\n"


def _escape(value: str) -> str:
  return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
