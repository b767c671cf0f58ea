"""Tables and plots of records, by any axis, and the studies' tables the docs quote.

    print(report.pivot(recs, rows="method", cols="category", cell=report.speedup_tau))
    report.spec_bench_speedup(header, recs)      # what docs/benchmarks.md shows

A cell function takes (records of the cell, plain decoding's records on the same prompts)
and returns the cell's text. The docs name the tables they quote through
`jspec.bench.tables.TABLES`, which holds these functions and the study modules' own.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

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


def _p50_p99_ms(values, digits: int) -> str:
  p = M.percentiles(values)
  return f"{p['p50'] * 1e3:.{digits}f} / {p['p99'] * 1e3:.{digits}f}"


def request_ms(recs, base) -> str:
  """"2162 / 2778": request latency p50 / p99, ms (`metrics.request_latency`)."""
  return _p50_p99_ms(M.request_latency(recs), 0)


def inter_token_ms(recs, base) -> str:
  """"34.1 / 50.7": inter-token latency p50 / p99, ms, of streamed records
  (`metrics.inter_token`)."""
  return _p50_p99_ms(M.inter_token(recs), 1)


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


def finish(ran, study: str, settings: dict, tables: dict, path: str | None, **header) -> int:
  """A study's end: its tables printed ({title: text}), its records written to `path` (JSON
  lines under `records.header(study, settings, **header)`, the mismatches in it), and its
  exit code: 1 where a greedy answer differed from its reference (the runner listed it)."""
  import sys

  from jspec.bench import records

  for title, table in tables.items():
    print(f"\n{title}:\n{table}")
  if path:
    records.write(path, records.header(study, settings, mismatches=ran.mismatches, **header),
                  ran.records)
    print(f"wrote {path} ({len(ran.records)} records)")
  if ran.mismatches:
    print(f"ERROR: {len(ran.mismatches)} greedy answer(s) differ from their reference "
          f"(listed above)", file=sys.stderr)
    return 1
  return 0


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


def load_figures(recs) -> dict:
  """A live-load run's figures from its request records: output tokens/s from the first
  arrival to the last answer, TTFT and TPOT percentiles (s), tau."""
  tokens = sum(r.tokens for r in recs)
  ttft = M.percentiles([M.ttft(r) for r in recs], (50, 99))
  tpot = M.percentiles([x for x in (M.tpot(r) for r in recs) if x is not None], (50, 99))
  return dict(tokens_per_s=tokens / M.span(recs), tokens=tokens, ttft_p50=ttft["p50"],
              ttft_p99=ttft["p99"], tpot_p50=tpot["p50"], tpot_p99=tpot["p99"],
              tau=M.tau(recs))


_LOAD_METHODS = {"ngram4": "n-gram K = 4", "auto": '`"auto"`'}  # engine_load.py's names


def engine_load(header: dict, recs) -> str:
  """benchmarks/engine_load.py's table: per workload, rate and method, tokens/s and against
  plain decoding's, TTFT and TPOT p50 / p99, tau, and the rounds at each K (the header's
  `runs`). With repeats (axis `repeat`; records without it are one repeat): tok/s is the
  median over repeats, "x plain" the median of each repeat's ratio to plain decoding's in the
  same repeat (the same arrivals), the percentiles pool every repeat's requests, and the
  rounds at each K are summed."""
  runs = header.get("runs", {})
  rep = lambda r: r.axes.get("repeat", 0)
  rows = [["workload", "req/s", "method", "tok/s", "x plain", "TTFT p50 / p99 s",
           "TPOT p50 / p99 ms", "tau", "rounds by K"]]
  for (w, rate, m), mine in M.group(recs, "workload", "rate", "method").items():
    res = load_figures(mine)
    plain = M.select(recs, workload=w, rate=rate, method="plain")
    by_rep = {}
    for r in mine:
      by_rep.setdefault(rep(r), []).append(r)
    speed = {i: load_figures(part)["tokens_per_s"] for i, part in by_rep.items()}
    ratios = [speed[i] / load_figures([r for r in plain if rep(r) == i])["tokens_per_s"]
              for i in speed if any(rep(r) == i for r in plain)]
    ratio = float(np.median(ratios)) if ratios else float("nan")
    by_k: dict = {}
    for i in sorted(by_rep):
      key = f"{w}/{rate:g}/{m}" + (f"/{i}" if i else "")
      for k, n in runs.get(key, {}).get("rounds_by_k", {}).items():
        by_k[k] = by_k.get(k, 0) + n
    by_k = ", ".join(f"{k}: {n}" for k, n in by_k.items()) if by_k else "-"
    rows.append([w, f"{rate:g}", _LOAD_METHODS.get(m, m),
                 f"{float(np.median(list(speed.values()))):.1f}",
                 f"{ratio:.2f}", f"{res['ttft_p50']:.2f} / {res['ttft_p99']:.2f}",
                 f"{1000 * res['tpot_p50']:.0f} / {1000 * res['tpot_p99']:.0f}",
                 f"{res['tau']:.2f}", by_k])
  return markdown(rows)


# ----------------------------------------------------------------------------- converted studies
# The tables of studies read from earlier reports (`jspec.bench.legacy`), in the pages' own
# forms.

CHAT_KINDS = {"restate": "restating given text or code", "explain": "explaining given code",
              "question": "free questions"}

_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven",
          8: "eight", 9: "nine", 10: "ten"}


def method_label(spec: str) -> str:
  """A method's spec as the docs' tables name it ("ngram@k=4" -> "n-gram K = 4",
  "eagle3@tree=16,5,4" -> "EAGLE-3 dynamic tree, 16 nodes")."""
  name, _, opt = spec.partition("@")
  base = {"ngram": "n-gram", "eagle3": "EAGLE-3", "draft": "draft model"}.get(name, name)
  if opt == "k=auto":
    return f'{base}, `"auto"`'
  if opt.startswith("k="):
    return f"{base} K = {opt[2:]}"
  if opt.startswith("tree="):
    return f"{base} dynamic tree, {opt[5:].split(',')[0]} nodes"
  return base


def _in(recs, **where):
  return M.select(recs, **where)


def _tight(table: str) -> str:
  """A markdown table with its empty cells written "| |", as the pages write them."""
  return re.sub(r"\|  (?=\|)", "| ", table)


def real_ngram_transformers(header: dict, recs) -> str:
  """README's results: per chat kind, jspec's and transformers' greedy tokens/s, and n-gram
  at K, n-gram "auto" and transformers' prompt lookup over their own library's greedy
  (`jspec bench --target smollm2 --sections ngram`, docs/bench/ngram_auto_smollm2.jsonl)."""
  k = header["settings"]["k"]
  out = [["prompts", "jspec greedy", "transformers greedy", f"jspec n-gram K = {k}",
          'jspec n-gram `"auto"`', "transformers prompt lookup"]]
  for kind, mine in M.group(recs, "kind").items():
    of = lambda method: _in(mine, method=method)
    out.append([CHAT_KINDS.get(kind, kind), f"{M.tokens_per_s(of('plain')):.1f} tok/s",
                f"{M.tokens_per_s(of('transformers')):.1f} tok/s",
                f"{M.speedup(of('plain'), of(f'ngram@k={k}')):.2f}x",
                f"{M.speedup(of('plain'), of('ngram@k=auto')):.2f}x",
                f"{M.speedup(of('transformers'), of(f'transformers-prompt-lookup@k={k}')):.2f}x"])
  return markdown(out)


def heads_real_sets(header: dict, recs) -> str:
  """`bench_heads_real`'s table: per prompt set and method, tau, speedup over plain (sums
  of per-call medians) and inter-token latency p50 / p99 as the report pooled it."""
  out = [["set", "method", "tau", "speedup", "inter-token p50 / p99, ms"]]
  for name, mine in M.group(recs, "set").items():
    base = _in(mine, method=PLAIN)
    for i, (method, part) in enumerate(
        (m, p) for m, p in M.group(mine, "method").items() if m != PLAIN):
      itl = part[0].extra["itl_ms"]
      out.append([name if i == 0 else "", method_label(method), f"{M.tau(part):.2f}",
                  f"{M.speedup(base, part):.2f}x", f"{itl['p50']:.1f} / {itl['p99']:.1f}"])
  return _tight(markdown(out))


def assisted_tokens_per_s(header: dict, recs) -> str:
  """`bench_assisted`'s table: tokens/s per chat kind and over all of them, each
  speculative variant over its own library's greedy in brackets."""
  k = header["settings"]["k"]
  cols = [("plain", None), (f"draft@k={k}", "plain"), ("draft@k=auto", "plain"),
          ("transformers", None), (f"transformers-assisted@k={k}", "transformers"),
          (f"transformers-assisted@k={k}+confidence", "transformers")]
  out = [["set", "jspec greedy", f"jspec draft K = {k}", 'jspec draft `"auto"`',
          "transformers greedy", f"assisted K = {k}", "assisted, confidence stop"]]
  for kind, mine in list(M.group(recs, "kind").items()) + [("all", list(recs))]:
    line = [kind]
    for method, base in cols:
      part = _in(mine, method=method)
      cell = f"{M.tokens_per_s(part):.1f}"
      if base is not None:
        cell += f" ({M.speedup(_in(mine, method=base), part):.2f}x)"
      line.append(cell)
    out.append(line)
  return markdown(out)


def eagle_trees_shapes(header: dict, recs) -> str:
  """`jspec.bench.eagle_trees`' table (benchmarks/eagle_trees_smollm2.py's before it): per
  shape (the records of the head, not plain decoding's), verify width, head passes a
  round, tau (3 places) and acceptance by draft position."""
  out = [["shape", "verify tokens", "head passes a round", "tau",
          "acceptance by draft position"]]
  for r in recs:
    out.append([r.extra["label"], str(r.axes["verify_tokens"]),
                str(r.extra["head_passes_per_round"]), f"{M.tau([r]):.3f}",
                acceptance([r], [])])
  return markdown(out)


def _suite_rows(header, recs, labels, costs_list):
  ks = {name: m["k"] for name, m in header["methods"].items()}
  rows = []
  for method, label in labels.items():
    mine = [r for r in _greedy(recs) if r.method == method]
    base = base_of(recs, mine)
    predicted = [predicted_accelerator(c, ks)(mine, base) for c in costs_list]
    rows.append([label, f"{M.tau(mine):.2f}", f"{M.speedup(base, mine):.2f}x",
                 " / ".join(predicted)])
  return rows


def spec_bench_heads(labels: dict) -> Callable:
  """A table of trained drafters on Spec-Bench prompts (docs/training.md): per method (in
  `labels`' order, as named there), tau, the speedup measured here and the one predicted
  where a verify costs one step."""
  def table(header: dict, recs) -> str:
    return markdown([["method", "tau", "measured here",
                      "predicted where a verify costs one step"]]
                    + _suite_rows(header, recs, labels, [header["costs"]]))
  return table


def spec_bench_heads_against(labels: dict) -> Callable:
  """As `spec_bench_heads` for the first of two files, its predicted speedup priced with
  its own run's costs and with the second file's (`a_{x,y}.jsonl`, the records told apart
  by their study)."""
  def table(header: dict, recs) -> str:
    mine, other = header["files"]
    recs = [r for r in recs if r.study == mine["study"]]
    return markdown([["method", "tau", "measured here",
                      "predicted where a verify costs one step (this run's costs / the run "
                      "above's)"]]
                    + _suite_rows(mine, recs, labels, [mine["costs"], other["costs"]]))
  return table


def capacity_cache(header: dict, recs) -> str:
  """benchmarks/continuous_batching.py capacity: per cache length, the median seconds (and
  range) of each number of new tokens, and the largest cache's medians over the first's."""
  news = list(M.group(recs, "new_tokens"))
  caches = list(M.group(recs, "cache_length"))
  out = [["cache slots"] + [f"{n} new tokens: median s (range)" for n in news]]
  for S in caches:
    line = [f"{S:,}"]
    for n in news:
      r = _in(recs, cache_length=S, new_tokens=n)
      line.append(f"{M.seconds(r):.2f} ({min(r[0].seconds):.2f}-{max(r[0].seconds):.2f})")
    out.append(line)
  at = lambda S, n: _in(recs, cache_length=S, new_tokens=n)
  out.append([f"{caches[-1]:,} / {caches[0]:,}"] + [
      f"{M.ratio_of_medians(at(caches[-1], n), at(caches[0], n)):.2f}x" for n in news])
  return markdown(out)


def quant_agreement(header: dict, recs) -> str:
  """benchmarks/quant_agreement.py: per weights mode, the bytes held (and over f32's),
  top-1 agreement with the f32 model teacher-forced on its answers (all positions, and
  the range over prompts), and the greedy answers equal / the median token where they
  part."""
  bytes_ = header["bytes"]
  recs = [r for r in recs if r.study == "quant-agreement"]
  out = [["weights", "bytes held (x f32)", "top-1 agreement", "per prompt",
          "greedy answers equal", "part at token (median)", "max logit difference"]]
  for mode in dict.fromkeys(r.method for r in recs):
    mine = [r for r in recs if r.method == mode]
    agree = sum(r.extra["agree"] for r in mine)
    positions = sum(r.extra["positions"] for r in mine)
    shares = [r.extra["agree"] / r.extra["positions"] for r in mine]
    parts = [r.extra["first_difference"] for r in mine if r.extra["first_difference"] is not None]
    out.append([f"`{mode}`", f"{bytes_[mode]:,} ({bytes_[mode] / bytes_['f32']:.3f}x)",
                f"{agree:,} / {positions:,} ({100 * agree / positions:.1f}%)",
                f"{100 * min(shares):.0f}-{100 * max(shares):.0f}%",
                f"{sum(bool(r.equal) for r in mine)} of {len(mine)}",
                f"{float(np.median(parts)):.0f}" if parts else "-",
                f"{max(r.extra['max_logit_difference'] for r in mine):.3g}"])
  return markdown(out)


def _many_label(header, method):
  slots, requests = header["settings"]["slots"], header["settings"]["requests"]
  calls = -(-requests // slots)
  return {"generate": f"static batches of {slots} (`generate`, {_WORDS.get(calls, calls)} "
                      "calls)",
          "generate_many": f"`generate_many`, {slots} slots",
          "vllm": f"vLLM, `max_num_seqs={slots}`"}.get(method, method)


def many_static(header: dict, recs) -> str:
  """benchmarks/continuous_batching.py many: static batches against `generate_many`,
  median seconds and tokens/s (the ratio of medians in brackets)."""
  static, many_ = _in(recs, method="generate"), _in(recs, method="generate_many")
  rows = [["", "s (median)", "tok/s"],
          [_many_label(header, "generate"), f"{M.seconds(static):.1f}",
           f"{M.tokens_per_s(static):.1f}"],
          [_many_label(header, "generate_many"), f"{M.seconds(many_):.1f}",
           f"{M.tokens_per_s(many_):.1f} ({M.ratio_of_medians(static, many_):.2f}x)"]]
  return _tight(markdown(rows))


def many_vllm(header: dict, recs) -> str:
  """benchmarks/continuous_batching.py many with vLLM: each repeat's seconds, the median
  tokens/s, and generate_many's over vLLM's (ratio of medians)."""
  many_, vllm = _in(recs, method="generate_many"), _in(recs, method="vllm")
  rows = [["", f"s per repeat ({_WORDS.get(len(many_[0].seconds))})", "tok/s (median)"]]
  for part in (many_, vllm):
    rows.append([_many_label(header, part[0].method),
                 ", ".join(f"{t:.1f}" for t in part[0].seconds),
                 f"{M.tokens_per_s(part):.1f}"])
  rows.append(["`generate_many` / vLLM", "",
               f"**{M.tokens_per_s(many_) / M.tokens_per_s(vllm):.2f}x**"])
  return _tight(markdown(rows))


# README's Spec-Bench rows: (method, as README names it, Spec-Bench's own leaderboard for the
# same family: Vicuna-7B on an RTX 3090, speedup / mean accepted tokens, its Leaderboard.md;
# published figures, not records of this repository)
SPEC_BENCH_README = (
    ("ngram", "n-gram lookup", "PLD 1.64x / 1.73"),
    ("suffix", "suffix, with memory", "-"),
    ("lookahead", "lookahead", "Lookahead 1.13x / 1.64"),
    ("recycling", "token recycling (the paper's 81-node tree, verify width 81, matrix carried)",
     "Recycling 1.40x / 2.73"),
    ("datastore", "datastore (SmolLM2's own answers)", "REST 1.28x / 1.63"),
    ("draft", "draft model (shipped)", "SpS 1.79x / 2.28"),
    ("eagle3", "EAGLE-3 head trained on 385k tokens, since replaced (b)", "EAGLE 2.03x / 3.57"),
    ("auto", '`"auto"` over n-gram', "-"),
)
SPEC_BENCH_SHORT = {"mt_bench": "Conversation", "translation": "Translation",
                    "summarization": "Summarization", "qa": "QA", "math_reasoning": "Math",
                    "rag": "RAG"}


def spec_bench_readme(header: dict, recs) -> str:
  """README's Spec-Bench table: per method, tau by category and overall, the speedup
  predicted where a verify costs one step ("(a)" for recycling's 81-token verify, which no
  device here measured at one step), the speedup measured here, and Spec-Bench's own
  leaderboard row for the same family (`SPEC_BENCH_README`)."""
  recs = _greedy(recs)
  cols = _spec_bench_cols(recs)
  costs = header.get("costs", [{}])
  ks = {name: m["k"] for name, m in header.get("methods", {}).items()}
  out = [["method"] + [SPEC_BENCH_SHORT.get(c, c) for c in cols]
         + ["tau", "predicted", "measured here", "Spec-Bench (7B, 3090)"]]
  for method, label, board in SPEC_BENCH_README:
    mine = _in(recs, method=method)
    base = base_of(recs, mine)
    line = [label] + [f"{M.tau(_in(mine, category=c)):.2f}" for c in cols]
    predicted = predicted_accelerator(costs, ks)(mine, base)
    line += [f"{M.tau(mine):.2f}", predicted + (" (a)" if method == "recycling" else ""),
             f"{M.speedup(base, mine):.2f}x", board]
    out.append(line)
  return markdown(out)


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


def lines(groups: dict, path: str, title: str, xlabel: str, ylabel: str,
          log2x: bool = False, unity: bool = True) -> None:
  """Curves against an axis (PNG; needs matplotlib): {group: {curve: (xs, ys)}}, one colour
  per group, its curves solid, dashed, dotted in turn, labelled "group curve"; a curve whose
  xs is None is a horizontal line at its one y (a figure with no x, "auto"'s speedup).
  unity: a grey line at 1 (speedups)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for group, curves in groups.items():
    color = None
    for style, (curve, (xs, ys)) in zip(("o-", "--", ":"), curves.items()):
      label = f"{group} {curve}".strip()
      if xs is None:
        line = ax.axhline(ys, color=color, ls=":", label=label)
      else:
        line, = ax.plot(xs, ys, style, color=color, label=label)
      color = line.get_color()
  if unity:
    ax.axhline(1.0, color="gray", lw=0.8)
  if log2x:
    ax.set_xscale("log", base=2)
  ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
