"""Timing decode rounds on this device: the profile that `"auto"` reads.

`num_draft_tokens="auto"` never times a round inside a call: it starts from the
prior of `jspec.planner.cost_model` (whose only timings, the models' own calls in
`jspec.planner.call_times`, run once per machine, model and shape). This module measures
what a round really costs, when asked (`jspec profile`, `profile_auto`), and keeps the
times in `<cache_dir>/costs.json` under a key of the machine, the models' shapes and the
call's shape; later calls with the same setup read them (`jspec.planner.cost_model.saved_round_costs`).

Sums of the calls alone (`call_costs`) understate a whole round by 20-40% at batch
8-64 on XLA CPU (the loop's own bookkeeping), and a schedule fed those speculates
where it loses; `round_costs` times whole rounds.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jspec.core import decode
from jspec.planner import call_times, cost_model
from jspec.core.drafter import DraftContext, target_for
from jspec.core.drafter import prepared as prepared_drafter
from jspec.core.model import Model
from jspec.core.schedule import AutoK, monotone


def _prepared(obj):
  """A model, a drafter or a (target, drafter) pair as the programs run them (the pair's
  parts are prepared where they are used)."""
  if isinstance(obj, tuple):
    return obj
  if isinstance(obj, Model):
    return obj.prepared()
  return prepared_drafter(obj)


def _interleaved_times(fns: dict, models, carries: dict, calls: int, repeats: int) -> dict:
  """Seconds per call of each `fns[key](models, carry, i)` from `carries[key]`, in loop
  and in turns (`call_times.looped`, `call_times.in_turns`): the fastest turn of each."""
  runs = {key: call_times.looped(fn) for key, fn in fns.items()}
  times = call_times.in_turns(runs, models, carries, calls, repeats)
  return {key: min(t) for key, t in times.items()}


def _measure_costs(role: str, obj, vocab_size: int, batch: int, cache_length: int, ks,
                   greedy: bool, prefix: int, calls: int, repeats: int,
                   filtered: bool = False) -> dict[int, float]:
  """Seconds per call, in-loop: role "target" times a call on K+1 tokens for each K,
  role "drafter" one `propose` of K drafts (K >= 1) after a realistic prefix, role
  "pair" (obj = (target, drafter)) both calls back to back (K >= 1), role "round"
  (obj = (target, drafter)) one whole `decode_round` at each K. Sampled (greedy
  False) at temperature 1, with a top-p of 0.95 when `filtered`."""
  from jspec.core import sampling  # local: keeps the module's import surface small

  B, S = batch, cache_length
  obj = _prepared(obj)  # as the decoding loops run it
  start = jnp.full((B,), prefix, jnp.int32)
  lengths = start + 1
  # Random ids, not a constant: an n-gram matcher's work depends on what it scans.
  tokens = jax.random.randint(jax.random.key(0), (B, prefix + 1), 0, vocab_size, jnp.int32)
  buffer = jnp.zeros((B, S), jnp.int32).at[:, :prefix + 1].set(tokens)
  params = None if greedy else sampling.SamplingParams(
      temperature=jnp.ones((B,), jnp.float32), top_k=jnp.zeros((B,), jnp.int32),
      top_p=jnp.full((B,), 0.95 if filtered else 1.0, jnp.float32))
  keys = sampling.row_keys(jnp.arange(B, dtype=jnp.int32))
  loops, carries = {}, {}
  if role == "round":
    target, drafter = obj
    config = decode.DecodeConfig(max(ks), S)
    state = jax.jit(
        lambda t, d: decode.init_state(t, d, tokens, lengths, jnp.full((B,), S, jnp.int32),
                                       params, jnp.full((1,), -1, jnp.int32),
                                       jnp.arange(B, dtype=jnp.int32), config))(target, drafter)
    target, drafter = decode.prepared(target, drafter)
    for k in ks:
      def whole_round(models, state, i, k=k):
        # Every round starts from the same committed length (moved by i % 2 so the
        # work is not loop-invariant): slots stay in bounds however much is accepted.
        state = dataclasses.replace(state, lengths=lengths + i % 2,
                                    done=jnp.zeros((B,), jnp.bool_))
        target, drafter = models
        # A plain round still returns the features the drafter reads (a fused drafter's
        # width), as the state was built with: the target as the drafter reads it.
        state, _ = decode.decode_round(target if k else target_for(target, drafter),
                                       drafter if k else None, state,
                                       dataclasses.replace(config, num_draft_tokens=k))
        return state, state.lengths

      loops[k] = whole_round
      carries[k] = jax.tree_util.tree_map(jnp.copy, state)  # each loop's own: donated
    return _interleaved_times(loops, (target, drafter), carries, calls, repeats)
  if role == "pair":
    target, drafter = obj
    for k in ks:
      def pair(models, carry, i, k=k):
        # A round's two calls without its bookkeeping: K drafts proposed, then the
        # block [last, drafts] verified. The block depends on the drafts, as in a
        # round: independent calls could run side by side, which a round never does.
        target, drafter = models
        cache, dstate = carry
        context = DraftContext(tokens=buffer, lengths=lengths - i % 2)
        drafts, _, dstate = drafter.propose(dstate, context, k, params, keys)
        block = jnp.concatenate([(tokens[:, -1:] + i) % vocab_size, drafts], axis=1)
        logits, _, cache = target.apply(block, cache, start)
        if not greedy:
          logits = sampling.probabilities(logits, params)
        return (cache, dstate), sampling.greedy_tokens(logits)

      loops[k] = pair
      carries[k] = (target.init_cache(B, S), jax.jit(lambda d: d.init(tokens, lengths, S))(drafter))
    return _interleaved_times(loops, (target, drafter), carries, calls, repeats)
  for k in ks:
    if role == "target":
      def verify(obj, carry, i, k=k):
        cache, block = carry
        # Tokens that change with i: with a loop-invariant block XLA would hoist the
        # first layer's projections out of the timed loop.
        logits, _, cache = obj.apply((block + i) % vocab_size, cache, start)
        if not greedy:  # sampled rounds also build the processed distribution
          logits = sampling.probabilities(logits, params)
        # Reduce over the whole vocabulary, as acceptance does: a slice of the logits
        # would let XLA compute only that slice of the LM head.
        return (cache, block), sampling.greedy_tokens(logits)

      loops[k] = verify
      carries[k] = (obj.init_cache(B, S), jnp.ones((B, k + 1), jnp.int32))
      if k == 0:
        # A whole plain round (step, argmax or sampling, commit): what it costs beyond
        # the step is paid by every round, whatever its K.
        def plain(obj, state, i):
          state, _ = decode.decode_round(obj, None, state, decode.DecodeConfig(0, S))
          return state, state.lengths

        loops[ROUND] = plain
        carries[ROUND] = jax.jit(
            lambda m: decode.init_state(m, None, tokens, lengths, jnp.full((B,), S, jnp.int32),
                                        params, jnp.full((1,), -1, jnp.int32),
                                        jnp.arange(B, dtype=jnp.int32),
                                        decode.DecodeConfig(0, S)))(obj)
    elif k > 0:
      def propose(obj, state, i, k=k):
        # The length moves with i: a stateless drafter's work would otherwise be
        # loop-invariant, and XLA would hoist it out of the timed loop.
        context = DraftContext(tokens=buffer, lengths=lengths - i % 2)
        drafts, _, state = obj.propose(state, context, k, params, keys)
        return state, drafts

      loops[k] = propose
      carries[k] = jax.jit(lambda d: d.init(tokens, lengths, S))(obj)
  out = _interleaved_times(loops, obj, carries, calls, repeats)
  return {k: out.get(k, 0.0) for k in list(ks) + ([ROUND] if ROUND in out else [])}


ROUND = -1  # key of a whole plain round's time in the target's measurements


def _cached_times(parts, batch: int, cache_length: int, greedy: bool, prefix: int, calls: int,
                  repeats: int, use_cache: bool, vocab_size: int, filtered: bool = False,
                  cache_dir: str | None = None, measure: bool = True) -> list | None:
  """Measured seconds per K for each (role, obj, wanted Ks), through the disk cache.
  measure=False: only what the cache holds; None when some K is missing."""
  filtered = filtered and not greedy
  path = cost_model.cache_path(cache_dir)
  table = cost_model.read_table(path) if use_cache else {}
  out, measured = [], False
  for role, obj, wanted in parts:
    key = cost_model.profile_key(role, obj, batch, cache_length, greedy, filtered)
    known = {int(k): float(v) for k, v in table.get(key, {}).items()}
    missing = set(wanted) - set(known)
    if ROUND in missing:  # a plain round is timed beside the 1-token step
      missing = (missing - {ROUND}) | {0}
    missing = sorted(missing)
    if missing and not measure:
      return None
    if missing:
      known.update(_measure_costs(role, obj, vocab_size, batch, cache_length, missing, greedy,
                                  prefix, calls, repeats, filtered))
      table[key] = {str(k): v for k, v in sorted(known.items())}
      measured = True
    out.append(known)
  if use_cache and measured:  # a call that only read the cache leaves the file alone
    cost_model.write_table(path, table)
  return out


def round_costs(target: Model, drafter, batch: int, cache_length: int, choices, *,
                greedy: bool = True, filtered: bool = False, calls: int = 16,
                repeats: int = 7, use_cache: bool = True,
                cache_dir: str | None = None) -> tuple[float, ...]:
  """Seconds per whole round for each K in `choices` at this batch size, in-loop.

  cost(0) is a plain decoding round; cost(K) a round that drafts K tokens, verifies
  them, accepts and commits. Kept in `cost_model.cache_path(cache_dir)` under a key of the
  machine, the target's and drafter's shapes and the call's shape, so a second call
  with the same setup measures nothing.

  greedy: every row greedy (argmax only). filtered: sampled rows use top-k or top-p,
  and every position of a round then sorts its logits; plain temperature sampling
  skips that sort, and a round at K sorts K+1 positions where a plain round sorts one
  (on the shipped pair with top-p 0.95, costs timed without it made `"auto"` draft
  n-gram rounds that ran at 0.79x of plain decoding).
  """
  if drafter.vocab_size != target.vocab_size:  # else the timed rounds would be of a pair no call runs
    raise ValueError(f"drafter vocab size {drafter.vocab_size} != target vocab size "
                     f"{target.vocab_size}: a drafter must draft ids of the target's vocabulary")
  target, drafter = _as_called(target, drafter)
  prefix = max(min(64, cache_length - max(choices) - 3), 0)
  (times,) = _cached_times([("round", (target, drafter), list(choices))], batch, cache_length,
                           greedy, prefix, calls, repeats, use_cache, target.vocab_size,
                           filtered, cache_dir)
  return monotone(choices, [times[k] for k in choices])


def profile_auto(target: Model, drafter, batch: int, cache_length: int, *,
                 auto: AutoK | None = None, greedy: bool = True, filtered: bool = False,
                 cache_dir: str | None = None, calls: int = 16, repeats: int = 7) -> AutoK:
  """Time a whole round at each of `auto.choices` on this device (`round_costs`), save
  the times in `cache_dir`, and return `auto` with them as its costs.

  Calls with the same models and shapes (batch, cache length, greedy or not) then find
  the saved profile by themselves when their AutoK names the same `cache_dir` (None:
  jspec's cache folder for both). Compiles one timing loop per K: tens of seconds on
  a 135M model on a small CPU, paid here and not inside a decoding call.
  """
  auto = auto or AutoK()
  costs = round_costs(target, drafter, batch, cache_length, auto.choices, greedy=greedy,
                      filtered=filtered, calls=calls, repeats=repeats, cache_dir=cache_dir)
  return dataclasses.replace(auto, costs=costs, cache_dir=cache_dir)


def _as_called(target: Model, drafter):
  """The models in the form a decoding call runs them (and keys their costs by)."""
  from jspec.drafters.draft_model import DraftModel

  if isinstance(drafter, DraftModel):
    drafter = dataclasses.replace(drafter, model=drafter.model.decoding_form())
  return target.decoding_form(), drafter


def call_costs(target: Model, drafter, batch: int, cache_length: int, choices, *,
               greedy: bool = True, filtered: bool = False, calls: int = 16,
               repeats: int = 7, use_cache: bool = True,
               apart: bool = False) -> tuple[float, ...]:
  """What a round's calls cost for each K: T_verify(K+1) + T_draft(K), plus the
  bookkeeping of a plain round beyond its step; cost(0) is that plain round.

  The inputs of the ideal speedup tau * T_step / (T_verify + K T_draft); the gap
  between these and `round_costs` is what a round costs beyond its calls: the loop's
  own overhead.

  By default the two calls are timed back to back in one loop body, as a round runs
  them. `apart=True` times each call in a loop of its own and adds the times. The
  sums can be lower: on a CPU the two models share the last-level cache, and a draft
  model timed alone keeps its weights there, where in a round the target's pass has
  evicted them (on the shipped pair, a 5.8 MB draft beside a 21 MB target in a 32 MB
  L3, the draft's K = 4 proposal cost 0.43 ms more right after a 21 MB pass, about as
  much as the pair costs beyond its two calls). That is a cost of the calls, not of
  the loop, so the ideal counts it.
  """
  target, drafter = _as_called(target, drafter)
  prefix = max(min(64, cache_length - max(choices) - 2), 0)
  drafting = [k for k in choices if k > 0]
  target_t, pair_t = _cached_times(
      [("target", target, sorted(set(choices) | {0, ROUND}) if apart else [0, ROUND]),
       ("drafter" if apart else "pair", drafter if apart else (target, drafter), drafting)],
      batch, cache_length, greedy, prefix, calls, repeats, use_cache, target.vocab_size,
      filtered)
  # Every round pays the same bookkeeping beyond its calls (the plain round minus the
  # step); counting it makes long rounds' fixed costs visible.
  extra = max(target_t[ROUND] - target_t[0], 0.0)
  calls_t = {k: (target_t[k] + pair_t[k] if apart else pair_t[k]) for k in drafting}
  calls_t[0] = target_t[0]
  return monotone(choices, [calls_t[k] + extra for k in choices])


