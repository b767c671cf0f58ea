"""N-gram drafting against plain decoding: tau, measured speedup, matcher cost.

    python -m jspec.bench.ngram [--batches 1,4,16] [--k 4]    # the shipped code-target
    python -m jspec.bench.ngram --target PATH                  # any checkpoint
    python -m jspec.bench.ngram --random                       # random init: smoke only

Two prompt sets (the records' `category`), built per row from held-out Python files of the
standard library (the shipped target never trained on them; see jspec/training/corpus.py):

  restating   a file's tokens, a separator, then the same tokens again cut in
              half: a model that copies continues the second copy, which the
              n-gram drafter finds in the first (code edits, quoting answers).
  plain       the opening tokens of other files: ordinary completion.

Without a tokenizer on the checkpoint (and with the random-init fallback) the "files" are
random ids of the same shape. For every batch size, plain decoding and speculative
decoding with `NGram` (the default adaptive schedule, and with drafts_per_ngram=None,
which always proposes K) run through the harness's runner (compiled first, timed as
interleaved repeats, greedy answers compared with plain's, EOS ignored). tau = tokens
emitted / target calls; speedup over plain paired by repeat (`metrics.speedup`). Then the
matcher's cost: `NGram.propose` jitted alone (`costs.round_time`) against one target
verify call (K+1 tokens) at the same batch and cache length, and the ideal speedup
(docs/measurement.md, `metrics.predicted_speedup`) from those times.

A random-init target's acceptance says nothing about real text: a random model neither
copies its prompt nor writes text; what it accepts comes from chance matches and from
greedy loops.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from jspec.bench import costs
from jspec.bench import metrics as M
from jspec.bench import report, runner
from jspec.bench import workloads as W

STUDY = "ngram"


def load_target(args):
  """--target, else the shipped code-target, else (--random) a random-init model."""
  import jax.numpy as jnp

  import jspec
  from jspec.bench import targets

  if args.target:
    return targets.load(args.target, dtype=args.dtype)
  if not args.random:
    from jspec.io import shipped
    args.target = os.path.join(shipped.checkpoints_dir(), shipped.TARGET)
    return targets.load(args.target, dtype=args.dtype or "float32")
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
  if model.tokenizer is None:
    return rng.integers(0, model.vocab_size, size=length).tolist()
  with open(path, encoding="utf-8", errors="replace") as f:
    ids = model.tokenizer.encode(f.read(), add_special_tokens=False)[0]
  return (ids * (-(-length // max(len(ids), 1))))[:length]


def workload(model, batch: int, length: int, seed: int) -> W.Workload:
  """`batch` restating rows, then `batch` plain ones, `length` tokens each."""
  rng = np.random.default_rng(seed)
  files = source_files(2 * batch)
  separator = [] if model.tokenizer is None else model.tokenizer.encode(
      "\n\n# The same file once more:\n", add_special_tokens=False)[0]
  body = (2 * (length - len(separator))) // 3  # body + separator + half the body = length
  rows = []
  for b in range(batch):
    ids = file_ids(model, files[b], body, rng)
    rows.append(("restating", (ids + separator + ids)[:length]))
  rows += [("plain", file_ids(model, files[batch + b], length, rng)) for b in range(batch)]
  return W.Workload("stdlib", tuple(W.Prompt(f"{kind}-{i % batch}", kind, ids=tuple(r))
                                    for i, (kind, r) in enumerate(rows)))


def variants(vocab: int, k: int, max_ngram: int = 3, temperature: float = 0.0) -> list:
  """Plain decoding; NGram's adaptive schedule ("ngram") and always K ("ngram-fullK")."""
  import jspec
  from jspec.bench.methods import Built

  return [runner.plain(temperature)] + [
      runner.Variant(name, Built(jspec.NGram(vocab, max_ngram=max_ngram, **kw), k, name),
                     temperature, {"k": k})
      for name, kw in (("ngram", {}), ("ngram-fullK", {"drafts_per_ngram": None}))]


def run(model, batches=(1, 4, 16), k: int = 4, prompt_tokens: int = 192, max_new: int = 64,
        repeats: int = 5, temperature: float = 0.0, max_ngram: int = 3,
        progress: bool = True) -> tuple[runner.Result, dict]:
  """The records of every batch size, and {batch: {"t_step", "t_verify", "t_round"}} (s)."""
  vs = variants(model.vocab_size, k, max_ngram, temperature)
  recs, mismatches, per_batch = [], [], {}
  for B in batches:
    _, S = runner.shapes(prompt_tokens, max_new)
    per_batch[B] = {"t_step": costs.call_time(model, B, 1, S, prefix=prompt_tokens),
                    "t_verify": costs.call_time(model, B, k + 1, S, prefix=prompt_tokens),
                    "t_round": costs.round_time(vs[1].built.drafter, B, k, S,
                                                prefix=prompt_tokens),
                    "cache_length": S}
    ran = runner.run(model, vs, workload(model, B, prompt_tokens, seed=B), runner.Settings(
        max_new_tokens=max_new, repeats=repeats, batch=B, eos=False, progress=progress),
        STUDY)
    recs += ran.records
    mismatches += ran.mismatches
  return runner.Result(recs, mismatches), per_batch


def table(recs, per_batch: dict) -> str:
  """Per batch, prompt set and drafter: tau, median ms, speedup, ideal speedup."""
  out = [["batch", "prompts", "drafter", "tau", "plain ms", "spec ms", "speedup", "ideal"]]
  for (B, kind), mine in M.group(recs, "batch", "category").items():
    base = report.base_of(recs, mine)
    c = per_batch[B]
    for name, part in M.group(mine, "method").items():
      if name == base[0].method:
        continue
      ideal = M.predicted_speedup(M.tau(part), c["t_step"], c["t_verify"], c["t_round"])
      out.append([str(B), kind, name, f"{M.tau(part):.2f}", f"{M.seconds(base) * 1e3:.1f}",
                  f"{M.seconds(part) * 1e3:.1f}", f"{M.speedup(base, part):.2f}x",
                  f"{ideal:.2f}x"])
  return report.markdown(out)


def costs_lines(per_batch: dict, k: int) -> str:
  """The matcher's cost per round against one verify call, per batch."""
  return "\n".join(
      f"batch {B:>2}: propose {c['t_round'] * 1e3:.3f} ms = {c['t_round'] / c['t_verify']:.1%} "
      f"of a verify call ({k + 1} tokens, {c['t_verify'] * 1e3:.2f} ms); 1-token step "
      f"{c['t_step'] * 1e3:.2f} ms (cache length {c['cache_length']})"
      for B, c in per_batch.items())


def main(argv=None) -> int:
  """The command line (module docstring)."""
  p = argparse.ArgumentParser(prog="python -m jspec.bench.ngram",
                              description=__doc__.split("\n")[0])
  p.add_argument("--target", default=None,
                 help="a target jspec.bench.targets resolves (default: the shipped code-target)")
  p.add_argument("--random", action="store_true", help="random-init target (smoke run)")
  p.add_argument("--dtype", default=None, help="cast params on load, e.g. bfloat16")
  p.add_argument("--batches", default="1,4,16")
  p.add_argument("--k", type=int, default=4, help="num_draft_tokens")
  p.add_argument("--prompt-tokens", type=int, default=192)
  p.add_argument("--max-new", type=int, default=64)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--max-ngram", type=int, default=3)
  p.add_argument("--json", help="write the records here (JSON lines)")
  # Random-init fallback only.
  p.add_argument("--vocab", type=int, default=2048)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  args = p.parse_args(argv)
  model = load_target(args)
  print(f"target: {args.target or 'random init'}  params {model.num_params() / 1e6:.1f}M  "
        f"vocab {model.vocab_size}  K {args.k}  prompt {args.prompt_tokens}  new "
        f"{args.max_new}  T {args.temperature}  tokenizer "
        f"{'yes' if model.tokenizer is not None else 'no (random ids)'}")
  batches = [int(b) for b in args.batches.split(",")]
  ran, per_batch = run(model, batches, args.k, args.prompt_tokens, args.max_new, args.repeats,
                       args.temperature, args.max_ngram)
  settings = {key: getattr(args, key) for key in ("k", "prompt_tokens", "max_new", "repeats",
                                                  "temperature", "max_ngram")}
  return report.finish(ran, STUDY, dict(settings, batches=batches), {
      f"medians of {args.repeats} interleaved repeats after compilation": table(
          ran.records, per_batch),
      "matcher cost per round (NGram.propose jitted alone) against one target call":
          costs_lines(per_batch, args.k)}, args.json, target=args.target or "random init",
      costs={str(B): c for B, c in per_batch.items()})


if __name__ == "__main__":
  raise SystemExit(main())
