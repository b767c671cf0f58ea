"""The report of `jspec bench --suite spec-bench`: per-category figures, costs, predictions, tables.

Per method (variant) and category, from the runs of `jspec.tools.spec_bench.run`:

  tau           tokens emitted / target calls (Spec-Bench's "#Mean Accepted Tokens");
  acceptance    by draft position i: of the rounds that judged draft i, the fraction that
                accepted it (`DecodeStats.position_judged` / `position_accepted`, summed);
  speedup       measured: tokens/s over plain decoding's, median over repeats of ratios
                of times taken in the same repeat;
  predicted_accelerator
                tau * T_step / (T_verify + T_draft_round) with T_verify = T_step, the
                regime of an accelerator, where a verify of a few tokens costs about one
                step (`jspec.planner.cost_model`), and T_draft_round / T_step the
                drafter's cost as measured here (zero for lookahead: its guesses ride in
                the verify); for "auto", each K's rounds at that K's cost;
  ideal_here    the same with T_verify measured here at the method's verify width
                (`jspec.core.stats.ideal_speedup`): what this machine's costs allow.
"""

from __future__ import annotations

import dataclasses
import statistics

from jspec.bench import questions as suite
from jspec.tools import bench_timing


def measure_costs(target, methods: dict, items: list, repeats: int = 10) -> dict:
  """T_step, and per method and K its verify and draft-round costs, at batch 1, at the
  median prompt's cache length and prefix (costs move little with either)."""
  from jspec.core.drafter import BranchDrafter
  from jspec.drafters.suffix import SuffixMemory
  from jspec.bench import costs
  from jspec.bench.costs import round_time, verify_width
  from jspec.tools.spec_bench import MEMORY_SLOTS

  mid = sorted(items, key=lambda it: it["prompt_tokens"])[len(items) // 2]
  S, prefix = mid["S"], mid["prompt_tokens"]
  t_step = costs.call_time(target, 1, 1, S, repeats=repeats, prefix=prefix)
  verify = {1: t_step}
  report = {"t_step_ms": t_step * 1e3, "cache_length": S, "prefix": prefix,
            "accelerator_verify_over_step": 1.0, "methods": {}}
  for name, built in methods.items():
    drafter = built.drafter
    if built.with_memory:
      drafter = dataclasses.replace(drafter, memory=SuffixMemory.empty(MEMORY_SLOTS))
    if built.k == "auto":
      ks = sorted({k for it in items for k, v in it["runs"][name]["rounds_by_k"].items()
                   if k > 0 and v})
    else:
      ks = [built.k]
    per_k = {}
    for k in ks:
      tree = getattr(built, "tree", None)
      width = verify_width(drafter, k) if tree is None else tree.num_nodes
      if width not in verify:
        verify[width] = costs.call_time(target, 1, width, S, repeats=repeats, prefix=prefix)
      note = None
      if isinstance(drafter, BranchDrafter):
        t_round = 0.0
      else:
        try:
          t_round = round_time(drafter, 1, k, S, prefix=prefix, repeats=repeats,
                                       target=target, tree=tree)
        except Exception as e:  # a drafter the timing harness does not know how to drive
          t_round, note = None, f"draft round not timed: {type(e).__name__}: {e}"
      per_k[k] = {"verify_tokens": width, "t_verify_here_ms": verify[width] * 1e3,
                  "verify_over_step_here": verify[width] / t_step,
                  "t_draft_round_ms": None if t_round is None else t_round * 1e3,
                  "draft_round_over_step": None if t_round is None else t_round / t_step,
                  **({"note": note} if note else {})}
    report["methods"][name] = {str(k): v for k, v in per_k.items()}
  return report


def _cell(items: list, variant: str, base: str) -> dict:
  """One method's figures over some prompts, against plain decoding (`base`) on them."""
  runs = [it["runs"][variant] for it in items]
  repeats = len(items[0]["times"][variant])
  sums = [sum(it["times"][variant][r] for it in items) for r in range(repeats)]
  base_sums = [sum(it["times"][base][r] for it in items) for r in range(repeats)]
  tokens = sum(r["tokens"] for r in runs)
  base_tokens = sum(it["runs"][base]["tokens"] for it in items)
  calls = sum(r["calls"] for r in runs)
  width = max(len(r["judged"]) for r in runs)
  judged = [sum(r["judged"][i] for r in runs if i < len(r["judged"])) for i in range(width)]
  accepted = [sum(r["accepted"][i] for r in runs if i < len(r["accepted"]))
              for i in range(width)]
  rounds = {}
  for r in runs:
    for k, v in r["rounds_by_k"].items():
      rounds[k] = rounds.get(k, 0) + v
  time_s = statistics.median(sums)
  cell = {"prompts": len(items), "tokens": tokens, "target_calls": calls,
          "tau": tokens / max(calls, 1), "time_s": time_s, "tokens_per_s": tokens / time_s,
          "speedup": (bench_timing.paired_speedup(base_sums, sums) * tokens
                      / max(base_tokens, 1)),
          "position_acceptance": [a / j if j else None for a, j in zip(accepted, judged)],
          "position_judged": judged}
  if rounds:
    cell["rounds_by_k"] = {str(k): v for k, v in sorted(rounds.items())}
  if "equal" in runs[0]:
    cell["equal_to_plain"] = all(r["equal"] for r in runs)
  return cell


def _predict(cell: dict, k, by_k: dict | None) -> None:
  """Adds predicted_accelerator and ideal_here to a cell from its rounds and the method's
  costs by K (`measure_costs`)."""
  if by_k is None:
    return
  if "rounds_by_k" in cell:
    rounds = {int(a): b for a, b in cell["rounds_by_k"].items()}
  else:  # "auto" that never drafted reports no rounds by K: all its rounds were plain
    rounds = {0 if k == "auto" else k: cell["target_calls"]}
  accel = here = 0.0
  for kk, n in rounds.items():
    if n == 0:
      continue
    if kk == 0:  # a plain round: one step either way
      accel += n
      here += n
      continue
    c = by_k.get(str(kk))
    if c is None or c["draft_round_over_step"] is None:
      return
    accel += n * (1.0 + c["draft_round_over_step"])
    here += n * (c["verify_over_step_here"] + c["draft_round_over_step"])
  cell["predicted_accelerator"] = cell["tokens"] / accel if accel else None
  cell["ideal_here"] = cell["tokens"] / here if here else None


def aggregate(items: list, methods: dict, sampled: bool, measured: dict | None) -> dict:
  """{"greedy": {method: {group or "overall": cell}}, "sampled": ...}: every method's
  figures per category and over all prompts (`_cell`), with predictions (`_predict`)."""
  groups = suite.columns(it["group"] for it in items) + ["overall"]
  out = {}
  for mode, suffix, base in (("greedy", "", "plain"), ("sampled", "@T1", "plain@T1")):
    if mode == "sampled" and not sampled:
      continue
    table = {}
    for name in ["plain"] + list(methods):
      variant = base if name == "plain" else name + suffix
      row = {}
      for g in groups:
        chosen = [it for it in items if g == "overall" or it["group"] == g]
        row[g] = _cell(chosen, variant, base)
        if name != "plain":
          _predict(row[g], methods[name].k, (measured or {}).get("methods", {}).get(name))
      table[name] = row
    out[mode] = table
  return out


def format_table(results: dict, title: str, key: str = "speedup", with_tau: bool = True) -> str:
  """The leaderboard's form: categories as columns, one row per method, "1.23x (tau)"."""
  groups = list(next(iter(results.values())))
  heads = [suite.heading(g) if g != "overall" else "Overall" for g in groups]
  rows = [["method"] + heads + (["#Mean Accepted Tokens"] if with_tau else [])]
  for name, row in results.items():
    if name == "plain":
      continue
    cells = [name]
    for g in groups:
      v = row[g].get(key)
      cells.append("-" if v is None else f"{v:.2f}x" + (f" ({row[g]['tau']:.2f})"
                                                        if with_tau and key == "speedup" else ""))
    if with_tau:
      cells.append(f"{row['overall']['tau']:.2f}")
    rows.append(cells)
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = [title]
  for i, r in enumerate(rows):
    lines.append(" | ".join(c.ljust(w) if j == 0 else c.rjust(w)
                            for j, (c, w) in enumerate(zip(r, widths))))
    if i == 0:
      lines.append("-+-".join("-" * w for w in widths))
  return "\n".join(lines)


def format_acceptance(results: dict) -> str:
  """Acceptance by draft position over all prompts, one line per method."""
  lines = ["acceptance by draft position, all prompts (judged rounds in brackets):"]
  for name, row in results.items():
    if name == "plain":
      continue
    cell = row["overall"]
    pos = " ".join("-" if a is None else f"{a:.2f}[{j}]"
                   for a, j in zip(cell["position_acceptance"], cell["position_judged"]))
    lines.append(f"  {name:<10} {pos}")
  return "\n".join(lines)


def plot(report: dict, path: str) -> None:
  """tau, measured and predicted speedup per category and method, as grouped bars (PNG)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  results = report["results"]["greedy"]
  names = [n for n in results if n != "plain"]
  groups = list(results[names[0]]) if names else []
  panels = (("tau", "tau (tokens per target call)"), ("speedup", "measured speedup here"),
            ("predicted_accelerator", "predicted, verify = 1 step"))
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharex=True)
  x = np.arange(len(groups))
  width = 0.8 / max(len(names), 1)
  for ax, (key, label) in zip(axes, panels):
    for i, name in enumerate(names):
      values = [results[name][g].get(key) or 0.0 for g in groups]
      ax.bar(x + i * width - 0.4 + width / 2, values, width, label=name)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_title(label)
    ax.set_xticks(x)
    ax.set_xticklabels([suite.heading(g) if g != "overall" else "Overall" for g in groups],
                       rotation=30, ha="right", fontsize=8)
  axes[0].legend(fontsize=8)
  fig.suptitle(f"Spec-Bench questions, batch 1, greedy, {report['target']}")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
