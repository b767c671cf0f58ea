"""The tables the docs quote, by name, and the page markers that quote them.

    tables.TABLES["spec-bench.speedup"](header, recs)      # what docs/benchmarks.md shows
    tables.render("engine.load", "docs/bench/engine_load_smollm2.jsonl")

A table the docs quote is written between

    <!-- table NAME FILE -->
    ...
    <!-- /table -->

in README.md or docs/*.md; `tests/test_docs.py` renders `TABLES[NAME]` from the records of
FILE and fails where the page says anything else. FILE may name several files with one
brace group, `docs/bench/serve/restate_{jspec-plain,vllm-plain}.jsonl`, read in that order.
The registry sits above the studies whose tables it names (`report`'s functions and each
study module's own, `pair`), so none of them imports another to be quoted.
"""

from __future__ import annotations

import re
from typing import Callable

from jspec.bench import pair, report

TABLES: dict[str, Callable] = {
    "spec-bench.readme": report.spec_bench_readme,
    "spec-bench.speedup": report.spec_bench_speedup,
    "spec-bench.predicted": report.spec_bench_predicted,
    "serve.load": report.serve_load,
    "real-ngram.transformers": report.real_ngram_transformers,
    "heads-real.sets": report.heads_real_sets,
    "assisted.tokens-per-s": report.assisted_tokens_per_s,
    "eagle-trees.shapes": report.eagle_trees_shapes,
    "spec-bench.heads-385k": report.spec_bench_heads({
        "draft": "draft model (shipped), K = 4", "eagle3": "EAGLE-3 (shipped), K = 4",
        "eagle3-tree": "EAGLE-3 (shipped), dynamic tree 32 nodes, depth 4, top-8",
        "dflash": "DFlash (385k point), K = 4"}),
    "spec-bench.heads-1.13m": report.spec_bench_heads_against({
        "draft": "draft model (shipped), K = 4", "eagle3": "EAGLE-3 (1.13M head), K = 4",
        "eagle3-tree": "EAGLE-3 (1.13M head), dynamic tree 32 nodes, depth 4, top-8"}),
    "capacity.cache": report.capacity_cache,
    "many.static": report.many_static,
    "many.vllm": report.many_vllm,
    "engine.load": report.engine_load,
    "quant.agreement": report.quant_agreement,
    # `jspec bench` on the shipped pair, a table per section (`pair.section_tables`)
    **{f"pair.{name}": pair.section_table(name) for name in pair.TABLE_SECTIONS},
}


MARKER = re.compile(r"<!-- table (\S+) (\S+) -->\n(.*?)\n<!-- /table -->", re.S)


def quoted_tables(text: str) -> list[tuple[str, str, str]]:
  """(table name, records file, the table as the page shows it) of each marked table."""
  return [(m.group(1), m.group(2), m.group(3).strip()) for m in MARKER.finditer(text)]


def paths(path: str) -> list[str]:
  """The files `path` names: itself, or one per item of its one brace group
  (`a_{x,y}.jsonl` -> a_x.jsonl, a_y.jsonl)."""
  m = re.fullmatch(r"([^{}]*)\{([^{}]*)\}([^{}]*)", path)
  if m is None:
    if "{" in path or "}" in path:
      raise ValueError(f"{path!r}: at most one brace group, {{a,b}}")
    return [path]
  return [m.group(1) + item + m.group(3) for item in m.group(2).split(",")]


def read(path: str) -> tuple[dict, list]:
  """(header, records) of the files `path` names (`paths`): one file's own header, or
  {"files": [each file's header]} of several, their records joined in order."""
  from jspec.bench import records

  heads, recs = [], []
  for one in paths(path):
    head, mine = records.read(one)
    heads.append(head)
    recs += mine
  return (heads[0] if len(heads) == 1 else {"files": heads}), recs


def render(name: str, path: str) -> str:
  """The table `name` rendered from the records in `path` (relative to the repository)."""
  if name not in TABLES:
    raise ValueError(f"unknown table {name!r}; known: {', '.join(TABLES)}")
  head, recs = read(path)
  return TABLES[name](head, recs)


def refresh(text: str, root: str = ".") -> str:
  """A page with every marked table rendered again from its records."""
  import os

  def sub(m):
    table = render(m.group(1), os.path.join(root, m.group(2)))
    return f"<!-- table {m.group(1)} {m.group(2)} -->\n{table}\n<!-- /table -->"

  return MARKER.sub(sub, text)
