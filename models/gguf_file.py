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


def _raw(file: GGUFFile, name: str) -> np.ndarray:
  """Tensor `name`'s bytes, one positioned read."""
  info = file.tensors[name]
  with open(file.path, "rb") as f:
    f.seek(info.offset)
    raw = np.frombuffer(f.read(info.n_bytes), np.uint8)
  if raw.size != info.n_bytes:
    raise GGUFFormatError(f"{file.path}: tensor {name} is truncated")
  return raw


def read_tensor(file: GGUFFile, name: str) -> np.ndarray:
  """Tensor `name` dequantised to f32, in NumPy (row-major) shape."""
  import gguf

  info = file.tensors[name]
  qtype = gguf.GGMLQuantizationType(info.type)
  raw = _raw(file, name)
  if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
    dtype = np.dtype(file.byte_order + ("f4" if qtype == gguf.GGMLQuantizationType.F32 else "f2"))
    return raw.view(dtype).astype(np.float32, copy=False).reshape(info.shape)
  block, type_size = gguf.GGML_QUANT_SIZES[qtype]
  # The package dequantises rows of whole blocks: [rows, bytes per row].
  rows = raw.reshape(-1, info.dims[0] // block * type_size)
  return np.asarray(gguf.quants.dequantize(rows, qtype), np.float32).reshape(info.shape)


# GGML types that load as quantized weights (`read_blocks`): name -> (inputs per scale,
# storage dtype of the values, value range). Each is w = scale * q (+ offset) over groups of
# consecutive inputs within a row; Q5's 5-bit and Q6_K's 6-bit values are held in int8. The
# other types (Q2_K, Q3_K, the IQ and ternary ones) are read dequantized.
KEPT = {"Q8_0": (32, "int8", (-128, 127)), "Q4_0": (32, "int4", (-8, 7)),
        "Q4_1": (32, "uint4", (0, 15)), "Q5_0": (32, "int8", (-16, 15)),
        "Q5_1": (32, "int8", (0, 31)), "Q4_K": (32, "uint4", (0, 15)),
        "Q5_K": (32, "int8", (0, 31)), "Q6_K": (16, "int8", (-32, 31))}


def kept(file: GGUFFile, name: str) -> bool:
  """Whether tensor `name` loads as a quantized weight (`read_blocks`): a matrix of one of
  the `KEPT` types in a little-endian file."""
  import gguf

  info = file.tensors[name]
  return (file.byte_order == "<" and len(info.dims) == 2
          and gguf.GGMLQuantizationType(info.type).name in KEPT)


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
  return np.ascontiguousarray(blocks[:, at:at + 2]).view("<f2").astype(np.float32)


def _block_scales(kind: str, blocks: np.ndarray):
  """(scale, offset or None), [blocks, groups per block] in f32, read from the blocks'
  headers ([blocks, bytes per block] uint8), as ggml's dequantisation computes them."""
  import gguf

  if kind in ("Q8_0", "Q4_0", "Q5_0"):  # d, then the values
    return _half(blocks, 0), None
  if kind in ("Q4_1", "Q5_1"):  # d, m: w = d q + m
    return _half(blocks, 0), _half(blocks, 2)
  if kind in ("Q4_K", "Q5_K"):  # d, dmin, 12 bytes of 6-bit scales and mins per 32 inputs
    sc, m = gguf.quants.Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
    return _half(blocks, 0) * sc.astype(np.float32), -(_half(blocks, 2) * m.astype(np.float32))
  if kind == "Q6_K":  # 128 + 64 bytes of values, 16 int8 scales per 16 inputs, then d
    sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    return _half(blocks, 208) * sc, None
  raise ValueError(f"no quantized form for GGML type {kind}")


def read_blocks(file: GGUFFile, name: str):
  """Tensor `name` (a `kept` one) as a `jspec.core.quant.QuantWeight` of NumPy arrays in
  NumPy (row-major) shape [out, in]: q [out, in] in the `KEPT` storage dtype, scale (and
  offset) [out, in / group] in f32.

  The scales and offsets are read from the blocks' headers; the values are the `gguf`
  package's dequantised weights solved for q (round((w - offset) / scale)), so the bit
  layouts of the types are the package's, and every q is checked to give back the
  package's weights (GGUFFormatError otherwise)."""
  import gguf
  import ml_dtypes

  from jspec.core import quant

  info = file.tensors[name]
  qtype = gguf.GGMLQuantizationType(info.type)
  group, storage, (lo, hi) = KEPT[qtype.name]
  block, type_size = gguf.GGML_QUANT_SIZES[qtype]
  raw = _raw(file, name)
  rows, width = info.shape
  w = np.asarray(gguf.quants.dequantize(raw.reshape(rows, -1), qtype), np.float32)
  scale, offset = _block_scales(qtype.name, raw.reshape(-1, type_size))
  scale = scale.reshape(rows, width // group)
  offset = None if offset is None else offset.reshape(rows, width // group)
  full = lambda x: np.repeat(x, group, axis=1)
  s = full(scale)
  shifted = w if offset is None else w - full(offset)
  q = np.where(s != 0, np.round(shifted / np.where(s != 0, s, 1)), 0)
  back = q * s if offset is None else q * s + full(offset)
  if not (np.all((q >= lo) & (q <= hi)) and np.allclose(back, w, rtol=1e-6, atol=1e-30)):
    raise GGUFFormatError(f"{file.path}: tensor {name} ({qtype.name}) does not decode into "
                          f"values in {lo}..{hi} times its block scales")
  dtype = {"int8": np.int8, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4}[storage]
  return quant.QuantWeight(q=q.astype(dtype), scale=scale, offset=offset)
