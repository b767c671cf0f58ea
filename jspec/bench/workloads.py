"""Named prompt sets: what every study, `jspec bench serve` and `jspec measure` run on.

    chat            the held-out chat prompts shipped with jspec (checkpoints/
                    chat_prompts.json), every kind; `restate`, `explain`, `question` one
                    kind each; `free` = explain + question (answers lookup cannot restate)
    spec-bench      Spec-Bench's questions (`jspec.bench.questions`; MT-Bench's 80 when no
                    file is given), every turn: `spec-bench:FILE` for a file of one's own
    mt-bench        the same questions, one group: MT-Bench's two-turn conversations
    agent           multi-turn, agent-style conversations (category "multi-turn"): per
                    standard-library function, a tool's output (its source) shown, the
                    model asked to explain it, to rewrite it, then to repeat its explanation
    jsonl:FILE      a user's conversations (a "messages" list, or "text" / "prompt", or a
                    string per line), each put through the chat template (alias chat:FILE)
    text:FILE       a user's plain-text prompts (JSONL, or prompts between `---` lines)

A `Prompt` is a conversation to answer (`messages`, ending with a user message), with
later user turns (`turns`) a runner answers one after the other, the model's answer to
each carried into the next, as Spec-Bench runs MT-Bench; or a plain `text`; or token
`ids` already encoded (`from_ids`).
"""

from __future__ import annotations

import dataclasses
import json
import os

CHAT_KINDS = ("restate", "explain", "question")
NAMES = ("chat", *CHAT_KINDS, "free", "spec-bench", "mt-bench", "agent")
HELP = ("chat, restate, explain, question, free (explain + question), spec-bench[:FILE], "
        "mt-bench, agent, jsonl:FILE (conversations), text:FILE (plain prompts)")
# The agent workload: the same three-turn task on each function, the whole history (the
# tool's output, the model's own earlier answers) in every turn's prompt.
AGENT_FUNCTIONS = ("textwrap.indent", "shlex.quote", "json.dumps", "shutil.copyfileobj",
                   "fnmatch.translate", "string.capwords", "base64.b64encode",
                   "colorsys.rgb_to_hsv")
AGENT_TURNS = (
    "The tool `read_source` returned:\n```python\n{code}\n```\nExplain in two sentences what "
    "`{name}` does.",
    "Rewrite `{name}` with a short docstring. Reply with the code only.",
    "Repeat your first explanation of `{name}` word for word, then list its parameters.",
)


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One prompt of a workload: its id, category (chat kind, Spec-Bench category, or ""),
  the conversation to answer and the user turns that follow, or a plain text."""

  id: str
  category: str = ""
  messages: tuple = ()  # ({"role", "content"}, ...), the last a user message
  turns: tuple[str, ...] = ()  # later user turns, answered one after the other
  text: str | None = None  # a plain-text prompt (no chat template)
  ids: tuple[int, ...] | None = None  # token ids, encoded by the caller

  @property
  def group(self) -> str:
    """The column a report puts it under: Spec-Bench's grouping (MT-Bench's eight
    categories as one), any other category as itself."""
    from jspec.bench.questions import group

    return group(self.category) if self.category else ""

  @property
  def first_user_turn(self) -> str:
    """The user message answered first (the text of a plain prompt)."""
    return self.text if self.text is not None else self.messages[-1]["content"]


@dataclasses.dataclass(frozen=True)
class Workload:
  """A named, ordered set of prompts."""

  name: str
  prompts: tuple[Prompt, ...]

  def first_turns(self) -> "Workload":
    """The same prompts without their later turns."""
    return Workload(self.name, tuple(dataclasses.replace(p, turns=()) for p in self.prompts))

  def head(self, n: int) -> "Workload":
    """The first n prompts."""
    return Workload(self.name, self.prompts[:n])

  def per_category(self, n: int) -> "Workload":
    """The first n prompts of each category, categories in turn (the order `pick` keeps)."""
    cats = list(dict.fromkeys(p.category for p in self.prompts))
    by = {c: [p for p in self.prompts if p.category == c] for c in cats}
    return Workload(self.name, tuple(by[c][i] for i in range(n) for c in cats
                                     if i < len(by[c])))


def from_ids(name: str, prompts) -> Workload:
  """A workload of prompts already encoded (lists of token ids), ids "0", "1", ..."""
  out = []
  for i, p in enumerate(prompts):
    ids = tuple(int(t) for t in p)
    if not ids:
      raise ValueError(f"prompt {i} of {name!r} is empty")
    out.append(Prompt(str(i), ids=ids))
  return Workload(name, tuple(out))


def chat_prompts(checkpoints: str | None = None) -> list[dict]:
  """The held-out chat prompts: [{"kind": restate|explain|question, "content": text}]."""
  from jspec.io import shipped

  with open(os.path.join(shipped.checkpoints_dir(checkpoints), "chat_prompts.json"),
            encoding="utf-8") as f:
    return json.load(f)


def pick(prompts: list[dict], per_kind: int) -> list[dict]:
  """The first `per_kind` prompts of each kind, kinds in turn."""
  by_kind = {k: [p for p in prompts if p["kind"] == k] for k in CHAT_KINDS}
  return [p for i in range(per_kind) for k in CHAT_KINDS if i < len(by_kind[k])
          for p in [by_kind[k][i]]]


def user(text: str) -> tuple:
  """A conversation of one user message."""
  return ({"role": "user", "content": text},)


def agent() -> Workload:
  """The agent workload: per function of AGENT_FUNCTIONS (its source, at most 30 lines, as
  a tool's output), a conversation of AGENT_TURNS' three user turns."""
  import importlib
  import inspect

  out = []
  for dotted in AGENT_FUNCTIONS:
    module, name = dotted.rsplit(".", 1)
    code = "\n".join(inspect.getsource(getattr(importlib.import_module(module), name))
                     .splitlines()[:30])
    first, *later = (t.format(name=name, code=code) for t in AGENT_TURNS)
    out.append(Prompt(name, "multi-turn", user(first), tuple(later)))
  return Workload("agent", tuple(out))


def load(name: str, checkpoints: str | None = None) -> Workload:
  """The workload called `name` (module docstring); a clear ValueError otherwise."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"a workload name is a non-empty string: {HELP}")
  if name in ("chat", *CHAT_KINDS, "free"):
    kinds = {"free": ("explain", "question"), "chat": CHAT_KINDS}.get(name, (name,))
    rows = chat_prompts(checkpoints)
    counters: dict[str, int] = {}
    out = []
    for p in rows:
      n = counters[p["kind"]] = counters.get(p["kind"], 0) + 1
      if p["kind"] in kinds:
        out.append(Prompt(f"{p['kind']}-{n}", p["kind"], user(p["content"])))
    return Workload(name, tuple(out))
  if name in ("spec-bench", "mt-bench") or name.startswith("spec-bench:"):
    from jspec.bench import questions

    path = name.split(":", 1)[1] if ":" in name else questions.default_questions()
    qs = questions.read_questions(path)
    if name == "mt-bench":
      qs = [q for q in qs if q.group == questions.MULTI_TURN]
    return Workload(name, tuple(Prompt(str(q.question_id), q.category, user(q.turns[0]),
                                       tuple(q.turns[1:])) for q in qs))
  if name == "agent":
    return agent()
  if name.startswith(("jsonl:", "chat:")):
    convs = read_chat_prompts(name.split(":", 1)[1])
    return Workload(name, tuple(Prompt(str(i), "", tuple(c)) for i, c in enumerate(convs)))
  if name.startswith("text:"):
    texts = read_prompts(name.split(":", 1)[1])
    return Workload(name, tuple(Prompt(str(i), "", text=t) for i, t in enumerate(texts)))
  raise ValueError(f"unknown workload {name!r}; known: {HELP}")


def encode(tokenizer, messages, where: str = "the model") -> list[int]:
  """A conversation's token ids under the chat template, ready for the assistant's turn."""
  return chat_prompt_ids(tokenizer, [list(messages)], where)[0]


def read_prompts(path: str) -> list[str]:
  """Text prompts from a file: JSONL (a string, or an object with "prompt" or
  "text", per line) when the name ends in .jsonl; otherwise prompts separated
  by lines holding only `---` (a file without one is a single prompt)."""
  if not path.endswith(".jsonl"):
    return _separated(path)
  prompts = []
  for where, item in _jsonl(path):
    if isinstance(item, dict):
      if "messages" in item and not ("prompt" in item or "text" in item):
        raise ValueError(f"{where}: a 'messages' row is a conversation: read it with "
                         f"read_chat_prompts (on the command line: --chat)")
      item = item.get("prompt", item.get("text"))
    if not isinstance(item, str) or not item:
      raise ValueError(f"{where}: expected a string or an object with a non-empty "
                       f"'prompt' or 'text' field")
    prompts.append(item)
  return _nonempty(prompts, path)


def read_chat_prompts(path: str) -> list[list[dict]]:
  """Conversations for a chat model, to be put through its chat template
  (`chat_prompt_ids`): from JSONL, per line an object with "messages" (a list of
  {"role", "content"} dicts) or "text" (or "prompt": one user message), or a string
  (one user message); from any other file, prompts separated by `---` lines, each one
  user message. Every row is checked here, before any model is loaded."""
  user = lambda text: [{"role": "user", "content": text}]
  if not path.endswith(".jsonl"):
    return [user(p) for p in _separated(path)]
  conversations = []
  for where, item in _jsonl(path):
    if isinstance(item, dict) and "messages" in item:
      messages = item["messages"]
      if not isinstance(messages, list) or not messages or not all(
          isinstance(m, dict) and isinstance(m.get("role"), str)
          and isinstance(m.get("content"), str) for m in messages):
        raise ValueError(f"{where}: 'messages' must be a non-empty list of "
                         f'{{"role": ..., "content": ...}} objects with string values')
      conversations.append([{"role": m["role"], "content": m["content"]} for m in messages])
      continue
    if isinstance(item, dict):
      item = item.get("text", item.get("prompt"))
    if not isinstance(item, str) or not item:
      raise ValueError(f"{where}: expected an object with 'text' (one user message) or "
                       f"'messages' (a list of role/content objects), or a string")
    conversations.append(user(item))
  return _nonempty(conversations, path)


def chat_prompt_ids(tokenizer, conversations, where: str = "the model") -> list[list[int]]:
  """Token ids of each conversation under the tokenizer's chat template, ending with the
  header of the assistant's turn (the prompt a chat model answers)."""
  if tokenizer is None or tokenizer.chat_template is None:
    raise ValueError(f"{where} has no chat template to apply; encode the prompts as plain "
                     f"text (on the command line: without --chat)")
  return [[int(i) for i in tokenizer.apply_chat_template(c, add_generation_prompt=True,
                                                          tokenize=True)]
          for c in conversations]


def _jsonl(path: str):
  """("path:line", parsed JSON) of each non-blank line."""
  with open(path, encoding="utf-8") as f:
    content = f.read()
  for n, line in enumerate(content.splitlines(), 1):
    if not line.strip():
      continue
    try:
      item = json.loads(line)
    except ValueError as e:
      raise ValueError(f"{path}:{n}: not JSON: {e}") from e
    yield f"{path}:{n}", item


def _separated(path: str) -> list[str]:
  """Prompts separated by lines holding only `---`."""
  with open(path, encoding="utf-8") as f:
    content = f.read()
  parts, current = [], []
  for line in content.splitlines(keepends=True):
    if line.strip() == "---":
      parts.append("".join(current))
      current = []
    else:
      current.append(line)
  parts.append("".join(current))
  return _nonempty([p for p in parts if p.strip()], path)


def _nonempty(prompts: list, path: str) -> list:
  if not prompts:
    raise ValueError(f"{path}: no prompts found")
  return prompts
