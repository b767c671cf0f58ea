"""`jspec bench --device gpu`: what a verify costs against a step, per batch size, on models
where acceptance is not the point (random-init: a random draft agrees with a random target by
chance only).

    head, recs = device.run(target, draft, batches=(1, 8, 64), ks=(1, 2, 4), k=4)
    print("\\n".join(device.lines(head, recs)))

Per batch size B, the header keeps the standalone call costs (`costs.call_time`: a cached
target call on 1 token, on K + 1 tokens for each K, a draft call on 1 token) and the records
are steady-state runs inside jspec's loop (`costs.steady`: plain decoding, and the draft
model at K = k where k is among the Ks). `rows` derives, per B:

    step_ms              one target call on 1 token per row;
    verify_over_step     a call on K + 1 tokens per row, over step_ms, for each K;
    draft_over_step      one draft call on 1 token, over step_ms;
    breakeven_tau        (T_verify + K T_draft) / T_step: the tokens per round a drafter must
                         reach for speculation to pay at this batch size;
    ideal_at_alpha_A     the ideal speedup if each draft were accepted with probability A
                         (tau = (1 - A^(K+1)) / (1 - A), Leviathan et al.);
    loop_step_ms         plain decoding's time per round inside the loop, steady state;
    loop_round_over_sum  a speculative round at K = k inside the loop over the sum of its
                         standalone calls (T_verify + K T_draft): the loop's own overhead,
                         which bounds measured / ideal.
"""

from __future__ import annotations

import numpy as np

from jspec.bench import costs, runner
from jspec.bench import metrics as M
from jspec.bench.methods import Built

STUDY = "device"
FILE = "bench_device.jsonl"
ALPHA = 0.8


def run(target, draft, batches, ks, k: int, prompt_length: int = 64, new_tokens: int = 256,
        repeats: int = 5) -> tuple[dict, list]:
  """(header part: {"cache_length", "calls_ms": {B: {"step", "draft", "verify": {K}}}},
  steady records with axis batch)."""
  from jspec.drafters.draft_model import DraftModel
  from jspec.planner.inputs import cache_bucket

  prompt = [int(x) for x in np.random.default_rng(0).integers(0, target.vocab_size,
                                                               prompt_length)]
  S = cache_bucket(prompt_length + new_tokens + max(ks) + 1)
  calls, recs = {}, []
  for B in batches:
    t = lambda model, block: costs.call_time(model, B, block, S, repeats=10) * 1e3
    calls[str(B)] = {"step": t(target, 1), "draft": t(draft, 1),
                     "verify": {str(kk): t(target, kk + 1) for kk in ks}}
    variants = {runner.PLAIN: None}
    if k in ks:
      variants[f"draft@k={k}"] = Built(DraftModel(draft), k, f"draft model, K = {k}")
    recs += costs.steady(target, variants, [prompt] * B, new_tokens, repeats, STUDY)
  return {"cache_length": S, "calls_ms": calls}, recs


def rows(head: dict, recs, k: int, alpha: float = ALPHA) -> dict[str, dict]:
  """Per batch size, the figures of the module docstring, from the header's call costs and
  the steady records."""
  from jspec.core.schedule import expected_tokens

  out = {}
  for B, c in head["calls_ms"].items():
    step, draft, verify = c["step"], c["draft"], {int(kk): v for kk, v in c["verify"].items()}
    sum_k = {kk: v + kk * draft for kk, v in verify.items()}
    mine = M.select(recs, batch=int(B))
    ends = lambda method: (M.select(mine, method=method, length="short"),
                           M.select(mine, method=method, length="long"))
    loop_step = M.steady_seconds(*ends(runner.PLAIN), per="rounds") * 1e3
    row = out[B] = {
        "step_ms": step, "draft_over_step": draft / step,
        "verify_over_step": {str(kk): v / step for kk, v in verify.items()},
        "breakeven_tau": {str(kk): v / step for kk, v in sum_k.items()},
        f"ideal_at_alpha_{alpha}": {str(kk): M.predicted_speedup(
            float(expected_tokens(np.float64(alpha), kk)), step, v, 0.0)
            for kk, v in sum_k.items()},
        "loop_step_ms": loop_step, "loop_tokens_per_s": int(B) / loop_step * 1e3}
    if k in verify:
      row["loop_round_ms"] = M.steady_seconds(*ends(f"draft@k={k}"), per="rounds") * 1e3
      row["loop_round_over_sum"] = row["loop_round_ms"] / sum_k[k]
  return out


def lines(head: dict, recs, k: int) -> list[str]:
  """One line per batch size: the step, in loop and alone, the draft's and verifies' costs
  over it, and the in-loop round over its calls."""
  return [f"  batch {B}: step {r['step_ms']:.2f} ms (in loop {r['loop_step_ms']:.2f}), "
          f"draft/step {r['draft_over_step']:.2f}, verify/step "
          + ", ".join(f"K={kk}: {v:.2f}" for kk, v in r["verify_over_step"].items())
          + (f"; in-loop round K={k} / its calls {r['loop_round_over_sum']:.2f}"
             if "loop_round_over_sum" in r else "")
          for B, r in rows(head, recs, k).items()]
