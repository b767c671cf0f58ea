"""Continuous batching on SmolLM2-135M-Instruct: what slots and live-length attention buy.

    python benchmarks/continuous_batching.py capacity [--batch 32] [--caches 256,4096]
    python benchmarks/continuous_batching.py many [--requests 128] [--slots 32]
        [--runs generate_many,static,vllm --vllm VENV --hf HF_DIR [--vllm-ngram K]]

capacity   the same 48 new tokens (greedy, EOS ignored) after 40-token prompts at one
           batch size, `generate` with each cache length; then the per-round cost
           alone, from the difference between 144 and 48 new tokens (prefill and
           allocation cancel out). Attention reads the cache only up to the longest
           live row, so the round cost should not depend on the cache length.
many       N requests with long-tailed answer lengths, new tokens drawn as
           min(384, max(8, lognormal(mu=3.8, sigma=0.9))) (median about 45), prompts
           cycled from the held-out chat prompts, greedy with EOS ignored: static
           batches of `slots` through `generate` against `generate_many` with `slots`
           rows. Every request's tokens are checked equal between the two. With
           `vllm` in --runs, vLLM's CPU build (benchmarks/vllm_setup.sh) serves the same
           token ids with `max_num_seqs=slots` in a worker process kept loaded
           (benchmarks/vllm_worker.py; f32, greedy, EOS ignored, prefix caching off,
           `--vllm-cores` its OpenMP threads), its repeats interleaved with jspec's; its
           tokens are compared with jspec's (agreement, not required: two numerics).

Each measurement runs once untimed (compiling it), then as repeats interleaved in
alternating order (`jspec.bench.runner.interleave`); tables come from the records
(`jspec.bench.report`: "capacity.cache", "many.static", "many.vllm"), and `--json` writes the
records under a header naming the machine and versions (`jspec.bench.records`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

import jspec
from jspec.bench import metrics as M
from jspec.bench import records as R
from jspec.bench import report, runner, targets
from jspec.bench.workloads import chat_prompts


def _model():
  path = targets.resolve_or_exit(targets.SMOLLM2)
  return targets.load(path, dtype=None)


def _prompts(model):
  tok = model.tokenizer
  return [tok.apply_chat_template([{"role": "user", "content": p["content"]}],
                                  add_generation_prompt=True, tokenize=True)
          for p in chat_prompts()]


def _interleaved(runs: dict, repeats: int) -> dict:
  """{name: [seconds per repeat]}: each run once untimed (compiling it), then the harness's
  interleaved repeats. A run returns nothing to wait on: it waits itself."""
  for run in runs.values():
    run()
  _, times = runner.interleave(runs, repeats, wait=lambda out: None)
  return times


def capacity(args) -> tuple[dict, list]:
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
  B = args.batch
  recs = [R.Record(study="capacity", method="plain", workload="capacity", prompt=f"{B} rows",
                   axes={"batch": B, "cache_length": S, "new_tokens": new, "temperature": 0.0},
                   tokens=B * new, seconds=tuple(times[(S, new)]))
          for S in caches for new in (48, 144)]
  head = R.header("capacity", {"batch": B, "repeats": args.repeats, "prompt_tokens": 40,
                               "eos": None, "temperature": 0.0},
                  cells="a record per cache length and new tokens: one `generate` call of the "
                        "whole batch, 40-token prompts, EOS ignored; target calls not recorded")
  print(f"batch {B}, 40-token prompts, greedy, EOS ignored; medians of {args.repeats}")
  print(report.capacity_cache(head, recs))
  for S in caches:
    at = {r.axes["new_tokens"]: r for r in recs if r.axes["cache_length"] == S}
    print(f"cache {S}: per round (144 - 48 tokens) "
          f"{1000 * (M.seconds([at[144]]) - M.seconds([at[48]])) / 96:.1f} ms")
  return head, recs


def many(args) -> tuple[dict, list]:
  model = _model()
  pool = _prompts(model)
  rng = np.random.default_rng(args.seed)
  N, B = args.requests, args.slots
  news = np.minimum(384, np.maximum(8, rng.lognormal(3.8, 0.9, size=N))).astype(int).tolist()
  if args.new:  # every request this many new tokens (--new 1: prefill and insertion alone)
    news = [args.new] * N
  prompts = [pool[i % len(pool)] for i in range(N)]
  outputs = {}
  wanted = args.runs.split(",")
  runs = {}

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

  if "generate_many" in wanted:
    runs["generate_many"] = slots
  if "static" in wanted:
    runs["static batches"] = static
  worker = None
  if "vllm" in wanted:
    worker = _vllm_worker(args, prompts, news)
    label = "vllm" + (f" ngram K={args.vllm_ngram}" if args.vllm_ngram else "")

    def vllm():
      worker.stdin.write("run\n")
      worker.stdin.flush()
      reply = json.loads(worker.stdout.readline())
      outputs["vllm"] = reply["tokens"]
    runs[label] = vllm
  try:
    times = _interleaved(runs, args.repeats)
  finally:
    if worker is not None:
      worker.stdin.write("quit\n")
      worker.stdin.flush()
      worker.wait(timeout=120)
  equal = None
  if "many" in outputs and "static" in outputs:
    equal = all(np.array_equal(outputs["many"][i, :news[i]], outputs["static"][i])
                for i in range(N))
  agreement = None
  if "many" in outputs and "vllm" in outputs:  # requests whose tokens all agree
    agreement = float(np.mean([list(outputs["many"][i, :news[i]]) == outputs["vllm"][i]
                               for i in range(N)]))
  total = sum(news)
  methods = {"generate_many": "generate_many", "static batches": "generate"}
  recs = [R.Record(study="many", method=methods.get(name, "vllm" + (
                       f"@ngram={args.vllm_ngram}" if args.vllm_ngram else "")),
                   workload="many", prompt=f"requests 0-{N - 1}",
                   axes={"slots": B, "requests": N, "temperature": 0.0}, tokens=total,
                   seconds=tuple(t), equal=None if name.startswith("vllm") else equal,
                   extra={"label": name})
          for name, t in times.items()]
  head = R.header("many", {"requests": N, "slots": B, "repeats": args.repeats,
                           "new_tokens": total, "eos": None, "temperature": 0.0,
                           "seed": args.seed, "new": args.new or None},
                  equal=equal, vllm_agreement=agreement,
                  vllm=None if worker is None else dict(cores=args.vllm_cores,
                                                        ngram=args.vllm_ngram),
                  cells="a record per way of serving: every request in one run, new tokens "
                        "summed; equal: generate_many's tokens equal static batches' for "
                        "every request (vllm_agreement: the share of requests whose tokens "
                        "equal vLLM's); target calls not recorded")
  print(f"{N} requests, {B} slots, {total} new tokens (median {np.median(news):.0f}, "
        f"max {max(news)}), greedy, EOS ignored; medians of {args.repeats}; "
        f"generate_many equal to static batches: {equal}; requests equal to vLLM's: "
        f"{agreement}")
  print(report.markdown([["", "s (median)", "tok/s"]] + [
      [r.extra["label"], f"{M.seconds([r]):.1f}", f"{M.tokens_per_s([r]):.1f}"] for r in recs]))
  mine = M.select(recs, method="generate_many")
  for r in recs:
    if mine and r is not mine[0]:
      print(f"generate_many / {r.extra['label']}: {M.speedup([r], mine):.2f}x (paired)")
  return head, recs


def _vllm_worker(args, prompts, news):
  """benchmarks/vllm_worker.py in vLLM's venv, loaded, warmed up and waiting."""
  if not args.vllm or not args.hf:
    raise SystemExit("--runs with vllm needs --vllm VENV (benchmarks/vllm_setup.sh) and --hf "
                     "DIR (jspec convert + jspec export-hf of the same model)")
  spec = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
  json.dump(dict(prompts=[list(map(int, p)) for p in prompts], max_new=news), spec)
  spec.close()
  env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=args.vllm_cores, VLLM_CPU_KVCACHE_SPACE="4")
  here = os.path.dirname(os.path.abspath(__file__))
  worker = subprocess.Popen(
      [os.path.join(args.vllm, "bin", "python"), os.path.join(here, "vllm_worker.py"),
       "--model", args.hf, "--requests", spec.name, "--max-num-seqs", str(args.slots),
       "--ngram", str(args.vllm_ngram)],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
  for line in worker.stdout:
    if line.strip() == "ready":
      return worker
  raise SystemExit(f"the vLLM worker ended before it was ready (exit {worker.wait()})")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("study", choices=("capacity", "many"))
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--caches", default="256,4096")
  parser.add_argument("--requests", type=int, default=128)
  parser.add_argument("--slots", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--new", type=int, default=0,
                      help="many: every request this many new tokens instead of the drawn "
                           "lengths (1: what prefill and insertion cost)")
  parser.add_argument("--runs", default="generate_many,static",
                      help="many: which of generate_many, static, vllm to time")
  parser.add_argument("--vllm", default=None, help="vLLM's venv (benchmarks/vllm_setup.sh)")
  parser.add_argument("--hf", default=None, help="the model as a Hugging Face folder, for vLLM")
  parser.add_argument("--vllm-ngram", type=int, default=0, help="vLLM's n-gram K (0: none)")
  parser.add_argument("--vllm-cores", default="0-1",
                      help="VLLM_CPU_OMP_THREADS_BIND: the cores of vLLM's compute threads")
  parser.add_argument("--json", default=None,
                      help="write the records (JSON lines under a header) here")
  args = parser.parse_args(argv)
  head, recs = (capacity if args.study == "capacity" else many)(args)
  if args.json:
    R.write(args.json, head, recs)


if __name__ == "__main__":
  main()
