"""Draft-free methods on a real model, per prompt set: lookahead (Jacobi) decoding against
plain decoding, n-gram lookup and suffix drafting, with latency percentiles.

    python -m jspec.tools.bench_lookahead [--target smollm2] [--per-kind 2]
        [--conversations 2] [--max-new-tokens 64] [--repeats 3] [--methods ...] [--json out.json]

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
import statistics

import jax
import numpy as np

from jspec.tools import latency

METHODS = {  # name: K; drafter built by `drafter`
    "ngram": 4,
    "suffix": 4,
    "lookahead": 3,  # window 5, 4-grams, 3 guesses: 1 + 9 + 14 = 24 tokens per verify
    "lookahead-small": 2,  # window 2, 3-grams, 1 guess: 1 + 2 + 3 = 6 tokens per verify
    "auto": "auto",  # n-gram lookup, K per round
    "auto-itl": "auto-itl",  # the same with AutoK(itl_bound=1.1)
}


def drafter(name: str, V: int, memory=None):
  """The drafter a METHODS name stands for (suffix drafting with `memory`)."""
  import jspec

  if name in ("ngram", "auto", "auto-itl"):
    return jspec.NGram(V)
  if name == "suffix":
    return jspec.Suffix(V, memory=memory)
  if name == "lookahead":
    return jspec.Lookahead(V, window=5, ngram=4, guesses=3)
  if name == "lookahead-small":
    return jspec.Lookahead(V, window=2, ngram=3, guesses=1)
  raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")


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


def run(target, sets: dict, methods=tuple(METHODS), max_new_tokens: int = 64, repeats: int = 3,
        log=print, extra: dict | None = None) -> dict:
  """Per set and method: tokens, tau, speedup over plain, latency percentiles.

  extra: more methods, {name: (drafter, speculative_generate keywords)} (trained heads
  with a K or a tree), run beside `methods`."""
  import jspec

  V = target.vocab_size
  extra = extra or {}
  methods = tuple(methods) + tuple(m for m in extra if m not in methods)

  def call(name, ids, mem):
    def go(stream=None):
      if name == "plain":
        return jspec.generate(target, [ids], max_new_tokens=max_new_tokens, stream=stream)
      if name in extra:
        made, kwargs = extra[name]
        return jspec.speculative_generate(target, made, [ids], max_new_tokens=max_new_tokens,
                                          stream=stream, **kwargs)
      k = jspec.AutoK(itl_bound=1.1) if name == "auto-itl" else METHODS[name]
      return jspec.speculative_generate(target, drafter(name, V, mem), [ids], num_draft_tokens=k,
                                        max_new_tokens=max_new_tokens, stream=stream)
    return go

  report = {"max_new_tokens": max_new_tokens, "repeats": repeats,
            "methods": {m: ({"k": METHODS[m]} if m in METHODS else
                            {k: str(v) for k, v in extra[m][1].items()}) for m in methods},
            "sets": {}}
  for set_name, prompts in sets.items():
    names = ["plain"] + [m for m in methods if m != "suffix" or set_name == "multi-turn"]
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
  parser.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  parser.add_argument("--per-kind", type=int, default=2)
  parser.add_argument("--conversations", type=int, default=2)
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--methods", default="ngram,suffix,lookahead,lookahead-small")
  parser.add_argument("--json", help="write the report here")
  args = parser.parse_args(argv)
  from jspec.tools.bench_real import load_target, write_json

  target = load_target(args.target)
  sets = prompt_sets(target, args.per_kind, args.conversations, args.max_new_tokens)
  report = run(target, sets, tuple(args.methods.split(",")), args.max_new_tokens, args.repeats)
  write_json(report, args.json)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
