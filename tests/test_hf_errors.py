"""Hugging Face import: sharded files, dtype on load, and clear errors for bad checkpoints."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import require

torch = require("torch")
tf = require("transformers")

from jspec.models import hf  # noqa: E402

V = 32


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  root = tmp_path_factory.mktemp("hf")
  torch.manual_seed(0)
  config = tf.LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1,
                          max_position_embeddings=64)
  model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
  model.save_pretrained(root / "single")
  model.save_pretrained(root / "sharded", max_shard_size="20KB")
  return root, model


def _copy(saved, tmp_path, name="single"):
  root, _ = saved
  shutil.copytree(root / name, tmp_path / "m")
  return tmp_path / "m"


def test_sharded_equals_single(saved):
  root, model = saved
  assert os.path.isfile(root / "sharded" / "model.safetensors.index.json")
  assert len([f for f in os.listdir(root / "sharded") if f.endswith(".safetensors")]) > 1
  a, b = hf.load_hf(str(root / "single")), hf.load_hf(str(root / "sharded"))
  tokens = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
  np.testing.assert_array_equal(a.logits(tokens), b.logits(tokens))
  with torch.no_grad():
    want = model(torch.tensor([[1, 2, 3, 4]])).logits.numpy()
  np.testing.assert_allclose(a.logits(tokens), want, atol=1e-5)


def test_dtype_on_load(saved):
  root, _ = saved
  model = hf.load_hf(str(root / "single"), dtype=jnp.bfloat16)
  assert model.dtype == jnp.bfloat16
  assert model.params["layers"]["wq"].dtype == jnp.bfloat16
  assert model.logits(jnp.asarray([[1, 2]], jnp.int32)).dtype == jnp.float32


def _edit_config(path, **changes):
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(changes)
  (path / "config.json").write_text(json.dumps(cfg))


def _truncate(path):
  data = (path / "model.safetensors").read_bytes()
  (path / "model.safetensors").write_bytes(data[: len(data) // 2])


# One broken file each: how to break a saved checkpoint, and the error that must name it.
BROKEN = {
    "unknown_model_type": (lambda path: _edit_config(path, model_type="mamba"),
                           hf.CheckpointError, "unsupported model_type 'mamba'; supported: llama"),
    "missing_weights_file": (lambda path: os.remove(path / "model.safetensors"),
                             FileNotFoundError, "no model.safetensors"),
    "truncated_file": (_truncate, hf.CheckpointError, "model.safetensors"),
    "missing_config": (lambda path: os.remove(path / "config.json"),
                       FileNotFoundError, "config.json not found"),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_broken_checkpoint(saved, tmp_path, broken):
  breakage, error, message = BROKEN[broken]
  path = _copy(saved, tmp_path)
  breakage(path)
  with pytest.raises(error, match=message):
    hf.load_hf(str(path))


def test_missing_shard(saved, tmp_path):
  path = _copy(saved, tmp_path, "sharded")
  shard = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[-1]
  os.remove(path / shard)
  with pytest.raises(FileNotFoundError, match=f"weights file .*{shard} is missing"):
    hf.load_hf(str(path))


def test_wrong_tensor_shape(saved, tmp_path):
  from safetensors.numpy import load_file, save_file
  path = _copy(saved, tmp_path)
  tensors = load_file(path / "model.safetensors")
  name = "model.layers.1.mlp.up_proj.weight"
  tensors[name] = np.zeros((31, 16), np.float32)
  save_file(tensors, path / "model.safetensors")
  with pytest.raises(hf.CheckpointError, match=rf"tensor {name} has shape \(31, 16\), expected \(32, 16\)"):
    hf.load_hf(str(path))


def test_config_that_does_not_match_weights(saved, tmp_path):
  path = _copy(saved, tmp_path)
  _edit_config(path, num_hidden_layers=1)  # weights hold two layers
  with pytest.raises(hf.CheckpointError, match="model.layers.1"):
    hf.load_hf(str(path))
  _edit_config(path, num_hidden_layers=3)  # weights hold only two
  with pytest.raises(hf.CheckpointError, match="tensor model.layers.2.* is missing"):
    hf.load_hf(str(path))
