"""Live load on `jspec.Engine`: Poisson arrivals at rising request rates, plain decoding
against n-gram at a fixed K and `"auto"`, on SmolLM2-135M-Instruct.

    python benchmarks/engine_load.py [--rates 0.2,1,4] [--requests 24] [--slots 32]
        [--max-new 64] [--workloads restate,free] [--repeats 1] [--json PATH]

Workloads: the held-out chat prompts of one kind, cycled ("restate": edits and rewrites
of text in the prompt, where lookup pays; "free": the explaining and question prompts).
At each rate, each method's engine (built and warmed up once: every batch bucket
compiled) serves the same arrival times and prompts, methods in alternating order from
one run to the next; `--repeats N` runs each rate N times, each with fresh arrivals (axis
`repeat`), and the table gives medians over the runs of tok/s and of the ratio to plain
decoding in the same run. Per method and rate: output tokens/s over the run (first arrival
to last answer), p50 / p99 time to first token and time per output token (after the
first), the batch sizes the engine ran at, and for speculation tau (tokens per target
call) and the rounds at each K. Greedy, EOS ignored: every method's answers are checked
equal. Every request is a record of the harness (`jspec.bench.records`: axes rate and
arrival index, extra its send time and each token's arrival, seconds from the run's start);
the figures are functions of those records (`jspec.bench.metrics`), and `--json` writes them
under a header holding each run's batches and rounds by K.
"""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time

import numpy as np

import jspec
from jspec.bench import records as R
from jspec.bench import report, targets, workloads

METHODS = ("plain", "ngram4", "auto")


def _engine(model, method, slots, cache_length):
  if method == "plain":
    return jspec.Engine(model, slots=slots, cache_length=cache_length)
  k = 4 if method == "ngram4" else "auto"
  return jspec.Engine(model, jspec.NGram(model.vocab_size), num_draft_tokens=k, slots=slots,
                      cache_length=cache_length)


def _serve(engine, prompts, arrivals, max_new, **fields):
  """Submit prompts[i] = (id, token ids) at arrivals[i] seconds from now; wait for every
  answer. Returns (a record per request, the run's batches and rounds by K, the answers)."""
  handles = [None] * len(prompts)
  t0 = time.perf_counter()

  def feed():
    for i, (p, at) in enumerate(zip(prompts, arrivals)):
      delay = t0 + at - time.perf_counter()
      if delay > 0:
        time.sleep(delay)
      handles[i] = engine.submit(p[1], max_new_tokens=max_new)

  runs_before = dict(engine.runs_by_batch)
  k_before = dict(engine.rounds_by_k)
  feeder = threading.Thread(target=feed)
  feeder.start()
  feeder.join()
  outs = [h.result(timeout=3600) for h in handles]
  recs, axes = [], fields.pop("axes", {})
  for i, ((pid, _), o) in enumerate(zip(prompts, outs)):
    sent = o.submitted - t0
    times = [sent + t for t in o.token_times]
    recs.append(R.Record(study="engine-load", prompt=pid, axes=dict(axes, index=i),
                         tokens=len(o.tokens), calls=o.target_calls,
                         seconds=(times[-1] - sent,),
                         extra={"sent": sent, "end": times[-1], "chunk_times": times},
                         **fields))
  batches = {b: n - runs_before.get(b, 0) for b, n in engine.runs_by_batch.items()
             if n - runs_before.get(b, 0)}
  by_k = {k: n - k_before.get(k, 0) for k, n in engine.rounds_by_k.items()}
  return recs, dict(runs_by_batch=batches, rounds_by_k=by_k), [o.tokens for o in outs]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rates", default="0.2,1,4", help="requests per second")
  parser.add_argument("--requests", type=int, default=24, help="per rate and method")
  parser.add_argument("--slots", type=int, default=32)
  parser.add_argument("--max-new", type=int, default=64)
  parser.add_argument("--cache-length", type=int, default=512)
  parser.add_argument("--methods", default=",".join(METHODS))
  parser.add_argument("--workloads", default="restate,free")
  parser.add_argument("--repeats", type=int, default=1,
                      help="runs per rate, each with fresh arrivals, the methods' order "
                           "alternating from run to run; the table gives medians")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None)
  args = parser.parse_args(argv)
  path = targets.resolve_or_exit(targets.SMOLLM2)
  model = targets.load(path, dtype=None)
  tok = model.tokenizer
  methods = args.methods.split(",")
  engines = {}
  for m in methods:
    t = time.perf_counter()
    engines[m] = _engine(model, m, args.slots, args.cache_length)
    engines[m].warmup(prompt_buckets=[64, 128])
    print(f"{m}: built and warmed up in {time.perf_counter() - t:.0f} s", flush=True)
  recs, runs = [], {}
  rng = np.random.default_rng(args.seed)
  for w in args.workloads.split(","):
    pool = [(p.id, workloads.encode(tok, p.messages))
            for p in workloads.load("restate" if w == "restate" else "free").prompts]
    prompts = [pool[i % len(pool)] for i in range(args.requests)]
    cell = 0
    for rate in (float(x) for x in args.rates.split(",")):
      for rep in range(args.repeats):
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=args.requests))
        arrivals -= arrivals[0]
        key = f"{w}/{rate:g}/{{}}" + (f"/{rep}" if rep else "")
        answers, served = {}, {}
        for m in (methods if cell % 2 == 0 else methods[::-1]):
          served[m], runs[key.format(m)], answers[m] = _serve(
              engines[m], prompts, arrivals, args.max_new, method=m, workload=w,
              axes={"rate": rate, "temperature": 0.0, "repeat": rep})
          res, run = report.load_figures(served[m]), runs[key.format(m)]
          print(f"{w} {rate:g} req/s {m} (repeat {rep}): {res['tokens_per_s']:.1f} tok/s, "
                f"TTFT p50/p99 {res['ttft_p50']:.2f}/{res['ttft_p99']:.2f} s, TPOT p50/p99 "
                f"{1000 * res['tpot_p50']:.0f}/{1000 * res['tpot_p99']:.0f} ms, tau "
                f"{res['tau']:.2f}, runs by batch {run['runs_by_batch']}, rounds by K "
                f"{run['rounds_by_k']}", flush=True)
        cell += 1
        equal = all(answers[m] == answers[methods[0]] for m in methods)
        for m in methods:  # every request's answer against the first method's
          recs += [dataclasses.replace(rec, equal=None if m == methods[0] else
                                       answers[m][i] == answers[methods[0]][i])
                   for i, rec in enumerate(served[m])]
        if not equal:
          print("  answers differ between methods")
  for e in engines.values():
    e.close()
  print()
  print(report.engine_load({"runs": runs}, recs))
  if args.json:
    R.write(args.json, R.header("engine-load", vars(args), runs=runs), recs)


if __name__ == "__main__":
  main()
