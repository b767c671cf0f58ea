"""The layering docs/architecture.md draws holds: the engine and the drafters never
import the model zoo (`jspec.models`). They reach a model only through the model
contract (`jspec.Model`: apply, init_cache and the optional prepare, axes and head
functions), so any architecture that follows the contract works with every drafter.

Every module under jspec/ counts as engine or drafter unless it is listed below as
checkpoint I/O or a tool (those may build reference models); a new module starts on
the engine side. The check reads the source (no import), so it also sees imports made
inside functions.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jspec"

# May import jspec.models: the package root (it exports the zoo), checkpoint and tokenizer
# I/O, and the tools (CLI, demo, chat, benchmarks, measurement).
OUTSIDE_THE_ENGINE = {
    "__init__", "checkpoint", "gguf_file", "gguf_tokenizer", "tokenizer", "text", "compilation",
    "cli", "demo", "chat", "bench", "bench_real", "bench_heads", "measure", "costs",
}


def zoo_imports(source: str) -> list[str]:
  """Lines of `source` that import `jspec.models` or reach it through `jspec.models`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [f"{node.lineno}: import {a.name}" for a in node.names
                if a.name == "jspec.models" or a.name.startswith("jspec.models.")]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      if node.module == "jspec.models" or node.module.startswith("jspec.models."):
        found.append(f"{node.lineno}: from {node.module} import ...")
      elif node.module == "jspec" and any(a.name == "models" for a in node.names):
        found.append(f"{node.lineno}: from jspec import models")
    elif (isinstance(node, ast.Attribute) and node.attr == "models"
          and isinstance(node.value, ast.Name) and node.value.id == "jspec"):
      found.append(f"{node.lineno}: jspec.models")
  return found


def engine_modules() -> list[pathlib.Path]:
  return sorted(p for p in ROOT.glob("*.py") if p.stem not in OUTSIDE_THE_ENGINE)


def test_the_check_sees_every_way_in():
  """Planted violations are found (top-level and inside a function); clean code is not."""
  bad = ("import jax\nfrom jspec.models import transformer\nimport jspec.models.hf as hf\n"
         "def f():\n  from jspec import models, sampling\n  import jspec\n"
         "  return jspec.models.init\n")
  assert [line.split(":")[0] for line in zoo_imports(bad)] == ["2", "3", "5", "7"]
  assert zoo_imports("from jspec import nn, sampling\nfrom jspec.model import Model\n") == []


def test_the_engine_list_is_not_empty():
  names = {p.stem for p in engine_modules()}
  assert {"api", "decode", "acceptance", "sampling", "eagle", "medusa", "ngram",
          "draft_model", "nn", "model"} <= names
  assert not OUTSIDE_THE_ENGINE - {p.stem for p in ROOT.glob("*.py")}, "stale entries"


@pytest.mark.parametrize("path", engine_modules(), ids=lambda p: p.name)
def test_engine_and_drafters_never_import_the_model_zoo(path):
  found = zoo_imports(path.read_text())
  assert not found, f"jspec/{path.name} imports the model zoo: {found}"
