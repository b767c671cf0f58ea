"""Draft-free methods on a real model, per prompt set: lookahead (Jacobi) decoding against
plain decoding, n-gram lookup and suffix drafting, with latency percentiles.

    python -m jspec.tools.bench_lookahead [--target smollm2] [--per-kind 2]
        [--conversations 2] [--max-new-tokens 64] [--repeats 3] [--methods ...] [--json out.json]

Methods are specs of the registry (`jspec.bench.methods`), K 4 unless a spec says: by default
ngram, suffix (with memory, multi-turn only), lookahead:5,4,3 (24 tokens per verify, depth 3)
and lookahead:2,3,1 (6 tokens per verify, depth 2); also auto (n-gram, K per round) and
auto-itl (the same with `AutoK(itl_bound=1.1)`), or any other spec.

Sets: the held-out chat prompts of the three kinds (restate, explain, question;
checkpoints/chat_prompts.json) and the multi-turn agent-style conversations of
`bench_suffix` (history, tool output and earlier answers in every prompt). Batch 1,
greedy. Every call runs once untimed, then `repeats` times with the methods
interleaved (order reversed every other repeat), each timed with its per-round
timestamps (`jspec.tools.latency`): a set's speedup is its plain time over the
method's (medians per call, summed over the set); request and inter-token latency
percentiles pool the set's calls. Speculative answers are compared with plain ones
(equal but for near-ties of float sums).

On this CPU a verify block of 10-30 tokens costs several one-token steps
(docs/benchmarks.md), where on an accelerator it costs about one: tau says what a
method finds, the speedup what it is worth here.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import jax
import numpy as np

from jspec.tools import latency

DEFAULT_METHODS = "ngram,suffix,lookahead:5,4,3,lookahead:2,3,1"
AUTO_ITL = "auto-itl"  # "auto" over n-gram lookup with AutoK(itl_bound=1.1)


def build_methods(target, specs, k: int = 4) -> dict:
  """{spec: `jspec.bench.methods.Built`} for registry specs (and AUTO_ITL), K `k` unless a
  spec sets it; a method that cannot run with this target is a SystemExit saying why."""
  import jspec
  from jspec.bench import methods as registry

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


def prompt_sets(target, per_kind: int, conversations: int, max_new_tokens: int) -> dict:
  """{set name: [(prompt ids, suffix memory or None)]}."""
  from jspec.tools import bench_suffix
  from jspec.tools.bench_real import default_prompts

  sets = {}
  for kind, ids in default_prompts(target, per_kind):
    sets.setdefault(kind, []).append((ids, None))
  if conversations:
    sets["multi-turn"] = [(ids, mem) for ids, mem, _ in
                          bench_suffix.conversation_calls(target, conversations, max_new_tokens)]
  return sets


def run(target, sets: dict, methods: dict, max_new_tokens: int = 64, repeats: int = 3,
        log=print) -> dict:
  """Per set and method: tokens, tau, speedup over plain, latency percentiles.

  methods: {name: `jspec.bench.methods.Built`} (`build_methods`, or trained heads with a K or
  a tree); a method `with_memory` (suffix) runs on sets with a memory (multi-turn) only."""
  import jspec

  def call(name, ids, mem):
    def go(stream=None):
      if name == "plain":
        return jspec.generate(target, [ids], max_new_tokens=max_new_tokens, stream=stream)
      built = methods[name]
      drafter = built.drafter
      if built.with_memory:
        drafter = dataclasses.replace(drafter, memory=mem)
      shape = dict(num_draft_tokens=built.k) if built.tree is None else dict(tree=built.tree)
      return jspec.speculative_generate(target, drafter, [ids], max_new_tokens=max_new_tokens,
                                        stream=stream, **shape)
    return go

  report = {"max_new_tokens": max_new_tokens, "repeats": repeats,
            "methods": {m: {"k": b.k if isinstance(b.k, (int, str)) else "auto",
                            "description": b.description}
                        | ({} if b.tree is None else {"tree": f"{b.tree.num_nodes} nodes, depth "
                                                              f"{b.tree.max_depth}"})
                        for m, b in methods.items()},
            "sets": {}}
  for set_name, prompts in sets.items():
    with_memory = any(mem is not None for _, mem in prompts)
    names = ["plain"] + [m for m, b in methods.items() if with_memory or not b.with_memory]
    times = {n: [] for n in names}  # per call: median seconds
    samples = {n: [] for n in names}
    tokens = {n: 0 for n in names}
    calls = {n: 0 for n in names}
    differs = {n: 0 for n in names}
    for ids, mem in prompts:
      # Compile and warm up the streamed programs the timing runs (their own programs).
      outs = {n: call(n, ids, mem)(stream=lambda rows: None) for n in names}
      jax.block_until_ready([o.tokens for o in outs.values()])
      per = {n: [] for n in names}
      for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
          out, sample = latency.timed_call(call(n, ids, mem))
          per[n].append(sample["request_s"][0])
          samples[n].append(sample)
      for n in names:
        times[n].append(statistics.median(per[n]))
        tokens[n] += int(outs[n].lengths[0])
        calls[n] += int(outs[n].stats.target_calls[0])
        differs[n] += int(not np.array_equal(np.asarray(outs[n].tokens),
                                              np.asarray(outs["plain"].tokens)))
    rows = {}
    for n in names:
      pct = latency.percentiles(latency.merge(samples[n]))
      rows[n] = {"tokens": tokens[n], "tau": tokens[n] / max(calls[n], 1),
                 "time_s": sum(times[n]), "speedup": sum(times["plain"]) / sum(times[n]),
                 "request_ms": pct["request_ms"], "itl_ms": pct["itl_ms"],
                 "answers_differing_from_plain": differs[n]}
    report["sets"][set_name] = {"prompts": len(prompts), "methods": rows}
    log(f"{set_name} ({len(prompts)} prompts)")
    for n, row in rows.items():
      log(f"  {n:<16} tau {row['tau']:.2f}  {row['speedup']:.2f}x  request p50/p99 "
          f"{row['request_ms']['p50']:.0f}/{row['request_ms']['p99']:.0f} ms  inter-token "
          f"p50/p99 {row['itl_ms']['p50']:.1f}/{row['itl_ms']['p99']:.1f} ms"
          + (f"  ({row['answers_differing_from_plain']} answers differ)"
             if row["answers_differing_from_plain"] else ""))
  return report


def main(argv=None) -> int:
  """The command line (module docstring)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2",
                      help="a target jspec.bench.targets resolves: smollm2, a GGUF file, a "
                           "checkpoint folder, a cached Hub id")
  parser.add_argument("--per-kind", type=int, default=2)
  parser.add_argument("--conversations", type=int, default=2)
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--methods", default=DEFAULT_METHODS,
                      help="method specs (jspec.bench.methods) and auto-itl")
  parser.add_argument("--k", type=int, default=4, help="K of the specs without @k")
  parser.add_argument("--json", help="write the report here")
  args = parser.parse_args(argv)
  from jspec.bench import methods as registry
  from jspec.bench import targets
  from jspec.tools.bench_real import write_json

  specs = registry.split(args.methods)
  for spec in specs:  # before the model loads
    if spec != AUTO_ITL:
      try:
        registry.parse_spec(spec)
      except ValueError as e:
        parser.error(f"--methods: {e}")
  target = targets.load(args.target)
  sets = prompt_sets(target, args.per_kind, args.conversations, args.max_new_tokens)
  report = run(target, sets, build_methods(target, specs, args.k), args.max_new_tokens,
               args.repeats)
  write_json(report, args.json)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
