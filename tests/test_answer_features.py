"""jspec.recipes.answer_features: the target's features and argmax labels captured by the
passes that generate the answer store, one file per shard; the windows a head trains on
take them instead of a second pass, equal to the prefill's; a bounded buffer; a shard
without its file is prefilled."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jspec.recipes import answer_features as F
from jspec.recipes import answer_windows as W
from jspec.recipes import answers as A
from test_answers import SETTINGS, encode, model, pool  # noqa: F401  (the fixture)

LAYERS = (0, 1)


def _features_fn(target, tokens, layers):
  """The prefill's features and argmax, as the recipes compute them (bf16, int32)."""
  m = target.with_features(layers)
  logits, hidden, _ = m.apply(tokens, m.init_cache(tokens.shape[0], tokens.shape[1]),
                              jnp.zeros((tokens.shape[0],), jnp.int32))
  return hidden.astype(jnp.bfloat16), jnp.argmax(logits, -1).astype(jnp.int32)


def _bf16(bits):
  return np.asarray(bits).view(jnp.bfloat16).astype(np.float32)


@pytest.mark.slow  # a benchmark or recipe end to end: tens of seconds on 2 cores
def test_captured_features_equal_a_prefill_and_replace_it(model, tmp_path):
  store, folder = str(tmp_path / "store"), str(tmp_path / "features")
  capture = F.Capture(folder, LAYERS)
  A.generate_answers(model, pool()[:14], encode, store, capture=capture, **SETTINGS)
  manifest = A.read_manifest(store)
  files = sorted(os.listdir(folder))
  assert files == [f"features-{e['file'][6:]}" for e in manifest["shards"]]
  captured = F.stored(manifest, folder, LAYERS)
  rows = W.store_rows(store)
  assert sorted(captured) == list(range(len(rows)))
  greedy = sampled = 0
  for i, (prompt, answer, _) in enumerate(rows):
    seq = np.concatenate([prompt, answer])
    feats, labels = captured[i]
    assert feats.shape == (len(seq) - 1, len(LAYERS) * model.config.hidden_size)
    ref_f, ref_l = jax.jit(_features_fn, static_argnums=2)(model, jnp.asarray([seq]), LAYERS)
    np.testing.assert_allclose(_bf16(feats), np.asarray(ref_f[0, :-1], np.float32),
                               rtol=2e-2, atol=2e-2)
    P = len(prompt)
    assert np.all(labels[:P - 1] == -1)
    np.testing.assert_array_equal(labels[P - 1:], np.asarray(ref_l)[0, P - 1:len(seq) - 1])
    # Greedy rows: the label is the answer's own next token; sampled rows' may differ.
    if np.array_equal(labels[P - 1:], answer):
      greedy += 1
    else:
      sampled += 1
  assert greedy and sampled

  # The training windows: captured rows are read, not prefilled (a prefill that fails
  # proves it), and equal the windows of a store prefilled in full.
  def refuse(*a):
    raise AssertionError("prefilled a captured row")

  kw = dict(window=24, heldout=2, max_windows=None, layers=LAYERS, progress=False)
  read = W.ensure_answer_data(model, str(tmp_path / "w1"), store, refuse, features_dir=folder,
                              **kw)
  full = W.ensure_answer_data(model, str(tmp_path / "w2"), store, _features_fn, **kw)
  valid = full["valid"]
  assert valid.any()
  np.testing.assert_array_equal(read["labels"][valid], full["labels"][valid])
  a = np.asarray(read["features"], np.float32)
  b = np.asarray(full["features"], np.float32)
  fed = np.zeros_like(valid)
  for n, (p, l) in enumerate(zip(full["prompt_lengths"], full["answer_lengths"])):
    fed[n, :p + l - 1] = True  # every slot whose successor is in the window
  np.testing.assert_allclose(a[fed], b[fed], rtol=2e-2, atol=2e-2)

  # A shard without its file (dropped, or written before capture): its rows alone are
  # prefilled, and the windows are the same.
  os.remove(os.path.join(folder, files[0]))
  calls = []

  def counting(target, tokens, layers):
    calls.append(tokens.shape[0])
    return _features_fn(target, tokens, layers)

  mixed = W.ensure_answer_data(model, str(tmp_path / "w3"), store, counting,
                               features_dir=folder, **kw)
  assert calls  # the first shard's rows went through a prefill
  np.testing.assert_array_equal(mixed["labels"][valid], full["labels"][valid])
  np.testing.assert_allclose(np.asarray(mixed["features"], np.float32)[fed], b[fed],
                             rtol=2e-2, atol=2e-2)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_the_buffer_keeps_the_newest_shards_and_a_stale_file_is_ignored(model, tmp_path):
  store, folder = str(tmp_path / "store"), str(tmp_path / "features")
  A.generate_answers(model, pool()[:14], encode, store, capture=F.Capture(folder, LAYERS, keep=1),
                     **SETTINGS)
  manifest = A.read_manifest(store)
  assert len(manifest["shards"]) >= 2
  assert os.listdir(folder) == [f"features-{manifest['shards'][-1]['file'][6:]}"]
  last = manifest["shards"][-1]
  first_row = sum(e["rows"] for e in manifest["shards"][:-1])
  assert sorted(F.stored(manifest, folder, LAYERS)) == list(
      range(first_row, first_row + last["rows"]))
  assert F.stored(manifest, folder, (1,)) == {}  # other layers: not these features
  stale = dict(manifest, shards=manifest["shards"][:-1] + [dict(last, sha256="0" * 64)])
  assert F.stored(stale, folder, LAYERS) == {}  # a file made for another shard
  with pytest.raises(ValueError, match="keep"):
    F.Capture(folder, LAYERS, keep=0)
  with pytest.raises(ValueError, match="at least one"):
    F.Capture(folder, ())
