"""`jspec bench --suite spec-bench`: Spec-Bench's questions, each method at batch 1, by category.

    jspec bench --suite spec-bench [--questions FILE] [--per-category 3 | --all]
        [--methods ngram,suffix,...] [--max-new-tokens 128] [--repeats 1] [--sampled]
        [--corpus FILE] [--target smollm2] [--json out.json] [--plot out.png]

Questions come from a file in Spec-Bench's format (`jspec.bench.questions`); methods from the
registry in `jspec.bench.methods`. What runs, question by question:

  prompts   each user turn through the target's chat template. A question of two turns
            (MT-Bench's) is a conversation, as Spec-Bench runs it: turn 1 is answered,
            the answer (plain greedy's, as text) is appended as the assistant's message,
            then turn 2 is answered with that history. Every method answers the same
            prompts; answers end at the target's end of turn or max_new_tokens.
  shapes    each prompt padded to its power-of-two bucket, the cache length set by the
            bucket, so a method compiles once per bucket (a 1-token call compiles it,
            untimed) whatever the prompt.
  timing    per prompt, plain greedy and every method run `repeats` times, interleaved
            (the order reversed every other repeat), in this process; a category's
            speedup is the median over repeats of the ratio of its summed times
            (`bench_timing.paired_speedup`). Spec-Bench averages per-question tokens/s
            instead; with equal answers the two differ only in how questions are weighed.
  exactness every greedy answer is compared token for token with plain greedy's; a
            difference is printed at once, listed in the report, and fails the command.
  --sampled the same methods at temperature 1 (seeded per prompt), reported apart:
            tokens/s against plain sampling; answers differ by design, so no comparison.

The report (`jspec.tools.spec_bench_report`): per method and category tau, acceptance by
draft position, the measured speedup and the speedup the measured tau and costs predict
where a verify costs one step; a table in the leaderboard's form.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax.numpy as jnp
import numpy as np

from jspec.planner.inputs import cache_bucket, prompt_bucket

MEMORY_SLOTS = 4096  # the suffix memory: earlier answers, newest last
MARGIN = 128  # cache slots past prompt + answer: wider than any method's verify block
# (Token Recycling's tree verifies 81 nodes)


@dataclasses.dataclass(frozen=True)
class Settings:
  """How the suite runs: answer length, timed repeats, the sampled pass, its seed."""

  max_new_tokens: int = 128
  repeats: int = 1
  sampled: bool = False
  seed: int = 0
  progress: bool = True


def chat_ids(tokenizer, messages) -> list[int]:
  """A conversation's token ids under the chat template, ready for the assistant's turn."""
  return [int(i) for i in tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                         tokenize=True)]


def shapes(prompt_length: int, max_new_tokens: int) -> tuple[int, int]:
  """(padded prompt width P, cache length S) of a prompt: programs are shared per P."""
  P = prompt_bucket(prompt_length)
  return P, cache_bucket(P + max_new_tokens + MARGIN)


def check_lengths(target, questions, max_new_tokens: int) -> None:
  """Every first turn fits the target's context with its answer (before anything compiles)."""
  limit = target.max_length
  if limit is None:
    return
  for q in questions:
    n = len(chat_ids(target.tokenizer, [{"role": "user", "content": q.turns[0]}]))
    if n + max_new_tokens > limit:
      raise ValueError(f"question {q.question_id!r}: its prompt ({n} tokens) + "
                       f"--max-new-tokens {max_new_tokens} exceeds the target's context "
                       f"({limit} tokens)")


def variants(methods: dict, sampled: bool) -> list[tuple[str, str | None, float]]:
  """(variant name, method name or None for plain decoding, temperature) of each run."""
  out = [("plain", None, 0.0)] + [(m, m, 0.0) for m in methods]
  if sampled:
    out += [("plain@T1", None, 1.0)] + [(f"{m}@T1", m, 1.0) for m in methods]
  return out


def _call(target, built, ids, S: int, temperature: float, seed: int, memory, carried=None):
  """fn(max_new_tokens) -> output of one prompt padded to its bucket, at cache length S.
  memory: the suffix memory (methods `with_memory`); carried: a `RememberingDrafter`'s
  `out.memory` from the question before (Token Recycling's matrix), or None."""
  import jspec

  P, _ = shapes(len(ids), 0)
  tokens = np.zeros((1, P), np.int32)
  tokens[0, :len(ids)] = ids
  kw = dict(prompt_lengths=[len(ids)], cache_length=S, temperature=temperature, seed=seed)
  if built is None:
    return lambda n: jspec.generate(target, tokens, max_new_tokens=n, **kw)
  drafter = built.drafter
  if built.with_memory:
    drafter = dataclasses.replace(drafter, memory=memory)
  if carried is not None:
    drafter = dataclasses.replace(drafter, memory=carried)
  shape = dict(num_draft_tokens=built.k) if built.tree is None else dict(tree=built.tree)
  return lambda n: jspec.speculative_generate(target, drafter, tokens, max_new_tokens=n,
                                              **shape, **kw)


def _timed(fn, n: int):
  t0 = time.perf_counter()
  out = fn(n)
  np.asarray(out.tokens)  # waits for the device
  return out, time.perf_counter() - t0


def record(out) -> dict:
  """What the report needs of one output (batch 1): the answer, tokens, target calls, the
  drafts judged and accepted at each position, rounds by K ("auto")."""
  n = int(np.asarray(out.lengths)[0])
  st = out.stats
  return {"answer": np.asarray(out.tokens)[0, :n].astype(np.int64), "tokens": n,
          "calls": int(np.asarray(st.target_calls)[0]),
          "judged": np.asarray(st.position_judged)[0].tolist(),
          "accepted": np.asarray(st.position_accepted)[0].tolist(),
          "rounds_by_k": {int(k): int(v) for k, v in (out.rounds_by_k or {}).items()}}


def _first_difference(a: np.ndarray, b: np.ndarray) -> int:
  n = min(len(a), len(b))
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if diff.size else n


def run(target, questions, methods: dict, s: Settings, log=print) -> dict:
  """Every question, every turn, every variant; returns {"items": [...], "mismatches": [...]}.

  methods: {name: `jspec.bench.methods.Built`}. Each item is one prompt (a question's turn) with
  its variants' records and per-repeat times (no answers: those are compared here)."""
  from jspec.core.drafter import RememberingDrafter
  from jspec.drafters.suffix import SuffixMemory, remember

  tok = target.tokenizer
  eos = set(int(e) for e in target.eos_ids)
  memory = SuffixMemory.empty(MEMORY_SLOTS)
  # A drafter that hands its memory back (`out.memory`: Token Recycling's matrix) carries it
  # from question to question, as a server would; started as an array, not None, so every
  # question reuses the program compiled for the first. The greedy run's memory is carried.
  carried = {m: b.drafter.remembered(None) for m, b in methods.items()
             if isinstance(b.drafter, RememberingDrafter)}
  runs = variants(methods, s.sampled)
  names = [v for v, _, _ in runs]
  compiled, cut = set(), set()  # (variant, P, S) and S already compiled
  items, mismatches = [], []
  bar = _progress(sum(len(q.turns) for q in questions), s.progress)
  for q in questions:
    history = []
    for turn, text in enumerate(q.turns):
      history.append({"role": "user", "content": text})
      ids = chat_ids(tok, history)
      P, S = shapes(len(ids), s.max_new_tokens)
      seed = s.seed + len(items)  # the T = 1 runs: one seed per prompt, every method alike
      calls = {v: _call(target, None if m is None else methods[m], ids, S, temp, seed, memory,
                        carried.get(m))
               for v, m, temp in runs}
      for v in names:
        if (v, P, S) not in compiled:  # max_new_tokens is traced: one token compiles it
          bar.set_postfix_str(f"compiling {v} for {P}-token prompts")
          _timed(calls[v], 1)
          compiled.add((v, P, S))
      if S not in cut:
        # A call's output is its [1, S] buffer cut to max_new_tokens on the host side; the
        # cut is a small program of its own per shape, compiled here, not in a timed call.
        jnp.zeros((1, S), jnp.int32)[:, :s.max_new_tokens].block_until_ready()
        cut.add(S)
      times = {v: [] for v in names}
      outs = {}
      for r in range(s.repeats):
        for v in (names if r % 2 == 0 else names[::-1]):
          bar.set_postfix_str(f"{q.group} {q.question_id} turn {turn + 1}: {v}")
          outs[v], t = _timed(calls[v], s.max_new_tokens)
          times[v].append(t)
      recs = {v: record(o) for v, o in outs.items()}
      reference = recs["plain"]["answer"]
      for v, m, temp in runs:
        rec = recs[v]
        if m is None or temp > 0:
          continue
        rec["equal"] = bool(np.array_equal(rec["answer"], reference))
        if not rec["equal"]:
          at = _first_difference(rec["answer"], reference)
          mismatches.append({"question_id": q.question_id, "turn": turn + 1, "method": v,
                             "first_difference": at, "tokens": rec["tokens"],
                             "plain_tokens": len(reference)})
          print(f"MISMATCH: {v} on question {q.question_id!r} turn {turn + 1} differs from "
                f"plain greedy at token {at}: greedy speculative decoding must equal it",
                file=sys.stderr, flush=True)
      for rec in recs.values():
        del rec["answer"]
      items.append({"question_id": q.question_id, "category": q.category, "group": q.group,
                    "turn": turn + 1, "prompt_tokens": len(ids), "P": P, "S": S,
                    "times": times, "runs": recs})
      answer = [t for t in reference.tolist() if t not in eos]
      history.append({"role": "assistant", "content": tok.decode(answer).strip()})
      # The memory holds every earlier answer (plain greedy's: every method's, when equal).
      memory = remember(memory, np.asarray(outs["plain"].tokens), np.asarray(outs["plain"].lengths))
      for v, m, temp in runs:
        if m in carried and temp == 0:
          carried[m] = outs[v].memory
      bar.update(1)
  bar.close()
  return {"items": items, "mismatches": mismatches}


def _progress(total: int, enabled: bool):
  from tqdm import tqdm

  return tqdm(total=total, unit="prompt", disable=not enabled, dynamic_ncols=True,
              file=sys.stderr)
