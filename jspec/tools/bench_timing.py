"""How `jspec bench` times calls, and the measurements built directly on that timing.

Every section of `jspec bench` (jspec/tools/bench.py), the heads section
(bench_heads.py) and the real-model bench (real_sections.py) time their variants
the same way, so the pieces live here, apart from the sections that use them:
side-by-side repeats and paired ratios, the steady-state cost of a round inside
jspec's loop, the weight-streaming floor, and the device mode's verify-against-
decode costs, which need those timings and no drafter's acceptance.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import schedule
from jspec.planner.api import generate, speculative_generate
from jspec.planner.inputs import cache_bucket
from jspec.drafters.draft_model import DraftModel
from jspec.core.model import Model


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `jspec.tools.bench.run` sweeps: batch sizes, the K sweep, the fixed K, lengths, repeats."""

  batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  ks: tuple[int, ...] = (1, 2, 3, 4, 6)
  k: int = 4  # the fixed K of the batch sweep and task runs
  max_new_tokens: int = 64
  repeats: int = 3
  transformers: bool = True
  steady_tokens: int = 256  # the k_sweep's steady-state part: tokens per long run (0: skip)


# ----------------------------------------------------------------------------- timing


def tokens_out(out) -> int:
  """New tokens of a call's output, every row summed."""
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


def report_row(res, base, k=None):
  """A report row of a timed run `res` against the plain run `base`: time, tokens/s,
  speedup, tau and, for "auto", the rounds at each K."""
  out = res["out"]
  calls = max(int(np.max(np.asarray(out.stats.target_calls))), 1)
  row = {"time_s": res["time"], "tokens_per_s": tokens_out(out) / res["time"],
         "tau": tokens_out(out) / max(int(np.sum(np.asarray(out.stats.target_calls))), 1),
         "speedup": paired_speedup(base["times"], res["times"]), "rounds": calls}
  if k is not None:
    row["k"] = k
  if out.rounds_by_k is not None:
    row["rounds_by_k"] = {str(a): b for a, b in out.rounds_by_k.items()}
  row["equal_to_baseline"] = bool(np.array_equal(np.asarray(out.tokens),
                                                 np.asarray(base["out"].tokens)))
  return row


@dataclasses.dataclass
class Concat:
  """Outputs of several batch-1 runs seen as one (for timing and stats)."""

  parts: list

  @property
  def tokens(self):
    """Each run's tokens."""
    return [p.tokens for p in self.parts]

  @property
  def lengths(self):
    """[runs * B] new tokens per row."""
    return np.concatenate([np.asarray(p.lengths) for p in self.parts])

  @property
  def stats(self):
    """Target calls per row, as a `DecodeStats` holds them."""
    calls = np.concatenate([np.asarray(p.stats.target_calls) for p in self.parts])
    return _Stats(calls)

  @property
  def rounds_by_k(self):
    """{K: rounds} summed over the runs; None for a fixed K."""
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
  from jspec.bench import costs
  from jspec.core.stats import ideal_speedup

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
           f"ideal_at_alpha_{alpha}": {str(k): ideal_speedup(tau[k], k, step, verify[k],
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
