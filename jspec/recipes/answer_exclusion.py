"""The evaluation prompts an answer store (`jspec.recipes.answers`) never answers.

Evaluation prompts are never used for training answers: the held-out chat prompts and code
prompts in `checkpoints/` (`chat_prompts.json`, `demo_prompts.json`) and any question file
given (Spec-Bench / MT-Bench's `question.jsonl`) are excluded by the hash of their normalised
text (`answer_prompts.prompt_hash`; the checkpoints' prompts also as substrings). The store
keeps the excluded hashes next to its shards, and they only ever grow
(`answer_store.store_state`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable

from jspec.recipes.answer_prompts import normalise, prompt_hash

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class Exclusion:
  """Evaluation prompts, never to be answered: hashes of their normalised texts, and
  normalised texts also refused as substrings of a prompt (`text in exclusion`)."""

  hashes: frozenset = frozenset()
  substrings: tuple = ()
  files: tuple = ()  # where they came from: (path, count)

  def __contains__(self, text: str) -> bool:
    if prompt_hash(text) in self.hashes:
      return True
    if self.substrings:
      norm = normalise(text)
      return any(s in norm for s in self.substrings)
    return False

  def union(self, other: "Exclusion") -> "Exclusion":
    return Exclusion(self.hashes | other.hashes, tuple(dict.fromkeys(self.substrings +
                                                                     other.substrings)),
                     self.files + other.files)


def _texts(obj) -> list[str]:
  """The prompt texts of a loaded .json/.jsonl object: strings, or the `content`, `turns`,
  `prompt` or `question` fields of objects, at any depth."""
  if isinstance(obj, str):
    return [obj]
  if isinstance(obj, list):
    return [t for x in obj for t in _texts(x)]
  if isinstance(obj, dict):
    return [t for k in ("content", "turns", "prompt", "question") if k in obj
            for t in _texts(obj[k])]
  return []


def read_prompt_file(path: str) -> list[str]:
  """The prompt texts of a .json file or a .jsonl file (one object a line)."""
  with open(path, encoding="utf-8") as f:
    if path.endswith(".jsonl"):
      return [t for line in f if line.strip() for t in _texts(json.loads(line))]
    return _texts(json.load(f))


def default_exclusion_files() -> list[str]:
  """The evaluation prompt files found: the checkpoints' held-out chat and code prompts,
  and Spec-Bench's questions ($JSPEC_SPEC_BENCH, or shared/spec_bench/question.jsonl
  beside the repository or one level up)."""
  found = [os.path.join(REPO_ROOT, "checkpoints", n) for n in ("chat_prompts.json",
                                                                "demo_prompts.json")]
  bench = [os.environ.get("JSPEC_SPEC_BENCH", "")] + [
      os.path.join(REPO_ROOT, *[".."] * up, "shared", "spec_bench", "question.jsonl")
      for up in (1, 2)]
  found.append(next((b for b in bench if b and os.path.isfile(b)), ""))
  return [os.path.normpath(p) for p in found if p and os.path.isfile(p)]


def exclusion_from_files(paths: Iterable[str], substring_paths: Iterable[str] = ()) -> Exclusion:
  """Every prompt text of `paths` by hash; those of `substring_paths` also as substrings
  (texts of 32 characters or more)."""
  hashes, subs, files = set(), [], []
  substring_paths = {os.path.abspath(p) for p in substring_paths}
  for path in paths:
    texts = read_prompt_file(path)
    hashes.update(prompt_hash(t) for t in texts)
    if os.path.abspath(path) in substring_paths:
      subs += [normalise(t) for t in texts if len(normalise(t)) >= 32]
    files.append((os.path.abspath(path), len(texts)))
  return Exclusion(frozenset(hashes), tuple(dict.fromkeys(subs)), tuple(files))


def evaluation_exclusion(extra: Iterable[str] = ()) -> Exclusion:
  """The default evaluation files (the checkpoints' ones also as substrings) and `extra`."""
  # One file named twice (found by default and given as `extra`) is read once.
  paths = list(dict.fromkeys(os.path.abspath(p) for p in default_exclusion_files() + list(extra)))
  checkpoints = [p for p in paths if os.path.dirname(p).endswith("checkpoints")]
  return exclusion_from_files(dict.fromkeys(paths), checkpoints)
