"""The layering docs/architecture.md draws holds:

    jspec.core      imports none of jspec.drafters, jspec.io, jspec.tools, jspec.models
                    (but its entry points, core/api.py, wrap a Model draft in DraftModel)
    jspec.drafters  imports jspec.core only (never io, tools or the model zoo)
    jspec.io        anything but jspec.tools
    jspec.tools     anything

The engine and the drafters reach a model only through the model contract
(`jspec.Model`: apply, init_cache and the optional prepare, axes and head functions),
so any architecture that follows the contract works with every drafter. The check
reads the source (no import), so it also sees imports made inside functions.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jspec"
LAYERS = ("core", "drafters", "io", "tools", "models")
FORBIDDEN = {
    "core": {"drafters", "io", "tools", "models"},
    "drafters": {"io", "tools", "models"},
    "io": {"tools"},
    "tools": set(),
}


def layer_imports(source: str, forbidden: set[str]) -> list[str]:
  """Lines of `source` that import (or reach through `jspec.<layer>`) a forbidden layer."""
  bad = lambda name: name in forbidden
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for a in node.names:
        parts = a.name.split(".")
        if parts[0] == "jspec" and len(parts) > 1 and bad(parts[1]):
          found.append(f"{node.lineno}: import {a.name}")
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      parts = node.module.split(".")
      if parts[0] == "jspec" and len(parts) > 1 and bad(parts[1]):
        found.append(f"{node.lineno}: from {node.module} import ...")
      elif node.module == "jspec":
        found += [f"{node.lineno}: from jspec import {a.name}" for a in node.names if bad(a.name)]
    elif (isinstance(node, ast.Attribute) and bad(node.attr)
          and isinstance(node.value, ast.Name) and node.value.id == "jspec"):
      found.append(f"{node.lineno}: jspec.{node.attr}")
  return found


# The one module that may reach one layer up, and what for.
EXCEPTIONS = {("core", "api.py"): {"drafters"}}  # speculative_generate(draft=Model) -> DraftModel


def modules(layer: str) -> list[pathlib.Path]:
  return sorted((ROOT / layer).glob("*.py"))


def test_the_check_sees_every_way_in():
  """Planted violations are found (top-level and inside a function); clean code is not."""
  bad = ("import jax\nfrom jspec.models import transformer\nimport jspec.tools.bench as b\n"
         "def f():\n  from jspec import models, core\n  import jspec\n"
         "  return jspec.drafters.ngram\n")
  assert [line.split(":")[0] for line in layer_imports(bad, FORBIDDEN["core"])] == \
      ["2", "3", "5", "7"]
  assert layer_imports(bad, FORBIDDEN["tools"]) == []
  assert layer_imports("from jspec.core import nn, sampling\nfrom jspec.core.model import "
                       "Model\n", FORBIDDEN["core"]) == []


def test_every_module_is_in_a_layer():
  assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py"]
  assert {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"} == \
      set(LAYERS) - {"models"}
  names = {p.stem for p in modules("core")} | {p.stem for p in modules("drafters")}
  assert {"api", "decode", "acceptance", "sampling", "eagle", "medusa", "ngram",
          "draft_model", "nn", "model"} <= names


@pytest.mark.parametrize("path", [p for layer in FORBIDDEN for p in modules(layer)],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_module_imports_a_layer_above_its_own(path):
  allowed = EXCEPTIONS.get((path.parent.name, path.name), set())
  found = layer_imports(path.read_text(), FORBIDDEN[path.parent.name] - allowed)
  assert not found, f"jspec/{path.parent.name}/{path.name} imports across layers: {found}"


def test_modules_stay_small():
  """One concern per module: none above 400 lines (split it when it grows past)."""
  sizes = {f"{p.parent.name}/{p.name}": len(p.read_text().splitlines())
           for layer in FORBIDDEN for p in modules(layer)}
  assert len(sizes) > 50
  assert not {name: n for name, n in sizes.items() if n > 400}
