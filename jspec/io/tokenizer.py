"""Text <-> token ids: a thin wrapper over Hugging Face `tokenizers`.

The engine speaks token ids only; this host-side object rides on a
`jspec.Model` (never inside a jitted program) so that text helpers and the
CLI can turn prompts into ids and outputs back into text. It reads the one
file every Hugging Face checkpoint with a fast tokenizer ships,
`tokenizer.json`, and the stop ids from `generation_config.json` (what
`transformers` generation obeys) or else `config.json`. Chat templates are
rendered the way `transformers` renders them, so a prompt built here is the
same string (and the same ids) the model saw in fine-tuning.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
from typing import Any, Sequence

import numpy as np

TOKENIZER_FILE = "tokenizer.json"
# Written back untouched on save, so an exported directory keeps its special
# tokens and chat template for `transformers.AutoTokenizer`.
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# The special-token strings a chat template sees by name, as in transformers.
TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                   "mask_token")


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Tokenizer:
  """A `tokenizers.Tokenizer` plus the checkpoint's stop ids.

  `encode` always returns a batch (a list of id lists), the shape
  `jspec.generate` takes; `decode` reads one output row, which ends at the
  first -1 (the padding `generate` leaves after a row's end).
  """

  backend: Any  # tokenizers.Tokenizer
  eos_ids: tuple[int, ...] = ()
  config: dict | None = None  # tokenizer_config.json, kept for export

  @property
  def vocab_size(self) -> int:
    """Number of ids the tokenizer knows, added tokens included."""
    return int(self.backend.get_vocab_size(with_added_tokens=True))

  def __repr__(self) -> str:
    # One line: the fields' own reprs spell out the whole vocabulary and merges (and a
    # Model's repr holds its tokenizer's).
    kind = type(self.backend.model).__name__
    template = "with" if self.chat_template is not None else "no"
    return (f"Tokenizer({kind}, vocab_size={self.vocab_size}, eos_ids={self.eos_ids}, "
            f"{template} chat template)")

  def encode(self, texts: str | Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids per text; a single string is a batch of one."""
    if isinstance(texts, str):
      texts = [texts]
    if not all(isinstance(t, str) for t in texts):
      raise TypeError(f"encode takes a string or a list of strings, got {texts!r}")
    encodings = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
    return [list(e.ids) for e in encodings]

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    """Text of one row of ids, up to its first -1."""
    row = np.asarray(ids).reshape(-1).tolist()
    if -1 in row:
      row = row[:row.index(-1)]
    return self.backend.decode(row, skip_special_tokens=skip_special_tokens)

  def decode_batch(self, rows, skip_special_tokens: bool = True) -> list[str]:
    """`decode` of every row of a [B, N] array (e.g. `GenerateOutput.tokens`)."""
    return [self.decode(r, skip_special_tokens) for r in rows]

  @property
  def chat_template(self) -> str | None:
    """The Jinja chat template of tokenizer_config.json, or None without one."""
    template = (self.config or {}).get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one is the chat format
      template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template

  def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = False,
                          tokenize: bool = False, **kwargs) -> str | list[int]:
    """The prompt text of a conversation (its ids when `tokenize`), as transformers renders it.

    `messages` are {"role", "content"} dicts; `add_generation_prompt` appends the
    header of an assistant turn so the model answers next. Extra keyword
    arguments reach the template as variables (e.g. `enable_thinking=False`).
    The ids are encoded without adding BOS again: the template writes every
    special token the model expects.
    """
    template = self.chat_template
    if template is None:
      raise ValueError("this tokenizer has no chat template (no 'chat_template' in its "
                       "tokenizer_config.json); format the prompt text yourself")
    variables = {}
    for name in TEMPLATE_TOKENS:
      value = (self.config or {}).get(name)
      if isinstance(value, dict):  # an AddedToken, serialised
        value = value.get("content")
      if isinstance(value, str):
        variables[name] = value
    variables.update(kwargs)
    text = render_chat_template(template, messages, add_generation_prompt, **variables)
    return self.encode(text, add_special_tokens=False)[0] if tokenize else text

  def save(self, directory) -> None:
    """Write tokenizer.json (and tokenizer_config.json when known) into `directory`."""
    os.makedirs(directory, exist_ok=True)
    self.backend.save(os.path.join(directory, TOKENIZER_FILE))
    if self.config is not None:
      with open(os.path.join(directory, TOKENIZER_CONFIG_FILE), "w") as f:
        json.dump(self.config, f, indent=2)


def load_tokenizer(directory, eos_ids: Sequence[int] | None = None) -> Tokenizer | None:
  """The tokenizer saved in `directory`, or None when it has no tokenizer.json.

  `eos_ids` overrides the stop ids read from the directory's
  generation_config.json / config.json.
  """
  from tokenizers import Tokenizer as Backend

  path = os.path.join(directory, TOKENIZER_FILE)
  if not os.path.isfile(path):
    return None
  try:
    backend = Backend.from_file(path)
  except Exception as e:  # the Rust error names neither the file nor the fix
    raise ValueError(f"cannot read tokenizer {path}: {e}") from e
  config = _read_json(os.path.join(directory, TOKENIZER_CONFIG_FILE))
  ids = read_eos_ids(directory) if eos_ids is None else tuple(int(i) for i in eos_ids)
  return Tokenizer(backend=backend, eos_ids=ids, config=config)


def read_eos_ids(directory) -> tuple[int, ...]:
  """Stop ids of a Hugging Face directory: generation_config.json's
  eos_token_id (an int or a list), else config.json's; () when neither has one."""
  for name in ("generation_config.json", "config.json"):
    value = (_read_json(os.path.join(directory, name)) or {}).get("eos_token_id")
    if value is None:
      continue
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
      raise ValueError(f"{os.path.join(directory, name)}: eos_token_id must be a non-negative "
                       f"int or a list of them, got {value!r}")
    return tuple(values)
  return ()


def render_chat_template(template: str, messages: Sequence[dict],
                         add_generation_prompt: bool = False, **variables) -> str:
  """`template` rendered over `messages` in transformers' Jinja environment.

  The same sandbox, whitespace rules and helpers (`raise_exception`, a
  `tojson` that keeps non-ASCII text, `strftime_now`) as transformers, so
  templates written for it render to the same text here.
  """
  if not all(isinstance(m, dict) for m in messages):
    raise TypeError(f"messages must be a list of dicts with 'role' and 'content', got {messages!r}")
  variables.setdefault("tools", None)
  variables.setdefault("documents", None)
  messages = [dict(m) for m in messages]  # the template sees copies
  variables["add_generation_prompt"] = add_generation_prompt
  return _compile_template(template).render(messages=messages, **variables)


@functools.lru_cache(maxsize=16)
def _compile_template(template: str):
  try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
  except ImportError as e:
    raise ImportError("chat templates need jinja2: pip install jinja2") from e

  class Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; it
    renders its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[Generation, jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env.from_string(template)


def _read_json(path) -> dict | None:
  if not os.path.isfile(path):
    return None
  try:
    with open(path) as f:
      value = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"cannot parse {path}: {e}") from e
  if not isinstance(value, dict):
    raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
  return value
