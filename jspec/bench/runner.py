"""The one runner: methods x a workload -> records, timed the same way everywhere.

    recs = runner.run(target, variants, workload, Settings(max_new_tokens=128, repeats=3),
                      study="spec-bench")

What runs, cell by cell (a cell: `batch` prompts of the workload at one turn):

  shapes    each prompt padded to its power-of-two bucket and the cache length set by the
            bucket (`shapes`), so a method compiles once per bucket whatever the prompt;
            a 1-token call compiles it, untimed, before the cell's timed repeats.
  timing    every variant runs `repeats` times, interleaved, the order reversed every
            other repeat (`interleave`: no variant always runs right after the same
            neighbour); each repeat's wall time is kept (`Record.seconds`), so speedups
            are medians of ratios taken in the same repeat (`metrics.paired_speedup`).
  exactness every greedy variant's answer is compared token for token with plain
            decoding's on the same prompt (`Record.equal`); a difference is reported at
            once and listed (`Result.mismatches`). A study that runs greedy methods
            without a "plain" variant compares nothing. A variant may name another
            reference (`Variant.reference`: another library's greedy run) and be compared
            without being held to it (`exact=False`: `equal` and, where it differs, the
            first differing token per row in `extra["first_difference"]`, no mismatch).
  turns     a prompt with later turns (MT-Bench) is a conversation: each turn is answered,
            plain decoding's answer appended as the assistant's message, then the next.
  memory    a method `with_memory` (suffix drafting) gets the answers of every earlier
            cell as its memory; a drafter that hands its memory back (Token Recycling's
            matrix, `out.memory`) carries it from cell to cell, as a server would
            (`carry=False`: it starts from its own memory in every cell).
  options   a variant's keyword arguments go to every call it makes (`Variant.options`:
            a `constraint`, `top_p`, ...).
  streams   with `Settings(stream=True)` every call is streamed and each round's arrival
            kept in its record (`extra["arrivals"]`: latency percentiles, `metrics`); with
            `answers=True` each row's answer is kept (`extra["answers"]`).

`interleave` is the timing loop of everything else too (steady-state rounds, latency
runs, probes): one place decides how jspec times a thing.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from jspec.bench import records as R
from jspec.bench.workloads import Prompt, Workload, encode

MEMORY_SLOTS = 4096  # the suffix memory: earlier answers, newest last
MARGIN = 128  # cache slots past prompt + answer: wider than any method's verify block
# (Token Recycling's tree verifies 81 nodes)
PLAIN = "plain"


@dataclasses.dataclass(frozen=True)
class Settings:
  """How a study runs its cells."""

  max_new_tokens: int = 128
  repeats: int = 3
  batch: int = 1  # prompts per call
  seed: int = 0  # sampled variants: seed + cell index, every method alike
  eos: bool = True  # False: every row runs max_new_tokens (EOS ignored)
  progress: bool = True
  stream: bool = False  # every call streamed, its rounds' arrival times in the record
  answers: bool = False  # each row's answer (token ids) in the record

  def __post_init__(self):
    for name in ("max_new_tokens", "repeats", "batch"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


@dataclasses.dataclass(frozen=True)
class Variant:
  """One thing to run on every cell: a method (its registry spec and what it built; None
  for plain decoding) at a temperature, with the axes its records carry (`k`, ...)."""

  name: str
  built: Any = None  # jspec.bench.methods.Built, or None: plain decoding
  temperature: float = 0.0
  axes: dict = dataclasses.field(default_factory=dict)
  reference: str | None = PLAIN  # the variant its greedy answers are compared with
  exact: bool = True  # a difference from the reference is a mismatch (False: recorded only)
  options: dict = dataclasses.field(default_factory=dict)  # keyword arguments of its calls
  carry: bool = True  # a remembering drafter's memory carried from cell to cell

  @property
  def greedy(self) -> bool:
    """Temperature 0: its answers are compared with plain decoding's."""
    return self.temperature == 0


def plain(temperature: float = 0.0) -> Variant:
  """Plain decoding, the reference every greedy variant is compared with."""
  return Variant(PLAIN if temperature == 0 else f"{PLAIN}@T{temperature:g}", None, temperature)


@dataclasses.dataclass
class Result:
  """What `run` returns: the records, and every greedy answer that differed from plain's."""

  records: list
  mismatches: list  # {"prompt", "method", "first_difference", ...}


# ----------------------------------------------------------------------------- timing


def interleave(calls: dict[str, Callable[[], Any]], repeats: int,
               wait: Callable[[Any], Any] = lambda out: np.asarray(out.tokens),
               on_call: Callable[[str], None] | None = None) -> tuple[dict, dict]:
  """({name: last output}, {name: [seconds per repeat]}): every call `repeats` times, the
  order reversed every other repeat. `wait(out)` blocks until the output is on the host
  (jspec's outputs: their tokens). Compile before: the first call is timed too."""
  names = list(calls)
  outs, times = {}, {n: [] for n in names}
  for r in range(repeats):
    for n in (names if r % 2 == 0 else names[::-1]):
      if on_call:
        on_call(n)
      t0 = time.perf_counter()
      out = calls[n]()
      wait(out)
      times[n].append(time.perf_counter() - t0)
      outs[n] = out
  return outs, times


# ----------------------------------------------------------------------------- shapes


def shapes(prompt_length: int, max_new_tokens: int) -> tuple[int, int]:
  """(padded prompt width P, cache length S) of a prompt: programs are shared per P."""
  from jspec.planner.inputs import cache_bucket, prompt_bucket

  P = prompt_bucket(prompt_length)
  return P, cache_bucket(P + max_new_tokens + MARGIN)


def _ids(target, prompt: Prompt, history: list) -> list[int]:
  if prompt.ids is not None:
    return list(prompt.ids)
  if prompt.text is not None:
    return [int(i) for i in target.tokenizer.encode(prompt.text)]
  return encode(target.tokenizer, history, where="the target")


def jspec_call(target, built, rows: list[list[int]], max_new_tokens: int, temperature: float,
               seed: int, eos: bool, memory=None, carried=None,
               **options) -> Callable[..., Any]:
  """fn(n, **more) -> output of `rows` padded to their bucket, cache length from the bucket
  and `max_new_tokens`; built None: plain decoding. memory: the suffix memory (methods
  `with_memory`); carried: a remembering drafter's memory from the cell before; options
  and more: keyword arguments of the call (`constraint`, `top_p`, `stream`)."""
  import jspec

  P, S = shapes(max(len(r) for r in rows), max_new_tokens)
  tokens = np.zeros((len(rows), P), np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  kw = {**dict(prompt_lengths=[len(r) for r in rows], cache_length=S, temperature=temperature,
              seed=seed, **({} if eos else {"eos_id": ()})), **options}  # options may set S
  if built is None:
    return lambda n, **more: jspec.generate(target, tokens, max_new_tokens=n, **kw, **more)
  drafter = built.drafter
  if built.with_memory:
    drafter = dataclasses.replace(drafter, memory=memory)
  if carried is not None:
    drafter = dataclasses.replace(drafter, memory=carried)
  shape = dict(num_draft_tokens=built.k) if built.tree is None else dict(tree=built.tree)
  return lambda n, **more: jspec.speculative_generate(target, drafter, tokens,
                                                      max_new_tokens=n, **shape, **kw, **more)


def answers(out) -> list[np.ndarray]:
  """Each row's emitted tokens."""
  toks, lens = np.asarray(out.tokens), np.asarray(out.lengths)
  return [toks[i, :int(lens[i])].astype(np.int64) for i in range(toks.shape[0])]


def first_difference(a: np.ndarray, b: np.ndarray) -> int:
  """The first index where two answers differ (the shorter's length when one is a prefix)."""
  n = min(len(a), len(b))
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if diff.size else n


# ----------------------------------------------------------------------------- run


def _cells(workload: Workload, batch: int):
  """(turn index, [prompts]) in order. One prompt a call: each conversation's turns one
  after the other, then the next conversation's (as Spec-Bench runs MT-Bench: what a
  memory carried across questions holds follows that order). Several a call: every
  prompt's turn t before any turn t + 1, in groups of `batch`."""
  if batch == 1:
    for p in workload.prompts:
      for t in range(1 + len(p.turns)):
        yield t, [p]
    return
  longest = max(1 + len(p.turns) for p in workload.prompts)
  for t in range(longest):
    live = [p for p in workload.prompts if t <= len(p.turns)]
    for i in range(0, len(live), batch):
      yield t, live[i:i + batch]


def run(target, variants: list[Variant], workload: Workload, s: Settings, study: str,
        call: Callable | None = None) -> Result:
  """Every cell of the workload, every variant; the records, and the greedy mismatches.
  call: what makes a variant's call for a cell (`jspec_call`, read when `run` is called)."""
  call = call or jspec_call
  from jspec.core.drafter import RememberingDrafter
  from jspec.drafters.suffix import SuffixMemory, remember

  names = [v.name for v in variants]
  if len(set(names)) != len(names):
    raise ValueError(f"variant names repeat: {names}")
  if not workload.prompts:
    raise ValueError(f"workload {workload.name!r} has no prompts")
  by_name = {v.name: v for v in variants}
  reference = PLAIN if PLAIN in by_name else None
  eos = set(int(e) for e in target.eos_ids) if s.eos else set()
  memory = SuffixMemory.empty(MEMORY_SLOTS)
  carried = {v.name: v.built.drafter.remembered(None) for v in variants
             if v.built is not None and v.carry
             and isinstance(v.built.drafter, RememberingDrafter)}
  history = {p.id: list(p.messages) for p in workload.prompts}
  compiled = set()
  recs, mismatches = [], []
  cells = list(_cells(workload, s.batch))
  bar = _progress(len(cells), s.progress)
  for index, (turn, prompts) in enumerate(cells):
    if turn > 0:
      for p in prompts:
        history[p.id].append({"role": "user", "content": p.turns[turn - 1]})
    rows = [_ids(target, p, history[p.id]) for p in prompts]
    P, S = shapes(max(len(r) for r in rows), s.max_new_tokens)
    seed = s.seed + index
    calls = {v.name: call(target, v.built, rows, s.max_new_tokens, v.temperature, seed,
                          s.eos, memory, carried.get(v.name), **v.options) for v in variants}
    arrivals = {v: [] for v in names}  # per timed call: [[seconds, tokens of each row], ...]
    for v in names:
      if (v, len(rows), P, S) not in compiled:  # max_new_tokens is traced: 1 token compiles
        bar.set_postfix_str(f"compiling {v} for {P}-token prompts")
        np.asarray(calls[v](1, **({"stream": lambda rows: None} if s.stream else {})).tokens)
        compiled.add((v, len(rows), P, S))
    if (len(rows), S) not in compiled:
      # A call's output is its [B, S] buffer cut to max_new_tokens on the host side; the
      # cut is a small program of its own per shape, compiled here, not in a timed call.
      np.asarray(jnp.zeros((len(rows), S), jnp.int32)[:, :s.max_new_tokens])
      compiled.add((len(rows), S))
    where = ",".join(p.id for p in prompts) + (f"/{turn + 1}" if turn else "")
    outs, times = interleave({v: _timed(calls[v], s, arrivals[v]) for v in names}, s.repeats,
                             on_call=lambda v: bar.set_postfix_str(f"{where}: {v}"))
    cats = {p.group for p in prompts}
    axes = {"batch": len(rows), "turn": turn + 1, "prompt_tokens": int(sum(map(len, rows))),
            "category": cats.pop() if len(cats) == 1 else "mixed"}
    for v in variants:
      equal, extra = None, {}
      if s.stream:
        extra["arrivals"] = arrivals[v.name]
      if s.answers:
        extra["answers"] = [a.tolist() for a in answers(outs[v.name])]
      if v.greedy and v.reference in by_name and v.name != v.reference:
        mine, theirs = answers(outs[v.name]), answers(outs[v.reference])
        equal = all(np.array_equal(a, b) for a, b in zip(mine, theirs))
        if not equal:
          at = [None if np.array_equal(a, b) else first_difference(a, b)
                for a, b in zip(mine, theirs)]
          row = next(i for i, x in enumerate(at) if x is not None)
          if v.exact:
            mismatches.append({"prompt": where, "row": row, "method": v.name,
                               "first_difference": at[row]})
            print(f"MISMATCH: {v.name} on {where!r} (row {row}) differs from {v.reference} "
                  f"greedy at token {at[row]}: greedy speculative decoding must equal it",
                  file=sys.stderr, flush=True)
          else:
            extra["first_difference"] = at
      recs.append(R.from_output(outs[v.name], study=study, method=v.name,
                                workload=workload.name, prompt=where,
                                axes={**axes, "temperature": v.temperature, **v.axes},
                                seconds=tuple(times[v.name]), equal=equal,
                                per_row=len(rows) > 1, **({"extra": extra} if extra else {})))
    # What the next turn and the memories see: plain greedy's answer (every greedy
    # method's, when equal), else the first variant's.
    said = answers(outs[reference or names[0]])
    for p, a in zip(prompts, said):
      if turn < len(p.turns):
        text = target.tokenizer.decode([t for t in a.tolist() if t not in eos]).strip()
        history[p.id].append({"role": "assistant", "content": text})
    first = outs[reference or names[0]]
    memory = remember(memory, np.asarray(first.tokens), np.asarray(first.lengths))
    for name in carried:
      if by_name[name].greedy:
        carried[name] = outs[name].memory
    bar.update(1)
  bar.close()
  return Result(recs, mismatches)


def _timed(fn, s: Settings, into: list) -> Callable[[], Any]:
  """fn's timed call; streamed (`s.stream`), each round's arrival appended to a new list
  of `into`: [seconds since the call began, new tokens of each row]."""
  if not s.stream:
    return lambda: fn(s.max_new_tokens)

  def streamed():
    seen, t0 = [], time.perf_counter()
    into.append(seen)
    return fn(s.max_new_tokens, stream=lambda rows: seen.append(
        [time.perf_counter() - t0] + [len(r) for r in rows]))
  return streamed


def _progress(total: int, enabled: bool):
  from tqdm import tqdm

  return tqdm(total=total, unit="cell", disable=not enabled, dynamic_ncols=True,
              file=sys.stderr)
