"""Live load on `jspec.Engine`: Poisson arrivals at rising request rates, plain decoding
against n-gram at a fixed K and `"auto"`, on SmolLM2-135M-Instruct.

    python benchmarks/engine_load.py [--rates 0.2,1,4] [--requests 24] [--slots 32]
        [--max-new 64] [--workloads restate,free] [--json PATH]

Workloads: the held-out chat prompts of one kind, cycled ("restate": edits and rewrites
of text in the prompt, where lookup pays; "free": the explaining and question prompts).
At each rate, each method's engine (built and warmed up once: every batch bucket
compiled) serves the same arrival times and prompts, methods in alternating order from
one rate to the next. Per method and rate: output tokens/s over the run (first arrival
to last answer), p50 / p99 time to first token and time per output token (after the
first), the batch sizes the engine ran at, and for speculation tau (tokens per target
call) and the rounds at each K. Greedy, EOS ignored: every method's answers are checked
equal.
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time

import numpy as np

import jspec
from jspec.bench import targets
from jspec.tools.demo import chat_prompts

METHODS = ("plain", "ngram4", "auto")


def _engine(model, method, slots, cache_length):
  if method == "plain":
    return jspec.Engine(model, slots=slots, cache_length=cache_length)
  k = 4 if method == "ngram4" else "auto"
  return jspec.Engine(model, jspec.NGram(model.vocab_size), num_draft_tokens=k, slots=slots,
                      cache_length=cache_length)


def _serve(engine, prompts, arrivals, max_new):
  """Submit prompts[i] at arrivals[i] seconds from now; wait for every answer."""
  handles = [None] * len(prompts)
  t0 = time.perf_counter()

  def feed():
    for i, (p, at) in enumerate(zip(prompts, arrivals)):
      delay = t0 + at - time.perf_counter()
      if delay > 0:
        time.sleep(delay)
      handles[i] = engine.submit(p, max_new_tokens=max_new)

  runs_before = dict(engine.runs_by_batch)
  k_before = dict(engine.rounds_by_k)
  feeder = threading.Thread(target=feed)
  feeder.start()
  feeder.join()
  outs = [h.result(timeout=3600) for h in handles]
  end = max(o.submitted + o.token_times[-1] for o in outs)
  tokens = sum(len(o.tokens) for o in outs)
  ttft = [o.time_to_first_token for o in outs]
  tpot = [(o.token_times[-1] - o.token_times[0]) / (len(o.tokens) - 1) for o in outs
          if len(o.tokens) > 1]
  batches = {b: n - runs_before.get(b, 0) for b, n in engine.runs_by_batch.items()
             if n - runs_before.get(b, 0)}
  by_k = {k: n - k_before.get(k, 0) for k, n in engine.rounds_by_k.items()}
  return dict(tokens_per_s=tokens / (end - t0), seconds=end - t0, tokens=tokens,
              ttft_p50=float(np.percentile(ttft, 50)), ttft_p99=float(np.percentile(ttft, 99)),
              tpot_p50=float(np.percentile(tpot, 50)), tpot_p99=float(np.percentile(tpot, 99)),
              tau=tokens / max(sum(o.target_calls for o in outs), 1),
              runs_by_batch=batches, rounds_by_k=by_k), [o.tokens for o in outs]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rates", default="0.2,1,4", help="requests per second")
  parser.add_argument("--requests", type=int, default=24, help="per rate and method")
  parser.add_argument("--slots", type=int, default=32)
  parser.add_argument("--max-new", type=int, default=64)
  parser.add_argument("--cache-length", type=int, default=512)
  parser.add_argument("--methods", default=",".join(METHODS))
  parser.add_argument("--workloads", default="restate,free")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  try:
    path = targets.resolve(targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(str(e)) from None
  model = targets.load(path, dtype=None)
  tok = model.tokenizer
  kinds = {"restate": ("restate",), "free": ("explain", "question")}
  methods = args.methods.split(",")
  engines = {}
  for m in methods:
    t = time.perf_counter()
    engines[m] = _engine(model, m, args.slots, args.cache_length)
    engines[m].warmup(prompt_buckets=[64, 128])
    print(f"{m}: built and warmed up in {time.perf_counter() - t:.0f} s", flush=True)
  rows = []
  rng = np.random.default_rng(args.seed)
  for w in args.workloads.split(","):
    pool = [tok.apply_chat_template([{"role": "user", "content": p["content"]}],
                                    add_generation_prompt=True, tokenize=True)
            for p in chat_prompts() if p["kind"] in kinds[w]]
    prompts = [pool[i % len(pool)] for i in range(args.requests)]
    for r, rate in enumerate(float(x) for x in args.rates.split(",")):
      arrivals = np.cumsum(rng.exponential(1.0 / rate, size=args.requests))
      arrivals -= arrivals[0]
      answers = {}
      for m in (methods if r % 2 == 0 else methods[::-1]):
        result, answers[m] = _serve(engines[m], prompts, arrivals, args.max_new)
        rows.append(dict(workload=w, rate=rate, method=m, **result))
        print(f"{w} {rate:g} req/s {m}: {result['tokens_per_s']:.1f} tok/s, TTFT p50/p99 "
              f"{result['ttft_p50']:.2f}/{result['ttft_p99']:.2f} s, TPOT p50/p99 "
              f"{1000 * result['tpot_p50']:.0f}/{1000 * result['tpot_p99']:.0f} ms, tau "
              f"{result['tau']:.2f}, runs by batch {result['runs_by_batch']}, rounds by K "
              f"{result['rounds_by_k']}", flush=True)
      equal = all(answers[m] == answers[methods[0]] for m in methods)
      rows[-1]["equal"] = equal
      if not equal:
        print("  answers differ between methods")
  for e in engines.values():
    e.close()
  print()
  print("| workload | req/s | method | tok/s | x plain | TTFT p50 / p99 s | TPOT p50 / p99 ms | "
        "tau | rounds by K |")
  print("|---|---|---|---|---|---|---|---|---|")
  for row in rows:
    plain = next((x for x in rows if x["workload"] == row["workload"]
                  and x["rate"] == row["rate"] and x["method"] == "plain"), None)
    ratio = row["tokens_per_s"] / plain["tokens_per_s"] if plain else float("nan")
    print(f"| {row['workload']} | {row['rate']:g} | {row['method']} | "
          f"{row['tokens_per_s']:.1f} | {ratio:.2f} | {row['ttft_p50']:.2f} / "
          f"{row['ttft_p99']:.2f} | {1000 * row['tpot_p50']:.0f} / {1000 * row['tpot_p99']:.0f} "
          f"| {row['tau']:.2f} | {row['rounds_by_k'] or '-'} |")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(study="engine_load", args=vars(args), rows=rows,
                     machine=dict(platform=platform.platform(),
                                  jax=__import__("jax").__version__)), f, indent=1)


if __name__ == "__main__":
  main()
