"""Trained drafters on a real model against plain decoding and n-gram lookup: a chain of K
drafts, and (for EAGLE heads) a dynamic tree (EAGLE-2) within a node budget.

    python -m jspec.bench.heads_real --head DIR [--head DIR2 ...] [--k 4]
        [--tree 16,5,4] [--per-kind 2] [--max-new-tokens 64] [--repeats 3] [--json out.jsonl]

Each `--head` is a drafter folder: an EAGLE head (`python -m jspec.recipes.smollm2_eagle3`),
a draft model (`python -m jspec.recipes.smollm2_draft`) or any folder `jspec measure
--drafter` reads, loaded for the target (SmolLM2-135M-Instruct by default), named in the
records by the spec of its folder's name ("smollm2-eagle3@k=4", "smollm2-eagle3@tree=16,5,4").
Sets, timing and latency as `jspec.bench.lookahead` (the chat prompts only): batch 1,
greedy, methods interleaved, every call streamed, answers compared with plain decoding's.
"""

from __future__ import annotations

import os

from jspec.bench import lookahead
from jspec.bench import methods as registry

STUDY = "heads-real"


def build_heads(target, heads, k: int, tree: str | None) -> dict:
  """{name: `jspec.bench.methods.Built`}: each drafter folder as a chain of k ("NAME@k=k"),
  and one that grows dynamic trees also as the tree `tree` ("N,D,K"; "NAME@tree=N,D,K"),
  NAME the folder's name. A folder that does not fit the target is a SystemExit saying why."""
  from jspec.core.drafter import DynamicTreeDrafter

  out = {}
  for path in heads:
    name = os.path.basename(os.path.normpath(path))
    try:
      chain = out[f"{name}@k={k}"] = registry.build(f"{path}@k={k}", target)
      if tree is not None and isinstance(chain.drafter, DynamicTreeDrafter):
        out[f"{name}@tree={tree}"] = registry.build(f"{path}@tree={tree}", target)
    except (ValueError, registry.Unavailable) as e:
      raise SystemExit(f"--head {path}: {e}") from None
  return out


def main(argv=None) -> int:
  """The command line (module docstring)."""
  p = lookahead.arguments("python -m jspec.bench.heads_real", __doc__.splitlines()[0], "ngram")
  p.add_argument("--head", action="append", required=True,
                 help="a drafter folder (EAGLE head, draft model)")
  p.add_argument("--tree", default="16,5,4",
                 help="dynamic tree nodes,depth,top_k ('none': chains only)")
  args = p.parse_args(argv)
  tree = None if args.tree == "none" else args.tree
  lookahead.check(p, registry.split(args.methods) + [f"{h}@k={args.k}" for h in args.head]
                  + ([f"{h}@tree={tree}" for h in args.head] if tree else []))
  return lookahead.execute(args, STUDY, lambda target: build_heads(target, args.head, args.k,
                                                                   tree))


if __name__ == "__main__":
  raise SystemExit(main())
