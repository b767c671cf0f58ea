"""`jspec.tools.measure`: per-position acceptance, prompt files, the report on a tiny model."""

import json

import numpy as np
import pytest

import jspec
from conftest import ragged_prompts, require
from jspec.core.stats import acceptance_rates
from jspec.bench import costs, metrics
from jspec.bench.records import Record
from jspec.tools import measure


def test_position_acceptance_from_histogram():
  # K = 3: 10 rounds stopped at n=0, 5 at n=1, 3 at n=2, 2 accepted all: position i
  # judged by rounds with n >= i, accepted by those with n > i (DecodeStats' counters).
  hist = [10, 5, 3, 2]
  one = Record(study="s", method="m", workload="w", prompt="p", tokens=0, calls=20,
               judged=(20, 10, 5), accepted=(10, 5, 2))
  np.testing.assert_allclose(metrics.acceptance([one]), [10 / 20, 5 / 10, 2 / 5])
  overall = acceptance_rates(hist, emitted=0, target_calls=1)
  # judged = 10*1 + 5*2 + 3*3 + 2*3 = 35, accepted = 5 + 6 + 6 = 17
  assert overall["alpha"] == pytest.approx(17 / 35)
  assert overall["draft_accept"] == pytest.approx(17 / (3 * 20))
  never = Record(study="s", method="m", workload="w", prompt="p", calls=4, judged=(4, 0),
                 accepted=(0, 0))
  assert np.isnan(metrics.acceptance([never])[1])


def test_read_prompts(tmp_path):
  text = tmp_path / "p.txt"
  text.write_text("def f():\n    return 1\n---\nclass A:\n    pass\n---\n\n")
  assert measure.read_prompts(str(text)) == ["def f():\n    return 1\n", "class A:\n    pass\n"]
  jl = tmp_path / "p.jsonl"
  jl.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps("b") + "\n\n"
                + json.dumps({"text": "c"}) + "\n")
  assert measure.read_prompts(str(jl)) == ["a", "b", "c"]
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": 3}\n')
  with pytest.raises(ValueError, match="bad.jsonl:1"):
    measure.read_prompts(str(bad))
  empty = tmp_path / "empty.txt"
  empty.write_text("\n---\n")
  with pytest.raises(ValueError, match="no prompts"):
    measure.read_prompts(str(empty))


@pytest.mark.slow
def test_report_on_a_draft_equal_to_the_target(target, tmp_path):
  prompts = ragged_prompts(2, target.vocab_size, seed=0, min_len=3, max_len=9)
  report = measure.measure(target, target, prompts, ks=(1, 3), max_new_tokens=12, repeats=1)
  assert [r["k"] for r in report["rows"]] == [1, 3]
  for row in report["rows"]:
    # The target drafting for itself is accepted everywhere (greedy).
    assert row["alpha"] == pytest.approx(1.0)
    assert row["position_acceptance"] == [1.0] * row["k"]
    assert row["equal_to_baseline"] is True
    assert row["t_verify_ms"] > 0 and row["t_draft_round_ms"] > 0
  assert "acceptance by position" in measure.format_table(report)
  for row in report["rows"]:  # per prompt, from the per-row counters, adding up to the whole
    per = row["per_prompt"]
    assert len(per) == 2 and all(p["position_acceptance"] == [1.0] * row["k"] for p in per)
    np.testing.assert_array_equal(np.sum([p["accept_hist"] for p in per], axis=0),
                                  row["accept_hist"])
  assert "per prompt" in measure.format_table(report)
  require("matplotlib")
  measure.plot(report, str(tmp_path / "m.png"))
  assert (tmp_path / "m.png").stat().st_size > 1000


@pytest.mark.slow
def test_report_with_a_lookup_drafter(target):
  prompts = [[1, 2, 3, 4, 1, 2, 3]]
  report = measure.measure(target, jspec.NGram(target.vocab_size), prompts, ks=(2,),
                           max_new_tokens=8, repeats=1)
  row = report["rows"][0]
  assert 0.0 <= row["alpha"] <= 1.0 and row["equal_to_baseline"] is True


@pytest.mark.slow
def test_report_with_lookahead_counts_its_whole_verify_block(target):
  la = jspec.Lookahead(target.vocab_size, window=3, ngram=3, guesses=2)
  assert costs.verify_width(la, 2) == 1 + 2 * 2 + 2 + 3  # tree, then the side branch
  assert costs.verify_width(jspec.NGram(target.vocab_size), 2) == 3
  report = measure.measure(target, la, [[1, 2, 3, 4, 1, 2, 3]], ks=(2,), max_new_tokens=8,
                           repeats=1)
  row = report["rows"][0]
  assert row["equal_to_baseline"] is True and row["t_draft_round_ms"] == 0.0


def test_measure_rejects_bad_settings(target):
  with pytest.raises(ValueError, match="ks"):
    measure.measure(target, target, [[1, 2]], ks=(0,))
  with pytest.raises(ValueError, match="empty"):
    measure.measure(target, target, [], ks=(1,))


def test_latency_from_timestamped_rounds(monkeypatch):
  """A streamed call's rounds are timestamped by the runner (`Settings(stream=True)`) and
  read as latencies: tokens of one round arrive together, the first waits for the round,
  the rest 0."""
  from types import SimpleNamespace
  from jspec.bench import runner, workloads

  def call(target, built, rows, *args, **options):
    def fn(n, stream=None):
      if stream is not None:
        stream([[7, 8], [9]])   # t = 1.0: row 0 gets 2 tokens, row 1 one
        stream([[1], []])       # t = 1.5
        stream([[], [4, 5, 6]])  # t = 3.5
      none = np.zeros((2, 0), np.int32)
      return SimpleNamespace(tokens=np.zeros((2, 4), np.int32), lengths=np.asarray([3, 4]),
                             stats=SimpleNamespace(target_calls=np.asarray([2, 2]),
                                                   position_judged=none,
                                                   position_accepted=none),
                             rounds_by_k=None, memory=None)
    return fn

  # The timed call's start and end (runner.interleave), the stream's start, three rounds.
  clock = iter([100.0, 0.0, 1.0, 1.5, 3.5, 200.0])
  monkeypatch.setattr(runner.time, "perf_counter", lambda: next(clock))
  (r,) = runner.run(SimpleNamespace(eos_ids=()), [runner.plain()],
                    workloads.from_ids("w", [[1, 2], [3, 4]]),
                    runner.Settings(max_new_tokens=4, repeats=1, batch=2, stream=True,
                                    progress=False), "s", call=call).records
  assert r.seconds == (100.0,)
  assert metrics.first_token([r]) == [1.0, 1.0]
  assert metrics.request_latency([r]) == [1.5, 3.5]
  assert sorted(metrics.inter_token([r])) == [0.0, 0.0, 0.0, 0.5, 2.5]
  assert metrics.percentiles(metrics.inter_token([r]))["p99"] == pytest.approx(2.42)


@pytest.mark.slow
def test_report_with_latency(target):
  prompts = ragged_prompts(2, target.vocab_size, seed=3, min_len=2, max_len=6)
  report = measure.measure(target, target, prompts, ks=(2,), max_new_tokens=6, repeats=1,
                           latency=True)
  for stats in (report["baseline_latency"], report["rows"][0]["latency"]):
    for d in stats.values():
      assert 0.0 <= d["p50"] <= d["p90"] <= d["p99"]
  assert "inter-token" in measure.format_table(report)
