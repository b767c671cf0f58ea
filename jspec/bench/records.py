"""The one record type of every measurement, and the file that holds a study's records.

A `Record` is one method run on one prompt (or one batch of prompts) at fixed axes, timed
`len(seconds)` times: what it emitted, what it cost the target, what the target judged of
its drafts, and whether its greedy answer equals plain decoding's. Every figure a study
reports is a pure function of its records (`jspec.bench.metrics`).

A study's file is JSON lines: the first line a header (`{"header": {...}}`: the schema, the
study, its settings, the machine and the versions that ran it), then one record a line.

    path = records.write("docs/bench/spec_bench_smollm2.jsonl", header, records)
    header, records = records.read(path)
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform

SCHEMA = "jspec.bench/1"


@dataclasses.dataclass(frozen=True)
class Record:
  """One method on one prompt (or batch) at fixed axes; counts summed over the batch's rows.

  axes: what the study varies or groups by, as plain JSON values (`batch`, `k`,
  `temperature`, `category`, `turn`, `constraint`, ...); `jspec.bench.report` tables
  by any of them. judged[i] / accepted[i]: rounds that judged / accepted draft position i
  (`DecodeStats.position_judged` / `position_accepted`, summed over rows). seconds: the
  wall time of each timed repeat. equal: the greedy answer equals plain decoding's on the
  same prompt (None where nothing was compared: plain itself, or sampled).
  """

  study: str
  method: str  # a registry spec ("plain", "ngram", "ngram@k=auto", "eagle3@tree=32,4,8")
  workload: str  # the prompt set's name
  prompt: str  # the prompt's id in the workload ("81/2": question 81, turn 2)
  axes: dict = dataclasses.field(default_factory=dict)
  tokens: int = 0  # new tokens emitted, all rows
  calls: int = 0  # target calls, summed over rows (tau = tokens / calls)
  rounds: int = 0  # loop rounds of the longest row
  judged: tuple[int, ...] = ()  # [K] per draft position
  accepted: tuple[int, ...] = ()  # [K] per draft position
  rounds_by_k: dict = dataclasses.field(default_factory=dict)  # {K: rounds} ("auto")
  seconds: tuple[float, ...] = ()  # per timed repeat
  equal: bool | None = None
  extra: dict = dataclasses.field(default_factory=dict)  # a study's own figures

  def __post_init__(self):
    if len(self.judged) != len(self.accepted):
      raise ValueError(f"record {self.method!r} on {self.prompt!r}: judged has "
                       f"{len(self.judged)} positions, accepted {len(self.accepted)}")
    if any(a > j for a, j in zip(self.accepted, self.judged)):
      raise ValueError(f"record {self.method!r} on {self.prompt!r}: a position accepted "
                       f"more drafts than it judged ({list(self.accepted)} > "
                       f"{list(self.judged)})")

  def to_json(self) -> dict:
    """The record as one JSON object (tuples as lists, K keys as strings)."""
    d = dataclasses.asdict(self)
    d["judged"], d["accepted"], d["seconds"] = (list(self.judged), list(self.accepted),
                                               list(self.seconds))
    d["rounds_by_k"] = {str(k): v for k, v in self.rounds_by_k.items()}
    return d

  @classmethod
  def from_json(cls, d: dict) -> "Record":
    """A record from `to_json`'s object; a ValueError naming any field it does not know."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - known
    if unknown:
      raise ValueError(f"record has fields this schema does not: {sorted(unknown)}")
    d = dict(d)
    d["judged"] = tuple(d.get("judged", ()))
    d["accepted"] = tuple(d.get("accepted", ()))
    d["seconds"] = tuple(d.get("seconds", ()))
    d["rounds_by_k"] = {int(k): int(v) for k, v in d.get("rounds_by_k", {}).items()}
    return cls(**d)


def from_output(out, per_row: bool = False, **fields) -> Record:
  """A record of one call's output (`jspec.generate` / `speculative_generate`): tokens,
  target calls, rounds and acceptance by position, summed over the batch's rows; per_row:
  each row's own in `extra["rows"]` too (`rows`)."""
  import numpy as np

  st = out.stats
  calls = np.asarray(st.target_calls)
  by_k = {int(k): int(v) for k, v in (out.rounds_by_k or {}).items()}
  if per_row:
    lengths, judged = np.asarray(out.lengths), np.asarray(st.position_judged)
    accepted = np.asarray(st.position_accepted)
    extra = dict(fields.pop("extra", {}))
    extra["rows"] = [{"tokens": int(lengths[b]), "calls": int(calls[b]),
                      "judged": [int(x) for x in judged[b]],
                      "accepted": [int(x) for x in accepted[b]]} for b in range(len(lengths))]
    fields["extra"] = extra
  return Record(tokens=int(np.sum(np.asarray(out.lengths))), calls=int(np.sum(calls)),
                rounds=int(np.max(calls)) if calls.size else 0,
                judged=tuple(int(x) for x in np.sum(np.asarray(st.position_judged), axis=0)),
                accepted=tuple(int(x) for x in np.sum(np.asarray(st.position_accepted), axis=0)),
                rounds_by_k=by_k, **fields)


def rows(record: Record) -> list[Record]:
  """The record's rows as records of their own (its seconds kept on each: time is the
  call's, not a row's); itself when it holds one row."""
  if "rows" not in record.extra:
    return [record]
  return [dataclasses.replace(record, tokens=r["tokens"], calls=r["calls"], rounds=r["calls"],
                              judged=tuple(r["judged"]), accepted=tuple(r["accepted"]),
                              extra={}) for r in record.extra["rows"]]


def machine() -> dict:
  """What ran the study: platform, processor, cores, JAX's backend and devices."""
  import jax

  return {"platform": platform.platform(), "processor": _cpu_name(),
          "cores": os.cpu_count(), "backend": jax.default_backend(),
          "devices": [str(d.device_kind) for d in jax.devices()]}


def versions() -> dict:
  """The versions that ran the study: Python, jax, jaxlib, numpy, jspec."""
  import importlib.metadata as md

  out = {"python": platform.python_version()}
  for name in ("jax", "jaxlib", "numpy", "jspec"):
    try:
      out[name] = md.version(name)
    except md.PackageNotFoundError:
      out[name] = None
  return out


def header(study: str, settings: dict | None = None, **extra) -> dict:
  """A file's header: schema, study, settings, when, machine, versions."""
  return {"schema": SCHEMA, "study": study, "settings": dict(settings or {}),
          "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "machine": machine(), "versions": versions(), **extra}


def write(path: str, head: dict, records) -> str:
  """Write a header and records as JSON lines (the folder made if needed); returns path."""
  if head.get("schema") != SCHEMA:
    raise ValueError(f"header schema {head.get('schema')!r}, expected {SCHEMA!r}")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps({"header": head}) + "\n")
    for r in records:
      f.write(json.dumps(r.to_json()) + "\n")
  return path


def read(path: str) -> tuple[dict, list[Record]]:
  """(header, records) of a study's file; a clear ValueError for any other shape."""
  with open(path, encoding="utf-8") as f:
    lines = [ln for ln in f.read().splitlines() if ln.strip()]
  if not lines:
    raise ValueError(f"{path}: empty; expected a header line and records")
  try:
    first = json.loads(lines[0])
  except ValueError as e:
    raise ValueError(f"{path}:1: not JSON: {e}") from None
  if not isinstance(first, dict) or "header" not in first:
    raise ValueError(f"{path}:1: expected {{\"header\": ...}} first")
  head = first["header"]
  if head.get("schema") != SCHEMA:
    raise ValueError(f"{path}: schema {head.get('schema')!r}, this version reads {SCHEMA!r}")
  out = []
  for n, line in enumerate(lines[1:], 2):
    try:
      out.append(Record.from_json(json.loads(line)))
    except (ValueError, TypeError) as e:
      raise ValueError(f"{path}:{n}: {e}") from None
  return head, out


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()
