"""The command line end to end on a tiny random llama GGUF with a chat template: each
subcommand a user types runs and prints what it says it does."""

import io
import json

import pytest

from jspec.core import cost_model
from jspec.tools import cli
from test_bench_real import write_tiny_llama


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.mark.parametrize("drafter", ["ngram", "none"])
def test_chat_answers_each_turn_and_resets(tiny_gguf, drafter, monkeypatch, capsys):
  monkeypatch.setattr("sys.stdin", io.StringIO("ab\n/reset\nba\n/quit\n"))
  assert cli.main(["chat", "--target", tiny_gguf, "--drafter", drafter,
                   "--max-new-tokens", "6"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("chatting with " + tiny_gguf)
  assert out.count("assistant> ") == 2 and "(conversation cleared)" in out


def test_chat_ends_at_end_of_input(tiny_gguf, monkeypatch, capsys):
  monkeypatch.setattr("sys.stdin", io.StringIO("ab\n"))
  assert cli.main(["chat", "--target", tiny_gguf, "--max-new-tokens", "4"]) == 0
  assert capsys.readouterr().out.count("assistant> ") == 1


def test_demo_on_a_given_gguf_checks_outputs_equal(tiny_gguf, tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))
  assert cli.main(["demo", "--model", tiny_gguf, "--per-kind", "1", "--max-new-tokens", "8",
                   "--repeats", "1", "--cache-dir", str(tmp_path / "xla")]) == 0
  out = capsys.readouterr().out
  assert "Outputs identical: True" in out and "rounds by K (auto)" in out


def test_profile_saves_round_costs_that_auto_reads(tiny_gguf, tmp_path, capsys):
  assert cli.main(["profile", "--target", tiny_gguf, "--drafter", "ngram",
                   "--cache-dir", str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert out.startswith("round costs at batch 1") and str(tmp_path) in out
  with open(cost_model.cache_path(str(tmp_path))) as f:
    (costs_by_k,) = json.load(f).values()  # one key: these models and shapes
  assert {int(k) for k in costs_by_k} >= {0, 1, 4}
  assert all(float(c) > 0 for c in costs_by_k.values())


def test_tokenizer_repr_is_one_short_line(tiny_gguf):
  import jspec

  text = repr(jspec.load(tiny_gguf).tokenizer)
  assert text == "Tokenizer(BPE, vocab_size=64, eos_ids=(2,), with chat template)"
