"""`jspec bench --suite spec-bench`: from the command's arguments to the printed tables and files.

Bad input is refused before the model loads where it can be (the suite name, the question
file row by row, the method names, --per-category, the corpus file, matplotlib for --plot,
folders given for drafters) and before anything compiles otherwise (a target without a
chat template, a prompt longer than the target's context). The run itself is
`jspec.tools.spec_bench`, the figures `jspec.tools.spec_bench_report`. The exit code is 1
when any greedy answer differed from plain greedy decoding.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
import time
from typing import Any

from jspec.bench import methods as registry
from jspec.bench import questions as suite

DEFAULT_PER_CATEGORY = 3


def _fail(message: str):
  raise SystemExit(f"jspec bench --suite: {message}")


def check(args) -> dict:
  """Everything that can be checked without the model; the settings it implies."""
  if args.suite != suite.SPEC_BENCH:
    _fail(f"unknown suite {args.suite!r}; known: {suite.SPEC_BENCH}")
  for flag, value in (("--prompts", args.prompts), ("--chat", args.chat),
                      ("--sections", args.sections), ("--batches", args.batches),
                      ("--device gpu", args.device == "gpu")):
    if value:
      _fail(f"{flag} does not apply: the suite runs its own questions at batch 1")
  if args.all and args.per_category is not None:
    _fail("give --per-category N or --all, not both")
  per_category = None if args.all else (DEFAULT_PER_CATEGORY if args.per_category is None
                                        else args.per_category)
  if per_category is not None and per_category < 1:
    _fail(f"--per-category must be >= 1, got {per_category} (--all runs every question)")
  for flag, value in (("--max-new-tokens", args.max_new_tokens), ("--repeats", args.repeats),
                      ("--fixed-k", args.fixed_k)):
    if value is not None and value < 1:
      _fail(f"{flag} must be >= 1, got {value}")
  try:
    names = registry.parse(args.methods)
  except ValueError as e:
    _fail(f"--methods: {e}")
  try:
    registry.parse_spec(f"{args.auto_over}@k=auto")
  except ValueError as e:
    _fail(f"--auto-over {args.auto_over!r}: give a method \"auto\" can set K for ({e})")
  try:
    path = args.questions or suite.default_questions()
    questions = suite.read_questions(path)
  except (FileNotFoundError, ValueError) as e:
    _fail(f"--questions: {e}")
  corpus = None
  if args.corpus:
    from jspec.tools import measure
    try:
      corpus = measure.read_prompts(args.corpus)
    except (OSError, ValueError) as e:
      _fail(f"--corpus: {e}")
  folders = {}
  for method, flag, value in (("draft", "--draft", args.draft), ("eagle3", "--eagle", args.eagle),
                              ("medusa", "--medusa", args.medusa),
                              ("dflash", "--dflash", args.dflash)):
    if value is not None:
      if not os.path.isdir(value):
        _fail(f"{flag} {value}: no such folder")
      folders[method] = value
  specs = {n: n for n in names}  # the spec each name runs: the suite's flags set two
  if "auto" in specs:
    specs["auto"] = f"{args.auto_over}@k=auto"
  if args.eagle_tree is not None:
    try:
      registry.parse_spec(f"eagle3@tree={args.eagle_tree}")
    except ValueError as e:
      _fail(f"--eagle-tree {args.eagle_tree!r}: give NODES,DEPTH,TOP_K of a dynamic tree ({e})")
    if "eagle3-tree" in specs:
      specs["eagle3-tree"] = f"eagle3@tree={args.eagle_tree}"
  if args.plot:
    if importlib.util.find_spec("matplotlib") is None:
      _fail("--plot needs matplotlib: pip install 'jspec[plot]'")
  drawn = suite.sample(questions, per_category, args.seed)
  if args.categories:
    present = suite.columns(q.group for q in questions)
    wanted = [c.strip() for c in args.categories.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in present]
    if unknown or not wanted:
      _fail(f"--categories: {', '.join(map(repr, unknown)) or repr(args.categories)} not in "
            f"{path} (its categories: {', '.join(present)})")
    drawn = [q for q in drawn if q.group in wanted]  # the same draw, fewer columns
  return {"questions_file": path, "questions": drawn,
          "per_category": per_category, "methods": names, "specs": specs, "corpus": corpus,
          "folders": folders}


def _load_target(name: str):
  from jspec.bench import targets

  try:
    target = targets.load(name)
  except (FileNotFoundError, NotADirectoryError) as e:
    _fail(f"--target: {e}")
  tok = target.tokenizer
  if tok is None or tok.chat_template is None:
    _fail(f"--target {name}: no chat template; the suite's questions are chat turns")
  return target


def _tables(results: dict, sampled: bool) -> dict:
  from jspec.tools import spec_bench_report as R

  tables = {"speedup": R.format_table(
      results["greedy"], "speedup over jspec's plain greedy decoding here (tau), batch 1, "
      "greedy:"),
      "predicted_accelerator": R.format_table(
          results["greedy"], "predicted speedup where a verify costs one step (tau / (1 + "
          "draft round / step), both costs measured here):", key="predicted_accelerator",
          with_tau=False)}
  if sampled:
    tables["sampled"] = R.format_table(results["sampled"], "at T = 1: tokens/s over plain "
                                       "sampling here (tau):")
  return tables


def _print_report(results: dict, tables: dict, costs: dict) -> None:
  from jspec.tools import spec_bench_report as R

  plain = results["greedy"]["plain"]["overall"]
  print(f"\nplain greedy decoding: {plain['tokens']} tokens, {plain['tokens_per_s']:.1f} tok/s "
        f"over all prompts\n")
  for text in tables.values():
    print(text + "\n")
  print(R.format_acceptance(results["greedy"]))
  print(f"step {costs['t_step_ms']:.2f} ms at cache {costs['cache_length']}; " + "; ".join(
      f"{n}: " + ", ".join(f"K={k} verify {c['verify_over_step_here']:.2f} steps, draft round "
                           + ("-" if c["draft_round_over_step"] is None
                              else f"{c['draft_round_over_step']:.3f}") + " steps"
                           for k, c in per.items())
      for n, per in costs["methods"].items() if per))


def _write(report: dict, args) -> None:
  from jspec.tools import spec_bench_report as R

  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)
    print(f"wrote {args.json}")
  if args.plot:
    R.plot(report, args.plot)
    print(f"wrote {args.plot}")


@dataclasses.dataclass(frozen=True)
class _Ran:
  """What `spec_bench_report.aggregate` reads of a method that ran in another process."""

  k: Any


MERGED_SETTINGS = ("max_new_tokens", "repeats", "k", "sampled", "batch", "seed")


def merge(paths: list[str]) -> dict:
  """One report from the reports of runs over different questions (`--categories`): items,
  questions and mismatches joined, figures recomputed from the items; each category's
  predictions use the costs its own run measured (at its prompts' lengths), "overall"
  combines them (tokens over summed predicted time); "costs" is the first report's, every
  run's are under "merged_costs". Refuses reports of another target, settings or method
  set, or sharing a question."""
  from jspec.tools import spec_bench_report as R

  reports = []
  for path in paths:
    try:
      with open(path, encoding="utf-8") as f:
        reports.append(json.load(f))
    except (OSError, ValueError) as e:
      _fail(f"--merge {path}: not a readable report ({e})")
    if "items" not in reports[-1] or "settings" not in reports[-1]:
      _fail(f"--merge {path}: not a `jspec bench --suite` report (no items or settings)")
  first = reports[0]
  seen = {}
  for path, r in zip(paths, reports):
    for key in ("suite", "target"):
      if r.get(key) != first.get(key):
        _fail(f"--merge: {path} has {key} {r.get(key)!r}, {paths[0]} {first.get(key)!r}")
    for key in MERGED_SETTINGS:
      if r["settings"].get(key) != first["settings"].get(key):
        _fail(f"--merge: {path} ran with {key} = {r['settings'].get(key)!r}, {paths[0]} with "
              f"{first['settings'].get(key)!r}")
    if {n: m["k"] for n, m in r["methods"].items()} != {n: m["k"] for n, m in
                                                        first["methods"].items()}:
      _fail(f"--merge: {path} ran methods {sorted(r['methods'])}, {paths[0]} "
            f"{sorted(first['methods'])} (with the same K each)")
    for qid in r["question_ids"]:
      if qid in seen:
        _fail(f"--merge: question {qid!r} is in both {seen[qid]} and {path}")
      seen[qid] = path
  items = [it for r in reports for it in r["items"]]
  methods = {n: _Ran(m["k"]) for n, m in first["methods"].items()}
  sampled = bool(first["settings"]["sampled"])
  costs = first["costs"]
  results = R.aggregate(items, methods, sampled, costs)
  # Each category's predictions with the costs its own run measured (at its own prompts'
  # lengths); "overall" combines them: its tokens over the summed predicted times.
  parts = [R.aggregate(r["items"], methods, sampled, r["costs"]) for r in reports]
  for mode, table in results.items():
    for name, row in table.items():
      for part in parts:
        for g, cell in part[mode][name].items():
          if g != "overall":
            row[g] = cell
      for key in ("predicted_accelerator", "ideal_here"):
        cells = [p[mode][name]["overall"] for p in parts]
        if all(c.get(key) for c in cells):
          row["overall"][key] = (sum(c["tokens"] for c in cells)
                                 / sum(c["tokens"] / c[key] for c in cells))
  counts = {}
  for r in reports:
    for g, n in r["prompts_by_category"].items():
      counts[g] = counts.get(g, 0) + n
  report = dict(first)
  report.update({
      "questions_file": [r["questions_file"] for r in reports],
      "question_ids": [q for r in reports for q in r["question_ids"]],
      "prompts_by_category": {g: counts[g] for g in suite.columns(counts)},
      "unavailable": {k: v for r in reports for k, v in r["unavailable"].items()},
      "merged_from": [{"categories": list(r["prompts_by_category"]), "wall_s": r["wall_s"]}
                      for r in reports],
      "merged_costs": [r["costs"] for r in reports],
      "results": results, "tables": _tables(results, sampled),
      "mismatches": [m for r in reports for m in r["mismatches"]], "items": items,
      "wall_s": sum(r["wall_s"] for r in reports)})
  return report


def merge_main(args) -> int:
  """`--merge`: join reports (`merge`), print and write the result."""
  if not args.json and not args.plot:
    _fail("--merge writes its result: give --json FILE and/or --plot FILE")
  if args.plot and importlib.util.find_spec("matplotlib") is None:
    _fail("--plot needs matplotlib: pip install 'jspec[plot]'")
  report = merge(args.merge)
  print(f"merged {len(args.merge)} reports: " + ", ".join(
      f"{suite.heading(g)} {n}" for g, n in report["prompts_by_category"].items()) + " prompts")
  _print_report(report["results"], report["tables"], report["costs"])
  _write(report, args)
  if report["mismatches"]:
    print(f"ERROR: {len(report['mismatches'])} greedy answer(s) differ from plain greedy "
          f"decoding (under \"mismatches\")", file=sys.stderr)
    return 1
  return 0


def main(args) -> int:
  """The command (module docstring)."""
  if args.merge:
    return merge_main(args)
  import jax

  from jspec.planner import cache_folder
  from jspec.tools import spec_bench, spec_bench_report as R

  start = time.perf_counter()
  opts = check(args)
  s = spec_bench.Settings(max_new_tokens=args.max_new_tokens or 128, repeats=args.repeats or 1,
                          sampled=args.sampled, seed=args.seed, progress=not args.no_progress)
  target_name = args.target or "smollm2"
  target = _load_target(target_name)
  corpus = None
  if opts["corpus"]:
    corpus = tuple(target.tokenizer.encode(t, add_special_tokens=False)[0]
                   for t in opts["corpus"])
  questions = opts["questions"]
  try:
    spec_bench.check_lengths(target, questions, s.max_new_tokens)
  except ValueError as e:
    _fail(str(e))
  methods, skipped = {}, {}
  for name in opts["methods"]:
    try:
      built = registry.build(opts["specs"][name], target, k=args.fixed_k, corpus=corpus,
                             folders=opts["folders"], checkpoints=args.checkpoints)
    except registry.Unavailable as e:
      skipped[name] = str(e)
      continue
    if built.drafter is None:
      skipped[name] = "plain decoding is the suite's baseline: every method runs beside it"
    else:
      methods[name] = built
  counts = {g: sum(q.group == g for q in questions)
            for g in suite.columns(q.group for q in questions)}
  print(f"jspec bench --suite {args.suite} on {jax.devices()[0].platform}: {target_name} "
        f"({target.num_params():,} params); {len(questions)} questions from "
        f"{opts['questions_file']} ("
        + ", ".join(f"{suite.heading(g)} {n}" for g, n in counts.items())
        + f"); batch 1, greedy{' and T = 1' if s.sampled else ''}, up to {s.max_new_tokens} "
        f"new tokens, {s.repeats} timed run(s) per prompt", flush=True)
  for name, built in methods.items():
    print(f"  {name:<10} {built.description}")
  for name, why in skipped.items():
    print(f"  {name:<10} unavailable: {why}")
  if not methods:
    _fail("no method can run: " + "; ".join(f"{n}: {w}" for n, w in skipped.items()))
  cache = cache_folder.enable_compilation_cache(args.cache_dir)
  print(f"  compiled programs are cached in {cache}", flush=True)
  ran = spec_bench.run(target, questions, methods, s)
  print("timing a step, each method's verify and draft round, for the predictions ...",
        flush=True)
  costs = R.measure_costs(target, methods, ran["items"])
  results = R.aggregate(ran["items"], methods, s.sampled, costs)
  tables = _tables(results, s.sampled)
  _print_report(results, tables, costs)
  wall = time.perf_counter() - start
  report = {"suite": args.suite, "questions_file": opts["questions_file"], "target": target_name,
            "target_params": target.num_params(), "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()],
            "settings": {"per_category": opts["per_category"], "seed": args.seed,
                         "max_new_tokens": s.max_new_tokens, "repeats": s.repeats,
                         "k": args.fixed_k, "sampled": s.sampled, "batch": 1,
                         "categories": args.categories},
            "question_ids": [q.question_id for q in questions], "prompts_by_category": counts,
            "methods": {n: {"family": b.family, "description": b.description, "k": b.k}
                        for n, b in methods.items()},
            "unavailable": skipped, "costs": costs, "results": results, "tables": tables,
            "mismatches": ran["mismatches"], "items": ran["items"], "wall_s": wall}
  _write(report, args)
  if ran["mismatches"]:
    print(f"ERROR: {len(ran['mismatches'])} greedy answer(s) differ from plain greedy decoding "
          f"(listed above and under \"mismatches\")", file=sys.stderr)
    return 1
  print(f"every greedy answer equals plain greedy decoding; {wall:.0f} s in all")
  return 0
