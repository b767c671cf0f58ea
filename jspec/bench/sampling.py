"""Sampled decoding against greedy decoding: what top-p costs, plain and speculative.

    python -m jspec.bench.sampling [--target smollm2] [--batches 64,1] [--repeats 3]
        [--new 64] [--k 4] [--json out.jsonl]

The target is SmolLM2-135M-Instruct by default (`jspec.bench.targets`' smollm2, its
parameters as stored). Prompts are the held-out chat prompts (the workload "chat"), in the
model's chat template, cycled to fill the batch. For every batch size, four variants run
through the harness's runner (compiled first, timed as interleaved repeats, the order
alternating, so a slow spell of the machine hits all of them alike):

    plain               jspec.generate, temperature 0
    plain sampled       jspec.generate, temperature 0.8, top_p 0.9
    ngram               jspec.speculative_generate with jspec.NGram, K = 4, temperature 0
                        (its answers compared with plain's)
    ngram sampled       the same at temperature 0.8, top_p 0.9

Every row writes all `--new` tokens (EOS is ignored). `ratio` is a variant's tokens/s over
plain's (plain variants) or ngram's (speculative ones), each repeat's ratio taken in the
same repeat (`metrics.speedup`); tau is tokens per target call.
"""

from __future__ import annotations

import argparse

from jspec.bench import metrics as M
from jspec.bench import methods as registry
from jspec.bench import report, runner
from jspec.bench import workloads as W

STUDY = "sampling"
SAMPLED = {"temperature": 0.8, "top_p": 0.9}


def workload(batch: int, base: W.Workload | None = None) -> W.Workload:
  """`batch` rows of `base`'s prompts (default: the chat prompts), cycled."""
  base = base or W.load("chat")
  ps = base.prompts
  return W.Workload(base.name, tuple(
      W.Prompt(str(i), ps[i % len(ps)].category, ps[i % len(ps)].messages,
               text=ps[i % len(ps)].text, ids=ps[i % len(ps)].ids) for i in range(batch)))


def variants(target, k: int) -> list[runner.Variant]:
  """Plain and n-gram decoding, greedy and sampled (SAMPLED)."""
  ngram = registry.build("ngram", target, k=k)
  T, top_p = SAMPLED["temperature"], {"top_p": SAMPLED["top_p"]}
  return [runner.plain(), runner.Variant("plain sampled", None, T, options=top_p),
          runner.Variant("ngram", ngram, axes={"k": k}),
          runner.Variant("ngram sampled", ngram, T, {"k": k}, options=top_p)]


def run(target, batches=(64, 1), new: int = 64, k: int = 4, repeats: int = 3, base=None,
        progress: bool = True) -> runner.Result:
  """Every variant at every batch size, EOS ignored, seed 0."""
  recs, mismatches = [], []
  for B in batches:
    ran = runner.run(target, variants(target, k), workload(B, base), runner.Settings(
        max_new_tokens=new, repeats=repeats, batch=B, eos=False, seed=0, progress=progress),
        STUDY)
    recs += ran.records
    mismatches += ran.mismatches
  return runner.Result(recs, mismatches)


def table(recs) -> str:
  """Per batch and variant: tokens/s, ratio, tau, each repeat's seconds."""
  out = [["batch", "variant", "tokens/s", "ratio", "tau", "times (s)"]]
  for B, mine in M.group(recs, "batch").items():
    for name, part in M.group(mine, "method").items():
      base = M.select(mine, method="ngram" if name.startswith("ngram") else runner.PLAIN)
      out.append([str(B), name, f"{M.tokens_per_s(part):.1f}", f"{M.speedup(base, part):.2f}",
                  f"{M.tau(part):.2f}", " ".join(f"{t:.2f}" for t in part[0].seconds)])
  return report.markdown(out)


def main(argv=None) -> int:
  """The command line (module docstring)."""
  from jspec.bench import targets

  p = argparse.ArgumentParser(prog="python -m jspec.bench.sampling",
                              description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  p.add_argument("--batches", default="64,1")
  p.add_argument("--new", type=int, default=64, help="new tokens per row")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--k", type=int, default=4, help="NGram's num_draft_tokens")
  p.add_argument("--json", help="write the records here (JSON lines)")
  args = p.parse_args(argv)
  try:
    target = targets.load(args.target, dtype=None)
  except FileNotFoundError as e:
    raise SystemExit(str(e)) from None
  batches = [int(b) for b in args.batches.split(",")]
  ran = run(target, batches, args.new, args.k, args.repeats)
  settings = {"batches": batches, "new": args.new, "k": args.k, "repeats": args.repeats,
              "sampled": SAMPLED}
  return report.finish(ran, STUDY, settings, {
      f"greedy and sampled ({SAMPLED}), {args.new} new tokens per row": table(ran.records)},
      args.json, target=args.target)


if __name__ == "__main__":
  raise SystemExit(main())
