"""Measure before trusting: acceptance and speedup on your own prompts.

    report = jspec.tools.measure.measure(target, drafter, prompts, ks=(1, 2, 4, 8))
    print(jspec.tools.measure.format_table(report))
    jspec.tools.measure.plot(report, "measure.png")         # needs matplotlib

For each K in the sweep, in one process, after compilation, with baseline and
speculative runs interleaved:

  * acceptance per draft position i = 1..K: of the rounds whose drafts 1..i-1
    were all accepted, the fraction that also accepted draft i; and overall
    (alpha = accepted / judged, see `jspec.core.stats.acceptance_rates`);
  * tau = tokens emitted / target calls;
  * per-call costs: a target step (1 token), a target verify (K+1 tokens) and
    one drafter round (K drafts), each jitted alone at the same batch size;
  * predicted speedup tau * T_step / (T_verify + T_round), and the measured one
    (baseline wall time / speculative wall time, medians of `repeats`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jspec.bench.workloads import chat_prompt_ids, read_chat_prompts, read_prompts  # noqa: F401  (their home is the harness's workloads)
from jspec.bench import costs
from jspec.bench.costs import round_time, verify_width
from jspec.bench.records import rows as record_rows

from jspec.core.stats import acceptance_rates, ideal_speedup
from jspec.planner.inputs import cache_bucket
from jspec.core.drafter import BranchDrafter
from jspec.core.model import Model


def measure(target: Model, drafter, prompts, *, ks=(1, 2, 4, 8), max_new_tokens: int = 64,
            batch_size: int = 1, temperature: float = 0.0, repeats: int = 3,
            seed: int = 0, latency: bool = False) -> dict:
  """Acceptance, tau, per-call costs and predicted / measured speedup per K.

  prompts: token-id lists. The runs go through the harness's runner
  (`jspec.bench.runner`: compiled outside timing, plain decoding and every K interleaved,
  the order alternating per repeat; greedy answers compared with plain decoding's) and
  every figure is a function of its records (`jspec.bench.metrics`); the measured speedup
  is the median over repeats of the paired ratio. latency: the same runs again, streamed
  (`runner.Settings(stream=True)`: each round's arrival timed), and request, first-token and
  inter-token latency percentiles for the baseline and each K. Returns a
  JSON-ready dict (see module docstring), its records under "records".
  """
  from jspec.bench import metrics as M
  from jspec.bench import runner, workloads
  from jspec.bench.methods import Built

  ks = sorted({int(k) for k in ks})
  if not ks or ks[0] < 1:
    raise ValueError(f"ks must be integers >= 1, got {ks!r}")
  if not prompts:
    raise ValueError("prompts is empty")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  name = lambda k: f"K={k}"
  base_name = runner.plain(temperature).name
  variants = [runner.plain(temperature)] + [
      runner.Variant(name(k), Built(drafter, k, f"K = {k}"), temperature, {"k": k}) for k in ks]
  settings = runner.Settings(max_new_tokens=max_new_tokens, repeats=repeats, batch=batch_size,
                             seed=seed, eos=False, progress=False)
  result = runner.run(target, variants, workloads.from_ids("prompts", prompts), settings,
                      study="measure")
  recs = result.records

  latencies = {}
  if latency:  # the same runs again, streamed: each round's arrival timed (metrics)
    streamed = runner.run(target, variants, workloads.from_ids("prompts", prompts),
                          dataclasses.replace(settings, stream=True), study="measure").records
    ms = lambda seconds: {p: v * 1e3 for p, v in M.percentiles(seconds).items()}
    for v in variants:
      mine = M.select(streamed, method=v.name)
      latencies[v.name] = {"request_ms": ms(M.request_latency(mine)),
                           "first_token_ms": ms(M.first_token(mine)),
                           "itl_ms": ms(M.inter_token(mine))}

  longest = max(len(p) for p in prompts)
  widest = max(verify_width(drafter, k) for k in ks)
  S = cache_bucket(longest + max_new_tokens + widest)
  prefix = min(longest, S - widest - 1)
  B = min(batch_size, len(prompts))
  t_step = costs.call_time(target, B, 1, S, prefix=prefix)
  base = M.select(recs, method=base_name)
  rows = []
  for k in ks:
    mine = M.select(recs, method=name(k))
    per_row = [r for rec in mine for r in record_rows(rec)]
    hist = np.asarray(M.accept_hist(mine, k), np.int64)
    rates = acceptance_rates(hist, sum(r.tokens for r in mine), sum(r.calls for r in mine))
    t_verify = costs.call_time(target, B, verify_width(drafter, k), S, prefix=prefix)
    # A branch drafter (lookahead) drafts by lookups; its work is the verify's extra rows.
    t_round = (0.0 if isinstance(drafter, BranchDrafter)
               else round_time(drafter, B, k, S, prefix=prefix, target=target))
    rows.append({
        "k": k, "tau": rates["tau"], "alpha": rates["alpha"],
        "draft_accept": rates["draft_accept"], "position_acceptance": M.acceptance(mine),
        "accept_hist": hist.tolist(), "t_verify_ms": t_verify * 1e3,
        "t_draft_round_ms": t_round * 1e3,
        "predicted_speedup": ideal_speedup(rates["tau"], 1, t_step, t_verify, t_round),
        "measured_speedup": M.speedup(base, mine), "tokens_per_s": M.tokens_per_s(mine),
        "equal_to_baseline": M.all_equal(mine) if temperature == 0 else None,
        "per_prompt": [_one(r, k) for r in per_row],
        **({"latency": latencies[name(k)]} if latency else {}),
    })
  return {
      "prompts": len(prompts), "batch_size": batch_size, "max_new_tokens": max_new_tokens,
      "temperature": temperature, "repeats": repeats, "backend": jax.default_backend(),
      "t_step_ms": t_step * 1e3, "baseline_tokens_per_s": M.tokens_per_s(base),
      "rows": rows, "records": [r.to_json() for r in recs],
      **({"baseline_latency": latencies[base_name]} if latency else {}),
  }


def _one(r, k: int) -> dict:
  """A row's tau, accepted-count histogram and acceptance by position (NaN: never judged)."""
  from jspec.bench.metrics import accept_hist

  return {"tau": r.tokens / max(r.calls, 1), "accept_hist": accept_hist([r], k),
          "position_acceptance": [a / j if j else float("nan")
                                  for a, j in zip(r.accepted, r.judged)]}


def format_table(report: dict) -> str:
  """The report of `measure` as a text table: one line per K."""
  lines = [f"{report['prompts']} prompts, batch {report['batch_size']}, "
           f"{report['max_new_tokens']} new tokens, temperature {report['temperature']}; "
           f"target step {report['t_step_ms']:.2f} ms; baseline "
           f"{report['baseline_tokens_per_s']:.1f} tok/s (medians of {report['repeats']})",
           f"{'K':>3} {'tau':>5} {'alpha':>6} {'verify ms':>9} {'draft ms':>8} "
           f"{'predicted':>9} {'measured':>8}  acceptance by position"]
  for r in report["rows"]:
    pos = " ".join(f"{a:.2f}" for a in r["position_acceptance"])
    lines.append(f"{r['k']:>3} {r['tau']:5.2f} {r['alpha']:6.2f} {r['t_verify_ms']:9.2f} "
                 f"{r['t_draft_round_ms']:8.2f} {r['predicted_speedup']:8.2f}x "
                 f"{r['measured_speedup']:7.2f}x  {pos}")
  if "baseline_latency" in report:
    lines.append("latency, milliseconds:")
    lines.append(_latency_line("baseline", report["baseline_latency"]))
    for r in report["rows"]:
      lines.append(_latency_line(f"K={r['k']}", r["latency"]))
  lines.append("per prompt: tau, then acceptance by position (- never judged)")
  for i in range(report["prompts"]):
    cells = []
    for r in report["rows"]:
      one = r["per_prompt"][i]
      pos = " ".join("-" if a != a else f"{a:.2f}" for a in one["position_acceptance"])
      cells.append(f"K={r['k']}: {one['tau']:.2f} [{pos}]")
    lines.append(f"{i:>4}  " + "  ".join(cells))
  return "\n".join(lines)


def _latency_line(label: str, stats: dict) -> str:
  """One text line: request, first-token and inter-token p50 / p90 / p99 in ms."""
  three = lambda d: "/".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in d.values())
  return (f"{label:<10} request {three(stats['request_ms'])}  first token "
          f"{three(stats['first_token_ms'])}  inter-token {three(stats['itl_ms'])} ms "
          f"(p50/p90/p99)")


def plot(report: dict, path: str) -> None:
  """tau and speedup (predicted, measured) against K, as a PNG."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError as e:
    raise ImportError("plotting needs matplotlib: pip install 'jspec[plot]'") from e
  ks = [r["k"] for r in report["rows"]]
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
  ax1.plot(ks, [r["tau"] for r in report["rows"]], "o-")
  ax1.set_xlabel("K (draft tokens per round)")
  ax1.set_ylabel("tau (tokens per target call)")
  ax2.plot(ks, [r["predicted_speedup"] for r in report["rows"]], "o--", label="predicted")
  ax2.plot(ks, [r["measured_speedup"] for r in report["rows"]], "o-", label="measured")
  ax2.axhline(1.0, color="gray", lw=0.8)
  ax2.set_xlabel("K")
  ax2.set_ylabel("speedup over baseline")
  ax2.legend()
  fig.suptitle(f"batch {report['batch_size']}, temperature {report['temperature']}")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
