"""Token-level constraints: a regular expression or a JSON schema as static tables.

Constrained generation keeps one automaton state per batch row. Compiling the
constraint happens once, on the host: `outlines-core` turns the pattern and the
vocabulary's token bytes into a token-level index, which is stored here as a dense
table so that the jitted decoder needs only gathers:

    next_state [Q, V] int32   state after emitting token v in state q; -1: not allowed
    final      [Q]    bool    states where the text so far matches the whole pattern

State 0 is the initial state and -1 is the dead state (a row that left the
language, or one whose positions are discarded anyway). Every reachable state
allows at least one token, and every allowed token keeps a full match reachable,
so masking with `allowed` never leaves a live row with nothing to sample. EOS ids
are allowed in final states only, and loop back to the same state: the decoder
ends a row at its EOS, so nothing after it matters, and the row stays live.

Patterns use Rust's regex syntax (regex-automata), which agrees with Python's `re`
on the common constructs but has no backreferences or look-around; the whole
text must match, so write patterns without ^ and $.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

# Prefixed to every pattern, and spelled by a stand-in token, so that the state
# after it is the pattern's own start. See `_index` for why.
_SENTINEL = b"\x00"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_DECODER_STEPS = frozenset({"ByteLevel", "Replace", "Metaspace", "ByteFallback", "Fuse", "Strip"})


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Constraint:
  """A compiled constraint: one automaton over token ids, initial state 0.

  Build it with `from_regex` or `from_json_schema`; pass it (a pytree of two
  arrays) into jitted code and use `allowed`, `advance` and `mask_logits` there.
  """

  next_state: jax.Array  # [Q, V] int32: state after token v in state q; -1: v not allowed
  final: jax.Array  # [Q] bool: the text so far is a full match (EOS allowed)

  @property
  def num_states(self) -> int:
    """Q, the automaton's states (reachable ones that can still reach a full match)."""
    return int(self.next_state.shape[0])

  @property
  def vocab_size(self) -> int:
    """V, which must equal the model's vocabulary size (the decoder checks)."""
    return int(self.next_state.shape[1])

  @classmethod
  def from_regex(cls, pattern: str, vocabulary, eos_ids: Sequence[int] | None = None
                 ) -> "Constraint":
    """Texts that match `pattern` whole, spelled with `vocabulary`'s tokens.

    `vocabulary` is a `jspec.Tokenizer` (or a `tokenizers.Tokenizer`) or a
    sequence giving each id's text (str, bytes, or None for an id never allowed).
    `eos_ids` defaults to the tokenizer's `eos_ids` (none for a plain sequence);
    they never count as text. Raises ValueError for an invalid pattern, one that
    no token sequence matches, and one where some text the tokens can spell has
    no token to continue it (outlines-core rejects those rather than pruning them).
    """
    return cls._build(pattern, vocabulary, eos_ids, f"regex {pattern!r}")

  @classmethod
  def from_json_schema(cls, schema: dict | str, vocabulary, eos_ids: Sequence[int] | None = None,
                       whitespace_pattern: str | None = None) -> "Constraint":
    """JSON texts valid under `schema`, via outlines-core's schema-to-regex.

    `whitespace_pattern` is the regex allowed between JSON tokens (outlines-core's
    default is at most one space, which keeps the automaton small).
    """
    from outlines_core.json_schema import build_regex_from_schema

    text = schema if isinstance(schema, str) else json.dumps(schema)
    name = f"JSON schema {text if len(text) <= 200 else text[:200] + '...'}"
    try:
      pattern = build_regex_from_schema(text, whitespace_pattern)
    except (ValueError, TypeError) as e:  # TypeError: text that is not JSON
      raise ValueError(f"cannot compile {name}: {e}") from e
    return cls._build(pattern, vocabulary, eos_ids, name)

  @classmethod
  def _build(cls, pattern, vocabulary, eos_ids, name) -> "Constraint":
    pieces, default_eos = token_bytes(vocabulary)
    vocab_size = len(pieces)
    eos = tuple(int(i) for i in (default_eos if eos_ids is None else eos_ids))
    if not all(0 <= i < vocab_size for i in eos):
      raise ValueError(f"eos_ids {eos} must lie in [0, {vocab_size})")
    table, final = _dense_index(pattern, pieces, set(eos), name)
    if not eos and (final & ~(table >= 0).any(axis=1)).any():
      raise ValueError(f"{name}: a full match can be followed by nothing but EOS, and no eos_ids "
                       "were given (pass eos_ids, or use a tokenizer that has them)")
    for q in np.flatnonzero(final):
      table[q, list(eos)] = q
    return cls(next_state=jnp.asarray(table), final=jnp.asarray(final))


def allowed(constraint: Constraint, states: jax.Array) -> jax.Array:
  """Tokens allowed next: states [...] int32 -> bool [..., V].

  A dead state (-1) allows everything: such positions are discarded anyway, and
  an all-False row would turn softmax into NaN there.
  """
  rows = constraint.next_state[jnp.maximum(states, 0)] >= 0
  return rows | (states < 0)[..., None]


def advance(constraint: Constraint, states: jax.Array, tokens: jax.Array) -> jax.Array:
  """States after emitting `tokens` (same shape as `states`), int32.

  -1 stays -1; a token that is not allowed (or not an id, such as -1 padding) gives -1.
  """
  ok = (states >= 0) & (tokens >= 0) & (tokens < constraint.vocab_size)
  nxt = constraint.next_state[jnp.where(ok, states, 0), jnp.where(ok, tokens, 0)]
  return jnp.where(ok, nxt, -1)


def mask_logits(logits: jax.Array, constraint: Constraint, states: jax.Array) -> jax.Array:
  """logits [B, N, V] with ids not allowed in states [B, N] set to -inf (dead rows unchanged)."""
  if logits.shape[-1] != constraint.vocab_size:
    raise ValueError(f"logits have {logits.shape[-1]} ids but the constraint was built for "
                     f"{constraint.vocab_size}")
  return jnp.where(allowed(constraint, states), logits, jnp.asarray(-jnp.inf, logits.dtype))


def token_bytes(vocabulary) -> tuple[list[bytes | None], tuple[int, ...]]:
  """(the bytes each id adds to the text, None where it is never allowed; default EOS ids).

  Special tokens of a tokenizer are never allowed (EOS is added back by id). A
  token's bytes are those it adds in the middle of a text: decoders' Strip steps,
  which trim the start of the whole text, are not applied.
  """
  backend = getattr(vocabulary, "backend", None)
  if backend is None and hasattr(vocabulary, "id_to_token"):
    backend = vocabulary
  if backend is None:
    if isinstance(vocabulary, (str, bytes)):
      raise TypeError("vocabulary must be a tokenizer or a sequence of token texts, got a string")
    return [p.encode() if isinstance(p, str) else None if p is None else bytes(p)
            for p in vocabulary], ()
  eos = tuple(getattr(vocabulary, "eos_ids", ()))
  steps = _decoder_steps(json.loads(backend.to_str()).get("decoder"))
  added = backend.get_added_tokens_decoder()
  pieces = []
  for i in range(backend.get_vocab_size(with_added_tokens=True)):
    if i in added:  # added tokens are matched whole and decode to their own text
      pieces.append(None if added[i].special else added[i].content.encode())
    else:
      token = backend.id_to_token(i)
      pieces.append(None if token is None else _decode_piece(token, steps))
  return pieces, eos


def _decoder_steps(config: dict | None) -> list[dict]:
  """A tokenizer.json decoder as a flat list of steps, checked to be ones handled here."""
  if config is None:
    return []
  steps = ([s for d in config["decoders"] for s in _decoder_steps(d)]
           if config["type"] == "Sequence" else [config])
  for step in steps:
    if step["type"] not in _DECODER_STEPS:
      raise ValueError(f"tokenizer decoder {step['type']!r} is not supported for constraints "
                       f"(supported: byte-level BPE and SentencePiece-style: "
                       f"{', '.join(sorted(_DECODER_STEPS))})")
  return steps


def _decode_piece(token: str, steps: list[dict]) -> bytes:
  """The bytes one vocabulary token adds to decoded text."""
  piece: str | bytes = token
  for step in steps:
    if isinstance(piece, bytes):  # a byte token (or byte-level text) is final
      break
    kind = step["type"]
    if kind == "ByteLevel":
      # GPT-2 spells each byte as a printable character ("Ġ" for a space).
      piece = b"".join(bytes([_GPT2_BYTES[c]]) if c in _GPT2_BYTES else c.encode()
                       for c in piece)
    elif kind == "Replace":
      pattern = step["pattern"]
      piece = (piece.replace(pattern["String"], step["content"]) if "String" in pattern
               else re.sub(pattern["Regex"], step["content"], piece))
    elif kind == "Metaspace":
      piece = piece.replace(step.get("replacement", "\u2581"), " ")
    elif kind == "ByteFallback":
      m = _BYTE_TOKEN.fullmatch(piece)
      if m:
        piece = bytes([int(m[1], 16)])
    # Fuse joins tokens and Strip trims the whole text's start: neither changes one token.
  return piece if isinstance(piece, bytes) else piece.encode()


def _gpt2_bytes() -> dict[str, int]:
  """GPT-2's byte-to-unicode table, reversed: printable bytes stand for themselves,
  the rest are shifted to code points from 256 on."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
               *range(ord("®"), ord("ÿ") + 1)]
  chars, extra = {}, 0
  for b in range(256):
    if b in printable:
      chars[chr(b)] = b
    else:
      chars[chr(256 + extra)] = b
      extra += 1
  return chars


_GPT2_BYTES = _gpt2_bytes()


def _index(pattern: str, pieces: list[bytes | None], eos: set[int], name: str):
  """(outlines-core Index, the state where the pattern starts).

  regex-automata's DFAs use leftmost-first semantics: once a preferred branch has
  matched, the others are dropped, so `a|ab` would reject "ab". Ending the pattern
  with $ makes every match wait for the end of the text, which restores full-match
  semantics; but a $ reachable from the start (a pattern that matches "") leaves
  the DFA without a single start state, so the pattern is also prefixed with a
  sentinel byte, spelled by a stand-in token id V, and the state after it is ours.
  """
  import outlines_core

  vocab_size = len(pieces)
  tokens: dict[bytes, list[int]] = {}
  for i, piece in enumerate(pieces):
    # Empty tokens add no text and could be emitted forever: never allowed.
    if piece and i not in eos:
      tokens.setdefault(piece, []).append(i)
  tokens.setdefault(_SENTINEL, []).append(vocab_size)
  wrapped = rf"\x00(?:{pattern})$"
  try:  # outlines-core's EOS handling is replaced by ours: a stand-in id V + 1
    index = outlines_core.Index(wrapped, outlines_core.Vocabulary(vocab_size + 1, tokens))
  except ValueError as e:
    detail = str(e).replace(wrapped, pattern)
    if "incompatible" in detail:
      raise ValueError(f"{name} cannot be followed with this vocabulary: some text it "
                       f"reaches has no allowed token next ({detail})") from e
    raise ValueError(f"invalid {name}: {detail}") from e
  start = index.get_next_state(index.get_initial_state(), vocab_size)
  if start is None:
    raise ValueError(f"{name} allows nothing: no token and no empty match")
  return index, start


def _dense_index(pattern, pieces, eos, name) -> tuple[np.ndarray, np.ndarray]:
  """([Q, V] int32, [Q] bool) of the states reachable from the pattern's start that
  can still reach a full match, renumbered densely from the start (state 0)."""
  index, start = _index(pattern, pieces, eos, name)
  vocab_size = len(pieces)
  transitions = index.get_transitions()
  order, ids = [start], {start: 0}
  rows: list[tuple[np.ndarray, np.ndarray]] = []
  while len(rows) < len(order):  # breadth-first from the start, numbering as found
    row = transitions.get(order[len(rows)], {})
    toks = np.fromiter(row.keys(), np.int64, len(row))
    nxt = np.fromiter(row.values(), np.int64, len(row))
    keep = toks < vocab_size  # drop the stand-in sentinel and EOS ids
    for s in nxt[keep]:
      if int(s) not in ids:
        ids[int(s)] = len(order)
        order.append(int(s))
    rows.append((toks[keep], np.array([ids[int(s)] for s in nxt[keep]], np.int32)))
  table = np.full((len(order), vocab_size), -1, np.int32)
  for q, (toks, nxt) in enumerate(rows):
    table[q, toks] = nxt
  final = np.array([index.is_final_state(s) for s in order], bool)

  # outlines-core rejects states with no token at all, but a state can still loop
  # without ever reaching a match (a*c with no token spelling c): keep only states
  # that can reach a final one, so no allowed token leads to a dead end.
  successors = [np.unique(row[row >= 0]) for row in table]
  live = final.copy()
  while True:
    grown = live | np.array([live[s].any() for s in successors], bool)
    if (grown == live).all():
      break
    live = grown
  if not live[0]:
    raise ValueError(f"{name} allows nothing: no token sequence of this vocabulary "
                     "reaches a full match")
  renumber = np.where(live, np.cumsum(live) - 1, -1).astype(np.int32)
  table = np.where(table >= 0, renumber[np.maximum(table, 0)], -1).astype(np.int32)
  return table[live], final[live]
