"""GGUF checkpoints (llama.cpp's single-file format): read natively into the reference decoder.

`load_gguf("model.gguf")` reads the architecture and hyper-parameters from the
file's metadata, dequantises each tensor with the `gguf` package (F32, F16, BF16,
Q8_0, Q4_0/1, Q5_0/1, the K-quants and the rest it implements) as it is needed,
renames it to Hugging Face naming and hands it to the same tensor rules that read
safetensors directories (`hf.load_tensors`). So a GGUF and the Hugging Face
checkpoint it was converted from give the same params, up to the quantisation.

What llama.cpp's converter changed, undone here:
  * `llama` files store the rows of q and k projections permuted (rotary pairs
    interleaved, `(H, 2, Dh/2)` -> `(H, Dh/2, 2)` per head); the inverse permutation
    restores the Hugging Face order (half-split rotary), which the decoder uses;
  * `gemma2` files store RMSNorm scales as `1 + w`; the decoder's (1 + w) norm
    wants `w`.

The header is parsed by `jspec.models.gguf_file`; each tensor is read with one positioned
read and dequantised to f32 just before it is placed, so host memory holds the
params placed so far and about one tensor more.

`load_gguf(path, keep=True)` (`jspec.load(path, weights="gguf")`) keeps the file's
quantization instead: each matrix of type Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K or Q6_K is held
as its values and block scales (`jspec.core.quant.QuantWeight`: 4-bit values as int4 /
uint4, 5- and 6-bit ones in int8; a scale, and for Q4_1, Q5_1 and the K-quants an offset,
per group of 32 or 16 inputs), so the model computes with exactly the weights the file
describes and holds about the file's bytes; other types are dequantised as above. Layers
of one param stored in different types (a Q4_K_M file's Q4_K and Q6_K layers) are brought
to one form, exactly (`jspec.core.quant.common_form`).
"""

from __future__ import annotations

import os
import re

import numpy as np

from jspec.core import quant
from jspec.models import hf

# llama.cpp architecture name -> Hugging Face model_type of the same decoder.
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                 "gemma2": "gemma2"}

# GGUF tensor names (after "blk.N.") -> Hugging Face names (after "model.layers.N.").
_LAYER = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Gemma 2 has four norms per layer; llama.cpp names them after their places.
_GEMMA2_NORMS = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Tensors llama.cpp writes that carry nothing the decoder needs (computed on the fly).
_IGNORED = ("rope_freqs.weight",)


class GGUFError(hf.CheckpointError):
  """A GGUF file that cannot be loaded: the message names the file and what is wrong."""


def open_reader(path: str):
  """The parsed header of `path` (`jspec.models.gguf_file.GGUFFile`), with a clear error naming
  the file for a missing, foreign, truncated or corrupt one."""
  from jspec.models import gguf_file

  try:
    return gguf_file.read_header(path)
  except gguf_file.GGUFFormatError as e:
    raise GGUFError(str(e)) from None


def field(reader, key: str, default=None):
  """A metadata value: a scalar, a string, or a list for array fields."""
  return reader.get(key, default)


def architecture(reader, path: str) -> str:
  arch = field(reader, "general.architecture")
  if arch not in ARCHITECTURES:
    raise GGUFError(f"{path}: unsupported GGUF architecture {arch!r}; supported: "
                    f"{', '.join(ARCHITECTURES)}")
  return arch


def hf_config(reader, path: str) -> dict:
  """The Hugging Face config.json fields of a GGUF file, from its metadata."""
  arch = architecture(reader, path)
  kind = ARCHITECTURES[arch]
  if kind == "llama" and "mistral" in str(field(reader, "general.name", "")).lower():
    kind = "mistral"

  def need(key):
    value = field(reader, f"{arch}.{key}")
    if value is None:
      raise GGUFError(f"{path}: metadata {arch}.{key} is missing")
    return value

  heads = int(need("attention.head_count"))
  names = set(reader.tensors)
  vocab = field(reader, f"{arch}.vocab_size")
  if vocab is None:  # older files: the vocabulary's length, else the embedding's rows
    tokens = reader.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if tokens is not None else int(reader.tensors["token_embd.weight"].dims[-1])
  hidden = int(need("embedding_length"))
  head_dim = field(reader, f"{arch}.attention.key_length")
  if head_dim is None and kind in ("llama", "mistral"):
    head_dim = field(reader, f"{arch}.rope.dimension_count")
  cfg = dict(
      model_type=kind, vocab_size=int(vocab), hidden_size=hidden,
      intermediate_size=int(need("feed_forward_length")),
      num_hidden_layers=int(need("block_count")), num_attention_heads=heads,
      num_key_value_heads=int(field(reader, f"{arch}.attention.head_count_kv", heads)),
      head_dim=None if head_dim is None else int(head_dim),
      rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
      rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
      max_position_embeddings=int(field(reader, f"{arch}.context_length", 2048)),
      tie_word_embeddings="output.weight" not in names, hidden_act="silu")
  scaling = field(reader, f"{arch}.rope.scaling.type")
  if scaling not in (None, "none"):
    if scaling != "linear":
      raise GGUFError(f"{path}: unsupported rope scaling {scaling!r}; supported: none, linear")
    cfg["rope_scaling"] = {"rope_type": "linear",
                           "factor": float(need("rope.scaling.factor"))}
  if "rope_freqs.weight" in names:
    raise GGUFError(f"{path}: per-frequency RoPE factors (rope_freqs.weight, Llama 3.1-style "
                    f"scaling) are not supported")
  if kind in ("llama", "mistral"):
    cfg["attention_bias"] = "blk.0.attn_q.bias" in names
  if kind == "gemma2":
    window = field(reader, f"{arch}.attention.sliding_window")
    cfg.update(hidden_activation="gelu_pytorch_tanh", sliding_window=window,
               attn_logit_softcapping=field(reader, f"{arch}.attn_logit_softcapping"),
               final_logit_softcapping=field(reader, f"{arch}.final_logit_softcapping"),
               # llama.cpp scales Gemma 2's queries by head_dim ** -0.5 (2B, 9B).
               query_pre_attn_scalar=cfg["head_dim"] or hidden // heads)
  return cfg


def _hf_name(name: str, kind: str) -> str | None:
  if name in _TOP:
    return _TOP[name]
  m = _BLOCK.match(name)
  if m is None:
    return None
  layer, part, what = m.groups()
  table = dict(_LAYER, **_GEMMA2_NORMS) if kind == "gemma2" else _LAYER
  if part not in table:
    return None
  return f"model.layers.{layer}.{table[part]}.{what}"


def _supported_types():
  import gguf

  return {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
          *gguf.quants._type_traits}


def _type_name(kind: int) -> str:
  import gguf

  return gguf.GGMLQuantizationType(kind).name


def tensor_source(reader, path: str, cfg: dict, keep: bool = False) -> hf.TensorSource:
  """The file's tensors under Hugging Face names, dequantised (and un-permuted) on read;
  with `keep`, the matrices of the types `gguf_file.KEPT` lists come as quantized weights
  (`gguf_file.read_blocks`) instead."""
  from jspec.models import gguf_file

  kind = cfg["model_type"]
  supported = _supported_types()
  by_name, unknown = {}, []
  for t in reader.tensors.values():
    name = _hf_name(t.name, kind)
    if name is None:
      if t.name not in _IGNORED:
        unknown.append(t.name)
      continue
    if t.type not in supported:
      raise GGUFError(
          f"{path}: tensor {t.name} has type {_type_name(t.type)}, which cannot be "
          f"dequantised; supported: {', '.join(sorted(q.name for q in supported))}")
    by_name[name] = t
  if unknown:
    raise GGUFError(f"{path}: tensors that a {kind} decoder has no place for: {unknown[:8]}")
  heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]

  def quantized(name: str) -> bool:
    return keep and name in by_name and gguf_file.kept(reader, by_name[name].name)

  def read(name: str):
    t = by_name[name]
    try:
      value = (gguf_file.read_blocks(reader, t.name) if quantized(name)
               else gguf_file.read_tensor(reader, t.name))
    except gguf_file.GGUFFormatError as e:
      raise GGUFError(str(e)) from None
    except Exception as e:
      raise GGUFError(f"{path}: cannot dequantise tensor {t.name} "
                      f"({_type_name(t.type)}): {e}") from None
    if kind in ("llama", "mistral") and (".q_proj." in name or ".k_proj." in name):
      n = heads if ".q_proj." in name else kv_heads
      value = (_unpermute(value, n) if not isinstance(value, quant.QuantWeight) else
               quant.QuantWeight(q=_unpermute(value.q, n), scale=_unpermute(value.scale, n),
                                 offset=None if value.offset is None else
                                 _unpermute(value.offset, n)))
    if kind == "gemma2" and name.endswith("norm.weight"):
      value = value - 1.0
    return value

  where = lambda name: f"{path} ({by_name[name].name})" if name in by_name else path
  return hf.TensorSource(names=frozenset(by_name), read=read, where=where, origin=path,
                         quantized=quantized)


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Undo llama.cpp's q/k row order: per head, rows (Dh/2, 2) back to (2, Dh/2)."""
  rows = w.shape[0]
  return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(path: str, dtype=None, layout=None, reader=None, keep: bool = False):
  """A `jspec.Model` (weights only) from a GGUF file; see the module docstring.

  dtype: the params' dtype (default f32: what the quantised values dequantise to; with
  `keep`, the dtype of the scales and of the weights read as floats);
  layout: optional `jspec.core.sharding.Layout`, as in `hf.load_hf`;
  keep: hold the matrices of the types `gguf_file.KEPT` lists as they are stored, as
  `jspec.core.quant.QuantWeight`s (what `jspec.load(path, weights="gguf")` asks for).
  """
  path = os.fspath(path)
  reader = open_reader(path) if reader is None else reader
  cfg = hf_config(reader, path)
  family = hf.family_of(cfg)
  source = tensor_source(reader, path, cfg, keep=keep)
  return hf.load_tensors(cfg, family, source, dtype=np.float32 if dtype is None else dtype,
                         layout=layout)
