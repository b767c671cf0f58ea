"""Tokenizer wrapper and generate_text: tokenizers built here, never downloaded."""

import dataclasses
import json

import numpy as np
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

import jspec
from conftest import tiny_config
from jspec.io.tokenizer import load_tokenizer, read_eos_ids

SENTENCES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "speculative decoding keeps the target distribution",
    "the draft proposes and the target verifies",
]
WORDS = sorted({w for s in SENTENCES for w in s.split()})


def trained_bpe():
  """A byte-level BPE trained on SENTENCES, BOS added to every encoding."""
  backend = Backend(models.BPE(unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  backend.train_from_iterator(SENTENCES, trainer)
  backend.post_processor = processors.TemplateProcessing(
      single="<s> $A", special_tokens=[("<s>", backend.token_to_id("<s>"))])
  return backend


def word_level(vocab_size):
  """One id per word, every id in [0, vocab_size) a word, so any output decodes."""
  words = ["<unk>", "<s>"] + WORDS
  words += [f"w{i}" for i in range(vocab_size - len(words))]
  backend = Backend(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  backend.add_special_tokens(["<unk>", "<s>"])
  backend.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                         special_tokens=[("<s>", 1)])
  return backend


def write_json(path, value):
  path.write_text(json.dumps(value))


# ----------------------------------------------------------------------------- Tokenizer


def test_save_load_round_trips_text(tmp_path):
  tok = jspec.Tokenizer(trained_bpe(), eos_ids=(2,), config={"model_max_length": 64})
  tok.save(tmp_path)
  write_json(tmp_path / "generation_config.json", {"eos_token_id": [2, 0]})
  loaded = load_tokenizer(tmp_path)
  assert loaded.eos_ids == (2, 0)
  assert loaded.config == {"model_max_length": 64}
  assert loaded.vocab_size == tok.vocab_size
  texts = SENTENCES + ["the cat verifies the park"]
  ids = loaded.encode(texts)
  assert ids == tok.encode(texts)
  assert all(row[0] == loaded.backend.token_to_id("<s>") for row in ids)  # BOS added
  assert [loaded.decode(row) for row in ids] == texts  # BOS skipped on decode
  assert loaded.decode_batch(ids) == texts
  assert loaded.encode("the cat") == [loaded.encode(["the cat"])[0]]  # a string: batch of one


def test_decode_stops_at_first_pad():
  tok = jspec.Tokenizer(word_level(40))
  [ids] = tok.encode("the cat sat", add_special_tokens=False)
  row = np.array(ids + [-1, -1] + ids, np.int32)  # generate's -1 padding ends the row
  assert tok.decode(row) == "the cat sat"
  assert tok.decode(np.array([-1, *ids])) == ""


def test_encode_rejects_non_text():
  tok = jspec.Tokenizer(word_level(40))
  with pytest.raises(TypeError, match="string"):
    tok.encode([[1, 2, 3]])


def test_eos_ids_from_generation_config_then_config(tmp_path):
  assert read_eos_ids(tmp_path) == ()
  write_json(tmp_path / "config.json", {"eos_token_id": 7})
  assert read_eos_ids(tmp_path) == (7,)
  write_json(tmp_path / "generation_config.json", {"eos_token_id": [3, 4]})
  assert read_eos_ids(tmp_path) == (3, 4)  # generation_config.json wins
  write_json(tmp_path / "generation_config.json", {"do_sample": True})
  assert read_eos_ids(tmp_path) == (7,)  # falls back when it has no eos_token_id
  write_json(tmp_path / "generation_config.json", {"eos_token_id": "</s>"})
  with pytest.raises(ValueError, match="generation_config.json.*eos_token_id"):
    read_eos_ids(tmp_path)


def test_load_tokenizer_missing_and_corrupt(tmp_path):
  assert load_tokenizer(tmp_path) is None
  jspec.Tokenizer(word_level(40)).save(tmp_path)
  text = (tmp_path / "tokenizer.json").read_text()
  (tmp_path / "tokenizer.json").write_text(text[:len(text) // 2])  # truncated
  with pytest.raises(ValueError, match="tokenizer.json"):
    load_tokenizer(tmp_path)
  (tmp_path / "tokenizer.json").write_text(text)
  (tmp_path / "generation_config.json").write_text("{\"eos_token_id\": ")
  with pytest.raises(ValueError, match="generation_config.json"):
    load_tokenizer(tmp_path)


# ----------------------------------------------------------------------------- generate_text


@pytest.fixture(scope="module")
def text_model():
  V = 40
  model = jspec.models.init(tiny_config(vocab_size=V, scale=0.5), seed=0)
  return dataclasses.replace(model, tokenizer=jspec.Tokenizer(word_level(V)))


@pytest.mark.slow
def test_generate_text_stops_at_eos(text_model):
  tok = text_model.tokenizer
  prompt = "the draft proposes"
  n = 12
  ids = np.asarray(jspec.generate(text_model, tok.encode(prompt), max_new_tokens=n).tokens)[0]
  # EOS: the first greedy token not seen before it, at position >= 1, so the cut is predictable.
  i = next(i for i in range(1, n) if ids[i] not in ids[:i])
  eos = int(ids[i])
  model = dataclasses.replace(text_model, eos_ids=(eos,))

  [text] = jspec.generate_text(model, prompt, max_new_tokens=n)
  assert text == tok.decode(ids[:i])  # stops at EOS, which is not part of the text
  assert len(text.split()) == i
  # The same through speculative decoding (greedy: equal to the target's own output).
  assert jspec.generate_text(model, [prompt], draft=model, num_draft_tokens=3,
                             max_new_tokens=n) == [text]
  # Explicit eos_id=() disables stopping: every new token comes back as a word.
  [full] = jspec.generate_text(model, prompt, max_new_tokens=n, eos_id=())
  assert full == tok.decode(ids) and len(full.split()) == n


def test_generate_text_batch_matches_token_api(text_model):
  texts = ["the cat", "a dog ran in the park"]
  out = jspec.generate(text_model, text_model.tokenizer.encode(texts), max_new_tokens=5,
                       temperature=0.8, seed=3)
  got = jspec.generate_text(text_model, texts, max_new_tokens=5, temperature=0.8, seed=3)
  assert got == [text_model.tokenizer.decode(r) for r in np.asarray(out.tokens)]
  specials = {0, 1}  # <unk>, <s>: dropped from the text
  assert [len(t.split()) for t in got] == [
      sum(i not in specials for i in row) for row in np.asarray(out.tokens).tolist()]


def test_generate_text_needs_a_tokenizer(text_model):
  bare = dataclasses.replace(text_model, tokenizer=None)
  with pytest.raises(ValueError, match="no tokenizer"):
    jspec.generate_text(bare, "the cat", max_new_tokens=4)
