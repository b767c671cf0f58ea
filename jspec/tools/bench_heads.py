"""`jspec bench --sections heads`: self-drafting heads against the draft model, chains and trees.

Batch 1, greedy, the shipped held-out code prompts run one after another. Each
drafter runs as a chain of K drafts and as a tree of `nodes` nodes, side by side
with the baseline in one process (compiled first, interleaved repeats, medians):

    draft model   chain K, tree        (a separate 1.5M-parameter model)
    Medusa        chain K, tree        (heads on the target's last hidden state)
    EAGLE         chain K, tree        (one decoder layer over target features)

Reported per variant: tau (tokens per target call, the figure the papers quote:
Li et al. 2024 give 3.6 for EAGLE on Spec-Bench), speedup over baseline, and
whether the output equals the baseline's.

Trees are chosen the same way for every drafter so the comparison is fair: the
chain run gives the per-depth acceptance a_d (P(n > d | n >= d) from the
acceptance histogram); rank r > 0 candidates are assumed right with probability
(1 - a_d) * SECOND * HALVING^(r-1), and `Tree.best_first` picks the `nodes`-node tree
with the largest expected length under that table.
"""

from __future__ import annotations

import numpy as np

from jspec.planner.api import generate, speculative_generate
from jspec.core.tree import Tree

SECOND = 0.4  # share of a rejected argmax's mass assumed caught by the second choice
HALVING = 0.5
MAX_RANKS = 4


def depth_acceptance(accept_hist) -> np.ndarray:
  """a_d = P(at least d+1 drafts accepted | at least d), d = 0..K-1, from [K+1] counts."""
  hist = np.asarray(accept_hist, np.float64)
  at_least = np.cumsum(hist[::-1])[::-1]  # at_least[d] = rounds with n >= d
  with np.errstate(invalid="ignore", divide="ignore"):
    a = at_least[1:] / at_least[:-1]
  return np.nan_to_num(a, nan=0.0)


def accuracy_table(accept_hist, depth: int) -> np.ndarray:
  """[depth, MAX_RANKS] rank accuracies from a chain's acceptance (see module docstring).
  Depths beyond the chain reuse its last depth."""
  a = depth_acceptance(accept_hist)
  a = np.concatenate([a, np.full(max(depth - a.size, 0), a[-1] if a.size else 0.0)])[:depth]
  ranks = np.arange(1, MAX_RANKS)
  rest = (1 - a)[:, None] * SECOND * HALVING ** (ranks - 1)[None, :]
  return np.clip(np.concatenate([a[:, None], rest], axis=1), 0.0, 1.0)


def heads(target, drafters: dict, prompts, *, k: int = 4, nodes: int = 16, tree_depth: int = 5,
          max_new_tokens: int = 64, repeats: int = 3, max_depth: dict | None = None) -> dict:
  """Chain and tree tau and speedup for each drafter ({name: drafter}) at batch 1.

  max_depth: {name: deepest tree / longest chain the drafter supports} (Medusa: its
  number of heads).
  """
  from jspec.tools.bench_timing import Concat, report_row, side_by_side

  max_depth = max_depth or {}
  kw = dict(max_new_tokens=max_new_tokens, eos_id=())

  def each(fn):  # the prompts one after another, seen as one output
    return lambda: Concat([fn([p]) for p in prompts])

  # Chains first: their acceptance picks each drafter's tree.
  chains = {}
  for name, d in drafters.items():
    kk = min(k, max_depth.get(name, k))
    chains[name] = kk
  calls = {"baseline": each(lambda p: generate(target, p, **kw))}
  for name, d in drafters.items():
    calls[f"{name} chain"] = (lambda d, kk: each(lambda p: speculative_generate(
        target, d, p, num_draft_tokens=kk, **kw)))(d, chains[name])
  trees = {}
  for name, d in drafters.items():
    probe = speculative_generate(target, d, prompts[:1], num_draft_tokens=chains[name], **kw)
    depth = min(tree_depth, max_depth.get(name, tree_depth))
    table = accuracy_table(np.asarray(probe.stats.accept_hist), depth)
    trees[name] = (Tree.best_first(table, nodes), table)
    calls[f"{name} tree"] = (lambda d, t: each(lambda p: speculative_generate(
        target, d, p, tree=t, **kw)))(d, trees[name][0])
  res = side_by_side(calls, repeats)
  base = res.pop("baseline")
  report = {"nodes": nodes, "k": k, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "baseline_tokens_per_s": float(np.sum(base["out"].lengths)) / base["time"],
            "rows": {}}
  for name in drafters:
    report["rows"][f"{name} chain"] = dict(report_row(res[f"{name} chain"], base), k=chains[name])
    t, table = trees[name]
    report["rows"][f"{name} tree"] = dict(
        report_row(res[f"{name} tree"], base), nodes=t.num_nodes, depth=t.max_depth,
        parents=list(t.parents), ranks=list(t.ranks),
        accuracy_table=np.round(table, 3).tolist())
  return report


def summary(report: dict) -> str:
  """Terminal lines for the heads section."""
  lines = [f"self-drafting heads, batch 1, held-out code, greedy, {report['prompts']} prompts x "
           f"{report['max_new_tokens']} tokens (baseline {report['baseline_tokens_per_s']:.0f} "
           f"tok/s)",
           f"  {'variant':<16}{'shape':>14}{'tau':>7}{'speedup':>9}"]
  for name, r in report["rows"].items():
    shape = f"K = {r['k']}" if "k" in r else f"{r['nodes']} nodes, d{r['depth']}"
    lines.append(f"  {name:<16}{shape:>14}{r['tau']:>7.2f}{r['speedup']:>8.2f}x"
                 + ("" if r["equal_to_baseline"] else "  (differs from baseline)"))
  return "\n".join(lines)
