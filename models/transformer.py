"""Reference decoder of the Llama family, written once as pure functions.

RMSNorm, rotary embeddings (configurable theta), grouped-query attention,
SwiGLU MLP, tied or untied embeddings. The config speaks Hugging Face
`LlamaConfig` field names so that real checkpoints map onto it field for field.

Two faces over the same math:
  * `apply(config, params, tokens, cache, start, block_mask, depth)`: the pure
    model contract the decoding engine calls (DESIGN.md), with a static-shape
    KV cache;
  * `Transformer`, a Flax NNX module holding the same params as `nnx.Param`s,
    trainable with optax like any NNX model.

Params are a plain nested dict with every layer stacked on a leading axis L,
so the layer loop is one `lax.scan` (compile time independent of depth):

    embed        [V, D]
    layers/attn_norm [L, D]      layers/mlp_norm [L, D]
    layers/wq    [L, D, H, Dh]   layers/wk, wv   [L, D, Hkv, Dh]
    layers/wo    [L, H, Dh, D]
    layers/w_gate, w_up [L, D, F]                layers/w_down [L, F, D]
    final_norm   [D]
    lm_head      [D, V]          (absent when tie_word_embeddings)

Cache: K as [L, B, Hkv, S, Dh] and V as [L, B, Hkv, Dh, S]. XLA CPU's attention
matmuls consume exactly these layouts; others transpose the whole cache every
step (measured 1.4-1.6x slower at batch 8-32, DESIGN.md).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jspec.model import Model


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Llama-family hyperparameters under Hugging Face `LlamaConfig` names."""

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int | None = None  # None: MHA (= num_attention_heads)
  head_dim: int | None = None  # None: hidden_size // num_attention_heads
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  max_position_embeddings: int = 2048
  tie_word_embeddings: bool = False
  initializer_range: float = 0.02

  def __post_init__(self):
    if self.num_key_value_heads is None:
      object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
    if self.head_dim is None:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"TransformerConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
          f"num_key_value_heads ({self.num_key_value_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

  @classmethod
  def from_dict(cls, fields: dict) -> "TransformerConfig":
    """Build from a (Hugging Face style) dict, ignoring fields it does not use."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in names})


# ----------------------------------------------------------------------------- params


@functools.partial(jax.jit, static_argnums=(0, 2))
def init_params(config: TransformerConfig, key: jax.Array, dtype=jnp.float32) -> dict:
  """Random params: normal(0, initializer_range) weights, unit norms."""
  c = config
  L, D, F, V = c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size
  H, Hkv, Dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  shapes = {
      "wq": (L, D, H, Dh), "wk": (L, D, Hkv, Dh), "wv": (L, D, Hkv, Dh), "wo": (L, H, Dh, D),
      "w_gate": (L, D, F), "w_up": (L, D, F), "w_down": (L, F, D),
  }
  keys = jax.random.split(key, len(shapes) + 2)

  def normal(k, shape):
    return (c.initializer_range * jax.random.normal(k, shape, jnp.float32)).astype(dtype)

  layers = {name: normal(k, shape) for k, (name, shape) in zip(keys[2:], shapes.items())}
  layers["attn_norm"] = jnp.ones((L, D), dtype)
  layers["mlp_norm"] = jnp.ones((L, D), dtype)
  params = {"embed": normal(keys[0], (V, D)), "layers": layers, "final_norm": jnp.ones((D,), dtype)}
  if not c.tie_word_embeddings:
    params["lm_head"] = normal(keys[1], (D, V))
  return params


def init_cache(config: TransformerConfig, batch: int, length: int, dtype=jnp.float32) -> dict:
  """Zeroed K/V buffers for `batch` rows of `length` slots."""
  c = config
  L, Hkv, Dh = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
  return {
      "k": jnp.zeros((L, batch, Hkv, length, Dh), dtype),  # [L, B, Hkv, S, Dh]
      "v": jnp.zeros((L, batch, Hkv, Dh, length), dtype),  # [L, B, Hkv, Dh, S]
  }


# ----------------------------------------------------------------------------- math


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  # Normalise in f32, scale in the param dtype (as Hugging Face Llama does).
  x32 = x.astype(jnp.float32)
  x32 = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return x32.astype(x.dtype) * weight.reshape((1,) * (x.ndim - 1) + weight.shape)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding, half-split convention. x [B, T, H, Dh], positions [B, T]."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))  # [Dh/2]
  angles = positions.astype(jnp.float32)[:, :, None] * inv_freq[None, None, :]  # [B, T, Dh/2]
  cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def attention(q, k, v, visible) -> jax.Array:
  """Grouped-query attention.

  q [B, T, H, Dh]; k [B, Hkv, S, Dh]; v [B, Hkv, Dh, S]; visible bool [B, T, S].
  Returns [B, T, H, Dh].
  """
  B, T, H, Dh = q.shape
  Hkv = k.shape[1]
  G = H // Hkv
  q = q.reshape(B, T, Hkv, G, Dh).transpose(0, 2, 3, 1, 4)  # [B, Hkv, G, T, Dh]
  scores = jnp.einsum("bkgtd,bksd->bkgts", q, k, preferred_element_type=jnp.float32)
  scores = scores * (1.0 / math.sqrt(Dh))
  scores = jnp.where(visible[:, None, None, :, :], scores, -jnp.inf)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bkds->bkgtd", probs, v)  # [B, Hkv, G, T, Dh]
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh)


def _visibility(start, block_mask, slots: int) -> jax.Array:
  """[B, T, S]: slot s is visible to block token t of row b (DESIGN.md contract)."""
  T = block_mask.shape[0]
  s = jnp.arange(slots, dtype=jnp.int32)[None, :]  # [1, S]
  rel = s - start[:, None]  # [B, S] slot offset inside the block
  in_block = (rel >= 0) & (rel < T)
  from_block = jnp.take(block_mask, jnp.clip(rel, 0, T - 1), axis=1)  # [T, B, S]
  from_block = from_block.transpose(1, 0, 2) & in_block[:, None, :]
  return (rel < 0)[:, None, :] | from_block


def _write(buffer, new, start, axis: int):
  """Write new [B, ..., T, ...] into buffer [B, ..., S, ...] at per-row slot start[b]."""

  def one(buf, blk, s):
    index = [jnp.int32(0)] * buf.ndim
    index[axis - 1] = s
    return lax.dynamic_update_slice(buf, blk, index)

  return jax.vmap(one)(buffer, new.astype(buffer.dtype), start)


def apply(config: TransformerConfig, params: dict, tokens, cache, start,
          block_mask=None, depth=None):
  """The model contract. See module docstring and DESIGN.md."""
  c = config
  B, T = tokens.shape
  H, Hkv, Dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  if block_mask is None:
    block_mask = jnp.tril(jnp.ones((T, T), bool))
  if depth is None:
    depth = jnp.arange(T, dtype=jnp.int32)
  start = start.astype(jnp.int32)
  positions = start[:, None] + depth[None, :]  # [B, T]
  x = jnp.take(params["embed"], tokens, axis=0)  # [B, T, D]

  if cache is None:  # cache-free pass over the block alone (training, tests)
    visible = jnp.broadcast_to(block_mask[None], (B, T, T))
  else:
    visible = _visibility(start, block_mask, cache["k"].shape[3])

  def layer(carry, inputs):
    x, cache = carry
    w, index = inputs
    with jax.named_scope("attention"):
      h = rms_norm(x, w["attn_norm"], c.rms_norm_eps)
      q = rope(jnp.einsum("btd,dhk->bthk", h, w["wq"]), positions, c.rope_theta)
      k = rope(jnp.einsum("btd,dhk->bthk", h, w["wk"]), positions, c.rope_theta)
      v = jnp.einsum("btd,dhk->bthk", h, w["wv"])
      k = k.transpose(0, 2, 1, 3)  # [B, Hkv, T, Dh]
      v = v.transpose(0, 2, 3, 1)  # [B, Hkv, Dh, T]
      if cache is not None:
        layer_k = _write(cache["k"][index], k, start, axis=2)
        layer_v = _write(cache["v"][index], v, start, axis=3)
        cache = {"k": cache["k"].at[index].set(layer_k), "v": cache["v"].at[index].set(layer_v)}
        k, v = layer_k, layer_v
      attn = attention(q, k, v, visible)
      x = x + jnp.einsum("bthk,hkd->btd", attn, w["wo"])
    with jax.named_scope("mlp"):
      h = rms_norm(x, w["mlp_norm"], c.rms_norm_eps)
      gate = jnp.einsum("btd,df->btf", h, w["w_gate"])
      up = jnp.einsum("btd,df->btf", h, w["w_up"])
      x = x + jnp.einsum("btf,fd->btd", jax.nn.silu(gate) * up, w["w_down"])
    return (x, cache), None

  layer_index = jnp.arange(c.num_hidden_layers, dtype=jnp.int32)
  (x, cache), _ = lax.scan(layer, (x, cache), (params["layers"], layer_index))
  hidden = rms_norm(x, params["final_norm"], c.rms_norm_eps)  # [B, T, D]
  head = params["embed"].T if c.tie_word_embeddings else params["lm_head"]
  logits = jnp.einsum("btd,dv->btv", hidden, head, preferred_element_type=jnp.float32)
  return logits, hidden, cache


# ----------------------------------------------------------------------------- NNX module


class _Layers(nnx.Module):
  """All decoder layers, each weight stacked on a leading layer axis."""

  def __init__(self, params: dict):
    for name, value in params.items():
      setattr(self, name, nnx.Param(value))


class Transformer(nnx.Module):
  """Flax NNX face of the reference decoder: trainable, same params as `apply`.

      module = Transformer(config, rngs=nnx.Rngs(0))
      logits = module(tokens)                 # [B, T, V] f32, causal
      model = module.to_model()               # jspec.Model for decoding
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
    self.config = config
    params = init_params(config, rngs.params(), dtype)
    self.embed = nnx.Param(params["embed"])
    self.layers = _Layers(params["layers"])
    self.final_norm = nnx.Param(params["final_norm"])
    if "lm_head" in params:
      self.lm_head = nnx.Param(params["lm_head"])

  def params(self) -> dict:
    """The plain nested dict that `apply` consumes."""
    return nnx.to_pure_dict(nnx.state(self, nnx.Param))

  def __call__(self, tokens: jax.Array) -> jax.Array:
    start = jnp.zeros((tokens.shape[0],), jnp.int32)
    logits, _, _ = apply(self.config, self.params(), tokens, None, start)
    return logits

  def to_model(self) -> Model:
    return make_model(self.config, self.params())


def make_model(config: TransformerConfig, params: dict) -> Model:
  return Model(params=params, config=config, apply_fn=apply, init_cache_fn=init_cache)


def init(config: TransformerConfig, seed: int = 0, dtype=jnp.float32) -> Model:
  """A random-init `jspec.Model` of this architecture."""
  return make_model(config, init_params(config, jax.random.key(seed), dtype))
