"""Token Recycling against n-gram lookup: tau, and what the matrix carries.

    python -m jspec.bench.recycling [--target smollm2] [--per-kind 1] [--new 64] [--k 4]
        [--tree paper|small] [--update path|all] [--prompt none|logits|context]
        [--questions FILE --groups mt_bench,qa --per-group 3] [--json out.jsonl]

Greedy, batch 1, the first prompts of each kind of the held-out chat prompts plus one more
question; with --questions, the first turns of questions in Spec-Bench's format instead
(`jspec.bench.questions`: seeded, --per-group of each of --groups, in file order). For each
of chain (K) and tree, through the harness's runner (every answer compared with plain
decoding's): `NGram`, and `TokenRecycling` three ways: "fresh" (an empty matrix for every
prompt: `Variant(carry=False)`), "carried" (the matrix the runner carries from prompt to
prompt, starting empty: the paper's setting) and "second" (the same variant over the
prompts again, the workload holding them twice: the matrix the carried pass ended with).
tau = new tokens / target calls, summed over the prompts (`metrics.tau`); one timed run
each, the times not reported.
"""

from __future__ import annotations

import argparse

from jspec.bench import metrics as M
from jspec.bench import report, runner
from jspec.bench import workloads as W

STUDY = "recycling"
SMALL_TREE = ((0, 0, 0, 0), (0, 1), (1, 0), (2,), (0, 0, 1))  # 10 nodes, depth 4
ROWS = (("n-gram", "ngram", 1), ("recycling, fresh", "recycling fresh", 1),
        ("recycling, carried", "recycling", 1), ("recycling, second pass", "recycling", 2))


def prompts(per_kind: int = 1, questions: str | None = None,
            groups=("mt_bench", "translation", "qa"), per_group: int = 3) -> W.Workload:
  """The chat prompts (module docstring), or the first turns of drawn questions."""
  if questions:
    from jspec.bench import questions as Q

    drawn = [q for q in Q.sample(Q.read_questions(questions), per_group) if q.group in groups]
    return W.Workload("questions", tuple(W.Prompt(str(q.question_id), q.group,
                                                  W.user(q.turns[0])) for q in drawn))
  chat = W.load("chat").per_category(per_kind)
  return W.Workload("chat", chat.prompts + W.load("question").prompts[per_kind:per_kind + 1])


def variants(vocab: int, k: int, tree, update: str = "path",
             prompt: str = "context") -> list[runner.Variant]:
  """Plain decoding; per shape (a chain of k, `tree`): n-gram, recycling fresh, recycling."""
  import jax.numpy as jnp

  import jspec
  from jspec.bench.methods import Built

  empty = jnp.full((vocab, 8), -1, jnp.int32)  # an array, not None: the carried one's program
  recycling = lambda memory=None: jspec.TokenRecycling(vocab, memory=memory, update=update,
                                                       prompt=prompt)
  out = [runner.plain()]
  for shape, depth, t in (("chain", k, None), ("tree", tree.max_depth, tree)):
    for name, drafter, carry in (("ngram", jspec.NGram(vocab), True),
                                 ("recycling fresh", recycling(empty), False),
                                 ("recycling", recycling(), True)):
      out.append(runner.Variant(f"{name} {shape}", Built(drafter, depth, name, tree=t),
                                axes={"drafter": name, "shape": shape, "k": depth},
                                carry=carry))
  return out


def run(target, workload: W.Workload, k: int = 4, tree=None, new: int = 64,
        update: str = "path", prompt: str = "context", progress: bool = True) -> runner.Result:
  """Every variant over the prompts twice (records' axis `pass`: 1, then 2)."""
  import dataclasses

  import jspec

  tree = tree or jspec.TokenRecycling.paper_tree()
  again = tuple(dataclasses.replace(p, id=f"again-{p.id}") for p in workload.prompts)
  ran = runner.run(target, variants(target.vocab_size, k, tree, update, prompt),
                   W.Workload(workload.name, workload.prompts + again),
                   runner.Settings(max_new_tokens=new, repeats=1, progress=progress), STUDY)
  recs = [dataclasses.replace(r, axes={**r.axes, "pass": 2 if r.prompt.startswith("again-")
                                       else 1}) for r in ran.records]
  return runner.Result(recs, ran.mismatches)


def tables(recs) -> dict[str, str]:
  """tau per drafter and shape; per prompt of the first pass."""
  drafted = [r for r in recs if r.method != runner.PLAIN]
  shapes = list(M.group(drafted, "shape"))
  out = [["drafter"] + shapes]
  for label, drafter, n in ROWS:
    out.append([label] + [f"{M.tau(M.select(drafted, drafter=drafter, shape=s, **{'pass': n})):.2f}"
                          for s in shapes])
  first = [r for r in recs if r.axes["pass"] == 1]
  return {"tau": report.markdown(out),
          "tau per prompt, first pass": report.pivot(first, "method", "prompt", report.tau,
                                                     overall=False)}


def main(argv=None) -> int:
  """The command line (module docstring)."""
  import jspec
  from jspec.bench import targets

  p = argparse.ArgumentParser(prog="python -m jspec.bench.recycling",
                              description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  p.add_argument("--per-kind", type=int, default=1)
  p.add_argument("--new", type=int, default=64)
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--tree", choices=("paper", "small"), default="paper")
  p.add_argument("--update", choices=("path", "all"), default="path")
  p.add_argument("--prompt", choices=("none", "logits", "context"), default="context",
                 help="what the prefill writes into the matrix (TokenRecycling's `prompt`)")
  p.add_argument("--questions", default=None, help="Spec-Bench question file (JSONL)")
  p.add_argument("--groups", default="mt_bench,translation,qa")
  p.add_argument("--per-group", type=int, default=3)
  p.add_argument("--json", help="write the records here (JSON lines)")
  args = p.parse_args(argv)
  try:
    target = targets.load(args.target)
  except FileNotFoundError as e:
    raise SystemExit(str(e)) from None
  tree = (jspec.TokenRecycling.paper_tree() if args.tree == "paper"
          else jspec.Tree.from_paths(SMALL_TREE))
  wl = prompts(args.per_kind, args.questions, args.groups.split(","), args.per_group)
  print(f"greedy, batch 1, {len(wl.prompts)} prompts ({', '.join(q.id for q in wl.prompts)}), "
        f"{args.new} new tokens; chain K = {args.k}, tree {args.tree} ({tree.num_nodes} nodes, "
        f"depth {tree.max_depth})")
  ran = run(target, wl, args.k, tree, args.new, args.update, args.prompt)
  settings = {key: getattr(args, key) for key in ("per_kind", "new", "k", "tree", "update",
                                                  "prompt", "questions", "groups",
                                                  "per_group")}
  return report.finish(ran, STUDY, settings, tables(ran.records), args.json, target=args.target)


if __name__ == "__main__":
  raise SystemExit(main())
