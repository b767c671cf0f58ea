"""The tokenizer of a GGUF file, as a `jspec.Tokenizer`.

A GGUF (llama.cpp's format) carries no tokenizer.json: its vocabulary, merges,
token types, special ids and chat template sit in the file's metadata under
llama.cpp's key names. This rebuilds the tokenizer they describe with Hugging
Face `tokenizers`, the way `transformers` does for `gguf_file=`, so that a
quantised checkpoint is prompted with the ids its model was trained on:

  byte-level BPE ("gpt2": GPT-2, Llama 3, Qwen2, SmolLM, ...), its text split
    by the regex `tokenizer.ggml.pre` names;
  SentencePiece BPE with byte fallback ("llama": Llama 2, Mistral, Gemma),
    merges taken from the file or rebuilt from the token scores.

Where transformers and llama.cpp disagree, this follows llama.cpp and the
model's own tokenizer.json: SmolLM-style files ("smollm", "starcoder", ...)
put each digit in a piece of its own, and `tokenizer.ggml.add_space_prefix`
is obeyed. Metadata is read straight from the file (its header only; tensors
are never touched), or from an already-open `gguf.GGUFReader`.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from jspec.io.tokenizer import TEMPLATE_TOKENS, Tokenizer, render_chat_template

SUPPORTED_MODELS = ("gpt2", "llama")  # values of tokenizer.ggml.model
# llama.cpp token types: control tokens (<|im_end|>) are special, user-defined
# ones (<think>) are whole-matched text; a byte token is <0x0A>.
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the split regex its merges were learned on.
PRE_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"),
                    _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2),
    **dict.fromkeys(("gpt-4o", "llama4"), _GPT4O),
}
# Each digit its own piece, then GPT-2's split: the StarCoder family's
# tokenizer.json (Digits + ByteLevel), and llama.cpp's regexes for these.
DIGIT_PRES = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
GPT2_PRES = ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais")


def tokenizer_from_gguf(source) -> Tokenizer:
  """The tokenizer described by a GGUF file (a path or a `gguf.GGUFReader`).

  Control tokens become special (whole-matched, dropped by
  `decode(skip_special_tokens=True)`); user-defined ones are whole-matched and
  kept. `eos_ids` holds the EOS id, the end-of-turn id (from metadata, or the
  token the chat template closes an assistant turn with) so generation stops
  where a chat reply ends. `config` is a tokenizer_config.json (chat template,
  special-token strings, add_bos_token) so `save` exports a directory
  `transformers.AutoTokenizer` loads.
  """
  name, meta = _read_metadata(source)
  kind, tokens = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.tokens")
  if kind is None or not tokens:
    raise ValueError(f"{name} has no tokenizer: its metadata lacks tokenizer.ggml.model / "
                     "tokenizer.ggml.tokens")
  if kind not in SUPPORTED_MODELS:
    raise ValueError(f"{name}: tokenizer.ggml.model {kind!r} is not supported "
                     f"(supported: {', '.join(SUPPORTED_MODELS)})")
  types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
  special_ids = {}
  for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                    ("pad", "padding_token_id")):
    i = meta.get(f"tokenizer.ggml.{key}")
    if i is not None and 0 <= i < len(tokens):
      special_ids[role] = int(i)
  if kind == "gpt2":
    backend = _byte_level(tokens, types, meta.get("tokenizer.ggml.merges"), meta, name)
  else:
    backend = _sentencepiece(tokens, meta, special_ids.get("unk"))
  _add_tokens(backend, tokens, types, special_ids.values())

  config = {f"{role}_token": tokens[i] for role, i in special_ids.items()}
  add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind == "llama"))
  add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
  _set_post_processor(backend, config, add_bos, add_eos)
  config.update(add_bos_token=add_bos, add_eos_token=add_eos, clean_up_tokenization_spaces=False,
                tokenizer_class="PreTrainedTokenizerFast")
  if meta.get("tokenizer.chat_template") is not None:
    config["chat_template"] = meta["tokenizer.chat_template"]

  eos = [meta.get(f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id", "eom_token_id")]
  eos.append(_turn_end_id(config, backend))
  eos_ids = tuple(dict.fromkeys(int(i) for i in eos if i is not None and 0 <= i < len(tokens)))
  return Tokenizer(backend=backend, eos_ids=eos_ids, config=config)


def _byte_level(tokens, types, merges, meta, name):
  """Byte-level BPE: every token is spelled in GPT-2's byte alphabet, except
  added tokens, which keep their text so that text matches them whole."""
  from tokenizers import Regex, Tokenizer as Backend, decoders, models, pre_tokenizers

  if merges is None:
    raise ValueError(f"{name}: a byte-level BPE tokenizer needs tokenizer.ggml.merges")
  alphabet = set(pre_tokenizers.ByteLevel.alphabet())
  spell = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  vocab = {}
  for i, (token, kind) in enumerate(zip(tokens, types)):
    if not set(token) <= alphabet and kind not in (CONTROL, USER_DEFINED):
      token = "".join(piece for piece, _ in spell.pre_tokenize_str(token))
    vocab[token] = i
  backend = Backend(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges],
                               continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre in PRE_SPLITS:
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_SPLITS[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  elif pre in DIGIT_PRES:
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  else:
    if pre not in GPT2_PRES:
      warnings.warn(f"{name}: tokenizer.ggml.pre {pre!r} is not known here; splitting text with "
                    "GPT-2's regex, which may tokenize differently from llama.cpp", stacklevel=3)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  backend.decoder = decoders.ByteLevel()
  return backend


def _sentencepiece(tokens, meta, unk_id):
  """SentencePiece BPE with byte fallback (<0x0A> tokens), "▁" for a space.

  Files without merges (most: llama.cpp scores the pieces instead) get merges
  rebuilt from the scores, as transformers and SentencePiece's own converter
  do. Gemma stores runs of spaces as spaces and ranks by file order; Phi-3
  prefixes every piece of text with "▁", not only the first.
  """
  from tokenizers import Tokenizer as Backend, decoders, models, normalizers, pre_tokenizers

  arch = meta.get("general.architecture", "")
  gemma = arch in ("gemma", "gemma2", "gemma3")
  if gemma:
    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
  vocab = {token: i for i, token in enumerate(tokens)}
  if meta.get("tokenizer.ggml.merges") is not None:
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
  else:
    scores = ([-i for i in range(len(tokens))] if gemma
              else meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
    merges = merges_from_scores(vocab, dict(zip(tokens, scores)))
  unk = tokens[unk_id] if unk_id is not None else None
  backend = Backend(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
  prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
  steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
  if gemma:
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
  elif arch == "phi3":
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                               normalizers.Replace(" ", "\u2581")])
    steps.append(decoders.Strip(" ", 1, 0))
  else:  # "▁" before the text's first piece only, as transformers; llama.cpp also adds one
    # after each special token inside the text
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False)
    if prefix:
      steps.append(decoders.Strip(" ", 1, 0))
  backend.decoder = decoders.Sequence(steps)
  return backend


def merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
  """BPE merges implied by a scored vocabulary: every split of a token into two
  tokens, best-scored token first (ties: longer left part, then longer right
  part) -- the order transformers' `generate_merges` gives, so ids agree."""
  merges = []
  for token, score in scores.items():
    local = [(token[:k], token[k:], score) for k in range(1, len(token))
             if token[:k] in vocab and token[k:] in vocab]
    merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
  merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
  return [(left, right) for left, right, _ in merges]


def _add_tokens(backend, tokens, types, special_ids):
  """Control tokens (and BOS/EOS/UNK/PAD) as special tokens, user-defined ones
  as plain added tokens: both are matched whole before any splitting."""
  from tokenizers import AddedToken

  special = {i for i, kind in enumerate(types) if kind in (UNKNOWN, CONTROL)} | set(special_ids)
  backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                              for i in sorted(special)])
  user = [i for i, kind in enumerate(types) if kind == USER_DEFINED and i not in special]
  backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])


def _set_post_processor(backend, config, add_bos, add_eos):
  """BOS before (EOS after) each text when the file asks for it, as llama.cpp does."""
  from tokenizers import processors

  bos, eos = config.get("bos_token"), config.get("eos_token")
  add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
  single = [bos] * add_bos + ["$A"] + [eos] * add_eos  # lists: token text may hold spaces
  pair = single + [f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos
  specials = [(t, backend.token_to_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on]
  backend.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                         special_tokens=specials)


def _turn_end_id(config, backend) -> int | None:
  """Id of the special token the chat template writes right after an assistant
  reply (<|im_end|>, <|eot_id|>, <end_of_turn>), found by rendering one."""
  template = config.get("chat_template")
  if not isinstance(template, str):
    return None
  mark = "\x00reply\x00"
  try:
    text = render_chat_template(template, [{"role": "user", "content": "hi"},
                                           {"role": "assistant", "content": mark}],
                                **{k: config[k] for k in TEMPLATE_TOKENS if k in config})
  except Exception:  # a template that will not render this conversation: no turn-end token
    return None
  after = text.partition(mark)[2].lstrip()
  found = [(len(t.content), i) for i, t in backend.get_added_tokens_decoder().items()
           if t.special and after.startswith(t.content)]
  return max(found)[1] if found else None


def _read_metadata(source) -> tuple[str, dict]:
  """(a name for messages, {key: value}) of a path, a parsed `jspec.models.gguf_file.GGUFFile`
  or an open `gguf.GGUFReader`."""
  from jspec.models import gguf_file

  if isinstance(source, (str, os.PathLike)):
    path = os.fspath(source)
    return path, gguf_file.read_header(path, tensors=False).metadata
  if isinstance(source, gguf_file.GGUFFile):
    return source.path, source.metadata
  fields = getattr(source, "fields", None)
  if fields is None:
    raise TypeError(f"tokenizer_from_gguf takes a path or a gguf.GGUFReader, got {source!r}")
  name = str(getattr(getattr(source, "data", None), "filename", None) or "GGUF reader")
  return name, {key: _field_value(field) for key, field in fields.items()}


def _field_value(field):
  """A GGUFReader field as a Python value; strings decoded, arrays as lists."""
  kinds = [int(t) for t in field.types]
  parts = [field.parts[i] for i in field.data]
  if kinds[0] == 9:  # array
    if kinds[-1] == 8:
      return [bytes(p).decode() for p in parts]
    if len(kinds) > 2:  # arrays of arrays: no tokenizer key uses them
      return None
    values = np.concatenate(parts).tolist() if parts else []
    return [bool(v) for v in values] if kinds[1] == 7 else values
  if kinds[0] == 8:
    return bytes(parts[0]).decode()
  value = parts[0][0].item()
  return bool(value) if kinds[0] == 7 else value


