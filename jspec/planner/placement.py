"""Where a call's arrays live: the models and the rows on one device, or on a mesh.

On one device the rows become device arrays and the models stay as they are. On a
mesh (`jspec.core.sharding.Layout`) the target is split by the layout's rules, the
models a drafter runs (`ModelDrafter`) are replicated unless already placed there,
and every per-row array is split over the batch; the constraint table is replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jspec.core import constrained, sharding
from jspec.core.drafter import ModelDrafter
from jspec.core.model import Model
from jspec.core.sampling import SamplingParams
from jspec.planner.inputs import Request


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Rows:
  """A call's per-row inputs as device arrays, as the programs take them."""

  tokens: jax.Array  # [B, P] int32
  lengths: jax.Array  # [B] int32
  max_new: jax.Array  # [B] int32
  seeds: jax.Array  # [B] int32
  eos_ids: jax.Array  # [E] int32
  params: SamplingParams | None  # per-row settings; None: every row greedy (static)
  constraint: constrained.ConstraintRows | None  # the automaton and each row's state


def placed_model(model: Model, layout: sharding.Layout, replicate: bool) -> Model:
  """The model on the layout's mesh: kept as is when already placed there."""
  leaves = jax.tree_util.tree_leaves(model.params)
  on_mesh = all(isinstance(x.sharding, jax.sharding.NamedSharding)
                and x.sharding.mesh.devices.tolist() == layout.mesh.devices.tolist()
                for x in leaves if isinstance(x, jax.Array))
  return model if on_mesh else sharding.shard_model(model, layout, replicate=replicate)


def place(target: Model, drafter: Any, request: Request, constraint,
          layout: sharding.Layout | None) -> tuple[Model, Any, Rows]:
  """(target, drafter, rows) placed for `layout` (None: one device)."""
  B = request.batch
  table = initial = None
  if constraint is not None:  # checked and stacked on the host, placed like the rows
    table, initial = constrained.for_batch(constraint, B, target.vocab_size)
  per_row = [request.tokens, request.lengths, request.max_new, request.seeds]
  settings = [] if request.greedy else [request.temperature, request.top_k, request.top_p,
                                        request.min_p]
  if layout is None:
    put_row = put_all = jnp.asarray
  else:
    target = placed_model(target, layout, replicate=False)
    if isinstance(drafter, ModelDrafter):
      drafter = drafter.with_models(tuple(placed_model(m, layout, replicate=True)
                                          for m in drafter.models()))
    put_row = lambda x: sharding.put(x, layout.batch(x.shape))
    put_all = lambda x: sharding.put(x, layout.sharding(x.shape, (None,) * x.ndim))
  tokens, lengths, max_new, seeds = [put_row(x) for x in per_row]
  params = None
  if settings:
    temperature, top_k, top_p, min_p = [put_row(x) for x in settings]
    penalties = {}
    if request.penalized:  # static: the loop counts tokens only when some row needs them
      penalties = dict(repetition_penalty=put_row(request.repetition_penalty),
                       presence_penalty=put_row(request.presence_penalty),
                       frequency_penalty=put_row(request.frequency_penalty))
    bias = None if request.logit_bias is None else put_row(request.logit_bias)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            logit_bias=bias, **penalties)
  rows_constraint = None
  if table is not None:
    rows_constraint = constrained.ConstraintRows(table=jax.tree_util.tree_map(put_all, table),
                                                 state=put_row(initial))
  rows = Rows(tokens=tokens, lengths=lengths, max_new=max_new, seeds=seeds,
              eos_ids=put_all(request.eos_ids), params=params, constraint=rows_constraint)
  return target, drafter, rows


def gathered(layout: sharding.Layout | None, tree):
  """`tree` with every array whole in this process (multi-host runs split the batch
  over processes; every process gets all of it)."""
  leaves = [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)]
  if layout is None or all(x.is_fully_addressable for x in leaves):
    return tree
  return jax.tree_util.tree_map(lambda x: jnp.asarray(sharding.fetch(x)), tree)
