"""Native checkpoints (orbax), Hugging Face import/export through the CLI, load errors."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import tiny_config
from jspec.io import checkpoint
from jspec.tools import cli
from test_tokenizer import word_level

V = 40


def tiny_model(dtype=jnp.float32, **kw):
  model = jspec.models.init(tiny_config(vocab_size=V, **kw), seed=0, dtype=dtype)
  return dataclasses.replace(model, tokenizer=jspec.Tokenizer(word_level(V)), eos_ids=(5, 7))


def leaves(model):
  return jax.tree_util.tree_flatten_with_path(model.params)[0]


def assert_same_params(a, b):
  assert jax.tree_util.tree_structure(a.params) == jax.tree_util.tree_structure(b.params)
  for (path, x), (_, y) in zip(leaves(a), leaves(b)):
    assert x.dtype == y.dtype, jax.tree_util.keystr(path)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), jax.tree_util.keystr(path))


TOKENS = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]], np.int32)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A float32 tiny model and the native checkpoint it was saved to."""
  model = tiny_model()
  path = tmp_path_factory.mktemp("ckpt") / "native"
  jspec.save(model, path)
  return model, path


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", [jnp.float32,
                                   pytest.param(jnp.bfloat16, marks=pytest.mark.slow)])
def test_round_trip_identical_params_and_logits(tmp_path, dtype):
  model = tiny_model(dtype, tie=dtype == jnp.bfloat16)
  jspec.save(model, tmp_path / "ckpt")
  assert sorted(os.listdir(tmp_path / "ckpt")) == ["jspec_config.json", "params", "tokenizer.json"]
  loaded = jspec.load(tmp_path / "ckpt")
  assert loaded.config == model.config
  assert loaded.dtype == dtype
  assert_same_params(model, loaded)
  np.testing.assert_array_equal(np.asarray(loaded.logits(TOKENS)),
                                np.asarray(model.logits(TOKENS)))
  assert loaded.eos_ids == (5, 7)
  assert loaded.tokenizer.eos_ids == (5, 7)
  assert loaded.tokenizer.encode("the cat sat") == model.tokenizer.encode("the cat sat")


def test_dtype_cast_on_load(saved):
  model, path = saved
  cast = jspec.load(path, dtype="bfloat16")
  for (p, x), (_, y) in zip(leaves(model), leaves(cast)):
    assert y.dtype == jnp.bfloat16, jax.tree_util.keystr(p)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x.astype(jnp.bfloat16)))
  back = jspec.load(path, dtype=jnp.float32)  # no-op cast keeps values bit for bit
  assert_same_params(model, back)
  with pytest.raises(ValueError, match="floating-point"):
    jspec.load(path, dtype="int32")


@pytest.mark.slow
def test_save_without_tokenizer_or_eos(tmp_path):
  model = jspec.models.init(tiny_config(vocab_size=V, layers=1), seed=1)
  jspec.save(model, tmp_path / "bare")
  loaded = jspec.load(str(tmp_path / "bare"))
  assert loaded.tokenizer is None and loaded.eos_ids == ()
  assert_same_params(model, loaded)


def test_save_refuses_a_non_empty_directory(saved, tmp_path):
  model, path = saved
  with pytest.raises(FileExistsError, match=str(path)):
    jspec.save(model, path)
  (tmp_path / "file").write_text("x")
  with pytest.raises(FileExistsError, match="file"):
    jspec.save(model, tmp_path / "file")


# ----------------------------------------------------------------------------- load errors


def copy_checkpoint(src, dst):
  import shutil
  shutil.copytree(src, dst)
  return dst


def edit_config(path, **changes):
  meta = json.loads((path / "jspec_config.json").read_text())
  for key, value in changes.items():
    if key in meta:
      meta[key] = value
    else:
      meta["config"][key] = value
  (path / "jspec_config.json").write_text(json.dumps(meta))


def test_missing_directory_and_unknown_contents(tmp_path):
  with pytest.raises(FileNotFoundError, match="no checkpoint directory.*nowhere"):
    jspec.load(tmp_path / "nowhere")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="empty.*neither"):
    jspec.load(tmp_path / "empty")
  (tmp_path / "f").write_text("x")
  with pytest.raises(NotADirectoryError, match="f is a file"):
    jspec.load(tmp_path / "f")


def test_missing_params(saved, tmp_path):
  import shutil
  path = copy_checkpoint(saved[1], tmp_path / "c")
  shutil.rmtree(path / "params")
  with pytest.raises(FileNotFoundError, match="params.*missing"):
    jspec.load(path)


def test_corrupt_config_file(saved, tmp_path):
  path = copy_checkpoint(saved[1], tmp_path / "c")
  text = (path / "jspec_config.json").read_text()
  (path / "jspec_config.json").write_text(text[:len(text) // 2])
  with pytest.raises(ValueError, match="jspec_config.json is not valid JSON"):
    jspec.load(path)


def test_unknown_config_class(saved, tmp_path):
  path = copy_checkpoint(saved[1], tmp_path / "c")
  edit_config(path, config_class="os.system")
  with pytest.raises(ValueError, match="jspec_config.json: unknown config class 'os.system'"):
    jspec.load(path)


def test_config_that_does_not_match_params(saved, tmp_path):
  path = copy_checkpoint(saved[1], tmp_path / "c")
  edit_config(path, vocab_size=V + 8)
  with pytest.raises(ValueError, match=r"tensor \['embed'\].*\(40, 32\).*\(48, 32\)"):
    jspec.load(path)
  edit_config(path, vocab_size=V, tie_word_embeddings=True)
  with pytest.raises(ValueError, match=r"unexpected tensors \[\"\['lm_head'\]\"\]"):
    jspec.load(path)


def test_invalid_eos_ids(saved, tmp_path):
  path = copy_checkpoint(saved[1], tmp_path / "c")
  edit_config(path, eos_ids=[V])
  with pytest.raises(ValueError, match="jspec_config.json: eos_ids"):
    jspec.load(path)


def test_truncated_params(saved, tmp_path):
  path = copy_checkpoint(saved[1], tmp_path / "c")
  files = [os.path.join(d, f) for d, _, fs in os.walk(path / "params") for f in fs]
  data = max(files, key=os.path.getsize)  # the tensor data
  with open(data, "r+b") as f:
    f.truncate(os.path.getsize(data) // 2)
  # In a subprocess: after the error, orbax's background thread still finishes the other
  # reads and reports them as unraisable exceptions in whichever test runs next.
  code = ("import sys, jspec\ntry:\n  jspec.load(sys.argv[1])\nexcept ValueError as e:\n"
          "  print(e)\n  sys.exit(3)\n")
  proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 3, proc.stderr[-2000:]
  assert proc.stdout.startswith(f"cannot read params from {path / 'params'} (truncated"), (
      proc.stdout)


def test_corrupt_params_metadata(saved, tmp_path):
  path = copy_checkpoint(saved[1], tmp_path / "c")
  meta = path / "params" / "_METADATA"
  meta.write_text(meta.read_text()[:100])
  with pytest.raises(ValueError, match=f"cannot read params metadata in {path / 'params'}"):
    jspec.load(path)


def test_hub_id_without_huggingface_hub(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
  with pytest.raises(FileNotFoundError, match=r"org/name.*pip install 'jspec\[hub\]'"):
    jspec.load("org/name")


# ----------------------------------------------------------------------------- Hugging Face

def test_cli_export_hf_then_convert(saved, tmp_path, capsys):
  model, native = saved
  assert cli.main(["export-hf", str(native), str(tmp_path / "hf")]) == 0
  files = set(os.listdir(tmp_path / "hf"))
  assert {"config.json", "tokenizer.json", "generation_config.json"} <= files
  assert any(f.endswith(".safetensors") for f in files)
  gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
  assert gen["eos_token_id"] == [5, 7]

  from_hf = jspec.load(tmp_path / "hf")  # an HF directory: tokenizer and EOS attached
  assert from_hf.eos_ids == (5, 7)
  assert from_hf.tokenizer.encode("a dog") == model.tokenizer.encode("a dog")
  np.testing.assert_array_equal(np.asarray(from_hf.logits(TOKENS)),
                                np.asarray(model.logits(TOKENS)))

  assert cli.main(["convert", str(tmp_path / "hf"), str(tmp_path / "back")]) == 0
  back = jspec.load(tmp_path / "back")
  assert_same_params(model, back)
  assert back.eos_ids == (5, 7) and back.tokenizer is not None
  assert cli.main(["convert", str(tmp_path / "hf"), str(tmp_path / "bf16"),
                   "--dtype", "bfloat16"]) == 0
  assert jspec.load(tmp_path / "bf16").dtype == jnp.bfloat16
  assert "bfloat16" in capsys.readouterr().out


def test_hub_id_downloads_and_loads(saved, tmp_path, monkeypatch):
  """A Hub id goes through snapshot_download (faked: no network in tests)."""
  import types
  model, native = saved
  checkpoint.save_hf(jspec.load(native), tmp_path / "snapshot")
  calls = []

  def snapshot_download(repo_id, allow_patterns):
    calls.append((repo_id, allow_patterns))
    return str(tmp_path / "snapshot")

  monkeypatch.chdir(tmp_path)
  monkeypatch.setitem(sys.modules, "huggingface_hub",
                      types.SimpleNamespace(snapshot_download=snapshot_download))
  loaded = jspec.load("org/tiny-model")
  assert calls[0][0] == "org/tiny-model"
  assert "*.safetensors" in calls[0][1] and "tokenizer.json" in calls[0][1]
  assert loaded.eos_ids == (5, 7) and loaded.tokenizer is not None
  assert_same_params(model, loaded)


def test_load_from_a_relative_path(tmp_path, monkeypatch):
  model = tiny_model()
  jspec.save(model, tmp_path / "ckpt")
  monkeypatch.chdir(tmp_path)
  assert_same_params(jspec.load("ckpt"), model)
  assert_same_params(jspec.load(os.path.join(".", "ckpt")), model)
