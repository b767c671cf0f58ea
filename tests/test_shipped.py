"""The shipped code models: they load, match their manifests, and decode exactly."""

import json
import os

import jax
import numpy as np
import pytest

import jspec
from jspec.tools import costs
from jspec.models import shipped, train


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
  loss = train.heldout_loss(model, heldout["windows"])
  assert abs(loss - manifest["heldout_loss"]) <= 0.01 * manifest["heldout_loss"], (
      name, loss, manifest["heldout_loss"])
  for key in ("tokens_seen", "command", "corpus", "training"):
    assert manifest[key]


def test_weights_are_stored_in_bf16():
  path = os.path.join(shipped.checkpoints_dir(), shipped.TARGET)
  stored = jspec.load(path)  # no dtype: keep what is on disk
  dtypes = {str(x.dtype) for x in jax.tree_util.tree_leaves(stored.params)}
  assert dtypes == {"bfloat16"}
  with open(os.path.join(path, "manifest.json")) as f:
    assert json.load(f)["stored_dtype"] == "bfloat16"


@pytest.mark.slow
def test_distilled_draft_beats_text_draft_and_speculation_is_exact(target, heldout):
  prompts = heldout["accept_prompts"][:8, :48].tolist()
  rates = {}
  base = jspec.generate(target, prompts, max_new_tokens=32, eos_id=())
  for name in (shipped.DRAFT, shipped.DRAFT_TEXT):
    draft = shipped.load(name)
    out = jspec.speculative_generate(target, draft, prompts, num_draft_tokens=4,
                                     max_new_tokens=32, eos_id=())
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(base.tokens))
    rates[name] = costs.acceptance_rates(out.stats.accept_hist, int(np.sum(out.lengths)),
                                         int(np.sum(out.stats.target_calls)))["alpha"]
  # The manifests' figures come from 32 prompts x 128 tokens; this is a smaller probe.
  assert rates[shipped.DRAFT] > rates[shipped.DRAFT_TEXT], rates
  manifest = shipped.manifest(shipped.DRAFT)["acceptance_vs_code_target"]
  assert manifest["greedy_equal"] and manifest["k"] == 4


def test_generate_cli_completes_text(capsys):
  from jspec.tools import cli

  prompt = "def add(a, b):\n    "
  assert cli.main(["generate", "--prompt", prompt, "--max-new-tokens", "8"]) == 0
  out = capsys.readouterr().out
  assert out.startswith(prompt) and len(out) > len(prompt)


def test_missing_checkpoints_are_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="no shipped checkpoints"):
    shipped.checkpoints_dir(str(tmp_path))
