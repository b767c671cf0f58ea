"""The measurements of `jspec bench --target` (jspec/tools/bench_real.py), section by section.

How a call is made in each library (one prompt bucket and cache length for every
jspec call, transformers answers put in jspec's output form), and the sections that
time them: batch 1 per prompt kind against transformers, larger batches, the
floor, the verify cost. bench_real.py picks the sections and writes the report;
with the measuring code here, that file stays the overview. The report's
formatting is in real_report.py.
"""

from __future__ import annotations

import dataclasses
import os
import statistics

import numpy as np

from jspec.tools import bench_timing
from jspec.planner import call_times
from jspec.planner.api import generate, speculative_generate
from jspec.planner.inputs import cache_bucket, prompt_bucket as _prompt_bucket
from jspec.core.model import Model
from jspec.drafters.ngram import NGram


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the real-model bench runs: fixed K, lengths, repeats, prompts, batch sizes."""

  k: int = 4
  max_new_tokens: int = 128
  repeats: int = 3
  per_kind: int = 2  # held-out chat prompts of each kind
  batches: tuple[int, ...] = (8, 32)
  max_ngram: int = 3
  transformers: bool = True
  # torch's intra-op threads; None keeps torch's default (one per core). On a loaded
  # machine its OpenMP barriers can stall on a descheduled thread: there a 1-thread
  # run shows what the machine's load costs torch.
  torch_threads: int | None = None
  steady_tokens: int = 256  # floor: tokens of the long generation (the short one: a quarter)
  cost_calls: int = 10  # verify: calls per timing


# ----------------------------------------------------------------------------- calls


def jax_threads() -> int:
  """Threads XLA's CPU client computes with: one per core this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


@dataclasses.dataclass
class _Answer:
  """One transformers answer in jspec's output form (tokens [1, N], -1 after the end)."""

  tokens: np.ndarray
  lengths: np.ndarray


@dataclasses.dataclass
class Runs:
  """Several batch-1 answers run one after another, seen as one timed call."""

  outs: list

  @property
  def tokens(self):
    return [o.tokens for o in self.outs]

  def answers(self) -> list[np.ndarray]:
    return [np.asarray(o.tokens)[0, :int(np.asarray(o.lengths)[0])] for o in self.outs]

  def count(self) -> int:
    return int(sum(int(np.sum(np.asarray(o.lengths))) for o in self.outs))

  def calls(self) -> int:
    return int(sum(int(np.sum(np.asarray(o.stats.target_calls))) for o in self.outs))


def shapes(prompts, s: Settings) -> tuple[int, int]:
  """One prompt bucket and one cache length for every call, so each variant compiles
  once, whatever prompt it runs on."""
  from jspec.core.schedule import AutoK

  P = _prompt_bucket(max(len(ids) for _, ids in prompts))
  return P, cache_bucket(P + s.max_new_tokens + max(s.k, AutoK().max_k) + 1)


def jspec_call(target: Model, rows, P: int, S: int, s: Settings, drafter=None, k=0):
  """A jspec call on `rows` (token-id lists) padded to P, greedy, stopping at EOS."""
  tokens = np.zeros((len(rows), P), np.int32)
  for b, r in enumerate(rows):
    tokens[b, :len(r)] = r
  kw = dict(prompt_lengths=[len(r) for r in rows], max_new_tokens=s.max_new_tokens,
            cache_length=S, eos_id=tuple(target.eos_ids))
  if drafter is None:
    return lambda: generate(target, tokens, **kw)
  return lambda: speculative_generate(target, drafter, tokens, num_draft_tokens=k, **kw)


def load_transformers(path: str):
  """The same GGUF through transformers' own loader, f32, in eval mode."""
  import torch
  import transformers

  return transformers.AutoModelForCausalLM.from_pretrained(
      os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
      dtype=torch.float32).eval()


def transformers_call(hf, ids, s: Settings, eos_ids, assistant=None, **extra):
  """transformers' greedy `generate` on one prompt (batch 1), stopping where jspec does;
  `extra`: more generation settings (prompt lookup's); `assistant`: a draft model for
  assisted generation."""
  import torch
  import transformers

  config = transformers.GenerationConfig(
      max_new_tokens=s.max_new_tokens, do_sample=False, eos_token_id=list(eos_ids) or None,
      pad_token_id=(list(eos_ids) or [0])[0], **extra)
  x = torch.tensor([ids])

  def call():
    with torch.no_grad():
      seq = hf.generate(x, attention_mask=torch.ones_like(x), generation_config=config,
                        **({"assistant_model": assistant} if assistant is not None else {}))
    new = seq[0, len(ids):].numpy().astype(np.int32)
    tokens = np.full((1, s.max_new_tokens), -1, np.int32)
    tokens[0, :len(new)] = new
    return _Answer(tokens=tokens, lengths=np.array([len(new)], np.int32))

  return call


def many(fns):
  return lambda: Runs([fn() for fn in fns])


# ----------------------------------------------------------------------------- batch 1


def rate(res) -> dict:
  n = res["out"].count()
  return {"tokens": n, "time_s": res["time"], "tokens_per_s": n / res["time"],
          "times_s": res["times"]}


def rate_ratio(a, b) -> float:
  """a's tokens/s over b's, the median over repeats of runs made in the same repeat."""
  return (bench_timing.paired_speedup(b["times"], a["times"])
          * a["out"].count() / b["out"].count())


def leading_agreement(a, b) -> int:
  """How many leading tokens two answers share."""
  n = min(len(a), len(b))
  diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
  return int(diff[0]) if diff.size else n


def _top2_gap(target: Model, prompt, answer, at: int, S: int) -> float:
  """jspec's top-2 logit gap where two answers part (a small gap: a near-tie that float
  rounding can flip). The context is padded to S so every prompt shares one program."""
  context = list(prompt) + [int(t) for t in answer[:at]]
  padded = np.zeros((1, S), np.int32)
  padded[0, :len(context)] = context
  logits = np.asarray(target.logits(padded))[0, len(context) - 1]
  top2 = np.sort(logits)[-2:]
  return float(top2[1] - top2[0])


def _agreement(target, prompts, ours, theirs, S) -> list[dict]:
  rows = []
  for (_, prompt), a, b in zip(prompts, ours, theirs):
    lead = leading_agreement(a, b)
    row = {"tokens_jspec": len(a), "tokens_transformers": len(b), "leading_equal": lead,
           "identical": bool(len(a) == len(b) == lead)}
    if lead < min(len(a), len(b)):
      row["top2_gap_at_divergence"] = _top2_gap(target, prompt, a, lead, S)
    rows.append(row)
  return rows


def batch1(target: Model, hf, prompts, s: Settings, sections) -> dict:
  """Batch 1, every prompt kind: the "transformers" and "ngram" sections, timed together
  when both run (the shared greedy runs are timed once)."""
  P, S = shapes(prompts, s)
  kinds = list(dict.fromkeys(kind for kind, _ in prompts))
  by_kind = {k: [p for p in prompts if p[0] == k] for k in kinds}
  ngram = NGram(target.vocab_size, max_ngram=s.max_ngram)
  eos = tuple(target.eos_ids)
  variants = {"jspec_greedy": lambda ids: jspec_call(target, [ids], P, S, s)}
  if "ngram" in sections:
    variants[f"jspec_ngram@{s.k}"] = lambda ids: jspec_call(target, [ids], P, S, s, ngram, s.k)
    variants["jspec_ngram@auto"] = lambda ids: jspec_call(target, [ids], P, S, s, ngram, "auto")
  if hf is not None:
    variants["transformers_greedy"] = lambda ids: transformers_call(hf, ids, s, eos)
    if "ngram" in sections:
      variants["transformers_prompt_lookup"] = lambda ids: transformers_call(
          hf, ids, s, eos, prompt_lookup_num_tokens=s.k, max_matching_ngram_size=s.max_ngram)
  calls = {(kind, name): many([make(ids) for _, ids in by_kind[kind]])
           for kind in kinds for name, make in variants.items()}
  res = bench_timing.side_by_side(calls, s.repeats)
  for name in variants:  # every kind together: per-repeat sums
    parts = [res[(kind, name)] for kind in kinds]
    times = [sum(t) for t in zip(*(p["times"] for p in parts))]
    res[("all", name)] = {"time": statistics.median(times), "times": times,
                          "out": Runs([o for p in parts for o in p["out"].outs])}
  report = {}
  if "transformers" in sections and hf is not None:
    report["transformers"] = _transformers_report(target, res, kinds, by_kind, S)
  if "ngram" in sections:
    report["ngram"] = _ngram_report(res, kinds, s, hf is not None)
  return report


def _transformers_report(target, res, kinds, by_kind, S) -> dict:
  import torch
  import transformers

  out = {"torch_threads": torch.get_num_threads(), "jax_threads": jax_threads(),
         "transformers": transformers.__version__, "torch": torch.__version__, "kinds": {}}
  for kind in kinds + ["all"]:
    j, t = res[(kind, "jspec_greedy")], res[(kind, "transformers_greedy")]
    row = {"jspec_greedy": rate(j), "transformers_greedy": rate(t),
           "jspec_over_transformers": rate_ratio(j, t)}
    if kind != "all":
      row["agreement"] = _agreement(target, by_kind[kind], j["out"].answers(),
                                    t["out"].answers(), S)
    out["kinds"][kind] = row
  agree = [a for k in kinds for a in out["kinds"][k]["agreement"]]
  out["identical_answers"] = sum(a["identical"] for a in agree)
  out["answers"] = len(agree)
  return out


def _ngram_report(res, kinds, s: Settings, with_hf: bool) -> dict:
  out = {"k": s.k, "max_ngram": s.max_ngram, "kinds": {}}
  spec = [f"jspec_ngram@{s.k}", "jspec_ngram@auto"]
  mismatches = []
  for kind in kinds + ["all"]:
    base = res[(kind, "jspec_greedy")]
    row = {"jspec_greedy": rate(base)}
    greedy = base["out"].answers()
    for name in spec:
      r = res[(kind, name)]
      equal = [bool(np.array_equal(a, g)) for a, g in zip(r["out"].answers(), greedy)]
      if not all(equal):
        mismatches.append(f"{kind} {name}: prompts {[i for i, e in enumerate(equal) if not e]}")
      row[name] = dict(rate(r), speedup=rate_ratio(r, base), equal_to_greedy=all(equal),
                       tau=r["out"].count() / max(r["out"].calls(), 1))
      rounds = {}
      for o in r["out"].outs:
        for k, v in (o.rounds_by_k or {}).items():
          rounds[str(k)] = rounds.get(str(k), 0) + int(v)
      if rounds:
        row[name]["rounds_by_k"] = rounds
    if with_hf:
      hb, pl = res[(kind, "transformers_greedy")], res[(kind, "transformers_prompt_lookup")]
      ans = [leading_agreement(a, g) == len(a) == len(g)
             for a, g in zip(pl["out"].answers(), hb["out"].answers())]
      row["transformers_greedy"] = rate(hb)
      row["transformers_prompt_lookup"] = dict(rate(pl), speedup=rate_ratio(pl, hb),
                                               equal_to_greedy=all(ans))
      row["jspec_over_transformers_prompt_lookup"] = {
          name.split("@")[1]: rate_ratio(res[(kind, name)], pl) for name in spec}
    out["kinds"][kind] = row
  out["mismatches"] = mismatches
  return out


# ----------------------------------------------------------------------------- other sections


def batch_section(target: Model, prompts, s: Settings) -> dict:
  """Plain, n-gram at the fixed K and "auto" at each batch size; rows: the prompts cycled."""
  P, S = shapes(prompts, s)
  ngram = NGram(target.vocab_size, max_ngram=s.max_ngram)
  report = {}
  for B in s.batches:
    rows = [prompts[i % len(prompts)][1] for i in range(B)]
    calls = {"baseline": jspec_call(target, rows, P, S, s),
             f"ngram@{s.k}": jspec_call(target, rows, P, S, s, ngram, s.k),
             "ngram@auto": jspec_call(target, rows, P, S, s, ngram, "auto")}
    res = bench_timing.side_by_side(calls, s.repeats)
    base = res.pop("baseline")
    report[str(B)] = {"baseline_tokens_per_s":
                      bench_timing.tokens_out(base["out"]) / base["time"],
                      "rows": {name: bench_timing.report_row(r, base) for name, r in res.items()}}
    print(f"  batch {B}: " + ", ".join(f"{n} {r['speedup']:.2f}x" for n, r in
                                       report[str(B)]["rows"].items()), flush=True)
  return report


def floor_section(path: str, target: Model, prompt, s: Settings) -> dict:
  """`bench_timing.floor` with f32 weights (the loaded model) and bf16 (the file loaded again).

  Bandwidth there is bytes read plus bytes written per second of a large array copy,
  and a step only reads its weights, so the floor is weight bytes over that rate. A
  read-only stream can run faster than a copy's rate (the copy's writes also cost
  reads of the lines they fill), so a step may come in under this floor."""
  from jspec.io import checkpoint

  new = max(s.steady_tokens, 8)
  out = {"bandwidth": "read + written bytes per second of a large array copy "
                      "(bench_timing.memory_bandwidth)", "steady_tokens": [new // 4, new]}
  out["float32"] = bench_timing.floor(target, prompt, new_tokens=new, repeats=s.repeats)
  half = checkpoint.load(path, dtype="bfloat16")
  out["bfloat16"] = bench_timing.floor(half, prompt, new_tokens=new, repeats=s.repeats)
  del half
  return out


def verify_costs(target: Model, k: int, cache_length: int, calls: int = 10,
                 repeats: int = 5) -> dict:
  """What a verify of K + 1 tokens costs against a 1-token step at batch 1.

  in_loop: each call repeated inside one jitted loop (`jspec.planner.call_times.loop_times`), the ratio the
  median over repeats of verify / step timed in the same repeat; single_calls: one
  call at a time, dispatched from Python (`costs.call_time`, medians). A verify
  costing more than a step is what speculation must win back: the ideal speedup of
  a drafter whose proposals cost nothing (n-gram lookup, nearly) is tau / ratio.
  """
  from jspec.bench import costs

  loop = call_times.loop_times(target, 1, [1, k + 1], cache_length, calls, repeats)
  step = costs.call_time(target, 1, 1, cache_length, repeats=calls)
  verify = costs.call_time(target, 1, k + 1, cache_length, repeats=calls)
  return {"k": k, "verify_tokens": k + 1, "cache_length": cache_length,
          "in_loop": {"step_ms": statistics.median(loop[1]) * 1e3,
                      "verify_ms": statistics.median(loop[k + 1]) * 1e3,
                      "ratio": 1 / bench_timing.paired_speedup(loop[1], loop[k + 1])},
          "single_calls": {"step_ms": step * 1e3, "verify_ms": verify * 1e3,
                           "ratio": verify / step}}

