"""The prompt pool of an answer store (`jspec.recipes.answers`): a deterministic, seeded pool
of distinct chat prompts built from local data only.

Sources: the Python standard library's train split (the split of `jspec.training.corpus`: a
file is held out when sha256(relative path) mod 1000 < 60) under instruction templates
(explain, rewrite, document, test, review or translate a function; write a function from its
docstring; questions about a module's names; summarise, simplify, translate or question a
docstring paragraph; passages of the language reference (`pydoc_data.topics`) with questions
about them; seeded arithmetic word problems; general chat requests from template lists).
Sources are interleaved by fixed weights with a seeded generator; a prompt is identified by
the hash of its normalised text (`prompt_hash`), which is also what the exclusion of
evaluation prompts (`jspec.recipes.answer_exclusion`) and the store (`answer_store`) key on.

A pool file (`python -m jspec.recipes.answers pool --write FILE`: one {"source", "text"}
object a line, in pool order) is read back by `read_pool`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import inspect
import json
import os
import textwrap
from typing import Callable, Iterator

import numpy as np

from jspec.training import corpus

SOURCES = ("code", "write", "api", "prose", "docs", "math", "chat")
WEIGHTS = (0.34, 0.12, 0.10, 0.18, 0.06, 0.08, 0.12)  # of the pool, while a source lasts


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


def read_pool(path: str) -> list[Prompt]:
  """The prompts of a pool file (`jspec.recipes.answers.write_pool`), in its order (unknown
  sources refused)."""
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
