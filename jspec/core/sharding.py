"""Sharding: logical axis names, a rules table, and placement on a device mesh.

Every parameter and cache buffer dimension has a logical name (the model says
which, through `Model.axes_fn`). A `Rules` table maps logical names to mesh axes
(`data`, `model`); `NamedSharding`s follow, and `jax.jit` does the rest (the
current form of pjit). One device needs no mesh.

Presets:
  TENSOR_PARALLEL  heads, kv_heads, MLP and vocab over `model`
  DATA_PARALLEL    batch over `data`
  HYBRID           both

A dimension that the mesh axis does not divide is replicated instead. In
particular, when a model has fewer K/V heads than the `model` axis has devices
(GQA), K/V projections and the K/V cache are replicated across `model` while the
query heads stay split: every device then computes the K/V heads its query heads
need, at the cost of holding all K/V heads. The draft model (and drafter state)
is replicated unless the caller shards it with the same rules.

Multi-host: call `jax.distributed.initialize()` first in every process (TPU VMs
and pod slices need no arguments; on GPU clusters or CPU processes pass
`coordinator_address`, `num_processes` and `process_id`; on CPU also set
`jax.config.update("jax_cpu_collectives_implementation", "gloo")`). Build the mesh
over `jax.devices()` (all processes' devices) and give every process the same
prompts, settings and seed: inputs are placed from each process's identical host
copy, and outputs are gathered so that every process returns the same arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from jspec.core import quant

LOGICAL_AXES = ("batch", "sequence", "heads", "kv_heads", "embed", "mlp", "vocab", "layers",
                "head_dim")


@dataclasses.dataclass(frozen=True)
class Rules:
  """Logical axis name -> mesh axis name (or None: replicated)."""

  table: tuple[tuple[str, str | None], ...] = ()

  @classmethod
  def of(cls, **mapping: str | None) -> "Rules":
    """Rules from keywords, e.g. `Rules.of(batch="data", mlp="model")`; names must be
    in `LOGICAL_AXES`."""
    unknown = set(mapping) - set(LOGICAL_AXES)
    if unknown:
      raise ValueError(f"unknown logical axes {sorted(unknown)}; known: {LOGICAL_AXES}")
    return cls(tuple(sorted(mapping.items())))

  def mesh_axis(self, logical: str | None) -> str | None:
    """The mesh axis a logical axis maps to, or None (replicated)."""
    return dict(self.table).get(logical)


TENSOR_PARALLEL = Rules.of(heads="model", kv_heads="model", mlp="model", vocab="model")
DATA_PARALLEL = Rules.of(batch="data")
HYBRID = Rules.of(batch="data", heads="model", kv_heads="model", mlp="model", vocab="model")


@dataclasses.dataclass(frozen=True)
class Layout:
  """A mesh and the rules that place arrays on it. Hashable: usable as a static arg."""

  mesh: Mesh
  rules: Rules = HYBRID

  def spec(self, shape: tuple[int, ...], axes: tuple[str | None, ...]) -> PartitionSpec:
    """The `PartitionSpec` of an array of `shape` whose dims have logical names `axes`.

    A dim is replicated when its rule maps it nowhere, the mesh axis has size 1, the
    mesh axis is already used by an earlier dim, or the size does not divide it.
    """
    if len(axes) != len(shape):
      raise ValueError(f"logical axes {axes} do not match shape {shape}")
    used, out = set(), []
    for dim, logical in zip(shape, axes):
      axis = self.rules.mesh_axis(logical)
      size = self.mesh.shape.get(axis, 1) if axis else 1
      if axis is None or size == 1 or axis in used or dim % size:
        out.append(None)  # replicated: not mapped, trivial, reused, or not divisible
      else:
        used.add(axis)
        out.append(axis)
    return PartitionSpec(*out)

  def sharding(self, shape, axes) -> NamedSharding:
    """`NamedSharding` on this mesh for `spec(shape, axes)`."""
    return NamedSharding(self.mesh, self.spec(tuple(shape), tuple(axes)))

  def tree_shardings(self, tree, axes_tree):
    """NamedShardings for a pytree of arrays (or shapes) given a matching axes tree.

    A quantized weight (`jspec.core.quant.QuantWeight`) under one axes tuple gets it for its
    values, scales and offsets alike: the scales keep the weight's rank, size 1 where it
    was contracted (a size-1 axis is never split) or one entry per group of inputs."""
    def place(x, a):
      if isinstance(x, quant.QuantWeight):
        return quant.QuantWeight(
            q=self.sharding(x.q.shape, a), scale=self.sharding(x.scale.shape, a),
            offset=None if x.offset is None else self.sharding(x.offset.shape, a))
      return self.sharding(x.shape, a)

    return jax.tree_util.tree_map(place, tree, axes_tree,
                                  is_leaf=lambda a: isinstance(a, (tuple, quant.QuantWeight)))

  def batch(self, shape) -> NamedSharding:
    """Rows over the batch rule's mesh axis, every other dim replicated."""
    return self.sharding(shape, ("batch",) + (None,) * (len(shape) - 1))


def make_mesh(data: int = 1, model: int | None = None, devices=None) -> Mesh:
  """A (`data`, `model`) mesh over `devices` (default: all devices of all processes).

  `model` defaults to whatever `data` leaves. Axes are `Auto`: jit propagates
  shardings from the placed inputs.
  """
  devices = list(jax.devices() if devices is None else devices)
  if model is None:
    model = len(devices) // data
  if data * model != len(devices):
    raise ValueError(f"mesh {data} x {model} does not use the {len(devices)} devices given")
  return jax.make_mesh((data, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2,
                       devices=devices)


def as_layout(mesh: Mesh | Layout | None, rules: Rules | None) -> Layout | None:
  """Normalise the `mesh=` / `rules=` arguments into a `Layout` (None without a mesh).

  A `Layout` keeps its rules unless `rules` is given; a `Mesh` gets `rules` or
  HYBRID, and its axes are made `Auto`.
  """
  if mesh is None:
    if rules is not None:
      raise ValueError("rules= needs mesh=")
    return None
  if isinstance(mesh, Layout):
    return mesh if rules is None else dataclasses.replace(mesh, rules=rules)
  if not isinstance(mesh, Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh or jspec.core.sharding.Layout, got "
                    f"{type(mesh).__name__}")
  if any(t != AxisType.Auto for t in mesh.axis_types):  # jspec relies on propagation
    mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))
  return Layout(mesh, HYBRID if rules is None else rules)


def model_axes(model) -> tuple[Any, Any] | None:
  """(param axes tree, cache axes tree) of a model, or None if it declares none."""
  return None if model.axes_fn is None else model.axes_fn(model.config)


def shard_model(model, layout: Layout, replicate: bool = False):
  """The model with params placed by `layout` (all replicated if `replicate`)."""
  axes = model_axes(model)
  if replicate or axes is None:
    shardings = jax.tree_util.tree_map(lambda x: NamedSharding(layout.mesh, PartitionSpec()),
                                       model.params)
  else:
    shardings = layout.tree_shardings(model.params, axes[0])
  return dataclasses.replace(model, params=jax.device_put(model.params, shardings))


def constrain_cache(model, cache, layout: Layout | None):
  """Pin a cache created inside jit to the layout (no-op without one)."""
  axes = None if layout is None else model_axes(model)
  if axes is None or cache is None:
    return cache
  return jax.lax.with_sharding_constraint(cache, layout.tree_shardings(cache, axes[1]))


def put(array, sharding: NamedSharding):
  """Place a host array on a (possibly multi-process) sharding from each process's copy."""
  array = np.asarray(array)
  if sharding.is_fully_addressable:
    return jax.device_put(array, sharding)
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def fetch(array) -> np.ndarray:
  """The full value of a (possibly multi-process) array on every process."""
  if getattr(array, "is_fully_addressable", True):
    return np.asarray(array)
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def per_device_bytes(tree) -> dict:
  """Bytes each device holds of a pytree of arrays: {device: bytes}."""
  totals: dict = {}
  for leaf in jax.tree_util.tree_leaves(tree):
    for shard in leaf.addressable_shards:
      totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
  return totals
