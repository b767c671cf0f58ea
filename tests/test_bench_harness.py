"""The measurement harness on synthetic records and stand-in calls (no model): the runner's
order, compilation, exactness check and turns; the metrics; records on disk; the tables
the docs quote."""

import dataclasses
import json
import types

import numpy as np
import pytest

from jspec.bench import legacy, metrics as M, records as R, report, runner, tables
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


def _request(method, rep, sent, times, tokens=None, **axes):
  """A live-load request record: sent at `sent`, its tokens arriving at `times`."""
  return R.Record(study="engine-load", method=method, workload="free", prompt="p",
                  axes=dict(rate=8.0, index=0, repeat=rep, **axes),
                  tokens=tokens or len(times), calls=len(times), seconds=(times[-1] - sent,),
                  extra={"sent": sent, "end": times[-1], "chunk_times": list(times)})


def test_load_table_gives_medians_of_paired_repeats():
  # Three repeats: plain makes 10 tokens in 1, 2 and 1 s; "auto" in 1, 1 and 2 s, so its
  # per-repeat ratios are 1, 2 and 0.5 (median 1.0); rounds by K summed over the repeats.
  plain = [_request("plain", i, 0.0, np.linspace(d / 10, d, 10)) for i, d in enumerate((1, 2, 1))]
  auto = [_request("auto", i, 0.0, np.linspace(d / 10, d, 10)) for i, d in enumerate((1, 1, 2))]
  runs = {"free/8/auto": {"rounds_by_k": {0: 3, 6: 1}},
          "free/8/auto/1": {"rounds_by_k": {0: 4}}, "free/8/auto/2": {"rounds_by_k": {6: 2}}}
  rows = {r.split(" | ")[2]: r.split(" | ") for r in
          report.engine_load({"runs": runs}, plain + auto).splitlines()[2:]}
  assert rows["plain"][3:5] == ["10.0", "1.00"]
  assert rows['`"auto"`'][3:5] == ["10.0", "1.00"]
  assert rows['`"auto"`'][-1].rstrip(" |") == "0: 7, 6: 3"
  # One faster repeat moves the median ratio: "auto" at 0.5 s in the third repeat.
  auto[2] = _request("auto", 2, 0.0, np.linspace(0.05, 0.5, 10))
  rows = {r.split(" | ")[2]: r.split(" | ") for r in
          report.engine_load({"runs": runs}, plain + auto).splitlines()[2:]}
  assert rows['`"auto"`'][3:5] == ["10.0", "2.00"]  # ratios 1, 2, 2; the ratio of medians: 1
  # Records without the axis are one repeat (the tables of earlier runs are unchanged).
  one = [dataclasses.replace(r, axes={"rate": 8.0, "index": 0}) for r in (plain[1], auto[0])]
  rows = {r.split(" | ")[2]: r.split(" | ") for r in
          report.engine_load({"runs": {}}, one).splitlines()[2:]}
  assert rows['`"auto"`'][3:5] == ["10.0", "2.00"]


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
  assert [r.prompt for r in res.records] == ["q", "q/2", "r"]
  second = tok.seen[1]
  assert [m["content"] for m in second] == ["one", "4", "two"]  # EOS (0) cut from the answer
  assert res.records[1].axes["turn"] == 2 and res.records[1].axes["category"] == "mt_bench"
  # Several prompts a call: every first turn before any second.
  batched = runner.run(Target(Tokenizer()), [runner.plain()], wl,
                       runner.Settings(max_new_tokens=3, repeats=1, batch=2, progress=False),
                       "s", call=stand_in([], lambda v, i: [4, 0, 0]))
  assert [r.prompt for r in batched.records] == ["q,r", "q/2"]


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
  assert tables.quoted_tables(page) == [("spec-bench.speedup", "r.jsonl", "| stale |")]
  fresh = tables.refresh(page, root=str(tmp_path))
  (_, _, table), = tables.quoted_tables(fresh)
  assert "| `ngram` | 2.00x (2.00) | 2.00x (2.00) |" in table
  assert table == tables.render("spec-bench.speedup", str(tmp_path / "r.jsonl"))


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


# ----------------------------------------------------------------------------- legacy reports


def _timed(tokens, times, **extra):
  """An old report's timed row: tokens, each repeat's seconds, the median and tokens/s."""
  med = float(np.median(times))
  return dict(tokens=tokens, time_s=med, tokens_per_s=tokens / med, times_s=list(times), **extra)


def test_legacy_spec_bench_checks_the_figures_the_report_stored():
  old = {"settings": {"repeats": 2}, "methods": {"ngram": {"k": 4}},
         "prompts_by_category": {"qa": 1},
         "costs": {"t_step_ms": 40.0, "methods": {"ngram": {"4": {
             "verify_over_step_here": 1.8, "draft_round_over_step": 0.0}}}},
         "items": [{"question_id": 7, "group": "qa", "turn": 1, "prompt_tokens": 30,
                    "times": {"plain": [2.0, 3.0], "ngram": [1.0, 2.0]},
                    "runs": {"plain": {"tokens": 8, "calls": 8, "judged": [], "accepted": [],
                                       "rounds_by_k": {}},
                             "ngram": {"tokens": 8, "calls": 4, "judged": [4, 2],
                                       "accepted": [2, 1], "rounds_by_k": {}, "equal": True}}}],
         "results": {"greedy": {"ngram": {g: {
             "prompts": 1, "tokens": 8, "target_calls": 4, "tau": 2.0, "speedup": 1.75,
             "position_acceptance": [0.5, 0.5], "position_judged": [4, 2],
             "equal_to_plain": True, "predicted_accelerator": 2.0, "ideal_here": 8 / 7.2}
             for g in ("qa", "overall")}}}}
  head, rs = legacy.spec_bench(old, "old.json", study="heads")
  assert head["study"] == "heads" and {r.study for r in rs} == {"heads"}
  old["results"]["greedy"]["ngram"]["overall"]["tau"] = 2.5
  with pytest.raises(ValueError, match="greedy ngram overall: tau is 2.5 in the file, 2.0"):
    legacy.spec_bench(old, "old.json")


def _real_ngram_report():
  row = {"jspec_greedy": _timed(12, [2.0, 4.0, 3.0]),
         "jspec_ngram@4": _timed(12, [1.0, 2.0, 2.0], speedup=2.0, equal_to_greedy=True, tau=3.0),
         "jspec_ngram@auto": _timed(12, [1.5, 2.0, 3.0], speedup=4 / 3, equal_to_greedy=True,
                                    tau=2.0, rounds_by_k={"0": 2, "4": 2}),
         "transformers_greedy": _timed(12, [6.0, 8.0, 6.0]),
         "transformers_prompt_lookup": _timed(12, [3.0, 4.0, 4.0], speedup=2.0,
                                              equal_to_greedy=True),
         "jspec_over_transformers_prompt_lookup": {"4": 2.0, "auto": 2.0}}
  return {"model": "m.gguf", "params": 1, "settings": {"k": 4, "per_kind": 1},
          "backend": "cpu", "cpu_count": 2, "jax_threads": 2, "jax": "0",
          "prompts": [{"kind": "restate", "tokens": 30}],
          "settings_by_section": {"ngram": {}},
          "ngram": {"k": 4, "max_ngram": 3, "mismatches": [],
                    "kinds": {"restate": row, "all": json.loads(json.dumps(row))}}}


def test_legacy_real_ngram_keeps_every_figure_and_refuses_a_wrong_one():
  old = _real_ngram_report()
  head, rs = legacy.real_ngram(old, "old.json@abc")
  assert head["converted_from"] == "old.json@abc" and len(rs) == 5
  auto = next(r for r in rs if r.method == "ngram@k=auto")
  assert auto.calls == 6 and auto.rounds_by_k == {0: 2, 4: 2} and auto.seconds == (1.5, 2.0, 3.0)
  assert auto.extra == {"prompts": 1, "prompt_tokens": [30]}
  assert report.real_ngram_transformers(head, rs).splitlines()[2] == (
      "| restating given text or code | 4.0 tok/s | 2.0 tok/s | 2.00x | 1.33x | 2.00x |")
  old["ngram"]["kinds"]["all"]["jspec_ngram@4"]["speedup"] = 2.5
  with pytest.raises(ValueError, match="all: jspec_ngram@4.speedup is 2.5 in the file, 2.0"):
    legacy.real_ngram(old, "old.json")
  with pytest.raises(ValueError, match="no whole number of target calls"):
    old = _real_ngram_report()
    old["ngram"]["kinds"]["restate"]["jspec_ngram@4"]["tau"] = 5.0
    legacy.real_ngram(old, "old.json")


def _heads_report():
  def run(tokens, tau, time_s, speedup):
    return {"tokens": tokens, "tau": tau, "time_s": time_s, "speedup": speedup,
            "request_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0},
            "itl_ms": {"p50": 10.0, "p90": 20.0, "p99": 30.0}, "answers_differing_from_plain": 0}
  return {"max_new_tokens": 64, "repeats": 3,
          "methods": {"ngram": {"k": 4},
                      "eagle3 tree16": {"tree": "DynamicTree(nodes=16, depth=5, top_k=4)"}},
          "sets": {"restate": {"prompts": 2, "methods": {
              "plain": run(10, 1.0, 2.0, 1.0), "ngram": run(10, 2.0, 1.0, 2.0),
              "eagle3 tree16": run(10, 2.5, 4.0, 0.5)}}}}


def test_legacy_heads_real_keeps_every_figure_and_refuses_a_wrong_one():
  head, rs = legacy.heads_real(_heads_report(), "old.json")
  assert [r.method for r in rs] == ["plain", "ngram@k=4", "eagle3@tree=16,5,4"]
  assert rs[2].calls == 4 and rs[2].seconds == (4.0,) and rs[2].equal is True
  assert report.heads_real_sets(head, rs).splitlines()[2:] == [
      "| restate | n-gram K = 4 | 2.00 | 2.00x | 10.0 / 30.0 |",
      "| | EAGLE-3 dynamic tree, 16 nodes | 2.50 | 0.50x | 10.0 / 30.0 |"]
  old = _heads_report()
  old["sets"]["restate"]["methods"]["ngram"]["speedup"] = 1.9
  with pytest.raises(ValueError, match="restate ngram: speedup is 1.9 in the file, 2.0"):
    legacy.heads_real(old, "old.json")


def _assisted_report():
  times = {"jspec_greedy": 2.0, "jspec_draft@4": 4.0, "transformers_greedy": 3.0,
           "jspec_draft@auto": 2.5, "transformers_assisted@4": 3.0,
           "transformers_assisted@4+confidence": 3.75}
  row = {name: _timed(10, [t]) for name, t in times.items()}
  row.update(tau=2.0, jspec_speedup=0.5, transformers_speedup=1.0,
             jspec_over_transformers_assisted=0.75, auto_speedup=0.8, confidence_speedup=0.8,
             jspec_auto_over_transformers_confidence=1.5, jspec_equal_to_greedy=True,
             transformers_equal_to_greedy=True)
  return {"target": "t.gguf", "draft": "d", "k": 4, "max_new_tokens": 64, "repeats": 1,
          "torch_threads": 2, "jax_threads": 2,
          "kinds": {"restate": row, "all": json.loads(json.dumps(row))}}


def test_legacy_assisted_keeps_every_figure_and_refuses_a_wrong_one():
  head, rs = legacy.assisted(_assisted_report(), "old.json")
  assert len(rs) == 6 and next(r for r in rs if r.method == "draft@k=4").calls == 5
  assert report.assisted_tokens_per_s(head, rs).splitlines()[2:] == [
      "| restate | 5.0 | 2.5 (0.50x) | 4.0 (0.80x) | 3.3 | 3.3 (1.00x) | 2.7 (0.80x) |",
      "| all | 5.0 | 2.5 (0.50x) | 4.0 (0.80x) | 3.3 | 3.3 (1.00x) | 2.7 (0.80x) |"]
  old = _assisted_report()
  old["kinds"]["restate"]["auto_speedup"] = 0.9
  with pytest.raises(ValueError, match="restate: auto_speedup is 0.9 in the file, 0.8"):
    legacy.assisted(old, "old.json")


def _trees_report():
  return {"head": "h", "questions": "q.jsonl", "conversations": 2, "new_tokens": 8, "rows": {
      "chain K=2": {"k": 2, "tau": 1.7, "accept_hist": [5, 3, 2],
                    "accept_per_position": [0.5, 0.4], "greedy_equal": True, "prompts": 2,
                    "new_tokens": 8, "answer_tokens": 17, "target_calls": 10,
                    "verify_tokens": 3, "head_passes_per_round": 2, "wall_seconds": 1.0}}}


def test_legacy_eagle_trees_takes_acceptance_from_the_histogram():
  head, (r,) = legacy.eagle_trees(_trees_report(), "old.json")
  assert r.method == "eagle3@k=2" and r.judged == (10, 5) and r.accepted == (5, 2)
  assert r.seconds == () and r.extra["wall_seconds"] == 1.0
  assert report.eagle_trees_shapes(head, [r]).splitlines()[2] == (
      "| chain K=2 | 3 | 2 | 1.700 | 0.50 / 0.40 |")
  old = _trees_report()
  old["rows"]["chain K=2"]["accept_per_position"] = [0.5, 0.3]
  with pytest.raises(ValueError, match="accept_per_position is"):
    legacy.eagle_trees(old, "old.json")
  old = _trees_report()
  old["rows"]["chain K=2"]["target_calls"] = 11
  with pytest.raises(ValueError, match="the histogram holds 10 rounds"):
    legacy.eagle_trees(old, "old.json")


def test_legacy_capacity_many_and_capture_cost_keep_their_medians():
  cap = {"study": "capacity", "batch": 2, "repeats": 3,
         "rows": [{"cache_length": 256, "seconds_48": 2.0, "tokens_per_s_48": 48.0,
                   "round_ms": 1000 * 3 / 96},
                  {"cache_length": 4096, "seconds_48": 4.0, "tokens_per_s_48": 24.0,
                   "round_ms": 1000 * 2 / 96}],
         "times": {"256/48": [1.0, 2.0, 3.0], "256/144": [5.0, 5.0, 6.0],
                   "4096/48": [4.0, 4.0, 4.0], "4096/144": [6.0, 6.0, 6.0]}}
  head, rs = legacy.capacity(cap, "old.json")
  assert report.capacity_cache(head, rs).splitlines()[2:] == [
      "| 256 | 2.00 (1.00-3.00) | 5.00 (5.00-6.00) |",
      "| 4,096 | 4.00 (4.00-4.00) | 6.00 (6.00-6.00) |", "| 4,096 / 256 | 2.00x | 1.20x |"]
  cap["rows"][1]["round_ms"] = 30.0
  with pytest.raises(ValueError, match="cache 4096: round_ms is 30.0 in the file"):
    legacy.capacity(cap, "old.json")

  many = {"study": "many", "requests": 4, "slots": 2, "new_tokens": 100, "repeats": 3,
          "equal": True, "vllm_agreement": None,
          "seconds": {"generate_many": 2.0, "static batches": 4.0},
          "tokens_per_s": {"generate_many": 50.0, "static batches": 25.0},
          "times": {"generate_many": [1.0, 2.0, 3.0], "static batches": [4.0, 4.0, 5.0]}}
  head, rs = legacy.many(many, "old.json")
  assert report.many_static(head, rs).splitlines()[2:] == [
      "| static batches of 2 (`generate`, two calls) | 4.0 | 25.0 |",
      "| `generate_many`, 2 slots | 2.0 | 50.0 (2.00x) |"]
  many["tokens_per_s"]["generate_many"] = 51.0
  with pytest.raises(ValueError, match="generate_many: tokens_per_s is 51.0 in the file, 50.0"):
    legacy.many(many, "old.json")

  cc = {"batch": 2, "new_tokens": 4, "layers": [1, 2], "prompt_tokens": 10,
        "times_s": {"plain": [1.0, 2.0, 3.0], "capture": [2.0, 2.5, 3.0],
                    "prefill": [1.0, 1.0, 1.0]},
        "median_s": {"plain": 2.0, "capture": 2.5, "prefill": 1.0},
        "answer_tokens_per_s": {"plain": 4.0, "capture": 3.2}, "capture_over_plain": 1.25,
        "plain_plus_prefill_over_capture": 1.2, "backend": "cpu", "cpus": 2}
  head, rs = legacy.capture_cost(cc, "old.json")
  assert [r.tokens for r in rs] == [8, 8, 0] and rs[1].method == "plain@features=1,2"
  cc["capture_over_plain"] = 1.3
  with pytest.raises(ValueError, match="capture_over_plain is 1.3 in the file, 1.25"):
    legacy.capture_cost(cc, "old.json")


def test_accept_hist_is_rebuilt_from_calls_and_acceptance_by_position():
  # 10 rounds accepted none, 5 one, 3 two, 2 all three: position i accepted by rounds with
  # m > i, judged by those with m >= i (DecodeStats' counters).
  one = rec(calls=20, judged=(20, 10, 5), accepted=(10, 5, 2))
  assert M.accept_hist([one], 3) == [10, 5, 3, 2]
  two = rec(calls=4, judged=(4,), accepted=(1,))  # a narrower record: zeros past its width
  assert M.accept_hist([one, two], 3) == [13, 6, 3, 2]
