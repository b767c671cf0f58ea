"""Token-level constraints (jspec.core.constraint): tables against Python's `re`,
JSON schemas, real tokenizers' bytes, errors, and the jitted helpers."""

import itertools
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer as Backend, decoders, models, pre_tokenizers, trainers

import jspec
from jspec.core.constraint import Constraint, advance, allowed, mask_logits, token_bytes

# Id 8 adds no text (never allowed); id 9 is EOS.
VOCAB = ["a", "b", "ab", "ba", "0", "1", "01", "-", "", "<eos>"]
EOS = 9
TEXT_IDS = range(8)
PATTERNS = ["a|ab", "(ab)*", "a+b?", "[01]{2}-?[01]", "(a|b)*abb", "0|1[01]*", "a??b", "(a|b)-?(0|1)*"]


def walk(constraint, sequences):
  """States after each token sequence (all of one length), walked with `advance`."""
  states = jnp.zeros((len(sequences),), jnp.int32)
  for column in np.asarray(sequences, np.int32).reshape(len(sequences), -1).T:
    states = advance(constraint, states, jnp.asarray(column))
  return np.asarray(states)


def completion(table, final, state):
  """Token ids of a shortest path from `state` to a final state (breadth-first)."""
  paths = {state: []}
  frontier = [state]
  while frontier:
    q = frontier.pop(0)
    if final[q]:
      return paths[q]
    for v in np.flatnonzero(table[q] >= 0):
      r = int(table[q, v])
      if r not in paths:
        paths[r] = paths[q] + [int(v)]
        frontier.append(r)
  raise AssertionError(f"state {state} cannot reach a final state")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_regex_agrees_with_fullmatch(pattern):
  constraint = Constraint.from_regex(pattern, VOCAB, eos_ids=[EOS])
  table, final = np.asarray(constraint.next_state), np.asarray(constraint.final)
  assert table.dtype == np.int32 and final.dtype == bool
  assert table.shape == (constraint.num_states, len(VOCAB)) and constraint.vocab_size == len(VOCAB)
  assert (table[:, 8] == -1).all()  # the empty token
  assert ((table[:, EOS] >= 0) == final).all()  # EOS in final states only, looping back
  assert (table[final, EOS] == np.flatnonzero(final)).all()
  assert ((table >= 0).any(axis=1)).all()  # no dead ends
  assert final[0] == bool(re.fullmatch(pattern, ""))
  for length in (1, 2, 3):
    sequences = list(itertools.product(TEXT_IDS, repeat=length))
    states = walk(constraint, sequences)
    for seq, state in zip(sequences, states):
      text = "".join(VOCAB[i] for i in seq)
      matches = re.fullmatch(pattern, text) is not None
      assert matches == (state >= 0 and final[state]), (pattern, text, state)
      if state >= 0:  # walkable: a prefix of some match
        rest = "".join(VOCAB[i] for i in completion(table, final, int(state)))
        assert re.fullmatch(pattern, text + rest), (pattern, text, rest)
      else:  # dead: no short extension matches either
        for extra in itertools.chain([()], *(itertools.product(TEXT_IDS, repeat=n) for n in (1, 2))):
          assert not re.fullmatch(pattern, text + "".join(VOCAB[i] for i in extra))


def test_unreachable_branches_are_pruned():
  """`a*c` cannot finish without a token spelling c, so "a" is not allowed."""
  constraint = Constraint.from_regex("a*c|b", VOCAB, eos_ids=[EOS])
  assert np.flatnonzero(np.asarray(allowed(constraint, jnp.zeros((), jnp.int32)))).tolist() == [1]


def char_tokenize(text, vocabulary):
  """Greedy longest-match tokenisation over a plain vocabulary."""
  ids, i = [], 0
  while i < len(text):
    best = max((j for j, t in enumerate(vocabulary) if t and text.startswith(t, i)),
               key=lambda j: len(vocabulary[j]))
    ids.append(best)
    i += len(vocabulary[best])
  return ids


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.mark.parametrize("as_text", [False, True])
def test_json_schema_accepts_valid_and_rejects_invalid(as_text):
  vocabulary = [chr(c) for c in range(32, 127)] + ['{"', '":', '","', '"name"', '"age"', "42", "<eos>"]
  eos = len(vocabulary) - 1
  schema = json.dumps(SCHEMA) if as_text else SCHEMA
  constraint = Constraint.from_json_schema(schema, vocabulary, eos_ids=[eos])
  final = np.asarray(constraint.final)

  def state_of(text):
    return int(walk(constraint, [char_tokenize(text, vocabulary)])[0])

  for valid in ['{"name":"Bo","age":42}', '{ "name": "Bo \\"B\\"", "age": -7 }']:
    state = state_of(valid)
    assert state >= 0 and final[state], valid
    assert int(advance(constraint, jnp.int32(state), jnp.int32(eos))) == state
  for invalid in ['{"name":"Bo","age":"42"}', '{"name":"Bo"}', '{"name":"Bo","age":4.5}']:
    state = state_of(invalid)
    assert state < 0 or not final[state], invalid
  assert state_of('{"name":"Bo","age":"') == -1


def byte_level_tokenizer():
  backend = Backend(models.BPE())
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>", "<pad>"], show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  backend.train_from_iterator(["call 555-1234 now", "héllo wörld", "naïve café 987-6543",
                               "日本語のテキスト", "a b c 0 1 2"] * 20, trainer)
  return jspec.Tokenizer(backend=backend, eos_ids=(backend.token_to_id("<eos>"),))


def sentencepiece_tokenizer():
  """SentencePiece-style BPE as jspec.io.gguf_tokenizer builds it: "▁" for a
  space, <0xNN> byte tokens, special <unk>/<s>/</s>."""
  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
  for piece in ["\u2581", "a", "b", "\u2581a", "\u2581b", "ab", "\u2581ab", "é"]:
    vocab[piece] = len(vocab)
  backend = Backend(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                              for t in ("<unk>", "<s>", "</s>")])
  backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                       decoders.Fuse(), decoders.Strip(" ", 1, 0)])
  return jspec.Tokenizer(backend=backend, eos_ids=(2,))


@jax.jit
def sample_step(constraint, states, logits):
  """One greedy step of a constrained decoder: mask, argmax, advance."""
  tokens = jnp.argmax(mask_logits(logits, constraint, states), axis=-1).astype(jnp.int32)
  return tokens, advance(constraint, states, tokens)


@pytest.mark.parametrize("make, pattern", [
    (byte_level_tokenizer, r"(héllo|café) w[öo]rld [0-9]{3}-[0-9]{2}"),
    (byte_level_tokenizer, r"日本語[のテキスト]{1,4} [a-zé]{1,6}"),
    (sentencepiece_tokenizer, r"(a|b)+( (a|b)+)*[éè]?"),
])
def test_real_tokenizer_walks_spell_matches(make, pattern):
  tok = make()
  backend = tok.backend
  pieces, eos = token_bytes(tok)
  assert eos == tok.eos_ids and len(pieces) == tok.vocab_size
  a = backend.token_to_id("a")
  for i, piece in enumerate(pieces):  # the bytes each id adds, as the decoder spells them
    if piece is not None and i != a:
      try:
        text = piece.decode()
      except UnicodeDecodeError:  # part of a character: decode would show U+FFFD
        continue
      assert backend.decode([a, i]) == "a" + text, (i, backend.id_to_token(i), piece)
  specials = [i for i, t in backend.get_added_tokens_decoder().items() if t.special]
  assert all(pieces[i] is None for i in specials)

  constraint = Constraint.from_regex(pattern, tok)
  table = np.asarray(constraint.next_state)
  assert (table[:, [i for i in specials if i not in tok.eos_ids]] == -1).all()
  rng = np.random.default_rng(0)
  batch, steps = 8, 40
  states = jnp.zeros((batch, 1), jnp.int32)
  rows = [[] for _ in range(batch)]
  done = np.zeros(batch, bool)
  for _ in range(steps):
    logits = jnp.asarray(rng.normal(size=(batch, 1, tok.vocab_size)), jnp.float32)
    tokens, states = sample_step(constraint, states, logits)
    for b, t in enumerate(np.asarray(tokens)[:, 0]):
      if not done[b]:
        done[b] = t in tok.eos_ids
        if not done[b]:
          rows[b].append(int(t))
  assert done.all() and (np.asarray(states) >= 0).all()
  texts = [backend.decode(r) for r in rows]
  assert all(re.fullmatch(pattern, t) for t in texts), texts
  assert len(set(texts)) > 1  # the walks explored different tokens


def test_errors_name_the_pattern():
  with pytest.raises(ValueError, match=r"invalid regex '\(ab'"):
    Constraint.from_regex("(ab", VOCAB, eos_ids=[EOS])
  with pytest.raises(ValueError, match=r"regex 'c\+' cannot be followed"):
    Constraint.from_regex("c+", VOCAB, eos_ids=[EOS])  # no token spells c
  with pytest.raises(ValueError, match="regex 'a\\*c' allows nothing"):
    Constraint.from_regex("a*c", VOCAB, eos_ids=[EOS])  # loops on a, never finishes
  with pytest.raises(ValueError, match=re.escape("regex '[^\\\\s\\\\S]'")):
    Constraint.from_regex("[^\\s\\S]", VOCAB, eos_ids=[EOS])  # an empty language
  with pytest.raises(ValueError, match="no eos_ids"):
    Constraint.from_regex("ab", VOCAB)  # a plain vocabulary has no EOS: "ab" would strand a row
  with pytest.raises(ValueError, match="eos_ids"):
    Constraint.from_regex("ab", VOCAB, eos_ids=[len(VOCAB)])
  with pytest.raises(ValueError, match="JSON schema"):
    Constraint.from_json_schema("{not json", VOCAB, eos_ids=[EOS])


def test_helpers_under_jit():
  constraint = Constraint.from_regex("ab|ba", VOCAB, eos_ids=[EOS])
  table = np.asarray(constraint.next_state)
  states = jnp.asarray([[0, 1, -1], [2, 0, 0]], jnp.int32)  # [B, N]
  tokens = jnp.asarray([[0, 1, 0], [EOS, -1, 2]], jnp.int32)

  mask = jax.jit(allowed)(constraint, states)
  assert mask.shape == (2, 3, len(VOCAB)) and mask.dtype == jnp.bool_
  assert np.asarray(mask[0, 2]).all()  # dead: everything
  np.testing.assert_array_equal(np.asarray(mask[0, 0]), table[0] >= 0)

  nxt = jax.jit(advance)(constraint, states, tokens)
  expect = [[table[0, 0], table[1, 1], -1], [table[2, EOS], -1, table[0, 2]]]
  np.testing.assert_array_equal(np.asarray(nxt), np.asarray(expect, np.int32))
  assert nxt.dtype == jnp.int32

  logits = jnp.arange(2 * 3 * len(VOCAB), dtype=jnp.bfloat16).reshape(2, 3, len(VOCAB))
  masked = jax.jit(mask_logits)(logits, constraint, states)
  assert masked.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(masked[0, 2]), np.asarray(logits[0, 2]))
  np.testing.assert_array_equal(np.isneginf(np.asarray(masked, np.float32)), ~np.asarray(mask))
  assert np.isfinite(np.asarray(jax.nn.softmax(masked.astype(jnp.float32), axis=-1))).all()
  with pytest.raises(ValueError, match="constraint was built for"):
    mask_logits(logits[..., :-1], constraint, states)
