"""Bad input is refused with a clear message before anything is traced."""

import numpy as np
import pytest

import jspec
from jspec.core import programs
from conftest import tiny_config


@pytest.fixture(scope="module")
def small():
  return jspec.models.init(tiny_config(max_len=64), seed=0)


@pytest.fixture(scope="module")
def other_vocab():
  return jspec.models.init(tiny_config(vocab_size=48, layers=1), seed=1)


CASES = [
    ("cache_length", dict(cache_length=16), ValueError, "cache_length 16 is too small.*17 slots"),
    ("too_long", dict(max_new_tokens=80), ValueError, "max_position_embeddings"),
    ("k_zero", dict(num_draft_tokens=0), ValueError, "num_draft_tokens must be an integer >= 1"),
    ("k_float", dict(num_draft_tokens=2.5), ValueError, "num_draft_tokens must be an integer"),
    ("neg_temp", dict(temperature=-0.1), ValueError, "temperature must be >= 0"),
    ("neg_temp_row", dict(temperature=[0.0, -1.0]), ValueError, "temperature must be >= 0"),
    ("nan_temp", dict(temperature=float("nan")), ValueError, "temperature must be finite"),
    ("top_p_zero", dict(top_p=0.0), ValueError, r"top_p must lie in \(0, 1\]"),
    ("top_p_big", dict(top_p=1.5), ValueError, r"top_p must lie in \(0, 1\]"),
    ("top_k_neg", dict(top_k=-1), ValueError, "top_k must be >= 0"),
    ("min_p_neg", dict(min_p=-0.1), ValueError, r"min_p must lie in \[0, 1\]"),
    ("min_p_big", dict(min_p=[0.5, 1.5]), ValueError, r"min_p must lie in \[0, 1\]"),
    ("min_p_nan", dict(min_p=float("nan")), ValueError, "min_p must be finite"),
    ("repetition_zero", dict(repetition_penalty=0.0), ValueError,
     "repetition_penalty must be > 0"),
    ("repetition_neg_row", dict(repetition_penalty=[1.2, -1.0]), ValueError,
     "repetition_penalty must be > 0"),
    ("presence_inf", dict(presence_penalty=float("inf")), ValueError,
     "presence_penalty must be finite"),
    ("frequency_rows", dict(frequency_penalty=[0.1, 0.2, 0.3]), ValueError, "one value per row"),
    ("bias_id_range", dict(logit_bias={64: 1.0}), ValueError,
     r"logit_bias ids must lie in \[0, 64\), got 64 in row 0"),
    ("bias_id_negative", dict(logit_bias=[None, {-1: 1.0}]), ValueError,
     r"logit_bias ids must lie in \[0, 64\), got -1 in row 1"),
    ("bias_value", dict(logit_bias={3: float("nan")}), ValueError,
     "logit_bias values must be finite"),
    ("bias_rows", dict(logit_bias=[{1: 1.0}]), ValueError, "one dict for every row or one per row"),
    ("bias_shape", dict(logit_bias=np.zeros((2, 63))), ValueError,
     r"a logit_bias array must be \[V\] or \[B, V\]"),
    ("max_new_zero", dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
    ("rows_mismatch", dict(temperature=[0.0, 0.5, 1.0]), ValueError, "one value per row"),
    ("eos_range", dict(eos_id=64), ValueError, "eos_id must be ids in"),
    ("empty_prompt", dict(prompts=[[1, 2], []]), ValueError, r"empty prompt in row\(s\) \[1\]"),
    ("no_prompts", dict(prompts=[]), ValueError, "prompts is empty"),
    ("token_range", dict(prompts=[[1, 64]]), ValueError, r"token ids must lie in \[0, 64\)"),
    ("negative_token", dict(prompts=[[-3, 1]]), ValueError, r"token ids must lie in \[0, 64\)"),
    ("string_prompt", dict(prompts=["hello"]), TypeError, "token ids, not strings"),
]


@pytest.mark.parametrize("name,kwargs,exc,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_rejected_before_tracing(small, name, kwargs, exc, message, monkeypatch):
  def must_not_run(*args, **kw):
    raise AssertionError("the program was traced for bad input")

  monkeypatch.setattr(programs, "fixed", must_not_run)
  monkeypatch.setattr(programs, "auto", must_not_run)
  call = dict(prompts=[[1, 2, 3], [4]], num_draft_tokens=3, max_new_tokens=10)
  call.update(kwargs)
  prompts = call.pop("prompts")
  with pytest.raises(exc, match=message):
    jspec.speculative_generate(small, small, prompts, **call)


def test_vocab_mismatch(small, other_vocab, monkeypatch):
  monkeypatch.setattr(programs, "fixed", None)
  with pytest.raises(ValueError, match="draft vocab size 48 != target vocab size 64"):
    jspec.speculative_generate(small, other_vocab, [[1, 2]], max_new_tokens=4)


def test_baseline_checks_too(small, monkeypatch):
  monkeypatch.setattr(programs, "fixed", None)
  with pytest.raises(ValueError, match="cache_length 8 is too small"):
    jspec.generate(small, [[1, 2, 3]], max_new_tokens=5, cache_length=8)
  with pytest.raises(ValueError, match=r"prompt_lengths must lie in \[1, 3\]"):
    jspec.generate(small, np.array([[1, 2, 3]]), prompt_lengths=[0], max_new_tokens=5)
  with pytest.raises(ValueError, match=r"token ids must lie in \[0, 64\)"):
    small.logits(np.array([[1, 99]]))


@pytest.mark.slow
def test_cache_exactly_large_enough_works(small):
  # prompt 3 + 10 new + K 3 + 1 = 17 slots: the bound is tight, not off by one.
  out = jspec.speculative_generate(small, small, [[1, 2, 3]], num_draft_tokens=3,
                                   max_new_tokens=10, cache_length=17)
  ref = jspec.generate(small, [[1, 2, 3]], max_new_tokens=10)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
