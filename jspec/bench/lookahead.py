"""Draft-free methods per prompt set on a real model: lookahead (Jacobi) decoding against
plain decoding, n-gram lookup and suffix drafting, with latency percentiles.

    python -m jspec.bench.lookahead [--target smollm2] [--per-kind 2] [--conversations 2]
        [--max-new-tokens 64] [--repeats 3] [--methods ...] [--k 4] [--json out.jsonl]

Methods are specs of the registry (`jspec.bench.methods`), K 4 unless a spec says: by default
ngram, suffix (with memory: on the conversations only), lookahead:5,4,3 (24 tokens per
verify, depth 3) and lookahead:2,3,1 (6 tokens per verify, depth 2); also auto-itl ("auto"
over n-gram lookup with `AutoK(itl_bound=1.1)`), or any other spec.

Sets (the records' `category`): the held-out chat prompts of the three kinds (restate,
explain, question; the workload "chat") and the multi-turn agent-style conversations
("agent": history, tool output and earlier answers in every prompt; `jspec.bench.suffix`'s).
Batch 1, greedy, through the harness's runner: compiled first, each call `repeats` times
with the methods interleaved, every call streamed (`Settings(stream=True)`: each round's
arrival kept in the record), every answer compared with plain decoding's. A set's speedup
is the median over repeats of plain's summed time over the method's (`metrics.speedup`);
request and inter-token latency percentiles pool the set's calls
(`metrics.request_latency`, `metrics.inter_token`).

On this CPU a verify block of 10-30 tokens costs several one-token steps
(docs/benchmarks.md), where on an accelerator it costs about one: tau says what a
method finds, the speedup what it is worth here.
"""

from __future__ import annotations

import argparse
import dataclasses

from jspec.bench import methods as registry
from jspec.bench import report, runner
from jspec.bench import workloads as W

STUDY = "lookahead"
DEFAULT_METHODS = "ngram,suffix,lookahead:5,4,3,lookahead:2,3,1"
AUTO_ITL = "auto-itl"  # "auto" over n-gram lookup with AutoK(itl_bound=1.1)


def build_methods(target, specs, k: int = 4) -> dict:
  """{spec: `jspec.bench.methods.Built`} for registry specs (and AUTO_ITL), K `k` unless a
  spec sets it; a method that cannot run with this target is a SystemExit saying why."""
  import jspec

  out = {}
  for spec in specs:
    try:
      if spec == AUTO_ITL:
        built = registry.build("auto", target, k=k)
        out[spec] = dataclasses.replace(built, k=jspec.AutoK(itl_bound=1.1),
                                        description=built.description + ", itl_bound 1.1")
      else:
        out[spec] = registry.build(spec, target, k=k)
    except (ValueError, registry.Unavailable) as e:
      raise SystemExit(f"--methods {spec}: {e}") from None
    if out[spec].drafter is None:
      raise SystemExit(f"--methods {spec}: plain decoding runs in every set, beside the methods")
  return out


def sets(per_kind: int, conversations: int) -> list:
  """The prompt sets: `per_kind` chat prompts of each kind, the first `conversations`
  agent conversations (either left out at 0)."""
  out = [W.load("chat").per_category(per_kind)] if per_kind else []
  return out + ([W.load("agent").head(conversations)] if conversations else [])


def run(target, methods: dict, workloads, max_new_tokens: int = 64, repeats: int = 3,
        study: str = STUDY, progress: bool = True) -> runner.Result:
  """Plain decoding and every method on each workload, streamed; a method `with_memory`
  (suffix) on workloads of conversations (prompts with later turns) only."""
  s = runner.Settings(max_new_tokens=max_new_tokens, repeats=repeats, stream=True,
                      progress=progress)
  recs, mismatches = [], []
  for wl in workloads:
    talks = any(p.turns for p in wl.prompts)
    variants = [runner.plain()] + [
        runner.Variant(name, b, axes={"k": b.k if isinstance(b.k, (int, str)) else "auto"})
        for name, b in methods.items() if talks or not b.with_memory]
    ran = runner.run(target, variants, wl, s, study)
    recs += ran.records
    mismatches += ran.mismatches
  return runner.Result(recs, mismatches)


def tables(recs) -> dict[str, str]:
  """Per method and set: speedup over plain (tau); request and inter-token latency."""
  by_set = lambda cell, **kw: report.pivot(recs, "method", "category", cell, **kw)
  return {"speedup over plain decoding (tau), batch 1, greedy": by_set(report.speedup_tau),
          "request latency p50 / p99, ms": by_set(report.request_ms, skip_rows=()),
          "inter-token latency p50 / p99, ms": by_set(report.inter_token_ms, skip_rows=())}


def arguments(prog: str, description: str, methods: str) -> argparse.ArgumentParser:
  """The flags this study and `jspec.bench.heads_real` share."""
  p = argparse.ArgumentParser(prog=prog, description=description)
  p.add_argument("--target", default="smollm2",
                 help="a target jspec.bench.targets resolves: smollm2, a GGUF file, a "
                      "checkpoint folder, a cached Hub id")
  p.add_argument("--per-kind", type=int, default=2)
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--methods", default=methods,
                 help="method specs (jspec.bench.methods) and auto-itl")
  p.add_argument("--k", type=int, default=4, help="K of the specs without @k")
  p.add_argument("--json", help="write the records here (JSON lines)")
  return p


def check(parser, specs) -> None:
  """Every spec parses (before the model loads)."""
  for spec in specs:
    if spec != AUTO_ITL:
      try:
        registry.parse_spec(spec)
      except ValueError as e:
        parser.error(f"--methods: {e}")


def execute(args, study: str, extra=lambda target: {}, conversations: int = 0) -> int:
  """Load the target, build --methods and `extra(target)`'s methods, run, print, write."""
  from jspec.bench import targets

  target = targets.load(args.target)
  methods = build_methods(target, registry.split(args.methods), args.k) | extra(target)
  ran = run(target, methods, sets(args.per_kind, conversations), args.max_new_tokens,
            args.repeats, study)
  settings = {"max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "batch": 1,
              "per_kind": args.per_kind, "conversations": conversations, "k": args.k}
  return report.finish(ran, study, settings, tables(ran.records), args.json, target=args.target,
                       methods={n: {"description": b.description} for n, b in methods.items()})


def main(argv=None) -> int:
  """The command line (module docstring)."""
  p = arguments("python -m jspec.bench.lookahead", __doc__.splitlines()[0], DEFAULT_METHODS)
  p.add_argument("--conversations", type=int, default=2)
  args = p.parse_args(argv)
  check(p, registry.split(args.methods))
  return execute(args, STUDY, conversations=args.conversations)


if __name__ == "__main__":
  raise SystemExit(main())
