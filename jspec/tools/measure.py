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

import statistics
import time

import jax
import numpy as np

from jspec.bench.workloads import chat_prompt_ids, read_chat_prompts, read_prompts  # noqa: F401  (their home is the harness's workloads)
from jspec.bench import costs
from jspec.bench.costs import round_time, verify_width

from jspec.core.stats import acceptance_rates, ideal_speedup
from jspec.tools import latency as lat
from jspec.planner.api import generate, speculative_generate
from jspec.planner.inputs import cache_bucket
from jspec.core.drafter import BranchDrafter
from jspec.core.model import Model


def position_acceptance(accept_hist) -> list[float]:
  """Acceptance of draft i given drafts 1..i-1 were accepted, for i = 1..K.

  accept_hist [K+1]: rounds by accepted count n. Draft i was judged in rounds
  with n >= i-1 and accepted in rounds with n >= i.
  """
  hist = np.asarray(accept_hist, np.int64)
  at_least = np.cumsum(hist[::-1])[::-1]  # at_least[j] = rounds with n >= j
  K = hist.shape[0] - 1
  return [float(at_least[i] / at_least[i - 1]) if at_least[i - 1] else float("nan")
          for i in range(1, K + 1)]


def per_prompt(outs) -> list[dict]:
  """Per prompt, in prompt order, from one K's outputs (one per batch): tau, the
  accepted-length histogram and the acceptance of each draft position given the ones
  before it were accepted (`DecodeStats.position_acceptance`; NaN: never judged)."""
  rows = []
  for o in outs:
    hist = np.asarray(o.stats.row_hist, np.int64)
    accept = np.asarray(o.stats.position_acceptance(), np.float64)
    calls = np.asarray(o.stats.target_calls, np.int64)
    lengths = np.asarray(o.lengths, np.int64)
    for b in range(hist.shape[0]):
      rows.append({"tau": float(lengths[b] / max(calls[b], 1)), "accept_hist": hist[b].tolist(),
                   "position_acceptance": [float(a) for a in accept[b]]})
  return rows


def _batches(prompts, batch_size):
  return [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]


def _timed(fn):
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return out, time.perf_counter() - t0


def measure(target: Model, drafter, prompts, *, ks=(1, 2, 4, 8), max_new_tokens: int = 64,
            batch_size: int = 1, temperature: float = 0.0, repeats: int = 3,
            seed: int = 0, latency: bool = False) -> dict:
  """Acceptance, tau, per-call costs and predicted / measured speedup per K.

  prompts: token-id lists. latency: also run every batch once more per repeat with
  per-round timestamps (`jspec.tools.latency`) and report request, first-token and
  inter-token latency percentiles for the baseline and each K. Returns a JSON-ready
  dict (see module docstring).
  """
  ks = sorted({int(k) for k in ks})
  if not ks or ks[0] < 1:
    raise ValueError(f"ks must be integers >= 1, got {ks!r}")
  if not prompts:
    raise ValueError("prompts is empty")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  groups = _batches(list(prompts), batch_size)
  kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, eos_id=())
  base = lambda g, stream=None: generate(target, g, stream=stream, **kw)
  spec = {k: (lambda g, stream=None, k=k: speculative_generate(
      target, drafter, g, num_draft_tokens=k, stream=stream, **kw)) for k in ks}
  outs = {"base": [base(g) for g in groups]}  # compile everything first
  for k in ks:
    outs[k] = [spec[k](g) for g in groups]
  jax.block_until_ready([o.tokens for v in outs.values() for o in v])

  spent = {name: [] for name in outs}
  for _ in range(repeats):  # interleaved: drift hits every variant alike
    totals = dict.fromkeys(outs, 0.0)
    for i, g in enumerate(groups):
      outs["base"][i], t = _timed(lambda: base(g))
      totals["base"] += t
      for k in ks:
        outs[k][i], t = _timed(lambda: spec[k](g))
        totals[k] += t
    for name, t in totals.items():
      spent[name].append(t)

  latencies = {}
  if latency:  # streamed programs are their own: compiled here, then timed interleaved
    fns = {"base": base, **spec}
    for name, fn in fns.items():
      lat.timed_call(lambda stream, g=groups[0], fn=fn: fn(g, stream=stream))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
      for g in groups:
        for name, fn in fns.items():
          samples[name].append(lat.timed_call(lambda stream, g=g, fn=fn: fn(g, stream=stream))[1])
    latencies = {name: lat.percentiles(lat.merge(v)) for name, v in samples.items()}

  longest = max(len(p) for p in prompts)
  widest = max(verify_width(drafter, k) for k in ks)
  S = cache_bucket(longest + max_new_tokens + widest)
  prefix = min(longest, S - widest - 1)
  t_step = costs.call_time(target, len(groups[0]), 1, S, prefix=prefix)
  base_time = statistics.median(spent["base"])
  base_tokens = sum(int(np.sum(np.asarray(o.lengths))) for o in outs["base"])
  rows = []
  for k in ks:
    hist = sum(np.asarray(o.stats.accept_hist, np.int64) for o in outs[k])
    emitted = sum(int(np.sum(np.asarray(o.lengths))) for o in outs[k])
    calls = sum(int(np.sum(np.asarray(o.stats.target_calls))) for o in outs[k])
    rates = acceptance_rates(hist, emitted, calls)
    t_verify = costs.call_time(target, len(groups[0]), verify_width(drafter, k), S,
                               prefix=prefix)
    # A branch drafter (lookahead) drafts by lookups; its work is the verify's extra rows.
    t_round = (0.0 if isinstance(drafter, BranchDrafter)
               else round_time(drafter, len(groups[0]), k, S, prefix=prefix, target=target))
    spec_time = statistics.median(spent[k])
    same = all(np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
               for a, b in zip(outs["base"], outs[k]))
    rows.append({
        "k": k, "tau": rates["tau"], "alpha": rates["alpha"],
        "draft_accept": rates["draft_accept"], "position_acceptance": position_acceptance(hist),
        "accept_hist": hist.tolist(), "t_verify_ms": t_verify * 1e3,
        "t_draft_round_ms": t_round * 1e3,
        "predicted_speedup": ideal_speedup(rates["tau"], 1, t_step, t_verify, t_round),
        "measured_speedup": base_time / spec_time, "tokens_per_s": emitted / spec_time,
        "equal_to_baseline": same if temperature == 0 else None,
        "per_prompt": per_prompt(outs[k]),
        **({"latency": latencies[k]} if latency else {}),
    })
  return {
      "prompts": len(prompts), "batch_size": batch_size, "max_new_tokens": max_new_tokens,
      "temperature": temperature, "repeats": repeats, "backend": jax.default_backend(),
      "t_step_ms": t_step * 1e3, "baseline_tokens_per_s": base_tokens / base_time,
      "rows": rows,
      **({"baseline_latency": latencies["base"]} if latency else {}),
  }


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
    lines.append(lat.format_line("baseline", report["baseline_latency"]))
    for r in report["rows"]:
      lines.append(lat.format_line(f"K={r['k']}", r["latency"]))
  lines.append("per prompt: tau, then acceptance by position (- never judged)")
  for i in range(report["prompts"]):
    cells = []
    for r in report["rows"]:
      one = r["per_prompt"][i]
      pos = " ".join("-" if a != a else f"{a:.2f}" for a in one["position_acceptance"])
      cells.append(f"K={r['k']}: {one['tau']:.2f} [{pos}]")
    lines.append(f"{i:>4}  " + "  ".join(cells))
  return "\n".join(lines)


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
