"""The code corpus every Python installation carries: its own standard library.

Files are read in a fixed order (sorted relative paths) and split into train and
held-out by a hash of the relative path, so the split does not depend on the
order files are found, on the machine, or on which other files exist:

    held out  <=>  sha256(relative path) mod 1000 < 1000 * heldout_fraction

Documents are joined into one token stream with an end-of-text id between them;
training windows are cut from the stream at random (seeded) offsets.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import sysconfig

import numpy as np

EOT = "<|endoftext|>"
HELDOUT_FRACTION = 0.06
_SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")


@dataclasses.dataclass(frozen=True)
class Document:
  """One source file of the corpus."""

  path: str  # relative to the library root, '/'-separated
  text: str


@dataclasses.dataclass(frozen=True)
class Corpus:
  """The corpus split into train and held-out documents (each in sorted path order)."""

  root: str
  train: tuple[Document, ...]
  heldout: tuple[Document, ...]

  def describe(self) -> dict:
    """What a manifest records: where the text came from and how big it is."""
    return {
        "source": "CPython standard library .py files",
        "python": sys.version.split()[0],
        "train_files": len(self.train),
        "heldout_files": len(self.heldout),
        "train_chars": sum(len(d.text) for d in self.train),
        "heldout_chars": sum(len(d.text) for d in self.heldout),
        "heldout_fraction": HELDOUT_FRACTION,
        "fingerprint": fingerprint(self.train + self.heldout),
    }


def stdlib_root() -> str:
  """The running interpreter's standard library directory."""
  root = sysconfig.get_paths()["stdlib"]
  if not os.path.isdir(root):
    raise FileNotFoundError(f"standard library directory {root} not found")
  return root


def is_heldout(relpath: str, fraction: float = HELDOUT_FRACTION) -> bool:
  """Whether the file at `relpath` ('/'-separated) is held out: a function of the path alone."""
  digest = hashlib.sha256(relpath.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") % 1000 < round(1000 * fraction)


def list_files(root: str) -> list[str]:
  """Relative paths of the .py files under root, sorted (third-party dirs skipped)."""
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    for name in filenames:
      if name.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, name), root)
        found.append(rel.replace(os.sep, "/"))
  return sorted(found)


def load_corpus(root: str | None = None, fraction: float = HELDOUT_FRACTION) -> Corpus:
  """Read every .py file under root (default: the stdlib) and split it.

  Files that are not valid UTF-8 (a few test fixtures are deliberately broken)
  are skipped, the same ones on every run.
  """
  root = stdlib_root() if root is None else root
  train, heldout = [], []
  for rel in list_files(root):
    with open(os.path.join(root, rel), "rb") as f:
      raw = f.read()
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError:
      continue
    if not text.strip():
      continue
    (heldout if is_heldout(rel, fraction) else train).append(Document(rel, text))
  if not train or not heldout:
    raise ValueError(f"{root}: found {len(train)} train and {len(heldout)} held-out files; "
                     f"need both")
  return Corpus(root=root, train=tuple(train), heldout=tuple(heldout))


def fingerprint(docs) -> str:
  """A 16-hex-digit hash of the documents' paths and texts, in order."""
  h = hashlib.sha256()
  for d in docs:
    h.update(d.path.encode())
    h.update(hashlib.sha256(d.text.encode()).digest())
  return h.hexdigest()[:16]


def token_stream(tokenizer, docs, eot_id: int) -> np.ndarray:
  """All documents as one uint16 stream, each followed by the end-of-text id."""
  ids = tokenizer.encode_batch([d.text for d in docs])
  parts = []
  for enc in ids:
    parts.append(np.asarray(enc.ids, np.uint16))
    parts.append(np.array([eot_id], np.uint16))
  return np.concatenate(parts)


def windows(stream: np.ndarray, length: int, count: int, seed) -> np.ndarray:
  """`count` windows of `length` tokens at uniformly random offsets: int32 [count, length]."""
  if stream.shape[0] <= length:
    raise ValueError(f"token stream of {stream.shape[0]} tokens is shorter than a window "
                     f"({length})")
  rng = np.random.default_rng(seed)
  starts = rng.integers(0, stream.shape[0] - length, size=count)
  return np.stack([stream[s:s + length] for s in starts]).astype(np.int32)


def tiled_windows(stream: np.ndarray, length: int, count: int) -> np.ndarray:
  """`count` non-overlapping windows spread evenly over the stream (for evaluation)."""
  usable = stream.shape[0] - length
  if usable < 0:
    raise ValueError(f"token stream of {stream.shape[0]} tokens is shorter than a window")
  starts = np.linspace(0, usable, count).astype(np.int64)
  return np.stack([stream[s:s + length] for s in starts]).astype(np.int32)
