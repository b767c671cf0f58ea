"""The EAGLE recipe's pieces on a tiny target: prompt building from source, stored
features, and training on them for both head kinds (no SmolLM2 needed)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.drafters import eagle as E
from jspec.training import corpus
from jspec.recipes import smollm2_eagle3 as R
from jspec.training import train_eagle as TE
from conftest import tiny_config

SOURCE = '''
def short(x):
    return x


def useful(values, scale=2):
    """Scale and sum."""
    total = 0
    for v in values:
        total += v * scale
    return total


class _Hidden:
    pass
'''


class FakeTokenizer:
  """Characters as ids; the chat template wraps the user text in two marker ids."""

  def apply_chat_template(self, messages, add_generation_prompt, tokenize):
    assert add_generation_prompt and tokenize
    return [1] + [ord(c) % 50 + 2 for c in messages[0]["content"]] + [1]


def test_snippets_and_prompts(monkeypatch):
  docs = (corpus.Document("pkg/mod.py", SOURCE),)
  found = R.snippets(docs)
  assert [(m, n) for m, n, _ in found] == [("pkg.mod", "useful")]  # short and private dropped
  monkeypatch.setattr(corpus, "load_corpus",
                      lambda: corpus.Corpus(root="", train=docs * 8, heldout=()))
  prompts = R.build_prompts(FakeTokenizer(), 6, max_prompt=400)
  assert [p["kind"] for p in prompts] == [k for k, _ in R.TEMPLATES]
  assert all(p["ids"][0] == 1 and p["ids"][-1] == 1 for p in prompts)
  assert len(R.build_prompts(FakeTokenizer(), 6, max_prompt=20)) == 0  # too long: dropped


@pytest.fixture(scope="module")
def stored():
  """A tiny target's greedy text as windows, with the features the recipe stores."""
  target = jspec.models.init(tiny_config(vocab_size=32, scale=0.5), seed=4)
  prompts = np.random.default_rng(0).integers(0, 32, size=(12, 4)).astype(np.int32)
  text = np.asarray(jspec.generate(target, prompts.tolist(), max_new_tokens=12,
                                   eos_id=()).tokens)
  windows = np.concatenate([prompts, text], axis=1)
  features, labels = R.window_features(target, windows, (0, 1, 1))
  valid = np.ones(windows.shape, bool)
  valid[:, -1] = False
  return target, {"windows": windows, "features": features, "labels": labels, "valid": valid}


def test_stored_features_are_the_targets(stored):
  target, data = stored
  feats, logits = TE.target_features(target.with_features((0, 1, 1)),
                                     jnp.asarray(data["windows"]))
  np.testing.assert_allclose(np.asarray(data["features"], np.float32), np.asarray(feats),
                             rtol=1e-2, atol=1e-2)  # stored in bf16
  np.testing.assert_array_equal(data["labels"], np.asarray(jnp.argmax(logits, -1)))


@pytest.mark.parametrize("kind", ["eagle3", "eagle1"])
def test_training_on_stored_features_lowers_the_loss(stored, kind):
  target, data = stored
  D = target.config.hidden_size
  if kind == "eagle3":
    config = E.EagleConfig.for_target(target.config, feature_layers=(0, 1))
    data = dict(data, features=data["features"][..., :2 * D])
  else:  # the last D columns are the last layer's output
    config = E.EagleConfig.for_target(target.config)
  cfg = TE.EagleTrainConfig(steps=30, batch_size=4, seq_len=16, learning_rate=1e-2,
                            warmup_steps=3, feature_noise=0.0,
                            ttt_steps=2 if kind == "eagle3" else 1)
  params = E.init_params(config, jax.random.key(0))
  eagle = E.Eagle.from_target(target, params, config)
  if kind == "eagle3":
    eagle = eagle.reduced(np.arange(0, 32, 2))
  final_norm = target.params["final_norm"]
  before = R.heldout_metrics(eagle, final_norm, data, np.arange(8, 12), cfg.ttt_steps)
  optimizer, step = R.make_step(cfg)
  frame = dataclasses.replace(eagle, params=None)
  with jax.numpy_dtype_promotion("standard"):  # optax's own code, as trainer.fit runs it
    opt_state = optimizer.init(params)
    for i in range(cfg.steps):
      rows = np.random.default_rng(i).permutation(8)[:4]
      params, opt_state, loss, _ = step(params, opt_state, frame, final_norm,
                                        *(jnp.asarray(data[k][rows]) for k in
                                          ("windows", "features", "labels", "valid")))
  after = R.heldout_metrics(dataclasses.replace(eagle, params=params), final_norm, data,
                            np.arange(8, 12), cfg.ttt_steps)
  assert np.isfinite(float(loss))
  assert after["ce"] < before["ce"] - 0.5, (before, after)
  if kind == "eagle1":
    assert after["feature_loss"] < before["feature_loss"]
