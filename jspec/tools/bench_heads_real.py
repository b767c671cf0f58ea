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


def build_heads(target, heads, k: int, tree: str | None) -> dict:
  """{name: `jspec.bench.methods.Built`}: each drafter folder as a chain of k ("NAME K=k",
  the spec "DIR@k=k"), and one that grows dynamic trees also as the tree `tree` ("N,D,K";
  "NAME treeN", the spec "DIR@tree=N,D,K"). A folder that does not fit the target is a
  SystemExit saying why."""
  from jspec.bench import methods as registry
  from jspec.core.drafter import DynamicTreeDrafter

  out = {}
  for path in heads:
    name = os.path.basename(os.path.normpath(path))
    specs = [(f"{name} K={k}", f"{path}@k={k}")]
    if tree is not None:
      specs.append((f"{name} tree{tree.split(',')[0]}", f"{path}@tree={tree}"))
    for label, spec in specs:
      if "@tree=" in spec and not isinstance(out[specs[0][0]].drafter, DynamicTreeDrafter):
        continue  # a chain drafter (a draft model): chains only
      try:
        out[label] = registry.build(spec, target)
      except (ValueError, registry.Unavailable) as e:
        raise SystemExit(f"--head {spec}: {e}") from None
  return out


def main(argv=None) -> int:
  """The command line (module docstring)."""
  from jspec.bench import methods as registry
  from jspec.bench import targets
  from jspec.tools import bench_lookahead
  from jspec.tools.bench_real import write_json

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2",
                      help="a target jspec.bench.targets resolves: smollm2, a GGUF file, a "
                           "checkpoint folder, a cached Hub id")
  parser.add_argument("--head", action="append", required=True,
                      help="a drafter folder (EAGLE head, draft model)")
  parser.add_argument("--k", type=int, default=4)
  parser.add_argument("--tree", default="16,5,4",
                      help="dynamic tree nodes,depth,top_k ('none': chains only)")
  parser.add_argument("--per-kind", type=int, default=2)
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--methods", default="ngram",
                      help="draft-free method specs (jspec.bench.methods) run beside")
  parser.add_argument("--json", help="write the report here")
  args = parser.parse_args(argv)
  tree = None if args.tree == "none" else args.tree
  others = registry.split(args.methods)
  checked = others + [f"{h}@k={args.k}" for h in args.head] + (
      [f"{h}@tree={tree}" for h in args.head] if tree else [])
  for spec in (s for s in checked if s != bench_lookahead.AUTO_ITL):  # before loading
    try:
      registry.parse_spec(spec)
    except ValueError as e:
      parser.error(str(e))
  target = targets.load(args.target)
  sets = bench_lookahead.prompt_sets(target, args.per_kind, 0, args.max_new_tokens)
  built = bench_lookahead.build_methods(target, others, args.k)
  built.update(build_heads(target, args.head, args.k, tree))
  report = bench_lookahead.run(target, sets, built, args.max_new_tokens, args.repeats)
  write_json(report, args.json)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
