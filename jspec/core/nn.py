"""Neural building blocks, as pure functions and small option types.

The reference decoder (`jspec.models`) is built from them, and so are the
drafters' own layers (EAGLE's decoder layer): they sit below both, so a drafter
never has to import the model zoo (docs/architecture.md, the layers).

The options are small frozen types rather than flags: a config says *which*
norm, position scheme and MLP it has, and each type knows its own params.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

# ----------------------------------------------------------------------------- norms


@dataclasses.dataclass(frozen=True)
class RMSNorm:
  """x / rms(x) * (offset + w). Gemma stores w - 1 (offset 1); Llama stores w (offset 0)."""

  kind: str = dataclasses.field(default="rms", init=False)

  offset: float = 0.0

  def params(self, shape, dtype):
    """Initial params of a norm over `shape`: {"scale": 1 - offset}, so offset + scale is 1."""
    return {"scale": jnp.full(shape, 1.0 - self.offset, dtype)}

  def __call__(self, x, p, eps):
    x32 = x.astype(jnp.float32)
    x32 = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    w = _lift(p["scale"], x.ndim)
    if self.offset:  # Gemma scales in f32 with (1 + w), then casts
      return (x32 * (self.offset + w.astype(jnp.float32))).astype(x.dtype)
    return x32.astype(x.dtype) * w  # Llama casts first, then scales


@dataclasses.dataclass(frozen=True)
class LayerNorm:
  """Mean-centred norm with scale and bias (GPT-2)."""

  kind: str = dataclasses.field(default="layer", init=False)

  def params(self, shape, dtype):
    """Initial params of a norm over `shape`: {"scale": ones, "bias": zeros}."""
    return {"scale": jnp.ones(shape, dtype), "bias": jnp.zeros(shape, dtype)}

  def __call__(self, x, p, eps):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * lax.rsqrt(var + eps)
    return (y * _lift(p["scale"], x.ndim).astype(jnp.float32)
            + _lift(p["bias"], x.ndim).astype(jnp.float32)).astype(x.dtype)


def _lift(w, ndim):
  """Reshape a [D] weight to broadcast against an ndim-rank activation (rank promotion off)."""
  return w.reshape((1,) * (ndim - w.ndim) + w.shape)


# ----------------------------------------------------------------------------- positions


@dataclasses.dataclass(frozen=True)
class Llama3Scaling:
  """Llama 3.1 frequency-dependent RoPE scaling (Hugging Face `rope_type: llama3`)."""

  kind: str = dataclasses.field(default="llama3", init=False)

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int

  def __call__(self, inv_freq):
    old = self.original_max_position_embeddings
    low_wavelen = old / self.low_freq_factor
    high_wavelen = old / self.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
    smooth = (old / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
    smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)


@dataclasses.dataclass(frozen=True)
class LinearScaling:
  """Position interpolation: every frequency divided by `factor`."""

  kind: str = dataclasses.field(default="linear", init=False)

  factor: float

  def __call__(self, inv_freq):
    return inv_freq / self.factor


@dataclasses.dataclass(frozen=True)
class Rotary:
  """Rotary embeddings (half-split convention), optionally with frequency scaling."""

  kind: str = dataclasses.field(default="rotary", init=False)

  scaling: Llama3Scaling | LinearScaling | None = None


@dataclasses.dataclass(frozen=True)
class Learned:
  """A learned absolute position table added to the token embeddings (GPT-2)."""

  kind: str = dataclasses.field(default="learned", init=False)


def rope(x: jax.Array, positions: jax.Array, theta: float, scaling=None) -> jax.Array:
  """Rotate x [B, T, H, Dh] by positions [B, T] (half-split convention)."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))  # [Dh/2]
  if scaling is not None:
    inv_freq = scaling(inv_freq)
  angles = positions.astype(jnp.float32)[:, :, None] * inv_freq[None, None, :]  # [B, T, Dh/2]
  cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


# ----------------------------------------------------------------------------- MLPs

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


@dataclasses.dataclass(frozen=True)
class GatedMLP:
  """down(act(gate(x)) * up(x)): SwiGLU (Llama, Qwen, Mistral) or GeGLU (Gemma)."""

  kind: str = dataclasses.field(default="gated", init=False)

  activation: str = "silu"

  def __post_init__(self):
    _check_activation(self.activation)

  def weight_names(self):
    """Names of the input projections ([L, D, F] each); `w_down` is always there."""
    return ("w_gate", "w_up")

  def __call__(self, h, w, dense=None):
    """`dense(x, w, b)`: `dense_in_major` for [in, out] weights (the default), or
    `dense_out_major` for the decoding form's [out, in]."""
    dense = dense or dense_in_major
    act = ACTIVATIONS[self.activation]
    if "w_gate_up" in w:  # the decoding form: one product, then split (transformer.unstack)
      gate, up = jnp.split(dense(h, w["w_gate_up"], w.get("b_gate_up")), 2, axis=-1)
    else:
      gate = dense(h, w["w_gate"], w.get("b_gate"))
      up = dense(h, w["w_up"], w.get("b_up"))
    return dense(act(gate) * up, w["w_down"], w.get("b_down"))


@dataclasses.dataclass(frozen=True)
class DenseMLP:
  """down(act(up(x))): the two-matrix MLP of GPT-2."""

  kind: str = dataclasses.field(default="dense", init=False)

  activation: str = "gelu_tanh"

  def __post_init__(self):
    _check_activation(self.activation)

  def weight_names(self):
    """Names of the input projections ([L, D, F] each); `w_down` is always there."""
    return ("w_up",)

  def __call__(self, h, w, dense=None):
    """`dense` as for `GatedMLP`."""
    dense = dense or dense_in_major
    act = ACTIVATIONS[self.activation]
    return dense(act(dense(h, w["w_up"], w.get("b_up"))), w["w_down"], w.get("b_down"))


def _check_activation(name):
  if name not in ACTIVATIONS:
    raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")


def dense_in_major(x, w, b=None):
  """x [B, T, Din] times w [Din, Dout] (+ b [Dout])."""
  y = jnp.einsum("btd,df->btf", x, w)
  return y if b is None else y + b[None, None, :]


def dense_out_major(x, w, b=None):
  """x [B, T, Din] times w stored [Dout, Din] (the decoding form, see transformer.unstack)."""
  y = jnp.einsum("btd,fd->btf", x, w)
  return y if b is None else y + b[None, None, :]


# ----------------------------------------------------------------------------- attention


def attention(q, k, v, visible, scale: float, softcap: float | None = None) -> jax.Array:
  """Grouped-query attention.

  q [B, T, H, Dh]; k [B, Hkv, Dh, S]; v [B, Hkv, S, Dh]; visible bool [B, T, S].
  These K/V layouts are the ones XLA CPU's batched matmuls read in place: K with
  the slot axis minor, V with the head dim minor (models/transformer.py).
  Returns [B, T, H, Dh].
  """
  B, T, H, Dh = q.shape
  Hkv = k.shape[1]
  G = H // Hkv
  q = q.reshape(B, T, Hkv, G, Dh).transpose(0, 2, 3, 1, 4)  # [B, Hkv, G, T, Dh]
  scores = jnp.einsum("bkgtd,bkds->bkgts", q, k, preferred_element_type=jnp.float32) * scale
  if softcap is not None:  # Gemma 2: bound attention logits smoothly
    scores = jnp.tanh(scores / softcap) * softcap
  scores = jnp.where(visible[:, None, None, :, :], scores, -jnp.inf)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bksd->bkgtd", probs, v)  # [B, Hkv, G, T, Dh]
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh)


def step_attention(q, k_cache, v_cache, k_new, v_new, visible, scale: float,
                   softcap: float | None = None) -> jax.Array:
  """Attention of one new token per row to the cache as it was before this step, plus
  to its own K/V, which the caller writes into the cache separately.

  q [B, 1, H, Dh]; k_cache [B, Hkv, Dh, S]; v_cache [B, Hkv, S, Dh]; k_new [B, Hkv, Dh, 1];
  v_new [B, Hkv, 1, Dh]; visible bool [B, 1, S] over the cache's slots (the token's own
  slot excluded: it sees itself through k_new). Returns [B, 1, H, Dh], equal to
  `attention` over the updated cache up to float rounding.
  """
  B, T, H, Dh = q.shape
  Hkv = k_cache.shape[1]
  G = H // Hkv
  q = q.reshape(B, Hkv, G, Dh)
  old = jnp.einsum("bkgd,bkds->bkgs", q, k_cache, preferred_element_type=jnp.float32) * scale
  new = jnp.sum(q.astype(jnp.float32) * k_new[..., 0][:, :, None].astype(jnp.float32), axis=-1,
                keepdims=True) * scale  # [B, Hkv, G, 1]
  if softcap is not None:
    old, new = jnp.tanh(old / softcap) * softcap, jnp.tanh(new / softcap) * softcap
  old = jnp.where(visible[:, :, None, :], old, -jnp.inf)  # [B, 1, 1, S] over [B, Hkv, G, S]
  top = jnp.maximum(jnp.max(old, axis=-1, keepdims=True), new)
  p_old, p_new = jnp.exp(old - top), jnp.exp(new - top)
  total = jnp.sum(p_old, axis=-1, keepdims=True) + p_new
  out = (jnp.einsum("bkgs,bksd->bkgd", p_old.astype(v_cache.dtype), v_cache,
                    preferred_element_type=jnp.float32)
         + p_new * v_new[:, :, 0][:, :, None].astype(jnp.float32)) / total  # [B, Hkv, G, Dh]
  return out.astype(v_cache.dtype).reshape(B, 1, H, Dh)


OPTION_TYPES = {cls.__dataclass_fields__["kind"].default: cls for cls in (
    RMSNorm, LayerNorm, Llama3Scaling, LinearScaling, Rotary, Learned, GatedMLP, DenseMLP)}


def option_from_dict(value):
  """Rebuild an option type from `dataclasses.asdict` output (tagged by `kind`)."""
  if value is None or not isinstance(value, dict):
    return value
  fields = dict(value)
  kind = fields.pop("kind", None)
  if kind not in OPTION_TYPES:
    raise ValueError(f"unknown option kind {kind!r}; known: {sorted(OPTION_TYPES)}")
  fields = {k: option_from_dict(v) for k, v in fields.items()}
  return OPTION_TYPES[kind](**fields)
