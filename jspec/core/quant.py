"""Weight-only quantized weights: values in a narrow dtype, scales (and offsets) in the model's.

    w ~= q * scale (+ offset)

`QuantWeight(q, scale, offset)` holds one weight. q has the weight's shape in a storage
dtype: int8, int4, uint4 or float8_e4m3fn. scale (and offset, when there is one) keeps the
weight's rank; on each axis a product keeps (an output channel) it has the weight's size,
and on the axes a product contracts it has size 1 (one scale per output channel) or one
entry per group of consecutive inputs (wq [D, H, Dh] in groups of 32 over D -> scale
[D/32, H, Dh]; wo [H, Dh, D] in groups of 32 inputs -> [H, Dh/32, D]). offset is None for the symmetric forms jspec makes; the
affine forms (jspec's int4; GGUF's Q4_1, Q4_K, ...: w = d * q - m per block) carry it.

`quantize(w, axes, mode)` makes the three forms `MODES` names, each rounding to nearest:

    "int8"  per output channel, scale = max |w| / 127, q in -127 .. 127
    "int4"  groups of 32 along the last contracted axis, affine: q in 0 .. 15,
            scale = (max - min) / 15, offset = min (GGUF's Q4_1)
    "fp8"   per output channel, q = w / scale in float8_e4m3fn, scale = max |w| / 448

(a group of 32 is what GGUF's Q4 types use; 4-bit values per output channel lose too much
to serve). Activations stay in the model's dtype. A product over a per-channel weight casts q
to it and scales the product's output (`einsum`), so a call reads one byte per parameter
and computes as before; a grouped or affine weight is dequantized inside the product. The
saving is in the bytes a call reads, not the arithmetic.

A cast of q depends on the weight alone, and XLA treats it so: on the CPU it computed every
cast of a call before the call's first product and held them all (an int8 SmolLM2-135M
call: 513 MiB of temp, its f32 weights' size), and inside a loop, as every decode loop is,
its loop-invariant code motion moved them before the loop. The model then held its
weights twice, narrow and wide, and a step streamed the wide ones. `einsum` therefore
passes the weight through `in_call` (on the CPU a select on a predicate of the product's
input that is never true, elsewhere an optimization barrier with that input): the same
values, but computed in the call after its input, so each cast happens where its product
needs it and is freed after. On the CPU that loop then holds
108 MiB (the tied output head, the largest weight, dequantized for its product), and an
int8 model decodes at its f32 model's speed as before (`benchmarks/quant_agreement.py
--loop-memory` and `--speed`); float8 casts, slow on the CPU, are now paid every step.
Where a product fuses the cast into its reads (GPU, TPU), the tie keeps the step reading
narrow weights; the device check measures both ways.

Keeping the weight's rank is what lets every operation that cuts or reshapes a stacked
weight do the same to q, scale and offset: the per-layer cut is a `tree_map`, a layer axis
is sliced off every leaf, a gathered embedding row carries its scales along, and a weight's
logical sharding axes fit its scales too (a size-1 axis is never split; a group axis splits
with its weight's axis when each shard holds whole groups).

Every weight product of the reference decoder and the layers in `jspec.core.nn` goes
through `einsum`, and the embedding lookup through `take`: on a plain array they call
exactly what they replace (`jnp.einsum`, `jnp.take` with the same arguments), so an
unquantized model computes bit for bit what it did before. Which params are quantized is
the model's business (`jspec.models.transformer.quantize_params`).
"""

from __future__ import annotations

import dataclasses
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

MODES = ("int8", "int4", "fp8")  # what `quantize` makes from float weights
# What `weights=` accepts at load besides None (the float weights): a mode, or "gguf": a
# GGUF file's quantized blocks kept as they are stored (`jspec.models.gguf`).
WEIGHTS = MODES + ("gguf",)
INT8_MAX = 127  # symmetric: -127 .. 127, so that negating a weight negates q exactly
UINT4_MAX = 15
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
INT4_GROUP = 32
_STORAGE = types.MappingProxyType({"int8": jnp.int8, "fp8": jnp.float8_e4m3fn})


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantWeight:
  """A weight as narrow values and scales (module docstring).

  Every field is a pytree leaf (offset an empty subtree when None), so slicing a leading
  layer axis off every leaf (a scan over stacked layers, the per-layer cut of the decoding
  form) slices them all.
  """

  q: jax.Array  # int8 / int4 / uint4 / float8_e4m3fn, the weight's shape, e.g. [L, D, H, Dh]
  # The weight's dtype (the model computes in it), the weight's rank: 1 on a contracted axis
  # (per channel) or the number of groups along it, e.g. [L, 1, H, Dh] or [L, D/32, H, Dh].
  scale: jax.Array
  offset: jax.Array | None = None  # scale's shape and dtype; None: symmetric

  @property
  def shape(self) -> tuple[int, ...]:
    """The weight's shape (that of `q`)."""
    return tuple(self.q.shape)

  @property
  def ndim(self) -> int:
    """The weight's rank."""
    return self.q.ndim

  @property
  def dtype(self):
    """The dtype the weight computes in (its scales'), not the storage dtype."""
    return self.scale.dtype


def check_weights(weights) -> str | None:
  """`weights` as given when it is None or one of `WEIGHTS`; ValueError naming them if not."""
  if weights is None or (isinstance(weights, str) and weights in WEIGHTS):
    return weights
  raise ValueError(f"weights must be None (the stored float weights) or one of "
                   f"{', '.join(repr(w) for w in WEIGHTS)}, got {weights!r}")


def quantize(w: jax.Array, axes, mode: str = "int8", group: int = INT4_GROUP) -> QuantWeight:
  """w quantized in `mode` (module docstring): `axes` are the axes a product contracts;
  "int4" groups the last of them in runs of gcd(its size, `group`) inputs. The scales (and
  offsets) are in w's dtype, as the model computes."""
  if mode not in MODES:
    raise ValueError(f"quantize mode must be one of {MODES}, got {mode!r}")
  w = jnp.asarray(w)
  if not jnp.issubdtype(w.dtype, jnp.floating):
    raise TypeError(f"quantize takes a floating-point weight, got {w.dtype}")
  axes = tuple(sorted(int(a) % w.ndim for a in axes))
  w32 = w.astype(jnp.float32)
  if mode == "int4":
    a = axes[-1]
    g = math.gcd(w.shape[a], group)
    return _affine4(w, w32.reshape(w.shape[:a] + (w.shape[a] // g, g) + w.shape[a + 1:]), a)
  absmax = jnp.max(jnp.abs(w32), axis=axes, keepdims=True)
  top = {"int8": INT8_MAX, "fp8": FP8_MAX}[mode]
  # An all-zero channel gets scale 1 (q = 0), not 0 / 0. The scale is rounded to w's dtype
  # before q is computed from it, so q * scale is what the model multiplies by: a bf16 scale
  # is within 2^-8 of absmax / top, so |w / scale| stays within rounding of top and the
  # clip guards against nothing but that arithmetic.
  scale = jnp.where(absmax > 0, absmax / top, 1.0).astype(w.dtype)
  q = w32 / scale.astype(jnp.float32)
  q = q if mode == "fp8" else jnp.round(q)
  return QuantWeight(q=jnp.clip(q, -top, top).astype(_STORAGE[mode]), scale=scale)


def _affine4(w, split, a: int) -> QuantWeight:
  """int4 in groups: `split` is w in f32 with axis `a` cut into [n/g, g]. Each group's
  range [min, max] in 16 levels (uint4 0..15): scale = (max - min) / 15, offset = min, as
  GGUF's Q4_1 does. Against a symmetric -7..7 grid this spends no level on a sign the
  group does not have and one more level overall: on SmolLM2-135M, top-1 agreement with the
  f32 model at 89.6% of positions against the symmetric grid's 67.2% (docs/checkpoints.md)."""
  lo = jnp.min(split, axis=a + 1, keepdims=True)  # [..., n/g, 1, ...]
  hi = jnp.max(split, axis=a + 1, keepdims=True)
  # Scale and offset rounded to w's dtype before q is solved from them, so that q * scale
  # + offset is what the model computes with; a constant group gets scale 1 and q = 0.
  scale = jnp.where(hi > lo, (hi - lo) / UINT4_MAX, 1.0).astype(w.dtype)
  offset = lo.astype(w.dtype)
  q = jnp.round((split - offset.astype(jnp.float32)) / scale.astype(jnp.float32))
  q = jnp.clip(q, 0, UINT4_MAX).astype(jnp.uint4).reshape(w.shape)
  cut = lambda x: x.reshape(x.shape[:a + 1] + x.shape[a + 2:])
  return QuantWeight(q=q, scale=cut(scale), offset=cut(offset))


def _expand(x, shape):
  """x (a scale or offset) repeated along its group axes up to `shape` (size-1 axes are
  left to broadcasting)."""
  xp = np if isinstance(x, np.ndarray) else jnp
  for a, (s, n) in enumerate(zip(x.shape, shape)):
    if s not in (1, n):
      x = xp.repeat(x, n // s, axis=a)
  return x


def dequantize(w, dtype=None):
  """q * scale (+ offset) in `dtype` (default the weight's); a plain array as it is. NumPy
  leaves give a NumPy array."""
  if not isinstance(w, QuantWeight):
    return w
  dtype = w.scale.dtype if dtype is None else dtype
  out = w.q.astype(dtype) * _expand(w.scale, w.q.shape).astype(dtype)
  if w.offset is not None:
    out = out + _expand(w.offset, w.q.shape).astype(dtype)
  return out


def is_quant_weight(x) -> bool:
  """Whether `x` is a `QuantWeight` (an `is_leaf` for tree functions)."""
  return isinstance(x, QuantWeight)


def is_quantized(tree) -> bool:
  """Whether any node of `tree` (params, a model's params) is a `QuantWeight`."""
  return any(isinstance(x, QuantWeight) for x in
             jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, QuantWeight)))


def in_call(w: QuantWeight, x) -> QuantWeight:
  """`w` as a value of the product over x (module docstring): the same weight, but one XLA
  must compute after x, in the call.

  On the CPU, each leaf selected by a predicate of x's first entry that no value satisfies
  (x > 0 and x < 0; NaN neither): one select fused into the cast that reads it. XLA CPU
  lowers optimization barriers before it schedules, and a barrier there left every cast
  where it was. Elsewhere, an optimization barrier over (w, x): no data moved, and, unlike
  the predicate, nothing read from another device when x is sharded (the device check
  measures whether it keeps the casts in the call there)."""
  if jax.default_backend() != "cpu":
    w, _ = lax.optimization_barrier((w, x))
    return w
  first = lax.slice(x.reshape(-1), (0,), (1,))
  never = jnp.logical_and(first > 0, first < 0).reshape((1,) * w.q.ndim)
  return jax.tree_util.tree_map(lambda a: jnp.where(never, jnp.zeros_like(a), a), w)


def _letters(eq: str) -> tuple[str, str, str]:
  inputs, out = eq.replace(" ", "").split("->")
  x, w = inputs.split(",")
  return x, w, out


def einsum(eq: str, x, w, **kwargs):
  """`jnp.einsum(eq, x, w, **kwargs)` for a plain weight; for a `QuantWeight`, the same
  product: over q cast to x's dtype with the output scaled per channel (scales of size 1 on
  every contracted axis, no offset), or over the weight dequantized to x's dtype (groups,
  offsets).

  eq names x then w and has an explicit output; for a per-channel weight the output must
  end with the weight's uncontracted axes in the weight's order (as every product of the
  reference decoder does: "btd,dhk->bthk", "btd,vd->btv", ...), so the scale broadcasts
  over its trailing axes. kwargs (preferred_element_type, precision) go to `jnp.einsum`.
  """
  if not isinstance(w, QuantWeight):
    return jnp.einsum(eq, x, w, **kwargs)
  _, w_spec, out_spec = _letters(eq)
  if "." in eq or len(w_spec) != w.ndim:
    raise ValueError(f"quant.einsum {eq!r}: a quantized weight of rank {w.ndim} needs its "
                     f"axes named and an explicit output")
  per_channel = w.offset is None and all(
      n == 1 for a, n in zip(w_spec, w.scale.shape) if a not in out_spec)
  if not per_channel:
    return jnp.einsum(eq, x, dequantize(in_call(w, x), x.dtype), **kwargs)
  kept = "".join(a for a in w_spec if a in out_spec)
  if not out_spec.endswith(kept):
    raise ValueError(f"quant.einsum {eq!r}: a quantized weight needs an output that ends "
                     f"with the weight's uncontracted axes ({kept!r}) in its order")
  y = jnp.einsum(eq, x, in_call(w, x).q.astype(x.dtype), **kwargs)
  scale = w.scale.reshape(tuple(n for a, n in zip(w_spec, w.scale.shape) if a in out_spec))
  scale = scale.reshape((1,) * (y.ndim - scale.ndim) + scale.shape)
  return y * scale.astype(y.dtype)


def take(w, indices, axis: int = 0):
  """`jnp.take(w, indices, axis=axis)` for a plain weight; for a `QuantWeight` (scaled
  along `axis`: an embedding quantized per row, or in groups within a row) the rows of q,
  dequantized by their own scales: [V, D] at ids [B, T] -> [B, T, D] in the weight's dtype."""
  if not isinstance(w, QuantWeight):
    return jnp.take(w, indices, axis=axis)
  if w.scale.shape[axis] != w.q.shape[axis]:
    raise ValueError(f"quant.take along axis {axis}: the quantized weight's scales "
                     f"{w.scale.shape} are not per entry of that axis (weight {w.shape})")
  pick = lambda x: None if x is None else jnp.take(x, indices, axis=axis)
  return dequantize(QuantWeight(q=pick(w.q), scale=pick(w.scale), offset=pick(w.offset)))


def _map(w: QuantWeight, fn) -> QuantWeight:
  return QuantWeight(q=fn(w.q), scale=fn(w.scale),
                     offset=None if w.offset is None else fn(w.offset))


def matrix(w):
  """w [Din, ...] as a [Din, prod(...)] matrix (a `QuantWeight`'s scale [1 or Din/g, ...]
  as [1 or Din/g, prod(...)]): how the decoding form fuses q, k and v into one product."""
  if not isinstance(w, QuantWeight):
    return w.reshape(w.shape[0], -1)
  return _map(w, lambda x: x.reshape(x.shape[0], -1))


def common_form(ws):
  """`ws` brought to one form, so they can be stacked or concatenated: all plain arrays
  as they are; plain and quantized mixed, or float8 beside integers, all dequantized (to
  the first float's dtype); integer values of several storage dtypes as int8 (every
  storage dtype here fits it); scales regrouped to the finest grouping among them (each
  coarser group's scale repeated); zero offsets where some have offsets. Exact: each
  weight dequantizes to what it did. NumPy leaves stay NumPy."""
  ws = list(ws)
  quantized = [isinstance(w, QuantWeight) for w in ws]
  if not any(quantized):
    return ws
  kinds = {jnp.issubdtype(w.q.dtype, jnp.floating) for w in ws if isinstance(w, QuantWeight)}
  if not all(quantized) or len(kinds) > 1:
    dtype = next((w.dtype for w in ws if not isinstance(w, QuantWeight)), ws[0].dtype)
    return [dequantize(w, dtype) for w in ws]
  xp = np if isinstance(ws[0].q, np.ndarray) else jnp
  storage = {jnp.dtype(w.q.dtype) for w in ws}
  store = ws[0].q.dtype if len(storage) == 1 else jnp.int8
  # Per axis of one size in every weight (not the axis they are concatenated along): the
  # scale count they share, or the largest where they differ (a per-channel 1 or a coarser
  # grouping repeated up to it).
  counts = [max(n) if len({w.q.shape[a] for w in ws}) == 1
            and len(n := {w.scale.shape[a] for w in ws}) > 1 else None
            for a in range(ws[0].ndim)]
  affine = any(w.offset is not None for w in ws)
  out = []
  for w in ws:
    scale, offset = w.scale, w.offset
    for a, c in enumerate(counts):
      if c is not None and scale.shape[a] != c:
        if c % scale.shape[a]:
          raise ValueError(f"groups of {w.q.shape[a] // scale.shape[a]} and of "
                           f"{w.q.shape[a] // c} along axis {a} do not nest")
        scale = xp.repeat(scale, c // scale.shape[a], axis=a)
        offset = None if offset is None else xp.repeat(offset, c // offset.shape[a], axis=a)
    if affine and offset is None:
      offset = xp.zeros_like(scale)
    out.append(QuantWeight(q=w.q.astype(store), scale=scale, offset=offset))
  return out


def concatenate(ws, axis: int):
  """`jnp.concatenate(ws, axis)`, quantized weights brought to one form first
  (`common_form`) and their q, scale and offset each concatenated (`axis` must be an
  output axis, where every scale has full size)."""
  ws = common_form(ws)
  if not isinstance(ws[0], QuantWeight):
    return jnp.concatenate(ws, axis=axis)
  cat = lambda xs: jnp.concatenate(xs, axis=axis)
  return QuantWeight(q=cat([w.q for w in ws]), scale=cat([w.scale for w in ws]),
                     offset=None if ws[0].offset is None else cat([w.offset for w in ws]))


def num_elements(tree) -> int:
  """Elements of every weight in `tree`, a `QuantWeight` counting as its weight's (its
  scales are not parameters)."""
  leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, QuantWeight))
  return int(sum(_size(x.q if isinstance(x, QuantWeight) else x) for x in leaves))


def bits(dtype) -> int:
  """Bits an element of `dtype` takes in device memory (int4 / uint4: 4, packed two to a
  byte by the accelerators' compilers)."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.iinfo(dtype).bits
  if jnp.issubdtype(dtype, jnp.floating):
    return jnp.finfo(dtype).bits
  return 8 * dtype.itemsize


def num_bytes(tree) -> int:
  """Bytes of every array in `tree` as stored: a `QuantWeight`'s values (4-bit ones at half
  a byte), scales and offsets."""
  return int(math.ceil(sum(_size(x) * bits(x.dtype) / 8
                           for x in jax.tree_util.tree_leaves(tree))))


def _size(x) -> int:
  size = 1
  for n in x.shape:
    size *= int(n)
  return size
