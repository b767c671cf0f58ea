"""`jspec bench`: baseline against every drafter, batch and K sweeps, and transformers.

    jspec bench [--batches 1,2,4,8,16,32,64] [--k 1,2,3,4,6] [--out docs/bench]
    jspec bench --device gpu          # larger random-init models: verify vs decode cost

One process, side by side; every variant is compiled first, then timed in
interleaved repeats. Times are medians; a speedup is the median over repeats of
baseline time / variant time within the same repeat (`paired_speedup`). Task
sets come from the shipped checkpoints' held-out token windows (jspec/io/shipped.py),
so nothing is downloaded:

  code      held-out code prompts (64 tokens), greedy completion;
  restate   a held-out window, a separator, then the window's first half again:
            the continuation restates earlier text (edits, quoting);
  sampled   the code prompts at temperature 0.8, top-p 0.95.

Sections of the JSON report (and the figures under --out):

  k_sweep      batch 1, code: tau, measured speedup and the ideal speedup from
               in-loop per-call costs (`profile.call_costs`: a round's calls
               back to back; "ideal_apart" from each call timed alone) for each
               drafter and K, plus "auto"; also the whole-round costs "auto" uses
               (`profile.round_costs`), and under "steady" the same comparison
               for rounds past a long generation's first quarter, without the
               call's fixed part (`steady_sweep`);
  batch_sweep  code: speedup of the draft model (fixed K), n-gram and "auto"
               over baseline at each batch size;
  latency      code, the same variants and batch sizes: request and inter-token
               latency p50 / p90 / p99 from per-round timestamps (`jspec.tools.latency`);
  tasks        batch 1: restating and sampled runs;
  floor        the weight-streaming floor of one decode step (weight bytes over
               the memory bandwidth of a large array copy, measured here) against
               jspec's steady-state batch-1 decode step (`baseline_step`);
  transformers PyTorch `generate` (greedy, and assisted generation with the same
               draft) on the same weights exported with `save_hf`, on the same
               prompts, in the same process (needs torch and transformers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
import time

import jax

from jspec.tools import latency as lat
from jspec.tools import profile
from jspec.tools.bench_report import jsonable, plot
from jspec.tools.bench_timing import (Concat, Settings, floor, paired_speedup, report_row,
                                      side_by_side, steady_rounds, tokens_out)
from jspec.planner.api import generate, speculative_generate
from jspec.planner.inputs import cache_bucket
from jspec.drafters.draft_model import DraftModel
from jspec.core.model import Model
from jspec.drafters.ngram import NGram


# ----------------------------------------------------------------------------- tasks


def task_prompts(target: Model, heldout: dict, count: int) -> dict[str, list[list[int]]]:
  """code and restate prompts, `count` rows each (held-out rows repeat when short)."""
  code = heldout["accept_prompts"]
  windows = heldout["windows"]
  sep = [] if target.tokenizer is None else target.tokenizer.encode(
      "\n\n# The same code once more:\n", add_special_tokens=False)[0]
  rows = lambda a: [a[i % len(a)].tolist() for i in range(count)]
  restate = [w[:96] + sep + w[:48] for w in rows(windows)]
  return {"code": rows(code), "restate": restate}


# ----------------------------------------------------------------------------- sweeps


def _variants(target, drafters, prompts, ks, s: Settings, **kw):
  kw = dict(max_new_tokens=s.max_new_tokens, eos_id=(), **kw)
  # Each call takes optional extra keywords (`stream=` for the latency section).
  calls = {"baseline": lambda **x: generate(target, prompts, **kw, **x)}
  for dname, drafter in drafters.items():
    for k in ks:
      calls[f"{dname}@{k}"] = (lambda d, k: lambda **x: speculative_generate(
          target, d, prompts, num_draft_tokens=k, **kw, **x))(drafter, k)
  return calls


def k_sweep(target, drafters, prompts, s: Settings) -> dict:
  """Batch 1 over the K sweep and "auto", with in-loop ideal speedups."""
  # Several prompts at batch 1, one after another: time the sum.
  per_prompt = [_variants(target, drafters, [p], list(s.ks) + ["auto"], s) for p in prompts]
  calls = {name: (lambda name: lambda: Concat([c[name]() for c in per_prompt]))(name)
           for name in per_prompt[0]}
  res = side_by_side(calls, s.repeats)
  base = res.pop("baseline")
  S = cache_bucket(len(prompts[0]) + s.max_new_tokens + max(s.ks) + 1)
  report = {"baseline_tokens_per_s": tokens_out(base["out"]) / base["time"], "rows": {}}
  costs_by_drafter = {}
  for dname, drafter in drafters.items():
    ks = (0,) + tuple(s.ks)
    costs = costs_by_drafter[dname] = dict(zip(ks, profile.call_costs(target, drafter, 1, S, ks)))
    apart = dict(zip(ks, profile.call_costs(target, drafter, 1, S, ks, apart=True)))
    report["costs_ms_" + dname] = {str(k): v * 1e3 for k, v in costs.items()}
    report["costs_apart_ms_" + dname] = {str(k): v * 1e3 for k, v in apart.items()}
    report["round_costs_ms_" + dname] = {
        str(k): v * 1e3 for k, v in zip(ks, profile.round_costs(target, drafter, 1, S, ks))}
    for k in list(s.ks) + ["auto"]:
      row = report_row(res[f"{dname}@{k}"], base, k)
      if k != "auto":
        row["ideal_speedup"] = row["tau"] * costs[0] / costs[k]
        row["measured_over_ideal"] = row["speedup"] / row["ideal_speedup"]
        row["ideal_apart_speedup"] = row["tau"] * apart[0] / apart[k]
      report["rows"][f"{dname}@{k}"] = row
  if s.steady_tokens:
    report["steady"] = steady_sweep(target, drafters, prompts[0], s, costs_by_drafter)
  return report


def steady_sweep(target, drafters, prompt, s: Settings, costs_by_drafter: dict) -> dict:
  """The loop's own overhead at batch 1: steady-state speedup (rounds past the first
  quarter of a long generation, `steady_rounds`) against the ideal from in-loop call
  costs at the same tau. Their ratio leaves out what a whole call adds (the prompt's
  prefill and the draft's), which the k_sweep rows include."""
  variants = {"baseline": (None, 0)}
  for dname, drafter in drafters.items():
    for k in s.ks:
      variants[f"{dname}@{k}"] = (drafter, k)
  res = steady_rounds(target, variants, [prompt], s.steady_tokens, s.repeats)
  base = res.pop("baseline")
  rows = {"baseline_ms_per_token": base["round_s"] * 1e3}
  for name, r in res.items():
    dname, k = name.split("@")
    costs = costs_by_drafter[dname]
    speedup = paired_speedup(base["extra_s"], r["extra_s"])
    ideal = r["tau"] * costs[0] / costs[int(k)]
    rows[name] = {"k": int(k), "tau": r["tau"], "round_ms": r["round_s"] * 1e3,
                  "speedup": speedup, "ideal_speedup": ideal,
                  "measured_over_ideal": speedup / ideal}
  return rows

def batch_sweep(target, drafters, prompts, s: Settings) -> dict:
  """Speedup over baseline at each batch size: each drafter at K = s.k, and "auto"."""
  report = {}
  for B in s.batches:
    res = side_by_side(_variants(target, drafters, prompts[:B], [s.k, "auto"], s), s.repeats)
    base = res.pop("baseline")
    report[str(B)] = {"baseline_tokens_per_s": tokens_out(base["out"]) / base["time"],
                      "rows": {name: report_row(r, base) for name, r in res.items()}}
    print(f"  batch {B}: " + ", ".join(f"{n} {r['speedup']:.2f}x"
                                       for n, r in report[str(B)]["rows"].items()), flush=True)
  return report


def latency_sweep(target, drafters, prompts, s: Settings) -> dict:
  """Per batch size: request and inter-token latency percentiles (`jspec.tools.latency`)
  of the baseline, each drafter at K = s.k and "auto", timed interleaved."""
  report = {}
  for B in s.batches:
    calls = _variants(target, drafters, prompts[:B], [s.k, "auto"], s)
    for call in calls.values():  # the streamed programs are their own: compile them
      jax.block_until_ready(call(stream=lambda rows: None).tokens)
    samples = {name: [] for name in calls}
    names = list(calls)
    for r in range(s.repeats):
      for name in (names if r % 2 == 0 else names[::-1]):
        samples[name].append(lat.timed_call(calls[name])[1])
    report[str(B)] = {name: lat.percentiles(lat.merge(v)) for name, v in samples.items()}
    print(f"  batch {B}: inter-token p99 ms " + ", ".join(
        f"{n} {p['itl_ms']['p99']:.1f}" for n, p in report[str(B)].items()), flush=True)
  return report


def task_runs(target, drafters, tasks, s: Settings) -> dict:
  """Batch 1 restating (greedy) and sampled (temperature 0.8, top-p 0.95) runs."""
  report = {}
  for name, prompts, kw in [("restate", tasks["restate"][:1], {}),
                            ("sampled", tasks["code"][:1],
                             dict(temperature=0.8, top_p=0.95, seed=0))]:
    res = side_by_side(_variants(target, drafters, prompts, [s.k, "auto"], s, **kw), s.repeats)
    base = res.pop("baseline")
    report[name] = {"baseline_tokens_per_s": tokens_out(base["out"]) / base["time"],
                    "rows": {n: report_row(r, base) for n, r in res.items()}}
  return report


# ----------------------------------------------------------------------------- transformers


def transformers_side(target: Model, draft: Model, prompts, jspec_rows: dict, s: Settings,
                      batch: int = 8) -> dict:
  """PyTorch greedy and assisted generation on the same weights and prompts."""
  import torch
  import transformers

  from jspec.io.checkpoint import save_hf

  torch.set_num_threads(os.cpu_count() or 1)
  with tempfile.TemporaryDirectory() as tmp:
    save_hf(target, os.path.join(tmp, "target"))
    save_hf(draft, os.path.join(tmp, "draft"))
    load = lambda p: transformers.AutoModelForCausalLM.from_pretrained(
        os.path.join(tmp, p), dtype=torch.float32).eval()
    hf_target, hf_draft = load("target"), load("draft")
  N = s.max_new_tokens
  # Exactly N new tokens, as in jspec's runs (eos_id=()): no early stop on EOS.
  kw = dict(generation_config=transformers.GenerationConfig(
      max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0, eos_token_id=None))

  def one_by_one(**extra):
    with torch.no_grad():
      return [hf_target.generate(torch.tensor([p]), **kw, **extra) for p in prompts]

  def batched():
    ids = torch.tensor([prompts[i % len(prompts)] for i in range(batch)])
    with torch.no_grad():  # equal-length prompts: no padding needed
      return hf_target.generate(ids, attention_mask=torch.ones_like(ids), **kw)

  ids8 = [prompts[i % len(prompts)] for i in range(batch)]
  jspec_kw = dict(max_new_tokens=N, eos_id=())

  def jspec_one_by_one():
    return jax.block_until_ready([generate(target, [p], **jspec_kw).tokens for p in prompts])

  runs = {"greedy_b1": one_by_one, "assisted_b1": lambda: one_by_one(assistant_model=hf_draft),
          "greedy_b%d" % batch: batched,
          # jspec's plain decoding on the same prompts, in turn with torch's runs, so
          # both libraries see the same load on a shared machine.
          "jspec_b1": jspec_one_by_one,
          "jspec_b%d" % batch: lambda: jax.block_until_ready(
              generate(target, ids8, **jspec_kw).tokens)}
  for fn in runs.values():
    fn()  # warm-up
  times = {n: [] for n in runs}
  for _ in range(s.repeats):
    for n, fn in runs.items():
      t0 = time.perf_counter()
      fn()
      times[n].append(time.perf_counter() - t0)
  t = {n: statistics.median(v) for n, v in times.items()}
  tokens_b1 = N * len(prompts)
  out = {"tokens_per_s": {"greedy_b1": tokens_b1 / t["greedy_b1"],
                          "assisted_b1": tokens_b1 / t["assisted_b1"],
                          f"greedy_b{batch}": N * batch / t[f"greedy_b{batch}"]},
         "jspec_tokens_per_s_b1": tokens_b1 / t["jspec_b1"],
         f"jspec_tokens_per_s_b{batch}": N * batch / t[f"jspec_b{batch}"],
         "assisted_speedup": paired_speedup(times["greedy_b1"], times["assisted_b1"]),
         "torch_threads": torch.get_num_threads(), "transformers": transformers.__version__}
  out.update(jspec_rows)
  return out


# ----------------------------------------------------------------------------- all


def run(target: Model, draft: Model, heldout: dict, s: Settings, out_dir: str | None = None,
        sections=("k_sweep", "batch_sweep", "latency", "tasks", "floor", "transformers"),
        self_drafters: dict | None = None) -> dict:
  """Every section in one process; writes bench.json and the figures to out_dir.

  self_drafters: {name: drafter} for the "heads" section (`jspec.tools.bench_heads`), e.g.
  the shipped Medusa and EAGLE heads; the draft model always takes part.
  """
  drafters = {"draft": DraftModel(draft), "ngram": NGram(vocab_size=target.vocab_size)}
  tasks = task_prompts(target, heldout, max(max(s.batches), 8))
  report = {}
  previous = os.path.join(out_dir, "bench.json") if out_dir else None
  if previous and os.path.exists(previous):
    # Sections not run now are kept from the last run, so one section can be redone
    # alone (e.g. `--sections floor,transformers`).
    with open(previous) as f:
      report = {k: v for k, v in json.load(f).items() if k not in sections}
  report.update({"settings": dataclasses.asdict(s), "backend": jax.default_backend(),
                 "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
                 "target_params": target.num_params(), "draft_params": draft.num_params()})
  code1 = tasks["code"][:6]  # batch-1 prompts, run one after another
  if "floor" in sections:
    # First, in a fresh process: at the end of a full run the same measurement read
    # 1.12 ms per step where a fresh process reads 0.63-0.68 (one run each).
    print("weight-streaming floor", flush=True)
    report["floor"] = floor(target, code1[0], new_tokens=max(4 * s.max_new_tokens, 64))
  if "k_sweep" in sections:
    print("K sweep, batch 1", flush=True)
    report["k_sweep"] = k_sweep(target, drafters, code1, s)
  if "batch_sweep" in sections:
    print("batch sweep", flush=True)
    report["batch_sweep"] = batch_sweep(target, drafters, tasks["code"], s)
  if "latency" in sections:
    print("latency percentiles by batch size", flush=True)
    report["latency"] = latency_sweep(target, drafters, tasks["code"], s)
  if "tasks" in sections:
    print("restating and sampled tasks, batch 1", flush=True)
    report["tasks"] = task_runs(target, drafters, tasks, s)
  if "heads" in sections:
    from jspec.tools import bench_heads
    print("self-drafting heads against the draft model, chains and trees, batch 1", flush=True)
    hd = {"draft": DraftModel(draft), **(self_drafters or {})}
    depth = {n: d.num_heads for n, d in hd.items() if hasattr(d, "num_heads")}
    report["heads"] = bench_heads.heads(target, hd, code1, k=s.k,
                                        max_new_tokens=s.max_new_tokens, repeats=s.repeats,
                                        max_depth=depth)
  if "transformers" in sections and s.transformers:
    try:
      import torch  # noqa: F401
      import transformers  # noqa: F401
    except ImportError:
      report["transformers"] = "not installed (pip install 'jspec[bench]')"
    else:
      print("transformers, same weights and prompts", flush=True)
      ks = report.get("k_sweep", {}).get("rows", {})
      best = max((r for n, r in ks.items() if n.startswith("draft@") and r["k"] != "auto"),
                 key=lambda r: r["speedup"], default=None)
      jrows = {"jspec_best_fixed_k_speedup": best and best["speedup"],
               "jspec_best_fixed_k": best and best["k"],
               "jspec_auto_speedup": ks.get("draft@auto", {}).get("speedup")}
      report["transformers"] = transformers_side(target, draft, code1, jrows, s)
  if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
      json.dump(report, f, indent=1, default=jsonable)
    report["figures"] = plot(report, out_dir)
  return report
