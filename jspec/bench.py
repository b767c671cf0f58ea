"""`jspec bench`: baseline against every drafter, batch and K sweeps, and transformers.

    jspec bench [--batches 1,2,4,8,16,32,64] [--k 1,2,3,4,6] [--out docs/bench]
    jspec bench --device gpu          # larger random-init models: verify vs decode cost

One process, side by side; every variant is compiled first, then timed in
interleaved repeats. Times are medians; a speedup is the median over repeats of
baseline time / variant time within the same repeat (`paired_speedup`). Task
sets come from the shipped checkpoints' held-out token windows (models/shipped.py),
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
import jax.numpy as jnp
import numpy as np

from jspec import profile, schedule
from jspec.api import cache_bucket, generate, speculative_generate
from jspec.draft_model import DraftModel
from jspec.model import Model
from jspec.ngram import NGram


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `run` sweeps: batch sizes, the K sweep, the fixed K, lengths, repeats."""

  batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  ks: tuple[int, ...] = (1, 2, 3, 4, 6)
  k: int = 4  # the fixed K of the batch sweep and task runs
  max_new_tokens: int = 64
  repeats: int = 3
  transformers: bool = True
  steady_tokens: int = 256  # the k_sweep's steady-state part: tokens per long run (0: skip)


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


# ----------------------------------------------------------------------------- timing


def _tokens_out(out) -> int:
  return int(np.sum(np.asarray(out.lengths)))


def side_by_side(calls: dict, repeats: int) -> dict:
  """{name: {"time": median s, "times": [s per repeat], "out": last output}}: compile
  all, then interleave, the order reversed every other repeat (no call always runs
  right after the same neighbour)."""
  outs = {name: fn() for name, fn in calls.items()}
  jax.block_until_ready([o.tokens for o in outs.values()])
  times = {name: [] for name in calls}
  names = list(calls)
  for r in range(repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      t0 = time.perf_counter()
      outs[name] = calls[name]()
      jax.block_until_ready(outs[name].tokens)
      times[name].append(time.perf_counter() - t0)
  return {name: {"time": statistics.median(times[name]), "times": times[name],
                 "out": outs[name]} for name in calls}


def paired_speedup(base_times, times) -> float:
  """Median over repeats of base time / this time, each pair timed in the same repeat.

  Load on a shared machine drifts over seconds; a ratio of two runs made next to each
  other cancels most of it, where a ratio of two medians taken over the whole sweep
  does not.
  """
  return statistics.median(b / x for b, x in zip(base_times, times))


def _row(res, base, k=None):
  out = res["out"]
  calls = max(int(np.max(np.asarray(out.stats.target_calls))), 1)
  row = {"time_s": res["time"], "tokens_per_s": _tokens_out(out) / res["time"],
         "tau": _tokens_out(out) / max(int(np.sum(np.asarray(out.stats.target_calls))), 1),
         "speedup": paired_speedup(base["times"], res["times"]), "rounds": calls}
  if k is not None:
    row["k"] = k
  if out.rounds_by_k is not None:
    row["rounds_by_k"] = {str(a): b for a, b in out.rounds_by_k.items()}
  row["equal_to_baseline"] = bool(np.array_equal(np.asarray(out.tokens),
                                                 np.asarray(base["out"].tokens)))
  return row


def _variants(target, drafters, prompts, ks, s: Settings, **kw):
  kw = dict(max_new_tokens=s.max_new_tokens, eos_id=(), **kw)
  calls = {"baseline": lambda: generate(target, prompts, **kw)}
  for dname, drafter in drafters.items():
    for k in ks:
      calls[f"{dname}@{k}"] = (lambda d, k: lambda: speculative_generate(
          target, d, prompts, num_draft_tokens=k, **kw))(drafter, k)
  return calls


def k_sweep(target, drafters, prompts, s: Settings) -> dict:
  """Batch 1 over the K sweep and "auto", with in-loop ideal speedups."""
  # Several prompts at batch 1, one after another: time the sum.
  per_prompt = [_variants(target, drafters, [p], list(s.ks) + ["auto"], s) for p in prompts]
  calls = {name: (lambda name: lambda: _Concat([c[name]() for c in per_prompt]))(name)
           for name in per_prompt[0]}
  res = side_by_side(calls, s.repeats)
  base = res.pop("baseline")
  S = cache_bucket(len(prompts[0]) + s.max_new_tokens + max(s.ks) + 1)
  report = {"baseline_tokens_per_s": _tokens_out(base["out"]) / base["time"], "rows": {}}
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
      row = _row(res[f"{dname}@{k}"], base, k)
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


@dataclasses.dataclass
class _Concat:
  """Outputs of several batch-1 runs seen as one (for timing and stats)."""

  parts: list

  @property
  def tokens(self):
    return [p.tokens for p in self.parts]

  @property
  def lengths(self):
    return np.concatenate([np.asarray(p.lengths) for p in self.parts])

  @property
  def stats(self):
    calls = np.concatenate([np.asarray(p.stats.target_calls) for p in self.parts])
    return _Stats(calls)

  @property
  def rounds_by_k(self):
    if self.parts[0].rounds_by_k is None:
      return None
    total = {}
    for p in self.parts:
      for k, r in p.rounds_by_k.items():
        total[k] = total.get(k, 0) + r
    return total


@dataclasses.dataclass
class _Stats:
  target_calls: np.ndarray


def batch_sweep(target, drafters, prompts, s: Settings) -> dict:
  """Speedup over baseline at each batch size: each drafter at K = s.k, and "auto"."""
  report = {}
  for B in s.batches:
    res = side_by_side(_variants(target, drafters, prompts[:B], [s.k, "auto"], s), s.repeats)
    base = res.pop("baseline")
    report[str(B)] = {"baseline_tokens_per_s": _tokens_out(base["out"]) / base["time"],
                      "rows": {name: _row(r, base) for name, r in res.items()}}
    print(f"  batch {B}: " + ", ".join(f"{n} {r['speedup']:.2f}x"
                                       for n, r in report[str(B)]["rows"].items()), flush=True)
  return report


def task_runs(target, drafters, tasks, s: Settings) -> dict:
  """Batch 1 restating (greedy) and sampled (temperature 0.8, top-p 0.95) runs."""
  report = {}
  for name, prompts, kw in [("restate", tasks["restate"][:1], {}),
                            ("sampled", tasks["code"][:1],
                             dict(temperature=0.8, top_p=0.95, seed=0))]:
    res = side_by_side(_variants(target, drafters, prompts, [s.k, "auto"], s, **kw), s.repeats)
    base = res.pop("baseline")
    report[name] = {"baseline_tokens_per_s": _tokens_out(base["out"]) / base["time"],
                    "rows": {n: _row(r, base) for n, r in res.items()}}
  return report


# ----------------------------------------------------------------------------- floor


def memory_bandwidth(nbytes: int = 1 << 28, repeats: int = 5) -> float:
  """Bytes per second of a large array copy (read + write counted), on the device
  that holds the weights: host memory through NumPy on the CPU, a jitted copy in
  device memory on an accelerator."""
  times = []
  if jax.default_backend() == "cpu":
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    for _ in range(repeats):
      t0 = time.perf_counter()
      np.copyto(dst, src)
      times.append(time.perf_counter() - t0)
  else:
    src = jnp.ones(nbytes // 4, jnp.float32)
    copy = jax.jit(lambda x: x + 1)  # one read, one write; not elided like a plain copy
    copy(src).block_until_ready()
    for _ in range(repeats):
      t0 = time.perf_counter()
      copy(src).block_until_ready()
      times.append(time.perf_counter() - t0)
  return 2 * nbytes / min(times)


def steady_rounds(target: Model, variants: dict, prompts, new_tokens: int = 256,
                  repeats: int = 7) -> dict:
  """Steady-state cost of jspec's loop for several variants, timed side by side.

  variants: {name: (drafter, k)}, k = 0 for plain decoding (drafter unused). Each
  variant runs two generations with the same cache, `new_tokens` and a quarter of
  that, all interleaved; the difference of a pair's times is what the extra tokens
  cost, without the call's fixed part (the prompts' prefill, the draft's prefill,
  host-side checks, transfers), which a long run only dilutes. Greedy.

  Returns {name: {"round_s": median seconds per extra round, "extra_s": [per-repeat
  time differences], "tau": extra tokens per extra round}}. For two variants the
  extra tokens are the same, so the median ratio of their "extra_s" lists
  (`paired_speedup`) is the steady-state speedup of one over the other.
  """
  short = max(new_tokens // 4, 1)
  if new_tokens <= short:
    raise ValueError(f"steady_rounds needs new_tokens >= 2, got {new_tokens}")
  kmax = max(k for _, k in variants.values())
  cache = cache_bucket(max(len(p) for p in prompts) + new_tokens + kmax + 1)
  kw = dict(eos_id=(), cache_length=cache)

  def run(drafter, k, n):
    if k == 0:
      return lambda: generate(target, prompts, max_new_tokens=n, **kw)
    return lambda: speculative_generate(target, drafter, prompts, num_draft_tokens=k,
                                        max_new_tokens=n, **kw)

  calls = {}
  for name, (drafter, k) in variants.items():
    calls[(name, "long")] = run(drafter, k, new_tokens)
    calls[(name, "short")] = run(drafter, k, short)
  res = side_by_side(calls, repeats)
  rounds = lambda r: int(np.max(np.asarray(r["out"].stats.target_calls)))
  out = {}
  for name in variants:
    long, short_ = res[(name, "long")], res[(name, "short")]
    extra_rounds = max(rounds(long) - rounds(short_), 1)  # the same every repeat: greedy
    extra = [a - b for a, b in zip(long["times"], short_["times"])]
    out[name] = {"round_s": statistics.median(x / extra_rounds for x in extra),
                 "extra_s": extra,
                 "tau": (new_tokens - short) / extra_rounds}
  return out


def loop_round_time(target: Model, drafter, prompts, k: int = 0, new_tokens: int = 256,
                    repeats: int = 7) -> float:
  """Seconds per decode round inside jspec's loop, steady state (`steady_rounds` for
  one variant; k = 0: plain decoding, one step per round)."""
  return steady_rounds(target, {"v": (drafter, k)}, prompts, new_tokens, repeats)["v"]["round_s"]


def baseline_step(target: Model, prompt, new_tokens: int = 256, repeats: int = 7) -> float:
  """Seconds per decode step of jspec's plain decoding at batch 1, steady state
  (`loop_round_time` with k = 0)."""
  return loop_round_time(target, None, [prompt], 0, new_tokens, repeats)


def floor(target: Model, prompt, new_tokens: int = 256, repeats: int = 7) -> dict:
  """The weight-streaming floor of a batch-1 step against jspec's baseline time per token.

  A decode step reads every weight once, so it cannot beat weight bytes / bandwidth
  (unless the weights sit in cache, which this does not model). The bandwidth and
  jspec's time per decode step (`baseline_step`) are measured here, one after the
  other.
  """
  weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(target.params))
  bw = memory_bandwidth()
  step = baseline_step(target, prompt, new_tokens, repeats)
  floor_s = weight_bytes / bw
  return {"weight_bytes": int(weight_bytes), "bandwidth_gb_s": bw / 1e9,
          "floor_ms": floor_s * 1e3, "baseline_ms_per_token": step * 1e3,
          "baseline_over_floor": step / floor_s}


# ----------------------------------------------------------------------------- transformers


def transformers_side(target: Model, draft: Model, prompts, jspec_rows: dict, s: Settings,
                      batch: int = 8) -> dict:
  """PyTorch greedy and assisted generation on the same weights and prompts."""
  import torch
  import transformers

  from jspec.checkpoint import save_hf

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


# ----------------------------------------------------------------------------- device mode


def device_report(target: Model, draft: Model, batches, ks, s: Settings,
                  prompt_length: int = 64, alpha: float = 0.8) -> dict:
  """Verify cost against decode cost per batch size, on models where acceptance is not
  the point (random-init: a random draft agrees with a random target by chance only).

  For each batch size B:
    step_ms            one cached target call on 1 token per row (`costs.call_time`);
    verify_over_step   a call on K + 1 tokens per row, over step_ms, for each K;
    draft_over_step    one cached draft call on 1 token, over step_ms;
    breakeven_tau      (T_verify + K T_draft) / T_step: the tokens per round a drafter
                       must reach for speculation to pay at this batch size;
    ideal_at_alpha     the ideal speedup if each draft were accepted with probability
                       `alpha` (tau = (1 - alpha^(K+1)) / (1 - alpha), Leviathan et al.);
    loop_step_ms       jspec's plain decoding per step inside its loop (`loop_round_time`);
    loop_round_over_sum  a speculative round at K = s.k inside the loop, over the sum
                       of its standalone calls (T_verify + K T_draft): the loop's own
                       overhead, which bounds measured / ideal.
  """
  from jspec import costs

  vocab = target.vocab_size
  prompt = [int(x) for x in np.random.default_rng(0).integers(0, vocab, prompt_length)]
  S = cache_bucket(prompt_length + 4 * 64 + max(ks) + 1)
  report = {}
  for B in batches:
    t = lambda model, block: costs.call_time(model, B, block, S, repeats=10)
    step = t(target, 1)
    t_draft = t(draft, 1)
    verify = {k: t(target, k + 1) for k in ks}
    tau = {k: float(schedule.expected_tokens(np.float64(alpha), k)) for k in ks}
    row = {"step_ms": step * 1e3, "draft_over_step": t_draft / step,
           "verify_over_step": {str(k): v / step for k, v in verify.items()},
           "breakeven_tau": {str(k): (verify[k] + k * t_draft) / step for k in ks},
           f"ideal_at_alpha_{alpha}": {str(k): costs.ideal_speedup(tau[k], k, step, verify[k],
                                                                  t_draft) for k in ks}}
    prompts = [prompt] * B
    loop_step = loop_round_time(target, None, prompts, 0, new_tokens=4 * 64, repeats=5)
    row["loop_step_ms"] = loop_step * 1e3
    row["loop_tokens_per_s"] = B / loop_step
    if s.k in verify:
      loop_round = loop_round_time(target, DraftModel(draft), prompts, s.k, new_tokens=4 * 64,
                                   repeats=5)
      row["loop_round_ms"] = loop_round * 1e3
      row["loop_round_over_sum"] = loop_round / (verify[s.k] + s.k * t_draft)
    report[str(B)] = row
    print(f"  batch {B}: step {row['step_ms']:.2f} ms (in loop {row['loop_step_ms']:.2f}), "
          f"draft/step {row['draft_over_step']:.2f}, verify/step "
          + ", ".join(f"K={k}: {v:.2f}" for k, v in row["verify_over_step"].items())
          + (f"; in-loop round K={s.k} / its calls {row['loop_round_over_sum']:.2f}"
             if "loop_round_over_sum" in row else ""), flush=True)
  return report


# ----------------------------------------------------------------------------- plots


def plot(report: dict, out_dir: str) -> list[str]:
  """speedup_vs_k.png and speedup_vs_batch.png under out_dir; returns the paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  paths = []
  if "k_sweep" in report:
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = report["k_sweep"]["rows"]
    for dname in sorted({n.split("@")[0] for n in rows}):
      pts = [(r["k"], r["speedup"], r.get("ideal_speedup")) for n, r in rows.items()
             if n.startswith(dname + "@") and r["k"] != "auto"]
      ks, sp, ideal = zip(*sorted(pts))
      line, = ax.plot(ks, sp, "o-", label=f"{dname} measured")
      ax.plot(ks, ideal, "--", color=line.get_color(), alpha=0.6, label=f"{dname} ideal")
      auto = rows.get(f"{dname}@auto")
      if auto:
        ax.axhline(auto["speedup"], color=line.get_color(), ls=":", label=f"{dname} auto")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set(xlabel="K (drafts per round)", ylabel="speedup over baseline",
           title="batch 1, held-out code, greedy")
    ax.legend(fontsize=7)
    paths.append(os.path.join(out_dir, "speedup_vs_k.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
  if "batch_sweep" in report:
    fig, ax = plt.subplots(figsize=(6, 4))
    sweep = report["batch_sweep"]
    Bs = [int(b) for b in sweep]
    for name in sweep[str(Bs[0])]["rows"]:
      ax.plot(Bs, [sweep[str(b)]["rows"][name]["speedup"] for b in Bs], "o-", label=name)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size", ylabel="speedup over baseline",
           title="held-out code, greedy")
    ax.legend(fontsize=7)
    paths.append(os.path.join(out_dir, "speedup_vs_batch.png"))
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
  return paths


# ----------------------------------------------------------------------------- all


def run(target: Model, draft: Model, heldout: dict, s: Settings, out_dir: str | None = None,
        sections=("k_sweep", "batch_sweep", "tasks", "floor", "transformers"),
        self_drafters: dict | None = None) -> dict:
  """Every section in one process; writes bench.json and the figures to out_dir.

  self_drafters: {name: drafter} for the "heads" section (`jspec.bench_heads`), e.g.
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
  if "tasks" in sections:
    print("restating and sampled tasks, batch 1", flush=True)
    report["tasks"] = task_runs(target, drafters, tasks, s)
  if "heads" in sections:
    from jspec import bench_heads
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
      json.dump(report, f, indent=1, default=_jsonable)
    report["figures"] = plot(report, out_dir)
  return report


def _jsonable(x):
  if isinstance(x, (np.integer, np.floating)):
    return x.item()
  return str(x)


def batch_table(by_batch: dict, title: str, rate_format: str) -> list[str]:
  """Lines of a table: per batch size, baseline tokens/s and each variant's speedup."""
  names = list(next(iter(by_batch.values()))["rows"])
  lines = [title, f"  {'batch':>5}{'base tok/s':>12}" + "".join(f"{n:>12}" for n in names)]
  for b, row in by_batch.items():
    lines.append(f"  {b:>5}{row['baseline_tokens_per_s']:>12{rate_format}}"
                 + "".join(f"{row['rows'][n]['speedup']:>11.2f}x" for n in names))
  return lines


def summary(report: dict) -> str:
  """The report's headline figures as terminal lines."""
  lines = []
  ks = report.get("k_sweep")
  if ks:
    lines.append(f"batch 1, code, greedy: baseline {ks['baseline_tokens_per_s']:.0f} tok/s")
    lines.append(f"  {'variant':<12}{'tau':>6}{'speedup':>9}{'ideal':>8}{'meas/ideal':>12}")
    for name, r in ks["rows"].items():
      ideal = r.get("ideal_speedup")
      ratio = r.get("measured_over_ideal")
      lines.append(f"  {name:<12}{r['tau']:>6.2f}{r['speedup']:>8.2f}x"
                   + (f"{ideal:>7.2f}x{ratio:>12.2f}" if ideal else f"{'':>8}{'':>12}")
                   + ("" if r["equal_to_baseline"] else "  (differs from baseline)"))
    st = ks.get("steady")
    if st:
      lines.append(f"  steady state (no prefill): baseline {st['baseline_ms_per_token']:.2f} "
                   f"ms/token")
      for name, r in st.items():
        if name != "baseline_ms_per_token":
          lines.append(f"  {name:<12}{r['tau']:>6.2f}{r['speedup']:>8.2f}x"
                       f"{r['ideal_speedup']:>7.2f}x{r['measured_over_ideal']:>12.2f}")
  bs = report.get("batch_sweep")
  if bs:
    lines += batch_table(bs, "speedup over baseline by batch size (code, greedy)", ".0f")
  for task, row in report.get("tasks", {}).items():
    lines.append(f"{task}, batch 1: " + ", ".join(
        f"{n} {r['speedup']:.2f}x (tau {r['tau']:.2f})" for n, r in row["rows"].items()))
  if "heads" in report:
    from jspec import bench_heads
    lines.append(bench_heads.summary(report["heads"]))
  fl = report.get("floor")
  if fl:
    lines.append(f"floor: {fl['weight_bytes'] / 1e6:.1f} MB of weights at "
                 f"{fl['bandwidth_gb_s']:.1f} GB/s = {fl['floor_ms']:.2f} ms/token; jspec "
                 f"baseline {fl['baseline_ms_per_token']:.2f} ms/token "
                 f"({fl['baseline_over_floor']:.2f}x the floor)")
  hf = report.get("transformers")
  if isinstance(hf, dict):
    t = hf["tokens_per_s"]
    b8 = [k for k in t if k.startswith("greedy_b") and k != "greedy_b1"][0]
    lines.append(f"transformers {hf['transformers']} (torch, {hf['torch_threads']} threads): "
                 f"greedy {t['greedy_b1']:.0f} tok/s at batch 1, {t[b8]:.0f} at batch "
                 f"{b8[8:]}; assisted {hf['assisted_speedup']:.2f}x")
    if hf.get("jspec_tokens_per_s_b1"):
      lines.append(f"  jspec baseline / transformers greedy: batch 1 "
                   f"{hf['jspec_tokens_per_s_b1'] / t['greedy_b1']:.2f}x"
                   + (f", batch {b8[8:]} {hf['jspec_tokens_per_s_b8'] / t[b8]:.2f}x"
                      if hf.get("jspec_tokens_per_s_b8") else ""))
    if hf.get("jspec_best_fixed_k_speedup"):
      lines.append(f"  speculative speedup: jspec {hf['jspec_best_fixed_k_speedup']:.2f}x "
                   f"(K = {hf['jspec_best_fixed_k']}), auto {hf['jspec_auto_speedup']:.2f}x; "
                   f"transformers assisted {hf['assisted_speedup']:.2f}x")
  elif hf:
    lines.append(f"transformers: {hf}")
  return "\n".join(lines)
