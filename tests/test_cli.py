"""The command line end to end on a tiny random llama GGUF with a chat template: each
subcommand a user types runs and prints what it says it does."""

import contextlib
import io
import json
import re

import pytest

from jspec.planner import cost_model
from jspec.tools import cli
from jspec.tools import profile as profile_lib
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


@pytest.mark.slow  # a benchmark or recipe end to end: tens of seconds on 2 cores
def test_demo_on_a_given_gguf_checks_outputs_equal(tiny_gguf, tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))
  assert cli.main(["demo", "--model", tiny_gguf, "--per-kind", "1", "--max-new-tokens", "8",
                   "--repeats", "1", "--cache-dir", str(tmp_path / "xla")]) == 0
  out = capsys.readouterr().out
  assert "Outputs identical: True" in out and "rounds by K (auto)" in out
  ideal = next(line for line in out.splitlines() if line.startswith("ideal speedup"))
  assert "in-loop T_step" in ideal and not ideal.rstrip().endswith(",")


@pytest.mark.slow
def test_profile_saves_round_costs_that_auto_reads(tiny_gguf, tmp_path, capsys):
  import jspec

  # No --drafter: on a target that is not the shipped pair the profile is n-gram lookup's.
  assert cli.main(["profile", "--target", tiny_gguf, "--cache-dir", str(tmp_path)]) == 0
  captured = capsys.readouterr()
  out = captured.out
  assert out.startswith("round costs at batch 1") and str(tmp_path) in out
  assert "n-gram lookup" in captured.err
  with open(cost_model.cache_path(str(tmp_path))) as f:
    (costs_by_k,) = json.load(f).values()  # one key: these models and shapes
  assert {int(k) for k in costs_by_k} >= {0, 1, 4}
  assert all(float(c) > 0 for c in costs_by_k.values())
  cache = int(re.search(r"cache (\d+)", out).group(1))
  auto = jspec.AutoK()
  assert cost_model.saved_round_costs(jspec.load(tiny_gguf).decoding_form(),
                                      jspec.NGram(64, max_ngram=3), 1, cache, auto.choices,
                                      cache_dir=str(tmp_path)) is not None


# ----------------------------------------------------------------------------- a foreign target
# The tiny GGUF is not the shipped code pair: whatever drafts for it must draft in its
# 64-token vocabulary, never fall back to the shipped 8k-token code draft.


@pytest.fixture(scope="module")
def other_vocab_draft(tmp_path_factory):
  """A native checkpoint with a 32-token vocabulary: a draft that fits no 64-token target."""
  import jspec
  from conftest import tiny_config

  path = tmp_path_factory.mktemp("draft") / "d32"
  jspec.save(jspec.models.init(tiny_config(32), seed=1), path)
  return str(path)


@pytest.fixture(scope="module")
def plain_completion(tiny_gguf):
  """`jspec generate` without a drafter: what every greedy speculative run must print."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert cli.main(["generate", "--prompt", "ab", "--target", tiny_gguf,
                     "--max-new-tokens", "8"]) == 0
  return out.getvalue()


@pytest.mark.parametrize("drafting", [["--speculative"], ["--draft", "ngram"],
                                      ["--draft", "ngram:2"], ["--draft", "lookahead"],
                                      ["--draft", "none"]])
def test_generate_on_a_foreign_target_drafts_by_name(tiny_gguf, plain_completion, drafting,
                                                      capsys):
  assert cli.main(["generate", "--prompt", "ab", "--target", tiny_gguf, "--max-new-tokens", "8",
                   *drafting]) == 0
  captured = capsys.readouterr()
  assert captured.out == plain_completion  # greedy speculative decoding is exact
  if drafting == ["--speculative"]:  # the default drafter says what it is
    assert "n-gram lookup" in captured.err


@pytest.mark.parametrize("drafting", [["--speculative"], ["--draft", "ngram"],
                                      ["--draft", "ngram:2"], ["--draft", "lookahead"],
                                      ["--draft", "none"]])
def test_generate_chat_drafts_by_name(tiny_gguf, drafting, capsys):
  assert cli.main(["generate", "--chat", "--prompt", "ab", "--target", tiny_gguf,
                   "--max-new-tokens", "6"]) == 0
  plain = capsys.readouterr().out
  assert cli.main(["generate", "--chat", "--prompt", "ab", "--target", tiny_gguf,
                   "--max-new-tokens", "6", *drafting]) == 0
  captured = capsys.readouterr()
  assert captured.out == plain and "tokens per target call" in captured.err


@pytest.mark.slow
def test_generate_takes_the_penalties(tiny_gguf, plain_completion, capsys):
  """The penalty flags reach decoding (a presence penalty of 100 forbids every repeat of
  an output token, which the tiny model's greedy completion makes) and are exact under speculation; a
  ratio of 0 is refused with the library's message."""
  penalised = ["generate", "--prompt", "ab", "--target", tiny_gguf, "--max-new-tokens", "8",
               "--presence-penalty", "100", "--repetition-penalty", "1.3"]
  assert cli.main(penalised) == 0
  plain = capsys.readouterr().out
  assert cli.main(penalised + ["--draft", "ngram"]) == 0
  assert capsys.readouterr().out == plain
  assert plain != plain_completion
  with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
    cli.main(["generate", "--prompt", "ab", "--target", tiny_gguf, "--repetition-penalty", "0"])


@pytest.mark.parametrize("spec, says", [("ngram:0", "ngram:N"), ("lookahead:1,2", "W,N,G"),
                                        ("ngarm", "not a drafter name")])
def test_a_bad_drafter_name_says_which_names_there_are(tiny_gguf, spec, says):
  with pytest.raises(SystemExit, match=says):
    cli.main(["generate", "--prompt", "ab", "--target", tiny_gguf, "--draft", spec])


@pytest.mark.parametrize("command", ["generate", "generate --chat", "measure", "profile"])
def test_a_draft_of_another_vocabulary_is_refused_before_compiling(
    tiny_gguf, other_vocab_draft, tmp_path, monkeypatch, command):
  import jspec

  def compiled(*args, **kwargs):
    raise AssertionError("reached decoding with a draft that does not fit the target")

  for name in ("jspec.generate_text", "jspec.tools.chat.answer", "jspec.tools.measure.measure",
               "jspec.tools.profile.profile_auto"):
    monkeypatch.setattr(name, compiled)
  prompts = tmp_path / "p.jsonl"
  prompts.write_text('{"text": "ab"}\n')
  argv = {"generate": ["generate", "--prompt", "ab", "--draft", other_vocab_draft],
          "generate --chat": ["generate", "--chat", "--prompt", "ab", "--draft",
                              other_vocab_draft],
          "measure": ["measure", "--prompts", str(prompts), "--drafter", other_vocab_draft],
          "profile": ["profile", "--drafter", other_vocab_draft,
                      "--cache-dir", str(tmp_path)]}[command]
  with pytest.raises(SystemExit) as e:
    cli.main([*argv, "--target", tiny_gguf])
  message = str(e.value)
  assert other_vocab_draft in message and tiny_gguf in message
  assert "32-token" in message and "64 tokens" in message and "ngram" in message
  if command == "profile":  # the library refuses the pair too, before timing anything
    target = jspec.load(tiny_gguf)
    with pytest.raises(ValueError, match="vocab size 32 != target vocab size 64"):
      profile_lib.round_costs(target, jspec.NGram(32), 1, 64, (0, 1))


def test_a_missing_gguf_file_is_named(tmp_path):
  from jspec.io import checkpoint

  missing = str(tmp_path / "x.gguf")
  with pytest.raises(FileNotFoundError, match=f"no GGUF file {missing}"):
    checkpoint.load(missing)
  with pytest.raises(SystemExit, match=f"no GGUF file {missing}"):
    cli.main(["generate", "--prompt", "ab", "--target", missing])


def test_tokenizer_repr_is_one_short_line(tiny_gguf):
  import jspec

  text = repr(jspec.load(tiny_gguf).tokenizer)
  assert text == "Tokenizer(BPE, vocab_size=64, eos_ids=(2,), with chat template)"


CHAT_ROWS = [{"text": "ab"}, {"messages": [{"role": "system", "content": "ba"},
                                           {"role": "user", "content": "ab ba"}]}]


def _chat_ids(tiny_gguf):
  import jspec

  tokenizer = jspec.load(tiny_gguf).tokenizer
  return [tokenizer.apply_chat_template([{"role": "user", "content": "ab"}],
                                        add_generation_prompt=True, tokenize=True),
          tokenizer.apply_chat_template(CHAT_ROWS[1]["messages"], add_generation_prompt=True,
                                        tokenize=True)]


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_measure_on_a_foreign_target_drafts_by_ngram(tiny_gguf, tmp_path, capsys):
  prompts = tmp_path / "p.jsonl"
  prompts.write_text('{"text": "ab ab"}\n"ba"\n')
  out = tmp_path / "report.json"
  assert cli.main(["measure", "--target", tiny_gguf, "--prompts", str(prompts), "--k", "2",
                   "--max-new-tokens", "4", "--repeats", "1", "--json", str(out)]) == 0
  assert "n-gram lookup" in capsys.readouterr().err
  report = json.loads(out.read_text())
  assert report["prompts"] == 2 and [r["equal_to_baseline"] for r in report["rows"]] == [True]


class _Encoded(Exception):
  """Stops a command once its prompts are encoded: measure's own run is timed above."""


def test_measure_chat_puts_prompts_through_the_template(tiny_gguf, tmp_path, monkeypatch):
  from jspec.tools import measure

  seen = []

  def stop(target, drafter, prompts, **kwargs):
    seen.append(prompts)
    raise _Encoded

  monkeypatch.setattr(measure, "measure", stop)
  prompts = tmp_path / "chat.jsonl"
  prompts.write_text("".join(json.dumps(r) + "\n" for r in CHAT_ROWS))
  with pytest.raises(_Encoded):
    cli.main(["measure", "--chat", "--target", tiny_gguf, "--prompts", str(prompts)])
  assert seen == [_chat_ids(tiny_gguf)]


def test_bench_chat_puts_prompts_through_the_template(tiny_gguf, tmp_path, monkeypatch):
  from jspec.bench import real as bench_real

  seen = []

  def stop(path, s, out_dir, sections, workload=None, target=None, strict=True):
    seen.append((path, [list(p.ids) for p in workload.prompts], target.vocab_size))
    raise _Encoded

  monkeypatch.setattr(bench_real, "run", stop)
  prompts = tmp_path / "chat.jsonl"
  prompts.write_text("".join(json.dumps(r) + "\n" for r in CHAT_ROWS))
  with pytest.raises(_Encoded):
    cli.main(["bench", "--target", tiny_gguf, "--prompts", str(prompts), "--chat",
              "--no-transformers", "--out", str(tmp_path / "out")])
  assert seen == [(tiny_gguf, _chat_ids(tiny_gguf), 64)]


@pytest.mark.parametrize("command", ["measure", "bench"])
def test_chat_rows_without_text_or_messages_fail_before_loading(tiny_gguf, tmp_path,
                                                                monkeypatch, command):
  from jspec.io import checkpoint

  def load(*args, **kwargs):
    raise AssertionError("loaded a model before checking the prompts")

  monkeypatch.setattr(checkpoint, "load", load)
  prompts = tmp_path / "bad.jsonl"
  prompts.write_text('{"text": "ab"}\n{"content": "ab"}\n')
  with pytest.raises(SystemExit, match="bad.jsonl:2: .*'text'.*'messages'"):
    cli.main([command, "--chat", "--target", tiny_gguf, "--prompts", str(prompts)])
