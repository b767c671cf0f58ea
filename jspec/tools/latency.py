"""Latency distributions: per-request latency and inter-token latency percentiles.

Speculative decoding moves the mean and the tail differently: a round that accepts
four drafts delivers five tokens at once, one that accepts none delivers one token
after a verify that cost more than a plain step. Means hide that; percentiles show
it. A call is run with `stream=` (`jspec.core.streaming`), whose per-round host
callback is timestamped:

    request latency      from the call's start to the row's last token
    time to first token  from the call's start to the row's first token (prefill + a round)
    inter-token latency  for every later token, the time since the row's previous token:
                         the first token of a round waits for the round, the others of the
                         same round arrive with it (0)

Every call pays the same callback per round, baseline and speculative alike, so
the percentiles compare like with like (the callback's own cost is in all of them).
"""

from __future__ import annotations

import time

import jax
import numpy as np

PERCENTILES = (50, 90, 99)


def timed_call(call) -> tuple[object, dict]:
  """Run `call(stream=listener)` and timestamp its rounds. Returns the output and
  {"request_s": [B], "first_token_s": [B], "itl_s": [...all later tokens...]}."""
  events = []

  def listener(rows):
    events.append((time.perf_counter(), [len(r) for r in rows]))

  t0 = time.perf_counter()
  out = call(stream=listener)
  jax.block_until_ready(out.tokens)
  B = len(events[0][1]) if events else int(np.asarray(out.lengths).shape[0])
  last = np.full(B, t0)
  first = np.full(B, np.nan)
  itl = []
  for t, counts in events:
    for b, n in enumerate(counts):
      if n == 0:
        continue
      if np.isnan(first[b]):
        first[b] = t - t0
        itl.extend([0.0] * (n - 1))
      else:
        itl.append(t - last[b])
        itl.extend([0.0] * (n - 1))
      last[b] = t
  return out, {"request_s": (last - t0).tolist(), "first_token_s": first.tolist(), "itl_s": itl}


def merge(samples: list[dict]) -> dict:
  """Several `timed_call` samples pooled."""
  return {key: [v for s in samples for v in s[key]] for key in ("request_s", "first_token_s",
                                                               "itl_s")}


def percentiles(sample: dict) -> dict:
  """{"request_ms": {p50, p90, p99}, "first_token_ms": ..., "itl_ms": ...} in milliseconds."""
  out = {}
  for key, name in (("request_s", "request_ms"), ("first_token_s", "first_token_ms"),
                    ("itl_s", "itl_ms")):
    values = np.asarray([v for v in sample[key] if v == v], np.float64) * 1e3
    out[name] = {f"p{q}": float(np.percentile(values, q)) if values.size else float("nan")
                 for q in PERCENTILES}
  return out


def format_line(label: str, stats: dict) -> str:
  """One text line: request, first-token and inter-token p50 / p90 / p99 in ms."""
  def three(d):
    return "/".join(f"{d[f'p{q}']:.0f}" if d[f"p{q}"] >= 10 else f"{d[f'p{q}']:.1f}"
                    for q in PERCENTILES)
  return (f"{label:<10} request {three(stats['request_ms'])}  first token "
          f"{three(stats['first_token_ms'])}  inter-token {three(stats['itl_ms'])} ms "
          f"(p{'/p'.join(str(q) for q in PERCENTILES)})")
