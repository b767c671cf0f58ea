"""The studies declared over the harness (jspec.bench.lookahead, suffix, constraint,
sampling, recycling, ngram; heads_real and eagle_trees in test_eagle3.py): the runner's
options, carry, streams and answers with a stand-in call, the latency metrics on synthetic
arrivals, and each study end to end on a tiny target (slow), every greedy answer compared
with plain decoding's."""

import dataclasses
import types

import numpy as np
import pytest

import jspec
from jspec.bench import metrics as M
from jspec.bench import records as R
from jspec.bench import report, runner
from jspec.bench import workloads as W
from conftest import tiny_config


def rec(method="m", prompt="p", seconds=(1.0,), **extra):
  return R.Record(study="s", method=method, workload="w", prompt=prompt, tokens=1, calls=1,
                  seconds=tuple(seconds), extra=extra)


# ----------------------------------------------------------------------------- metrics


def test_latency_metrics_read_the_arrivals_of_streamed_records():
  # One repeat of a 2-row call: rounds arrive at 0.1 s (row 0: 2 tokens, row 1: 1),
  # 0.3 s (row 0: 1; row 1: nothing), 0.6 s (row 0: nothing; row 1: 3 tokens).
  r = rec(arrivals=[[[0.1, 2, 1], [0.3, 1, 0], [0.6, 0, 3]]])
  assert M.first_token([r]) == [0.1, 0.1]
  assert M.request_latency([r]) == [0.3, 0.6]
  assert M.inter_token([r]) == pytest.approx([0.0, 0.2, 0.5, 0.0, 0.0])
  two = rec(arrivals=[[[0.1, 1]], [[0.2, 1], [0.5, 1]]])  # two repeats pool
  assert M.inter_token([two]) == pytest.approx([0.3])
  assert M.request_latency([rec(seconds=(2.0, 3.0))]) == [2.0, 3.0]  # not streamed: calls
  with pytest.raises(ValueError, match="was not streamed"):
    M.inter_token([rec()])
  assert report.inter_token_ms([r], []) == "0.0 / 488.0"
  assert report.request_ms([r], []) == "450 / 597"


def test_finish_writes_the_records_and_fails_on_a_mismatch(tmp_path, capsys):
  ok = runner.Result([rec()], [])
  assert report.finish(ok, "s", {"k": 4}, {"t": "| a |"}, str(tmp_path / "r.jsonl"),
                       target="x") == 0
  head, recs = R.read(str(tmp_path / "r.jsonl"))
  assert head["study"] == "s" and head["target"] == "x" and head["mismatches"] == []
  assert recs == [rec()] and "t:\n| a |" in capsys.readouterr().out
  bad = runner.Result([rec()], [{"prompt": "p", "row": 0, "method": "m"}])
  assert report.finish(bad, "s", {}, {}, None) == 1


# ----------------------------------------------------------------------------- runner


class Remembers:
  """A stand-in remembering drafter: `out.memory` is the memory it ran with, plus one."""

  memory = 0

  def remembered(self, state):
    return 0 if state is None else state


def stand_in(log):
  """A `call` for `runner.run` that answers [5, 6, 7, ...], streams two rounds, and logs
  (variant, options, memory carried)."""
  def call(target, built, rows, max_new, temperature, seed, eos, memory, carried, **options):
    name = "plain" if built is None else built.name
    log.append((name, options, carried))

    def fn(n, stream=None):
      B = len(rows)
      if stream is not None:
        stream([[5]] * B)
        stream([list(range(6, 5 + n))] * B)
      toks = np.tile(np.arange(5, 5 + n), (B, 1))
      stats = types.SimpleNamespace(target_calls=np.full(B, 2), position_judged=np.ones((B, 1)),
                                    position_accepted=np.ones((B, 1)))
      return types.SimpleNamespace(tokens=toks, lengths=np.full(B, n), stats=stats,
                                   rounds_by_k=None, memory=(carried or 0) + 1)
    return fn
  return call


def test_runner_passes_options_streams_keeps_answers_and_carries_memory():
  log = []
  built = lambda name: types.SimpleNamespace(name=name, drafter=Remembers(), with_memory=False)
  variants = [runner.plain(), runner.Variant("kept", built("kept")),
              runner.Variant("fresh", built("fresh"), options={"top_p": 0.5}, carry=False)]
  wl = W.from_ids("ids", [[1, 2], [3]])
  res = runner.run(types.SimpleNamespace(eos_ids=(0,), tokenizer=None), variants, wl,
                   runner.Settings(max_new_tokens=3, repeats=2, stream=True, answers=True,
                                   progress=False), "s", call=stand_in(log))
  assert res.mismatches == []
  # The remembering drafter's memory goes from cell to cell unless carry=False; options
  # reach every call of their variant.
  assert log == [("plain", {}, None), ("kept", {}, 0), ("fresh", {"top_p": 0.5}, None),
                 ("plain", {}, None), ("kept", {}, 1), ("fresh", {"top_p": 0.5}, None)]
  by = {(r.method, r.prompt): r for r in res.records}
  kept = by["kept", "1"]
  assert kept.extra["answers"] == [[5, 6, 7]] and kept.equal is True
  assert [[e[1:] for e in repeat] for repeat in kept.extra["arrivals"]] == [[[1], [2]]] * 2
  assert all(0 <= e[0] for repeat in kept.extra["arrivals"] for e in repeat)
  assert M.inter_token([kept])[1::2] == [0.0, 0.0]  # a round's second token waits 0


# ----------------------------------------------------------------------------- workloads


def test_agent_workload_is_three_turns_per_function():
  wl = W.load("agent")
  assert [p.id for p in wl.prompts][:3] == ["indent", "quote", "dumps"]
  first = wl.prompts[0]
  assert first.category == "multi-turn" and len(first.turns) == 2
  assert "def indent(" in first.first_user_turn and "`indent`" in first.turns[1]
  assert [p.id for p in wl.head(2).prompts] == ["indent", "quote"]


# ----------------------------------------------------------------------------- studies


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  from test_bench_real import write_tiny_llama
  from jspec.bench import targets

  return targets.load(write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


@pytest.fixture(scope="module")
def tiny():
  return jspec.models.init(tiny_config(), seed=0)


@pytest.mark.slow
def test_suffix_and_lookahead_on_conversations(tiny_gguf):
  """suffix: plain, n-gram and suffix over two-turn conversations, plain's answers carried
  into the second turn; lookahead: a method with memory runs on conversations only."""
  from jspec.bench import lookahead, suffix

  talks = W.Workload("agent", (W.Prompt("a", "multi-turn", W.user("ab ab cd"), ("again ab",)),
                               W.Prompt("b", "multi-turn", W.user("xy xy"), ("once more",))))
  ran = suffix.run(tiny_gguf, talks, k=3, max_new_tokens=6, repeats=2, progress=False)
  assert ran.mismatches == []
  assert [(r.method, r.prompt) for r in ran.records[:3]] == [
      ("plain", "a"), ("ngram", "a"), ("suffix", "a")]
  # A conversation's turns in a row, then the next conversation (batch 1).
  assert [r.axes["turn"] for r in ran.records] == ([1] * 3 + [2] * 3) * 2
  assert all(r.equal is True for r in ran.records if r.method != "plain")
  tables = suffix.tables(ran.records)
  assert "| `suffix` |" in tables["suffix over n-gram, by turn"]
  assert "| turn 1 | turn 2 | Overall |" in tables["speedup over plain decoding (tau), by turn"]

  methods = lookahead.build_methods(tiny_gguf, ["ngram", "suffix"], k=3)
  ran = lookahead.run(tiny_gguf, methods, [W.from_ids("ids", [[5, 6, 7]]), talks.head(1)],
                      max_new_tokens=4, repeats=1, progress=False)
  assert ran.mismatches == []
  assert {r.method for r in ran.records if r.workload == "ids"} == {"plain", "ngram"}
  assert {r.method for r in ran.records if r.workload == "agent"} == {"plain", "ngram",
                                                                      "suffix"}


@pytest.mark.slow
def test_constraint_study_keeps_answers_and_compares_the_unconstrained(tiny):
  """free and lookup-only equal plain decoding; the constrained answers are compared but
  not held to it; every variant also at one new token, for the decoding rate."""
  from jspec.bench import constraint

  vocabulary = [chr(ord("a") + i % 26) for i in range(tiny.vocab_size)]
  c = jspec.Constraint.from_regex("[a-c]+", vocabulary, eos_ids=[0])
  ran = constraint.run(tiny, c, batches=(2,), max_new_tokens=6, k=3, repeats=2,
                       prompts=[[5, 6, 7], [8, 9]], progress=False)
  assert ran.mismatches == []
  full = {r.method: r for r in M.select(ran.records, new_tokens=6)}
  assert full["free"].equal is True and full["lookup only"].equal is True
  assert full["free"].extra["answers"] == full["plain"].extra["answers"]
  assert all(vocabulary[t] in "abc" or t == 0 for row in full["json"].extra["answers"]
             for t in row)
  assert {r.tokens for r in M.select(ran.records, new_tokens=1)} == {2}
  table = constraint.table(ran.records, 6).splitlines()
  assert [line.split(" | ")[1] for line in table[2:]] == list(constraint.VARIANTS)
  assert constraint.valid_json('{"name": "a", "age": 3}') and not constraint.valid_json("{")


@pytest.mark.slow
def test_sampling_study_compares_greedy_and_not_sampled(tiny):
  from jspec.bench import sampling

  ran = sampling.run(tiny, batches=(2,), new=5, k=3, repeats=2,
                     base=W.from_ids("ids", [[5, 6, 7], [8, 9]]), progress=False)
  assert ran.mismatches == []
  by = {r.method: r for r in ran.records}
  assert list(by) == ["plain", "plain sampled", "ngram", "ngram sampled"]
  assert by["ngram"].equal is True and by["ngram sampled"].equal is None
  assert by["plain sampled"].axes["temperature"] == 0.8 and all(r.tokens == 10
                                                                  for r in by.values())
  assert "| 2 | ngram sampled |" in sampling.table(ran.records)


@pytest.mark.slow
def test_recycling_study_passes_and_matrices(tiny):
  """The second pass starts from the matrix the carried pass ended with; every answer
  equal to plain decoding's."""
  from jspec.bench import recycling

  tree = jspec.Tree.from_paths(recycling.SMALL_TREE)
  ran = recycling.run(tiny, W.from_ids("ids", [[5, 6, 7, 5, 6], [8, 9]]), k=3, tree=tree,
                      new=6, progress=False)
  assert ran.mismatches == []
  assert [r.axes["pass"] for r in M.select(ran.records, method="recycling tree")] == [1, 1, 2, 2]
  assert all(r.equal for r in ran.records if r.method != "plain")
  second = M.tau(M.select(ran.records, method="recycling tree", **{"pass": 2}))
  fresh = M.tau(M.select(ran.records, method="recycling fresh tree", **{"pass": 2}))
  assert second >= fresh  # the carried matrix has seen these answers
  tau = recycling.tables(ran.records)["tau"].splitlines()
  assert tau[0] == "| drafter | chain | tree |" and tau[-1].startswith("| recycling, second")


@pytest.mark.slow
def test_ngram_study_restating_and_plain_sets(tiny):
  from jspec.bench import ngram

  ran, per_batch = ngram.run(tiny, batches=(1,), k=3, prompt_tokens=24, max_new=5, repeats=2,
                             progress=False)
  assert ran.mismatches == []
  assert [(r.axes["category"], r.method) for r in ran.records] == [
      (kind, m) for kind in ("restating", "plain") for m in ("plain", "ngram", "ngram-fullK")]
  assert all(r.tokens == 5 for r in ran.records)  # EOS ignored
  assert set(per_batch[1]) == {"t_step", "t_verify", "t_round", "cache_length"}
  assert len(ngram.table(ran.records, per_batch).splitlines()) == 2 + 4
