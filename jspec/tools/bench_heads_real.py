"""Trained drafters on a real model against plain decoding and n-gram lookup: a chain of K
drafts, and (for EAGLE heads) a dynamic tree (EAGLE-2) within a node budget.

    python -m jspec.tools.bench_heads_real --head DIR [--head DIR2 ...] [--k 4]
        [--tree 16,5,4] [--per-kind 2] [--max-new-tokens 64] [--repeats 3] [--json out.json]

Each `--head` is a drafter folder: an EAGLE head (`python -m jspec.recipes.smollm2_eagle3`),
a draft model (`python -m jspec.recipes.smollm2_draft`) or any folder `jspec measure
--drafter` reads, loaded for the target (SmolLM2-135M-Instruct by default). Sets, timing and latency
as `jspec.tools.bench_lookahead`: batch 1, greedy, the held-out chat prompts of the three
kinds, methods interleaved, speedup = plain time over the method's, answers compared
with plain ones.
"""

from __future__ import annotations

import argparse
import os


def head_methods(target, heads, k: int, tree) -> dict:
  """{name: (drafter, keywords)}: each drafter as a chain of k, and those that grow
  dynamic trees as the dynamic tree too."""
  from jspec.core.drafter import DynamicTreeDrafter
  from jspec.tools.chat import drafter_from_dir

  out = {}
  for path in heads:
    name = os.path.basename(os.path.normpath(path))
    head = drafter_from_dir(path, target)
    out[f"{name} K={k}"] = (head, {"num_draft_tokens": k})
    if tree is not None and isinstance(head, DynamicTreeDrafter):
      out[f"{name} tree{tree.num_nodes}"] = (head, {"tree": tree})
  return out


def main(argv=None) -> int:
  """The command line (module docstring)."""
  import jspec
  from jspec.tools import bench_lookahead
  from jspec.tools.bench_real import load_target, write_json

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  parser.add_argument("--head", action="append", required=True, help="a drafter folder (EAGLE head, draft model)")
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--tree", default="16,5,4",
                      help="dynamic tree nodes,depth,top_k ('none': chains only)")
  parser.add_argument("--per-kind", type=int, default=2)
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--methods", default="ngram", help="draft-free methods run beside")
  parser.add_argument("--json", help="write the report here")
  args = parser.parse_args(argv)
  tree = None
  if args.tree != "none":
    nodes, depth, top_k = (int(x) for x in args.tree.split(","))
    tree = jspec.DynamicTree(nodes=nodes, depth=depth, top_k=top_k)
  target = load_target(args.target)
  sets = bench_lookahead.prompt_sets(target, args.per_kind, 0, args.max_new_tokens)
  extra = head_methods(target, args.head, args.k, tree)
  methods = tuple(m for m in args.methods.split(",") if m)
  report = bench_lookahead.run(target, sets, methods, args.max_new_tokens, args.repeats,
                               extra=extra)
  write_json(report, args.json)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
