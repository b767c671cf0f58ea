"""The Spec-Bench study (`jspec bench --suite spec-bench`): every method beside plain decoding
on Spec-Bench's questions, batch 1, by category.

A declaration over the harness: the questions are a workload (`jspec.bench.questions`; a
two-turn MT-Bench question is a conversation, its second turn answered after plain
greedy's first answer), the methods come from the registry (`jspec.bench.methods`), the
runner times them (`jspec.bench.runner`: interleaved, the order alternating, greedy
answers compared with plain decoding's, suffix memory and Token Recycling's matrix carried
from question to question), and every figure is a function of the records
(`jspec.bench.metrics`, `jspec.bench.report`):

  tau           tokens emitted / target calls (Spec-Bench's "#Mean Accepted Tokens");
  acceptance    by draft position i: of the rounds that judged draft i, the fraction that
                accepted it;
  speedup       tokens/s over plain decoding's, the median over repeats of ratios of times
                taken in the same repeat (Spec-Bench averages per-question tokens/s
                instead; with equal answers the two differ only in how questions weigh);
  predicted     tau over the rounds' cost in steps where a verify costs one step (an
                accelerator's regime, `jspec.planner.cost_model`) and the drafter's round
                costs what it was measured to cost here (`method_costs`); for "auto", each
                K's rounds at that K's cost.

The records are written with a header holding the costs each process measured (`costs`,
one entry per process, a record's own in its axis `part`), so runs over different
categories in different processes join (`merge`) with each category priced by its own.
"""

from __future__ import annotations

import dataclasses

from jspec.bench import metrics as M
from jspec.bench import questions as Q
from jspec.bench import records as R
from jspec.bench import report, runner
from jspec.bench.workloads import Prompt, Workload, encode, user

STUDY = "spec-bench"


def workload(questions) -> Workload:
  """Spec-Bench's questions as a workload: ids as given, each turn after the first answered
  in the conversation of the ones before."""
  return Workload(STUDY, tuple(Prompt(str(q.question_id), q.category, user(q.turns[0]),
                                      tuple(q.turns[1:])) for q in questions))


def check_lengths(target, questions, max_new_tokens: int) -> None:
  """Every first turn fits the target's context with its answer (before anything compiles)."""
  limit = target.max_length
  if limit is None:
    return
  for q in questions:
    n = len(encode(target.tokenizer, user(q.turns[0])))
    if n + max_new_tokens > limit:
      raise ValueError(f"question {q.question_id!r}: its prompt ({n} tokens) + "
                       f"--max-new-tokens {max_new_tokens} exceeds the target's context "
                       f"({limit} tokens)")


def variants(methods: dict, sampled: bool) -> list[runner.Variant]:
  """Plain decoding and every method, greedy; with `sampled` the same again at T = 1."""
  out = [runner.plain()] + [runner.Variant(n, b, 0.0, {"k": b.k}) for n, b in methods.items()]
  if sampled:
    out += [runner.plain(1.0)] + [runner.Variant(f"{n}@T1", b, 1.0, {"k": b.k})
                                  for n, b in methods.items()]
  return out


def method_costs(target, methods: dict, recs, max_new_tokens: int, repeats: int = 10) -> dict:
  """T_step, and per method and K its verify and draft-round costs, at batch 1, at the
  median prompt's cache length and prefix (costs move little with either):
  {"t_step_ms", "cache_length", "prefix", "methods": {name: {K: {...}}}}."""
  from jspec.bench.costs import call_time, round_time, verify_width
  from jspec.core.drafter import BranchDrafter
  from jspec.drafters.suffix import SuffixMemory

  lengths = sorted(r.axes["prompt_tokens"] for r in recs if r.method == runner.PLAIN)
  prefix = lengths[len(lengths) // 2]
  _, S = runner.shapes(prefix, max_new_tokens)
  t_step = call_time(target, 1, 1, S, repeats=repeats, prefix=prefix)
  verify = {1: t_step}
  out = {"t_step_ms": t_step * 1e3, "cache_length": S, "prefix": prefix, "methods": {}}
  for name, built in methods.items():
    drafter = built.drafter
    if built.with_memory:
      drafter = dataclasses.replace(drafter, memory=SuffixMemory.empty(runner.MEMORY_SLOTS))
    ks = ([k for k, n in M.rounds_by_k(M.select(recs, method=name)).items() if k > 0 and n]
          if built.k == "auto" else [built.k])
    per_k = {}
    for k in ks:
      width = verify_width(drafter, k) if built.tree is None else built.tree.num_nodes
      if width not in verify:
        verify[width] = call_time(target, 1, width, S, repeats=repeats, prefix=prefix)
      note = None
      if isinstance(drafter, BranchDrafter):  # lookahead: its guesses ride in the verify
        t_round = 0.0
      else:
        try:
          t_round = round_time(drafter, 1, k, S, prefix=prefix, repeats=repeats, target=target,
                               tree=built.tree)
        except Exception as e:  # a drafter the timing probe does not know how to drive
          t_round, note = None, f"draft round not timed: {type(e).__name__}: {e}"
      per_k[str(k)] = {"verify_tokens": width, "t_verify_here_ms": verify[width] * 1e3,
                       "verify_over_step_here": verify[width] / t_step,
                       "t_draft_round_ms": None if t_round is None else t_round * 1e3,
                       "draft_round_over_step": None if t_round is None else t_round / t_step,
                       **({"note": note} if note else {})}
    out["methods"][name] = per_k
  return out


def header(settings: dict, methods: dict, costs: dict, questions, **extra) -> dict:
  """The records' header: settings, methods (family, description, K), the measured costs."""
  return R.header(STUDY, settings,
                  methods={n: {"family": b.family, "description": b.description, "k": b.k}
                           for n, b in methods.items()},
                  costs=[costs["methods"]], step_ms=[costs["t_step_ms"]],
                  cost_shapes=[{"cache_length": costs["cache_length"],
                                "prefix": costs["prefix"]}],
                  question_ids=[q.question_id for q in questions],
                  columns=Q.columns(q.group for q in questions), **extra)


def tables(head: dict, recs) -> dict[str, str]:
  """The printed report: measured speedup (tau) and the prediction per category, greedy;
  tokens/s over plain sampling at T = 1 where sampled."""
  out = {"speedup over jspec's plain greedy decoding here (tau), batch 1, greedy":
         report.spec_bench_speedup(head, recs),
         "predicted speedup where a verify costs one step (tau / (1 + draft round / step), "
         "both costs measured here)": report.spec_bench_predicted(head, recs)}
  hot = [r for r in recs if r.axes.get("temperature", 0.0) > 0]
  if hot:
    out["at T = 1: tokens/s over plain sampling here (tau)"] = report.pivot(
        hot, "method", "category", report.speedup_tau, col_order=Q.columns(
            r.axes["category"] for r in hot), heading=Q.heading, corner="jspec method",
        skip_rows=(runner.plain(1.0).name,))
  return out


def acceptance_lines(recs) -> str:
  """Acceptance by draft position over all prompts, one line per method (greedy)."""
  lines = ["acceptance by draft position, all prompts (judged rounds in brackets):"]
  greedy = [r for r in recs if r.axes.get("temperature", 0.0) == 0]
  for name, mine in M.group(greedy, "method").items():
    if name == runner.PLAIN:
      continue
    judged = [sum(r.judged[i] for r in mine if i < len(r.judged))
              for i in range(max(len(r.judged) for r in mine))]
    pos = " ".join("-" if a != a else f"{a:.2f}[{j}]"
                   for a, j in zip(M.acceptance(mine), judged))
    lines.append(f"  {name:<10} {pos}")
  return "\n".join(lines)


def plot(head: dict, recs, path: str) -> None:
  """tau, measured and predicted speedup per category and method, as grouped bars (PNG)."""
  greedy = [r for r in recs if r.axes.get("temperature", 0.0) == 0]
  costs, ks = head.get("costs", [{}]), {n: m["k"] for n, m in head.get("methods", {}).items()}
  predict = report.predicted_accelerator(costs, ks)

  def predicted(part, base):
    text = predict(part, base)
    return None if text == "-" else float(text.rstrip("x"))

  report.bars(greedy, "category", {
      "tau (tokens per target call)": lambda part, base: M.tau(part),
      "measured speedup here": lambda part, base: M.speedup(base, part),
      "predicted, verify = 1 step": predicted}, path,
      f"Spec-Bench questions, batch 1, greedy, {head.get('target', '')}",
      col_order=Q.columns(r.axes["category"] for r in greedy), heading=Q.heading)


MERGED_SETTINGS = ("max_new_tokens", "repeats", "k", "sampled", "batch", "seed")


def merge(files: list[tuple[dict, list]], names: list[str]) -> tuple[dict, list]:
  """One header and record list from runs over different questions (`--categories`):
  records joined, each keeping the costs its own run measured (its axis `part`); refuses
  runs of another study, target, settings or method set, or sharing a question."""
  first = files[0][0]
  seen, recs, parts = {}, [], []
  costs, steps, shapes = [], [], []
  for name, (head, mine) in zip(names, files):
    if head.get("study") != STUDY:
      raise ValueError(f"{name}: a {head.get('study')!r} study, not {STUDY!r}")
    for key in ("target",):
      if head.get(key) != first.get(key):
        raise ValueError(f"{name} has {key} {head.get(key)!r}, {names[0]} {first.get(key)!r}")
    for key in MERGED_SETTINGS:
      if head["settings"].get(key) != first["settings"].get(key):
        raise ValueError(f"{name} ran with {key} = {head['settings'].get(key)!r}, {names[0]} "
                         f"with {first['settings'].get(key)!r}")
    if ({n: m["k"] for n, m in head["methods"].items()}
        != {n: m["k"] for n, m in first["methods"].items()}):
      raise ValueError(f"{name} ran methods {sorted(head['methods'])}, {names[0]} "
                       f"{sorted(first['methods'])} (with the same K each)")
    for qid in head["question_ids"]:
      if qid in seen:
        raise ValueError(f"question {qid!r} is in both {seen[qid]} and {name}")
      seen[qid] = name
    offset = len(costs)
    costs += head["costs"]
    steps += head["step_ms"]
    shapes += head.get("cost_shapes", [None] * len(head["costs"]))
    parts += head.get("parts") or [{"categories": head["columns"],
                                    "wall_s": head.get("wall_s")}]
    recs += [dataclasses.replace(r, axes={**r.axes, "part": r.axes.get("part", 0) + offset})
             for r in mine]
  merged = dict(first)
  merged.update(costs=costs, step_ms=steps, cost_shapes=shapes, parts=parts,
                question_ids=list(seen), merged_from=list(names),
                columns=Q.columns(r.axes["category"] for r in recs),
                unavailable={k: v for h, _ in files for k, v in h.get("unavailable", {}).items()},
                mismatches=[m for h, _ in files for m in h.get("mismatches", [])],
                wall_s=sum(h.get("wall_s") or 0 for h, _ in files))
  return merged, recs


def summary_line(recs) -> str:
  """Plain greedy decoding's tokens and tokens/s over all prompts."""
  plain = M.select(recs, method=runner.PLAIN)
  return (f"plain greedy decoding: {sum(r.tokens for r in plain)} tokens, "
          f"{M.tokens_per_s(plain):.1f} tok/s over all prompts")


def costs_line(head: dict) -> str:
  """The measured step, verify and draft-round costs, one process after another."""
  out = []
  for ms, shape, per in zip(head["step_ms"], head.get("cost_shapes", []), head["costs"]):
    where = f" at cache {shape['cache_length']}" if shape else ""
    out.append(f"step {ms:.2f} ms{where}; " + "; ".join(
        f"{n}: " + ", ".join(
            f"K={k} verify {c['verify_over_step_here']:.2f} steps, draft round "
            + ("-" if c["draft_round_over_step"] is None
               else f"{c['draft_round_over_step']:.3f}") + " steps" for k, c in by_k.items())
        for n, by_k in per.items() if by_k))
  return "\n".join(out)

