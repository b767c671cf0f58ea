"""The layering docs/architecture.md draws holds, read from the source of every module
of `jspec/`, `models/` and `benchmarks/` (imports inside functions included; nothing is
imported):

    benchmarks       anything of jspec (scripts: nothing imports them)
    jspec.recipes    anything
    jspec.tools      all below
    jspec.training   all below
    jspec.io         planner, models, drafters, core
    jspec.planner    drafters, core
    jspec.drafters   core            jspec.models   core
    jspec.core       nothing of jspec

No module imports one of a layer above its own, no two modules import each other,
directly or around a longer cycle, and no module imports another's private names.
Importing `jspec.core.decode` loads the engine alone (not flax, not any layer above).
`jspec/core` does no timing and no file I/O and keeps no state between calls.
"""

import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# What each layer may import (besides itself).
ALLOWED = {
    "core": set(),
    "drafters": {"core"},
    "models": {"core"},
    "planner": {"core", "drafters"},
    "io": {"core", "drafters", "models", "planner"},
    "training": {"core", "drafters", "models", "planner", "io"},
    # The measurement harness: below the command line, beside nothing it measures.
    "bench": {"core", "drafters", "models", "planner", "io", "training"},
    "tools": {"core", "drafters", "models", "planner", "io", "training", "bench"},
    "recipes": {"core", "drafters", "models", "planner", "io", "training", "bench", "tools"},
    # Scripts run as `python benchmarks/x.py`, outside the wheel: the top, a leaf.
    "benchmarks": {"core", "drafters", "models", "planner", "io", "training", "bench",
                   "tools", "recipes"},
}
# The import roots the graph follows: jspec's (models/ installs as jspec.models) and the
# benchmark scripts'.
ROOTS = ("jspec", "benchmarks")


def folder_of(layer: str) -> pathlib.Path:
  return REPO / {"models": "models", "benchmarks": "benchmarks"}.get(layer, f"jspec/{layer}")


def dotted(layer: str, stem: str) -> str:
  package = "benchmarks" if layer == "benchmarks" else f"jspec.{layer}"
  return package if stem == "__init__" else f"{package}.{stem}"


def all_modules() -> dict[str, pathlib.Path]:
  """Dotted name -> file, for every module of the installed namespace and every
  benchmark script (`benchmarks.capture_cost` for benchmarks/capture_cost.py)."""
  found = {"jspec": REPO / "jspec" / "__init__.py"}
  for layer in ALLOWED:
    for path in sorted(folder_of(layer).glob("*.py")):
      found[dotted(layer, path.stem)] = path
  return found


def imports(source: str, package: str, known) -> list[tuple[int, str, tuple[str, ...]]]:
  """(line, module, names) for each import of a jspec module in `source`; names are
  what a `from` import takes from it. `package`: the importing module's package, for
  relative imports. Attribute chains `jspec.x.y` count as imports of `jspec.x.y`."""
  found, inner = [], set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(node.lineno, a.name, ()) for a in node.names if a.name.split(".")[0] in ROOTS]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      if base.split(".")[0] not in ROOTS:
        continue
      for a in node.names:  # `from jspec.core import decode` imports a module
        sub = f"{base}.{a.name}"
        if sub in known:
          found.append((node.lineno, sub, ()))
        else:
          found.append((node.lineno, base, (a.name,)))
    elif isinstance(node, ast.Attribute) and id(node) not in inner:
      chain = []
      value = node
      while isinstance(value, ast.Attribute):
        chain.append(value.attr)
        inner.add(id(value.value))  # the chain's shorter prefixes are this same use
        value = value.value
      if isinstance(value, ast.Name) and value.id in ROOTS and chain:
        found.append((node.lineno, f"{value.id}." + ".".join(reversed(chain)), ()))
  return sorted(found, key=lambda f: f[0])


def private_uses(source: str, package: str, known) -> list[tuple[int, str]]:
  """(line, "module._name") for each private name read through an imported jspec module
  (`from jspec.tools import bench_timing` ... `bench_timing.row`)."""
  tree = ast.parse(source)
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      for a in node.names:
        if f"{base}.{a.name}" in known:
          aliases[a.asname or a.name] = f"{base}.{a.name}"
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.asname and a.name in known:
          aliases[a.asname] = a.name
  return [(node.lineno, f"{aliases[node.value.id]}.{node.attr}") for node in ast.walk(tree)
          if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id in aliases and node.attr.startswith("_")
          and not node.attr.startswith("__")]


def layer_of(module: str) -> str | None:
  parts = module.split(".")
  if parts[0] == "benchmarks":
    return "benchmarks"
  return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def owner(module: str, known) -> str:
  """The longest known module that `module` names (an attribute chain may go past it)."""
  parts = module.split(".")
  for n in range(len(parts), 0, -1):
    if ".".join(parts[:n]) in known:
      return ".".join(parts[:n])
  return module


def module_findings(name: str, source: str, package: str, known):
  """(the modules `name` imports, [(line, problem)]) for one module's source."""
  edges, problems = set(), []
  mine = layer_of(name)
  for line, chain, names in imports(source, package, known):
    target = owner(chain, known)
    rest = chain[len(target) + 1:].split(".")[0] if chain != target else ""
    if rest.startswith("_") and not rest.startswith("__") and target != name:
      problems.append((line, f"{name} reads the private name {target}.{rest}"))
    if target == name:
      continue
    theirs = layer_of(target)
    if theirs == "benchmarks":
      problems.append((line, f"{name} imports the benchmark script {chain}"))
    elif mine and theirs and theirs != mine and theirs not in ALLOWED[mine]:
      problems.append((line, f"{name} ({mine}) imports {target} ({theirs})"))
    if (name != "jspec" and mine != "benchmarks" and target == "jspec"
        and not set(names) <= {"__version__"}):  # a script may use the public API
      problems.append((line, f"{name} imports {names} through the top-level jspec"))
    for n in names:
      if n.startswith("_") and not n.startswith("__"):
        problems.append((line, f"{name} imports the private name {target}.{n}"))
    if target in known and target != "jspec":
      edges.add(target)
  for line, used in private_uses(source, package, known):
    problems.append((line, f"{name} reads the private name {used}"))
  if mine == "benchmarks":  # `python benchmarks/x.py` puts benchmarks/ on the path
    for line, script in sibling_imports(source, known):
      problems.append((line, f"{name} imports the benchmark script {script}"))
  return edges, sorted(problems)


def graph():
  known = all_modules()
  edges: dict[str, set[str]] = {m: set() for m in known}
  problems = []
  for name, path in known.items():
    package = name if path.stem == "__init__" else name.rsplit(".", 1)[0]
    edges[name], found = module_findings(name, path.read_text(), package, known)
    problems += [f"{path.relative_to(REPO)}:{line}: {what}" for line, what in found]
  return known, edges, problems


def sibling_imports(source: str, known) -> list[tuple[int, str]]:
  """(line, "benchmarks.x") for each import of a benchmark script by its bare name
  (`import ngram_bench`, `from ngram_bench import ...`), as one script beside another
  would write it."""
  stems = {m.split(".", 1)[1] for m in known if m.startswith("benchmarks.")}
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(node.lineno, f"benchmarks.{a.name}") for a in node.names
                if a.name.split(".")[0] in stems]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      if node.module.split(".")[0] in stems:
        found.append((node.lineno, f"benchmarks.{node.module}"))
  return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  sys.setrecursionlimit(10000)
  for v in edges:
    if v not in index:
      visit(v)
  return out


def test_the_check_sees_every_way_in():
  """Planted imports are found: top level, inside a function, relative, attribute chains,
  private names; a planted cycle is found."""
  known = {"jspec.core", "jspec.core.decode", "jspec.tools", "jspec.tools.bench",
           "jspec.drafters", "jspec.drafters.ngram"}
  src = ("import jax\nfrom jspec.tools import bench\nimport jspec.tools.bench as b\n"
         "def f():\n  from . import decode\n  import jspec\n  return jspec.drafters.ngram.x\n"
         "from jspec.core.decode import _private\n")
  found = imports(src, "jspec.core", known)
  assert [(line, owner(m, known)) for line, m, _ in found] == [
      (2, "jspec.tools.bench"), (3, "jspec.tools.bench"), (5, "jspec.core.decode"),
      (6, "jspec"), (7, "jspec.drafters.ngram"), (8, "jspec.core.decode")]
  assert found[-1][2] == ("_private",)
  assert private_uses("from jspec.tools import bench\nimport jspec.core.decode as d\n"
                      "x = bench._row(d._go, bench.row)\n", "jspec.tools", known) == [
                          (3, "jspec.tools.bench._row"), (3, "jspec.core.decode._go")]
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_check_sees_benchmarks():
  """The benchmark scripts are in the graph at the top: a planted private name read by a
  script, a planted import of a script (from jspec, or from a script beside it, by its bare
  name or through `benchmarks.`) and a planted private attribute chain are found."""
  known = {"jspec", "jspec.recipes", "jspec.recipes.smollm2_eagle3", "jspec.tools",
           "jspec.tools.demo", "benchmarks.capture_cost", "benchmarks.ngram_bench"}
  src = ("import jspec\nfrom jspec.recipes.smollm2_eagle3 import _features\n"
         "from jspec.tools import demo\nx = demo._path() + jspec.tools.demo._y\n"
         "import benchmarks.ngram_bench\nimport ngram_bench\nfrom ngram_bench import run\n"
         "jspec.generate\n")
  found = imports(src, "benchmarks", known)
  assert [(line, owner(m, known), n) for line, m, n in found] == [
      (1, "jspec", ()), (2, "jspec.recipes.smollm2_eagle3", ("_features",)),
      (3, "jspec.tools.demo", ()), (4, "jspec.tools.demo", ()),
      (5, "benchmarks.ngram_bench", ()), (8, "jspec", ())]
  assert found[3][1] == "jspec.tools.demo._y"
  assert private_uses(src, "benchmarks", known) == [(4, "jspec.tools.demo._path")]
  assert sibling_imports(src, known) == [(6, "benchmarks.ngram_bench"),
                                         (7, "benchmarks.ngram_bench")]
  edges, problems = module_findings("benchmarks.capture_cost", src, "benchmarks", known)
  assert edges == {"jspec.recipes.smollm2_eagle3", "jspec.tools.demo", "benchmarks.ngram_bench"}
  assert problems == [
      (2, "benchmarks.capture_cost imports the private name "
          "jspec.recipes.smollm2_eagle3._features"),
      (4, "benchmarks.capture_cost reads the private name jspec.tools.demo._path"),
      (4, "benchmarks.capture_cost reads the private name jspec.tools.demo._y"),
      (5, "benchmarks.capture_cost imports the benchmark script benchmarks.ngram_bench"),
      (6, "benchmarks.capture_cost imports the benchmark script benchmarks.ngram_bench"),
      (7, "benchmarks.capture_cost imports the benchmark script benchmarks.ngram_bench")]
  _, problems = module_findings("jspec.tools.demo", "import benchmarks.capture_cost\n",
                                "jspec.tools", known)
  assert problems == [(1, "jspec.tools.demo imports the benchmark script "
                          "benchmarks.capture_cost")]
  assert layer_of("benchmarks.capture_cost") == "benchmarks"
  assert set(ALLOWED["benchmarks"]) == set(ALLOWED) - {"benchmarks"}
  assert not any("benchmarks" in allowed for layer, allowed in ALLOWED.items())


def test_every_module_is_in_a_layer():
  """Every Python file of jspec/, models/ and benchmarks/ is in the graph, and every layer
  has modules."""
  known = all_modules()
  files = ({p for p in (REPO / "jspec").rglob("*.py")} | set((REPO / "models").glob("*.py"))
           | set((REPO / "benchmarks").glob("*.py")))
  assert files == set(known.values())
  assert {layer_of(m) for m in known} - {None} == set(ALLOWED)
  assert {"jspec.core.decode", "jspec.planner.api", "jspec.models.transformer",
          "jspec.training.trainer", "jspec.recipes.smollm2",
          "benchmarks.capture_cost"} <= set(known)


def test_no_upward_import_no_private_names():
  _, _, problems = graph()
  assert not problems, "\n".join(problems)


def test_no_import_cycle():
  _, edges, _ = graph()
  found = cycles(edges)
  assert not found, f"modules that import each other: {found}"


def test_the_engine_loads_alone():
  """`import jspec.core.decode` loads no module of drafters, models, planner, io,
  training, tools or recipes, and not flax."""
  code = ("import sys, jspec.core.decode, jspec.core.programs\n"
          "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('jspec.', 'flax')))))")
  loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=REPO).stdout.split()
  assert "jspec.core.decode" in loaded
  above = [m for m in loaded if m.startswith("flax") or layer_of(m) not in (None, "core")]
  assert not above, above


# What the engine may not do. Timing and file I/O belong to the planner and the tools;
# state kept between calls (caches, listeners) to the planner.
FORBIDDEN_MODULES = {"time", "os", "pathlib", "shutil", "tempfile", "threading", "platform",
                     "pickle", "io", "glob", "weakref", "timeit", "functools.lru_cache"}
FORBIDDEN_CALLS = {"open", "perf_counter", "lru_cache", "cache", "block_until_ready"}


def engine_findings(source: str) -> list[str]:
  """Timing, file I/O and module-level mutable state in one module's source."""
  tree = ast.parse(source)
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [f"{node.lineno}: import {a.name}" for a in node.names
                if a.name.split(".")[0] in FORBIDDEN_MODULES]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      if node.module.split(".")[0] in FORBIDDEN_MODULES:
        found.append(f"{node.lineno}: from {node.module} import ...")
    elif isinstance(node, ast.Call):
      fn = node.func
      name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
      if name in FORBIDDEN_CALLS:
        found.append(f"{node.lineno}: calls {name}")
    elif isinstance(node, (ast.Global, ast.Nonlocal)) and isinstance(node, ast.Global):
      found.append(f"{node.lineno}: global {', '.join(node.names)}")
  mutable = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
  for node in tree.body:  # module level: state that outlives a call
    value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
    if value is None:
      continue
    if isinstance(value, mutable) or (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
        and value.func.id in {"dict", "list", "set", "defaultdict", "OrderedDict"}):
      found.append(f"{node.lineno}: module-level mutable {ast.unparse(node).split('=')[0]}")
  return found


def test_the_engine_check_sees_what_it_forbids():
  src = ("import time\nfrom os import path\n_MEMO = {}\nTABLE: dict = dict()\nX = (1, 2)\n"
         "def f():\n  global _MEMO\n  with open('x') as fh:\n    return time.perf_counter()\n")
  assert [f.split(":")[0] for f in engine_findings(src)] == ["1", "2", "7", "8", "9", "3", "4"]
  assert engine_findings("import jax\nCHOICES = (0, 1)\nNAMES = frozenset({'a'})\n") == []


@pytest.mark.parametrize("path", sorted((REPO / "jspec" / "core").glob("*.py")),
                         ids=lambda p: p.name)
def test_the_engine_keeps_no_state_times_nothing_reads_no_files(path):
  found = engine_findings(path.read_text())
  assert not found, f"jspec/core/{path.name}: {found}"


def module_attributes(source: str, package: str, known) -> list[tuple[int, str, str]]:
  """(line, module, name) for each `alias.name` read through an imported jspec module."""
  tree = ast.parse(source)
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      aliases.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names
                      if f"{base}.{a.name}" in known})
    elif isinstance(node, ast.Import):
      aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
  return [(node.lineno, aliases[node.value.id], node.attr) for node in ast.walk(tree)
          if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id in aliases]


def from_imports(source: str, package: str, known) -> list[tuple[int, str, str]]:
  """(line, module, name) for each `from module import name` of a jspec module that takes a
  name (not a submodule) from it."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      if base in known:
        found += [(node.lineno, base, a.name) for a in node.names
                  if a.name != "*" and f"{base}.{a.name}" not in known]
  return found


def test_every_name_read_through_a_module_exists():
  """`bench_timing.row(...)` after `row` was renamed fails only when that line runs: every
  `module.name` and every `from module import name` in jspec/, models/, benchmarks/ and
  tests/ is checked here against the module."""
  import importlib
  known = all_modules()
  files = dict(known)
  files.update({f"tests.{p.stem}": p for p in (REPO / "tests").glob("*.py")})
  missing = []
  for name, path in files.items():
    package = name if path.stem == "__init__" else name.rsplit(".", 1)[0]
    source = path.read_text()
    for line, module, attr in (module_attributes(source, package, known)
                               + from_imports(source, package, known)):
      if layer_of(module) == "benchmarks":
        continue  # nothing imports a script (test_no_upward_import_no_private_names)
      if not hasattr(importlib.import_module(module), attr):
        missing.append(f"{path.relative_to(REPO)}:{line}: {module}.{attr}")
  assert not missing, "\n".join(missing)
  assert module_attributes("from jspec.tools import bench_timing as t\nt.gone(1)\n",
                           "x", {"jspec.tools.bench_timing"}) == [
                               (2, "jspec.tools.bench_timing", "gone")]
  assert from_imports("from jspec.tools import bench_timing\nfrom jspec.tools.demo import "
                      "gone, smollm2_path as p\nfrom . import x\n", "jspec.tools",
                      {"jspec.tools", "jspec.tools.bench_timing", "jspec.tools.demo"}) == [
                          (2, "jspec.tools.demo", "gone"), (2, "jspec.tools.demo", "smollm2_path"),
                          (3, "jspec.tools", "x")]
