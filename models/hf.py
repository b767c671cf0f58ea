"""Hugging Face checkpoints: import into the reference decoder, and export back.

`load_hf(path)` reads `config.json` and the safetensors weights (one file, or
shards listed in `model.safetensors.index.json`) of a local directory. Tensors
are read one at a time and written into preallocated stacked arrays, so loading
never holds a second full copy of the weights.

Families: llama (with Llama 3 RoPE scaling), mistral, qwen2, qwen3, gemma, gemma2,
gpt2. Each is a config translator plus a table of tensor rules; a rule maps one
or more Hugging Face tensors to one or more jspec params and back.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import quant
from jspec.core.nn import (DenseMLP, GatedMLP, LayerNorm, Learned, LinearScaling,
                                 Llama3Scaling, RMSNorm, Rotary)
from jspec.models.transformer import (FULL, SLIDING, TransformerConfig, init_params,
                                      logical_axes, make_model)

ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_tanh", "gelu": "gelu"}


class CheckpointError(ValueError):
  """A checkpoint that cannot be loaded as it is: the message names the file or tensor."""


# ----------------------------------------------------------------------------- configs


def _activation(name):
  if name not in ACTIVATIONS:
    raise CheckpointError(f"unsupported activation {name!r}; supported: {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def _rotary(cfg: dict) -> tuple[float, Rotary]:
  params = cfg.get("rope_parameters") or {}
  theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
  spec = cfg.get("rope_scaling") or params
  kind = (spec or {}).get("rope_type", (spec or {}).get("type", "default"))
  if kind in (None, "default"):
    return theta, Rotary()
  if kind == "llama3":
    return theta, Rotary(Llama3Scaling(
        float(spec["factor"]), float(spec["low_freq_factor"]), float(spec["high_freq_factor"]),
        int(spec["original_max_position_embeddings"])))
  if kind == "linear":
    return theta, Rotary(LinearScaling(float(spec["factor"])))
  raise CheckpointError(f"unsupported rope type {kind!r}; supported: default, llama3, linear")


def rope_settings(cfg: dict):
  """(rope theta, frequency scaling or None) of a Hugging Face-style config dict (v4
  `rope_theta` / `rope_scaling` or v5 `rope_parameters`); unsupported kinds raise."""
  theta, rotary = _rotary(cfg)
  return theta, rotary.scaling


def _llama_like(cfg: dict, tie_default: bool) -> dict:
  theta, rotary = _rotary(cfg)
  return dict(
      vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
      intermediate_size=cfg["intermediate_size"], num_hidden_layers=cfg["num_hidden_layers"],
      num_attention_heads=cfg["num_attention_heads"],
      num_key_value_heads=cfg.get("num_key_value_heads"), head_dim=cfg.get("head_dim"),
      rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), rope_theta=theta,
      max_position_embeddings=cfg.get("max_position_embeddings", 2048),
      tie_word_embeddings=cfg.get("tie_word_embeddings", tie_default), positions=rotary,
      mlp=GatedMLP(_activation(cfg.get("hidden_activation") or cfg.get("hidden_act", "silu"))))


def _windows(cfg: dict, enabled: bool) -> dict:
  """Sliding-window layers, from `layer_types` when given."""
  window = cfg.get("sliding_window")
  if not enabled or not window:
    return {}
  return dict(sliding_window=int(window), layer_types=cfg.get("layer_types"))


def _llama(cfg):
  bias = bool(cfg.get("attention_bias", False))
  return TransformerConfig(**_llama_like(cfg, False), qkv_bias=bias, o_bias=bias,
                           mlp_bias=bool(cfg.get("mlp_bias", False)))


def _mistral(cfg):
  return TransformerConfig(**_llama_like(cfg, False), **_windows(cfg, True))


def _qwen2(cfg):
  return TransformerConfig(**_llama_like(cfg, False), qkv_bias=True,
                           **_windows(cfg, cfg.get("use_sliding_window", False)))


def _qwen3(cfg):
  bias = bool(cfg.get("attention_bias", False))
  return TransformerConfig(**_llama_like(cfg, False), qk_norm=True, qkv_bias=bias, o_bias=bias,
                           **_windows(cfg, cfg.get("use_sliding_window", False)))


def _gemma(cfg):
  return TransformerConfig(**_llama_like(cfg, True), norm=RMSNorm(offset=1.0),
                           embedding_multiplier=math.sqrt(cfg["hidden_size"]))


def _gemma2(cfg):
  n = cfg["num_hidden_layers"]
  types = cfg.get("layer_types") or [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
  return TransformerConfig(
      **_llama_like(cfg, True), norm=RMSNorm(offset=1.0), post_norms=True,
      embedding_multiplier=math.sqrt(cfg["hidden_size"]),
      query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"),
      attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
      final_logit_softcapping=cfg.get("final_logit_softcapping"),
      sliding_window=cfg.get("sliding_window"), layer_types=types)


def _gpt2(cfg):
  if cfg.get("scale_attn_by_inverse_layer_idx") or not cfg.get("scale_attn_weights", True):
    raise CheckpointError("gpt2 variants with scale_attn_by_inverse_layer_idx or without "
                          "scale_attn_weights are not supported")
  D = cfg["n_embd"]
  return TransformerConfig(
      vocab_size=cfg["vocab_size"], hidden_size=D, intermediate_size=cfg.get("n_inner") or 4 * D,
      num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"],
      rms_norm_eps=cfg.get("layer_norm_epsilon", 1e-5),
      max_position_embeddings=cfg.get("n_positions", 1024), tie_word_embeddings=True,
      norm=LayerNorm(), positions=Learned(),
      mlp=DenseMLP(_activation(cfg.get("activation_function", "gelu_new"))),
      qkv_bias=True, o_bias=True, mlp_bias=True)


# ----------------------------------------------------------------------------- tensor rules


@dataclasses.dataclass(frozen=True)
class Rule:
  """Hugging Face tensors `theirs` <-> jspec params `ours` (paths like "layers/wq").

  `load(config, *theirs) -> tuple(ours)` and `save(config, *ours) -> tuple(theirs)`
  work on NumPy arrays and on shapes (through `jax.eval_shape`).
  """

  theirs: tuple[str, ...]
  ours: tuple[str, ...]
  load: Callable = lambda c, *x: x
  save: Callable = lambda c, *x: x
  optional: bool = False  # skipped when the config has no such param


def _t(c, x):
  return (x.T,)


def _heads_in(n_heads):  # torch Linear [H*Dh, D] -> [D, H, Dh]
  return lambda c, w: (w.T.reshape(w.shape[1], n_heads(c), c.head_dim),)


def _heads_out(c, w):  # [D, H, Dh] -> [H*Dh, D]
  return (w.reshape(w.shape[0], -1).T,)


def _bias_in(n_heads):
  return lambda c, b: (b.reshape(n_heads(c), c.head_dim),)


def _flat(c, b):
  return (b.reshape(-1),)


# Head counts of a config, for the head-splitting tensor rules below.
H = lambda c: c.num_attention_heads
HKV = lambda c: c.num_key_value_heads


def _llama_rules(post_norms: bool) -> tuple[list[Rule], list[Rule]]:
  top = [Rule(("model.embed_tokens.weight",), ("embed",)),
         Rule(("model.norm.weight",), ("final_norm/scale",)),
         Rule(("lm_head.weight",), ("lm_head",), _t, _t, optional=True)]
  a, m = "self_attn.", "mlp."
  layer = [
      Rule((a + "q_proj.weight",), ("layers/wq",), _heads_in(H), _heads_out),
      Rule((a + "k_proj.weight",), ("layers/wk",), _heads_in(HKV), _heads_out),
      Rule((a + "v_proj.weight",), ("layers/wv",), _heads_in(HKV), _heads_out),
      Rule((a + "o_proj.weight",), ("layers/wo",),
           lambda c, w: (w.T.reshape(H(c), c.head_dim, w.shape[0]),),
           lambda c, w: (w.reshape(-1, w.shape[-1]).T,)),
      Rule((a + "q_proj.bias",), ("layers/bq",), _bias_in(H), _flat, optional=True),
      Rule((a + "k_proj.bias",), ("layers/bk",), _bias_in(HKV), _flat, optional=True),
      Rule((a + "v_proj.bias",), ("layers/bv",), _bias_in(HKV), _flat, optional=True),
      Rule((a + "o_proj.bias",), ("layers/bo",), optional=True),
      Rule((a + "q_norm.weight",), ("layers/q_norm/scale",), optional=True),
      Rule((a + "k_norm.weight",), ("layers/k_norm/scale",), optional=True),
      Rule((m + "gate_proj.weight",), ("layers/w_gate",), _t, _t),
      Rule((m + "up_proj.weight",), ("layers/w_up",), _t, _t),
      Rule((m + "down_proj.weight",), ("layers/w_down",), _t, _t),
      Rule((m + "gate_proj.bias",), ("layers/b_gate",), optional=True),
      Rule((m + "up_proj.bias",), ("layers/b_up",), optional=True),
      Rule((m + "down_proj.bias",), ("layers/b_down",), optional=True),
      Rule(("input_layernorm.weight",), ("layers/attn_norm/scale",)),
  ]
  if post_norms:  # Gemma 2's names: its post_attention_layernorm follows attention
    layer += [Rule(("post_attention_layernorm.weight",), ("layers/post_attn_norm/scale",)),
              Rule(("pre_feedforward_layernorm.weight",), ("layers/mlp_norm/scale",)),
              Rule(("post_feedforward_layernorm.weight",), ("layers/post_mlp_norm/scale",))]
  else:
    layer += [Rule(("post_attention_layernorm.weight",), ("layers/mlp_norm/scale",))]
  return top, layer


def _split3(c, w):  # GPT-2 fused c_attn: [..., 3D] -> q, k, v
  q, k, v = np.split(w, 3, axis=-1) if isinstance(w, np.ndarray) else jnp.split(w, 3, axis=-1)
  shape = q.shape[:-1] + (H(c), c.head_dim)
  return q.reshape(shape), k.reshape(shape), v.reshape(shape)


def _join3(c, q, k, v):
  cat = np.concatenate if isinstance(q, np.ndarray) else jnp.concatenate
  return (cat([x.reshape(x.shape[:-2] + (-1,)) for x in (q, k, v)], axis=-1),)


def _gpt2_rules() -> tuple[list[Rule], list[Rule]]:
  top = [Rule(("wte.weight",), ("embed",)), Rule(("wpe.weight",), ("pos_embed",)),
         Rule(("ln_f.weight",), ("final_norm/scale",)), Rule(("ln_f.bias",), ("final_norm/bias",))]
  qkv = ("layers/wq", "layers/wk", "layers/wv")
  layer = [
      Rule(("ln_1.weight",), ("layers/attn_norm/scale",)),
      Rule(("ln_1.bias",), ("layers/attn_norm/bias",)),
      Rule(("attn.c_attn.weight",), qkv, _split3, _join3),
      Rule(("attn.c_attn.bias",), ("layers/bq", "layers/bk", "layers/bv"), _split3, _join3),
      Rule(("attn.c_proj.weight",), ("layers/wo",),
           lambda c, w: (w.reshape(H(c), c.head_dim, w.shape[-1]),),
           lambda c, w: (w.reshape(-1, w.shape[-1]),)),
      Rule(("attn.c_proj.bias",), ("layers/bo",)),
      Rule(("ln_2.weight",), ("layers/mlp_norm/scale",)),
      Rule(("ln_2.bias",), ("layers/mlp_norm/bias",)),
      Rule(("mlp.c_fc.weight",), ("layers/w_up",)),
      Rule(("mlp.c_fc.bias",), ("layers/b_up",)),
      Rule(("mlp.c_proj.weight",), ("layers/w_down",)),
      Rule(("mlp.c_proj.bias",), ("layers/b_down",)),
  ]
  return top, layer


@dataclasses.dataclass(frozen=True)
class Family:
  """One Hugging Face `model_type`: its config translator and tensor rules.

  `config(hf_config_dict) -> TransformerConfig`; `rules() -> (top-level rules,
  per-layer rules)`; tensor names are `top_prefix + name` and
  `layer_prefix.format(i) + name`; `ignored` names are skipped on load.
  """

  config: Callable[[dict], TransformerConfig]
  rules: Callable[[], tuple[list[Rule], list[Rule]]]
  layer_prefix: str
  top_prefix: str = ""
  ignored: tuple[str, ...] = ("rotary_emb.inv_freq",)


_LLAMA = lambda: _llama_rules(False)
FAMILIES = {
    "llama": Family(_llama, _LLAMA, "model.layers.{}."),
    "mistral": Family(_mistral, _LLAMA, "model.layers.{}."),
    "qwen2": Family(_qwen2, _LLAMA, "model.layers.{}."),
    "qwen3": Family(_qwen3, _LLAMA, "model.layers.{}."),
    "gemma": Family(_gemma, _LLAMA, "model.layers.{}."),
    "gemma2": Family(_gemma2, lambda: _llama_rules(True), "model.layers.{}."),
    "gpt2": Family(_gpt2, _gpt2_rules, "transformer.h.{}.", "transformer.",
                   ignored=("attn.bias", "attn.masked_bias")),
}


def family_of(cfg: dict) -> Family:
  """The `Family` of a parsed config.json, by its `model_type`; CheckpointError if unsupported."""
  kind = cfg.get("model_type")
  if kind not in FAMILIES:
    raise CheckpointError(f"unsupported model_type {kind!r}; supported: {', '.join(FAMILIES)}")
  return FAMILIES[kind]


# ----------------------------------------------------------------------------- loading


def read_config(path: str) -> dict:
  """The parsed config.json of a Hugging Face model directory."""
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise FileNotFoundError(f"{file} not found: not a Hugging Face model directory")
  try:
    with open(file) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{file} is not valid JSON: {e}") from None


def _weight_files(path: str) -> dict[str, str]:
  """Tensor name -> file holding it."""
  index = os.path.join(path, "model.safetensors.index.json")
  single = os.path.join(path, "model.safetensors")
  if os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    return {name: os.path.join(path, file) for name, file in weight_map.items()}
  if os.path.isfile(single):
    return {name: single for name in SafetensorsFile(single).tensors}
  raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")


_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": jnp.bfloat16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}


class SafetensorsFile:
  """Reads tensors of a .safetensors file one at a time with plain file reads.

  Why not the `safetensors` library's reader: it memory-maps the file (every page
  read stays resident while the file is open) and hands out framework arrays
  (NumPy cannot hold bf16 there), which measured ~2.5x the checkpoint's size at
  peak when loading; a positioned read into one NumPy buffer per tensor keeps the
  loader near 1x. The format is a little-endian u64 header length, a JSON header
  {name: {dtype, shape, data_offsets}}, then the data.
  """

  def __init__(self, file: str):
    if not os.path.isfile(file):
      raise FileNotFoundError(f"weights file {file} is missing")
    self.file = file
    size = os.path.getsize(file)
    try:
      with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if size < 8 or n > size - 8:
          raise ValueError("header runs past the end of the file")
        header = json.loads(f.read(n))
    except (ValueError, UnicodeDecodeError) as e:
      raise CheckpointError(f"{file} is not a readable safetensors file (truncated or "
                            f"corrupt?): {e}") from None
    header.pop("__metadata__", None)
    self.data_start = 8 + n
    self.tensors = header
    for name, info in header.items():
      begin, end = info["data_offsets"]
      if self.data_start + end > size:
        raise CheckpointError(f"{file} is truncated: tensor {name} ends at byte "
                              f"{self.data_start + end}, the file has {size}")

  def read(self, name: str) -> np.ndarray:
    """Tensor `name` as a NumPy array of its stored dtype and shape (bf16 as ml_dtypes)."""
    info = self.tensors[name]
    if info["dtype"] not in _DTYPES:
      raise CheckpointError(f"{self.file}: tensor {name} has unsupported dtype {info['dtype']}")
    dtype = np.dtype(_DTYPES[info["dtype"]])
    begin, end = info["data_offsets"]
    count = (end - begin) // dtype.itemsize
    array = np.fromfile(self.file, dtype=dtype, count=count, offset=self.data_start + begin)
    if array.size != count or int(np.prod(info["shape"])) != count:
      raise CheckpointError(f"{self.file}: tensor {name} is truncated or has a bad size")
    return array.reshape(info["shape"])


def load_hf(path: str, dtype=None, layout=None):
  """Load a local Hugging Face model directory as a `jspec.Model` (weights only).

  dtype: the params' dtype (e.g. jnp.bfloat16 on TPU/GPU, jnp.float32 on CPU);
  None keeps the checkpoint's own.
  layout: optional `jspec.core.sharding.Layout`; each param is placed with its
  sharding as soon as it has been read, before the next one is read.
  """
  cfg = read_config(path)
  family = family_of(cfg)
  files = _weight_files(path)
  readers: dict[str, SafetensorsFile] = {}

  def read(name):
    file = files[name]
    if file not in readers:
      readers[file] = SafetensorsFile(file)
    if name not in readers[file].tensors:
      raise CheckpointError(f"{file}: tensor {name} listed in the index is not in the file")
    return readers[file].read(name)

  source = TensorSource(names=frozenset(files), read=read, where=files.get, origin=path)
  return load_tensors(cfg, family, source, dtype=dtype, layout=layout)


@dataclasses.dataclass(frozen=True)
class TensorSource:
  """Named tensors in Hugging Face naming, read one at a time.

  `read(name)` returns a NumPy array in the torch layout (Linear weights
  [out, in]), or for a tensor `quantized(name)` says is stored quantized, a
  `jspec.core.quant.QuantWeight` of NumPy arrays in that layout (q [out, in], scale and
  offset [out, in / group]); `where(name)` names the file it lives in, for error
  messages; `origin` names the checkpoint. A safetensors directory and a GGUF file
  (`jspec.models.gguf`) are both read through this.
  """

  names: frozenset
  read: Callable[[str], np.ndarray]
  where: Callable[[str], str]
  origin: str
  quantized: Callable[[str], bool] = lambda name: False


def load_tensors(cfg: dict, family: Family, source: TensorSource, *, dtype=None, layout=None,
                 config: TransformerConfig | None = None):
  """A `jspec.Model` from Hugging Face-named tensors and a parsed config.json dict.

  Tensors are read one at a time. Without a layout each layer's slice is written
  in place into a preallocated device stack; with one, stacks are filled on the
  host and placed shard by shard as soon as they are complete. Either way host
  memory holds little beyond the params already placed. A param whose tensors the
  source holds quantized is stacked on the host in that form (`_quantized_rule`) and
  placed as a `jspec.core.quant.QuantWeight` (its layers brought to one form first).
  """
  config = family.config(cfg) if config is None else config
  files = source.names
  path = source.origin
  shapes = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))  # our layout
  flat_shapes = _flatten(shapes)
  top_rules, layer_rules = family.rules()
  prefix = family.top_prefix if any(n.startswith(family.top_prefix) for n in files) else ""
  layer_prefix = family.layer_prefix if prefix else family.layer_prefix[len(family.top_prefix):]

  def tensor(name):
    if name not in files:
      raise CheckpointError(f"tensor {name} is missing from the checkpoint in {path}")
    return source.read(name)

  out: dict[str, np.ndarray] = {}
  pending: dict[str, list] = {}  # quantized param -> its layers' values, stacked at placing
  used: set[str] = set()
  expected_shapes: dict[Rule, list] = {}
  L = config.num_hidden_layers

  def apply_rule(rule, names, layer):
    if any(p not in flat_shapes for p in rule.ours):
      if rule.optional:
        return
      raise CheckpointError(f"params {rule.ours} not in the {cfg.get('model_type')} layout")
    arrays = [tensor(n) for n in names]
    if rule not in expected_shapes:
      expected_shapes[rule] = _their_shapes(rule, config, flat_shapes, layer is not None)
    for n, arr, expected in zip(names, arrays, expected_shapes[rule]):
      if tuple(arr.shape) != expected:
        raise CheckpointError(f"{source.where(n)}: tensor {n} has shape {tuple(arr.shape)}, "
                              f"expected {expected} for this config")
    used.update(names)
    if any(isinstance(a, quant.QuantWeight) for a in arrays):
      values = _quantized_rule(rule, config, arrays)
    else:
      values = rule.load(config, *arrays)
    for p, value in zip(rule.ours, values):
      if isinstance(value, quant.QuantWeight) or p in quantized:
        float_dtype = np.dtype(dtype) if dtype is not None else np.dtype(np.float32)
        if isinstance(value, quant.QuantWeight):
          value = quant.QuantWeight(
              q=value.q, scale=value.scale.astype(float_dtype),
              offset=None if value.offset is None else value.offset.astype(float_dtype))
        else:
          value = np.asarray(value).astype(float_dtype, copy=False)
        if layer is None:
          out[p] = value
        else:
          pending.setdefault(p, [None] * L)[layer] = value
        continue
      value = np.asarray(value)
      target_dtype = np.dtype(dtype) if dtype is not None else value.dtype
      if layer is None:
        out[p] = value.astype(target_dtype, copy=False)
      elif layout is None:  # straight into a device buffer, one layer at a time
        if p not in out:
          out[p] = jnp.zeros(flat_shapes[p].shape, target_dtype)
        out[p] = _set_layer(out[p], value, layer)
      else:
        if p not in out:
          out[p] = np.empty(flat_shapes[p].shape, target_dtype)
        out[p][layer] = value

  axes = None if layout is None else _flatten(logical_axes(config)[0])
  # Params some layer of which the source holds quantized: stacked as quantized weights.
  quantized = {p for rule in layer_rules for p in rule.ours
               if any(source.quantized(layer_prefix.format(i) + n)
                      for i in range(L) for n in rule.theirs)}

  def place(paths):
    """Move finished params to the device (sharded when a layout is given) right away,
    so host memory holds at most one stacked param at a time."""
    for p in paths:
      if p in pending:
        out[p] = _stack(pending.pop(p))
      if p in out and isinstance(out[p], quant.QuantWeight):
        value = out[p]
        out[p] = (jax.tree_util.tree_map(jnp.asarray, value) if layout is None
                  else jax.device_put(value, layout.tree_shardings(value, axes[p])))
        del value
      elif p in out and isinstance(out[p], np.ndarray):
        value = out[p]
        out[p] = (jnp.asarray(value) if layout is None
                  else jax.device_put(value, layout.sharding(value.shape, axes[p])))
        del value

  for rule in top_rules:
    names = [prefix + n for n in rule.theirs]
    if rule.ours == ("lm_head",):
      names = [n for n in rule.theirs]  # lm_head sits outside the model prefix
      if config.tie_word_embeddings:
        used.update(n for n in names if n in files)
        continue
    apply_rule(rule, names, None)
    place(rule.ours)
  for rule in layer_rules:  # param by param, each layer in turn: one stack in host memory
    for i in range(L):
      names = [layer_prefix.format(i) + n for n in rule.theirs]
      if rule.optional and not all(n in files for n in names):
        if all(p not in flat_shapes for p in rule.ours):
          continue
      apply_rule(rule, names, i)
    place(rule.ours)

  ignored = family.ignored
  extra = [n for n in files if n not in used and not any(n.endswith(s) for s in ignored)]
  if extra:
    raise CheckpointError(f"tensors in {path} that its config does not account for "
                          f"(config and weights disagree?): {sorted(extra)[:8]}")
  missing = [p for p in flat_shapes if p not in out]
  if missing:
    raise CheckpointError(f"the checkpoint in {path} has no tensors for params {missing}")
  return make_model(config, _unflatten(out))


def _quantized_rule(rule: Rule, config, arrays):
  """`rule.load` for quantized tensors ([out, in], scales [out, in / group]): the rule
  (transposes and reshapes) moves q, and the scales and offsets repeated to the full shape,
  the same way; the scales are then taken back to one per group along the param's last
  contracted axis (`jspec.models.transformer`'s table), where each group now lies. A param
  whose groups no longer lie along that axis (a group wider than a head), or a rule with
  float inputs too, gets the dequantized float weights."""
  from jspec.models.transformer import contracted_axes

  if not all(isinstance(a, quant.QuantWeight) for a in arrays):
    return rule.load(config, *[quant.dequantize(a) for a in arrays])
  groups = [a.q.shape[1] // a.scale.shape[1] for a in arrays]
  full = lambda x, g: None if x is None else np.repeat(x, g, axis=1)
  qs = rule.load(config, *[a.q for a in arrays])
  scales = rule.load(config, *[full(a.scale, g) for a, g in zip(arrays, groups)])
  offsets = ([None] * len(qs) if all(a.offset is None for a in arrays) else
             rule.load(config, *[full(np.zeros_like(a.scale) if a.offset is None else a.offset,
                                      g) for a, g in zip(arrays, groups)]))
  out = []
  for p, q, s, o in zip(rule.ours, qs, scales, offsets):
    axes = contracted_axes(p)
    axis = None if axes is None else max(axes)
    g = min(groups)
    value = quant.QuantWeight(q=np.asarray(q), scale=np.asarray(s),
                              offset=None if o is None else np.asarray(o))
    if axis is None or q.shape[axis] % g:
      out.append(quant.dequantize(value))
      continue
    cut = lambda x: x.reshape(x.shape[:axis] + (x.shape[axis] // g, g) + x.shape[axis + 1:])
    s_g, o_g = cut(value.scale), None if o is None else cut(value.offset)
    if not (np.all(s_g == s_g.take([0], axis=axis + 1))
            and (o_g is None or np.all(o_g == o_g.take([0], axis=axis + 1)))):
      out.append(quant.dequantize(value))
      continue
    out.append(quant.QuantWeight(q=value.q, scale=s_g.take(0, axis=axis + 1),
                                 offset=None if o_g is None else o_g.take(0, axis=axis + 1)))
  return tuple(out)


def _stack(layers: list):
  """A param's layers as one stack [L, ...]: quantized ones in one form
  (`jspec.core.quant.common_form`), on the host."""
  layers = quant.common_form(layers)
  if not isinstance(layers[0], quant.QuantWeight):
    return np.stack(layers)
  return quant.QuantWeight(q=np.stack([w.q for w in layers]),
                           scale=np.stack([w.scale for w in layers]),
                           offset=None if layers[0].offset is None else
                           np.stack([w.offset for w in layers]))


@functools.partial(jax.jit, donate_argnums=0)
def _set_layer(stack, value, layer):
  """stack[layer] = value, in place (the stack is donated): a stacked param is filled on the
  device layer by layer, so host memory never holds a whole stack next to its device copy."""
  return jax.lax.dynamic_update_index_in_dim(stack, value.astype(stack.dtype), layer, 0)


def _their_shapes(rule, config, flat_shapes, per_layer):
  ours = [flat_shapes[p] for p in rule.ours]
  if per_layer:
    ours = [jax.ShapeDtypeStruct(s.shape[1:], s.dtype) for s in ours]
  theirs = jax.eval_shape(lambda *x: rule.save(config, *x), *ours)
  return [tuple(t.shape) for t in theirs]


def _flatten(tree, prefix=""):
  flat = {}
  for key, value in tree.items():
    path = f"{prefix}{key}"
    if isinstance(value, dict):
      flat.update(_flatten(value, path + "/"))
    else:
      flat[path] = value
  return flat


def _unflatten(flat):
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


# ----------------------------------------------------------------------------- export


def model_type_of(config: TransformerConfig) -> str:
  """The Hugging Face family a config corresponds to."""
  if isinstance(config.positions, Learned):
    return "gpt2"
  if config.post_norms:
    return "gemma2"
  if isinstance(config.norm, RMSNorm) and config.norm.offset == 1.0:
    return "gemma"
  if config.qk_norm:
    return "qwen3"
  if config.qkv_bias and not config.o_bias:
    return "qwen2"
  if config.sliding_window:
    return "mistral"
  return "llama"


def hf_config(config: TransformerConfig) -> dict:
  """The Hugging Face config.json fields (a dict) of a `TransformerConfig`."""
  c = config
  kind = model_type_of(c)
  act = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}[c.mlp.activation]
  if kind == "gpt2":
    return dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=c.vocab_size,
                n_embd=c.hidden_size, n_inner=c.intermediate_size, n_layer=c.num_hidden_layers,
                n_head=c.num_attention_heads, n_positions=c.max_position_embeddings,
                layer_norm_epsilon=c.rms_norm_eps, tie_word_embeddings=True,
                activation_function="gelu_new" if act == "gelu_pytorch_tanh" else act)
  rope = {"rope_type": "default", "rope_theta": c.rope_theta}
  scaling = c.positions.scaling
  if isinstance(scaling, Llama3Scaling):
    rope.update(rope_type="llama3", factor=scaling.factor, low_freq_factor=scaling.low_freq_factor,
                high_freq_factor=scaling.high_freq_factor,
                original_max_position_embeddings=scaling.original_max_position_embeddings)
  elif isinstance(scaling, LinearScaling):
    rope.update(rope_type="linear", factor=scaling.factor)
  arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
          "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
          "gemma2": "Gemma2ForCausalLM"}[kind]
  out = dict(model_type=kind, architectures=[arch], vocab_size=c.vocab_size,
             hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
             num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
             num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
             rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
             tie_word_embeddings=c.tie_word_embeddings, hidden_act=act,
             rope_theta=c.rope_theta, rope_parameters=rope,
             rope_scaling=None if rope["rope_type"] == "default" else rope)
  if kind == "llama":
    out.update(attention_bias=c.qkv_bias, mlp_bias=c.mlp_bias)
  if kind == "qwen3":
    out.update(attention_bias=c.qkv_bias)
  if kind in ("mistral", "qwen2", "qwen3", "gemma2"):
    out.update(sliding_window=c.sliding_window)
  if kind in ("qwen2", "qwen3"):
    out.update(use_sliding_window=bool(c.sliding_window))
  if c.layer_types is not None:
    out.update(layer_types=list(c.layer_types))
  if kind == "gemma2":
    out.update(hidden_activation=act, query_pre_attn_scalar=c.query_pre_attn_scalar,
               attn_logit_softcapping=c.attn_logit_softcapping,
               final_logit_softcapping=c.final_logit_softcapping)
  return out


def export_hf(model, out_dir: str) -> None:
  """Write `config.json` and `model.safetensors` that `transformers` loads as is."""
  from safetensors.flax import save_file

  config = model.config
  kind = model_type_of(config)
  family = FAMILIES[kind]
  top_rules, layer_rules = family.rules()
  flat = _flatten(model.params)
  tensors = {}
  for rule in top_rules:
    if not all(p in flat for p in rule.ours):
      continue
    names = list(rule.theirs) if rule.ours == ("lm_head",) else [
        family.top_prefix + n for n in rule.theirs]
    for n, v in zip(names, rule.save(config, *[np.asarray(flat[p]) for p in rule.ours])):
      tensors[n] = jnp.asarray(np.ascontiguousarray(v))
  for i in range(config.num_hidden_layers):
    for rule in layer_rules:
      if not all(p in flat for p in rule.ours):
        continue
      values = rule.save(config, *[np.asarray(flat[p][i]) for p in rule.ours])
      for n, v in zip(rule.theirs, values):
        tensors[family.layer_prefix.format(i) + n] = jnp.asarray(np.ascontiguousarray(v))
  os.makedirs(out_dir, exist_ok=True)
  cfg = hf_config(config)
  cfg["dtype"] = str(np.dtype(model.dtype))
  if model.eos_ids:
    cfg["eos_token_id"] = list(model.eos_ids) if len(model.eos_ids) > 1 else model.eos_ids[0]
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
