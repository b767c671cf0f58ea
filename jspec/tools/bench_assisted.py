"""A draft model in jspec against transformers' assisted generation, same weights, one process.

    python -m jspec.tools.bench_assisted --draft checkpoints/smollm2-draft [--target smollm2]
        [--k 4] [--per-kind 2] [--max-new-tokens 64] [--repeats 3] [--json out.json]

The target is one GGUF file read by both libraries (`jspec.tools.bench_real`). The draft
is a folder `jspec measure --drafter` reads (a draft model saved by
`jspec.io.draft_checkpoint`, or any checkpoint `jspec.load` reads); transformers gets the
same draft weights through `jspec.save_hf` and runs it as `assistant_model` with K draft
tokens per round (`num_assistant_tokens_schedule="constant"`) in two forms: always K
(`assistant_confidence_threshold=0`), the rule of jspec's fixed K, and transformers'
default, which stops a round's drafting early once the assistant's confidence falls
below an adaptive threshold (from 0.4), set beside jspec's `num_draft_tokens="auto"`. transformers' assistant scores the whole vocabulary; a jspec draft
saved with a reduced vocabulary scores only its ids (FR-Spec), which changes its cost,
not the target's output.

Per prompt kind (held-out chat prompts, batch 1, greedy): tokens/s of jspec's plain
and speculative decoding and of transformers' greedy and assisted generation, each
speculative one over its own library's plain one, jspec's over transformers', tau, and
whether each speculative answer equals its library's greedy answer. Timing as
`jspec.tools.bench_timing`: one untimed run of every variant, then turns within each
repeat, ratios as medians over repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile


def hf_draft(draft_model, directory: str):
  """The draft's weights as a transformers model (f32, eval mode), through `jspec.save_hf`."""
  import torch
  import transformers

  from jspec.io.checkpoint import save_hf

  save_hf(draft_model, directory)
  return transformers.AutoModelForCausalLM.from_pretrained(directory,
                                                           dtype=torch.float32).eval()


def run(target_path: str, draft_dir: str, k: int, per_kind: int, max_new_tokens: int,
        repeats: int, prompts=None, target=None) -> dict:
  """The report (module docstring). prompts: [(kind, token ids)] (default: the held-out
  chat prompts, `per_kind` of each kind); target: the model already loaded from
  `target_path` (f32)."""
  from jspec.planner.cache_folder import enable_compilation_cache
  from jspec.io import checkpoint
  from jspec.tools import bench_timing
  from jspec.tools import real_sections as R
  from jspec.tools.bench_real import Settings, default_prompts
  from jspec.bench.methods import from_folder

  enable_compilation_cache()
  if target is None:
    target = checkpoint.load(target_path, dtype="float32")
  drafter = from_folder(draft_dir, target)
  s = Settings(k=k, max_new_tokens=max_new_tokens, repeats=repeats, per_kind=per_kind)
  prompts = default_prompts(target, per_kind) if prompts is None else prompts
  P, S = R.shapes(prompts, s)
  eos = tuple(target.eos_ids)
  print("loading the target and the draft in transformers", flush=True)
  hf = R.load_transformers(target_path)
  with tempfile.TemporaryDirectory() as tmp:
    hf_assistant = hf_draft(getattr(drafter, "model", drafter), os.path.join(tmp, "fixed"))
    # transformers keeps the adapted threshold on the assistant across calls: its own copy.
    hf_assistant_adaptive = hf_draft(getattr(drafter, "model", drafter),
                                     os.path.join(tmp, "adaptive"))
  variants = {
      "jspec_greedy": lambda ids: R.jspec_call(target, [ids], P, S, s),
      f"jspec_draft@{k}": lambda ids: R.jspec_call(target, [ids], P, S, s, drafter, k),
      "transformers_greedy": lambda ids: R.transformers_call(hf, ids, s, eos),
      "jspec_draft@auto": lambda ids: R.jspec_call(target, [ids], P, S, s, drafter, "auto"),
      f"transformers_assisted@{k}": lambda ids: R.transformers_call(
          hf, ids, s, eos, assistant=hf_assistant, num_assistant_tokens=k,
          num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0),
      f"transformers_assisted@{k}+confidence": lambda ids: R.transformers_call(
          hf, ids, s, eos, assistant=hf_assistant_adaptive, num_assistant_tokens=k,
          num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.4),
  }
  kinds = sorted({kind for kind, _ in prompts}, key=[kind for kind, _ in prompts].index)
  by_kind = {kind: [ids for kk, ids in prompts if kk == kind] for kind in kinds}
  calls = {(kind, name): R.many([make(ids) for ids in by_kind[kind]])
           for kind in kinds for name, make in variants.items()}
  print(f"batch 1, {len(prompts)} prompts, {len(variants)} variants, {repeats} repeats",
        flush=True)
  res = bench_timing.side_by_side(calls, repeats)
  for name in variants:
    parts = [res[(kind, name)] for kind in kinds]
    times = [sum(t) for t in zip(*(p["times"] for p in parts))]
    res[("all", name)] = {"time": statistics.median(times), "times": times,
                          "out": R.Runs([o for p in parts for o in p["out"].outs])}
  jd, ta = f"jspec_draft@{k}", f"transformers_assisted@{k}"
  ja, tc = "jspec_draft@auto", f"transformers_assisted@{k}+confidence"
  report = {"target": os.path.basename(target_path), "draft": os.path.basename(
      os.path.normpath(draft_dir)), "k": k, "max_new_tokens": max_new_tokens,
            "repeats": repeats, "torch_threads": __import__("torch").get_num_threads(),
            "jax_threads": R.jax_threads(), "kinds": {}}
  for kind in kinds + ["all"]:
    row = {name: R.rate(res[(kind, name)]) for name in variants}
    out = res[(kind, jd)]["out"]
    row["tau"] = out.count() / max(out.calls(), 1)
    row["jspec_speedup"] = R.rate_ratio(res[(kind, jd)], res[(kind, "jspec_greedy")])
    row["transformers_speedup"] = R.rate_ratio(res[(kind, ta)],
                                                res[(kind, "transformers_greedy")])
    row["jspec_over_transformers_assisted"] = R.rate_ratio(res[(kind, jd)], res[(kind, ta)])
    row["auto_speedup"] = R.rate_ratio(res[(kind, ja)], res[(kind, "jspec_greedy")])
    row["confidence_speedup"] = R.rate_ratio(res[(kind, tc)],
                                              res[(kind, "transformers_greedy")])
    row["jspec_auto_over_transformers_confidence"] = R.rate_ratio(res[(kind, ja)],
                                                                   res[(kind, tc)])
    row["jspec_equal_to_greedy"] = all(_same(res[(kind, name)], res[(kind, "jspec_greedy")])
                                       for name in (jd, ja))
    row["transformers_equal_to_greedy"] = all(
        _same(res[(kind, name)], res[(kind, "transformers_greedy")]) for name in (ta, tc))
    report["kinds"][kind] = row
    print(f"  {kind:9s} tau {row['tau']:.2f}  jspec draft {row['jspec_speedup']:.2f}x "
          f"({row[jd]['tokens_per_s']:.1f} tok/s)  transformers assisted "
          f"{row['transformers_speedup']:.2f}x ({row[ta]['tokens_per_s']:.1f} tok/s)  "
          f"jspec / transformers {row['jspec_over_transformers_assisted']:.2f}x; adaptive: jspec "
          f"auto {row['auto_speedup']:.2f}x, transformers confidence "
          f"{row['confidence_speedup']:.2f}x, jspec / transformers "
          f"{row['jspec_auto_over_transformers_confidence']:.2f}x", flush=True)
  return report


def _same(a, b) -> bool:
  """Whether two timed variants gave the same answers, prompt by prompt."""
  from jspec.tools.real_sections import leading_agreement

  return all(leading_agreement(x, y) == len(x) == len(y)
             for x, y in zip(a["out"].answers(), b["out"].answers()))


def main(argv=None) -> int:
  """The command line (module docstring)."""
  from jspec.bench import targets
  from jspec.tools.bench_real import write_json

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF file")
  parser.add_argument("--draft", required=True, help="a draft-model folder")
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--per-kind", type=int, default=2)
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", help="write the report here")
  args = parser.parse_args(argv)
  report = run(targets.resolve(args.target), args.draft, args.k, args.per_kind, args.max_new_tokens,
               args.repeats)
  write_json(report, args.json)
  bad = [kind for kind, row in report["kinds"].items() if not row["jspec_equal_to_greedy"]]
  if bad:
    print(f"ERROR: jspec's speculative answers differ from its greedy ones on {bad}")
    return 1
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
