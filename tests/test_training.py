"""Corpus, training and distillation: deterministic split, losses that fall, exact resumption."""

import os

import jax
import numpy as np
import pytest

from conftest import tiny_config
from jspec.training import corpus, train

pytestmark = pytest.mark.slow  # training runs

# A stream with structure to learn: a few repeated "statements" over a vocab of 32.
_VOCAB = 32


def _stream(n=6000, seed=0):
  rng = np.random.default_rng(seed)
  phrases = [rng.integers(1, _VOCAB, size=int(k)) for k in rng.integers(3, 9, size=12)]
  parts = [phrases[i] for i in rng.integers(0, len(phrases), size=n // 5)]
  return np.concatenate(parts)[:n].astype(np.uint16)


def _cfg(steps, lr=1e-2, seed=0, **kw):
  return train.TrainConfig(steps=steps, batch_size=4, seq_len=24, learning_rate=lr,
                           warmup_steps=min(2, steps - 1), seed=seed, eval_every=10_000,
                           checkpoint_every=kw.pop("checkpoint_every", 10_000), **kw)


def _batches(stream, cfg):
  return lambda step: {"tokens": corpus.windows(stream, cfg.seq_len + 1, cfg.batch_size,
                                                (cfg.seed, step))}


# ----------------------------------------------------------------------------- corpus


def _write_tree(root, files):
  for rel, text in files.items():
    path = os.path.join(root, *rel.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
      f.write(text if isinstance(text, bytes) else text.encode())


def test_split_is_a_pure_function_of_the_path(tmp_path):
  files = {f"pkg{i % 7}/mod_{i}.py": f"x = {i}\n" for i in range(300)}
  files["pkg0/broken.py"] = b"\xff\xfe not utf-8"
  files["site-packages/thirdparty.py"] = "y = 1\n"
  files["notes.txt"] = "not python"
  _write_tree(tmp_path / "a", files)
  first = corpus.load_corpus(str(tmp_path / "a"))
  again = corpus.load_corpus(str(tmp_path / "a"))
  assert [d.path for d in first.heldout] == [d.path for d in again.heldout]
  assert first.describe()["fingerprint"] == again.describe()["fingerprint"]
  paths = [d.path for d in first.train + first.heldout]
  assert "pkg0/broken.py" not in paths and "site-packages/thirdparty.py" not in paths
  assert len(paths) == 300
  # Removing files does not move the others between splits.
  kept = {k: v for k, v in files.items() if not k.startswith("pkg3/")}
  _write_tree(tmp_path / "b", kept)
  fewer = corpus.load_corpus(str(tmp_path / "b"))
  assert {d.path for d in fewer.heldout} == {d.path for d in first.heldout
                                             if not d.path.startswith("pkg3/")}
  assert all(corpus.is_heldout(d.path) for d in first.heldout)
  assert not any(corpus.is_heldout(d.path) for d in first.train)


def test_stdlib_split_holds_out_at_least_five_percent():
  root = corpus.stdlib_root()
  files = corpus.list_files(root)
  held = sum(corpus.is_heldout(f) for f in files)
  assert len(files) > 100
  assert held / len(files) >= 0.05, (held, len(files))
  assert files == sorted(files)


def test_windows_are_seeded():
  s = _stream()
  a = corpus.windows(s, 25, 4, (3, 7))
  b = corpus.windows(s, 25, 4, (3, 7))
  c = corpus.windows(s, 25, 4, (3, 8))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  with pytest.raises(ValueError, match="shorter than a window"):
    corpus.windows(s[:10], 25, 1, 0)


# ----------------------------------------------------------------------------- training


def test_a_few_steps_lower_the_heldout_loss():
  config = tiny_config(vocab_size=_VOCAB, layers=1, hidden=32)
  stream = _stream(seed=0)
  heldout = corpus.tiled_windows(stream[-1000:], 25, 16)  # same phrases, unseen offsets
  cfg = _cfg(40)
  before = train.heldout_loss(train.train(config, _cfg(1, lr=0.0), _batches(stream, cfg),
                                          progress=False).module.to_model(), heldout)
  result = train.train(config, cfg, _batches(stream, cfg), heldout=heldout, progress=False)
  assert result.heldout_loss < before - 0.5, (before, result.heldout_loss)
  assert result.tokens_seen == 40 * 4 * 24
  assert result.history and result.history[-1]["step"] == 40


def test_resume_from_checkpoint_is_exact(tmp_path):
  config = tiny_config(vocab_size=_VOCAB, layers=1, hidden=16, heads=2, kv_heads=1)
  stream = _stream()
  cfg = _cfg(8, checkpoint_every=4)
  whole = train.train(config, cfg, _batches(stream, cfg), progress=False)
  # An interrupted run: stop after 4 steps (same schedule, so same checkpoint), resume.
  ckpt = str(tmp_path / "run")

  def interrupted(step):
    if step >= 4:
      raise KeyboardInterrupt
    return _batches(stream, cfg)(step)

  with pytest.raises(KeyboardInterrupt):
    train.train(config, cfg, interrupted, checkpoint_dir=ckpt, progress=False)
  resumed = train.train(config, cfg, _batches(stream, cfg), checkpoint_dir=ckpt, progress=False)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                              atol=1e-6),
      whole.module.params(), resumed.module.params())


def test_distillation_lowers_kl_to_the_teacher():
  import jspec

  teacher = jspec.models.init(tiny_config(vocab_size=_VOCAB, layers=1, hidden=32, scale=0.5),
                              seed=0)
  student_config = tiny_config(vocab_size=_VOCAB, layers=1, hidden=16, heads=2, kv_heads=1)
  stream = _stream()
  probe = corpus.tiled_windows(_stream(seed=1), 24, 16)
  cfg = _cfg(40, lr=1e-2)
  start = train.train(student_config, _cfg(1, lr=0.0), _batches(stream, cfg), progress=False)
  kl_before = train.kl_divergence(start.module.to_model(), teacher, probe)
  result = train.train(student_config, cfg, _batches(stream, cfg), train.distill_loss,
                       teacher=teacher, progress=False)
  kl_after = train.kl_divergence(result.module.to_model(), teacher, probe)
  assert kl_after < 0.75 * kl_before, (kl_before, kl_after)


def test_train_config_rejects_bad_settings():
  with pytest.raises(ValueError, match="warmup_steps"):
    train.TrainConfig(steps=5, batch_size=1, seq_len=8, learning_rate=1e-3, warmup_steps=5)
  with pytest.raises(ValueError, match=">= 1"):
    train.TrainConfig(steps=0, batch_size=1, seq_len=8, learning_rate=1e-3, warmup_steps=0)
