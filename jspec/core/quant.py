"""Weight-only int8: a weight stored as int8 values and one scale per output channel.

    w ~= q * scale        q int8, the weight's shape; scale over the output channels

`quantize(w, axes)` rounds symmetrically: each output channel (every index of the axes a
product does not contract) gets scale = max |w| / 127 over the contracted `axes`, and
q = round(w / scale), so |w - q * scale| <= scale / 2 entry by entry. Activations stay in
the model's dtype; a product casts q to it and scales its output (`einsum`), so the saving
is in the bytes a call reads, not in the arithmetic.

The scale keeps the weight's rank, with size 1 on the contracted axes (wq [D, H, Dh] ->
scale [1, H, Dh]; a tied embedding [V, D] -> [V, 1]). In that form every operation that
cuts or reshapes a stacked weight does the same to q and scale: the per-layer cut is a
`tree_map` over both leaves, a layer axis is sliced off both, a gathered embedding row
carries its scale along ([B, T, 1] against [B, T, D]), and a weight's logical sharding
axes fit its scale too (a size-1 axis is never split).

Every weight product of the reference decoder and the layers in `jspec.core.nn` goes
through `einsum`, and the embedding lookup through `take`: on a plain array they call
exactly what they replace (`jnp.einsum`, `jnp.take` with the same arguments), so an
unquantized model computes bit for bit what it did before. Which params are quantized is
the model's business (`jspec.models.transformer.quantize_params`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

WEIGHTS = ("int8",)  # what `weights=` accepts besides None (the stored float weights)
INT8_MAX = 127  # symmetric: -127 .. 127, so that negating a weight negates q exactly


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Weight:
  """A weight as int8 values and per-output-channel scales (module docstring).

  Both fields are pytree leaves, so slicing a leading layer axis off every leaf (a scan over
  stacked layers, the per-layer cut of the decoding form) slices both.
  """

  q: jax.Array  # int8, the weight's shape, e.g. [L, D, H, Dh]
  # The weight's dtype (the model computes in it), the weight's rank: the weight's shape
  # with 1 on each contracted axis, e.g. [L, 1, H, Dh].
  scale: jax.Array

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
    """The dtype the weight computes in (its scales'), not the storage dtype int8."""
    return self.scale.dtype


def check_weights(weights) -> str | None:
  """`weights` as given when it is None or one of `WEIGHTS`; ValueError naming them if not."""
  if weights is None or (isinstance(weights, str) and weights in WEIGHTS):
    return weights
  raise ValueError(f"weights must be None (the stored float weights) or one of "
                   f"{', '.join(repr(w) for w in WEIGHTS)}, got {weights!r}")


def quantize(w: jax.Array, axes) -> Int8Weight:
  """w quantized per output channel: `axes` are the axes a product contracts (module
  docstring); the scales are in w's dtype, as the model computes."""
  w = jnp.asarray(w)
  axes = tuple(int(a) % w.ndim for a in axes)
  if not jnp.issubdtype(w.dtype, jnp.floating):
    raise TypeError(f"quantize takes a floating-point weight, got {w.dtype}")
  w32 = w.astype(jnp.float32)
  absmax = jnp.max(jnp.abs(w32), axis=axes, keepdims=True)
  # An all-zero channel gets scale 1 (q = 0), not 0 / 0. The scale is rounded to w's
  # dtype before q is computed from it, so q * scale is what the model multiplies by:
  # a bf16 scale is within 2^-8 of absmax / 127, so |w / scale| stays below 127.5 and
  # no entry needs clipping (the clip guards against nothing but that arithmetic).
  scale = jnp.where(absmax > 0, absmax / INT8_MAX, 1.0).astype(w.dtype)
  q = jnp.clip(jnp.round(w32 / scale.astype(jnp.float32)), -INT8_MAX, INT8_MAX)
  return Int8Weight(q=q.astype(jnp.int8), scale=scale)


def dequantize(w):
  """q * scale in the weight's dtype; a plain array as it is."""
  if not isinstance(w, Int8Weight):
    return w
  return w.q.astype(w.scale.dtype) * w.scale


def is_quantized(tree) -> bool:
  """Whether any node of `tree` (params, a model's params) is an `Int8Weight`."""
  return any(isinstance(x, Int8Weight) for x in
             jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, Int8Weight)))


def _letters(eq: str) -> tuple[str, str, str]:
  inputs, out = eq.replace(" ", "").split("->")
  x, w = inputs.split(",")
  return x, w, out


def einsum(eq: str, x, w, **kwargs):
  """`jnp.einsum(eq, x, w, **kwargs)` for a plain weight; for an `Int8Weight`, the same
  product over q cast to x's dtype, scaled per output channel.

  eq names x then w and has an explicit output; the output must end with the weight's
  uncontracted axes in the weight's order (as every product of the reference decoder
  does: "btd,dhk->bthk", "btd,vd->btv", ...), so the scale broadcasts over its trailing
  axes. kwargs (preferred_element_type, precision) go to `jnp.einsum` unchanged.
  """
  if not isinstance(w, Int8Weight):
    return jnp.einsum(eq, x, w, **kwargs)
  _, w_spec, out_spec = _letters(eq)
  kept = "".join(a for a in w_spec if a in out_spec)
  if "." in eq or not out_spec.endswith(kept) or len(w_spec) != w.ndim:
    raise ValueError(f"quant.einsum {eq!r}: an int8 weight needs an explicit output that "
                     f"ends with the weight's uncontracted axes ({kept!r}) in its order")
  y = jnp.einsum(eq, x, w.q.astype(x.dtype), **kwargs)
  scale = w.scale.reshape(tuple(n for a, n in zip(w_spec, w.scale.shape) if a in out_spec))
  scale = scale.reshape((1,) * (y.ndim - scale.ndim) + scale.shape)
  return y * scale.astype(y.dtype)


def take(w, indices, axis: int = 0):
  """`jnp.take(w, indices, axis=axis)` for a plain weight; for an `Int8Weight` (scaled
  along `axis`: an embedding quantized per row) the rows of q, dequantized by their own
  scales: [V, D] at ids [B, T] -> [B, T, D] in the weight's dtype."""
  if not isinstance(w, Int8Weight):
    return jnp.take(w, indices, axis=axis)
  if w.scale.shape[axis] != w.q.shape[axis]:
    raise ValueError(f"quant.take along axis {axis}: the int8 weight's scales {w.scale.shape} "
                     f"are not per entry of that axis (weight {w.shape})")
  rows = jnp.take(w.q, indices, axis=axis).astype(w.scale.dtype)
  return rows * jnp.take(w.scale, indices, axis=axis)


def matrix(w):
  """w [Din, ...] as a [Din, prod(...)] matrix (an `Int8Weight`'s scale [1, ...] as
  [1, prod(...)]): how the decoding form fuses q, k and v into one product."""
  if not isinstance(w, Int8Weight):
    return w.reshape(w.shape[0], -1)
  return Int8Weight(q=w.q.reshape(w.q.shape[0], -1),
                    scale=w.scale.reshape(w.scale.shape[0], -1))


def concatenate(ws, axis: int):
  """`jnp.concatenate(ws, axis)` of plain weights; of `Int8Weight`s, q and scale each
  concatenated (`axis` must be an output axis, where every scale has full size)."""
  ws = list(ws)
  kinds = {isinstance(w, Int8Weight) for w in ws}
  if kinds == {False}:
    return jnp.concatenate(ws, axis=axis)
  if kinds != {True}:
    raise TypeError("quant.concatenate: int8 and float weights cannot be fused into one")
  return Int8Weight(q=jnp.concatenate([w.q for w in ws], axis=axis),
                    scale=jnp.concatenate([w.scale for w in ws], axis=axis))


def num_elements(tree) -> int:
  """Elements of every weight in `tree`, an `Int8Weight` counting as its weight's (its
  scales are not parameters)."""
  leaves = jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, Int8Weight))
  return int(sum(_size(x.q if isinstance(x, Int8Weight) else x) for x in leaves))


def num_bytes(tree) -> int:
  """Bytes of every array in `tree` as stored: an `Int8Weight`'s int8 values and scales."""
  return int(sum(_size(x) * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)))


def _size(x) -> int:
  size = 1
  for n in x.shape:
    size *= int(n)
  return size
