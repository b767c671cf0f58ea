"""Records of jspec's earlier benchmark modules, read into this schema (`jspec.bench.records`).

The measurements stay what they were; only their shape changes, so a documented figure
can be rendered from the same numbers by `jspec.bench.report` and checked against the page.
The header says where the records came from and what the old file did not record (the
versions: None).

    python -m jspec.bench.legacy spec-bench OLD.json NEW.jsonl
    python -m jspec.bench.legacy serve OLD.json NEW.jsonl      # a `jspec bench serve` run
"""

from __future__ import annotations

import argparse
import json

from jspec.bench import records as R
from jspec.bench import questions


def spec_bench(report: dict, source: str) -> tuple[dict, list]:
  """A `jspec bench --suite spec-bench` report (joined with `--merge` or not): one record
  per prompt (a question's turn) and variant, the process that ran it in the axis `part`
  (its costs: the header's `costs[part]`)."""
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
          study="spec-bench", method=variant, workload="spec-bench", prompt=where,
          axes={"batch": 1, "turn": it["turn"], "prompt_tokens": it["prompt_tokens"],
                "category": it["group"], "temperature": temperature,
                "part": part_of[it["group"]]},
          tokens=run["tokens"], calls=run["calls"], rounds=run["calls"],
          judged=tuple(run["judged"]), accepted=tuple(run["accepted"]),
          rounds_by_k={int(k): v for k, v in run["rounds_by_k"].items()},
          seconds=tuple(it["times"][variant]), equal=run.get("equal")))
  head = {"schema": R.SCHEMA, "study": "spec-bench", "settings": report["settings"],
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
  return head, recs


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


CONVERTERS = {"spec-bench": spec_bench, "serve": serve}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m jspec.bench.legacy", description=__doc__)
  p.add_argument("kind", choices=sorted(CONVERTERS))
  p.add_argument("old")
  p.add_argument("new")
  p.add_argument("--source", help="what the header names as the source (default: OLD)")
  args = p.parse_args(argv)
  with open(args.old, encoding="utf-8") as f:
    report = json.load(f)
  head, recs = CONVERTERS[args.kind](report, args.source or args.old)
  R.write(args.new, head, recs)
  print(f"{len(recs)} records -> {args.new}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
