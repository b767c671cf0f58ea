"""`jspec bench --suite spec-bench`: from the command's arguments to the printed tables and files.

Bad input is refused before the model loads where it can be (the suite name, the question
file row by row, the method names, --per-category, the corpus file, matplotlib for --plot,
folders given for drafters) and before anything compiles otherwise (a target without a
chat template, a prompt longer than the target's context). The study itself is
`jspec.bench.spec_bench` over the harness's runner; `--json` writes its records (JSON lines
under a header, `jspec.bench.records`), which `--merge` joins. The exit code is 1 when any
greedy answer differed from plain greedy decoding.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

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


def _print_report(head: dict, recs) -> None:
  from jspec.bench import spec_bench as study

  print("\n" + study.summary_line(recs) + "\n")
  for title, table in study.tables(head, recs).items():
    print(f"{title}:\n{table}\n")
  print(study.acceptance_lines(recs))
  print(study.costs_line(head))


def _write(head: dict, recs, args) -> None:
  from jspec.bench import records, spec_bench as study

  if args.json:
    records.write(args.json, head, recs)
    print(f"wrote {args.json} ({len(recs)} records)")
  if args.plot:
    study.plot(head, recs, args.plot)
    print(f"wrote {args.plot}")


def merge_main(args) -> int:
  """`--merge`: join runs' records (`jspec.bench.spec_bench.merge`), print and write them."""
  from jspec.bench import records, spec_bench as study

  if not args.json and not args.plot:
    _fail("--merge writes its result: give --json FILE and/or --plot FILE")
  if args.plot and importlib.util.find_spec("matplotlib") is None:
    _fail("--plot needs matplotlib: pip install 'jspec[plot]'")
  files = []
  for path in args.merge:
    try:
      files.append(records.read(path))
    except (OSError, ValueError) as e:
      _fail(f"--merge {path}: not a readable record file ({e})")
  try:
    head, recs = study.merge(files, list(args.merge))
  except ValueError as e:
    _fail(f"--merge: {e}")
  counts = {}
  for r in recs:
    if r.method == "plain":
      counts[r.axes["category"]] = counts.get(r.axes["category"], 0) + 1
  print(f"merged {len(args.merge)} runs: " + ", ".join(
      f"{suite.heading(g)} {counts[g]}" for g in suite.columns(counts)) + " prompts")
  _print_report(head, recs)
  _write(head, recs, args)
  if head["mismatches"]:
    print(f"ERROR: {len(head['mismatches'])} greedy answer(s) differ from plain greedy "
          f"decoding (under \"mismatches\" in the header)", file=sys.stderr)
    return 1
  return 0


def main(args) -> int:
  """The command (module docstring)."""
  if args.merge:
    return merge_main(args)
  import jax

  from jspec.bench import runner, spec_bench as study
  from jspec.planner import cache_folder

  start = time.perf_counter()
  opts = check(args)
  s = runner.Settings(max_new_tokens=args.max_new_tokens or 128, repeats=args.repeats or 1,
                      seed=args.seed, progress=not args.no_progress)
  target_name = args.target or "smollm2"
  target = _load_target(target_name)
  corpus = None
  if opts["corpus"]:
    corpus = tuple(target.tokenizer.encode(t, add_special_tokens=False)[0]
                   for t in opts["corpus"])
  questions = opts["questions"]
  try:
    study.check_lengths(target, questions, s.max_new_tokens)
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
        + f"); batch 1, greedy{' and T = 1' if args.sampled else ''}, up to {s.max_new_tokens} "
        f"new tokens, {s.repeats} timed run(s) per prompt", flush=True)
  for name, built in methods.items():
    print(f"  {name:<10} {built.description}")
  for name, why in skipped.items():
    print(f"  {name:<10} unavailable: {why}")
  if not methods:
    _fail("no method can run: " + "; ".join(f"{n}: {w}" for n, w in skipped.items()))
  cache = cache_folder.enable_compilation_cache(args.cache_dir)
  print(f"  compiled programs are cached in {cache}", flush=True)
  ran = runner.run(target, study.variants(methods, args.sampled), study.workload(questions), s,
                   study.STUDY)
  print("timing a step, each method's verify and draft round, for the predictions ...",
        flush=True)
  costs = study.method_costs(target, methods, ran.records, s.max_new_tokens)
  wall = time.perf_counter() - start
  head = study.header({"per_category": opts["per_category"], "seed": args.seed,
                       "max_new_tokens": s.max_new_tokens, "repeats": s.repeats,
                       "k": args.fixed_k, "sampled": args.sampled, "batch": 1,
                       "categories": args.categories},
                      methods, costs, questions, suite=args.suite,
                      questions_file=opts["questions_file"], target=target_name,
                      target_params=target.num_params(), unavailable=skipped,
                      mismatches=ran.mismatches, wall_s=wall)
  _print_report(head, ran.records)
  _write(head, ran.records, args)
  if ran.mismatches:
    print(f"ERROR: {len(ran.mismatches)} greedy answer(s) differ from plain greedy decoding "
          f"(listed above and under \"mismatches\" in the header)", file=sys.stderr)
    return 1
  print(f"every greedy answer equals plain greedy decoding; {wall:.0f} s in all")
  return 0
