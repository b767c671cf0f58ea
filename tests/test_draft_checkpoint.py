"""Draft models that borrow their target's embedding (`jspec.io.draft_checkpoint`) and the
recipe that distils one (`jspec.recipes.smollm2_draft`), on tiny targets; the shipped
SmolLM2 draft against its manifest when the real model is installed."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.io import draft_checkpoint as DC
from jspec.recipes import smollm2_draft as RD
from jspec.recipes import smollm2_eagle3 as RE
from jspec.bench.methods import from_folder
from conftest import assert_reproduces_chat_manifest, perturbed, smollm2_and_shipped, tiny_config

V = 48


@pytest.fixture(scope="module")
def pair():
  """A 2-layer tiny target and a 1-layer draft copied from its first layer (same embed)."""
  target = jspec.models.init(tiny_config(vocab_size=V, scale=0.5, tie=True), seed=3)
  config = RD.draft_config(target.config, 1)
  trainable = RD.init_from_target(target.params, [0])
  draft = jspec.models.make_model(config, {**trainable, "embed": target.params["embed"]})
  return target, draft


def _prompts(B, seed=0):
  rng = np.random.default_rng(seed)
  lengths = [5, 1, 9][:B]
  tokens = np.zeros((B, 9), np.int32)
  for b, n in enumerate(lengths):
    tokens[b, :n] = rng.integers(0, V, n)
  return tokens, lengths


@pytest.mark.parametrize("reduced", [False, True], ids=["full", "reduced"])
def test_saved_draft_borrows_the_embedding_and_decodes_exactly(pair, tmp_path, reduced):
  target, draft = pair
  drafter = jspec.DraftModel.reduced(draft, np.arange(0, V, 3)) if reduced else \
      jspec.DraftModel(draft)
  DC.save_draft(drafter, tmp_path / "d", meta={"note": "tiny"})
  stored = DC.params_io.stored_tensors(str(tmp_path / "d" / DC.PARAMS_DIR))
  assert not any(k.startswith("['embed']") for k in stored)  # the embedding is not saved
  assert DC.read_meta(tmp_path / "d") == {"note": "tiny"}
  loaded = from_folder(str(tmp_path / "d"), target)
  assert isinstance(loaded, jspec.DraftModel)
  if reduced:
    np.testing.assert_array_equal(np.asarray(loaded.ids), np.arange(0, V, 3))
  else:
    assert loaded.ids is None
  assert loaded.model.params["embed"] is target.params["embed"]  # f32 target: shared as is
  jax.tree_util.tree_map(np.testing.assert_array_equal, loaded.model.params, draft.params)
  tokens, lengths = _prompts(3)
  base = jspec.generate(target, tokens, prompt_lengths=lengths, max_new_tokens=12, eos_id=())
  spec = jspec.speculative_generate(target, loaded, tokens, prompt_lengths=lengths,
                                    num_draft_tokens=3, max_new_tokens=12, eos_id=())
  np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))


def test_bf16_on_disk_loads_in_f32(pair, tmp_path):
  target, draft = pair
  DC.save_draft(draft, tmp_path / "d", dtype="bfloat16")
  stored = DC.params_io.stored_tensors(str(tmp_path / "d" / DC.PARAMS_DIR))
  assert {str(dt) for _, dt in stored.values()} == {"bfloat16"}
  loaded = DC.load_draft(tmp_path / "d", target)
  wq = loaded.model.params["layers"]["wq"]
  assert wq.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(wq), np.asarray(draft.params["layers"]["wq"]),
                             rtol=1e-2, atol=1e-3)


def test_errors(pair, tmp_path):
  target, draft = pair
  with pytest.raises(ValueError, match="borrows only"):
    DC.save_draft(draft, tmp_path / "a", borrowed=("final_norm",))
  with pytest.raises(TypeError, match="DraftModel or a jspec.Model"):
    DC.save_draft({"embed": 1}, tmp_path / "a")
  DC.save_draft(draft, tmp_path / "d")
  other = jspec.models.init(tiny_config(vocab_size=V + 2, tie=True), seed=0)
  with pytest.raises(ValueError, match="vocab"):
    DC.load_draft(tmp_path / "d", other)
  with pytest.raises(FileNotFoundError, match="no draft model directory"):
    DC.load_draft(tmp_path / "missing", target)
  config_path = tmp_path / "d" / DC.CONFIG_FILE
  meta = json.loads(config_path.read_text())
  meta["config"]["num_hidden_layers"] = 2  # a config the stored tensors do not match
  config_path.write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="shape"):
    DC.load_draft(tmp_path / "d", target)
  config_path.write_text("{")
  with pytest.raises(ValueError, match="not valid JSON"):
    DC.load_draft(tmp_path / "d", target)


@pytest.mark.slow
def test_distillation_lowers_kl_and_raises_engine_acceptance(tmp_path):
  """The recipe's objective and step on a tiny target's stored last-layer outputs: KL
  falls, top-1 agreement rises, and the saved draft's tau through the engine rises."""
  target = jspec.models.init(tiny_config(vocab_size=32, scale=0.4, tie=True), seed=4)
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, 32, size=(96, 4)).astype(np.int32)
  text = np.asarray(jspec.generate(target, prompts.tolist(), max_new_tokens=16,
                                   eos_id=()).tokens)
  windows = np.concatenate([prompts, text], axis=1)
  features, labels = RE.window_features(target, windows, (1,))
  valid = np.ones(windows.shape, bool)
  valid[:, -1] = False
  data = {"windows": windows, "features": features, "labels": labels, "valid": valid}
  # A reduced vocabulary: the half of the ids the target's text uses most (FR-Spec).
  ids = jspec.drafters.vocab_subset.frequent_tokens(text[:88].ravel(), 16, 32)
  index = np.full((32,), -1, np.int32)
  index[ids] = np.arange(len(ids), dtype=np.int32)
  head = target.head()
  rows = jspec.drafters.vocab_subset.head_rows(head.embed, head.lm_head, jnp.asarray(ids))
  embed, norm = target.params["embed"], target.params["final_norm"]
  # As deep as the target, its layers copied with noise: able to match it, far
  # from it at first.
  config = RD.draft_config(target.config, 2)
  draft = perturbed(jspec.models.make_model(config, {
      **RD.init_from_target(target.params, [0, 1]), "embed": target.params["embed"]}), 0.3, 7)
  trainable = {k: draft.params[k] for k in ("layers", "final_norm")}
  held = np.arange(88, 96)
  cfg = jspec.training.train.TrainConfig(steps=150, batch_size=8, seq_len=20, learning_rate=1e-2,
                                       warmup_steps=5)

  def engine_tau(params):
    draft = jspec.DraftModel.reduced(
        jspec.models.make_model(config, {**params, "embed": embed}), ids)
    DC.save_draft(draft, tmp_path / str(len(os.listdir(tmp_path))))
    loaded = DC.load_draft(tmp_path / str(len(os.listdir(tmp_path)) - 1), target)
    out = jspec.speculative_generate(target, loaded, prompts[held].tolist(),
                                     num_draft_tokens=3, max_new_tokens=24, eos_id=())
    base = jspec.generate(target, prompts[held].tolist(), max_new_tokens=24, eos_id=())
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
    return float(np.sum(np.asarray(out.lengths)) / np.sum(np.asarray(out.stats.target_calls)))

  before = RD.heldout_metrics(trainable, embed, config, rows, norm, data, held, index)
  tau_before = engine_tau(trainable)
  optimizer, step = RD.make_step(cfg, config)
  with jax.numpy_dtype_promotion("standard"):
    opt_state = optimizer.init(trainable)
    for i in range(cfg.steps):
      r = np.random.default_rng(i).permutation(88)[:8]
      trainable, opt_state, loss, _ = step(trainable, opt_state, embed, rows, norm,
                                           *RD.batch(data, r, index, config.hidden_size))
  after = RD.heldout_metrics(trainable, embed, config, rows, norm, data, held, index)
  assert np.isfinite(float(loss))
  assert after["kl"] < 0.6 * before["kl"], (before, after)
  assert after["top1"] > before["top1"] + 0.1, (before, after)
  tau_after = engine_tau(trainable)
  assert tau_after > tau_before + 0.1


@pytest.mark.slow
def test_shipped_smollm2_draft_reproduces_its_manifest():
  """checkpoints/smollm2-draft loads for SmolLM2-135M-Instruct (borrowing its embedding)
  and reproduces the held-out chat tau of its manifest (K = 4 chain, greedy, batch 1)
  within 3% per prompt kind, outputs equal to plain greedy. Skipped without the model."""
  from jspec.io import shipped

  target, folder, manifest = smollm2_and_shipped(shipped.SMOLLM2_DRAFT)
  draft = DC.load_draft(folder, target)
  assert draft.model.config.num_hidden_layers == manifest["layers"]
  assert int(draft.ids.shape[0]) == manifest["draft_vocab"]
  assert_reproduces_chat_manifest(target, draft, manifest)


def test_one_command_runs_both_recipes_on_one_work_folder(monkeypatch):
  """`python -m jspec.recipes.smollm2` hands both recipes the same data settings and
  work folder (so the data stage runs once) and writes the shipped folder names."""
  from jspec.io import shipped
  from jspec.recipes import smollm2 as recipe_smollm2

  calls = []
  monkeypatch.setattr(RE, "main", lambda argv: calls.append(("eagle3", argv)) or 0)
  monkeypatch.setattr(RD, "main", lambda argv: calls.append(("draft", argv)) or 0)
  assert recipe_smollm2.main(["--out", "OUT", "--work", "W", "--prompts", "64",
                              "--draft-steps", "7"]) == 0
  assert [name for name, _ in calls] == ["eagle3", "draft"]
  opts = [dict(zip(argv[::2], argv[1::2])) for _, argv in calls]
  assert opts[0]["--out"] == os.path.join("OUT", shipped.SMOLLM2_EAGLE3)
  assert opts[1]["--out"] == os.path.join("OUT", shipped.SMOLLM2_DRAFT)
  assert opts[0]["--kind"] == "eagle3" and opts[1]["--steps"] == "7"
  assert all(o["--work"] == "W" and o["--prompts"] == "64" for o in opts)


@pytest.mark.slow  # training
def test_recipe_distils_on_an_answer_store(tmp_path):
  """`--answers DIR`: the store's windows (loss on answer positions only), the target's last
  decoder layer cached as the teacher, `--max-windows` taking the split's first rows (a
  learning curve's points), and a saved draft that decodes exactly."""
  from jspec.recipes import answer_windows as W
  from test_answer_windows import V as SV, write_store

  store = str(tmp_path / "store")
  write_store(store, rows_per_shard=(6, 6))
  target = jspec.models.init(tiny_config(vocab_size=SV, layers=3, scale=0.5, tie=True), seed=2)
  jspec.save(target, str(tmp_path / "target"))
  out = tmp_path / "draft"
  common = ["--target", str(tmp_path / "target"), "--answers", store, "--window", "24",
            "--heldout", "2", "--layers", "1", "--init", "2", "--vocab", "16", "--steps", "4",
            "--batch-size", "2", "--feature-cache", str(tmp_path / "cache"), "--features-dir",
            str(tmp_path / "none"), "--no-measure", "--no-progress"]
  assert RD.main(["--out", str(out), "--work", str(tmp_path / "w1"), "--max-windows", "5"]
                 + common) == 0
  manifest = json.loads((out / "manifest.json").read_text())
  data = manifest["data"]
  assert (data["train_windows"], data["heldout_windows"], data["max_windows"]) == (5, 2, 5)
  assert 0 < data["loss_positions"] <= data["train_answer_tokens"]
  assert data["source"].startswith("answer store")
  assert manifest["draft_vocab"] == 16 and manifest["steps"] == 4
  assert np.isfinite(manifest["heldout_windows"]["kl"])
  # The cache holds the last decoder layer (the teacher), keyed so; a second point reads it.
  keys = [json.loads((tmp_path / "cache" / f).read_text())
          for f in os.listdir(tmp_path / "cache") if f.endswith(".json")]
  assert [k["layers"] for k in keys] == [[2]]
  cached = W.ensure_answer_data(target, str(tmp_path / "cache"), store, None, window=24,
                                heldout=2, max_windows=None, layers=(2,), progress=False)
  hidden = RE.layer_features(target, jnp.asarray(cached["windows"]), (2,))[0]
  np.testing.assert_allclose(np.asarray(cached["features"], np.float32),
                             np.asarray(hidden, np.float32), rtol=1e-2, atol=1e-2)
  assert RD.main(["--out", str(tmp_path / "all"), "--work", str(tmp_path / "w2")]
                 + common) == 0
  assert json.loads((tmp_path / "all" / "manifest.json").read_text())["data"][
      "train_windows"] == 10
  assert len([f for f in os.listdir(tmp_path / "cache") if f.endswith(".npz")]) == 1
  draft = from_folder(str(out), target)
  assert isinstance(draft, jspec.DraftModel) and int(draft.ids.shape[0]) == 16
  prompts = [r[0].tolist() for r in W.store_rows(store)[:3]]
  spec = jspec.speculative_generate(target, draft, prompts, num_draft_tokens=3,
                                    max_new_tokens=10, eos_id=())
  base = jspec.generate(target, prompts, max_new_tokens=10, eos_id=())
  np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
