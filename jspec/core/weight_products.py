"""How a model call's cost grows with the tokens it carries, from its weight products
alone: the part of the cost prior that bytes and FLOPs get wrong on a CPU.

`jspec.core.cost_model` prices a call on r rows from the device's bandwidth and a
compute rate probed on one stack of square-ish matrices. On a small CPU that probe
misjudges a real model: whether XLA runs a product over 2-7 rows near the streaming
speed or several times slower depends on each matrix's shape and which axis is
contracted. On SmolLM2-135M (2-core CPU) a call on 2 tokens costs ~1.7x one on 1
token, where the probe predicted 1.4x; the schedule then drafted rounds that did not
pay for themselves and `"auto"` ran at 0.83-0.90x of plain decoding on text that
n-gram lookup cannot guess.

So the prior takes the *growth* of a call's cost with its block length from the
model itself: trace the call once per block length (no compile), keep every
`dot_general` one of whose operands is a weight (a leaf of the params, possibly cast),
and time just those products, on the model's own weights, in one small program:

    growth(T) = products(B, T) / products(B, 1)

The skeleton leaves out attention, norms and the loop; `cost_model.call_time`
scales its bandwidth-and-FLOPs estimate of a one-token call by growth(T). Measured
at T = 1, 2 and the largest block; between 2 and the largest, interpolated in
log T (a call's cost grows steeply from 1 to 2 tokens and slowly after). Kept in
`<cache_dir>/products.json` under the machine, the model's shapes and the batch, so
one machine measures one model once (SmolLM2-135M: about 4 s).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from jspec.core import cost_model

# Below this fraction of the weights' parameters reached by the products found (a
# model that reshapes or dequantises its weights inside the call), no growth is
# measured and the prior keeps its bandwidth-and-FLOPs curve.
MIN_COVERAGE = 0.5
VERSION = 1  # part of the cache key: bump when what is timed changes


@dataclasses.dataclass(frozen=True)
class Product:
  """One weight product of a call: `dot_general(w, x)` or `dot_general(x, w)`."""

  leaf: int  # index of the weight among the params' leaves
  weight_first: bool  # the weight is the left operand
  dimension_numbers: Any
  activation: jax.ShapeDtypeStruct  # the other operand
  preferred: Any  # preferred_element_type of the product (None: the operands')


def _inner_jaxprs(params: dict):
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jcore.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jcore.Jaxpr):
        yield item


def weight_products(model, batch: int, block: int, cache_length: int) -> list[Product]:
  """The weight products of one cached call of `model` on `block` tokens per row.

  Traced with abstract inputs, not compiled. A weight stays a weight through casts
  and into nested jaxprs (jit, custom_jvp) whose inputs it feeds."""
  leaves, treedef = jax.tree_util.tree_flatten(model.params)
  cache = jax.eval_shape(lambda: model.init_cache(batch, cache_length))

  def call(leaves, tokens, cache, start):
    params = jax.tree_util.tree_unflatten(treedef, leaves)
    return model.apply_fn(model.config, params, tokens, cache, start)

  closed = jax.make_jaxpr(call)(
      [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves],
      jax.ShapeDtypeStruct((batch, block), jnp.int32), cache,
      jax.ShapeDtypeStruct((batch,), jnp.int32))
  found: list[Product] = []

  def walk(jaxpr, weights: dict):
    for eq in jaxpr.eqns:
      ins = [v if isinstance(v, jcore.Var) else None for v in eq.invars]
      if eq.primitive.name == "dot_general":
        for first in (False, True):  # a weight on the right is the usual form
          w, x = (ins[0], eq.invars[1]) if first else (ins[1], eq.invars[0])
          if w is not None and w in weights:
            found.append(Product(weights[w], first, eq.params["dimension_numbers"],
                                 jax.ShapeDtypeStruct(x.aval.shape, x.aval.dtype),
                                 eq.params.get("preferred_element_type")))
            break
      elif eq.primitive.name == "convert_element_type" and ins[0] in weights:
        weights[eq.outvars[0]] = weights[ins[0]]
      for inner in _inner_jaxprs(eq.params):
        if len(inner.invars) == len(ins):
          walk(inner, {iv: weights[v] for iv, v in zip(inner.invars, ins)
                       if v is not None and v in weights})

  walk(closed.jaxpr, {v: i for i, v in enumerate(closed.jaxpr.invars[:len(leaves)])})
  return found


def coverage(model, products: list[Product]) -> float:
  """The fraction of the params' elements that some product reads."""
  leaves = jax.tree_util.tree_leaves(model.params)
  total = sum(int(np.prod(x.shape)) for x in leaves)
  used = sum(int(np.prod(leaves[i].shape)) for i in {p.leaf for p in products})
  return used / max(total, 1)


def products_time(model, products: list[Product], repeats: int = 5) -> float:
  """Seconds for the products on the model's own weights (their own values, so
  they stream from memory as in a call), fastest of `repeats` after a compile."""
  leaves = jax.tree_util.tree_leaves(model.params)
  used = sorted({p.leaf for p in products})
  slot = {leaf: i for i, leaf in enumerate(used)}

  @jax.jit
  def run(weights, xs):
    total = jnp.zeros((), jnp.float32)
    for p, x in zip(products, xs):
      w = weights[slot[p.leaf]].astype(x.dtype)  # as a cast weight is used
      y = lax.dot_general(*((w, x) if p.weight_first else (x, w)), p.dimension_numbers,
                          preferred_element_type=p.preferred)
      total = total + y.reshape(-1)[0].astype(jnp.float32)  # keeps every product live
    return total

  weights = [leaves[i] for i in used]
  xs = [jnp.full(p.activation.shape, 0.01, p.activation.dtype) for p in products]
  return cost_model._best_time(run, weights, xs, repeats=repeats)


def _times(model, batch: int, blocks, cache_length: int, cache_dir: str | None):
  """{T: seconds of the weight products of a call on T tokens} for each T in `blocks`, or
  None when they cover too little of the model. Reads and extends
  `<cache_dir>/products.json`; measures only what it lacks."""
  path = cost_model.cache_path(cache_dir, "products.json")
  table = cost_model.read_table(path)
  base = [cost_model.machine(), cost_model._fingerprint(model), batch, VERSION]
  times, new = {}, False
  for t in blocks:
    key = json.dumps(base + [t])
    if key not in table:
      products = weight_products(model, batch, t, cache_length)
      if not products or coverage(model, products) < MIN_COVERAGE:
        table[key] = None
      else:
        table[key] = products_time(model, products)
      new = True
    times[t] = table[key]
  if new:
    cost_model.write_table(path, table)
  return None if any(v is None for v in times.values()) else times


def growth(model, batch: int, blocks, cache_length: int,
           cache_dir: str | None = None) -> dict[int, float] | None:
  """{T: cost of a call on T tokens / on 1 token} for each T in `blocks`, from the
  weight products (module docstring); None when they cover too little of the model."""
  blocks = sorted({int(t) for t in blocks} | {1})
  measured = sorted({1, min(2, blocks[-1]), blocks[-1]})
  times = _times(model, batch, measured, cache_length, cache_dir)
  if times is None:
    return None
  known_t = np.log(np.asarray(measured[1:], np.float64))
  known_v = np.asarray([times[t] for t in measured[1:]], np.float64)
  out = {1: 1.0}
  for t in blocks[1:]:
    value = float(np.interp(np.log(t), known_t, known_v))
    out[t] = max(value / times[1], 1.0)  # more tokens never cost less
  return out


def step_ratio(model, reference, batch: int, cache_length: int,
               cache_dir: str | None = None) -> float | None:
  """A one-token call of `model` (a draft model) over one of `reference` (its target),
  from their weight products timed alike; None when either's products miss its weights.

  The bandwidth-and-FLOPs prior prices a small model by its bytes, but a call also
  pays per operation, and the smaller the model the larger that share: the shipped
  1.5M-parameter draft streams 0.28 of its 5.3M target's bytes, and its step costs
  about 0.4 of the target's on a 2-core CPU."""
  mine = _times(model, batch, [1], cache_length, cache_dir)
  theirs = _times(reference, batch, [1], cache_length, cache_dir)
  if mine is None or theirs is None:
    return None
  return float(mine[1] / theirs[1])
