"""Command line: the main job (`jspec demo`), text generation, checkpoint conversion.

    jspec demo [--k 4] [--max-new-tokens 64] [--repeats 3]
    jspec generate --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
                   [--top-p P] [--seed S] [--speculative] [--k 4] [--target DIR] [--draft DIR]
    jspec measure [--target DIR] [--drafter DIR|ngram] --prompts FILE [--k 1,2,4,8]
                  [--json OUT.json] [--plot OUT.png]
    jspec bench [--batches 1,2,4,8,16,32,64] [--k 1,2,3,4,6] [--out docs/bench]
                [--device cpu|gpu] [--no-transformers]
    jspec convert HF_DIR OUT_DIR [--dtype bfloat16|float32]
    jspec export-hf NATIVE_DIR OUT_DIR

`jspec demo` loads the shipped code models (checkpoints/: a target trained on the
CPython standard library and a draft distilled from it), completes held-out code
prompts at batch 1 with baseline and speculative greedy decoding, prints each
completion, checks that both outputs are identical, and prints tau (tokens per
target call), the acceptance rate, tokens/s of each and the speedup, measured side
by side in this process after compilation, beside the ideal speedup that tau and
the measured per-call times allow.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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
  """README's main job: shipped pair, baseline vs speculative at batch 1, checked equal."""
  import jax

  import jspec
  from jspec import costs, dynamic
  from jspec.api import cache_bucket
  from jspec.models import shipped

  t_start = time.perf_counter()
  path = shipped.checkpoints_dir(args.checkpoints)
  target = shipped.load(shipped.TARGET, path=path)
  draft = shipped.load(shipped.DRAFT, path=path)
  texts = shipped.demo_prompts(path)[:args.prompts]
  tok = target.tokenizer
  prompts = [tok.encode(t)[0] for t in texts]
  K, N = args.k, args.max_new_tokens
  print(f"jspec demo on {jax.devices()[0].platform}: shipped code models from {path}")
  print(f"  target {target.num_params():,} params, draft {draft.num_params():,} params "
        f"(bf16 on disk, f32 compute); batch 1, greedy, K = {K}, {N} new tokens, "
        f"{len(prompts)} held-out prompts")

  kw = dict(max_new_tokens=N)
  runs = {
      "baseline": lambda p: jspec.generate(target, [p], **kw),
      "speculative": lambda p: jspec.speculative_generate(target, draft, [p],
                                                          num_draft_tokens=K, **kw),
  }
  outputs = {name: [] for name in runs}
  for p in prompts:  # first pass compiles (one program per prompt bucket)
    for name, fn in runs.items():
      outputs[name].append(_timed(lambda: fn(p))[0])
  print(f"  loaded and compiled in {time.perf_counter() - t_start:.1f} s")

  totals = {name: [] for name in runs}
  for _ in range(args.repeats):  # interleaved, so drift hits both alike
    spent = {name: 0.0 for name in runs}
    for p in prompts:
      for name, fn in runs.items():
        spent[name] += _timed(lambda: fn(p))[1]
    for name in runs:
      totals[name].append(spent[name])

  all_equal = True
  for i, text in enumerate(texts):
    base, spec = outputs["baseline"][i], outputs["speculative"][i]
    equal = np.array_equal(np.asarray(base.tokens), np.asarray(spec.tokens))
    all_equal &= equal
    tail = "".join(text.splitlines(keepends=True)[-3:])
    completion = tok.decode(np.asarray(base.tokens)[0][:int(base.lengths[0])])
    print(f"\n--- prompt {i + 1} (last lines) " + "-" * 40)
    print(tail.rstrip("\n"))
    print(f"--- completion ({int(base.lengths[0])} tokens; speculative identical: {equal}) "
          + "-" * 12)
    print(completion.rstrip("\n"))

  spec_outs = outputs["speculative"]
  emitted = sum(int(o.lengths[0]) for o in spec_outs)
  calls = sum(int(o.stats.target_calls[0]) for o in spec_outs)
  hist = sum(np.asarray(o.stats.accept_hist) for o in spec_outs)
  rates = costs.acceptance_rates(hist, emitted, calls)
  # The ideal from in-loop costs (calls repeated inside one jitted loop, as in decoding):
  # a standalone call also pays dispatch, which on an accelerator can exceed the
  # work of a small model's step. A round's two calls are timed back to back, as a
  # round runs them (on a CPU they share the last-level cache).
  S = cache_bucket(max(len(p) for p in prompts) + N + K + 1)
  t_plain, t_round = dynamic.call_costs(target, jspec.DraftModel(draft), 1, S, (0, K))
  ideal = rates["tau"] * t_plain / t_round
  base_tokens = sum(int(o.lengths[0]) for o in outputs["baseline"])
  base_t, spec_t = statistics.median(totals["baseline"]), statistics.median(totals["speculative"])
  print("\n" + "=" * 72)
  print(f"in-loop costs: plain round {t_plain * 1e3:.3f} ms; a round's calls at K = {K} "
        f"(verify of {K + 1} tokens and {K} draft tokens) {t_round * 1e3:.3f} ms")
  print(f"tau (tokens per target call) {rates['tau']:.2f}; acceptance rate "
        f"{rates['alpha']:.2f} per draft token judged ({rates['draft_accept']:.2f} of all "
        f"drafts proposed)")
  print(f"{'run':12s} {'tokens':>7s} {'seconds':>8s} {'tok/s':>8s} {'speedup':>8s} {'ideal':>6s}")
  print(f"{'baseline':12s} {base_tokens:7d} {base_t:8.3f} {base_tokens / base_t:8.1f} "
        f"{1.0:8.2f} {1.0:6.2f}")
  print(f"{'speculative':12s} {emitted:7d} {spec_t:8.3f} {emitted / spec_t:8.1f} "
        f"{base_t / spec_t:8.2f} {ideal:6.2f}")
  print(f"medians of {args.repeats} interleaved repeats over all prompts; ideal = tau * T_step "
        f"/ (T_verify + K * T_draft), in-loop times (verify and draft back to back), each "
        f"plus a plain round's bookkeeping. "
        f"Outputs identical: {all_equal}. "
        f"Total {time.perf_counter() - t_start:.0f} s.")
  if not all_equal:
    print("ERROR: speculative output differs from baseline", file=sys.stderr)
    return 1
  return 0


def generate(args) -> int:
  """Complete one text prompt with the shipped (or given) model, optionally speculatively."""
  import jspec
  from jspec.models import shipped

  if args.target is not None:
    target = jspec.load(args.target, dtype="float32")
  else:
    target = shipped.load(shipped.TARGET, path=args.checkpoints)
  draft = None
  if args.speculative or args.draft is not None:
    draft = (jspec.load(args.draft, dtype="float32") if args.draft is not None
             else shipped.load(shipped.DRAFT, path=args.checkpoints))
  texts = jspec.generate_text(target, args.prompt, draft=draft, num_draft_tokens=args.k,
                              max_new_tokens=args.max_new_tokens,
                              temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              seed=args.seed)
  sys.stdout.write(args.prompt + texts[0] + "\n")
  return 0


def _target_and_draft(args):
  """--target / --drafter: checkpoint dirs, "ngram[:N]", or the shipped models by default."""
  import jspec
  from jspec.models import shipped

  target = (jspec.load(args.target, dtype="float32") if args.target
            else shipped.load(shipped.TARGET, path=args.checkpoints))
  spec = args.drafter
  if spec is None:
    return target, shipped.load(shipped.DRAFT, path=args.checkpoints)
  if spec.startswith("ngram"):
    max_ngram = int(spec.split(":", 1)[1]) if ":" in spec else 3
    return target, jspec.NGram(target.vocab_size, max_ngram=max_ngram)
  return target, jspec.load(spec, dtype="float32")


def measure(args) -> int:
  """Acceptance, tau and speedup per K on the user's prompts (jspec/measure.py)."""
  from jspec import measure as M

  target, drafter = _target_and_draft(args)
  if target.tokenizer is None:
    raise SystemExit(f"{args.target}: the target has no tokenizer to encode text prompts")
  texts = M.read_prompts(args.prompts)
  prompts = [target.tokenizer.encode(t)[0] for t in texts]
  ks = [int(k) for k in args.k.split(",")]
  report = M.measure(target, drafter, prompts, ks=ks, max_new_tokens=args.max_new_tokens,
                     batch_size=args.batch_size, temperature=args.temperature,
                     repeats=args.repeats)
  print(M.format_table(report))
  if args.json:
    import json
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)
    print(f"wrote {args.json}")
  if args.plot:
    M.plot(report, args.plot)
    print(f"wrote {args.plot}")
  return 0


def bench(args) -> int:
  """Side-by-side benchmark (jspec/bench.py): shipped models, or random-init ones on --device gpu."""
  import jax

  import jspec
  from jspec import bench as bench_lib
  from jspec.models import shipped

  ints = lambda text: tuple(int(x) for x in text.split(",") if x.strip())
  s = bench_lib.Settings(batches=ints(args.batches), ks=ints(args.k), k=args.fixed_k,
                         max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                         transformers=not args.no_transformers)
  if args.device == "gpu":
    if jax.default_backend() == "cpu":
      print("--device gpu needs an accelerator; jax sees only the CPU", file=sys.stderr)
      return 2
    big = lambda layers, hidden: jspec.models.TransformerConfig(
        vocab_size=32000, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers, num_attention_heads=hidden // 128,
        num_key_value_heads=max(hidden // 512, 1), max_position_embeddings=4096)
    target = jspec.models.init(big(24, 2048), seed=0, dtype="bfloat16")
    draft = jspec.models.init(big(4, 1024), seed=1, dtype="bfloat16")
    print(f"jspec bench on {jax.devices()[0].device_kind}: random-init target "
          f"{target.num_params():,} params, draft {draft.num_params():,} (bf16)", flush=True)
    report = {"devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
              "target_params": target.num_params(), "draft_params": draft.num_params(),
              "settings": dataclasses.asdict(s),
              "device": bench_lib.device_report(target, draft, s.batches, s.ks, s)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_device.json"), "w") as f:
      json.dump(report, f, indent=1)
    return 0
  path = shipped.checkpoints_dir(args.checkpoints)
  target = shipped.load(shipped.TARGET, path=path)
  draft = shipped.load(shipped.DRAFT, path=path)
  sections = tuple(x for x in args.sections.split(",") if x)
  heads = shipped.load_heads(target, path=path) if "heads" in sections else None
  report = bench_lib.run(target, draft, shipped.heldout(path), s, args.out, sections=sections,
                         self_drafters=heads)
  print(bench_lib.summary(report))
  print(f"wrote {os.path.join(args.out, 'bench.json')} and {len(report['figures'])} figures")
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
  """Entry point of the `jspec` command."""
  parser = argparse.ArgumentParser(prog="jspec", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("demo", help="shipped models: baseline vs speculative, checked equal, timed")
  p.add_argument("--k", type=int, default=4, help="draft tokens per round")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--prompts", type=int, default=6, help="how many held-out prompts")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  p.set_defaults(func=demo)
  p = sub.add_parser("generate", help="complete a text prompt (shipped code model by default)")
  p.add_argument("--prompt", required=True)
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
  p.add_argument("--top-k", type=int, default=0, help="0 turns top-k off")
  p.add_argument("--top-p", type=float, default=1.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--speculative", action="store_true", help="draft with the shipped draft")
  p.add_argument("--k", type=int, default=4, help="draft tokens per round")
  p.add_argument("--target", default=None, help="checkpoint directory (default: shipped)")
  p.add_argument("--draft", default=None, help="draft checkpoint directory (implies "
                 "--speculative)")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  p.set_defaults(func=generate)
  p = sub.add_parser("measure", help="acceptance, tau and speedup per K on your prompts")
  p.add_argument("--target", default=None, help="checkpoint directory (default: shipped)")
  p.add_argument("--drafter", default=None,
                 help="draft checkpoint directory, or ngram[:MAX] (default: shipped draft)")
  p.add_argument("--prompts", required=True,
                 help="JSONL (one prompt per line) or text with prompts separated by '---' lines")
  p.add_argument("--k", default="1,2,4,8", help="comma-separated K sweep")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--batch-size", type=int, default=1)
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--json", default=None, help="write the report as JSON here")
  p.add_argument("--plot", default=None, help="write a PNG of tau and speedup against K")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  p.set_defaults(func=measure)
  p = sub.add_parser("bench", help="baseline vs drafters over batch sizes and K; vs transformers")
  p.add_argument("--batches", default="1,2,4,8,16,32,64")
  p.add_argument("--k", default="1,2,3,4,6", help="K sweep at batch 1")
  p.add_argument("--fixed-k", type=int, default=4, help="K of the batch sweep and task runs")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default="docs/bench", help="folder for bench.json and the figures")
  p.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                 help="gpu: larger random-init models, verify cost against decode cost")
  p.add_argument("--sections", default="k_sweep,batch_sweep,tasks,floor,transformers",
                 help="which parts to run (comma-separated; also: heads, the Medusa / EAGLE / "
                      "draft-model chains and trees)")
  p.add_argument("--no-transformers", action="store_true",
                 help="skip the PyTorch transformers comparison")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  p.set_defaults(func=bench)
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
  for name, module in (("train-medusa", "train_medusa"), ("train-eagle", "train_eagle")):
    what = "Medusa heads" if name == "train-medusa" else "an EAGLE head"
    p = sub.add_parser(name, add_help=False,
                       help=f"train {what} on a frozen target (shipped code-target by default); "
                            f"`jspec {name} --help` lists the options")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=(lambda module: lambda args: _train_heads(module, args.rest))(module))
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv and argv[0] in ("train-medusa", "train-eagle"):  # their options are the modules' own
    return _train_heads(argv[0].replace("-", "_"), argv[1:])
  args = parser.parse_args(argv)
  return args.func(args)


def _train_heads(module: str, argv) -> int:
  """`jspec train-medusa` / `train-eagle`: the training modules' own command lines."""
  import importlib

  return importlib.import_module(f"jspec.models.{module}").main(argv)


if __name__ == "__main__":
  sys.exit(main())
