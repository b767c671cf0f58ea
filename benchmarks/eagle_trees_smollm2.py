"""Which dynamic tree (EAGLE-2) of at most 32 nodes an EAGLE head should grow on SmolLM2:
held-out tau of the head as a K = 4 chain and as each tree, on MT-Bench first turns.

    python benchmarks/eagle_trees_smollm2.py [--head checkpoints/smollm2-eagle3]
        [--trees 16,4,4 24,4,4 32,4,8 32,5,4 32,6,4] [--conversations 20] [--new 128]
        [--json out.json]

The first `--conversations` MT-Bench questions of Spec-Bench's file (never trained on), turn
1 in the chat template, answered greedily as one ragged batch
(`jspec.recipes.learning_curve.batched_acceptance`: batch 1's figures), every answer checked
against plain greedy decoding. Tau only: where a verify of up to 32 tokens costs about one
step, the tree's cost over the chain is its drafting, `depth` passes of the head against K
(`jspec bench --suite spec-bench --methods eagle3,eagle3-tree` times both).
"""

import argparse
import json
import os
import sys
import time


def main(argv=None) -> int:
  import jspec
  from jspec.bench import methods, targets
  from jspec.recipes import learning_curve as LC

  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--head", default=os.path.join("checkpoints", "smollm2-eagle3"))
  ap.add_argument("--trees", nargs="+", default=["16,4,4", "24,4,4", "32,4,8", "32,5,4", "32,6,4"])
  ap.add_argument("--conversations", type=int, default=20)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--k", type=int, default=4)
  ap.add_argument("--questions", default=None)
  ap.add_argument("--json", default=None)
  args = ap.parse_args(argv)
  trees = []
  for spec in args.trees:
    try:
      nodes, depth, top_k = (int(x) for x in spec.split(","))
      trees.append(jspec.DynamicTree(nodes=nodes, depth=depth, top_k=top_k))
    except (TypeError, ValueError) as e:
      raise SystemExit(f"--trees {spec!r}: give NODES,DEPTH,TOP_K ({e})") from None
  questions = args.questions or LC.default_questions()
  if questions is None:
    raise SystemExit("no Spec-Bench question.jsonl found: give --questions")
  try:
    target = targets.load(targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(str(e)) from None
  head = methods.from_folder(args.head, target)
  prompts = LC.conversation_prompts(target, questions, args.conversations)
  rows = {}
  for name, tree in [(f"chain K={args.k}", None)] + [
      (f"tree {t.num_nodes} nodes, depth {t.max_depth}, top-{t.top_k}", t) for t in trees]:
    t0 = time.perf_counter()
    r = LC.batched_acceptance(target, head, prompts, args.k, args.new, tree=tree)
    if not r["greedy_equal"]:
      raise SystemExit(f"{name}: an answer differs from plain greedy decoding")
    r["verify_tokens"] = args.k + 1 if tree is None else tree.num_nodes
    r["head_passes_per_round"] = args.k if tree is None else tree.max_depth
    r["wall_seconds"] = round(time.perf_counter() - t0, 1)
    rows[name] = r
    print(f"{name:36s} tau {r['tau']:.3f}  verify {r['verify_tokens']:2d} tokens  "
          f"acceptance by position {r['accept_per_position']}", flush=True)
  report = {"head": os.path.normpath(args.head), "questions": os.path.basename(questions),
            "conversations": args.conversations, "new_tokens": args.new, "rows": rows}
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
