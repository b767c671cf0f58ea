"""Drafter training features captured while the answer store is generated.

An EAGLE-3 or DFlash head trains on the target's intermediate layers at every position of
its answers, and the target computes them anyway while it generates those answers. With a
`Capture`, `jspec.recipes.answers.generate_answers` asks each `jspec.generate` call for
them (`return_features=layers`) and for the target's own argmax at each answer position
(`Logprobs(raw=True, top=1)`: the label a head is scored against, whatever the row's
temperature), and writes one file per shard next to it, in a folder of its own:

    features-00007.npz   features uint16 [n, F] (bf16 bits), labels int32 [n], offsets
                         int64 [rows + 1], layers int32, shard_sha256 (the shard's)

Row i of the shard covers entries offsets[i] .. offsets[i+1]-1, one per slot of its prompt
+ answer but the last (never fed to the target): the features at slot s, and the target's
argmax there for the answer's positions (slots P-1 .. end-2; -1 at the prompt's).

The folder is a bounded buffer: `keep` newest shards' files are kept (they are 3.5 KB
a token for SmolLM2's three layers; the token ids themselves are what the repository
keeps). `stored(...)` reads the files that still match their shard (sha256 and layers);
`jspec.recipes.answer_windows.ensure_answer_data` takes those rows' features from them
and runs a prefill only over the rest: a shard written before capture, or whose file was
dropped.
"""

from __future__ import annotations

import dataclasses
import io
import os

import numpy as np

PREFIX = "features-"


@dataclasses.dataclass
class Capture:
  """Where and what to capture: the folder, the decoder layers, how many shards' files to
  keep (None: all)."""

  folder: str
  layers: tuple[int, ...]
  keep: int | None = None
  _rows: dict = dataclasses.field(default_factory=dict)  # prompt hash -> (features, labels)

  def __post_init__(self):
    self.layers = tuple(int(i) for i in self.layers)
    if not self.layers:
      raise ValueError("Capture needs at least one decoder layer")
    if self.keep is not None and self.keep < 1:
      raise ValueError(f"keep must be >= 1 (or None: every shard), got {self.keep}")

  def generate_kwargs(self) -> dict:
    """What `jspec.generate` is asked for besides the tokens."""
    import jspec

    return {"return_features": self.layers, "return_logprobs": jspec.Logprobs(raw=True, top=1)}

  def collect(self, out, rows) -> None:
    """Keeps each row's features and labels from a `jspec.generate` output; rows: the
    batch's (prompt, ids) pairs in row order (padding rows past them are ignored)."""
    import jax.numpy as jnp

    feats = np.asarray(out.features.astype(jnp.bfloat16)).view(np.uint16)  # [B, S, F]
    top = np.asarray(out.top_ids)[..., 0]  # [B, max_new]: argmax predicting new token j
    lengths = np.asarray(out.lengths)
    for j, (prompt, ids) in enumerate(rows):
      P, n = len(ids), int(lengths[j])
      labels = np.full((P + n - 1,), -1, np.int32)
      labels[P - 1:] = top[j, :n]  # slot P-1+j predicts new token j
      self._rows[prompt.hash] = (feats[j, :P + n - 1].copy(), labels)

  def write(self, entry: dict, hashes) -> str:
    """The file of the shard `entry` (its manifest entry) whose rows are `hashes`, in shard
    order; drops files past `keep`. Returns its path."""
    feats, labels, lengths = [], [], []
    for h in hashes:
      f, l = self._rows.pop(h)
      feats.append(f)
      labels.append(l)
      lengths.append(len(l))
    os.makedirs(self.folder, exist_ok=True)
    name = PREFIX + entry["file"].removeprefix("shard-")
    path = os.path.join(self.folder, name)
    buf = io.BytesIO()
    np.savez(buf, features=np.concatenate(feats), labels=np.concatenate(labels),
             offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
             layers=np.asarray(self.layers, np.int32), shard_sha256=np.asarray(entry["sha256"]))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
      f.write(buf.getvalue())
    os.replace(tmp, path)
    self._prune()
    return path

  def _prune(self) -> None:
    if self.keep is None:
      return
    files = sorted(n for n in os.listdir(self.folder)
                   if n.startswith(PREFIX) and n.endswith(".npz"))
    for name in files[:-self.keep]:
      os.remove(os.path.join(self.folder, name))


def stored(manifest: dict, folder: str | None, layers) -> dict[int, tuple[np.ndarray, np.ndarray]]:
  """{store row index: (features uint16 [n, F], labels int32 [n])} for the rows whose
  shard has a file in `folder` made for that very shard (sha256) and `layers`; rows are
  numbered in store order, as `answer_windows.store_rows` lists them."""
  out = {}
  if folder is None or not os.path.isdir(folder):
    return out
  base = 0
  for entry in manifest["shards"]:
    path = os.path.join(folder, PREFIX + entry["file"].removeprefix("shard-"))
    if os.path.isfile(path):
      z = np.load(path)
      if (str(z["shard_sha256"]) == entry["sha256"]
          and tuple(z["layers"].tolist()) == tuple(layers)
          and len(z["offsets"]) == entry["rows"] + 1):
        o = z["offsets"]
        feats, labels = z["features"], z["labels"]
        for i in range(entry["rows"]):
          out[base + i] = (feats[o[i]:o[i + 1]], labels[o[i]:o[i + 1]])
    base += entry["rows"]
  return out
