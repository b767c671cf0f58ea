"""Records of jspec's earlier benchmark modules, read into this schema (`jspec.bench.records`).

The measurements stay what they were; only their shape changes, so a documented figure
can be rendered from the same numbers by `jspec.bench.report` and checked against the page.
The header says where the records came from and what the old file did not record (the
versions: None).

    python -m jspec.bench.legacy spec-bench OLD.json NEW.jsonl
    python -m jspec.bench.legacy serve OLD.json NEW.jsonl      # a `jspec bench serve` run
    python -m jspec.bench.legacy KIND OLD.json NEW.jsonl --source "OLD.json@COMMIT"

KIND is one of `CONVERTERS`: spec-bench, serve, real-ngram (`jspec bench --target ...
--sections ngram`), heads-real (`python -m jspec.tools.bench_heads_real`), assisted
(`python -m jspec.tools.bench_assisted`), eagle-trees (benchmarks/eagle_trees_smollm2.py),
capacity and many (benchmarks/continuous_batching.py), capture-cost
(benchmarks/capture_cost.py). Each recomputes from its records the figures the old file
stored and refuses the file (a ValueError naming the figure) where one differs.

Where an old report kept only a set's sums (a kind of chat prompts, a run over many
prompts), a record is that cell, not one prompt: its `extra["prompts"]` says how many
prompts it sums, and its header says what its seconds are.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re

from jspec.bench import records as R
from jspec.bench import questions


def _same(old, new, rel: float = 1e-9, abs_: float = 0.0) -> bool:
  """Whether a figure recomputed from records equals the old file's (floats within rel;
  abs_ for figures the old file rounded)."""
  nan = lambda x: isinstance(x, float) and x != x
  if (old is None and nan(new)) or (new is None and nan(old)):  # NaN written as null
    return True
  if old is None or new is None or isinstance(old, (bool, str)) or isinstance(new, (bool, str)):
    return old == new
  if isinstance(old, (list, tuple)) or isinstance(new, (list, tuple)):
    return (isinstance(old, (list, tuple)) and isinstance(new, (list, tuple))
            and len(old) == len(new) and all(_same(a, b, rel, abs_) for a, b in zip(old, new)))
  if isinstance(old, dict) or isinstance(new, dict):
    return (isinstance(old, dict) and isinstance(new, dict)
            and {str(k) for k in old} == {str(k) for k in new}
            and all(_same(old[k], {str(j): v for j, v in new.items()}[str(k)], rel, abs_)
                    for k in old))
  if old != old and new != new:  # NaN both
    return True
  return math.isclose(old, new, rel_tol=rel, abs_tol=abs_)


def _check(source: str, where: str, key: str, old, new, **tol) -> None:
  """Refuse the conversion where a figure recomputed from the records differs."""
  if not _same(old, new, **tol):
    raise ValueError(f"{source}: {where}: {key} is {old} in the file, {new} from its records")


def _calls(source: str, where: str, tokens: int, tau: float) -> int:
  """Target calls from a stored tau (tokens / calls): refused unless a whole number."""
  if not tau:
    raise ValueError(f"{source}: {where}: tau {tau} gives no number of calls")
  calls = tokens / tau
  if abs(calls - round(calls)) > 1e-6 * max(calls, 1):
    raise ValueError(f"{source}: {where}: tau {tau} of {tokens} tokens is no whole number "
                     f"of target calls ({calls})")
  return int(round(calls))


def _pos(hist) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(judged, accepted) by draft position from a histogram of drafts accepted a round
  (hist[n]: rounds that accepted n): position i is judged in the rounds that accepted at
  least i drafts and accepted in those that accepted more than i."""
  k = len(hist) - 1
  return (tuple(sum(hist[i:]) for i in range(k)), tuple(sum(hist[i + 1:]) for i in range(k)))


def spec_bench(report: dict, source: str, study: str = "spec-bench") -> tuple[dict, list]:
  """A `jspec bench --suite spec-bench` report (joined with `--merge` or not): one record
  per prompt (a question's turn) and variant, the process that ran it in the axis `part`
  (its costs: the header's `costs[part]`). Where the report holds its per-category
  `results`, checks that the records give the same tau, speedup, acceptance by position,
  equality and predicted speedup."""
  if "items" not in report or "settings" not in report:
    raise ValueError(f"{source}: not a `jspec bench --suite` report (no items or settings)")
  parts = report.get("merged_from") or [{"categories": list(report["prompts_by_category"])}]
  costs = report.get("merged_costs") or [report["costs"]]
  part_of = {g: i for i, p in enumerate(parts) for g in p["categories"]}
  recs = []
  for it in report["items"]:
    where = str(it["question_id"]) + (f"/{it['turn']}" if it["turn"] > 1 else "")
    for variant, run in it["runs"].items():
      temperature = 1.0 if variant.endswith("@T1") else 0.0
      recs.append(R.Record(
          study=study, method=variant, workload="spec-bench", prompt=where,
          axes={"batch": 1, "turn": it["turn"], "prompt_tokens": it["prompt_tokens"],
                "category": it["group"], "temperature": temperature,
                "part": part_of[it["group"]]},
          tokens=run["tokens"], calls=run["calls"], rounds=run["calls"],
          judged=tuple(run["judged"]), accepted=tuple(run["accepted"]),
          rounds_by_k={int(k): v for k, v in run["rounds_by_k"].items()},
          seconds=tuple(it["times"][variant]), equal=run.get("equal")))
  head = {"schema": R.SCHEMA, "study": study, "settings": report["settings"],
          "created": None, "converted_from": source,
          "machine": {"backend": report.get("backend"), "devices": report.get("devices")},
          "versions": None, "target": report.get("target"),
          "target_params": report.get("target_params"),
          "methods": report["methods"], "unavailable": report.get("unavailable", {}),
          "costs": [c["methods"] for c in costs],
          "step_ms": [c["t_step_ms"] for c in costs],
          "parts": [{"categories": p["categories"], "wall_s": p.get("wall_s",
                                                                     report.get("wall_s"))}
                    for p in parts],
          "columns": questions.columns(it["group"] for it in report["items"]),
          "mismatches": report.get("mismatches", [])}
  _check_spec_bench(report, source, head, recs)
  return head, recs


def _predicted(recs, costs: list, k) -> tuple[float | None, float | None]:
  """Tokens over the steps the records' rounds cost (where a verify costs one step, with
  the verify costs measured), each process's records priced by its own costs
  (`report.predicted_accelerator`'s figure)."""
  from jspec.bench import metrics as M

  accel = here = 0.0
  for part, mine in M.group(recs, "part").items():
    a, h = M.predicted_steps(mine, costs[part].get(recs[0].method, {}), k)
    if a is None:
      return None, None
    accel, here = accel + a, here + h
  tokens = sum(r.tokens for r in recs)
  return (tokens / accel if accel else None), (tokens / here if here else None)


def _check_spec_bench(report: dict, source: str, head: dict, recs: list) -> None:
  from jspec.bench import metrics as M
  from jspec.bench import report as T

  costs = head["costs"]
  ks = {name: m["k"] for name, m in head["methods"].items()}
  ks.update({name + "@T1": k for name, k in ks.items()})
  for mode, by_method in report.get("results", {}).items():
    for method, by_group in by_method.items():
      for group, row in by_group.items():
        mine = [r for r in recs if r.method == method
                and (group == "overall" or r.axes["category"] == group)]
        where = f"{mode} {method} {group}"
        if len(mine) != row["prompts"]:
          raise ValueError(f"{source}: {where}: {row['prompts']} prompts in the file, "
                           f"{len(mine)} records")
        base = T.base_of(recs, mine)
        got = {"tokens": sum(r.tokens for r in mine), "target_calls": sum(r.calls for r in mine),
               "tau": M.tau(mine), "speedup": M.speedup(base, mine),
               "position_acceptance": M.acceptance(mine),
               "position_judged": [sum(col) for col in itertools.zip_longest(
                   *(r.judged for r in mine), fillvalue=0)]}
        if "equal_to_plain" in row:
          got["equal_to_plain"] = M.all_equal(mine)
        if "predicted_accelerator" in row:
          got["predicted_accelerator"], here = _predicted(mine, costs, ks.get(method))
          if "ideal_here" in row:
            got["ideal_here"] = here
        for key, value in got.items():
          _check(source, where, key, row[key], value)


def serve(report: dict, source: str) -> tuple[dict, list]:
  """A `jspec bench serve --json` run (or one config of benchmarks/serve_load.py) as
  written before the harness: one record per request (`serve_load.request_record`; the
  old prompt index kept in extra as `prompt_index`), the rounds by K each rate's /metrics
  counters differed by in the header's "rates". Checks that the converted records give
  every figure the old file's per-rate rows recorded."""
  import math

  from jspec.bench import serve_load as S
  from jspec.bench import workloads

  if report.get("study") != "serve" or "rows" not in report:
    raise ValueError(f"{source}: not a `jspec bench serve` run (no study 'serve' or rows)")
  prompts = workloads.load(report["workload"]).prompts
  recs, rates = [], {}
  for row in report["rows"]:
    mine = []
    for r in row["records"]:
      got = {"sent": r["sent"], "end": r["end"], "status": r["status"], "error": r["error"],
             "chunk_times": r["chunk_times"], "text": r["text"], "tokens": r["output_tokens"],
             "calls": r["target_calls"], "accepted": r["accepted"], "prompt_index": r["prompt"]}
      mine.append(S.request_record(got, label=report["label"], workload=report["workload"],
                                   prompt=prompts[r["prompt"]].id, rate=r["rate"],
                                   index=r["index"]))
    for key, value in S.summary(mine).items():
      old = row[key]
      if not (old == value or (old is not None and value is not None
                               and math.isclose(old, value, rel_tol=1e-9))):
        raise ValueError(f"{source}: rate {row['rate']:g}: {key} is {old} in the file, "
                         f"{value} from its records")
    rates[S.rate_key(row["rate"])] = {"rounds_by_k": row.get("rounds_by_k") or {}}
    recs += mine
  settings = {k: report[k] for k in ("url", "workload", "requests", "max_tokens", "seed",
                                      "extra") if k in report}
  head = {"schema": R.SCHEMA, "study": "serve", "settings": settings, "created": None,
          "converted_from": source, "machine": report.get("machine"), "versions": None,
          "label": report["label"], "command": report.get("command"), "counter": S.COUNTER,
          "rates": rates}
  return head, recs


def _rate_ratio(a: list, b: list) -> float:
  """a's tokens/s over b's, each repeat's ratio taken in the same repeat (the old reports'
  `rate_ratio`): `metrics.speedup(b, a)`."""
  from jspec.bench import metrics as M

  return M.speedup(b, a)


def _kinds_check(source: str, kinds: dict, recs: list, names: dict, ratios: dict) -> None:
  """Every figure of an old per-kind report (and its "all" row, every kind's per-repeat
  sums): tokens, seconds per repeat, tokens/s, and each ratio {key: (a, b)} of two
  variants' tokens/s; names: {old variant: method}."""
  from jspec.bench import metrics as M

  for kind, row in kinds.items():
    mine = recs if kind == "all" else [r for r in recs if r.axes["kind"] == kind]
    of = lambda name: [r for r in mine if r.method == names[name]]
    for name in names:
      old = row[name]
      got = {"tokens": sum(r.tokens for r in of(name)), "times_s": M.repeat_seconds(of(name)),
             "time_s": M.seconds(of(name)), "tokens_per_s": M.tokens_per_s(of(name))}
      for key, value in got.items():
        _check(source, f"{kind} {name}", key, old[key], value)
    for key, (a, b) in ratios.items():
      old = row
      for part in key.split("."):
        old = old[part]
      _check(source, kind, key, old, _rate_ratio(of(a), of(b)))


def real_ngram(report: dict, source: str) -> tuple[dict, list]:
  """`jspec bench --target FILE.gguf --sections ngram` (jspec.tools.bench_real, its batch-1
  n-gram section, transformers beside where it ran): a record per variant and chat kind,
  the kind's prompts run one after another and summed (the report kept no per-prompt
  figures): jspec's greedy, n-gram at K and "auto", transformers' greedy and prompt lookup.
  Checks tokens, each repeat's seconds, tokens/s, tau, rounds by K, equality and every
  speedup of each kind and of all nine against the file."""
  from jspec.bench import metrics as M

  if "ngram" not in report or "kinds" not in report.get("ngram", {}):
    raise ValueError(f"{source}: not a `jspec bench --target` report with an ngram section")
  others = sorted(set(report.get("settings_by_section", {})) - {"ngram"})
  if others:
    raise ValueError(f"{source}: sections {others} beside ngram; this reads the ngram one")
  sec = report["ngram"]
  k = sec["k"]
  names = {"jspec_greedy": "plain", f"jspec_ngram@{k}": f"ngram@k={k}",
           "jspec_ngram@auto": "ngram@k=auto", "transformers_greedy": "transformers",
           "transformers_prompt_lookup": f"transformers-prompt-lookup@k={k}"}
  kinds = {kind: row for kind, row in sec["kinds"].items() if kind != "all"}
  names = {old: new for old, new in names.items() if old in next(iter(kinds.values()))}
  prompt_tokens = {kind: [p["tokens"] for p in report["prompts"] if p["kind"] == kind]
                   for kind in kinds}
  recs = []
  for kind, row in kinds.items():
    for old, method in names.items():
      run = row[old]
      calls = (_calls(source, f"{kind} {old}", run["tokens"], run["tau"]) if "tau" in run
               else 0)
      by_k = {int(kk): v for kk, v in run.get("rounds_by_k", {}).items()}
      recs.append(R.Record(
          study="real-ngram", method=method, workload="chat", prompt=kind,
          axes={"kind": kind, "batch": 1, "temperature": 0.0,
                "library": old.split("_")[0]},
          tokens=run["tokens"], calls=calls, rounds=calls, rounds_by_k=by_k,
          seconds=tuple(run["times_s"]), equal=run.get("equal_to_greedy"),
          extra={"prompts": len(prompt_tokens[kind]), "prompt_tokens": prompt_tokens[kind]}))
  ratios = {f"{old}.speedup": (old, "transformers_greedy" if old.startswith("transformers")
                               else "jspec_greedy")
            for old in names if "speedup" in kinds[next(iter(kinds))][old]}
  if "transformers_prompt_lookup" in names:
    ratios.update({f"jspec_over_transformers_prompt_lookup.{old.split('@')[1]}":
                   (old, "transformers_prompt_lookup")
                   for old in (f"jspec_ngram@{k}", "jspec_ngram@auto")})
  _kinds_check(source, sec["kinds"], recs, names, ratios)
  for kind, row in sec["kinds"].items():
    mine = recs if kind == "all" else [r for r in recs if r.axes["kind"] == kind]
    for old, method in names.items():
      part = [r for r in mine if r.method == method]
      if "tau" in row[old]:
        _check(source, f"{kind} {old}", "tau", row[old]["tau"], M.tau(part))
      if "rounds_by_k" in row[old]:
        _check(source, f"{kind} {old}", "rounds_by_k", row[old]["rounds_by_k"],
               M.rounds_by_k(part))
      if "equal_to_greedy" in row[old]:
        _check(source, f"{kind} {old}", "equal_to_greedy", row[old]["equal_to_greedy"],
               M.all_equal(part))
  settings = dict(report["settings"])
  head = {"schema": R.SCHEMA, "study": "real-ngram", "settings": settings, "created": None,
          "converted_from": source,
          "machine": {"backend": report.get("backend"), "cores": report.get("cpu_count"),
                      "jax_threads": report.get("jax_threads")},
          "versions": {"jax": report.get("jax")}, "target": report.get("model"),
          "target_params": report.get("params"), "max_ngram": sec["max_ngram"],
          "mismatches": sec.get("mismatches", []),
          "cells": "a record per variant and chat kind: the kind's prompts answered one "
                   "after another, tokens and calls summed; seconds: each repeat's time "
                   "for all of them; calls 0 where the report kept no tau (greedy, "
                   "transformers)"}
  return head, recs


_HEADS_METHOD = re.compile(r"(?:.*?)(eagle3|draft)\b.*?(?: K=(\d+)| tree(\d+))$")


def _heads_method(label: str, spec: dict) -> str:
  """The registry spec of a `bench_heads_real` label ("ngram", "auto", "smollm2-eagle3 K=4",
  "eagle3 tree16" with its method entry)."""
  if label == "plain":
    return "plain"
  if label == "ngram":
    return f"ngram@k={spec['k']}"
  if label == "auto":
    return "ngram@k=auto"
  m = _HEADS_METHOD.match(label)
  if m is None:
    raise ValueError(f"unknown method label {label!r}")
  if m.group(2):
    return f"{m.group(1)}@k={m.group(2)}"
  t = re.fullmatch(r"DynamicTree\(nodes=(\d+), depth=(\d+), top_k=(\d+)\)", spec["tree"])
  return f"{m.group(1)}@tree={t.group(1)},{t.group(2)},{t.group(3)}"


def heads_real(report: dict, source: str) -> tuple[dict, list]:
  """`python -m jspec.tools.bench_heads_real` (and `bench_lookahead`'s report of the same
  form): a record per method and prompt set (the set's prompts summed; the report kept no
  per-prompt figures), seconds the one figure it kept: the sum over the set's calls of
  each call's median over the repeats; request and inter-token latency percentiles (pooled
  over the set's calls) in extra. Checks tau, speedup (plain's seconds over the method's,
  tokens equal) and the count of answers that differ from plain's."""
  from jspec.bench import metrics as M

  if "sets" not in report or "methods" not in report:
    raise ValueError(f"{source}: not a bench_heads_real report (no sets or methods)")
  specs = dict(report["methods"], plain={})
  recs = []
  for name, st in report["sets"].items():
    for label, run in st["methods"].items():
      where = f"{name} {label}"
      calls = _calls(source, where, run["tokens"], run["tau"])
      recs.append(R.Record(
          study="heads-real", method=_heads_method(label, specs[label]), workload="chat",
          prompt=name, axes={"set": name, "batch": 1, "temperature": 0.0},
          tokens=run["tokens"], calls=calls, rounds=calls, seconds=(run["time_s"],),
          equal=None if label == "plain" else run["answers_differing_from_plain"] == 0,
          extra={"prompts": st["prompts"], "label": label, "request_ms": run["request_ms"],
                 "itl_ms": run["itl_ms"],
                 "answers_differing_from_plain": run["answers_differing_from_plain"]}))
  for name, st in report["sets"].items():
    mine = [r for r in recs if r.axes["set"] == name]
    base = [r for r in mine if r.method == "plain"]
    for label, run in st["methods"].items():
      part = [r for r in mine if r.extra["label"] == label]
      _check(source, f"{name} {label}", "tau", run["tau"], M.tau(part))
      _check(source, f"{name} {label}", "speedup", run["speedup"], M.speedup(base, part))
  head = {"schema": R.SCHEMA, "study": "heads-real", "created": None,
          "settings": {"max_new_tokens": report["max_new_tokens"], "repeats": report["repeats"],
                       "batch": 1, "temperature": 0.0},
          "converted_from": source, "machine": None, "versions": None,
          "methods": {_heads_method(k, v): dict(v, label=k) for k, v in specs.items()},
          "cells": "a record per method and prompt set, the set's prompts summed; seconds: "
                   "one figure, the sum over the set's calls of each call's median over "
                   "the repeats (the report kept no per-repeat times); request_ms, itl_ms: "
                   "percentiles pooled over the set's calls, as the report gave them"}
  return head, recs


def assisted(report: dict, source: str) -> tuple[dict, list]:
  """`python -m jspec.tools.bench_assisted`: a draft model in jspec against transformers'
  assisted generation with the same weights; a record per variant and chat kind (the
  kind's prompts summed), seconds per repeat. Checks tokens, every repeat's seconds,
  tokens/s, tau and every speedup of each kind and of all of them against the file."""
  from jspec.bench import metrics as M

  if "kinds" not in report or "draft" not in report:
    raise ValueError(f"{source}: not a bench_assisted report (no kinds or draft)")
  k = report["k"]
  names = {"jspec_greedy": "plain", f"jspec_draft@{k}": f"draft@k={k}",
           "jspec_draft@auto": "draft@k=auto", "transformers_greedy": "transformers",
           f"transformers_assisted@{k}": f"transformers-assisted@k={k}",
           f"transformers_assisted@{k}+confidence": f"transformers-assisted@k={k}+confidence"}
  kinds = {kind: row for kind, row in report["kinds"].items() if kind != "all"}
  recs = []
  for kind, row in kinds.items():
    for old, method in names.items():
      run = row[old]
      calls = (_calls(source, f"{kind} {old}", run["tokens"], row["tau"])
               if old == f"jspec_draft@{k}" else 0)
      equal = (row["jspec_equal_to_greedy"] if old.startswith("jspec_draft")
               else row["transformers_equal_to_greedy"] if old.startswith("transformers_a")
               else None)
      recs.append(R.Record(
          study="assisted", method=method, workload="chat", prompt=kind,
          axes={"kind": kind, "batch": 1, "temperature": 0.0, "library": old.split("_")[0]},
          tokens=run["tokens"], calls=calls, rounds=calls, seconds=tuple(run["times_s"]),
          equal=equal, extra={"prompts": report["per_kind"]} if "per_kind" in report else {}))
  ratios = {"jspec_speedup": (f"jspec_draft@{k}", "jspec_greedy"),
            "transformers_speedup": (f"transformers_assisted@{k}", "transformers_greedy"),
            "jspec_over_transformers_assisted": (f"jspec_draft@{k}", f"transformers_assisted@{k}"),
            "auto_speedup": ("jspec_draft@auto", "jspec_greedy"),
            "confidence_speedup": (f"transformers_assisted@{k}+confidence",
                                   "transformers_greedy"),
            "jspec_auto_over_transformers_confidence": ("jspec_draft@auto",
                                                        f"transformers_assisted@{k}+confidence")}
  _kinds_check(source, report["kinds"], recs, names, ratios)
  for kind, row in report["kinds"].items():
    mine = [r for r in recs if r.method == f"draft@k={k}"
            and (kind == "all" or r.axes["kind"] == kind)]
    _check(source, kind, "tau", row["tau"], M.tau(mine))
    for key, lib in (("jspec_equal_to_greedy", "jspec"), ("transformers_equal_to_greedy",
                                                           "transformers")):
      _check(source, kind, key, row[key], M.all_equal(
          [r for r in recs if r.axes["library"] == lib
           and (kind == "all" or r.axes["kind"] == kind)]))
  head = {"schema": R.SCHEMA, "study": "assisted", "created": None,
          "settings": {"k": k, "max_new_tokens": report["max_new_tokens"],
                       "repeats": report["repeats"], "batch": 1, "temperature": 0.0},
          "converted_from": source,
          "machine": {"torch_threads": report.get("torch_threads"),
                      "jax_threads": report.get("jax_threads")},
          "versions": None, "target": report.get("target"), "draft": report.get("draft"),
          "cells": "a record per variant and chat kind: the kind's prompts answered one "
                   "after another, tokens summed; seconds: each repeat's time for all of "
                   "them; calls only where the report kept tau (jspec's draft at fixed K), "
                   "0 elsewhere"}
  return head, recs


def eagle_trees(report: dict, source: str) -> tuple[dict, list]:
  """benchmarks/eagle_trees_smollm2.py: one EAGLE head as a chain and as dynamic trees on
  MT-Bench first turns; a record per shape over all the conversations (the report kept
  only their sums), acceptance by position from its histogram of drafts accepted a round,
  the wall time of the shape's run (compilation included) in extra, no timed repeats.
  Checks tau, acceptance by position (both rounded to 4 places in the file) and the
  histogram's rounds against the target calls."""
  from jspec.bench import metrics as M

  if "rows" not in report or "head" not in report:
    raise ValueError(f"{source}: not an eagle_trees report (no head or rows)")
  recs = []
  for label, row in report["rows"].items():
    judged, accepted = _pos(row["accept_hist"])
    if sum(row["accept_hist"]) != row["target_calls"]:
      raise ValueError(f"{source}: {label}: the histogram holds {sum(row['accept_hist'])} "
                       f"rounds, the file {row['target_calls']} target calls")
    t = re.fullmatch(r"tree (\d+) nodes, depth (\d+), top-(\d+)", label)
    method = f"eagle3@tree={t.group(1)},{t.group(2)},{t.group(3)}" if t else f"eagle3@k={row['k']}"
    recs.append(R.Record(
        study="eagle-trees", method=method, workload="mt-bench",
        prompt=f"first turns 1-{row['prompts']}",
        axes={"batch": 1, "temperature": 0.0, "turn": 1, "k": row["k"],
              "verify_tokens": row["verify_tokens"]},
        tokens=row["answer_tokens"], calls=row["target_calls"], rounds=row["target_calls"],
        judged=judged, accepted=accepted, equal=row["greedy_equal"],
        extra={"prompts": row["prompts"], "label": label,
               "head_passes_per_round": row["head_passes_per_round"],
               "accept_hist": row["accept_hist"], "wall_seconds": row["wall_seconds"]}))
  for rec in recs:
    row = report["rows"][rec.extra["label"]]
    _check(source, rec.extra["label"], "tau", row["tau"], M.tau([rec]), abs_=5e-5)
    _check(source, rec.extra["label"], "accept_per_position", row["accept_per_position"],
           M.acceptance([rec]), abs_=5e-5)
  head = {"schema": R.SCHEMA, "study": "eagle-trees", "created": None,
          "settings": {"conversations": report["conversations"],
                       "new_tokens": report["new_tokens"], "batch": 1, "temperature": 0.0},
          "converted_from": source, "machine": None, "versions": None,
          "drafter": report["head"], "questions": report.get("questions"),
          "cells": "a record per shape, every conversation's first turn summed; judged / "
                   "accepted from the report's histogram of drafts accepted a round; no "
                   "timed repeats (extra wall_seconds: the shape's whole run, compilation "
                   "included)"}
  return head, recs


def capacity(report: dict, source: str) -> tuple[dict, list]:
  """benchmarks/continuous_batching.py capacity: `generate` at one batch with each cache
  length, 48 and 144 new tokens; a record per (cache length, new tokens), one call of the
  whole batch, seconds per repeat. Calls are not recorded (plain decoding, EOS ignored).
  Checks each cache length's median seconds and tokens/s at 48 tokens and its round cost
  ((144 - 48 tokens' medians) / 96) against the file."""
  from jspec.bench import metrics as M

  if report.get("study") != "capacity" or "times" not in report:
    raise ValueError(f"{source}: not a continuous_batching capacity report")
  B = report["batch"]
  recs = []
  for key, times in report["times"].items():
    S, new = (int(x) for x in key.split("/"))
    recs.append(R.Record(
        study="capacity", method="plain", workload="capacity", prompt=f"{B} rows",
        axes={"batch": B, "cache_length": S, "new_tokens": new, "temperature": 0.0},
        tokens=B * new, seconds=tuple(times)))
  for row in report["rows"]:
    S = row["cache_length"]
    at = {r.axes["new_tokens"]: r for r in recs if r.axes["cache_length"] == S}
    _check(source, f"cache {S}", "seconds_48", row["seconds_48"], M.seconds([at[48]]))
    _check(source, f"cache {S}", "tokens_per_s_48", row["tokens_per_s_48"],
           M.tokens_per_s([at[48]]))
    _check(source, f"cache {S}", "round_ms", row["round_ms"],
           1000 * (M.seconds([at[144]]) - M.seconds([at[48]])) / 96)
  head = {"schema": R.SCHEMA, "study": "capacity", "created": None,
          "settings": {"batch": B, "repeats": report["repeats"], "prompt_tokens": 40,
                       "eos": None, "temperature": 0.0},
          "converted_from": source, "machine": report.get("machine"), "versions": None,
          "cells": "a record per cache length and new tokens: one `generate` call of the "
                   "whole batch, 40-token prompts, EOS ignored; target calls not recorded"}
  return head, recs


def many(report: dict, source: str) -> tuple[dict, list]:
  """benchmarks/continuous_batching.py many: N requests of long-tailed lengths through
  `generate_many`, static batches of `generate` and vLLM; a record per way of serving
  them all, seconds per repeat. Checks the medians and tokens/s against the file."""
  from jspec.bench import metrics as M

  if report.get("study") != "many" or "times" not in report:
    raise ValueError(f"{source}: not a continuous_batching many report")
  N, B = report["requests"], report["slots"]
  methods = {"generate_many": "generate_many", "static batches": "generate",
             "vllm": "vllm"}
  recs = []
  for name, times in report["times"].items():
    base = name.split(" ngram")[0]
    if base not in methods:
      raise ValueError(f"{source}: unknown run {name!r}")
    equal = report["equal"] if base != "vllm" else None
    recs.append(R.Record(
        study="many", method=methods[base] + (name[len(base):].replace(" ngram K=", "@ngram=")),
        workload="many", prompt=f"requests 0-{N - 1}",
        axes={"slots": B, "requests": N, "temperature": 0.0},
        tokens=report["new_tokens"], seconds=tuple(times), equal=equal,
        extra={"label": name}))
  for rec in recs:
    name = rec.extra["label"]
    _check(source, name, "seconds", report["seconds"][name], M.seconds([rec]))
    _check(source, name, "tokens_per_s", report["tokens_per_s"][name], M.tokens_per_s([rec]))
  head = {"schema": R.SCHEMA, "study": "many", "created": None,
          "settings": {"requests": N, "slots": B, "repeats": report["repeats"],
                       "new_tokens": report["new_tokens"], "eos": None, "temperature": 0.0},
          "converted_from": source, "machine": report.get("machine"), "versions": None,
          "equal": report["equal"], "vllm_agreement": report.get("vllm_agreement"),
          "vllm": report.get("vllm"),
          "cells": "a record per way of serving: every request in one run, new tokens "
                   "summed; equal: generate_many's tokens equal static batches' for every "
                   "request (vllm_agreement: the share of requests whose tokens equal "
                   "vLLM's); target calls not recorded"}
  return head, recs


def capture_cost(report: dict, source: str) -> tuple[dict, list]:
  """benchmarks/capture_cost.py: one batch generated plainly, with features captured, and
  the prefill that capture replaces; a record per call, seconds per repeat (the prefill
  emits no tokens). Checks the medians, tokens/s and both ratios against the file."""
  from jspec.bench import metrics as M

  if "times_s" not in report or "capture_over_plain" not in report:
    raise ValueError(f"{source}: not a capture_cost report")
  B, new = report["batch"], report["new_tokens"]
  layers = ",".join(str(x) for x in report["layers"])
  methods = {"plain": "plain", "capture": f"plain@features={layers}",
             "prefill": f"prefill@features={layers}"}
  recs = [R.Record(study="capture-cost", method=methods[name], workload="answers-pool",
                   prompt=f"{B} rows", axes={"batch": B, "new_tokens": new,
                                             "temperature": 0.0},
                   tokens=0 if name == "prefill" else B * new, seconds=tuple(times),
                   extra={"label": name})
          for name, times in report["times_s"].items()]
  by = {r.extra["label"]: r for r in recs}
  for name, rec in by.items():
    _check(source, name, "median_s", report["median_s"][name], M.seconds([rec]))
    if name in report["answer_tokens_per_s"]:
      _check(source, name, "answer_tokens_per_s", report["answer_tokens_per_s"][name],
             M.tokens_per_s([rec]))
  _check(source, "all", "capture_over_plain", report["capture_over_plain"],
         M.ratio_of_medians([by["capture"]], [by["plain"]]))
  _check(source, "all", "plain_plus_prefill_over_capture",
         report["plain_plus_prefill_over_capture"],
         (M.seconds([by["plain"]]) + M.seconds([by["prefill"]])) / M.seconds([by["capture"]]))
  head = {"schema": R.SCHEMA, "study": "capture-cost", "created": None,
          "settings": {"batch": B, "new_tokens": new, "layers": report["layers"],
                       "temperature": 0.0},
          "converted_from": source,
          "machine": {"backend": report.get("backend"), "cores": report.get("cpus")},
          "versions": None, "prompt_tokens": report.get("prompt_tokens"),
          "cells": "a record per call over the whole batch: plain generation, the same "
                   "capturing the head's features (layers), and the prefill over the "
                   "finished rows it replaces (no tokens emitted)"}
  return head, recs


CONVERTERS = {"spec-bench": spec_bench, "serve": serve, "real-ngram": real_ngram,
              "heads-real": heads_real, "assisted": assisted, "eagle-trees": eagle_trees,
              "capacity": capacity, "many": many, "capture-cost": capture_cost}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m jspec.bench.legacy", description=__doc__)
  p.add_argument("kind", choices=sorted(CONVERTERS))
  p.add_argument("old")
  p.add_argument("new")
  p.add_argument("--source", help="what the header names as the source (default: OLD)")
  p.add_argument("--study", help="spec-bench: the study's name (default spec-bench), to "
                                 "tell apart the records of two runs a table joins")
  args = p.parse_args(argv)
  if args.study and args.kind != "spec-bench":
    p.error("--study is for spec-bench")
  with open(args.old, encoding="utf-8") as f:
    report = json.load(f)
  extra = {"study": args.study} if args.study else {}
  head, recs = CONVERTERS[args.kind](report, args.source or args.old, **extra)
  R.write(args.new, head, recs)
  print(f"{len(recs)} records -> {args.new}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
