"""The GGUF container: header, metadata and tensor table read directly, tensors one at a time.

Layout of a GGUF file (llama.cpp's format, version 2 or 3, little- or big-endian):

    "GGUF"  version u32  n_tensors u64  n_kv u64
    n_kv x      key (string), value type u32, value
    n_tensors x name (string), n_dims u32, dims u64 x n_dims (fastest axis first),
                type u32 (GGMLQuantizationType), offset u64 (from the data start)
    padding to `general.alignment` (default 32), then the tensor data

Why not `gguf.GGUFReader`: it parses every metadata array into NumPy pieces (a
49k-token vocabulary and its merges cost 3.8 s and 170 MB here) and memory-maps
the whole file, whose touched pages then count against the loading process. This
reads the header once with plain unpacking and each tensor with one positioned
read, so loading holds one tensor's bytes at a time. Dequantisation is the `gguf`
package's (`gguf.quants.dequantize`), the reference implementation in Python.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct

import numpy as np

# GGUF value types: NumPy dtype codes by type id; 7 is bool, 8 string, 9 array.
_NUMBERS = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 7: "u1", 10: "u8",
            11: "i8", 12: "f8"}
DEFAULT_ALIGNMENT = 32


class GGUFFormatError(ValueError):
  """A file that is not a readable GGUF: the message names the file and the cause."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """One entry of the tensor table."""

  name: str
  dims: tuple[int, ...]  # GGML order: fastest-varying axis first
  type: int  # GGMLQuantizationType value
  offset: int  # absolute byte offset in the file
  n_bytes: int

  @property
  def shape(self) -> tuple[int, ...]:
    """NumPy (row-major) shape: the dims reversed."""
    return tuple(reversed(self.dims))


@dataclasses.dataclass(frozen=True)
class GGUFFile:
  """A parsed GGUF header: `metadata` {key: value} and `tensors` {name: TensorInfo}."""

  path: str
  metadata: dict
  tensors: dict
  byte_order: str

  def get(self, key: str, default=None):
    """A metadata value (strings decoded, arrays as lists), or `default`."""
    return self.metadata.get(key, default)


def read_header(path, tensors: bool = True) -> GGUFFile:
  """Parse `path`'s header (metadata, and the tensor table unless `tensors=False`).

  Raises GGUFFormatError naming the file for a foreign, truncated or corrupt file,
  including a tensor whose data would run past the end of the file.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no GGUF file {path}")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    magic = f.read(4)
    if magic != b"GGUF":
      raise GGUFFormatError(f"{path} is not a GGUF file (it starts with {magic!r}, not "
                            f"b'GGUF')")
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  with buf:
    try:
      return _parse(path, buf, size, tensors)
    except (struct.error, ValueError, UnicodeDecodeError, KeyError, IndexError) as e:
      if isinstance(e, GGUFFormatError):
        raise
      raise GGUFFormatError(f"cannot read {path} (truncated or corrupt GGUF?): "
                            f"{type(e).__name__}: {e}") from None


def _parse(path, buf, size, with_tensors) -> GGUFFile:
  pos = 24
  # A big-endian file's version reads as a huge number little-endian.
  order = "<" if struct.unpack_from("<I", buf, 4)[0] < 0x10000 else ">"
  version, n_tensors, n_kv = struct.unpack_from(order + "IQQ", buf, 4)
  if version < 2:
    raise GGUFFormatError(f"{path}: GGUF version {version} is too old; 2 or later is needed")

  def take(fmt):
    nonlocal pos
    (v,) = struct.unpack_from(order + fmt, buf, pos)
    pos += struct.calcsize(order + fmt)
    return v

  def numbers(kind, n):
    nonlocal pos
    dtype = np.dtype(order + _NUMBERS[kind])
    if pos + n * dtype.itemsize > size:
      raise ValueError("metadata runs past the end of the file")
    values = np.frombuffer(buf, dtype, n, pos).tolist()
    pos += n * dtype.itemsize
    return [bool(v) for v in values] if kind == 7 else values

  def string():
    nonlocal pos
    n = take("Q")
    if pos + n > size:
      raise ValueError("a string runs past the end of the file")
    pos += n
    return buf[pos - n:pos].decode()

  def value(kind):
    if kind == 8:
      return string()
    if kind == 9:
      item, n = take("I"), take("Q")
      return [value(item) for _ in range(n)] if item in (8, 9) else numbers(item, n)
    return numbers(kind, 1)[0]

  metadata = {}
  for _ in range(n_kv):
    key = string()
    metadata[key] = value(take("I"))
  tensors = {}
  if with_tensors:
    import gguf

    table = []
    for _ in range(n_tensors):
      name = string()
      dims = tuple(take("Q") for _ in range(take("I")))
      table.append((name, dims, take("I"), take("Q")))
    align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-pos // align) * align
    for name, dims, kind, offset in table:
      try:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
      except ValueError:
        raise GGUFFormatError(f"{path}: tensor {name} has unknown type id {kind}") from None
      n_bytes = int(np.prod(dims, dtype=np.int64)) // block * type_size
      info = TensorInfo(name, dims, kind, start + offset, n_bytes)
      if info.offset + n_bytes > size:
        raise GGUFFormatError(f"{path} is truncated: tensor {name} ends at byte "
                              f"{info.offset + n_bytes}, the file has {size}")
      tensors[name] = info
  return GGUFFile(path=path, metadata=metadata, tensors=tensors, byte_order=order)


def read_tensor(file: GGUFFile, name: str) -> np.ndarray:
  """Tensor `name` dequantised to f32, in NumPy (row-major) shape."""
  import gguf

  info = file.tensors[name]
  qtype = gguf.GGMLQuantizationType(info.type)
  with open(file.path, "rb") as f:
    f.seek(info.offset)
    raw = np.frombuffer(f.read(info.n_bytes), np.uint8)
  if raw.size != info.n_bytes:
    raise GGUFFormatError(f"{file.path}: tensor {name} is truncated")
  if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
    dtype = np.dtype(file.byte_order + ("f4" if qtype == gguf.GGMLQuantizationType.F32 else "f2"))
    return raw.view(dtype).astype(np.float32, copy=False).reshape(info.shape)
  block, type_size = gguf.GGML_QUANT_SIZES[qtype]
  # The package dequantises rows of whole blocks: [rows, bytes per row].
  rows = raw.reshape(-1, info.dims[0] // block * type_size)
  return np.asarray(gguf.quants.dequantize(rows, qtype), np.float32).reshape(info.shape)
