"""The shipped code models: they load, match their manifests, and decode exactly."""

import json
import os

import jax
import numpy as np
import pytest

import jspec
from jspec.core.stats import acceptance_rates
from jspec.io import shipped
from jspec.training import train


@pytest.fixture(scope="module")
def target():
  return shipped.load(shipped.TARGET)


@pytest.fixture(scope="module")
def heldout():
  return shipped.heldout()


@pytest.mark.slow
@pytest.mark.parametrize("name", [shipped.TARGET, shipped.DRAFT, shipped.DRAFT_TEXT])
def test_heldout_loss_matches_manifest(name, heldout):
  manifest = shipped.manifest(name)
  model = shipped.load(name)
  assert model.num_params() == manifest["parameters"]
  assert model.tokenizer is not None and model.eos_ids
  config = model.config.to_dict()  # (fields added since keep their defaults)
  assert {key: config.get(key) for key in manifest["config"]} == manifest["config"]
  windows = heldout["windows"]
  assert list(windows.shape) == [manifest["heldout_eval"]["windows"],
                                 manifest["heldout_eval"]["tokens_per_window"]]
  loss = train.heldout_loss(model, windows)
  assert abs(loss - manifest["heldout_loss"]) <= 0.01 * manifest["heldout_loss"], (
      name, loss, manifest["heldout_loss"])
  # The training it reports adds up: steps, the history's last step, tokens seen (a draft's
  # include the text-only stage it started from, run at the same batch and length).
  training, cfg = manifest["training"], manifest["training"]["train_config"]
  assert training["steps"] == cfg["steps"] == training["history"][-1]["step"]
  steps = cfg["steps"]
  if name != shipped.TARGET:
    import re
    steps += int(re.fullmatch(r"draft-text \((\d+) steps of cross-entropy\)",
                              manifest["init_from"]).group(1))
    # The distance to the target it reports: KL(target || draft) on the same windows.
    kl = train.kl_divergence(model, shipped.load(shipped.TARGET), windows[:, :-1])
    assert abs(kl - manifest["kl_to_target"]) <= 0.01 * manifest["kl_to_target"], (name, kl)
  assert manifest["tokens_seen"] == steps * cfg["batch_size"] * cfg["seq_len"]


def test_weights_are_stored_in_bf16():
  for name in (shipped.TARGET, shipped.DRAFT, shipped.DRAFT_TEXT):
    path = os.path.join(shipped.checkpoints_dir(), name)
    stored = jspec.load(path)  # no dtype: keep what is on disk
    dtypes = {str(x.dtype) for x in jax.tree_util.tree_leaves(stored.params)}
    assert dtypes == {"bfloat16"}, name
    with open(os.path.join(path, "manifest.json")) as f:
      manifest = json.load(f)
    assert manifest["stored_dtype"] == "bfloat16" and manifest["compute_dtype"] == "float32"
    assert stored.num_params() == manifest["parameters"], name


@pytest.mark.slow
def test_distilled_draft_beats_text_draft_and_speculation_is_exact(target, heldout):
  """Each draft's `acceptance_vs_code_target`, run again as its manifest describes it
  (every held-out prompt, K = 4, greedy; under a minute): outputs equal plain decoding, and
  tau, alpha and the acceptance histogram come out as the manifest says."""
  want = {name: shipped.manifest(name)["acceptance_vs_code_target"]
          for name in (shipped.DRAFT, shipped.DRAFT_TEXT)}
  spec = want[shipped.DRAFT]
  prompts = heldout["accept_prompts"]
  assert list(prompts.shape) == [spec["prompts"], spec["prompt_tokens"]]
  base = jspec.generate(target, prompts.tolist(), max_new_tokens=spec["new_tokens"], eos_id=())
  rates = {}
  for name, w in want.items():
    assert (w["k"], w["prompts"], w["prompt_tokens"], w["new_tokens"]) == (
        spec["k"], spec["prompts"], spec["prompt_tokens"], spec["new_tokens"])
    out = jspec.speculative_generate(target, shipped.load(name), prompts.tolist(),
                                     num_draft_tokens=w["k"], max_new_tokens=w["new_tokens"],
                                     eos_id=())
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
    assert w["greedy_equal"]
    hist = np.asarray(out.stats.accept_hist)
    rates[name] = acceptance_rates(hist, int(np.sum(out.lengths)),
                                         int(np.sum(out.stats.target_calls)))
    for key in ("tau", "alpha", "draft_accept"):
      assert rates[name][key] == pytest.approx(w[key], rel=0.01), (name, key, rates[name], w)
    # Greedy rounds are fixed by the weights: the histogram too, up to a round or two where
    # another machine's float rounding flips a near-tie in the draft.
    assert np.abs(hist - np.asarray(w["accept_hist"])).sum() <= 0.01 * hist.sum(), (name, hist)
  assert rates[shipped.DRAFT]["alpha"] > rates[shipped.DRAFT_TEXT]["alpha"], rates


def test_generate_cli_completes_text(capsys):
  from jspec.tools import cli

  prompt = "def add(a, b):\n    "
  assert cli.main(["generate", "--prompt", prompt, "--max-new-tokens", "8"]) == 0
  out = capsys.readouterr().out
  assert out.startswith(prompt) and len(out) > len(prompt)


def test_missing_checkpoints_are_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="no shipped checkpoints"):
    shipped.checkpoints_dir(str(tmp_path))
