"""Named tensors of a published drafter directory, in and out, with clear errors.

Reading: safetensors files with jspec's own reader (`jspec.models.hf.SafetensorsFile`,
which names a truncated file and the tensor that runs past its end), a sharded
`*.safetensors.index.json`, or PyTorch pickles (`pytorch_model.bin`, `medusa_lm_head.pt`:
the formats EAGLE-1 and Medusa were published in), which need torch and are read with
`weights_only=True`. Every tensor is checked by name and shape against what the config
implies before a value is used: a missing or misshapen tensor is an error naming the file,
the tensor and both shapes.

Writing: one safetensors file (header JSON, then the raw little-endian data; bf16 through
ml_dtypes), and a PyTorch pickle beside it when torch is importable, for reference code
that reads only those.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterable

import numpy as np

from jspec.models.hf import CheckpointError, SafetensorsFile


class Tensors:
  """The tensors of one drafter directory: names, shapes, and reads by name."""

  def __init__(self, shapes: dict[str, tuple[int, ...]], read: Callable[[str], np.ndarray],
               where: Callable[[str], str], origin: str):
    self.shapes = shapes  # name -> shape, from the headers alone
    self._read = read
    self.where = where  # name -> the file holding it, for messages
    self.origin = origin

  @property
  def names(self) -> frozenset:
    """The tensor names held."""
    return frozenset(self.shapes)

  def get(self, name: str, shape: tuple[int, ...] | None = None, what: str = "") -> np.ndarray:
    """Tensor `name` (checked to have `shape` when given) as a NumPy array."""
    if name not in self.shapes:
      raise CheckpointError(f"{self.origin}: tensor {name} is missing{what}")
    if shape is not None:
      self.check(name, shape, what)
    return np.asarray(self._read(name))

  def check(self, name: str, shape: tuple[int, ...], what: str = "") -> None:
    """Raise naming the file, the tensor and both shapes unless `name` has `shape`
    (`what`: where the wanted shape comes from)."""
    got = tuple(self.shapes[name])
    if got != tuple(shape):
      raise CheckpointError(f"{self.where(name)}: tensor {name} has shape {got}, but "
                            f"{what or 'the config'} gives {tuple(shape)}")


def _safetensors(files: Iterable[str], origin: str) -> Tensors:
  readers = {}
  owner = {}
  for file in files:
    reader = SafetensorsFile(file)  # checks the header and every tensor's extent
    readers[file] = reader
    for name in reader.tensors:
      owner[name] = file
  shapes = {name: tuple(readers[f].tensors[name]["shape"]) for name, f in owner.items()}
  return Tensors(shapes, lambda n: readers[owner[n]].read(n), owner.get, origin)


def _torch_file(file: str, origin: str) -> Tensors:
  try:
    import torch
  except ImportError:
    raise CheckpointError(f"{file} is a PyTorch pickle, which needs torch to read; install "
                          f"torch or convert the file to safetensors") from None
  try:
    state = torch.load(file, map_location="cpu", weights_only=True)
  except Exception as e:  # noqa: BLE001 (torch raises many types for damaged files)
    raise CheckpointError(f"{file} is not a readable PyTorch state dict (truncated or "
                          f"corrupt?): {e}") from None
  if not isinstance(state, dict):
    raise CheckpointError(f"{file} holds a {type(state).__name__}, not a state dict")

  def read(name):
    t = state[name]
    if t.dtype == torch.bfloat16:
      t = t.float()
    return t.detach().cpu().numpy()

  shapes = {k: tuple(v.shape) for k, v in state.items() if hasattr(v, "shape")}
  return Tensors(shapes, read, lambda n: file, origin)


def open_tensors(path: str, stems: tuple[str, ...] = ("model",)) -> Tensors:
  """The tensors of directory `path`: `<stem>.safetensors`, `<stem>.safetensors.index.json`
  or a PyTorch pickle (`pytorch_model.bin`, `<stem>.pt`, `<stem>.bin`), the first found."""
  for stem in stems:
    single = os.path.join(path, f"{stem}.safetensors")
    index = single + ".index.json"
    if os.path.isfile(single):
      return _safetensors([single], path)
    if os.path.isfile(index):
      try:
        with open(index) as f:
          weight_map = json.load(f)["weight_map"]
      except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index} is not a safetensors index: {e}") from None
      return _safetensors(sorted({os.path.join(path, v) for v in weight_map.values()}), path)
  for name in ("pytorch_model.bin",) + tuple(f"{s}.{e}" for s in stems for e in ("pt", "bin")):
    file = os.path.join(path, name)
    if os.path.isfile(file):
      return _torch_file(file, path)
  wanted = ", ".join([f"{s}.safetensors" for s in stems] + ["pytorch_model.bin"]
                     + [f"{s}.pt" for s in stems if s != "model"])
  raise FileNotFoundError(f"{path} has no weights file ({wanted})")


# ----------------------------------------------------------------------------- writing

_CODES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64",
          np.dtype(np.int32): "I32", np.dtype(np.bool_): "BOOL"}


def _code(dtype) -> str:
  dtype = np.dtype(dtype)
  if dtype in _CODES:
    return _CODES[dtype]
  if dtype.name == "bfloat16":
    return "BF16"
  raise ValueError(f"cannot write dtype {dtype} to safetensors")


def write_safetensors(file: str, tensors: dict[str, np.ndarray]) -> None:
  """Write `tensors` (name -> NumPy array, C order) as one safetensors file, atomically."""
  header, offset, blobs = {}, 0, []
  for name in sorted(tensors):
    x = np.ascontiguousarray(tensors[name])
    data = x.astype(x.dtype.newbyteorder("<"), copy=False).tobytes()
    header[name] = {"dtype": _code(x.dtype), "shape": list(x.shape),
                    "data_offsets": [offset, offset + len(data)]}
    blobs.append(data)
    offset += len(data)
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
  tmp = file + ".tmp"
  with open(tmp, "wb") as f:
    f.write(len(text).to_bytes(8, "little"))
    f.write(text)
    for blob in blobs:
      f.write(blob)
  os.replace(tmp, file)


def write_torch(file: str, tensors: dict[str, np.ndarray]) -> bool:
  """Write `tensors` as a PyTorch state dict when torch is importable; False otherwise."""
  try:
    import torch
  except ImportError:
    return False
  state = {}
  for name, x in tensors.items():
    x = np.asarray(x)
    if x.dtype.name == "bfloat16":
      state[name] = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    else:
      state[name] = torch.from_numpy(np.array(x))
  torch.save(state, file)
  return True


def write_config(path: str, config: dict) -> None:
  """config.json, written last: a directory without it is an interrupted export."""
  tmp = os.path.join(path, "config.json.tmp")
  with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
  os.replace(tmp, os.path.join(path, "config.json"))


def new_dir(path: str) -> str:
  """`path` as an absolute, new or empty directory."""
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  if os.path.exists(path) and (not os.path.isdir(path) or os.listdir(path)):
    raise FileExistsError(f"{path} exists and is not an empty directory; export into a new one")
  os.makedirs(path, exist_ok=True)
  return path


def fits_target(where: str, hidden: int, vocab: int, target) -> None:
  """Raise CheckpointError naming `where` when a drafter of hidden size `hidden` and
  vocabulary `vocab` does not fit `target` (both sizes given)."""
  V, D = target.head().embed.shape
  if hidden != D:
    raise CheckpointError(f"{where}: hidden size {hidden}, but the target's is {D}")
  if vocab != V:
    raise CheckpointError(f"{where}: vocabulary size {vocab}, but the target's is {V}")


def as_arrays(tree, dtype=None):
  """A nested dict of arrays as jax arrays, floating point or not cast to `dtype` (None keeps
  each array's dtype)."""
  import jax.numpy as jnp

  if isinstance(tree, dict):
    return {k: as_arrays(v, dtype) for k, v in tree.items()}
  return jnp.asarray(tree) if dtype is None else jnp.asarray(tree, dtype)
