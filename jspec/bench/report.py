"""Tables and plots of records, by any axis; the tables the docs quote, by name.

    print(report.pivot(recs, rows="method", cols="category", cell=report.speedup_tau))
    report.TABLES["spec-bench.speedup"](header, recs)      # what docs/benchmarks.md shows

A cell function takes (records of the cell, plain decoding's records on the same prompts)
and returns the cell's text. A table the docs quote is written between

    <!-- table NAME FILE -->
    ...
    <!-- /table -->

in README.md or docs/*.md; `tests/test_docs.py` renders `TABLES[NAME]` from the records of
FILE and fails where the page says anything else. FILE may name several files with one
brace group, `docs/bench/serve/restate_{jspec-plain,vllm-plain}.jsonl`, read in that order.
"""

from __future__ import annotations

import re
from typing import Callable

from jspec.bench import metrics as M
from jspec.bench import questions
from jspec.bench.runner import PLAIN

OVERALL = "Overall"


def markdown(rows: list[list[str]]) -> str:
  """A markdown table; rows[0] is the heading."""
  lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
  lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
  return "\n".join(lines)


def base_of(all_records, cell_records, base: str = PLAIN) -> list:
  """Plain decoding's records on the same prompts (and temperature) as `cell_records`."""
  keys = {(r.workload, r.prompt, r.axes.get("temperature", 0.0)) for r in cell_records}
  name = lambda r: base if r.axes.get("temperature", 0.0) == 0 else (
      f"{base}@T{r.axes.get('temperature'):g}")
  return [r for r in all_records
          if (r.workload, r.prompt, r.axes.get("temperature", 0.0)) in keys
          and r.method == name(r)]


def pivot(records, rows: str, cols: str, cell: Callable, col_order=None, heading=str,
          overall: bool = True, row_order=None, skip_rows=(PLAIN,), corner: str | None = None,
          extra: dict | None = None) -> str:
  """Records pivoted: one row per value of `rows`, one column per value of `cols` (in
  `col_order` where given), plus an overall column; each cell `cell(recs, base_recs)`.
  extra: {heading: fn(row records, base records)} columns after the overall one."""
  recs = list(records)
  row_keys = row_order or [k for k in M.group(recs, rows) if k not in skip_rows]
  col_keys = col_order or list(M.group(recs, cols))
  head = [corner or rows] + [heading(c) for c in col_keys] + ([OVERALL] if overall else [])
  head += list(extra or {})
  out = [head]
  for rk in row_keys:
    mine = M.select(recs, **{rows: rk})
    line = [f"`{rk}`" if rows == "method" else str(rk)]
    for ck in col_keys:
      part = M.select(mine, **{cols: ck})
      line.append(cell(part, base_of(recs, part)) if part else "-")
    if overall:
      line.append(cell(mine, base_of(recs, mine)))
    for fn in (extra or {}).values():
      line.append(fn(mine, base_of(recs, mine)))
    out.append(line)
  return markdown(out)


# ----------------------------------------------------------------------------- cells


def speedup_tau(recs, base) -> str:
  """"0.94x (1.81)": measured speedup over plain decoding, tau in brackets."""
  return f"{M.speedup(base, recs):.2f}x ({M.tau(recs):.2f})"


def tau(recs, base) -> str:
  """"1.81": tokens per target call."""
  return f"{M.tau(recs):.2f}"


def speedup(recs, base) -> str:
  """"0.94x": measured speedup over plain decoding on the same prompts."""
  return f"{M.speedup(base, recs):.2f}x"


def tokens_per_s(recs, base) -> str:
  """Tokens per second of the median repeat."""
  return f"{M.tokens_per_s(recs):.1f}"


def acceptance(recs, base) -> str:
  """"0.30 / 0.73 / ...": acceptance by draft position."""
  return " / ".join("-" if a != a else f"{a:.2f}" for a in M.acceptance(recs))


def predicted_accelerator(costs: list, ks: dict) -> Callable:
  """A cell: the speedup the measured tau and draft costs predict where a verify costs
  one step. costs: one {method: {K: cost figures}} (`metrics.predicted_steps`) per
  process that measured them, a record's own in its axis `part` (0 when absent), so
  records joined from several processes are each priced by their own; ks: {method: K}."""
  def cell(recs, base):
    method = recs[0].method
    steps = 0.0
    for part, mine in M.group(recs, "part").items() if "part" in recs[0].axes else [(0, recs)]:
      accel, _ = M.predicted_steps(mine, costs[part].get(method, {}), ks.get(method))
      if accel is None:
        return "-"
      steps += accel
    return f"{sum(r.tokens for r in recs) / steps:.2f}x" if steps else "-"
  return cell


# ----------------------------------------------------------------------------- docs


def _spec_bench_cols(recs):
  return questions.columns(r.axes["category"] for r in recs)


def _heading(group: str) -> str:
  return questions.heading(group)


def _greedy(recs):
  return [r for r in recs if r.axes.get("temperature", 0.0) == 0]


def spec_bench_speedup(header: dict, recs) -> str:
  """Spec-Bench's leaderboard form: measured speedup (tau) per category, greedy."""
  recs = _greedy(recs)
  return pivot(recs, "method", "category", speedup_tau, col_order=_spec_bench_cols(recs),
               heading=_heading, corner="jspec method").replace(
                   f"| {OVERALL} |", f"| {OVERALL} (tau) |", 1)


def spec_bench_predicted(header: dict, recs) -> str:
  """The speedup predicted where a verify costs one step, per category, greedy."""
  recs = _greedy(recs)
  costs = header.get("costs", [{}])
  ks = {name: m["k"] for name, m in header.get("methods", {}).items()}
  return pivot(recs, "method", "category", predicted_accelerator(costs, ks),
               col_order=_spec_bench_cols(recs), heading=_heading, corner="jspec method")


def serve_load(header: dict, recs) -> str:
  """`jspec bench serve`'s table: per rate and server, completed / refused, tokens/s (and
  against the first server's), TTFT, TPOT and E2E p50 / p99, tau and rounds by K."""
  from jspec.bench import serve_load as S

  return S.table(S.runs_of(header, recs))


TABLES: dict[str, Callable] = {
    "spec-bench.speedup": spec_bench_speedup,
    "spec-bench.predicted": spec_bench_predicted,
    "serve.load": serve_load,
}

MARKER = re.compile(r"<!-- table (\S+) (\S+) -->\n(.*?)\n<!-- /table -->", re.S)


def quoted_tables(text: str) -> list[tuple[str, str, str]]:
  """(table name, records file, the table as the page shows it) of each marked table."""
  return [(m.group(1), m.group(2), m.group(3).strip()) for m in MARKER.finditer(text)]


def paths(path: str) -> list[str]:
  """The files `path` names: itself, or one per item of its one brace group
  (`a_{x,y}.jsonl` -> a_x.jsonl, a_y.jsonl)."""
  m = re.fullmatch(r"([^{}]*)\{([^{}]*)\}([^{}]*)", path)
  if m is None:
    if "{" in path or "}" in path:
      raise ValueError(f"{path!r}: at most one brace group, {{a,b}}")
    return [path]
  return [m.group(1) + item + m.group(3) for item in m.group(2).split(",")]


def read(path: str) -> tuple[dict, list]:
  """(header, records) of the files `path` names (`paths`): one file's own header, or
  {"files": [each file's header]} of several, their records joined in order."""
  from jspec.bench import records

  heads, recs = [], []
  for one in paths(path):
    head, mine = records.read(one)
    heads.append(head)
    recs += mine
  return (heads[0] if len(heads) == 1 else {"files": heads}), recs


def render(name: str, path: str) -> str:
  """The table `name` rendered from the records in `path` (relative to the repository)."""
  if name not in TABLES:
    raise ValueError(f"unknown table {name!r}; known: {', '.join(TABLES)}")
  head, recs = read(path)
  return TABLES[name](head, recs)


def refresh(text: str, root: str = ".") -> str:
  """A page with every marked table rendered again from its records."""
  import os

  def sub(m):
    table = render(m.group(1), os.path.join(root, m.group(2)))
    return f"<!-- table {m.group(1)} {m.group(2)} -->\n{table}\n<!-- /table -->"

  return MARKER.sub(sub, text)


# ----------------------------------------------------------------------------- plots


def bars(records, cols: str, values: dict[str, Callable], path: str, title: str,
         col_order=None, heading=str, skip=(PLAIN,)) -> None:
  """One panel per entry of `values` ({label: fn(recs, base) -> float}), grouped bars of
  each method per value of `cols` and overall (PNG; needs matplotlib)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  recs = list(records)
  names = [k for k in M.group(recs, "method") if k not in skip]
  cols_ = (col_order or list(M.group(recs, cols))) + [OVERALL]
  fig, axes = plt.subplots(1, len(values), figsize=(5 * len(values), 4.2), squeeze=False)
  x = np.arange(len(cols_))
  width = 0.8 / max(len(names), 1)
  for ax, (label, fn) in zip(axes[0], values.items()):
    for i, name in enumerate(names):
      mine = M.select(recs, method=name)
      ys = []
      for c in cols_:
        part = mine if c == OVERALL else M.select(mine, **{cols: c})
        y = fn(part, base_of(recs, part)) if part else None
        ys.append(0.0 if y is None else y)
      ax.bar(x + i * width - 0.4 + width / 2, ys, width, label=name)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_title(label)
    ax.set_xticks(x)
    ax.set_xticklabels([c if c == OVERALL else heading(c) for c in cols_], rotation=30,
                       ha="right", fontsize=8)
  axes[0][0].legend(fontsize=8)
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
