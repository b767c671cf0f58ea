"""Figures as pure functions of records (`jspec.bench.records.Record`); no model, no timing.

    tau(records)                    tokens emitted / target calls, summed
    acceptance(records)             [K] per draft position: accepted / judged, summed
    alpha(records)                  accepted drafts / judged drafts (Leviathan et al.'s rate)
    tokens_per_s(records)           tokens / median over repeats of the summed seconds
    paired_speedup(base, records)   median over repeats of the ratio of summed seconds,
                                    each pair timed in the same repeat
    steady_seconds(short, long)     seconds per extra token of a long run over a short one
    percentiles(values)             p50 / p90 / p99
    predicted_speedup(...)          tau * T_step / (T_verify + T_draft_round)
    group(records, *axes)           {key: records} by method, workload, or any axis
    ttft(r) / tpot(r) / e2e(r)      a streamed request's time to first token, time per
                                    output token after the first, end-to-end seconds
    span(records)                   seconds from the first request sent to the last answer
    request_latency / first_token / inter_token(records)
                                    a streamed call's per-row latencies (below)

A streamed record (`runner.Settings(stream=True)`) keeps in `extra["arrivals"]`, per timed
repeat, each round's arrival on the host: [seconds since the call began, new tokens of row
0, of row 1, ...].

A request record (one request to a server, `jspec.bench.serve_load`) keeps its times in
`extra`, in seconds on one clock: `sent`, `chunk_times` (the arrival of each streamed text
chunk) and `end` (the last byte); its `seconds` is `(end - sent,)`.

Acceptance by position uses `DecodeStats`'s own definitions (a draft counts as accepted
only if it was emitted), summed, not re-derived.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable

from jspec.core.stats import ideal_speedup


def _list(records) -> list:
  out = list(records)
  if not out:
    raise ValueError("no records")
  return out


def tau(records) -> float:
  """Tokens emitted per target call, over all rows of all records."""
  rs = _list(records)
  calls = sum(r.calls for r in rs)
  return sum(r.tokens for r in rs) / calls if calls else float("nan")


def _positions(rs) -> tuple[list[int], list[int]]:
  width = max((len(r.judged) for r in rs), default=0)
  judged, accepted = [0] * width, [0] * width
  for r in rs:
    for i, (j, a) in enumerate(zip(r.judged, r.accepted)):
      judged[i] += j
      accepted[i] += a
  return judged, accepted


def acceptance(records) -> list[float]:
  """[K] of the rounds that judged draft position i, the fraction that accepted it (NaN
  where no round judged it); K the widest record's."""
  judged, accepted = _positions(_list(records))
  return [a / j if j else float("nan") for a, j in zip(accepted, judged)]


def accept_hist(records, k: int) -> list[int]:
  """[k+1] rounds by accepted count m, from calls and acceptance by position: a round that
  accepted m drafts was counted at positions 0..m-1, so hist[m] = accepted[m-1] -
  accepted[m] and hist[0] = calls - accepted[0] (linear: summed records give summed
  histograms). Positions past a record's own width count zero."""
  rs = _list(records)
  _, acc = _positions(rs)
  acc = (acc + [0] * (k + 1))[:k] + [0]
  calls = sum(r.calls for r in rs)
  return [calls - acc[0]] + [acc[i] - acc[i + 1] for i in range(k)]


def alpha(records) -> float:
  """Accepted drafts over judged drafts, all positions (NaN where none was judged)."""
  judged, accepted = _positions(_list(records))
  return sum(accepted) / sum(judged) if sum(judged) else float("nan")


def rounds_by_k(records) -> dict[int, int]:
  """{K: rounds} summed ("auto"'s choices); empty for fixed-K records."""
  out: dict[int, int] = {}
  for r in _list(records):
    for k, n in r.rounds_by_k.items():
      out[int(k)] = out.get(int(k), 0) + int(n)
  return dict(sorted(out.items()))


def repeat_seconds(records) -> list[float]:
  """[R] seconds of each repeat, summed over the records (all timed R times)."""
  rs = _list(records)
  counts = {len(r.seconds) for r in rs}
  if len(counts) != 1 or 0 in counts:
    raise ValueError(f"records timed a different number of repeats: {sorted(counts)}")
  return [sum(r.seconds[i] for r in rs) for i in range(counts.pop())]


def seconds(records) -> float:
  """Median over repeats of the summed seconds."""
  return statistics.median(repeat_seconds(records))


def tokens_per_s(records) -> float:
  """Tokens of all records over the median repeat's summed seconds."""
  rs = _list(records)
  return sum(r.tokens for r in rs) / seconds(rs)


def paired_speedup(base, records) -> float:
  """Median over repeats r of (base's summed seconds in r) / (these records' in r).

  The two sets must cover the same prompts (the same work for greedy runs); a ratio of
  runs timed next to each other cancels the drift of a shared machine that a ratio of two
  medians over the whole run does not."""
  b, x = _list(base), _list(records)
  if sorted(r.prompt for r in b) != sorted(r.prompt for r in x):
    raise ValueError("paired_speedup: the two sets of records cover different prompts")
  bs, xs = repeat_seconds(b), repeat_seconds(x)
  if len(bs) != len(xs):
    raise ValueError(f"paired_speedup: {len(bs)} repeats against {len(xs)}")
  return statistics.median(p / q for p, q in zip(bs, xs))


def speedup(base, records) -> float:
  """Tokens/s over base's tokens/s, each repeat's ratio taken in the same repeat (equal to
  `paired_speedup` where both emitted the same tokens, as greedy runs do)."""
  b, x = _list(base), _list(records)
  return paired_speedup(b, x) * sum(r.tokens for r in x) / max(sum(r.tokens for r in b), 1)


def steady_seconds(short, long, per: str = "tokens") -> float:
  """Seconds per extra token (per="calls": per extra target call) of a long run over a short
  one, the median over repeats of (long's summed seconds - short's) / (the difference in
  tokens or calls): a run's fixed part (prefill, host work, transfers) cancels, leaving the
  steady state of the loop. Both sets timed in the same repeats."""
  s, lg = _list(short), _list(long)
  extra = sum(getattr(r, per) for r in lg) - sum(getattr(r, per) for r in s)
  if extra <= 0:
    raise ValueError(f"steady_seconds: the long run has no more {per} than the short one")
  a, b = repeat_seconds(s), repeat_seconds(lg)
  if len(a) != len(b):
    raise ValueError(f"steady_seconds: {len(a)} repeats against {len(b)}")
  return statistics.median((y - x) / extra for x, y in zip(a, b))


def predicted_steps(records, costs_by_k: dict, k) -> tuple[float | None, float | None]:
  """The records' rounds priced in target steps: (where a verify costs one step, with this
  machine's verify costs). costs_by_k: {K: {"verify_over_step_here",
  "draft_round_over_step"}} as measured for the method; a K = 0 round ("auto" not
  drafting) costs one step either way. k: the method's K (a tree's depth), or "auto".
  (None, None) where a K's cost is missing."""
  rs = _list(records)
  by_k = rounds_by_k(rs)
  if not by_k:  # a fixed K: every round at it; "auto" that never drafted: plain rounds
    by_k = {0 if k == "auto" else int(k): sum(r.calls for r in rs)}
  accel = here = 0.0
  for kk, n in by_k.items():
    if n == 0:
      continue
    if kk == 0:
      accel += n
      here += n
      continue
    c = costs_by_k.get(kk, costs_by_k.get(str(kk)))
    if c is None or c.get("draft_round_over_step") is None:
      return None, None
    accel += n * (1.0 + c["draft_round_over_step"])
    here += n * (c["verify_over_step_here"] + c["draft_round_over_step"])
  return accel, here


def predicted(records, costs_by_k: dict, k) -> tuple[float | None, float | None]:
  """Tokens over `predicted_steps`: the speedup the measured tau and costs allow, (where a
  verify costs one step, with this machine's verify costs); tau * T_step / (T_verify +
  T_draft_round) per round, `jspec.core.stats.ideal_speedup`'s form."""
  rs = _list(records)
  tokens = sum(r.tokens for r in rs)
  accel, here = predicted_steps(rs, costs_by_k, k)
  return (tokens / accel if accel else None), (tokens / here if here else None)


def ratio_of_medians(base, records) -> float:
  """Median base seconds / median seconds (where repeats were not paired)."""
  return seconds(base) / seconds(records)


def percentiles(values: Iterable[float], ps=(50, 90, 99)) -> dict[str, float]:
  """{"p50": ..., ...}: linear interpolation between closest ranks (numpy's default)."""
  xs = sorted(float(v) for v in values)
  if not xs:
    return {f"p{p}": float("nan") for p in ps}
  out = {}
  for p in ps:
    at = (len(xs) - 1) * p / 100
    lo, hi = math.floor(at), math.ceil(at)
    out[f"p{p}"] = xs[lo] + (xs[hi] - xs[lo]) * (at - lo)
  return out


def all_equal(records) -> bool | None:
  """Whether every compared record equals plain decoding (None: none was compared)."""
  seen = [r.equal for r in _list(records) if r.equal is not None]
  return all(seen) if seen else None


def predicted_speedup(tau_: float, t_step: float, t_verify: float, t_draft_round: float) -> float:
  """tau * T_step / (T_verify + T_draft_round): what measured call costs allow
  (`jspec.core.stats.ideal_speedup` with the round's draft cost as one call)."""
  return ideal_speedup(tau_, 1, t_step, t_verify, t_draft_round)


def group(records, *keys: str) -> dict:
  """{key tuple (or value, for one key): [records]} in first-seen order. A key is a
  Record field (`method`, `workload`, `prompt`, `study`) or an axis name."""
  out: dict = {}
  for r in records:
    k = tuple(_value(r, key) for key in keys)
    out.setdefault(k[0] if len(keys) == 1 else k, []).append(r)
  return out


def _value(r, key: str):
  if key in ("method", "workload", "prompt", "study"):
    return getattr(r, key)
  if key not in r.axes:
    raise KeyError(f"record {r.method!r} on {r.prompt!r} has no axis {key!r} "
                   f"(axes: {sorted(r.axes)})")
  return r.axes[key]


def select(records, **where) -> list:
  """The records whose fields / axes equal every given value."""
  return [r for r in records if all(_value(r, k) == v for k, v in where.items())]


# ----------------------------------------------------------------------------- requests


def ttft(r) -> float | None:
  """Time to first token of a streamed request record: its first chunk's arrival after it
  was sent (None where no chunk came)."""
  times = r.extra.get("chunk_times") or ()
  return times[0] - r.extra["sent"] if times else None


def tpot(r) -> float | None:
  """Time per output token after the first of a streamed request record: (end - first
  chunk) / (tokens - 1); None with fewer than two tokens, no chunk, or no end."""
  times, end = r.extra.get("chunk_times") or (), r.extra.get("end")
  if not times or r.tokens < 2 or end is None:
    return None
  return (end - times[0]) / (r.tokens - 1)


def e2e(r) -> float | None:
  """End-to-end seconds of a request record, sent to last byte (None where it never
  ended)."""
  return r.seconds[0] if r.seconds else None


def span(records) -> float:
  """Seconds from the first request sent to the last one's end (0 where none ended)."""
  rs = _list(records)
  start = min(r.extra["sent"] for r in rs)
  end = max((r.extra["end"] for r in rs if r.extra.get("end") is not None), default=start)
  return end - start


# ----------------------------------------------------------------------------- streamed calls


def _rows_arrivals(records):
  """[(seconds, tokens)] of each row of each timed repeat, rounds that emitted nothing left
  out; a ValueError for a record that was not streamed."""
  for r in _list(records):
    if "arrivals" not in r.extra:
      raise ValueError(f"record {r.method!r} on {r.prompt!r} was not streamed "
                       f"(runner.Settings(stream=True))")
    for repeat in r.extra["arrivals"]:
      for b in range(len(repeat[0]) - 1 if repeat else 0):
        yield [(e[0], e[1 + b]) for e in repeat if e[1 + b]]


def request_latency(records) -> list[float]:
  """Seconds from each call's start to each row's last token (streamed records); for
  records not streamed, each timed call's seconds."""
  rs = _list(records)
  if not all("arrivals" in r.extra for r in rs):
    return [t for r in rs for t in r.seconds]
  return [row[-1][0] for row in _rows_arrivals(rs) if row]


def first_token(records) -> list[float]:
  """Seconds from each streamed call's start to each row's first token (prefill, a round)."""
  return [row[0][0] for row in _rows_arrivals(records) if row]


def inter_token(records) -> list[float]:
  """For every token after a row's first, the seconds since the row's previous token: the
  first token of a round waits for the round, the others of that round arrive with it (0)."""
  out = []
  for row in _rows_arrivals(records):
    if row:
      out += [0.0] * (row[0][1] - 1)
    for (t, n), (before, _) in zip(row[1:], row):
      out += [t - before] + [0.0] * (n - 1)
  return out

