"""A draft model in jspec against transformers' assisted generation, same weights, one process.

    python -m jspec.bench.assisted --draft checkpoints/smollm2-draft [--target smollm2]
        [--k 4] [--per-kind 2] [--max-new-tokens 64] [--repeats 3] [--json out.jsonl]

The target is one GGUF file read by both libraries (`jspec.bench.transformers_backend`).
The draft is a folder the method registry reads (`draft@dir=...`: a draft model saved by
`jspec.io.draft_checkpoint`, or any checkpoint `jspec.load` reads); transformers gets the
same draft weights through `jspec.save_hf` and runs it as `assistant_model` with K draft
tokens per round in two forms: always K (`assistant_confidence_threshold=0`), the rule of
jspec's fixed K, and transformers' default, which ends a round's drafting early once the
assistant's confidence falls below an adaptive threshold (from 0.4), set beside jspec's
`num_draft_tokens="auto"`. transformers' assistant scores the whole vocabulary; a jspec
draft saved with a reduced vocabulary scores only its ids (FR-Spec), which changes its
cost, not the target's output.

Per prompt (the `chat` workload's held-out prompts, `per_kind` of each kind, batch 1,
greedy), one runner times all six variants interleaved: jspec's plain and speculative
decoding (`plain`, `draft@k=K`, `draft@k=auto`) and transformers' greedy and assisted
generation (`transformers`, `transformers-assisted@k=K`, `...+confidence`). The printed
table (`tables.TABLES["assisted.tokens-per-s"]`, the one docs/benchmarks.md quotes) gives
tokens/s per kind, each speculative variant over its own library's greedy; jspec's
speculative answers must equal its greedy ones (exit code 1 otherwise).
"""

from __future__ import annotations

import argparse
import os

from jspec.bench import metrics as M
from jspec.bench import records as R
from jspec.bench import report, runner, workloads
from jspec.bench import transformers_backend as T

STUDY = "assisted"


def run(target_path: str, draft_dir: str, k: int, per_kind: int, max_new_tokens: int,
        repeats: int, workload=None, target=None, progress: bool = True) -> tuple[dict, list]:
  """(header, records) of the study (module docstring). workload: the prompts (default:
  `chat`, `per_kind` of each kind); target: the model already loaded from `target_path`
  (f32)."""
  from jspec.bench import methods, targets
  from jspec.bench.real import tag_kinds, jax_threads
  from jspec.planner.cache_folder import enable_compilation_cache

  enable_compilation_cache()
  target = targets.load(target_path) if target is None else target
  wl = workloads.load("chat").per_category(per_kind) if workload is None else workload
  folders = {"draft": draft_dir}
  fixed, auto = (methods.build(f"draft@k={x}", target, folders=folders) for x in (k, "auto"))
  print("loading the target and the draft in transformers", flush=True)
  hf = T.load(target_path)
  draft = getattr(fixed.drafter, "model", fixed.drafter)
  # transformers keeps the adapted threshold on the assistant across calls: its own copy.
  assistants = [T.from_jspec(draft), T.from_jspec(draft)]
  variants = [runner.plain(), runner.Variant(f"draft@k={k}", fixed, axes={"k": k}),
              runner.Variant("draft@k=auto", auto, axes={"k": "auto"}), T.greedy(hf),
              T.assisted(hf, assistants[0], k), T.assisted(hf, assistants[1], k, 0.4)]
  print(f"batch 1, {len(wl.prompts)} prompts, {len(variants)} variants, {repeats} repeats",
        flush=True)
  res = runner.run(target, variants, wl, runner.Settings(max_new_tokens=max_new_tokens,
                                                         repeats=repeats, progress=progress),
                   STUDY, call=T.call)
  head = R.header(STUDY, {"k": k, "per_kind": per_kind, "max_new_tokens": max_new_tokens,
                          "repeats": repeats}, target=os.path.basename(target_path),
                  draft=os.path.basename(os.path.normpath(draft_dir)), jax_threads=jax_threads(),
                  mismatches=res.mismatches, **T.versions())
  return head, tag_kinds(res.records)


def main(argv=None) -> int:
  """The command line (module docstring)."""
  from jspec.bench import targets

  parser = argparse.ArgumentParser(prog="python -m jspec.bench.assisted",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF file")
  parser.add_argument("--draft", required=True, help="a draft-model folder")
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--per-kind", type=int, default=2)
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", help="write the records here (JSON lines under a header)")
  args = parser.parse_args(argv)
  head, recs = run(targets.resolve(args.target), args.draft, args.k, args.per_kind,
                   args.max_new_tokens, args.repeats)
  print(report.assisted_tokens_per_s(head, recs))
  print("tau (tokens per target call): " + ", ".join(
      f"{name} {M.tau(mine):.2f}" for name, mine in M.group(recs, "method").items()
      if name not in (runner.PLAIN, T.NAME)))
  if args.json:
    print(f"wrote {R.write(args.json, head, recs)}")
  if head["mismatches"]:
    print(f"ERROR: jspec's speculative answers differ from its greedy ones: "
          f"{head['mismatches']}")
    return 1
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
