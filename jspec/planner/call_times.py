"""How a model call's cost grows with the tokens it carries, timed on the model itself:
the part of the cost prior that bytes and FLOPs get wrong on a CPU.

`jspec.planner.cost_model` prices a call on r rows from the device's bandwidth and a
compute rate probed on one stack of square-ish matrices. On a small CPU that misjudges
a real model twice over. Whether XLA runs a product over 2-7 rows near the streaming
speed or several times slower depends on each matrix's shape. And on a small model much
of a call is not weight products at all: attention over the cache, norms and the fixed
cost of a few hundred small kernels, which grow with the block too. Measured on a 2-core
CPU, batch 1 unless said:

    call on 2 tokens / on 1           whole call   weight products alone
    SmolLM2-135M                        1.78x          1.38x
    shipped 5M target, batch 4          1.20x          1.00x   (whole round: 1.21x)
    the same, 7 tokens                  2.07x          1.20x   (whole round: 2.09x)

Priced from the products alone, `"auto"` drafted rounds with the shipped draft model at
batch 4 that cost 1.59 plain rounds where it expected 1.32, and ran at 0.91x of plain
decoding.

So the prior takes the growth from whole calls: the model's own cached call on T
tokens per row, run several times inside one jitted loop (dispatch is paid once, as
inside the decode loop), at T = 1, 2 and the largest block, the blocks timed in turns
and the fastest turn of each kept:

    growth(T) = call(B, T) / call(B, 1)

Between 2 and the largest block it is interpolated in log T (a call's cost grows
steeply from 1 to 2 tokens and slowly after). `step_ratio` divides a draft model's
one-token call by its target's, the two timed side by side in the same turns. The times are kept in
`<cache_dir>/calls.json` under the machine, the model's shapes, the batch and the cache
length, so one machine times one model once per shape; on SmolLM2-135M that is three
compiles of its call and a second or two of timing.
"""

from __future__ import annotations

import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jspec.core import compilation
from jspec.planner import cost_model

VERSION = 4  # part of the cache key: bump when what is timed changes (3: CPU_OPTIONS; 4:
# input-major MLP matrices in the decoding form)
# A timed turn runs at least this long and this many calls: each run of a program pays
# a fixed cost that the decode loop does not (on the shipped 5M target at batch 64,
# about 5 ms: a call timed two to a run cost 11.6 ms, eight to a run 9.2 ms).
TURN_SECONDS = 0.1
MIN_CALLS = 4
MAX_CALLS = 64  # and at most this many calls
PREFIX = 64  # cached tokens in front of the timed block (attention reads them)


def looped(fn):
  """`fn(models, carry, i) -> (carry, out)` as one jitted program `run(models, carry,
  calls) -> (carry, total)` that calls it `calls` times (a traced count: one compile
  serves every count) and sums its outputs, so that nothing it computes is dead.
  The models are arguments of the program, not constants of it: closed over, a 135M
  model's weights were folded as constants for minutes at compile time. The carry is
  donated (pass each call's output carry to the next): kept, it would be copied into
  the loop at every run, and a 67 MB cache copied per run of two calls made a call of
  the shipped 5M target at batch 64 cost 17 ms where the decode loop spends 10."""

  @compilation.program(donate_argnums=(1,))  # compiled as the decode loop is
  def run(models, carry, calls):
    def body(i, c):
      carry, acc = c
      carry, out = fn(models, carry, i)
      return carry, acc + jnp.sum(out).astype(jnp.float32)
    return lax.fori_loop(0, calls, body, (carry, jnp.zeros((), jnp.float32)))

  return run


def in_turns(runs: dict, models, carries: dict, calls: int | None, repeats: int
             ) -> dict[object, list[float]]:
  """Seconds per call of each `looped` program in `runs` (same keys as `carries`), one
  time per turn: all compiled first, then run in turns (alternating order), so a burst
  of load on a shared machine hits each alike. calls None: as many per turn as make it
  last TURN_SECONDS (at least MIN_CALLS, at most MAX_CALLS), from a first timed run
  of each. `models` is passed to every program (a tuple of models serves programs that
  each call one of them)."""
  counts = {}
  for key, run in runs.items():
    carries[key], acc = run(models, carries[key], 1)  # compile
    jax.block_until_ready(acc)
    if calls is None:
      t0 = time.perf_counter()
      carries[key], acc = run(models, carries[key], 1)
      jax.block_until_ready(acc)
      one = max(time.perf_counter() - t0, 1e-6)
      counts[key] = int(min(MAX_CALLS, max(MIN_CALLS, math.ceil(TURN_SECONDS / one))))
    else:
      counts[key] = calls
  times = {key: [] for key in runs}
  order = list(runs)
  for r in range(repeats):
    for key in (order if r % 2 == 0 else order[::-1]):
      t0 = time.perf_counter()
      carries[key], acc = runs[key](models, carries[key], counts[key])
      jax.block_until_ready(acc)
      times[key].append((time.perf_counter() - t0) / counts[key])
  return times


def cached_call(vocab: int):
  """The body `looped` runs to time a model's cached call: carry (cache, block [B, T],
  start [B]) -> the call on the block's tokens moved by i (mod `vocab`), and its argmax."""
  def call(model, carry, i):
    cache, block, start = carry
    # Tokens that change with i, or XLA hoists the first layer's work out of the loop.
    logits, _, cache = model.apply((block + i) % vocab, cache, start)
    return (cache, block, start), jnp.argmax(logits, axis=-1)

  return call


def loop_times(model, batch: int, blocks, cache_length: int, calls: int | None = None,
               repeats: int = 5, prefix: int = PREFIX) -> dict[int, list[float]]:
  """Seconds per cached call of `model` on each block of `blocks` tokens per row, in
  loop (`looped`, `in_turns`): one time per turn. The call starts after `prefix` cached
  tokens (fewer when the block would not fit) and ends in an argmax over the whole
  vocabulary, as acceptance takes one (a slice of the logits would let XLA compute only
  that slice of the output head)."""
  model = model.prepared()  # its decoding form, as the decode loop runs it
  blocks = sorted({int(b) for b in blocks})
  run, runs, carries = looped(cached_call(model.vocab_size)), {}, {}
  for b in blocks:
    start = jnp.full((batch,), max(min(prefix, cache_length - b), 0), jnp.int32)
    runs[b] = run  # one jitted program, compiled once per block shape
    carries[b] = (model.init_cache(batch, cache_length), jnp.ones((batch, b), jnp.int32), start)
  return in_turns(runs, model, carries, calls, repeats)


def loop_memory(model, batch: int = 1, cache_length: int = 256) -> dict[str, int | None]:
  """Bytes of the program `loop_times` runs (a loop of one-token cached calls), compiled
  and not run: "weights" as the model holds them (`quant.num_bytes`), and the compiled
  program's "arguments" and "temp" (`memory_analysis`; None where the backend gives none).

  What a quantized model's loop holds beyond its arguments shows whether the compiler
  kept its weights narrow: a cast of q that depends on its weight alone may be computed
  ahead of its product, or before the loop, and every weight held dequantized while the
  loop runs (on the CPU, SmolLM2-135M in int8 held 513 MiB of temp, its f32 weights'
  size, until `quant.in_call` tied each cast to its product's input)."""
  from jspec.core import quant

  model = model.prepared()
  start = jnp.full((batch,), max(min(PREFIX, cache_length - 1), 0), jnp.int32)
  carry = (jax.eval_shape(lambda: model.init_cache(batch, cache_length)),
           jax.ShapeDtypeStruct((batch, 1), jnp.int32), start)
  compiled = looped(cached_call(model.vocab_size)).lower(model, carry, 2).compile()
  stats = compiled.memory_analysis()
  held = jax.tree_util.tree_leaves(model.params, is_leaf=quant.is_quant_weight)
  return {"weights": int(quant.num_bytes(held)),
          "arguments": None if stats is None else int(stats.argument_size_in_bytes),
          "temp": None if stats is None else int(stats.temp_size_in_bytes)}


def _times(model, batch: int, blocks, cache_length: int, cache_dir: str | None
           ) -> dict[int, float]:
  """{T: fastest seconds per call on T tokens} for each T in `blocks`. Reads and
  extends `<cache_dir>/calls.json`; times only what it lacks, in one set of turns."""
  path = cost_model.cache_path(cache_dir, "calls.json")
  table = cost_model.read_table(path)
  base = [cost_model.machine(), cost_model.fingerprint(model), batch, cache_length, VERSION]
  key = lambda t: json.dumps(base + [t])
  missing = [t for t in blocks if key(t) not in table]
  if missing:
    for t, seconds in loop_times(model, batch, missing, cache_length).items():
      table[key(t)] = min(seconds)
    cost_model.write_table(path, table)
  return {t: float(table[key(t)]) for t in blocks}


def growth(model, batch: int, blocks, cache_length: int,
           cache_dir: str | None = None) -> dict[int, float]:
  """{T: cost of a call on T tokens / on 1 token} for each T in `blocks`, timed at
  1, 2 and the largest block and interpolated in log T between (module docstring)."""
  blocks = sorted({int(t) for t in blocks} | {1})
  measured = sorted({1, min(2, blocks[-1]), blocks[-1]})
  times = _times(model, batch, measured, cache_length, cache_dir)
  known_t = np.log(np.asarray(measured[1:], np.float64))
  known_v = np.asarray([times[t] for t in measured[1:]], np.float64)
  out, floor = {1: 1.0}, 1.0
  for t in blocks[1:]:  # ascending: more tokens never cost less (a faster time is noise)
    floor = out[t] = max(float(np.interp(np.log(t), known_t, known_v)) / times[1], floor)
  return out


def step_ratio(model, reference, batch: int, cache_length: int, cache_dir: str | None = None,
               block: int = 1) -> float:
  """A call of `model` (a draft model) on `block` tokens per row over a one-token call
  of `reference` (its target), both timed in loop at this batch and cache length.

  The bandwidth-and-FLOPs prior prices a small model by its bytes, but a call also
  pays per operation, and the smaller the model the larger that share: the shipped
  1.5M-parameter draft streams 0.28 of its 5.3M target's bytes, and its one-token
  call costs 0.29-0.38 of the target's on a 2-core CPU at batch 1-8. With a `block`
  above one: what one call of a draft model's catch-up costs (`DraftModel.sync`).

  The two calls are timed side by side, in the same turns (`pair_ratios`), and the
  ratio is the median of the turns' ratios, kept in `<cache_dir>/calls.json` under both
  models' shapes. Timed apart, each from its own fastest turn, a quiet moment for one
  and a busy one for the other moved the ratio enough for `"auto"` to draft with the
  draft model at K = 1 where it lost a fifth of plain decoding's speed."""
  path = cost_model.cache_path(cache_dir, "calls.json")
  table = cost_model.read_table(path)
  key = json.dumps(["ratio", cost_model.machine(), cost_model.fingerprint(model),
                    cost_model.fingerprint(reference), batch, cache_length, block, VERSION])
  if key not in table:
    table[key] = float(np.median(pair_ratios(model, reference, batch, block, cache_length)))
    cost_model.write_table(path, table)
  return float(table[key])


def pair_ratios(model, reference, batch: int, block: int, cache_length: int,
                repeats: int = 7, prefix: int = PREFIX) -> list[float]:
  """Per turn: seconds per cached call of `model` on `block` tokens per row over
  seconds per one-token call of `reference`, both run in each turn back to back (in
  alternating order; `in_turns`), so a burst of load on a shared machine that lasts a
  turn or more weighs on both."""
  models = (model.prepared(), reference.prepared())

  def call_of(which: int, vocab: int):
    def call(models, carry, i):
      cache, tokens, start = carry
      logits, _, cache = models[which].apply((tokens + i) % vocab, cache, start)
      return (cache, tokens, start), jnp.argmax(logits, axis=-1)
    return call

  runs, carries = {}, {}
  for which, (name, width) in enumerate((("model", block), ("reference", 1))):
    runs[name] = looped(call_of(which, models[which].vocab_size))
    start = jnp.full((batch,), max(min(prefix, cache_length - width), 0), jnp.int32)
    carries[name] = (models[which].init_cache(batch, cache_length),
                     jnp.ones((batch, width), jnp.int32), start)
  times = in_turns(runs, models, carries, None, repeats)
  return [m / r for m, r in zip(times["model"], times["reference"])]
