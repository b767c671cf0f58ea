"""N-gram drafting against plain decoding: tau, measured speedup, matcher cost.

    python benchmarks/ngram_bench.py [--batches 1,4,16] [--k 4]    # shipped code-target
    python benchmarks/ngram_bench.py --target PATH                  # any checkpoint
    python benchmarks/ngram_bench.py --random                       # random init: smoke only

Two prompt sets, built per row from held-out Python files of the standard library
(the shipped target never trained on them; see jspec/training/corpus.py):

  restating   a file's tokens, a separator, then the same tokens again cut in
              half: a model that copies continues the second copy, which the
              n-gram drafter finds in the first (code edits, quoting answers).
  plain       the opening tokens of other files: ordinary completion.

Without a tokenizer on the checkpoint (and with the random-init fallback) the
"files" are random ids of the same shape. For every batch size, baseline decoding
and speculative decoding with `NGram` (the default adaptive schedule, and with
drafts_per_ngram=None, which always proposes K) run in one process, compiled
first, then timed as interleaved repeats; the table gives medians. tau = tokens
emitted / target calls. Then the matcher's cost: `NGram.propose` jitted alone
against one target verify call (K+1 tokens) at the same batch and cache length,
and the ideal speedup (docs/measurement.md) from those times.

A random-init target's acceptance says nothing about real text: a random model
neither copies its prompt nor writes text; what it accepts comes from chance
matches and from greedy loops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jspec
from jspec.bench import costs
from jspec.core.stats import ideal_speedup
from jspec.core.drafter import DraftContext
from jspec.drafters.ngram import NGram

CACHE_BUCKET = 128  # as jspec.planner.api: the program's cache length for the matcher timing


def load_target(args) -> jspec.Model:
  if args.target:
    return jspec.load(args.target, dtype=args.dtype)
  if not args.random:
    from jspec.io import shipped
    args.target = os.path.join(shipped.checkpoints_dir(), shipped.TARGET)
    return jspec.load(args.target, dtype=args.dtype or "float32")
  print("WARNING: no --target given: using a RANDOM-INIT model. Acceptance, tau and speedup "
        "below are MEANINGLESS for real text (a random model does not copy its prompt; what "
        "it accepts comes from chance and greedy loops); this run only checks that the "
        "benchmark works.\n", file=sys.stderr)
  config = jspec.models.TransformerConfig(
      vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
      num_hidden_layers=args.layers, num_attention_heads=max(args.hidden // 64, 1),
      num_key_value_heads=max(args.hidden // 128, 1), max_position_embeddings=4096,
      initializer_range=0.3)
  return jspec.models.init(config, seed=0, dtype=args.dtype or jnp.float32)


def source_files(count: int) -> list[str]:
  """`count` held-out standard-library Python files of at least 8 KB, in a fixed order."""
  from jspec.training import corpus

  root = corpus.stdlib_root()
  names = [n for n in corpus.list_files(root) if corpus.is_heldout(n)
           and os.path.getsize(os.path.join(root, n)) >= 8192]
  if not names:
    raise SystemExit(f"no held-out Python files found in {root}")
  return [os.path.join(root, names[i % len(names)]) for i in range(count)]


def file_ids(model, path: str, length: int, rng) -> list[int]:
  """`length` token ids of a file's body, or random ids without a tokenizer."""
  tokenizer = model.tokenizer
  if tokenizer is None:
    return rng.integers(0, model.vocab_size, size=length).tolist()
  with open(path, encoding="utf-8", errors="replace") as f:
    text = f.read()
  ids = tokenizer.encode(text, add_special_tokens=False)[0]
  return (ids * (-(-length // max(len(ids), 1))))[:length]


def build_prompts(model, batch: int, length: int, seed: int):
  """(restating, plain) prompt lists, `length` tokens each row."""
  rng = np.random.default_rng(seed)
  files = source_files(2 * batch)
  separator = [] if model.tokenizer is None else model.tokenizer.encode(
      "\n\n# The same file once more:\n", add_special_tokens=False)[0]
  body = (2 * (length - len(separator))) // 3  # body + separator + half the body = length
  restating, plain = [], []
  for b in range(batch):
    ids = file_ids(model, files[b], body, rng)
    restating.append((ids + separator + ids)[:length])
    plain.append(file_ids(model, files[batch + b], length, rng))
  return restating, plain


def timed(fn):
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return time.perf_counter() - t0, out


def tau_of(out) -> float:
  return float(np.sum(out.lengths)) / max(int(np.sum(out.stats.target_calls)), 1)


def run_batch(model, prompts, variants, args):
  """Median wall time and tau per variant, interleaved repeats after a compile."""
  kw = dict(max_new_tokens=args.max_new, temperature=args.temperature, eos_id=())
  calls = {"baseline": lambda: jspec.generate(model, prompts, **kw)}
  for name, drafter in variants.items():
    calls[name] = (lambda d: lambda: jspec.speculative_generate(
        model, d, prompts, num_draft_tokens=args.k, **kw))(drafter)
  times = {name: [] for name in calls}
  outs = {name: fn() for name, fn in calls.items()}  # compile
  for out in outs.values():
    jax.block_until_ready(out.tokens)
  for _ in range(args.repeats):
    for name, fn in calls.items():
      t, outs[name] = timed(fn)
      times[name].append(t)
  return {name: (statistics.median(times[name]), tau_of(outs[name])) for name in calls}


def matcher_time(drafter, batch: int, cache_length: int, k: int, vocab: int, repeats=50) -> float:
  propose = jax.jit(lambda d, c: d.propose(None, c, k, None, None)[:2])
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, vocab, size=(batch, cache_length)), jnp.int32)
  lengths = jnp.full((batch,), cache_length - k - 2, jnp.int32)
  context = DraftContext(tokens, lengths)
  jax.block_until_ready(propose(drafter, context))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(propose(drafter, context))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--target", default=None,
                      help="checkpoint for jspec.load (default: the shipped code-target)")
  parser.add_argument("--random", action="store_true", help="random-init target (smoke run)")
  parser.add_argument("--dtype", default=None, help="cast params on load, e.g. bfloat16")
  parser.add_argument("--batches", default="1,4,16")
  parser.add_argument("--k", type=int, default=4, help="num_draft_tokens")
  parser.add_argument("--prompt-tokens", type=int, default=192)
  parser.add_argument("--max-new", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--temperature", type=float, default=0.0)
  parser.add_argument("--max-ngram", type=int, default=3)
  # Random-init fallback only.
  parser.add_argument("--vocab", type=int, default=2048)
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--layers", type=int, default=4)
  args = parser.parse_args(argv)

  model = load_target(args)
  vocab = model.vocab_size
  batches = [int(b) for b in args.batches.split(",")]
  variants = {
      "ngram": NGram(vocab, max_ngram=args.max_ngram),
      "ngram-fullK": NGram(vocab, max_ngram=args.max_ngram, drafts_per_ngram=None),
  }
  print(f"target: {args.target or 'random init'}  params {model.num_params() / 1e6:.1f}M  "
        f"vocab {vocab}  dtype {jnp.dtype(model.dtype).name}  K {args.k}  prompt "
        f"{args.prompt_tokens}  new {args.max_new}  T {args.temperature}  "
        f"tokenizer {'yes' if model.tokenizer is not None else 'no (random ids)'}")
  print(f"medians of {args.repeats} interleaved repeats after compilation\n")
  header = f"{'batch':>5}  {'prompts':<10} {'drafter':<12} {'tau':>5}  {'base ms':>8}  " \
           f"{'spec ms':>8}  {'speedup':>7}  {'ideal':>6}"
  print(header)
  print("-" * len(header))
  cache_length = -(-(args.prompt_tokens + args.max_new + args.k + 1) // CACHE_BUCKET) * CACHE_BUCKET
  costs_at = {}
  for batch in batches:
    t_step = costs.call_time(model, batch, 1, cache_length, prefix=args.prompt_tokens)
    t_verify = costs.call_time(model, batch, args.k + 1, cache_length, prefix=args.prompt_tokens)
    t_match = matcher_time(variants["ngram"], batch, cache_length, args.k, vocab)
    costs_at[batch] = (t_step, t_verify, t_match)
    restating, plain = build_prompts(model, batch, args.prompt_tokens, seed=batch)
    for kind, prompts in (("restating", restating), ("plain", plain)):
      result = run_batch(model, prompts, variants, args)
      base_time = result["baseline"][0]
      for name in variants:
        spec_time, tau = result[name]
        ideal = ideal_speedup(tau, args.k, t_step, t_verify, t_match / args.k)
        print(f"{batch:>5}  {kind:<10} {name:<12} {tau:>5.2f}  {base_time * 1e3:>8.1f}  "
              f"{spec_time * 1e3:>8.1f}  {base_time / spec_time:>6.2f}x  {ideal:>5.2f}x")
  print("\nmatcher cost per round (NGram.propose jitted alone, cache length "
        f"{cache_length}) vs one target call:")
  for batch, (t_step, t_verify, t_match) in costs_at.items():
    print(f"  batch {batch:>2}: propose {t_match * 1e3:.3f} ms = {t_match / t_verify:.1%} of a "
          f"verify call ({args.k + 1} tokens, {t_verify * 1e3:.2f} ms); 1-token step "
          f"{t_step * 1e3:.2f} ms")


if __name__ == "__main__":
  main()
