"""Multi-turn, agent-style conversations: n-gram lookup against suffix drafting with a
memory carried across calls.

    python -m jspec.bench.suffix [--target smollm2] [--conversations 4] [--repeats 2]
        [--max-new-tokens 96] [--k 4] [--json out.jsonl]

Each conversation (the workload "agent", `jspec.bench.workloads`) runs the same three-turn
task on a different standard-library function, the way an agent loop does: the tool's
output (the function's source) is shown, the model explains it, rewrites it, then repeats
its explanation. The whole history is in every turn's prompt (plain greedy decoding's
answers), so both drafters can copy from it; the suffix drafter also remembers every
earlier answer (the runner carries its memory from call to call: the workload
ArcticInference's suffix decoding targets, the same kind of task again and again). Batch 1,
greedy, through the harness's runner: each call timed `repeats` times with the methods
interleaved, every answer compared with plain decoding's. By turn: tau, speedup over plain
and suffix over n-gram (`metrics.speedup`, repeats paired), and each method's request
latency p50 / p99 (a call's median seconds, over the calls).
"""

from __future__ import annotations

import argparse

from jspec.bench import metrics as M
from jspec.bench import methods as registry
from jspec.bench import report, runner
from jspec.bench import workloads as W

STUDY = "suffix"
METHODS = ("ngram", "suffix")


def run(target, workload, k: int = 4, max_new_tokens: int = 96, repeats: int = 2,
        progress: bool = True) -> runner.Result:
  """Plain decoding, n-gram lookup and suffix drafting (its memory carried) at K = k."""
  variants = [runner.plain()] + [runner.Variant(name, registry.build(name, target, k=k),
                                                axes={"k": k}) for name in METHODS]
  return runner.run(target, variants, workload, runner.Settings(
      max_new_tokens=max_new_tokens, repeats=repeats, progress=progress), STUDY)


def request_s(recs, base) -> str:
  """"3.66 / 5.22": p50 / p99 over the calls of each call's median seconds."""
  p = M.percentiles(M.seconds([r]) for r in recs)
  return f"{p['p50']:.2f} / {p['p99']:.2f}"


def tables(recs) -> dict[str, str]:
  """By turn: speedup over plain (tau), suffix over n-gram, request seconds p50 / p99."""
  turn = lambda t: f"turn {t}"
  suffix = [r for r in recs if r.method == "suffix"]
  over = lambda part, base: f"{M.speedup(report.base_of(recs, part, 'ngram'), part):.2f}x"
  return {"speedup over plain decoding (tau), by turn": report.pivot(
              recs, "method", "turn", report.speedup_tau, heading=turn),
          "suffix over n-gram, by turn": report.pivot(suffix, "method", "turn", over,
                                                      heading=turn),
          "request seconds p50 / p99 (a call's median over repeats), by turn": report.pivot(
              recs, "method", "turn", request_s, heading=turn, skip_rows=())}


def main(argv=None) -> int:
  """The command line (module docstring)."""
  from jspec.bench import targets

  p = argparse.ArgumentParser(prog="python -m jspec.bench.suffix",
                              description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  p.add_argument("--conversations", type=int, default=4)
  p.add_argument("--max-new-tokens", type=int, default=96)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--json", help="write the records here (JSON lines)")
  args = p.parse_args(argv)
  ran = run(targets.load(args.target), W.load("agent").head(args.conversations), args.k,
            args.max_new_tokens, args.repeats)
  settings = {"max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "k": args.k,
              "batch": 1, "conversations": args.conversations}
  return report.finish(ran, STUDY, settings, tables(ran.records), args.json,
                       target=args.target)


if __name__ == "__main__":
  raise SystemExit(main())
