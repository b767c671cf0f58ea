"""`jspec bench` end to end on tiny random models (the figures are for the shipped ones).

Timings here mean nothing; what is checked is that every section runs, that greedy
variants reproduce the baseline's tokens, that the ideal speedup comes from the
measured in-loop costs, and that the report and figures are written.
"""

import json
import math
import os

import jax
import numpy as np
import pytest

import jspec
from conftest import require, tiny_config
from jspec.tools import bench, bench_report, bench_timing

pytestmark = pytest.mark.slow  # benchmark sections


@pytest.fixture(scope="module")
def pair():
  target = jspec.models.init(tiny_config(vocab_size=48, layers=1), seed=0)
  return target, jspec.models.init(tiny_config(vocab_size=48, layers=1, hidden=16, heads=2,
                                               kv_heads=1), seed=1)


def heldout(vocab, rows=8, seed=0):
  rng = np.random.default_rng(seed)
  return {"accept_prompts": rng.integers(0, vocab, size=(rows, 12)).astype(np.int32),
          "windows": rng.integers(0, vocab, size=(rows, 100)).astype(np.int32)}


def test_run_writes_every_section(pair, tmp_path, monkeypatch):
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path / "cache"))
  target, draft = pair
  s = bench.Settings(batches=(1, 2), ks=(2,), k=2, max_new_tokens=6, repeats=1,
                     transformers=False, steady_tokens=16)
  report = bench.run(target, draft, heldout(48), s, str(tmp_path / "out"))
  steady = report["k_sweep"]["steady"]
  assert set(steady) == {"baseline_ms_per_token", "draft@2", "ngram@2"}
  for name, r in steady.items():
    if name == "baseline_ms_per_token":
      continue
    costs = report["k_sweep"]["costs_ms_" + name.split("@")[0]]
    # round_ms is a difference of two timed calls, noise at this size: finite is all.
    assert 1.0 <= r["tau"] <= 3.0 and math.isfinite(r["round_ms"])
    assert r["ideal_speedup"] == pytest.approx(r["tau"] * costs["0"] / costs["2"])
    assert r["measured_over_ideal"] == pytest.approx(r["speedup"] / r["ideal_speedup"])
  rows = report["k_sweep"]["rows"]
  assert set(rows) == {f"{d}@{k}" for d in ("draft", "ngram") for k in (2, "auto")}
  for name, r in rows.items():
    assert r["equal_to_baseline"], name  # greedy: every variant reproduces the baseline
    assert r["tau"] >= 1.0 and (r["k"] == "auto" or r["tau"] <= r["k"] + 1 + 1e-6), (name, r)
    if r["k"] != "auto":
      costs = report["k_sweep"]["costs_ms_" + name.split("@")[0]]
      assert r["ideal_speedup"] == pytest.approx(r["tau"] * costs["0"] / costs[str(r["k"])])
      apart = report["k_sweep"]["costs_apart_ms_" + name.split("@")[0]]
      assert r["ideal_apart_speedup"] == pytest.approx(r["tau"] * apart["0"] / apart[str(r["k"])])
  assert set(report["batch_sweep"]) == {"1", "2"}
  for b in ("1", "2"):
    assert all(r["equal_to_baseline"] for r in report["batch_sweep"][b]["rows"].values())
  assert set(report["latency"]) == {"1", "2"}
  for b in ("1", "2"):  # every variant's percentiles, in order
    assert set(report["latency"][b]) == {"baseline", "draft@2", "draft@auto", "ngram@2",
                                         "ngram@auto"}
    for stats in report["latency"][b].values():
      for key in ("request_ms", "itl_ms"):
        assert 0 <= stats[key]["p50"] <= stats[key]["p90"] <= stats[key]["p99"], stats
  assert set(report["tasks"]) == {"restate", "sampled"}
  fl = report["floor"]
  assert fl["weight_bytes"] == sum(x.nbytes for x in
                                   __import__("jax").tree_util.tree_leaves(target.params))
  assert fl["bandwidth_gb_s"] > 0 and math.isfinite(fl["baseline_over_floor"])
  with open(tmp_path / "out" / "bench.json") as f:
    assert json.load(f)["k_sweep"]["rows"].keys() == rows.keys()
  assert sorted(os.path.basename(p) for p in report["figures"]) == [
      "latency_vs_batch.png", "speedup_vs_batch.png", "speedup_vs_k.png"]
  text = bench_report.summary(report)
  assert "draft@auto" in text and "floor" in text and "inter-token latency" in text
  # Redoing one section keeps the others from the last run's bench.json.
  again = bench.run(target, draft, heldout(48), s, str(tmp_path / "out"), sections=("floor",))
  assert again["k_sweep"] == json.loads(json.dumps(report["k_sweep"]))
  assert again["floor"]["baseline_ms_per_token"] == pytest.approx(
      again["floor"]["baseline_over_floor"] * again["floor"]["floor_ms"])


def test_transformers_side_same_weights(pair):
  require("torch")
  require("transformers")
  target, draft = pair
  prompts = heldout(48)["accept_prompts"][:2].tolist()
  s = bench.Settings(max_new_tokens=5, repeats=1)
  out = bench.transformers_side(target, draft, prompts, {"jspec_best_fixed_k": 2}, s,
                                batch=2)
  assert set(out["tokens_per_s"]) == {"greedy_b1", "assisted_b1", "greedy_b2"}
  assert all(v > 0 for v in out["tokens_per_s"].values())
  # jspec's own greedy runs are timed in the same turns as torch's.
  assert out["jspec_tokens_per_s_b1"] > 0 and out["jspec_tokens_per_s_b2"] > 0
  assert out["assisted_speedup"] > 0 and out["jspec_best_fixed_k"] == 2


def test_heads_section(pair, tmp_path):
  """The heads section runs chains and trees side by side, picks each tree from the
  chain's acceptance, reproduces the baseline's greedy tokens, and summarises."""
  from jspec.tools import bench_heads
  target, draft = pair
  s = bench.Settings(batches=(1,), ks=(2,), k=2, max_new_tokens=6, repeats=1,
                     transformers=False, steady_tokens=16)
  eagle = jspec.drafters.eagle.Eagle.from_target(
      target, jspec.drafters.eagle.init_params(jspec.drafters.eagle.EagleConfig.for_target(target.config),
                                      jax.random.key(0)))
  report = bench.run(target, draft, heldout(48), s, str(tmp_path / "out"), sections=("heads",),
                     self_drafters={"eagle": eagle})
  rows = report["heads"]["rows"]
  assert set(rows) == {"draft chain", "draft tree", "eagle chain", "eagle tree"}
  for name, r in rows.items():
    assert r["equal_to_baseline"], name
    # A round accepts at most one path's drafts, then adds the target's own token: tau is
    # at most K + 1 for a chain of K, depth + 1 for a tree (its depth from its parents).
    if "tree" in name:
      depth = [0] * len(r["parents"])
      for i, parent in enumerate(r["parents"][1:], start=1):
        depth[i] = depth[parent] + 1
      assert len(r["parents"]) == r["nodes"] and r["depth"] == max(depth), name
      longest = r["depth"]
    else:
      longest = r["k"]
    assert 1.0 <= r["tau"] <= longest + 1 + 1e-6, (name, r["tau"], longest)
  assert rows["draft chain"]["k"] == rows["eagle chain"]["k"] == 2
  assert rows["draft tree"]["nodes"] == 16
  assert "draft tree" in bench_report.summary(report)


def test_accuracy_table_from_acceptance():
  from jspec.tools import bench_heads
  # 10 rounds: 4 stopped at 0, 3 at 1, 3 accepted both drafts.
  a = bench_heads.depth_acceptance([4, 3, 3])
  np.testing.assert_allclose(a, [6 / 10, 3 / 6])
  table = bench_heads.accuracy_table([4, 3, 3], depth=3)
  assert table.shape == (3, bench_heads.MAX_RANKS)
  np.testing.assert_allclose(table[:, 0], [0.6, 0.5, 0.5])
  np.testing.assert_allclose(table[0, 1], 0.4 * bench_heads.SECOND)


def test_device_report_costs_and_breakeven(pair):
  """The accelerator mode's report, on the CPU: what it derives follows from what it timed."""
  target, draft = pair
  s = bench.Settings(k=2, repeats=1)
  report = bench_timing.device_report(target, draft, batches=(1, 2), ks=(1, 2), s=s,
                                      prompt_length=8)
  assert set(report) == {"1", "2"}
  for row in report.values():
    assert row["step_ms"] > 0 and row["loop_step_ms"] > 0 and row["draft_over_step"] > 0
    for k in (1, 2):
      v = row["verify_over_step"][str(k)]
      assert row["breakeven_tau"][str(k)] == pytest.approx(v + k * row["draft_over_step"])
      tau = (1 - 0.8 ** (k + 1)) / 0.2
      assert row["ideal_at_alpha_0.8"][str(k)] == pytest.approx(
          tau / row["breakeven_tau"][str(k)])
    assert row["loop_round_over_sum"] == pytest.approx(
        row["loop_round_ms"] / (row["step_ms"] * row["breakeven_tau"]["2"]))


def test_loop_round_time_counts_rounds(pair, monkeypatch):
  """Time per round is the time difference over the difference in round counts: with
  the target as its own draft (greedy, so every draft is accepted) a K = 2 round emits
  3 tokens, and the rounds, not the tokens, divide."""
  target, _ = pair
  real = bench_timing.side_by_side

  def fixed_times(calls, repeats):  # real runs (for the round counts), chosen times
    res = real(calls, repeats)
    for (_, length), r in res.items():
      r["times"] = [1.0] if length == "long" else [0.4]
    return res

  monkeypatch.setattr(bench_timing, "side_by_side", fixed_times)
  prompt = [1, 2, 3, 4]
  rounds = lambda n: int(jspec.speculative_generate(
      target, jspec.DraftModel(target), [prompt], num_draft_tokens=2, max_new_tokens=n,
      eos_id=()).stats.target_calls[0])
  extra = rounds(24) - rounds(6)
  assert extra in (6, 7)  # 18 more tokens at 3 per round, give or take the last round
  spec = bench_timing.loop_round_time(target, jspec.DraftModel(target), [prompt], 2,
                                      new_tokens=24, repeats=1)
  assert spec == pytest.approx(0.6 / extra)
  assert bench_timing.loop_round_time(target, None, [prompt], 0, new_tokens=24,
                                      repeats=1) == pytest.approx(0.6 / 18)
  with pytest.raises(ValueError, match="new_tokens >= 2"):
    bench_timing.loop_round_time(target, None, [prompt], 0, new_tokens=1)
