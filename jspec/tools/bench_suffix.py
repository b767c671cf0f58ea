"""Multi-turn, agentic-style conversations: n-gram lookup against suffix drafting with a
memory carried across calls.

    python -m jspec.tools.bench_suffix [--target smollm2] [--conversations 4] [--repeats 2]

Each conversation runs the same three-turn task on a different standard-library
function, the way an agent loop does: the tool's output (the function's source) is
shown, the model explains it, rewrites it, then repeats its explanation. The whole
history is in every turn's prompt, so both drafters can copy from it; the suffix
drafter also remembers every earlier answer of every earlier conversation (the
workload ArcticInference's suffix decoding targets: the same kind of task again and
again). Batch 1, greedy, each call timed `repeats` times with the methods interleaved
(medians); the three methods' outputs are compared (they are equal but for near-ties).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time

import jax
import numpy as np

FUNCTIONS = ("textwrap.indent", "shlex.quote", "json.dumps", "shutil.copyfileobj",
             "fnmatch.translate", "string.capwords", "base64.b64encode", "colorsys.rgb_to_hsv")
TURNS = (
    "The tool `read_source` returned:\n```python\n{code}\n```\nExplain in two sentences what "
    "`{name}` does.",
    "Rewrite `{name}` with a short docstring. Reply with the code only.",
    "Repeat your first explanation of `{name}` word for word, then list its parameters.",
)


def sources(count: int) -> list[tuple[str, str]]:
  """(name, source) of the first `count` FUNCTIONS, at most 30 lines each."""
  import importlib

  out = []
  for dotted in FUNCTIONS[:count]:
    module, name = dotted.rsplit(".", 1)
    code = inspect.getsource(getattr(importlib.import_module(module), name))
    out.append((name, "\n".join(code.splitlines()[:30])))
  return out


def conversation_calls(target, conversations: int = 4, max_new_tokens: int = 96,
                       memory_size: int = 4096) -> list[tuple[list[int], object, int]]:
  """The multi-turn set: [(prompt ids, suffix memory before the call, turn)], each turn's
  prompt holding the whole history with the model's own greedy answers."""
  import jspec
  from jspec.drafters.suffix import SuffixMemory, remember

  tok = target.tokenizer
  memory = SuffixMemory.empty(memory_size)
  calls = []
  for name, code in sources(conversations):
    history = []
    for turn, template in enumerate(TURNS):
      history.append({"role": "user", "content": template.format(name=name, code=code)})
      ids = [int(i) for i in tok.apply_chat_template(history, add_generation_prompt=True,
                                                     tokenize=True)]
      base = jspec.generate(target, [ids], max_new_tokens=max_new_tokens)
      answer = np.asarray(base.tokens[0, :int(base.lengths[0])])
      history.append({"role": "assistant", "content": tok.decode(answer)})
      calls.append((ids, memory, turn))
      memory = remember(memory, base.tokens, base.lengths)
  return calls


def run(target, conversations: int = 4, k: int = 4, max_new_tokens: int = 96, repeats: int = 2,
        memory_size: int = 4096, log=print) -> dict:
  """Per turn and over all: tau and time of plain, n-gram and suffix-with-memory decoding."""
  import jspec

  ngram = jspec.NGram(target.vocab_size)
  calls = conversation_calls(target, conversations, max_new_tokens, memory_size)
  log(f"{len(calls)} calls ({conversations} conversations x {len(TURNS)} turns); prompts "
      f"{min(len(c[0]) for c in calls)}-{max(len(c[0]) for c in calls)} tokens")

  def method(name, ids, mem):
    kw = dict(max_new_tokens=max_new_tokens)
    if name == "plain":
      return jspec.generate(target, [ids], **kw)
    drafter = ngram if name == "ngram" else jspec.Suffix(target.vocab_size, memory=mem)
    return jspec.speculative_generate(target, drafter, [ids], num_draft_tokens=k, **kw)

  names = ("plain", "ngram", "suffix")
  rows = []
  for ids, mem, turn in calls:
    outs = {n: method(n, ids, mem) for n in names}  # compile (per prompt bucket) and check
    # Greedy speculative output is plain greedy output; a difference can only come from a
    # near-tie that the verify's and the step's float sums order differently.
    differs = [n for n in names[1:]
               if not np.array_equal(np.asarray(outs[n].tokens), np.asarray(outs["plain"].tokens))]
    times = {n: [] for n in names}
    for _ in range(repeats):
      for n in names:
        t = time.perf_counter()
        jax.block_until_ready(method(n, ids, mem).tokens)
        times[n].append(time.perf_counter() - t)
    tokens = int(outs["plain"].lengths[0])
    rows.append({"turn": turn, "tokens": tokens, "differs_from_plain": differs,
                 **{f"{n}_s": statistics.median(times[n]) for n in names},
                 **{f"{n}_calls": int(outs[n].stats.target_calls[0]) for n in names[1:]}})
  report = {"k": k, "max_new_tokens": max_new_tokens, "repeats": repeats, "calls": rows,
            "by_turn": {}}
  groups = {f"turn {t + 1}": [r for r in rows if r["turn"] == t] for t in range(len(TURNS))}
  groups["all"] = rows
  for label, group in groups.items():
    tokens = sum(r["tokens"] for r in group)
    summary = {"tokens": tokens}
    for n in names:  # request latency: each call is one request
      per_call = [r[f"{n}_s"] for r in group]
      summary[f"{n}_s"] = sum(per_call)
      summary[f"{n}_p50_s"] = float(np.percentile(per_call, 50))
      summary[f"{n}_p99_s"] = float(np.percentile(per_call, 99))
    for n in names[1:]:
      summary[f"{n}_tau"] = tokens / sum(r[f"{n}_calls"] for r in group)
      summary[f"{n}_speedup"] = summary["plain_s"] / summary[f"{n}_s"]
    summary["suffix_vs_ngram"] = summary["ngram_s"] / summary["suffix_s"]
    report["by_turn"][label] = summary
    log(f"{label:<7} {tokens:5d} tokens  n-gram tau {summary['ngram_tau']:.2f} "
        f"{summary['ngram_speedup']:.2f}x  suffix tau {summary['suffix_tau']:.2f} "
        f"{summary['suffix_speedup']:.2f}x  suffix / n-gram {summary['suffix_vs_ngram']:.2f}x  "
        f"p50/p99 s: " + " ".join(f"{n} {summary[n + '_p50_s']:.2f}/{summary[n + '_p99_s']:.2f}"
                                  for n in names))
  return report


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2", help="'smollm2' or a GGUF / jspec path")
  parser.add_argument("--conversations", type=int, default=4)
  parser.add_argument("--max-new-tokens", type=int, default=96)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--json", help="write the report here")
  args = parser.parse_args(argv)
  from jspec.bench import targets
  from jspec.tools.bench_real import write_json

  report = run(targets.load(args.target), args.conversations, max_new_tokens=args.max_new_tokens,
               repeats=args.repeats)
  write_json(report, args.json)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
