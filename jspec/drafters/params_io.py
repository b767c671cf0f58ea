"""One on-disk form for drafters' params (Medusa heads, EAGLE heads): a directory holding
an orbax array folder and a JSON config file written last.

    path/
      <arrays>/            orbax StandardCheckpointer output
      <config>.json        {"format", "version", ...}: written after the arrays, so a
                           directory without it is an interrupted save and never loads

Loading checks everything it can before reading an array: the directory and the config
(format, version), the stored tensors' names and shapes against the shapes the config
implies, then restores with floating-point arrays cast to the asked dtype. Each failure
is a clear error naming the file; nothing is silently dropped or padded.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp


def read_format_file(config_path: str, fmt: str, version: int, what: str) -> dict:
  """A jspec JSON config file (checkpoint, Medusa heads, EAGLE head), checked: valid
  JSON, a dict, the expected `format` name and `version`."""
  try:
    with open(config_path) as f:
      meta = json.load(f)
  except ValueError as e:
    raise ValueError(f"{config_path} is not valid JSON (truncated?): {e}") from e
  if not isinstance(meta, dict) or meta.get("format") != fmt:
    raise ValueError(f"{config_path} is not {what} (format {fmt!r})")
  if meta.get("version") != version:
    raise ValueError(f"{config_path}: format version {meta.get('version')!r} is not supported "
                     f"(this jspec reads version {version})")
  return meta


def stored_tensors(directory: str, what: str = "params") -> dict[str, tuple[tuple[int, ...], Any]]:
  """{leaf path: (shape, dtype)} of an orbax directory, read from its metadata alone.

  Clear errors for a missing directory (an interrupted save), unreadable metadata
  and an empty listing (orbax logs a warning and returns an empty tree)."""
  import orbax.checkpoint as ocp

  if not os.path.isdir(directory):
    raise FileNotFoundError(f"{directory}: {what} directory missing (an interrupted save?)")
  unreadable = f"cannot read {what} metadata in {directory} (missing or corrupt files?)"
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      stored = _leaf_metadata(checkpointer.metadata(directory))
  except Exception as e:
    raise ValueError(f"{unreadable}: {e}") from e
  if not stored:
    raise ValueError(f"{unreadable}: no tensors listed")
  return stored


def _leaf_metadata(metadata) -> dict[str, tuple[tuple[int, ...], Any]]:
  """{key path: (shape, dtype)} of the stored params, from orbax metadata
  (a StepMetadata / TreeMetadata in recent orbax, the bare tree in older)."""
  tree = getattr(metadata, "item_metadata", metadata)
  tree = getattr(tree, "tree", tree)
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: hasattr(x, "shape") and hasattr(x, "dtype"))[0]
  return {jax.tree_util.keystr(p): (tuple(x.shape), jnp.dtype(x.dtype)) for p, x in leaves}


def absolute(path) -> str:
  """An absolute path (orbax misreads relative ones)."""
  return os.path.abspath(os.path.expanduser(os.fspath(path)))


def save_dir(path, arrays: str, tree, config_file: str, config: dict) -> None:
  """Write `tree` (arrays) into path/arrays and `config` into path/config_file, last.

  `path` must be new or an empty directory. The config is serialised before anything
  is written, so a config that is not JSON-ready leaves no trace on disk.
  """
  import orbax.checkpoint as ocp

  text = json.dumps(config, indent=2)
  path = absolute(path)
  if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
    raise FileExistsError(f"{path} exists and is not an empty directory; save into a new one")
  os.makedirs(path, exist_ok=True)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(path, arrays), jax.tree_util.tree_map(jnp.asarray, tree))
  tmp = os.path.join(path, config_file + ".tmp")
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, os.path.join(path, config_file))


def open_dir(path, config_file: str, fmt: str, version: int, what: str) -> tuple[str, dict]:
  """(absolute path, the checked config dict) of a directory written by `save_dir`.

  what: the kind of directory, for messages (e.g. "Medusa heads", "EAGLE head").
  """
  path = absolute(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"no {what} directory {path}")
  config_path = os.path.join(path, config_file)
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f"{path} has no {config_file}: not a {what} directory "
                            f"(or an interrupted save)")
  return path, read_format_file(config_path, fmt, version, f"a {what} config")


def check_stored(want: dict, stored: dict, arrays_dir: str, what: str, source: str) -> None:
  """Raise unless the stored tensors ({key path: (shape, dtype)}) are exactly `want`
  ({key path: shape}) by name and shape."""
  missing, extra = sorted(set(want) - set(stored)), sorted(set(stored) - set(want))
  if missing or extra:
    raise ValueError(f"{what} in {arrays_dir} do not match {source}: missing tensors "
                     f"{missing}, unexpected tensors {extra}")
  for key, shape in want.items():
    if stored[key][0] != shape:
      raise ValueError(f"{what} tensor {key} in {arrays_dir} has shape {stored[key][0]}, but "
                       f"{source} gives {shape}")


def restore_checked(arrays_dir: str, shapes, dtype, what: str, source: str) -> Any:
  """The tree stored in `arrays_dir`, checked against `shapes` (a pytree of shape tuples)
  before any array is read, floating-point leaves cast to `dtype` (None keeps them).

  what: the stored thing, for messages ("heads", "params"); source: what the shapes
  come from (e.g. "medusa_config.json (num_heads 3, hidden_size 32)").
  """
  import orbax.checkpoint as ocp

  stored = stored_tensors(arrays_dir, what)
  is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
  flat = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_shape)[0]
  want = {jax.tree_util.keystr(p): tuple(s) for p, s in flat}
  check_stored(want, stored, arrays_dir, what, source)
  cast = None if dtype is None else jnp.dtype(dtype)
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def abstract(key_path, shape):
    stored_dtype = stored[jax.tree_util.keystr(key_path)][1]
    dt = cast if cast is not None and jnp.issubdtype(stored_dtype, jnp.floating) else stored_dtype
    return jax.ShapeDtypeStruct(tuple(shape), dt, sharding=one)

  target = jax.tree_util.tree_map_with_path(abstract, shapes, is_leaf=is_shape)
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      return checkpointer.restore(arrays_dir, target)
  except Exception as e:  # orbax raises many types for damaged files  # noqa: BLE001
    raise ValueError(f"cannot read {what} from {arrays_dir} (truncated or corrupt files?): "
                     f"{e}") from e
