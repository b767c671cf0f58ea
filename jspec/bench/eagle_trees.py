"""Which dynamic tree (EAGLE-2) of at most 32 nodes an EAGLE head should grow: held-out tau
of the head as a K = 4 chain and as each tree, on MT-Bench first turns.

    python -m jspec.bench.eagle_trees [--target smollm2] [--head DIR]
        [--trees 16,4,4 24,4,4 32,4,8 32,5,4 32,6,4] [--conversations 20] [--new 128]
        [--questions FILE] [--json out.jsonl]

The first `--conversations` MT-Bench questions (Spec-Bench's file with --questions, else
MT-Bench's own; never trained on), turn 1 in the chat template, answered greedily as one
ragged batch through the harness's runner (greedy rows do not interact and a row's calls
count only its own rounds: batch 1's figures), every answer compared with plain greedy
decoding's. The head is the shipped EAGLE head that fits the target (the registry's
"eagle3"), or --head. Tau only: where a verify of up to 32 tokens costs about one step,
the tree's cost over the chain is its drafting, `depth` passes of the head against K
(`jspec bench --suite spec-bench --methods eagle3,eagle3-tree` times both). The table is
`jspec.bench.tables.TABLES["eagle-trees.shapes"]`.
"""

from __future__ import annotations

import argparse
import dataclasses

from jspec.bench import methods as registry
from jspec.bench import report, runner
from jspec.bench import workloads as W

STUDY = "eagle-trees"
TREES = ("16,4,4", "24,4,4", "32,4,8", "32,5,4", "32,6,4")


def workload(conversations: int, questions: str | None = None) -> W.Workload:
  """The first turns of the first `conversations` MT-Bench questions."""
  from jspec.bench import questions as Q

  wl = W.load(f"spec-bench:{questions}" if questions else "mt-bench")
  mt = [p for p in wl.first_turns().prompts if p.group == Q.MULTI_TURN][:conversations]
  if len(mt) < conversations:
    raise SystemExit(f"--conversations {conversations}: {questions or 'MT-Bench'} holds "
                     f"{len(mt)} MT-Bench questions")
  return W.Workload("mt-bench", tuple(mt))


def variants(target, head: str | None, trees, k: int = 4) -> list[runner.Variant]:
  """Plain decoding, the head as a chain of k, and as each dynamic tree ("N,D,K")."""
  import os

  spec = head or "eagle3"
  name = "eagle3" if head is None else os.path.basename(os.path.normpath(head))
  out = [runner.plain()]
  for option in [f"k={k}"] + [f"tree={t}" for t in trees]:
    try:
      b = registry.build(f"{spec}@{option}", target)
    except (ValueError, registry.Unavailable) as e:
      raise SystemExit(f"{spec}@{option}: {e}") from None
    width = b.k + 1 if b.tree is None else b.tree.num_nodes
    out.append(runner.Variant(f"{name}@{option}", b, axes={"k": b.k, "verify_tokens": width}))
  return out


def label(built) -> str:
  """A shape as the table names it."""
  t = built.tree
  return (f"chain K={built.k}" if t is None
          else f"tree {t.num_nodes} nodes, depth {t.max_depth}, top-{t.top_k}")


def run(target, variants_, workload: W.Workload, new: int = 128,
        progress: bool = True) -> runner.Result:
  """Every variant on the workload as one batch, one timed run; a record per shape, its
  label and the head's passes a round (its K: a tree's depth) in `extra`."""
  ran = runner.run(target, variants_, workload, runner.Settings(
      max_new_tokens=new, repeats=1, batch=len(workload.prompts), progress=progress), STUDY)
  built = {v.name: v.built for v in variants_ if v.built is not None}
  recs = [r if r.method not in built else dataclasses.replace(
      r, extra={**r.extra, "label": label(built[r.method]),
                "head_passes_per_round": built[r.method].k}) for r in ran.records]
  return runner.Result(recs, ran.mismatches)


def main(argv=None) -> int:
  """The command line (module docstring)."""
  from jspec.bench import targets

  p = argparse.ArgumentParser(prog="python -m jspec.bench.eagle_trees",
                              description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  p.add_argument("--head", default=None, help="an EAGLE head folder (default: the shipped "
                                              "one that fits the target)")
  p.add_argument("--trees", nargs="+", default=list(TREES))
  p.add_argument("--conversations", type=int, default=20)
  p.add_argument("--new", type=int, default=128)
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--questions", default=None)
  p.add_argument("--json", default=None, help="write the records here (JSON lines)")
  args = p.parse_args(argv)
  for t in args.trees:  # before the model loads
    try:
      registry.parse_spec(f"eagle3@tree={t}")
    except ValueError as e:
      p.error(f"--trees {t!r}: {e}")
  try:
    wl = workload(args.conversations, args.questions)
    target = targets.load(args.target)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(str(e)) from None
  ran = run(target, variants(target, args.head, args.trees, args.k), wl, args.new)
  head = {"settings": {"conversations": args.conversations, "new_tokens": args.new,
                       "batch": 1, "temperature": 0.0}}
  shapes = [r for r in ran.records if r.method != runner.PLAIN]
  return report.finish(ran, STUDY, head["settings"], {
      "tau by shape": report.eagle_trees_shapes(head, shapes)}, args.json,
      target=args.target, drafter=args.head or "eagle3", questions=args.questions)


if __name__ == "__main__":
  raise SystemExit(main())
