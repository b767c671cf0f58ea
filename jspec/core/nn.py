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
import types
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import lax

from jspec.core import quant

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

ACTIVATIONS = types.MappingProxyType({
    "silu": jax.nn.silu,
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
})


@dataclasses.dataclass(frozen=True)
class _MLP:
  """What every MLP kind shares: an activation checked by name, and its input projections."""

  activation: str
  INPUTS: ClassVar[tuple[str, ...]] = ()

  def __post_init__(self):
    _check_activation(self.activation)

  def weight_names(self):
    """Names of the input projections ([L, D, F] each); `w_down` is always there."""
    return self.INPUTS


@dataclasses.dataclass(frozen=True)
class GatedMLP(_MLP):
  """down(act(gate(x)) * up(x)): SwiGLU (Llama, Qwen, Mistral) or GeGLU (Gemma)."""

  activation: str = "silu"
  kind: str = dataclasses.field(default="gated", init=False)
  INPUTS: ClassVar[tuple[str, ...]] = ("w_gate", "w_up")

  def __call__(self, h, w):
    """h [B, T, D] -> [B, T, D]; w holds [in, out] matrices (w_gate_up [D, 2F] in the
    decoding form)."""
    dense = dense_in_major
    act = ACTIVATIONS[self.activation]
    if "w_gate_up" in w:  # the decoding form: one product, then split (transformer.unstack)
      gate, up = jnp.split(dense(h, w["w_gate_up"], w.get("b_gate_up")), 2, axis=-1)
    else:
      gate = dense(h, w["w_gate"], w.get("b_gate"))
      up = dense(h, w["w_up"], w.get("b_up"))
    return dense(act(gate) * up, w["w_down"], w.get("b_down"))


@dataclasses.dataclass(frozen=True)
class DenseMLP(_MLP):
  """down(act(up(x))): the two-matrix MLP of GPT-2."""

  activation: str = "gelu_tanh"
  kind: str = dataclasses.field(default="dense", init=False)
  INPUTS: ClassVar[tuple[str, ...]] = ("w_up",)

  def __call__(self, h, w):
    """h [B, T, D] -> [B, T, D]; w holds [in, out] matrices."""
    dense = dense_in_major
    act = ACTIVATIONS[self.activation]
    return dense(act(dense(h, w["w_up"], w.get("b_up"))), w["w_down"], w.get("b_down"))


def _check_activation(name):
  if name not in ACTIVATIONS:
    raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")


def dense_in_major(x, w, b=None):
  """x [B, T, Din] times w [Din, Dout] (+ b [Dout]); w may be int8 (`quant.QuantWeight`)."""
  y = quant.einsum("btd,df->btf", x, w)
  return y if b is None else y + b[None, None, :]



# ----------------------------------------------------------------------------- attention


@dataclasses.dataclass(frozen=True)
class KVLayout:
  """Axis order of one layer's K and V cache buffers, in the letters b (batch), h (KV
  heads), s (slots) and d (head dim).

  Which order is fastest depends on the backend's attention kernels; `CPU_KV` and
  `SLOT_MAJOR_KV` below are the two a config chooses between (`kv_layout_for`).
  """

  kind: str = dataclasses.field(default="kv_layout", init=False)

  k: str = "bhds"
  v: str = "bhsd"

  def __post_init__(self):
    for name in ("k", "v"):
      order = getattr(self, name)
      if sorted(order) != sorted("bhsd") or order[0] != "b":
        raise ValueError(f"KVLayout.{name} must order the letters b, h, s, d with b first "
                         f"(rows are written one by one), got {order!r}")

  def shape(self, which: str, B: int, Hkv: int, S: int, Dh: int) -> tuple[int, ...]:
    """The shape of buffer `which` ("k" or "v") for S slots."""
    size = {"b": B, "h": Hkv, "s": S, "d": Dh}
    return tuple(size[a] for a in getattr(self, which))

  def slot_axis(self, which: str) -> int:
    """The index of the slot axis in buffer `which`."""
    return getattr(self, which).index("s")

  def arrange(self, which: str, x):
    """x [B, T, Hkv, Dh] (new K or V of T tokens) in this layout's order, T on the slot axis."""
    return x.transpose(tuple("bshd".index(a) for a in getattr(self, which)))

  def axis_names(self, which: str) -> tuple[str, ...]:
    """Logical axis names of buffer `which` (jspec/core/sharding.py)."""
    names = {"b": "batch", "h": "kv_heads", "s": "sequence", "d": "head_dim"}
    return tuple(names[a] for a in getattr(self, which))

  def spec(self, which: str) -> str:
    """The buffer's axes as einsum letters of `attention` (k for KV heads)."""
    return getattr(self, which).replace("h", "k")


# K with the slot axis minor and V with the head dim minor: the right operands XLA CPU's
# batched attention matmuls read in place (measurements in models/transformer.py).
CPU_KV = KVLayout("bhds", "bhsd")
# Slots before heads, head dim minor, for both: the order GPU and TPU attention kernels
# and most serving engines keep.
SLOT_MAJOR_KV = KVLayout("bshd", "bshd")


def kv_layout_for(backend: str) -> KVLayout:
  """The layout a cache gets on `backend` ("cpu", "gpu", "tpu", ...) when its config
  names none."""
  return CPU_KV if backend == "cpu" else SLOT_MAJOR_KV


# The shortest prefix of the cache a round's attention reads on the CPU backend. A
# round reads the cache's slots up to the smallest span (MIN_SPAN, 2 MIN_SPAN, 4 ..., S)
# that holds every row's live slots, so its cost follows the rows' lengths, not the
# cache's capacity (`attention_spans`, measured in models/transformer.py).
MIN_SPAN = 128


def attention_spans(slots: int, backend: str, min_span: int | None = None) -> tuple[int, ...]:
  """The static prefixes of a cache of `slots` slots that attention may read: powers of
  two times `min_span` below `slots`, then `slots` itself, shortest first.

  min_span None: the backend's default, MIN_SPAN on CPU and the whole cache elsewhere
  (each span is a branch of a `lax.switch`, and on GPU a conditional waits for its
  predicate on the host; ragged attention kernels are the form there). 0: the whole
  cache."""
  if min_span is None:
    min_span = MIN_SPAN if backend == "cpu" else 0
  if min_span <= 0:
    return (slots,)
  spans, span = [], int(min_span)
  while span < slots:
    spans.append(span)
    span *= 2
  return tuple(spans) + (slots,)


def span_index(spans: tuple[int, ...], extent) -> jax.Array:
  """[] int32: the index of the shortest of `spans` that holds `extent` [] slots."""
  return jnp.sum(extent > jnp.asarray(spans[:-1], jnp.int32)).astype(jnp.int32)


def read_span(buffer, span: int, axis: int):
  """The first `span` slots of a cache buffer along its slot axis (static)."""
  return buffer if buffer.shape[axis] == span else lax.slice_in_dim(buffer, 0, span, axis=axis)


def attention(q, k, v, visible, scale: float, softcap: float | None = None,
              layout: KVLayout = CPU_KV) -> jax.Array:
  """Grouped-query attention.

  q [B, T, H, Dh]; k, v in `layout`'s order over S slots; visible bool [B, T, S].
  Returns [B, T, H, Dh].
  """
  B, T, H, Dh = q.shape
  Hkv = k.shape[layout.k.index("h")]
  G = H // Hkv
  q = q.reshape(B, T, Hkv, G, Dh).transpose(0, 2, 3, 1, 4)  # [B, Hkv, G, T, Dh]
  scores = jnp.einsum(f"bkgtd,{layout.spec('k')}->bkgts", q, k,
                      preferred_element_type=jnp.float32) * scale
  if softcap is not None:  # Gemma 2: bound attention logits smoothly
    scores = jnp.tanh(scores / softcap) * softcap
  scores = jnp.where(visible[:, None, None, :, :], scores, -jnp.inf)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum(f"bkgts,{layout.spec('v')}->bkgtd", probs, v)  # [B, Hkv, G, T, Dh]
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh)


def step_attention(q, k_cache, v_cache, k_new, v_new, visible, scale: float,
                   softcap: float | None = None, layout: KVLayout = CPU_KV) -> jax.Array:
  """Attention of one new token per row to the cache as it was before this step, plus
  to its own K/V, which the caller writes into the cache separately.

  q [B, 1, H, Dh]; k_cache, v_cache in `layout`'s order over S slots; k_new, v_new
  [B, 1, Hkv, Dh]; visible bool [B, 1, S] over the cache's slots (the token's own slot
  excluded: it sees itself through k_new). Returns [B, 1, H, Dh], equal to `attention`
  over the updated cache up to float rounding.
  """
  B, T, H, Dh = q.shape
  Hkv = k_new.shape[2]
  G = H // Hkv
  q = q.reshape(B, Hkv, G, Dh)
  old = jnp.einsum(f"bkgd,{layout.spec('k')}->bkgs", q, k_cache,
                   preferred_element_type=jnp.float32) * scale
  k_new, v_new = k_new[:, 0], v_new[:, 0]  # [B, Hkv, Dh]
  new = jnp.sum(q.astype(jnp.float32) * k_new[:, :, None].astype(jnp.float32), axis=-1,
                keepdims=True) * scale  # [B, Hkv, G, 1]
  if softcap is not None:
    old, new = jnp.tanh(old / softcap) * softcap, jnp.tanh(new / softcap) * softcap
  old = jnp.where(visible[:, :, None, :], old, -jnp.inf)  # [B, 1, 1, S] over [B, Hkv, G, S]
  top = jnp.maximum(jnp.max(old, axis=-1, keepdims=True), new)
  p_old, p_new = jnp.exp(old - top), jnp.exp(new - top)
  total = jnp.sum(p_old, axis=-1, keepdims=True) + p_new
  out = (jnp.einsum(f"bkgs,{layout.spec('v')}->bkgd", p_old.astype(v_cache.dtype), v_cache,
                    preferred_element_type=jnp.float32)
         + p_new * v_new[:, :, None].astype(jnp.float32)) / total  # [B, Hkv, G, Dh]
  return out.astype(v_cache.dtype).reshape(B, 1, H, Dh)


OPTION_TYPES = types.MappingProxyType({cls.__dataclass_fields__["kind"].default: cls for cls in (
    RMSNorm, LayerNorm, Llama3Scaling, LinearScaling, Rotary, Learned, GatedMLP, DenseMLP,
    KVLayout)})


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
