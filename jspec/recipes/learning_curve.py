"""How a head's held-out tau grows with its training data: a resumable curve over nested
parts of the answer store, and the fit of tau against log tokens.

    python -m jspec.recipes.learning_curve --head eagle3 --answers data/smollm2_answers \\
        --tokens 25000,50000,100000,200000,400000 --out .recipe/curve [--epochs 2] \\
        [-- ARGS FOR THE RECIPE, e.g. --form published --window 384 --heldout 64]

Each point trains the head's recipe (`smollm2_eagle3` for eagle3 / eagle1, `smollm2_dflash`
for dflash, `smollm2_draft` for the distilled draft model) on the first windows of the
store's seeded split (`answer_windows.split`: the parts are nested, the held-out windows the
same for every point) holding at least that many answer tokens in the loss, for `--epochs`
passes over them (steps = epochs x windows / batch, at least `--min-steps`), then reads its
manifest: held-out chat tau at K = 4 per kind (the recipe's measurement) and the held-out
windows' metrics, with the wall and CPU seconds of the point. A point whose manifest exists
is read, not rerun: a curve grows across sessions (`--tokens` with more points, a larger
store). The features are computed once per store (or read from the capture buffer,
`answers generate --features`) and shared by every point.

The fit: tau = a + b log10(tokens) by least squares over the points (b: tau gained per
tenfold data), its R^2, and the tokens at which the line would reach `--goal` (3.0 by
default), reported as an extrapolation, not a measurement. Written to OUT/curve.json and,
with matplotlib, OUT/curve.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np

RECIPES = {"eagle3": "jspec.recipes.smollm2_eagle3", "eagle1": "jspec.recipes.smollm2_eagle3",
           "dflash": "jspec.recipes.smollm2_dflash", "draft": "jspec.recipes.smollm2_draft"}


def windows_for(answers: str, tokens: int, window: int, heldout: int, seed: int = 0) -> tuple[int, int]:
  """(windows, answer tokens in their loss) of the smallest prefix of the store's training
  split whose windows hold at least `tokens` answer tokens in the loss (all of it when the
  store is smaller: then the tokens are fewer than asked)."""
  from jspec.recipes import answer_windows as W

  rows = W.store_rows(answers)
  W.split(len(rows), heldout, None, seed)  # (checks heldout)
  order = np.random.default_rng(seed).permutation(len(rows))[heldout:]  # as `split` takes them
  total = 0
  for n, i in enumerate(order, 1):
    prompt, answer, _ = rows[i]
    P = min(len(prompt), window)
    total += max(0, min(len(prompt) + len(answer), window) - P)  # answer ids in the window
    if total >= tokens:
      return n, total
  return len(order), total


def fit(points: list[dict], goal: float) -> dict | None:
  """Least squares tau = a + b log10(tokens); None with fewer than two distinct sizes."""
  x = np.log10([p["answer_tokens"] for p in points])
  y = np.asarray([p["tau"] for p in points], float)
  if len(set(x.tolist())) < 2:
    return None
  b, a = np.polyfit(x, y, 1)
  pred = a + b * x
  ss = float(np.sum((y - y.mean()) ** 2))
  r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss if ss > 0 else 1.0
  reach = 10 ** ((goal - a) / b) if b > 0 else None
  return {"a": float(a), "b_per_decade": float(b), "r2": r2, "goal": goal,
          "tokens_at_goal_extrapolated": None if reach is None or not math.isfinite(reach)
          else float(reach)}


def acceptance_for(goal: float, k: int = 4) -> float | None:
  """The per-draft acceptance p at which a K = k chain accepts `goal` tokens per call when
  every draft is accepted with p given the ones before (1 + p + ... + p^k = goal); None when
  the goal is out of reach at this k."""
  if not 1.0 <= goal <= k + 1:
    return None
  lo, hi = 0.0, 1.0
  for _ in range(60):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < goal else (lo, mid)
  return (lo + hi) / 2


def fit_first_draft(points: list[dict], goal: float, k: int = 4) -> dict | None:
  """How the head's first-draft agreement with the target on the held-out windows
  (`top1_first`, else `top1`) grows with log10(tokens), and where the line would reach the
  acceptance a goal tau needs (`acceptance_for`): a second reading of the same curve, from
  thousands of window positions rather than a few dozen answers."""
  rows = []
  for p in points:
    held = p.get("heldout_windows") or {}
    value = held.get("top1_first", held.get("top1"))
    if value is not None:
      rows.append((p["answer_tokens"], float(value)))
  if len({t for t, _ in rows}) < 2:
    return None
  x = np.log10([t for t, _ in rows])
  y = np.asarray([v for _, v in rows])
  b, a = np.polyfit(x, y, 1)
  need = acceptance_for(goal, k)
  reach = 10 ** ((need - a) / b) if need is not None and b > 0 else None
  return {"a": float(a), "b_per_decade": float(b), "acceptance_needed": need,
          "tokens_at_acceptance_extrapolated": None if reach is None or not math.isfinite(reach)
          else float(reach)}


def default_questions() -> str | None:
  """Spec-Bench's question file where the store's exclusion finds it (its MT-Bench turns are
  never trained on), else the MT-Bench wheel's."""
  from jspec.recipes import answer_exclusion
  from jspec.bench import questions as suite

  found = [p for p in answer_exclusion.default_exclusion_files() if p.endswith(".jsonl")]
  if found:
    return found[0]
  try:
    return suite.default_questions()
  except (FileNotFoundError, ImportError):
    return None


def conversation_prompts(target, path: str, n: int) -> list[list[int]]:
  """The first turns of the first `n` MT-Bench questions (Spec-Bench's "mt_bench" group) of
  `path`, in the target's chat template."""
  from jspec.bench import questions as suite
  from jspec.bench.workloads import encode, user

  questions = [q for q in suite.read_questions(path) if q.group == "mt_bench"][:n]
  if len(questions) < n:
    raise SystemExit(f"--conversations {n}: {path} holds {len(questions)} MT-Bench questions")
  return [encode(target.tokenizer, user(q.turns[0])) for q in questions]


def batched_acceptance(target, drafter, prompts: list[list[int]], k: int,
                       new_tokens: int, tree=None) -> dict:
  """Greedy K = k chains (or rounds of `tree`, a `jspec.Tree` or `jspec.DynamicTree`; k is
  then its depth) over all `prompts` in one ragged batch, and plain greedy decoding of the
  same batch, through the harness's runner: tau (answer tokens over target calls, summed
  over rows), acceptance per draft position, and whether every answer equals plain greedy's.

  Greedy rows do not interact and a row's calls count only the rounds it was active in, so
  the figures are batch 1's; one batch is what makes a few dozen answers per point
  affordable on a CPU shared with training."""
  from jspec.bench import metrics as M
  from jspec.bench import runner, workloads
  from jspec.bench.methods import Built

  if tree is not None:
    k = tree.max_depth
  spec = runner.Variant("speculative", Built(drafter, k, f"K = {k}", tree=tree), axes={"k": k})
  ran = runner.run(target, [runner.plain(), spec], workloads.from_ids("held-out", prompts),
                   runner.Settings(max_new_tokens=new_tokens, repeats=1, batch=len(prompts),
                                   progress=False), "learning-curve")
  mine = M.select(ran.records, method="speculative")
  return {"k": k, "tau": round(M.tau(mine), 4), "accept_hist": M.accept_hist(mine, k),
          "accept_per_position": [None if a != a else round(a, 4) for a in M.acceptance(mine)],
          "greedy_equal": bool(M.all_equal(mine)), "prompts": len(prompts),
          "new_tokens": new_tokens, "answer_tokens": sum(r.tokens for r in mine),
          "target_calls": sum(r.calls for r in mine)}


def conversation_tau(folder: str, target, prompts: list[list[int]], key: dict,
                     new_tokens: int, k: int = 4) -> dict:
  """Held-out tau of the point's head on `prompts` (`batched_acceptance`: greedy, K = k
  chain, every answer checked against plain greedy), cached in the point's folder under
  `key`."""
  from jspec.bench.methods import from_folder

  path = os.path.join(folder, "conversations.json")
  if os.path.isfile(path):
    with open(path) as f:
      done = json.load(f)
    if done.get("key") == key:
      return done["report"]
  report = batched_acceptance(target, from_folder(folder, target), prompts, k, new_tokens)
  if not report["greedy_equal"]:
    raise SystemExit(f"{folder}: a speculative answer differs from plain greedy decoding")
  with open(path, "w") as f:
    json.dump({"key": key, "report": report}, f, indent=1)
  return report


def _cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


FEATURE_SOURCES = ("--feature-windows", "--features-dir")


def trained_as(folder: str, steps: int, recipe_args: list[str]) -> None:
  """Refuses a point trained with other steps or recipe options than asked (another
  --epochs or --min-steps, another --form...): it would be read as the asked point."""
  path = os.path.join(folder, "curve_point.json")
  if not os.path.isfile(path):
    return  # a point trained outside the curve: nothing recorded to compare
  with open(path) as f:
    record = json.load(f)
  argv = record.get("argv") or []
  trained = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--steps"]
  if trained and int(trained[0]) != steps:
    raise SystemExit(f"{folder} was trained for {trained[0]} steps and this curve asks {steps} "
                     f"(another --epochs or --min-steps): give the curve another --out")
  # The recipe's options follow the curve's own (`run_point`). Where the features come from
  # does not change what a point is: the cache's extent (--feature-windows, set by the
  # curve's largest point) and the capture buffer (--features-dir; captured features equal
  # the prefill's, `answer_features`).
  before = record.get("recipe_args")
  if before is None and "--no-progress" in argv:  # recorded before recipe_args was
    rest = argv[argv.index("--no-progress") + 1:]
    before = rest[2:] if rest[:1] == ["--kind"] else rest
  given, before = _options(recipe_args), _options(before or [])
  if before != given:
    raise SystemExit(f"{folder} was trained with the recipe options {before} and this curve "
                     f"gives {given}: give the curve another --out")


def _options(argv: list[str]) -> list[str]:
  out, skip = [], False
  for a in argv:
    if skip:
      skip = False
    elif a in FEATURE_SOURCES:
      skip = True
    else:
      out.append(a)
  return out


def run_point(head: str, answers: str, out: str, tokens: int, windows: int, steps: int,
              recipe_args: list[str], work: str) -> dict:
  """Trains (unless its manifest exists) and reads one point."""
  import importlib

  folder = os.path.join(out, f"{head}-{tokens}")
  manifest_path = os.path.join(folder, "manifest.json")
  timing_path = os.path.join(folder, "curve_point.json")
  if os.path.isfile(manifest_path):
    trained_as(folder, steps, recipe_args)
  else:
    recipe = importlib.import_module(RECIPES[head])
    # Training state per point and step count (a point resumes only itself, and two curves
    # of other epochs may share one --work); the features shared.
    argv = ["--answers", answers, "--out", folder, "--work",
            os.path.join(work, f"{head}-{tokens}-{steps}steps"),
            "--feature-cache", os.path.join(work, "features"), "--max-windows", str(windows),
            "--steps", str(steps), "--no-progress"]
    if head in ("eagle3", "eagle1"):
      argv += ["--kind", head]
    t0, c0 = time.perf_counter(), _cpu_seconds()
    rc = recipe.main(argv + recipe_args)
    if rc not in (0, None):
      raise SystemExit(f"the {head} recipe failed at {tokens} tokens (exit {rc})")
    with open(timing_path, "w") as f:
      json.dump({"wall_seconds": time.perf_counter() - t0, "cpu_seconds": _cpu_seconds() - c0,
                 "argv": argv + recipe_args, "recipe_args": recipe_args}, f, indent=1)
  with open(manifest_path) as f:
    manifest = json.load(f)
  timing = {}
  if os.path.isfile(timing_path):
    with open(timing_path) as f:
      timing = json.load(f)
  chat = manifest.get("chat_heldout_k4") or {}
  taus = {k: v["tau"] for k, v in chat.items() if isinstance(v, dict) and "tau" in v}
  if not taus:
    raise SystemExit(f"{manifest_path}: no held-out chat tau (run the recipe with its "
                     f"measure stage)")
  return {"tokens_asked": tokens, "windows": windows, "steps": steps,
          "tau_by_kind": taus, "tau": float(np.mean(list(taus.values()))),
          "heldout_windows": manifest.get("heldout_windows")
          or manifest.get("heldout_windows_metrics"),
          "wall_seconds": timing.get("wall_seconds"), "cpu_seconds": timing.get("cpu_seconds"),
          # the recipe's own stages (data, train, measure): what a budget's training rate needs
          "recipe_seconds": manifest.get("wall_seconds"), "folder": folder}


def plot(curve: dict, path: str) -> None:
  """One curve: its mean tau, each kind's, and the fit."""
  plot_curves([curve], path, kinds=True)


def _label(curve: dict) -> str:
  return curve.get("label") or f"{curve['head']}, {curve['epochs']:g} epochs"


def plot_curves(curves: list[dict], path: str, kinds: bool = False) -> None:
  """Several curves (heads, or one head at different epochs) on one log axis, each with its
  fit drawn a decade past its last point."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for n, curve in enumerate(curves):
    color = f"C{n}"
    pts = curve["points"]
    x = [p["answer_tokens"] for p in pts]
    ax.plot(x, [p["tau"] for p in pts], "o-", color=color,
            label=f"{_label(curve)}: mean held-out chat tau")
    measured = [p for p in pts if p.get("conversations")]  # possibly some points only
    if measured:
      ax.plot([p["answer_tokens"] for p in measured],
              [p["conversations"]["tau"] for p in measured], "s:", color=color,
              label=f"{_label(curve)}: MT-Bench tau ({measured[0]['conversations']['n']} "
                    f"first turns)")
    if kinds:
      for j, kind in enumerate(pts[0]["tau_by_kind"]):
        ax.plot(x, [p["tau_by_kind"][kind] for p in pts], ".", color=f"C{j + 1}", alpha=0.5,
                label=kind)
    f = curve.get("fit")
    if f:
      xs = np.logspace(np.log10(min(x)), np.log10(max(x)) + 1, 50)
      ax.plot(xs, f["a"] + f["b_per_decade"] * np.log10(xs), "--", color=color, alpha=0.6,
              label=f"fit: {f['b_per_decade']:+.2f} per tenfold (extrapolated past the data)")
  ax.set_xscale("log")
  ax.set_xlabel("answer tokens in the loss")
  ax.set_ylabel("tau, K = 4")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  recipe_args = []
  if "--" in argv:
    cut = argv.index("--")
    argv, recipe_args = argv[:cut], argv[cut + 1:]
  ap = argparse.ArgumentParser(prog="python -m jspec.recipes.learning_curve",
                               description=__doc__.splitlines()[0])
  ap.add_argument("--plot", nargs="+", metavar="CURVE.json", default=None,
                  help="only draw these curves (curve.json files) together into --png")
  ap.add_argument("--png", default=None, help="the figure --plot writes")
  ap.add_argument("--head", choices=sorted(RECIPES))
  ap.add_argument("--answers", help="the answer store")
  ap.add_argument("--tokens", help="comma-separated answer-token counts")
  ap.add_argument("--out")
  ap.add_argument("--work", default=None, help="the recipes' work folder (default OUT/work)")
  ap.add_argument("--epochs", type=float, default=2.0)
  ap.add_argument("--min-steps", type=int, default=100)
  ap.add_argument("--batch-size", type=int, default=4, help="the recipe's (passed on)")
  ap.add_argument("--window", type=int, default=384, help="the recipe's (passed on)")
  ap.add_argument("--heldout", type=int, default=64, help="the recipe's (passed on)")
  ap.add_argument("--goal", type=float, default=3.0)
  ap.add_argument("--conversations", type=int, default=0, metavar="N",
                  help="also measure each point on the first N MT-Bench first turns (K = 4 "
                       "chain, greedy, as one batch) and fit that tau too")
  ap.add_argument("--questions", default=None,
                  help="Spec-Bench's question.jsonl for --conversations (default: the one the "
                       "store's exclusion reads)")
  ap.add_argument("--eval-tokens", type=int, default=128, help="answer tokens per conversation")
  args = ap.parse_args(argv)
  if args.plot:
    if not args.png:
      ap.error("--plot needs --png OUT.png")
    curves = []
    for name in args.plot:
      try:
        with open(name) as f:
          curves.append(json.load(f))
      except (OSError, ValueError) as e:
        ap.error(f"--plot {name}: {e}")
      if not curves[-1].get("points"):
        ap.error(f"--plot {name}: no points")
    plot_curves(curves, args.png)
    return 0
  missing = [f"--{n}" for n in ("head", "answers", "tokens", "out") if getattr(args, n) is None]
  if missing:
    ap.error(f"a curve needs {', '.join(missing)} (or --plot CURVE.json ... --png OUT)")
  try:
    sizes = sorted({int(float(t)) for t in args.tokens.split(",") if t.strip()})
  except ValueError:
    raise SystemExit(f"--tokens: comma-separated integers, got {args.tokens!r}") from None
  if not sizes or sizes[0] < 1:
    raise SystemExit(f"--tokens: give counts >= 1, got {args.tokens!r}")
  if args.epochs <= 0:
    raise SystemExit(f"--epochs must be > 0, got {args.epochs}")
  recipe_args = recipe_args + ["--batch-size", str(args.batch_size), "--window",
                               str(args.window), "--heldout", str(args.heldout)]
  if args.conversations < 0 or args.eval_tokens < 1:
    raise SystemExit("--conversations must be >= 0 and --eval-tokens >= 1")
  questions = None
  if args.conversations:
    questions = args.questions or default_questions()
    if questions is None or not os.path.isfile(questions):
      raise SystemExit(f"--conversations needs Spec-Bench's question.jsonl: give --questions "
                       f"(not found: {questions})")
  work = args.work or os.path.join(args.out, "work")
  os.makedirs(args.out, exist_ok=True)
  points = []
  parts = [(tokens, *windows_for(args.answers, tokens, args.window, args.heldout))
           for tokens in sizes]
  from jspec.recipes import answer_store

  everything = int(answer_store.read_manifest(args.answers)["totals"]["rows"]) - args.heldout
  if parts[-1][1] < everything:  # the cache holds what the largest point trains on, no more
    recipe_args = recipe_args + ["--feature-windows", str(parts[-1][1])]
  for tokens, windows, held in parts:
    steps = max(args.min_steps, math.ceil(args.epochs * windows / args.batch_size))
    point = run_point(args.head, args.answers, args.out, tokens, windows, steps, recipe_args,
                      work)
    point["answer_tokens"] = held
    points.append(point)
    print(f"{args.head}: {held:,} answer tokens ({windows} windows, {steps} steps): tau "
          f"{point['tau']:.3f} " + " ".join(f"{k} {v:.2f}" for k, v in point["tau_by_kind"].items()),
          flush=True)
  curve = {"head": args.head, "answers": os.path.normpath(args.answers), "epochs": args.epochs,
           "recipe_args": recipe_args, "points": points, "fit": fit(points, args.goal),
           "fit_first_draft": fit_first_draft(points, args.goal)}
  if args.conversations:
    from jspec.bench import targets

    given = [recipe_args[i + 1] for i, a in enumerate(recipe_args[:-1]) if a == "--target"]
    target = targets.load(given[-1] if given else targets.SMOLLM2)
    prompts = conversation_prompts(target, questions, args.conversations)
    key = {"questions": os.path.basename(questions), "n": args.conversations,
           "new_tokens": args.eval_tokens, "k": 4, "batched": True}
    for point in points:
      report = conversation_tau(point["folder"], target, prompts, key, args.eval_tokens)
      point["conversations"] = {**key, "tau": report["tau"],
                                "accept_per_position": report["accept_per_position"],
                                "greedy_equal": report["greedy_equal"]}
      print(f"{args.head}: {point['answer_tokens']:,} answer tokens: MT-Bench tau "
            f"{report['tau']:.3f} ({args.conversations} first turns)", flush=True)
    conv = [dict(p, tau=p["conversations"]["tau"]) for p in points]
    curve["conversations"] = key
    curve["fit_conversations"] = fit(conv, args.goal)
  with open(os.path.join(args.out, "curve.json"), "w") as f:
    json.dump(curve, f, indent=1)
  f = curve["fit"]
  if f:
    reach = f["tokens_at_goal_extrapolated"]
    print(f"fit: tau = {f['a']:.3f} + {f['b_per_decade']:.3f} log10(tokens), R^2 {f['r2']:.2f}; "
          + (f"the line reaches {args.goal} at about {reach:.3g} tokens (extrapolated)"
             if reach else "the line does not rise"))
  f = curve["fit_first_draft"]
  if f:
    reach = f["tokens_at_acceptance_extrapolated"]
    print(f"first-draft agreement on held-out windows: {f['a']:.3f} + {f['b_per_decade']:.3f} "
          f"log10(tokens); tau {args.goal} at K = 4 needs about {f['acceptance_needed']:.2f}"
          + (f", which the line reaches at about {reach:.3g} tokens (extrapolated)" if reach
             else ""))
  f = curve.get("fit_conversations")
  if f:
    print(f"fit on MT-Bench: tau = {f['a']:.3f} + {f['b_per_decade']:.3f} log10(tokens), R^2 "
          f"{f['r2']:.2f}")
  try:
    plot(curve, os.path.join(args.out, "curve.png"))
  except ImportError:
    pass
  return 0


if __name__ == "__main__":
  sys.exit(main())
