"""The shard store of an answer store (`jspec.recipes.answers`): files, manifest, checks.

Shards (`shard-00000.npz`, ...): `tokens` uint16 (each row's prompt and answer ids,
concatenated, rows one after another), `offsets` int64 [rows + 1], `prompt_lengths`
int32, `temperature` float32 (0: greedy), `seeds` uint32, `sources` uint8 (index into
`answer_prompts.SOURCES`), `prompt_hash` uint64, `finished` bool (the answer ended with EOS).
`manifest.json`: per shard its file, rows, tokens, sha256, source counts, seconds and
machine; totals. Files are written to a temporary name and renamed, the manifest after
each shard, so a kill at any moment loses at most the shard in progress; the next run
skips every prompt whose hash is in a finished shard (`store_state`) and continues with the
next ones. A shard's bytes are a function of its arrays (fixed zip timestamps), so a
resumed run writes the same files as an uninterrupted one. The store only ever appends: its
first N shards never change (`head` copies them into a store of their own). The hashes of
the excluded evaluation prompts (`jspec.recipes.answer_exclusion`) are kept beside the
shards (EXCLUDED) and only grow.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import hashlib
import io
import json
import os
import zipfile

import numpy as np

from jspec.recipes.answer_exclusion import Exclusion, evaluation_exclusion
from jspec.recipes.answer_prompts import SOURCES

FORMAT = 1
MANIFEST = "manifest.json"
EXCLUDED = "excluded_prompts.txt"


def atomic_write(path: str, data: bytes) -> None:
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def npz_bytes(arrays: dict) -> bytes:
  """A compressed .npz of `arrays` whose bytes depend on the arrays alone (fixed times)."""
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
    for name, arr in arrays.items():
      info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
      info.compress_type = zipfile.ZIP_DEFLATED
      with zf.open(info, "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)
  return buf.getvalue()


def read_manifest(out: str) -> dict | None:
  path = os.path.join(out, MANIFEST)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def load_shard(out: str, entry: dict, check: bool = True) -> dict:
  """A manifest entry's arrays; its sha256 checked against the manifest first."""
  with open(os.path.join(out, entry["file"]), "rb") as f:
    raw = f.read()
  if check and hashlib.sha256(raw).hexdigest() != entry["sha256"]:
    raise ValueError(f"{entry['file']}: sha256 differs from {MANIFEST}'s; the shard is corrupt")
  with np.load(io.BytesIO(raw)) as z:
    return {k: z[k] for k in z.files}


def rows_of(shard: dict) -> list[tuple[np.ndarray, np.ndarray]]:
  """(prompt ids, answer ids) of every row of a loaded shard."""
  t, o, p = shard["tokens"], shard["offsets"], shard["prompt_lengths"]
  return [(t[o[i]:o[i] + p[i]], t[o[i] + p[i]:o[i + 1]]) for i in range(len(p))]


def write_corpus(out: str, tokenizer, path: str) -> dict:
  """Every stored answer (shards checked) decoded to text, one {"text": ...} JSONL row per
  answer, in store order: {"rows": n, "answer_tokens": m}."""
  manifest = read_manifest(out)
  if manifest is None:
    raise FileNotFoundError(f"no {MANIFEST} in {out}")
  rows = tokens = 0
  with open(path, "w") as f:
    for entry in manifest["shards"]:
      for _, answer in rows_of(load_shard(out, entry)):
        f.write(json.dumps({"text": tokenizer.decode(answer.astype(np.int64).tolist())}) + "\n")
        rows, tokens = rows + 1, tokens + len(answer)
  return {"rows": rows, "answer_tokens": tokens}


def verify(out: str) -> dict:
  """Checks every shard of the manifest (sha256, rows, tokens, no prompt twice): totals."""
  manifest = read_manifest(out)
  if manifest is None:
    raise FileNotFoundError(f"no {MANIFEST} in {out}")
  seen, rows, answer = set(), 0, 0
  for entry in manifest["shards"]:
    z = load_shard(out, entry)
    n = len(z["prompt_lengths"])
    a = int((np.diff(z["offsets"]) - z["prompt_lengths"]).sum())
    if n != entry["rows"] or a != entry["answer_tokens"]:
      raise ValueError(f"{entry['file']}: {n} rows / {a} answer tokens, manifest says "
                       f"{entry['rows']} / {entry['answer_tokens']}")
    hashes = z["prompt_hash"].tolist()
    if len(set(hashes)) != n or seen & set(hashes):
      raise ValueError(f"{entry['file']}: a prompt appears twice")
    seen.update(hashes)
    rows, answer = rows + n, answer + a
  if rows != manifest["totals"]["rows"] or answer != manifest["totals"]["answer_tokens"]:
    raise ValueError("manifest totals differ from the sum of its shards")
  return {"shards": len(manifest["shards"]), "rows": rows, "answer_tokens": answer}


@contextlib.contextmanager
def locked(out: str):
  """One writer per output folder."""
  import fcntl
  path = os.path.join(out, ".lock")
  with open(path, "w") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise RuntimeError(f"{out} is being written by another process") from None
    try:
      yield
    finally:
      os.remove(path)


def store_state(out: str, manifest: dict | None,
                exclusion: Exclusion | None) -> tuple[set, Exclusion]:
  """(the prompt hashes the store in `out` has answered, the exclusion that applies to it):
  `exclusion` (None: `evaluation_exclusion()`) joined with the hashes the store keeps in
  its EXCLUDED file. Exclusion only grows: what earlier runs excluded stays excluded."""
  written = set()
  for entry in (manifest or {}).get("shards", []):
    written.update(load_shard(out, entry)["prompt_hash"].tolist())
  if exclusion is None:
    exclusion = evaluation_exclusion()
  if os.path.isfile(os.path.join(out, EXCLUDED)):
    with open(os.path.join(out, EXCLUDED)) as f:
      exclusion = exclusion.union(Exclusion(frozenset(int(x, 16) for x in f if x.strip())))
  return written, exclusion


def write_shard(out: str, manifest: dict, rows: list, eos, extra: dict) -> None:
  """Writes shard number len(manifest["shards"]) from `rows` (in pool order), then the
  manifest. rows: (prompt (`answer_prompts.Prompt`), prompt ids, answer ids, temperature,
  seed) each; eos: the ids that end an answer (a row is `finished` when its answer ends
  with one); extra: recorded in the shard's manifest entry (must hold "seconds")."""
  seqs, plens, temps, seeds, sources, hashes, finished = [], [], [], [], [], [], []
  for p, ids, a, t, s in rows:
    seqs.append(np.concatenate([np.asarray(ids, np.int64), np.asarray(a).astype(np.int64)]))
    plens.append(len(ids))
    temps.append(t)
    seeds.append(s)
    sources.append(p.source)
    hashes.append(p.hash)
    finished.append(bool(len(a)) and int(a[-1]) in eos)
  lengths = np.array([len(s) for s in seqs], np.int64)
  arrays = {"tokens": np.concatenate(seqs).astype(np.uint16),
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "prompt_lengths": np.array(plens, np.int32),
            "temperature": np.array(temps, np.float32), "seeds": np.array(seeds, np.uint32),
            "sources": np.array(sources, np.uint8), "prompt_hash": np.array(hashes, np.uint64),
            "finished": np.array(finished, bool)}
  data = npz_bytes(arrays)
  name = f"shard-{len(manifest['shards']):05d}.npz"
  atomic_write(os.path.join(out, name), data)
  answer_tokens = int((lengths - arrays["prompt_lengths"]).sum())
  counts = collections.Counter(SOURCES[s] for s in sources)
  entry = {"file": name, "rows": len(rows), "answer_tokens": answer_tokens,
           "prompt_tokens": int(arrays["prompt_lengths"].sum()),
           "greedy_rows": int(np.sum(arrays["temperature"] == 0)),
           "finished_rows": int(arrays["finished"].sum()), "bytes": len(data),
           "sha256": hashlib.sha256(data).hexdigest(),
           "sources": {k: counts[k] for k in SOURCES if counts[k]},
           "tokens_per_second": round(answer_tokens / max(extra["seconds"], 1e-9), 1),
           "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           **extra}
  manifest["shards"].append(entry)
  manifest["totals"] = totals_of(manifest["shards"])
  atomic_write(os.path.join(out, MANIFEST), json.dumps(manifest, indent=1).encode())


def totals_of(entries: list[dict]) -> dict:
  """The manifest's totals over its shard entries."""
  totals = collections.Counter()
  sources_total = collections.Counter()
  for e in entries:
    for k in ("rows", "answer_tokens", "prompt_tokens", "greedy_rows", "finished_rows", "bytes",
              "seconds"):
      totals[k] += e[k]
    sources_total.update(e["sources"])
  return {"shards": len(entries), **{k: totals[k] for k in (
      "rows", "answer_tokens", "prompt_tokens", "greedy_rows", "finished_rows", "bytes")},
      "seconds": round(totals["seconds"], 1),
      "sources": {k: sources_total[k] for k in SOURCES if sources_total[k]}}


def head(out: str, shards: int, to: str) -> dict:
  """A store of the first `shards` shards of the store in `out`, written to `to` (each
  shard's sha256 checked), with its manifest's totals over them and where it came from.

  The store only ever appends, so its first N shards never change: a run on the head of N
  is reproducible however far the store has grown since (its seeded split depends on the
  number of rows). The manifest names the source folder as given."""
  manifest = read_manifest(out)
  if manifest is None:
    raise FileNotFoundError(f"no {MANIFEST} in {out}")
  have = len(manifest["shards"])
  if not 1 <= shards <= have:
    raise ValueError(f"{out} holds {have} shards; --shards must lie in [1, {have}], got {shards}")
  if os.path.exists(os.path.join(to, MANIFEST)):
    raise FileExistsError(f"{to} already holds a store")
  os.makedirs(to, exist_ok=True)
  entries = manifest["shards"][:shards]
  for entry in entries:
    with open(os.path.join(out, entry["file"]), "rb") as f:
      raw = f.read()
    if hashlib.sha256(raw).hexdigest() != entry["sha256"]:
      raise ValueError(f"{entry['file']}: sha256 differs from {MANIFEST}'s; the shard is corrupt")
    atomic_write(os.path.join(to, entry["file"]), raw)
  copy = {k: v for k, v in manifest.items() if k not in ("shards", "totals")}
  copy.update(shards=entries, totals=totals_of(entries),
              head_of={"store": os.path.normpath(out), "shards": shards, "of": have})
  atomic_write(os.path.join(to, MANIFEST), json.dumps(copy, indent=1).encode())
  return copy["totals"]
