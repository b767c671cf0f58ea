"""Training windows for a drafter from an answer store (`jspec.recipes.answers`).

Each stored row (the target's prompt in its chat template, then the target's answer)
becomes one window [T] of prompt + answer, cut at T tokens. The loss covers only the
positions whose next token is an answer token (P - 1 .. P + A - 2 for a prompt of P and
an answer of A ids): the head drafts answers, never prompts, though it attends over the
prompt's pairs as it does when it drafts. Rows are split by a seeded permutation: the
first `heldout` are held out (held-out loss and top-1), the next `max_windows` (all by
default) are trained on. The store itself already leaves out every evaluation prompt.

Features are the target's fused-layer outputs (bf16) and its argmax at every position,
computed in chunks of similar lengths at the chunk's width rounded up to 64 (padding past
a row's end never reaches its positions: attention is causal), and cached in the work
directory under a name that carries every setting they depend on.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from jspec.recipes import answer_store as S
from jspec.recipes.answer_prompts import SOURCES

WIDTH_STEP = 64


def store_rows(store: str) -> list[tuple[np.ndarray, np.ndarray, str]]:
  """(prompt ids, answer ids, source) of every row of the store, in store order (each
  shard's sha256 checked against the manifest)."""
  manifest = S.read_manifest(store)
  if manifest is None:
    raise FileNotFoundError(f"{store}: no {S.MANIFEST}; not an answer store "
                            "(python -m jspec.recipes.answers generate --out DIR)")
  sources = manifest.get("sources", SOURCES)
  rows = []
  for entry in manifest["shards"]:
    shard = S.load_shard(store, entry)
    for (prompt, answer), s in zip(S.rows_of(shard), shard["sources"]):
      rows.append((prompt.astype(np.int32), answer.astype(np.int32), sources[int(s)]))
  return rows


def split(n: int, heldout: int, max_windows: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(held-out rows, training rows) of n rows: a seeded permutation's first `heldout`,
  then the next `max_windows` (all the rest when None)."""
  if not 0 <= heldout < n:
    raise ValueError(f"heldout must lie in [0, {n}), got {heldout}")
  if max_windows is not None and max_windows < 1:
    raise ValueError(f"max_windows must be >= 1, got {max_windows}")
  order = np.random.default_rng(seed).permutation(n)
  held, rest = order[:heldout], order[heldout:]
  return np.sort(held), np.sort(rest[:max_windows])


def windows_of(rows, window: int) -> dict:
  """windows [N, T] int32 (prompt + answer, zero-padded), valid [N, T] (the next token is
  an answer token inside the window), prompt_lengths and answer_lengths [N] (the answer
  ids inside the window), kinds [N] (sources)."""
  N = len(rows)
  windows = np.zeros((N, window), np.int32)
  valid = np.zeros((N, window), bool)
  plen, alen = np.zeros((N,), np.int64), np.zeros((N,), np.int64)
  for i, (prompt, answer, _) in enumerate(rows):
    seq = np.concatenate([prompt, answer])[:window]
    windows[i, :len(seq)] = seq
    P = min(len(prompt), window)
    plen[i], alen[i] = P, len(seq) - P
    valid[i, max(P - 1, 0):len(seq) - 1] = True
  return {"windows": windows, "valid": valid, "prompt_lengths": plen, "answer_lengths": alen,
          "kinds": np.asarray([r[2] for r in rows])}


def prefill_shape(backend: str) -> tuple[int, int | None]:
  """(rows per prefill call, width step) for a backend. On a CPU the work is the rows'
  tokens, so short chunks run at their own width (a compile per width, each paid back);
  on an accelerator one call of 64 full windows costs about what a call of 8 does and each
  compile costs more than the padding, so every chunk runs at the full width (None)."""
  return (8, WIDTH_STEP) if backend == "cpu" else (64, None)


def chunked_features(features_fn, target, windows: np.ndarray, lengths: np.ndarray, layers,
                     chunk: int | None = None, progress: bool = True,
                     width_step: int | None = 0, partial: str | None = None):
  """features [N, T, F] bf16 and labels [N, T] int32 of windows [N, T]: rows sorted by
  length, each chunk run at its longest row rounded up to `width_step` (at most T; None:
  always T). chunk and width_step default to `prefill_shape` of the default backend.
  features_fn(target, tokens [b, w], layers) -> (features [b, w, F] bf16, labels [b, w]).

  `partial` (a path prefix): the arrays live in files there (PREFIX.features.npy,
  PREFIX.labels.npy, memory-mapped) and PREFIX.json counts the chunks written, so a prefill
  killed part way resumes at its next chunk: on a CPU the whole store's prefill takes hours.
  The caller removes them (`remove_partial`) once it has kept the result."""
  import jax
  import jax.numpy as jnp
  from tqdm import tqdm

  default_chunk, default_step = prefill_shape(jax.default_backend())
  chunk = default_chunk if chunk is None else chunk
  width_step = default_step if width_step == 0 else width_step
  N, T = windows.shape
  order = np.argsort(lengths, kind="stable")
  shape = {"N": int(N), "T": int(T), "chunk": int(chunk), "width_step": width_step,
           "layers": [int(x) for x in layers], "windows": hashlib.sha256(
               np.ascontiguousarray(windows).tobytes()
               + np.ascontiguousarray(lengths).tobytes()).hexdigest()}
  feats = labels = None
  first = 0
  if partial is not None and all(os.path.isfile(partial + x) for x in
                                 (".json", ".features.npy", ".labels.npy")):
    with open(partial + ".json") as f:
      state = json.load(f)
    if state["shape"] == shape:  # the same prefill: go on from its last chunk
      feats = np.lib.format.open_memmap(partial + ".features.npy", mode="r+")
      labels = np.lib.format.open_memmap(partial + ".labels.npy", mode="r+")
      first = int(state["chunks"])
  starts = range(0, N, chunk)
  bar = tqdm(total=len(starts), initial=first, desc="features", disable=not progress)
  for n in range(first, len(starts)):
    rows = order[starts[n]:starts[n] + chunk]
    width = T if width_step is None else min(
        T, -(-int(lengths[rows].max()) // width_step) * width_step)
    tokens = windows[rows, :width]
    if len(rows) < chunk:  # one static batch size: pad with copies of the first row
      tokens = np.concatenate([tokens, np.repeat(tokens[:1], chunk - len(rows), 0)])
    f, l = features_fn(target, jnp.asarray(tokens), tuple(layers))
    f, l = np.asarray(f)[:len(rows)], np.asarray(l)[:len(rows)]
    if feats is None:
      if partial is None:
        feats = np.zeros((N, T, f.shape[-1]), np.uint16)
        labels = np.zeros((N, T), np.int32)
      else:  # (written as uint16: the .npy format has no bfloat16)
        feats = np.lib.format.open_memmap(partial + ".features.npy", mode="w+",
                                          dtype=np.uint16, shape=(N, T, f.shape[-1]))
        labels = np.lib.format.open_memmap(partial + ".labels.npy", mode="w+",
                                           dtype=np.int32, shape=(N, T))
    feats[rows, :width], labels[rows, :width] = f.view(np.uint16), l
    if partial is not None:  # the chunk on disk before it is counted
      feats.flush()
      labels.flush()
      tmp = partial + ".json.tmp"
      with open(tmp, "w") as fh:
        json.dump({"shape": shape, "chunks": n + 1}, fh)
      os.replace(tmp, partial + ".json")
    bar.update(1)
  bar.close()
  return feats.view(jnp.bfloat16), labels


def remove_partial(partial: str) -> None:
  """Removes what `chunked_features(partial=...)` kept for a resumed prefill."""
  for suffix in (".json", ".features.npy", ".labels.npy"):
    if os.path.isfile(partial + suffix):
      os.remove(partial + suffix)


def captured_windows(data: dict, chosen: np.ndarray, captured: dict):
  """Features [N, T, F] (uint16: bf16 bits, zeros where not captured) and labels [N, T]
  of the windows whose store row (`chosen`) has captured features
  (`answer_features.stored`), and the mask [N] of those windows."""
  N, T = data["windows"].shape
  have = np.asarray([int(r) in captured for r in chosen], bool)
  feats = labels = None
  for i in np.flatnonzero(have):
    f, l = captured[int(chosen[i])]
    if feats is None:
      feats = np.zeros((N, T, f.shape[-1]), np.uint16)
      labels = np.zeros((N, T), np.int32)
    n = min(T, len(l))
    feats[i, :n], labels[i, :n] = f[:n], np.maximum(l[:n], 0)
  return feats, labels, have


def add_feature_arguments(parser) -> None:
  """The recipes' options for where window features come from: --feature-cache (the
  cache's folder; default their --work) and --features-dir (the capture buffer)."""
  parser.add_argument("--feature-cache", default=None, metavar="DIR",
                      help="where the store's window features are cached (default --work): "
                           "runs with different --work share it")
  parser.add_argument("--features-dir", default=os.path.join(".recipe", "answer_features"),
                      help="features captured with the answers (`answers generate --features`): "
                           "rows found there are not prefilled again")
  parser.add_argument("--feature-windows", type=int, default=None, metavar="N",
                      help="cache features for the held-out rows and the split's first N "
                           "training rows only (default every row): what a learning curve "
                           "whose largest point is N windows needs")


def ensure_answer_data(target, work: str, store: str, features_fn, *, window: int,
                       heldout: int, max_windows: int | None, layers, seed: int = 0,
                       progress: bool = True, features_dir: str | None = None,
                       feature_windows: int | None = None) -> dict:
  """The store's windows with features, cached in `work`: windows, valid, features
  [N, T, len(layers) * D] bf16, labels, kinds, prompt_lengths, answer_lengths [N], rows
  (the store row of each window), heldout_rows and train_rows (indices into the arrays).
  Rows whose features were captured as they were generated (`features_dir`,
  `jspec.recipes.answer_features`) take them from there; only the others are prefilled.
  `feature_windows`: only the held-out rows and the split's first that many training rows
  are cached (a prefill costs as much as an epoch, so a curve that stops short of the whole
  store pays for what it trains on); `max_windows` must then not exceed it."""
  import jax.numpy as jnp

  from jspec.recipes import answer_features

  manifest = S.read_manifest(store)
  if manifest is None:
    raise FileNotFoundError(f"{store}: no {S.MANIFEST}; not an answer store")
  captured = answer_features.stored(manifest, features_dir, tuple(layers))
  if max_windows is not None and max_windows < 1:
    raise ValueError(f"max_windows must be >= 1, got {max_windows}")
  if feature_windows is not None and feature_windows < 1:
    raise ValueError(f"feature_windows must be >= 1, got {feature_windows}")
  if None not in (max_windows, feature_windows) and max_windows > feature_windows or (
      max_windows is None and feature_windows is not None):
    raise ValueError(f"max_windows ({max_windows}) asks for training rows past the "
                     f"{feature_windows} whose features are cached (feature_windows)")
  # Features for every row (or the first feature_windows), whatever max_windows: runs over
  # nested parts of one store (a learning curve) share one cache, and max_windows picks the
  # training rows after.
  key = {"shards": [e["sha256"] for e in manifest["shards"]], "window": window,
         "heldout": heldout, "max_windows": feature_windows, "layers": list(layers),
         "seed": seed}
  if captured:  # (the key of a store without captured rows is as before)
    key["captured_rows"] = len(captured)
  digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
  os.makedirs(work, exist_ok=True)
  path = os.path.join(work, f"answers-{digest}.npz")
  if not os.path.isfile(path):
    rows = store_rows(store)
    held, train = split(len(rows), heldout, feature_windows, seed)
    chosen = np.concatenate([held, train])
    data = windows_of([rows[i] for i in chosen], window)
    lengths = data["prompt_lengths"] + data["answer_lengths"]
    features, labels, have = captured_windows(data, chosen, captured)
    missing = np.flatnonzero(~have)
    partial = os.path.join(work, f"answers-{digest}.partial")
    if len(missing):  # a prefill over the rows nobody captured (resumed if killed)
      f, l = chunked_features(features_fn, target, data["windows"][missing], lengths[missing],
                              layers, progress=progress, partial=partial)
      f = f.view(np.uint16)
      if features is None:
        features = np.zeros((len(chosen),) + f.shape[1:], np.uint16)
        labels = np.zeros((len(chosen), f.shape[1]), np.int32)
      features[missing], labels[missing] = f, l
    tmp = path + ".tmp.npz"
    np.savez(tmp, features=features, labels=labels, rows=chosen,
             heldout_rows=np.arange(len(held)),
             train_rows=np.arange(len(held), len(chosen)), **data)
    os.replace(tmp, path)
    remove_partial(partial)
    with open(os.path.join(work, f"answers-{digest}.json"), "w") as f:
      json.dump(key, f)
  z = np.load(path)
  data = {k: z[k] for k in z.files}
  data["features"] = data["features"].view(jnp.bfloat16)
  if max_windows is not None:  # the split's first max_windows training rows, as `split` picks
    _, train = split(int(manifest["totals"]["rows"]), heldout, max_windows, seed)
    keep = np.isin(data["rows"][data["train_rows"]], train)
    data["train_rows"] = data["train_rows"][keep]
  return data
