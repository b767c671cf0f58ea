"""Int8 SmolLM2 against f32 on the held-out chat prompts: top-1 agreement at every position and
the greedy answers side by side, and the bytes each loads.

    python benchmarks/int8_agreement.py [--new 64] [--json PATH]

For each held-out chat prompt (its chat template applied): the f32 model's greedy answer
(`--new` tokens, EOS ignored) and the int8 model's (`jspec.load(..., weights="int8")`:
weight-only, per-channel scales), compared token by token (equal, and the first position
where they part); then both models' logits over the prompt followed by the f32 answer
(teacher-forced, `Model.logits`), and the share of positions, prompt and answer, where their
argmaxes agree. A record per prompt (`jspec.bench.records`: tokens, extra: agree, positions,
first_difference, equal) under a header with both models' bytes and parameter counts.
"""

from __future__ import annotations

import argparse

import numpy as np

import jspec
from jspec.bench import records as R
from jspec.bench import targets
from jspec.bench.workloads import chat_prompts


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--new", type=int, default=64, help="new tokens per answer (EOS ignored)")
  p.add_argument("--json", default=None)
  args = p.parse_args(argv)
  path = targets.resolve_or_exit(targets.SMOLLM2)
  f32 = targets.load(path, dtype="float32")
  int8 = targets.load(path, dtype="float32", weights="int8")
  tok = f32.tokenizer
  recs = []
  for i, prompt in enumerate(chat_prompts()):
    ids = tok.apply_chat_template([{"role": "user", "content": prompt["content"]}],
                                  add_generation_prompt=True, tokenize=True)
    answers = {}
    for name, model in (("f32", f32), ("int8", int8)):
      out = jspec.generate(model, [ids], max_new_tokens=args.new, eos_id=())
      answers[name] = np.asarray(out.tokens)[0, :args.new]
    same = answers["f32"] == answers["int8"]
    first = int(np.argmin(same)) if not same.all() else None
    seq = np.asarray([list(ids) + answers["f32"].tolist()], np.int32)
    top = {name: np.asarray(model.logits(seq)).argmax(-1)[0]
           for name, model in (("f32", f32), ("int8", int8))}
    agree = int((top["f32"] == top["int8"]).sum())
    recs.append(R.Record(study="int8-agreement", method="int8", workload="chat",
                         prompt=f"{prompt['kind']}-{i}", tokens=args.new,
                         axes={"kind": prompt["kind"], "new_tokens": args.new},
                         equal=bool(same.all()),
                         extra={"agree": agree, "positions": int(seq.shape[1]),
                                "first_difference": first}))
    print(f"{prompt['kind']:8s} {i}: top-1 agreement {agree}/{seq.shape[1]}, greedy answers "
          + ("equal" if same.all() else f"part at token {first}"), flush=True)
  agree = sum(r.extra["agree"] for r in recs)
  positions = sum(r.extra["positions"] for r in recs)
  bytes_ = {"f32": f32.num_bytes(), "int8": int8.num_bytes()}
  print(f"all: top-1 agreement {agree}/{positions} ({agree / positions:.4f}); greedy answers "
        f"equal in {sum(bool(r.equal) for r in recs)} of {len(recs)}; bytes f32 "
        f"{bytes_['f32']:,}, int8 {bytes_['int8']:,} ({bytes_['int8'] / bytes_['f32']:.2f}x); "
        f"params {f32.num_params():,} / {int8.num_params():,}")
  if args.json:
    R.write(args.json, R.header("int8-agreement", vars(args), bytes=bytes_,
                                params={"f32": f32.num_params(), "int8": int8.num_params()}),
            recs)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
