"""Command line: `jspec demo` (the main job) and checkpoint conversion.

    jspec demo [--k 4] [--max-new-tokens 64] [--repeats 5]
    jspec convert HF_DIR OUT_DIR [--dtype bfloat16|float32]
    jspec export-hf NATIVE_DIR OUT_DIR

Until trained checkpoints ship, the demo runs a random-init target with two
drafters at batch 1: the target itself (acceptance 1, which shows the loop's
overhead against the ideal K+1 tokens per target call) and an independent,
smaller random model (low acceptance, the worst case). It checks that greedy
speculative output equals greedy baseline output and prints tau (tokens per
target call), the acceptance rate and tokens/s. Timings are medians of
interleaved runs after compilation, in this one process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  np.asarray(out.tokens)  # wait for the device
  return out, time.perf_counter() - start


def demo(args) -> int:
  import jax

  import jspec
  from jspec import costs
  from jspec.models import TransformerConfig, init

  target_cfg = TransformerConfig(vocab_size=8192, hidden_size=256, intermediate_size=768,
                                 num_hidden_layers=4, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=1024,
                                 initializer_range=0.05)
  draft_cfg = TransformerConfig(vocab_size=8192, hidden_size=128, intermediate_size=384,
                                num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1, max_position_embeddings=1024,
                                initializer_range=0.05)
  target = init(target_cfg, seed=0)
  small = init(draft_cfg, seed=1)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 8192, size=args.prompt_len).tolist() for _ in range(args.batch)]
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}; target {target.num_params():,} "
        f"params, small draft {small.num_params():,} params; batch {args.batch}, "
        f"K = {args.k}, {args.max_new_tokens} new tokens, greedy")

  kw = dict(max_new_tokens=args.max_new_tokens)
  runs = {
      "baseline": lambda: jspec.generate(target, prompts, **kw),
      "speculative, draft = target": lambda: jspec.speculative_generate(
          target, target, prompts, num_draft_tokens=args.k, **kw),
      "speculative, small random draft": lambda: jspec.speculative_generate(
          target, small, prompts, num_draft_tokens=args.k, **kw),
  }
  outputs, times = {}, {name: [] for name in runs}
  t0 = time.perf_counter()
  for name, fn in runs.items():  # compile
    outputs[name], _ = _timed(fn)
  print(f"compiled in {time.perf_counter() - t0:.1f} s")
  for _ in range(args.repeats):  # interleaved, so drift hits every variant alike
    for name, fn in runs.items():
      times[name].append(_timed(fn)[1])

  # Per-call costs, for the ideal speedup each run could reach at its tau.
  S = args.prompt_len + args.max_new_tokens + args.k + 64
  t_step = costs.call_time(target, args.batch, 1, S)
  t_verify = costs.call_time(target, args.batch, args.k + 1, S)
  t_small = costs.call_time(small, args.batch, 1, S)
  print(f"per call: target step {t_step * 1e3:.2f} ms, target verify of {args.k + 1} tokens "
        f"{t_verify * 1e3:.2f} ms, small draft step {t_small * 1e3:.2f} ms")
  draft_cost = {"baseline": None, "speculative, draft = target": t_step,
                "speculative, small random draft": t_small}

  ref = np.asarray(outputs["baseline"].tokens)
  ok = True
  base_median = statistics.median(times["baseline"])
  print(f"{'run':34s} {'equal':>6s} {'tau':>6s} {'accept':>7s} {'tok/s':>8s} {'speedup':>8s} "
        f"{'ideal':>6s}")
  for name, out in outputs.items():
    same = np.array_equal(np.asarray(out.tokens), ref)
    ok &= same
    emitted = int(np.sum(out.lengths))
    calls = int(np.sum(out.stats.target_calls))
    proposed = args.k * calls if name != "baseline" else 0
    accept = int(np.sum(out.stats.accepted)) / proposed if proposed else float("nan")
    median = statistics.median(times[name])
    tau = emitted / calls
    ideal = (1.0 if draft_cost[name] is None else
             costs.ideal_speedup(tau, args.k, t_step, t_verify, draft_cost[name]))
    print(f"{name:34s} {str(same):>6s} {tau:6.2f} {accept:7.2f} "
          f"{emitted / median:8.1f} {base_median / median:8.2f} {ideal:6.2f}")
  print(f"medians of {args.repeats} interleaved runs; ideal = tau * T_step / (T_verify + K * "
        f"T_draft) from the per-call medians above; tau at acceptance 1 is {args.k + 1}")
  if not ok:
    print("ERROR: speculative output differs from baseline", file=sys.stderr)
    return 1
  return 0


def convert(args) -> int:
  """Hugging Face directory (or Hub id) -> native jspec checkpoint."""
  import jspec

  model = jspec.load(args.src, dtype=args.dtype)
  jspec.save(model, args.out)
  _describe("wrote", args.out, model)
  return 0


def export_hf(args) -> int:
  """Native jspec checkpoint -> Hugging Face directory (safetensors, tokenizer, EOS)."""
  import jspec
  from jspec import checkpoint

  model = jspec.load(args.src)
  checkpoint.save_hf(model, args.out)
  _describe("exported", args.out, model)
  return 0


def _describe(verb, path, model) -> None:
  tokenizer = "with tokenizer" if model.tokenizer is not None else "no tokenizer"
  print(f"{verb} {path}: {type(model.config).__name__}, {model.num_params():,} params, "
        f"{model.dtype}, {tokenizer}, EOS ids {list(model.eos_ids)}")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="jspec", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("demo", help="baseline vs speculative decoding, checked equal, timed")
  p.add_argument("--k", type=int, default=4, help="draft tokens per round")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--prompt-len", type=int, default=16)
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--repeats", type=int, default=5)
  p.set_defaults(func=demo)
  p = sub.add_parser("convert", help="Hugging Face directory or Hub id -> native checkpoint")
  p.add_argument("src", metavar="HF_DIR",
                 help="directory with config.json + safetensors, or a Hub id org/name")
  p.add_argument("out", metavar="OUT_DIR", help="new (or empty) directory to write")
  p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                 help="cast floating-point params (default: keep the stored dtype)")
  p.set_defaults(func=convert)
  p = sub.add_parser("export-hf", help="native checkpoint -> Hugging Face directory")
  p.add_argument("src", metavar="NATIVE_DIR")
  p.add_argument("out", metavar="OUT_DIR")
  p.set_defaults(func=export_hf)
  args = parser.parse_args(argv)
  return args.func(args)


if __name__ == "__main__":
  sys.exit(main())
