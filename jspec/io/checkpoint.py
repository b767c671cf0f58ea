"""Checkpoints on disk: jspec's native format, Hugging Face directories, GGUF files, the Hub.

`load` takes any of four things and returns a `jspec.Model`:

  * a native jspec directory (written by `save`):
        jspec_config.json   config class and fields, EOS ids
        params/             the params pytree, written by orbax
        tokenizer.json      when the model carries a tokenizer
  * a Hugging Face directory (config.json + safetensors), read by
    `jspec.models.hf.load_hf`, with its tokenizer.json and EOS ids attached;
  * a GGUF file (llama.cpp's format, quantised or not), read by
    `jspec.models.gguf.load_gguf`: architecture, weights (dequantised to f32),
    tokenizer, chat template and stop ids all come from the one file;
  * a Hub repo id ("org/name"), downloaded with `huggingface_hub` when it is
    installed (`pip install 'jspec[hub]'`), then read as above.

Native checkpoints go through orbax so that params restore straight into
device arrays of the requested dtype (and, later, shardings) without a host
copy of the whole model. Everything is checked before the params are read:
a stored tensor whose shape differs from what the config builds is named, so
a wrong config fails at load, not as a shape error deep inside a jitted call.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from jspec.core import quant, sharding
from jspec.drafters.params_io import check_stored, read_format_file, stored_tensors
from jspec.core.model import Model
from jspec.io.tokenizer import load_tokenizer, read_eos_ids

CONFIG_FILE = "jspec_config.json"
PARAMS_DIR = "params"
FORMAT = "jspec"
FORMAT_VERSION = 1
HUB_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "*.safetensors", "*.safetensors.index.json",
)
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


# ----------------------------------------------------------------------------- save


def save(model: Model, path) -> None:
  """Write `model` as a native jspec checkpoint into `path` (new or empty).

  Params keep their dtypes. The config file is written last, so a directory
  without it is an interrupted save, never a checkpoint that loads.
  """
  import orbax.checkpoint as ocp

  if not isinstance(model, Model):
    raise TypeError(f"save takes a jspec.Model, got {type(model).__name__}")
  _refuse_quantized(model)
  if not dataclasses.is_dataclass(model.config):
    raise TypeError(f"model.config must be a dataclass to be saved, got "
                    f"{type(model.config).__name__}")
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
    raise FileExistsError(f"{path} exists and is not an empty directory; save into a new one")
  meta = {
      "format": FORMAT,
      "version": FORMAT_VERSION,
      "config_class": type(model.config).__name__,
      "config": dataclasses.asdict(model.config),
      "eos_ids": [int(i) for i in model.eos_ids],
  }
  text = json.dumps(meta, indent=2)  # fails here, before anything is written
  os.makedirs(path, exist_ok=True)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(path, PARAMS_DIR), model.params)
  if model.tokenizer is not None:
    model.tokenizer.save(path)
  tmp = os.path.join(path, CONFIG_FILE + ".tmp")
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, os.path.join(path, CONFIG_FILE))


def save_hf(model: Model, path) -> None:
  """Write `model` as a Hugging Face directory: config.json and safetensors
  (from `jspec.models.hf.export_hf`), its tokenizer, and a
  generation_config.json with the EOS ids when the model has any."""
  from jspec.models import hf

  _refuse_quantized(model)
  path = os.fspath(path)
  hf.export_hf(model, path)
  if model.tokenizer is not None:
    model.tokenizer.save(path)
  if model.eos_ids:
    gen_path = os.path.join(path, "generation_config.json")
    gen = {}
    if os.path.isfile(gen_path):
      with open(gen_path) as f:
        gen = json.load(f)
    ids = [int(i) for i in model.eos_ids]
    gen["eos_token_id"] = ids[0] if len(ids) == 1 else ids
    with open(gen_path, "w") as f:
      json.dump(gen, f, indent=2)


def _refuse_quantized(model: Model) -> None:
  # A checkpoint holds the float weights; quantizing is a choice made at load (weights=).
  if quant.is_quantized(model.params):
    raise ValueError("checkpoints hold float weights: save the model before quantizing it, "
                     "and load it with weights=\"int8\" (or \"int4\", \"fp8\")")


# ----------------------------------------------------------------------------- load


def load(path, dtype=None, mesh=None, rules=None, weights=None) -> Model:
  """A `jspec.Model` from a native directory, a Hugging Face directory or a Hub id.

  Args:
    path: a directory, a .gguf file, or "org/name" on the Hugging Face Hub (needs
      `huggingface_hub`; files are cached by it).
    dtype: cast floating-point params to this dtype on load (e.g.
      "bfloat16"); None keeps the stored dtypes.
    mesh, rules: optional device mesh and `jspec.core.sharding.Rules` (default
      HYBRID): each param is placed shard by shard as it is read.
    weights: None keeps the float weights; "int8", "int4" or "fp8" stores every matrix,
      the embedding and the LM head quantized with scales in `dtype`
      (`jspec.models.quantize_model`; int8 and fp8 one byte per parameter, int4 half a
      byte plus a scale and an offset per 32, `Model.num_bytes`), the parameter count unchanged: the
      weights are read as floats first, then quantized. "gguf" keeps a GGUF file's own
      quantized blocks as they are stored (Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K;
      `jspec.models.gguf`), and is refused for any other checkpoint. Checked before
      anything is read."""
  weights = quant.check_weights(weights)
  if weights == "gguf":
    local = os.path.expanduser(os.fspath(path))
    if not (os.path.isfile(local) and (local.endswith(".gguf") or _has_gguf_magic(local))):
      raise ValueError(f"weights=\"gguf\" keeps a GGUF file's quantized blocks; "
                       f"{os.fspath(path)!r} is not a GGUF file")
    return _load(path, dtype, mesh, rules, keep=True)
  model = _load(path, dtype, mesh, rules)
  if weights is None:
    return model
  from jspec import models

  model = models.quantize_model(model, weights)
  layout = sharding.as_layout(mesh, rules)
  return model if layout is None else sharding.shard_model(model, layout)


def _load(path, dtype, mesh, rules, keep: bool = False) -> Model:
  dtype = _float_dtype(dtype)
  layout = sharding.as_layout(mesh, rules)
  name = os.fspath(path)
  local = os.path.expanduser(name)
  if os.path.isdir(local):
    local = os.path.abspath(local)  # orbax reads relative paths wrongly
    if os.path.isfile(os.path.join(local, CONFIG_FILE)):
      return _load_native(local, dtype, layout)
    if os.path.isfile(os.path.join(local, "config.json")):
      return _load_hf(local, dtype, layout)
    raise FileNotFoundError(
        f"{local} holds neither a jspec checkpoint ({CONFIG_FILE}) nor a Hugging Face "
        f"checkpoint (config.json)")
  if os.path.isfile(local):
    if local.endswith(".gguf") or _has_gguf_magic(local):
      return _load_gguf(os.path.abspath(local), dtype, layout, keep=keep)
    raise NotADirectoryError(f"{local} is a file but not a GGUF file; other checkpoints are "
                             f"directories")
  if local.endswith(".gguf"):  # before the Hub: "models/x.gguf" also reads as a repo id
    raise FileNotFoundError(f"no GGUF file {os.path.abspath(local)}")
  if REPO_ID.match(name) and ".." not in name:
    try:
      import huggingface_hub
    except ImportError:
      raise FileNotFoundError(
          f"no directory {name!r}; to download it from the Hugging Face Hub, install "
          f"huggingface_hub: pip install 'jspec[hub]'") from None
    local = huggingface_hub.snapshot_download(name, allow_patterns=list(HUB_FILES))
    if not os.path.isfile(os.path.join(local, "config.json")):
      raise FileNotFoundError(f"Hub repo {name!r} has no config.json (downloaded to {local})")
    return _load_hf(local, dtype, layout)
  raise FileNotFoundError(f"no checkpoint directory or GGUF file {name!r}")


def _load_hf(path: str, dtype, layout=None) -> Model:
  from jspec.models import hf

  model = hf.load_hf(path, dtype=dtype, layout=layout)
  eos_ids = read_eos_ids(path) or tuple(model.eos_ids)
  outside = [i for i in eos_ids if not 0 <= i < model.vocab_size]
  if outside:  # e.g. a small test model keeping its family's default EOS id
    warnings.warn(f"{path}: ignoring EOS ids {outside} outside the vocabulary "
                  f"(size {model.vocab_size})")
    eos_ids = tuple(i for i in eos_ids if 0 <= i < model.vocab_size)
  return dataclasses.replace(model, tokenizer=load_tokenizer(path, eos_ids=eos_ids),
                             eos_ids=eos_ids)


def _has_gguf_magic(path: str) -> bool:
  with open(path, "rb") as f:
    return f.read(4) == b"GGUF"


def _load_gguf(path: str, dtype, layout=None, keep: bool = False) -> Model:
  from jspec.io.gguf_tokenizer import tokenizer_from_gguf
  from jspec.models import gguf

  reader = gguf.open_reader(path)
  # The tokenizer first: its metadata errors are cheaper than reading the weights.
  tokenizer = tokenizer_from_gguf(reader)
  model = gguf.load_gguf(path, dtype=dtype, layout=layout, reader=reader, keep=keep)
  if tokenizer.vocab_size > model.vocab_size:
    raise ValueError(f"{path}: the tokenizer knows {tokenizer.vocab_size} ids, the model's "
                     f"vocabulary has {model.vocab_size}")
  return dataclasses.replace(model, tokenizer=tokenizer, eos_ids=tuple(tokenizer.eos_ids))


def _load_native(path: str, dtype, layout=None) -> Model:
  import orbax.checkpoint as ocp

  from jspec import models

  config_path = os.path.join(path, CONFIG_FILE)
  config, eos_ids = _read_config(config_path)
  params_dir = os.path.join(path, PARAMS_DIR)
  stored = stored_tensors(params_dir)
  expected = jax.eval_shape(lambda: models.init_params(config, jax.random.key(0)))
  _check_shapes(expected, stored, params_dir, config_path)

  if layout is None:
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placements = jax.tree_util.tree_map(lambda _: one, expected)
  else:  # orbax reads each array straight into its shards
    axes = models.make_model(config, expected).axes_fn(config)[0]
    placements = layout.tree_shardings(expected, axes)

  def target(key_path, leaf, placement):
    stored_dtype = stored[jax.tree_util.keystr(key_path)][1]
    cast = dtype is not None and jnp.issubdtype(stored_dtype, jnp.floating)
    return jax.ShapeDtypeStruct(leaf.shape, dtype if cast else stored_dtype, sharding=placement)

  abstract = jax.tree_util.tree_map_with_path(target, expected, placements)
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      params = checkpointer.restore(params_dir, abstract)
  except Exception as e:
    raise ValueError(f"cannot read params from {params_dir} (truncated or corrupt "
                     f"files?): {e}") from e
  model = models.make_model(config, params)
  return dataclasses.replace(model, tokenizer=load_tokenizer(path, eos_ids=eos_ids),
                             eos_ids=eos_ids)


def _read_config(config_path: str):
  meta = read_format_file(config_path, FORMAT, FORMAT_VERSION, "a jspec checkpoint config")
  config = zoo_config(meta, config_path, ("eos_ids",))
  eos_ids = meta["eos_ids"]
  if not isinstance(eos_ids, list) or not all(
      isinstance(i, int) and not isinstance(i, bool) and 0 <= i < config.vocab_size
      for i in eos_ids):
    raise ValueError(f"{config_path}: eos_ids must be a list of ids in [0, "
                     f"{config.vocab_size}), got {eos_ids!r}")
  return config, tuple(eos_ids)


def zoo_config(meta: dict, config_path: str, required=()):
  """The model-zoo config a checkpoint config file names (`config_class`, `config`),
  checked: those fields and `required` ones present, a class `jspec.models` exports,
  fields it accepts. Errors name `config_path`."""
  for key in ("config_class", "config", *required):
    if key not in meta:
      raise ValueError(f"{config_path}: missing field {key!r}")
  config_cls = _config_class(meta["config_class"], config_path)
  try:
    return config_cls.from_dict(meta["config"])
  except (TypeError, ValueError) as e:
    raise ValueError(f"{config_path}: invalid {meta['config_class']}: {e}") from e


def _config_class(name: Any, config_path: str) -> type:
  # Only config classes the model zoo exports: a checkpoint file never
  # chooses arbitrary code to import.
  from jspec import models

  known = sorted(n for n in dir(models) if n.endswith("Config")
                 and dataclasses.is_dataclass(getattr(models, n)))
  cls = getattr(models, name, None) if isinstance(name, str) else None
  if name not in known or not hasattr(cls, "from_dict"):
    raise ValueError(f"{config_path}: unknown config class {name!r}; jspec.models has "
                     f"{', '.join(known)}")
  return cls


def _check_shapes(expected, stored: dict, params_dir: str, config_path: str) -> None:
  want = {jax.tree_util.keystr(p): tuple(x.shape)
          for p, x in jax.tree_util.tree_flatten_with_path(expected)[0]}
  check_stored(want, stored, params_dir, "params", f"the config in {config_path}")


def _float_dtype(dtype):
  if dtype is None:
    return None
  try:
    dt = jnp.dtype(dtype)
  except TypeError as e:
    raise ValueError(f"unknown dtype {dtype!r}") from e
  if not jnp.issubdtype(dt, jnp.floating):
    raise ValueError(f"dtype must be a floating-point dtype, got {dt}")
  return dt
