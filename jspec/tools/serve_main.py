"""`jspec serve`'s start: the engine built from the command line's flags, served by uvicorn.

The command line (jspec/tools/cli.py) loads --target and --drafter with the helpers every
command shares and hands them here. Programs compile as the first requests arrive, or
all before the port opens with --warmup (`Engine.warmup`), so that /health answering
means every request is served without a compile.
"""

from __future__ import annotations

import dataclasses
import functools

from jspec.planner import engine as engine_lib
from jspec.tools import server


def run(target, drafter, args, model_name: str) -> int:
  """Build the engine from `jspec serve`'s flags (`args`) and serve until SIGINT / SIGTERM."""
  import uvicorn

  from jspec.planner import cache_folder

  # Every flag is checked before anything is set up or compiled.
  tokenizer = _tokenizer(target, args.chat_template, model_name)
  options = engine_options(drafter is not None, args)
  warmup = _ints(args.warmup, "--warmup", "prompt buckets") if args.warmup not in (
      None, "all") else None
  cache_folder.enable_compilation_cache(args.cache_dir)
  try:
    engine = engine_lib.Engine(target, drafter, **options)
  except (ValueError, TypeError) as e:
    raise SystemExit(f"jspec serve: {e}") from None
  if args.warmup:
    print("compiling the engine's programs (--warmup) ...", flush=True)
    engine.warmup(warmup)
  # A chain's verify block is K + 1 slots past the answer; a tree's is wider, and the
  # engine refuses a request that does not fit it (a 400 too).
  max_length = args.cache_length - (engine.num_draft_tokens + 1)
  if target.max_length is not None:
    max_length = min(max_length, int(target.max_length))
  config = server.ServerConfig(
      model_name=model_name, vocab_size=int(target.vocab_size), max_length=max_length,
      eos_ids=tuple(int(i) for i in target.eos_ids), penalties=not args.no_penalties,
      logit_bias=not args.no_logit_bias, logprobs=args.logprobs or 0,
      constraints=args.constraint_states or 0)
  constraint_for = constraint_cache(tokenizer) if args.constraint_states else None
  service = server.Service(engine, tokenizer, config, constraint_for=constraint_for)
  app = server.App(service, on_shutdown=lambda: engine.close(drain=False, timeout=60))
  print(f"serving {model_name} on http://{args.host}:{args.port}/v1 ({args.slots} slots, "
        f"K = {options['num_draft_tokens'] or 0}, cache {args.cache_length})", flush=True)
  uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
              timeout_graceful_shutdown=args.drain_timeout, lifespan="on")
  return 0


def _ints(text: str, flag: str, what: str) -> list[int]:
  try:
    return [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    raise SystemExit(f"{flag} takes comma-separated {what}, got {text!r}") from None


def _tokenizer(target, template_path: str | None, model_name: str):
  """The target's tokenizer, with --chat-template's template when given (for a model
  whose checkpoint has none, or to replace it)."""
  tokenizer = target.tokenizer
  if tokenizer is None:
    raise SystemExit(f"{model_name} has no tokenizer: the server reads and writes text")
  if template_path:
    try:
      with open(template_path) as f:
        template = f.read()
    except OSError as e:
      raise SystemExit(f"--chat-template: {e}") from None
    tokenizer = dataclasses.replace(tokenizer, config={**(tokenizer.config or {}),
                                                      "chat_template": template})
  return tokenizer


def engine_options(drafting: bool, args) -> dict:
  """`jspec.Engine`'s keywords from the flags (SystemExit naming the flag when one is bad)."""
  k = None
  if drafting:
    k = args.num_draft_tokens
    if k != "auto":
      try:
        k = int(k)
      except ValueError:
        raise SystemExit(f"--num-draft-tokens must be auto or an integer, got {k!r}") from None
  options = dict(slots=args.slots, cache_length=args.cache_length, num_draft_tokens=k,
                 max_queue=args.max_queue, rounds=args.rounds,
                 penalties=not args.no_penalties, logit_bias=not args.no_logit_bias)
  if args.buckets:
    options["buckets"] = _ints(args.buckets, "--buckets", "batch sizes")
  # The engine's optional outputs, asked for only when used (each costs every round).
  if args.logprobs:
    options["logprobs"] = args.logprobs
  if args.constraint_states:
    options["constraints"] = args.constraint_states
  return options


def constraint_cache(tokenizer):
  """ResponseFormat -> a compiled `jspec.Constraint`: one compile per schema text (a JSON
  schema's automaton takes seconds to build; the same schema comes back request after
  request)."""
  from jspec.core import constraint as constraint_lib

  @functools.lru_cache(maxsize=64)
  def compile_schema(schema: str):
    return constraint_lib.Constraint.from_json_schema(schema, tokenizer)

  return lambda fmt: compile_schema(fmt.schema)
