"""jspec.recipes.learning_curve: nested parts of the store's split sized by answer tokens,
one recipe run per point (each its own training state, the features shared), points read
rather than rerun, and the fit of tau against log tokens. The recipe is replaced by a fake
that writes a manifest (the recipes' own runs are tested in their modules)."""

import json
import math
import os
import sys

import numpy as np
import pytest

import jspec

from jspec.recipes import answer_windows as W
from jspec.recipes import learning_curve as LC
from test_answer_windows import write_store


def test_windows_for_takes_the_splits_prefix(tmp_path):
  store = str(tmp_path / "store")
  rows = write_store(store, rows_per_shard=(6, 6))
  window, heldout = 16, 2
  order = np.random.default_rng(0).permutation(len(rows))[heldout:]
  counts = [max(0, min(len(p) + len(a), window) - min(len(p), window)) for p, a, _ in rows]
  running = np.cumsum([counts[i] for i in order])
  for tokens in (1, int(running[3]), int(running[3]) + 1, 10 ** 6):
    n, held = LC.windows_for(store, tokens, window, heldout)
    if tokens <= running[-1]:
      assert held >= tokens and (n == 1 or running[n - 2] < tokens) and held == running[n - 1]
    else:
      assert n == len(order) and held == running[-1]  # the store is smaller than asked
  # Those windows are the ones the recipes train on with --max-windows n.
  _, train = W.split(len(rows), heldout, 5, 0)
  assert sorted(order[:5].tolist()) == train.tolist()


def test_fit_recovers_a_log_linear_curve():
  points = [{"answer_tokens": t, "tau": 1.2 + 0.3 * math.log10(t / 1e4)} for t in (1e4, 1e5, 1e6)]
  f = LC.fit(points, goal=3.0)
  assert f["b_per_decade"] == pytest.approx(0.3) and f["r2"] == pytest.approx(1.0)
  assert f["tokens_at_goal_extrapolated"] == pytest.approx(1e4 * 10 ** (1.8 / 0.3), rel=1e-6)
  flat = LC.fit([{"answer_tokens": 1e4, "tau": 1.5}, {"answer_tokens": 1e5, "tau": 1.4}], 3.0)
  assert flat["b_per_decade"] < 0 and flat["tokens_at_goal_extrapolated"] is None
  assert LC.fit(points[:1], 3.0) is None


def test_points_run_once_each_with_their_own_state_and_resume(tmp_path, monkeypatch):
  store = str(tmp_path / "store")
  write_store(store, rows_per_shard=(6, 6))
  calls = []

  def fake_main(argv):
    args = {a: (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True)
            for i, a in enumerate(argv) if a.startswith("--")}
    calls.append(args)
    windows = int(args["--max-windows"])
    os.makedirs(args["--out"], exist_ok=True)
    tau = 1.0 + 0.1 * windows
    with open(os.path.join(args["--out"], "manifest.json"), "w") as f:
      json.dump({"chat_heldout_k4": {"restate": {"tau": tau + 0.1}, "question": {"tau": tau - 0.1}},
                 "heldout_windows": {"ce": 1.0}}, f)
    return 0

  fake = type(sys)("fake_recipe")
  fake.main = fake_main
  monkeypatch.setitem(sys.modules, "jspec.recipes.smollm2_eagle3", fake)
  out = str(tmp_path / "curve")
  argv = ["--head", "eagle3", "--answers", store, "--tokens", "20,60", "--out", out,
          "--window", "16", "--heldout", "2", "--epochs", "2", "--min-steps", "3", "--",
          "--form", "published"]
  assert LC.main(argv) == 0
  assert len(calls) == 2
  for c in calls:
    assert c["--form"] == "published" and c["--kind"] == "eagle3"
    assert c["--feature-cache"] == os.path.join(out, "work", "features")
    assert int(c["--steps"]) == max(3, math.ceil(2 * int(c["--max-windows"]) / 4))
  assert calls[0]["--work"] != calls[1]["--work"]  # training state per point
  assert int(calls[0]["--max-windows"]) < int(calls[1]["--max-windows"])
  curve = json.loads(open(os.path.join(out, "curve.json")).read())
  assert [p["tau"] for p in curve["points"]] == pytest.approx(
      [1.0 + 0.1 * int(c["--max-windows"]) for c in calls])
  # Two points: the fit is the line through them, in tau per decade of answer tokens.
  (t0, y0), (t1, y1) = [(p["answer_tokens"], p["tau"]) for p in curve["points"]]
  slope = (y1 - y0) / (math.log10(t1) - math.log10(t0))
  assert curve["fit"]["b_per_decade"] == pytest.approx(slope)
  assert curve["fit"]["a"] == pytest.approx(y0 - slope * math.log10(t0))
  assert all(p["cpu_seconds"] is not None for p in curve["points"])
  # Run again with one more point: the two done are read, only the new one trains.
  assert LC.main(argv[:5] + ["20,60,90"] + argv[6:]) == 0
  assert len(calls) == 3 and len(json.loads(open(os.path.join(out, "curve.json")).read())[
      "points"]) == 3
  with pytest.raises(SystemExit, match="--tokens"):
    LC.main(["--head", "eagle3", "--answers", store, "--tokens", "x", "--out", out])
  # A point is read only as what it was trained as: other epochs (steps) or other recipe
  # options into the same --out are refused, not read as the asked point.
  def changed(option, value):
    at = argv.index(option) + 1
    return argv[:at] + [value] + argv[at + 1:]

  with pytest.raises(SystemExit, match="trained for .* steps"):
    LC.main(changed("--epochs", "8"))
  with pytest.raises(SystemExit, match="recipe options"):
    LC.main(changed("--form", "eagle"))
  # Where the features come from is not what a point is: read, not refused or retrained.
  assert LC.main(argv + ["--features-dir", str(tmp_path / "captures")]) == 0
  assert len(calls) == 3
  # Another epochs' curve sharing the first's --work trains its own state beside it.
  argv = changed("--out", str(tmp_path / "c8"))
  argv = changed("--epochs", "8")
  cut = argv.index("--")
  assert LC.main(argv[:cut] + ["--work", os.path.join(out, "work")] + argv[cut:]) == 0
  assert len(calls) == 5 and {c["--work"] for c in calls[3:]}.isdisjoint(
      c["--work"] for c in calls[:3])


def test_the_draft_model_curve_drives_its_recipe(tmp_path, monkeypatch):
  """`--head draft` runs `smollm2_draft` per point with the store, the shared feature cache
  and the point's windows and steps (no `--kind`: the recipe has none)."""
  store = str(tmp_path / "store")
  write_store(store, rows_per_shard=(6, 6))
  calls = []

  def options(argv):
    return {a: (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True)
            for i, a in enumerate(argv) if a.startswith("--")}

  def fake_main(argv):
    args = options(argv)
    calls.append(argv)
    os.makedirs(args["--out"], exist_ok=True)
    with open(os.path.join(args["--out"], "manifest.json"), "w") as f:
      json.dump({"chat_heldout_k4": {"restate": {"tau": 1.0 + 0.01 * int(args["--max-windows"])}},
                 "heldout_windows": {"kl": 1.0, "top1": 0.1 * int(args["--max-windows"])}}, f)
    return 0

  fake = type(sys)("fake_draft_recipe")
  fake.main = fake_main
  monkeypatch.setitem(sys.modules, "jspec.recipes.smollm2_draft", fake)
  out = str(tmp_path / "curve")
  assert LC.main(["--head", "draft", "--answers", store, "--tokens", "20,60", "--out", out,
                  "--window", "16", "--heldout", "2", "--min-steps", "3"]) == 0
  assert len(calls) == 2 and not any("--kind" in c for c in calls)
  opts = [options(c) for c in calls]
  assert all(o["--answers"] == store and o["--window"] == "16" for o in opts)
  assert opts[0]["--feature-cache"] == opts[1]["--feature-cache"]
  # The cache holds what the largest point trains on: all 10 training rows, or only its own.
  largest = int(opts[1]["--max-windows"])
  assert opts[0].get("--feature-windows") == (None if largest == 10 else str(largest))
  assert LC.main(["--head", "draft", "--answers", store, "--tokens", "20", "--out",
                  str(tmp_path / "c2"), "--window", "16", "--heldout", "2"]) == 0
  last = options(calls[-1])
  assert int(last["--max-windows"]) < 10 and last["--feature-windows"] == last["--max-windows"]
  curve = json.loads(open(os.path.join(out, "curve.json")).read())
  assert curve["head"] == "draft"
  # The first-draft line runs through the two points' held-out top1 (0.1 per window).
  (t0, w0), (t1, w1) = [(p["answer_tokens"], int(o["--max-windows"]))
                        for p, o in zip(curve["points"], opts)]
  assert curve["fit_first_draft"]["b_per_decade"] == pytest.approx(
      0.1 * (w1 - w0) / (math.log10(t1) - math.log10(t0)))


def test_plot_draws_several_curves_and_a_curve_needs_its_options(tmp_path):
  from conftest import require

  with pytest.raises(SystemExit):  # neither a curve nor a plot
    LC.main(["--head", "eagle3", "--out", str(tmp_path)])
  with pytest.raises(SystemExit):
    LC.main(["--plot", str(tmp_path / "none.json"), "--png", str(tmp_path / "x.png")])
  if require("matplotlib", optional=True) is None:
    return
  names = []
  for head, b in (("eagle3", 0.2), ("dflash", 0.05)):
    pts = [{"answer_tokens": t, "tau": 1.0 + b * math.log10(t), "tau_by_kind": {"a": 1.0}}
           for t in (1e4, 1e5)]
    pts[1]["conversations"] = {"n": 20, "tau": 1.1}  # measured at some points only
    names.append(str(tmp_path / f"{head}.json"))
    with open(names[-1], "w") as f:
      json.dump({"head": head, "epochs": 2.0, "points": pts, "fit": LC.fit(pts, 3.0)}, f)
  png = tmp_path / "both.png"
  assert LC.main(["--plot", *names, "--png", str(png)]) == 0
  assert png.stat().st_size > 1000


@pytest.mark.slow
def test_conversation_tau_is_measured_checked_and_cached(tmp_path, monkeypatch):
  """MT-Bench first turns in the target's chat template; a point's head measured on them in
  one batch (answers equal to plain greedy, figures equal to batch 1's) once, then read from
  its folder while the key holds."""
  import jax

  from jspec.drafters import eagle as E
  from jspec.recipes import smollm2_eagle3
  from jspec.tools import bench_suite
  from test_bench_real import write_tiny_llama

  target = bench_suite._load_target(write_tiny_llama(tmp_path / "tiny.gguf"))
  questions = tmp_path / "q.jsonl"
  questions.write_text("".join(json.dumps(r) + "\n" for r in [
      {"question_id": 1, "category": "writing", "turns": ["abab cdcd", "again"]},
      {"question_id": 2, "category": "qa", "turns": ["why"]},
      {"question_id": 3, "category": "roleplay", "turns": ["you are a cat abab"]}]))
  prompts = LC.conversation_prompts(target, str(questions), 2)
  assert len(prompts) == 2 and prompts[0] != prompts[1]  # questions 1 and 3, not the QA one
  with pytest.raises(SystemExit, match="holds 2 MT-Bench questions"):
    LC.conversation_prompts(target, str(questions), 3)
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3,
                                    feature_layers=(0, 1, 1))
  folder = str(tmp_path / "point")
  E.save_eagle(E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config),
               folder)
  key = {"questions": "q.jsonl", "n": 2, "new_tokens": 6, "k": 4}
  report = LC.conversation_tau(folder, target, prompts, key, 6)
  assert report["greedy_equal"] and report["prompts"] == 2
  # tau is the answers' tokens over the rounds the histogram counts; those tokens are the
  # accepted drafts plus one per round (one fewer in a prompt's last round if cut).
  hist = np.asarray(report["accept_hist"])
  calls, accepted = int(hist.sum()), int(hist @ np.arange(hist.size))
  assert report["target_calls"] == calls
  assert report["tau"] == round(report["answer_tokens"] / calls, 4)
  assert calls + accepted - 2 <= report["answer_tokens"] <= calls + accepted
  # One ragged batch gives batch 1's figures: greedy rows do not interact.
  one = smollm2_eagle3.chat_acceptance(target, E.load_eagle(folder, target), prompts, 4, 6)
  assert one["greedy_equal"]
  assert (report["tau"], report["accept_hist"]) == (one["tau"], one["accept_hist"])
  # The same with a drafter that is accepted often (the tiny model repeats itself).
  ngram = jspec.NGram(target.vocab_size)
  batched = LC.batched_acceptance(target, ngram, prompts, 4, 24)
  one = smollm2_eagle3.chat_acceptance(target, ngram, prompts, 4, 24)
  assert batched["greedy_equal"] and one["greedy_equal"] and batched["tau"] > 1.2
  assert (batched["tau"], batched["accept_hist"]) == (one["tau"], one["accept_hist"])
  # A dynamic tree (EAGLE-2) in the same batch: still plain greedy's answers.
  grown = LC.batched_acceptance(target, E.load_eagle(folder, target), prompts, 4, 12,
                                tree=jspec.DynamicTree(nodes=6, depth=3, top_k=2))
  assert grown["greedy_equal"] and grown["k"] == 3 and len(grown["accept_hist"]) == 4

  def no_run(*a, **k):
    raise AssertionError("measured again")

  monkeypatch.setattr(LC, "batched_acceptance", no_run)
  assert LC.conversation_tau(folder, target, prompts, key, 6) == report
  with pytest.raises(AssertionError, match="measured again"):  # another key: measured anew
    LC.conversation_tau(folder, target, prompts, dict(key, n=1), 6)


def test_the_acceptance_a_goal_needs_and_the_first_draft_fit():
  p = LC.acceptance_for(3.0, 4)
  assert sum(p ** i for i in range(5)) == pytest.approx(3.0) and 0.7 < p < 0.8
  assert LC.acceptance_for(1.0, 4) == pytest.approx(0.0, abs=1e-9)
  assert LC.acceptance_for(6.0, 4) is None  # more than K + 1 per call
  points = [{"answer_tokens": t, "heldout_windows": {"top1": 0.2 + 0.1 * math.log10(t / 1e4)}}
            for t in (1e4, 1e5)]
  f = LC.fit_first_draft(points, 3.0)
  assert f["b_per_decade"] == pytest.approx(0.1) and f["acceptance_needed"] == pytest.approx(p)
  assert f["tokens_at_acceptance_extrapolated"] == pytest.approx(1e4 * 10 ** ((p - 0.2) / 0.1))
  # DFlash's manifests name the first slot's agreement apart from the mean over slots.
  dflash = [{"answer_tokens": t, "heldout_windows": {"top1": 0.05, "top1_first": v}}
            for t, v in ((1e4, 0.1), (1e5, 0.2))]
  assert LC.fit_first_draft(dflash, 3.0)["b_per_decade"] == pytest.approx(0.1)
  assert LC.fit_first_draft(points[:1], 3.0) is None
