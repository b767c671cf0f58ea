"""`jspec bench` (jspec.bench.pair, jspec.bench.device) end to end on tiny random models.

Timings here mean nothing; what is checked is that every section runs and writes records,
that greedy variants reproduce plain decoding's tokens, that the ideal speedup comes from the
measured in-loop costs, that a section redone alone keeps the others, and that the report
and figures are written.
"""

import dataclasses
import math
import os

import jax
import numpy as np
import pytest

import jspec
from conftest import require, tiny_config
from jspec.bench import costs, device, pair, records, runner
from jspec.bench import metrics as M
from jspec.tools import profile

pytestmark = pytest.mark.slow  # benchmark sections


@pytest.fixture(scope="module")
def pair_models():
  target = jspec.models.init(tiny_config(vocab_size=48, layers=1), seed=0)
  return target, jspec.models.init(tiny_config(vocab_size=48, layers=1, hidden=16, heads=2,
                                               kv_heads=1), seed=1)


def heldout(vocab, rows=8, seed=0):
  rng = np.random.default_rng(seed)
  return {"accept_prompts": rng.integers(0, vocab, size=(rows, 12)).astype(np.int32),
          "windows": rng.integers(0, vocab, size=(rows, 100)).astype(np.int32)}


def drafters(target, draft):
  return {"draft": jspec.DraftModel(draft), "ngram": jspec.NGram(vocab_size=target.vocab_size)}


SMALL = pair.Settings(batches=(1, 2), ks=(2,), k=2, max_new_tokens=6, repeats=1,
                      transformers=False, steady_tokens=16)


def test_run_writes_every_section(pair_models, tmp_path, monkeypatch):
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path / "cache"))
  target, draft = pair_models
  head, recs = pair.run(target, drafters(target, draft), heldout(48), SMALL, profile=profile,
                        log=lambda *a: None)
  assert {r.axes["section"] for r in recs} == {"floor", "k_sweep", "steady", "batch_sweep",
                                               "latency", "tasks"}
  assert all(r.study == pair.STUDY for r in recs)
  greedy = [r for r in recs if r.axes.get("temperature", 0.0) == 0 and r.equal is not None]
  assert greedy and all(r.equal for r in greedy)  # every greedy variant reproduces plain
  assert pair.differing(recs) == []

  rows = pair.k_rows(head, recs)
  assert set(rows) == {f"{d}@k={k}" for d in ("draft", "ngram") for k in (2, "auto")}
  for name, r in rows.items():
    assert r["tau"] >= 1.0 and (r["k"] == "auto" or r["tau"] <= r["k"] + 1 + 1e-6), (name, r)
    if r["k"] == "auto":
      assert "ideal" not in r and sum(r["rounds_by_k"].values()) > 0
      continue
    c = head["sections"]["k_sweep"]["costs_ms"][name.split("@")[0]]
    assert set(c) == {"calls", "apart", "rounds"} and set(c["calls"]) == {"0", "2"}
    assert r["ideal"] == pytest.approx(r["tau"] * c["calls"]["0"] / c["calls"]["2"])
    assert r["ideal_apart"] == pytest.approx(r["tau"] * c["apart"]["0"] / c["apart"]["2"])
    assert r["measured_over_ideal"] == pytest.approx(r["speedup"] / r["ideal"])
    mine = M.select(recs, section="k_sweep", method=name)
    assert len(mine) == pair.PROMPTS and r["tau"] == pytest.approx(
        sum(x.tokens for x in mine) / sum(x.calls for x in mine))

  steady = pair.steady_rows(head, recs)
  assert set(steady) == {"plain", "draft@k=2", "ngram@k=2"}
  for name, r in steady.items():
    if name == "plain":
      continue
    # round_ms is a difference of two timed calls, noise at this size: finite is all.
    assert 1.0 <= r["tau"] <= 3.0 + 1e-6 and math.isfinite(r["round_ms"])
    c = head["sections"]["k_sweep"]["costs_ms"][name.split("@")[0]]["calls"]
    assert r["ideal"] == pytest.approx(r["tau"] * c["0"] / c["2"])

  for section in ("batch_sweep", "latency"):
    part = M.select(recs, section=section)
    assert sorted(M.group(part, "batch")) == [1, 2]
    assert set(M.group(part, "method")) == {"plain", "draft@k=2", "draft@k=auto", "ngram@k=2",
                                            "ngram@k=auto"}
  for r in M.select(recs, section="latency"):  # every call streamed, every row's rounds
    assert len(r.extra["arrivals"]) == SMALL.repeats
    gaps = M.inter_token([r])
    assert len(gaps) == r.tokens - r.axes["batch"] and min(gaps) >= 0
  tasks = M.select(recs, section="tasks")
  assert {r.axes["task"] for r in tasks} == {"restate", "sampled"}
  assert {r.axes["temperature"] for r in M.select(tasks, task="sampled")} == {0.8}
  fl = pair.floor_row(head, recs)
  assert fl["weight_bytes"] == sum(x.nbytes for x in jax.tree_util.tree_leaves(target.params))
  assert fl["bandwidth_gb_s"] > 0 and math.isfinite(fl["plain_over_floor"])

  path = records.write(str(tmp_path / "out" / pair.FILE), head, recs)
  head2, recs2 = records.read(path)
  assert recs2 == recs and pair.k_rows(head2, recs2) == rows
  figures = pair.plot(head2, recs2, str(tmp_path / "out"))
  assert sorted(os.path.basename(p) for p in figures) == [
      "latency_vs_batch.png", "speedup_vs_batch.png", "speedup_vs_k.png"]
  assert all(os.path.getsize(p) > 0 for p in figures)
  text = pair.summary(head2, recs2)
  assert "`draft@k=auto`" in text and "floor:" in text and "inter-token latency" in text
  assert "every greedy answer equals" in text

  # Redoing one section keeps the others' records and header parts.
  head3, recs3 = pair.run(target, drafters(target, draft), heldout(48), SMALL,
                          sections=("floor",), keep=(head2, recs2), log=lambda *a: None)
  assert [r for r in recs3 if r.axes["section"] != "floor"] == [
      r for r in recs2 if r.axes["section"] != "floor"]
  assert head3["sections"]["k_sweep"] == head2["sections"]["k_sweep"]
  assert len(M.select(recs3, section="floor")) == 2
  with pytest.raises(ValueError, match="unknown sections"):
    pair.run(target, drafters(target, draft), heldout(48), SMALL, sections=("nope",))


def test_a_greedy_answer_unlike_plain_is_reported(pair_models, monkeypatch):
  """A variant whose greedy answer differs from plain decoding's is named in the report."""
  target, draft = pair_models
  real = runner.jspec_call

  def altered(target, built, *args, **kw):
    fn = real(target, built, *args, **kw)
    if built is None:
      return fn

    def call(n, **more):
      out = fn(n, **more)
      tokens = np.asarray(out.tokens).copy()
      tokens[0, 0] = (tokens[0, 0] + 1) % target.vocab_size
      return dataclasses.replace(out, tokens=tokens)
    return call

  monkeypatch.setattr(runner, "jspec_call", altered)
  s = dataclasses.replace(SMALL, batches=(1,))
  head, recs = pair.run(target, {"ngram": jspec.NGram(vocab_size=48)}, heldout(48), s,
                        sections=("batch_sweep",), log=lambda *a: None)
  assert pair.differing(recs) == ["ngram@k=2", "ngram@k=auto"]
  assert "ERROR: greedy answers differ" in pair.summary(head, recs)


def test_transformers_side_same_weights(pair_models):
  require("torch")
  require("transformers")
  target, draft = pair_models
  prompts = heldout(48)["accept_prompts"][:2].tolist()
  recs, head = pair.transformers_side(target, draft, prompts, dataclasses.replace(
      SMALL, max_new_tokens=5), batch=2)
  assert {(r.method, r.axes["batch"]) for r in recs} == {
      ("plain", 1), ("transformers", 1), ("transformers-assisted@k=2", 1), ("plain", 2),
      ("transformers", 2)}
  assert all(M.tokens_per_s([r]) > 0 for r in recs)
  assert head["transformers"] and head["torch_threads"] >= 1
  full = {"sections": {"transformers": head}}
  text = "\n".join(pair.lines(full, recs))
  assert "assisted" in text and "batch 2" in text
  assert pair.differing(recs) == []  # transformers' answers are compared, not held to jspec's


def test_heads_section(pair_models):
  """The heads section runs chains and trees beside plain decoding, picks each tree from the
  chain's acceptance, and reproduces plain decoding's greedy tokens."""
  from jspec.drafters import eagle as E

  target, draft = pair_models
  eagle = E.Eagle.from_target(target, E.init_params(E.EagleConfig.for_target(target.config),
                                                    jax.random.key(0)))
  head, recs = pair.run(target, drafters(target, draft), heldout(48), SMALL,
                        sections=("heads",), log=lambda *a: None,
                        heads_drafters={"draft": jspec.DraftModel(draft), "eagle": eagle})
  assert {r.method for r in recs} == {"plain", "draft@k=2", "eagle@k=2",
                                      f"draft@best-first={pair.NODES}",
                                      f"eagle@best-first={pair.NODES}"}
  assert all(r.equal for r in recs if r.method != "plain")
  trees = head["sections"]["heads"]["trees"]
  for name, mine in M.group(recs, "method").items():
    if name == "plain":
      continue
    a = mine[0].axes
    if a["shape"] == "tree":  # a tree's depth from its parents
      t = trees[a["drafter"]]
      depth = [0] * len(t["parents"])
      for i, parent in enumerate(t["parents"][1:], start=1):
        depth[i] = depth[parent] + 1
      assert len(t["parents"]) == t["nodes"] == pair.NODES and a["k"] == t["depth"] == max(depth)
    # A round accepts at most one path's drafts, then adds the target's own token.
    assert 1.0 <= M.tau(mine) <= a["k"] + 1 + 1e-6, (name, M.tau(mine))
  assert "`eagle@best-first=16`" in pair.summary(head, recs)


def test_accuracy_table_from_acceptance():
  # 10 rounds: 4 stopped at 0, 3 at 1, 3 accepted both drafts: position 0 accepted in 6 of
  # 10, position 1 in 3 of the 6 that reached it.
  table = pair.accuracy_table([0.6, 0.5], depth=3)
  assert table.shape == (3, pair.MAX_RANKS)
  np.testing.assert_allclose(table[:, 0], [0.6, 0.5, 0.5])
  np.testing.assert_allclose(table[0, 1:], 0.4 * pair.SECOND * pair.HALVING ** np.arange(3))
  np.testing.assert_allclose(pair.accuracy_table([float("nan")], 1)[0], [0, 0.4, 0.2, 0.1])


def test_device_costs_and_breakeven(pair_models):
  """The accelerator mode's figures, on the CPU: what it derives follows from what it timed."""
  target, draft = pair_models
  part, recs = device.run(target, draft, batches=(1, 2), ks=(1, 2), k=2, prompt_length=8,
                          new_tokens=16, repeats=1)
  rows = device.rows(part, recs, k=2)
  assert set(rows) == {"1", "2"}
  for B, row in rows.items():
    # The in-loop step is a difference of two timed runs (costs.steady): finite, its sign
    # at the mercy of a loaded machine at one repeat; the single calls are timed whole.
    assert row["step_ms"] > 0 and np.isfinite(row["loop_step_ms"]) and row["draft_over_step"] > 0
    for k in (1, 2):
      v = row["verify_over_step"][str(k)]
      assert row["breakeven_tau"][str(k)] == pytest.approx(v + k * row["draft_over_step"])
      tau = (1 - 0.8 ** (k + 1)) / 0.2
      assert row["ideal_at_alpha_0.8"][str(k)] == pytest.approx(
          tau / row["breakeven_tau"][str(k)])
    assert row["loop_round_over_sum"] == pytest.approx(
        row["loop_round_ms"] / (row["step_ms"] * row["breakeven_tau"]["2"]))
    assert row["loop_tokens_per_s"] == pytest.approx(int(B) / row["loop_step_ms"] * 1e3)
  assert len(device.lines(part, recs, k=2)) == 2


def test_steady_counts_rounds(pair_models, monkeypatch):
  """Time per round is the time difference over the difference in round counts: with the
  target as its own draft (greedy, so every draft is accepted) a K = 2 round emits 3 tokens,
  and the rounds, not the tokens, divide."""
  target, _ = pair_models
  real = runner.interleave

  def fixed_times(calls, repeats, **kw):  # real runs (for the round counts), chosen times
    outs, times = real(calls, repeats, **kw)
    return outs, {n: [1.0 if n.endswith("/long") else 0.4] * repeats for n in times}

  monkeypatch.setattr(runner, "interleave", fixed_times)
  prompt = [1, 2, 3, 4]
  rounds = lambda n: int(jspec.speculative_generate(
      target, jspec.DraftModel(target), [prompt], num_draft_tokens=2, max_new_tokens=n,
      eos_id=()).stats.target_calls[0])
  extra = rounds(24) - rounds(6)
  assert extra in (6, 7)  # 18 more tokens at 3 per round, give or take the last round
  from jspec.bench.methods import Built
  recs = costs.steady(target, {"plain": None, "self": Built(jspec.DraftModel(target), 2, "")},
                      [prompt], new_tokens=24, repeats=1)
  at = lambda name, length: M.select(recs, method=name, length=length)
  assert M.steady_seconds(at("self", "short"), at("self", "long"), per="rounds") == (
      pytest.approx(0.6 / extra))
  assert M.steady_seconds(at("plain", "short"), at("plain", "long"),
                          per="rounds") == pytest.approx(0.6 / 18)
  with pytest.raises(ValueError, match="new_tokens >= 2"):
    costs.steady(target, {"plain": None}, [prompt], new_tokens=1)


def test_command_refuses_unknown_sections_and_a_missing_accelerator(capsys):
  """`jspec bench`: an unknown section is refused before anything loads; --device gpu on a
  CPU-only jax returns 2 with the reason."""
  from jspec.tools import cli

  with pytest.raises(SystemExit, match="--sections: unknown nope; known: k_sweep"):
    cli.main(["bench", "--sections", "k_sweep,nope"])
  if jax.default_backend() == "cpu":
    assert cli.main(["bench", "--device", "gpu"]) == 2
    assert "needs an accelerator" in capsys.readouterr().err
