"""The measurement harness on synthetic records and stand-in calls (no model): the runner's
order, compilation, exactness check and turns; the metrics; records on disk; the tables
the docs quote."""

import dataclasses
import json
import types

import numpy as np
import pytest

from jspec.bench import legacy, metrics as M, records as R, report, runner
from jspec.bench.workloads import Prompt, Workload


def rec(method="m", prompt="p", tokens=10, calls=5, seconds=(1.0,), judged=(), accepted=(),
        rounds_by_k=None, **axes):
  return R.Record(study="s", method=method, workload="w", prompt=prompt, axes=axes,
                  tokens=tokens, calls=calls, judged=tuple(judged), accepted=tuple(accepted),
                  rounds_by_k=rounds_by_k or {}, seconds=tuple(seconds))


# ----------------------------------------------------------------------------- metrics


def test_tau_and_acceptance_sum_over_records():
  rs = [rec(tokens=12, calls=6, judged=(6, 3), accepted=(3, 1)),
        rec(tokens=8, calls=2, judged=(2,), accepted=(2,))]
  assert M.tau(rs) == 20 / 8
  assert M.acceptance(rs) == [5 / 8, 1 / 3]
  assert M.alpha(rs) == 6 / 11
  assert np.isnan(M.acceptance([rec(judged=(0,), accepted=(0,))])[0])


def test_paired_speedup_is_the_median_of_ratios_in_the_same_repeat():
  base = [rec(seconds=(2.0, 4.0, 3.0), prompt="a")]
  fast = [rec(seconds=(1.0, 1.0, 3.0), prompt="a")]
  # Ratios 2, 4, 1: median 2; the ratio of the medians would say 3.
  assert M.paired_speedup(base, fast) == 2.0
  assert M.ratio_of_medians(base, fast) == 3.0
  # Summed over prompts per repeat before the ratio.
  base2 = base + [rec(seconds=(2.0, 0.0, 1.0), prompt="b")]
  fast2 = fast + [rec(seconds=(3.0, 1.0, 1.0), prompt="b")]
  assert M.paired_speedup(base2, fast2) == pytest.approx(np.median([1.0, 2.0, 1.0]))
  with pytest.raises(ValueError, match="different prompts"):
    M.paired_speedup(base, [rec(prompt="z", seconds=(1.0, 1.0, 1.0))])
  with pytest.raises(ValueError, match="repeats"):
    M.paired_speedup(base, [rec(prompt="a", seconds=(1.0,))])


def test_speedup_counts_tokens_where_answers_differ_in_length():
  base = [rec(tokens=10, seconds=(1.0,))]
  assert M.speedup(base, [rec(tokens=20, seconds=(1.0,))]) == 2.0
  assert M.tokens_per_s([rec(tokens=30, seconds=(1.0, 3.0, 2.0))]) == 15.0


def test_percentiles_match_numpy():
  xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
  got = M.percentiles(xs)
  for p in (50, 90, 99):
    assert got[f"p{p}"] == pytest.approx(np.percentile(xs, p))


def test_predicted_steps_price_each_k_and_plain_rounds():
  costs = {4: {"verify_over_step_here": 1.8, "draft_round_over_step": 0.1}}
  auto = [rec(tokens=30, calls=20, rounds_by_k={0: 10, 4: 10})]
  accel, here = M.predicted_steps(auto, costs, "auto")
  assert accel == pytest.approx(10 + 10 * 1.1)
  assert here == pytest.approx(10 + 10 * 1.9)
  assert M.predicted(auto, costs, "auto")[0] == pytest.approx(30 / 21)
  fixed = [rec(tokens=30, calls=10)]
  assert M.predicted(fixed, costs, 4)[0] == pytest.approx(30 / 11)
  never = [rec(tokens=10, calls=10)]  # "auto" that never drafted: plain rounds
  assert M.predicted(never, costs, "auto") == (1.0, 1.0)
  assert M.predicted(fixed, {}, 4) == (None, None)


def test_group_and_select_by_field_or_axis():
  rs = [rec(method="a", category="x"), rec(method="b", category="x"), rec(method="a", category="y")]
  assert list(M.group(rs, "method")) == ["a", "b"]
  assert [len(v) for v in M.group(rs, "method", "category").values()] == [1, 1, 1]
  assert len(M.select(rs, method="a")) == 2
  with pytest.raises(KeyError, match="no axis 'batch'"):
    M.group(rs, "batch")


# ----------------------------------------------------------------------------- records


def test_records_round_trip_and_refuse_other_shapes(tmp_path):
  rs = [rec(judged=(3, 1), accepted=(1, 0), rounds_by_k={0: 2, 4: 3}, category="qa")]
  head = {"schema": R.SCHEMA, "study": "s", "settings": {}}
  path = R.write(str(tmp_path / "r.jsonl"), head, rs)
  head2, back = R.read(path)
  assert back == rs and head2 == head
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"items": []}) + "\n")
  with pytest.raises(ValueError, match="header"):
    R.read(str(bad))
  bad.write_text(json.dumps({"header": {"schema": "other"}}) + "\n")
  with pytest.raises(ValueError, match="schema 'other'"):
    R.read(str(bad))
  bad.write_text(json.dumps({"header": head}) + "\n" + json.dumps({"method": "x", "k": 1}) + "\n")
  with pytest.raises(ValueError, match=":2: record has fields"):
    R.read(str(bad))
  with pytest.raises(ValueError, match="accepted more drafts than it judged"):
    rec(judged=(1,), accepted=(2,))


# ----------------------------------------------------------------------------- runner


class Tokenizer:
  chat_template = "stand-in"

  def __init__(self):
    self.seen = []

  def apply_chat_template(self, messages, add_generation_prompt, tokenize):
    self.seen.append([dict(m) for m in messages])
    return [1] * (3 * len(messages))

  def encode(self, text):
    return [1] * len(text)

  def decode(self, ids):
    return " ".join(map(str, ids))


@dataclasses.dataclass
class Target:
  tokenizer: Tokenizer
  eos_ids: tuple = (0,)


@dataclasses.dataclass
class Stats:
  target_calls: np.ndarray
  position_judged: np.ndarray
  position_accepted: np.ndarray


@dataclasses.dataclass
class Out:
  tokens: np.ndarray
  lengths: np.ndarray
  stats: Stats
  rounds_by_k: dict | None = None
  memory: object = None


def built(name):
  """What a variant carries of its method, for the stand-in call: a name, a drafter."""
  return types.SimpleNamespace(name=name, drafter=object())


def stand_in(log, answer):
  """A `call` for `runner.run`: answers `answer(variant, row)` per row, logs each call."""
  def call(target, built, rows, max_new, temperature, seed, eos, memory, carried):
    name = "plain" if built is None else built.name

    def fn(n):
      log.append((name, n))
      toks = np.array([answer(name, i)[:n] for i in range(len(rows))])
      B = len(rows)
      return Out(toks, np.full(B, toks.shape[1]), Stats(np.full(B, 2), np.ones((B, 2), int),
                                                        np.zeros((B, 2), int)))
    return fn
  return call


def test_runner_compiles_outside_timing_interleaves_and_alternates():
  log = []
  variants = [runner.plain(), runner.Variant("a", built("a")), runner.Variant("b", built("b"))]
  wl = Workload("w", (Prompt("p", "qa", ({"role": "user", "content": "hi"},)),))
  res = runner.run(Target(Tokenizer()), variants, wl, runner.Settings(max_new_tokens=4, repeats=3,
                   progress=False), "s", call=stand_in(log, lambda v, i: [5, 6, 7, 8]))
  assert log[:3] == [("plain", 1), ("a", 1), ("b", 1)]  # compiled with one token, untimed
  timed = [name for name, n in log[3:]]
  assert timed == ["plain", "a", "b", "b", "a", "plain", "plain", "a", "b"]
  assert all(n == 4 for _, n in log[3:])
  by = {r.method: r for r in res.records}
  assert len(by["a"].seconds) == 3 and by["a"].equal is True and by["plain"].equal is None
  assert by["a"].axes["category"] == "qa" and by["a"].tokens == 4 and by["a"].calls == 2
  assert res.mismatches == []


def test_runner_reports_a_greedy_answer_that_differs(capsys):
  wrong = lambda v, i: [5, 6, 9, 8] if (v == "bad" and i == 1) else [5, 6, 7, 8]
  prompts = tuple(Prompt(f"p{i}", "qa", ({"role": "user", "content": "x"},)) for i in range(2))
  res = runner.run(Target(Tokenizer()), [runner.plain(), runner.Variant("bad", built("bad")),
                                         runner.Variant("hot", built("hot"), temperature=1.0)],
                   Workload("w", prompts), runner.Settings(max_new_tokens=4, repeats=1, batch=2,
                                                           progress=False), "s",
                   call=stand_in([], wrong))
  assert res.mismatches == [{"prompt": "p0,p1", "row": 1, "method": "bad", "first_difference": 2}]
  by = {r.method: r for r in res.records}
  assert by["bad"].equal is False and by["hot"].equal is None  # sampled: nothing compared
  assert by["bad"].axes["batch"] == 2
  assert "MISMATCH" in capsys.readouterr().err


def test_runner_answers_turns_in_order_with_plain_answers_carried():
  tok = Tokenizer()
  wl = Workload("w", (Prompt("q", "writing", ({"role": "user", "content": "one"},), ("two",)),
                      Prompt("r", "writing", ({"role": "user", "content": "solo"},))))
  res = runner.run(Target(tok), [runner.plain()], wl,
                   runner.Settings(max_new_tokens=3, repeats=1, progress=False), "s",
                   call=stand_in([], lambda v, i: [4, 0, 0]))
  assert [r.prompt for r in res.records] == ["q", "r", "q/2"]
  last = tok.seen[-1]
  assert [m["content"] for m in last] == ["one", "4", "two"]  # EOS (0) cut from the answer
  assert res.records[-1].axes["turn"] == 2 and res.records[-1].axes["category"] == "mt_bench"


def test_interleave_times_each_call_per_repeat():
  order = []
  outs, times = runner.interleave({"x": lambda: order.append("x") or 1,
                                   "y": lambda: order.append("y") or 2}, 4, wait=lambda o: o)
  assert order == ["x", "y", "y", "x", "x", "y", "y", "x"]
  assert outs == {"x": 1, "y": 2} and all(len(t) == 4 for t in times.values())


def test_settings_refuse_bad_values():
  with pytest.raises(ValueError, match="repeats must be an integer >= 1"):
    runner.Settings(repeats=0)
  with pytest.raises(ValueError, match="variant names repeat"):
    runner.run(None, [runner.plain(), runner.plain()], Workload("w", ()), runner.Settings(), "s")


# ----------------------------------------------------------------------------- report


def test_pivot_puts_speedup_and_tau_per_category():
  rs = [rec(method="plain", prompt="1", tokens=10, calls=10, seconds=(2.0,), category="qa"),
        rec(method="ngram", prompt="1", tokens=10, calls=5, seconds=(1.0,), category="qa"),
        rec(method="plain", prompt="2", tokens=10, calls=10, seconds=(1.0,), category="rag"),
        rec(method="ngram", prompt="2", tokens=10, calls=4, seconds=(2.0,), category="rag")]
  table = report.pivot(rs, "method", "category", report.speedup_tau)
  assert table.splitlines()[2] == "| `ngram` | 2.00x (2.00) | 0.50x (2.50) | 1.00x (2.22) |"


def test_quoted_tables_are_found_and_refreshed(tmp_path):
  rs = [rec(method="plain", prompt="1", tokens=10, calls=10, category="qa", temperature=0.0),
        rec(method="ngram", prompt="1", tokens=10, calls=5, seconds=(0.5,), category="qa",
            temperature=0.0)]
  R.write(str(tmp_path / "r.jsonl"), {"schema": R.SCHEMA, "study": "s"}, rs)
  page = "text\n<!-- table spec-bench.speedup r.jsonl -->\n| stale |\n<!-- /table -->\nmore"
  assert report.quoted_tables(page) == [("spec-bench.speedup", "r.jsonl", "| stale |")]
  fresh = report.refresh(page, root=str(tmp_path))
  (_, _, table), = report.quoted_tables(fresh)
  assert "| `ngram` | 2.00x (2.00) | 2.00x (2.00) |" in table
  assert table == report.render("spec-bench.speedup", str(tmp_path / "r.jsonl"))


def test_legacy_spec_bench_report_keeps_every_figure():
  old = {"settings": {"repeats": 2}, "methods": {"ngram": {"k": 4}},
         "prompts_by_category": {"qa": 1},
         "costs": {"t_step_ms": 40.0, "methods": {"ngram": {"4": {
             "verify_over_step_here": 1.8, "draft_round_over_step": 0.0}}}},
         "items": [{"question_id": 7, "group": "qa", "turn": 1, "prompt_tokens": 30,
                    "times": {"plain": [2.0, 3.0], "ngram": [1.0, 2.0]},
                    "runs": {"plain": {"tokens": 8, "calls": 8, "judged": [], "accepted": [],
                                       "rounds_by_k": {}},
                             "ngram": {"tokens": 8, "calls": 4, "judged": [4, 2],
                                       "accepted": [2, 1], "rounds_by_k": {}, "equal": True}}}]}
  head, rs = legacy.spec_bench(old, "old.json")
  ng = next(r for r in rs if r.method == "ngram")
  assert ng.prompt == "7" and ng.seconds == (1.0, 2.0) and ng.equal is True
  assert ng.axes["category"] == "qa" and ng.axes["part"] == 0
  assert head["costs"][0]["ngram"]["4"]["verify_over_step_here"] == 1.8
  assert M.speedup([r for r in rs if r.method == "plain"], [ng]) == pytest.approx(1.75)
  table = report.spec_bench_predicted(head, rs)
  assert "| `ngram` | 2.00x | 2.00x |" in table  # 8 tokens over 4 rounds of one step
  with pytest.raises(ValueError, match="not a `jspec bench --suite` report"):
    legacy.spec_bench({"items": []}, "x.json")
