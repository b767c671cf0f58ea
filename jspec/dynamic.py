"""Dynamic speculation: choose K per round inside the jitted loop (`num_draft_tokens="auto"`).

Speculation pays when the target has spare capacity (small batch) and the drafts
are accepted; it loses under load or on text the drafter cannot guess. `AutoK`
compiles one round per K in `choices` (0 = plain decoding, no drafter call) and,
before every round, picks the K with the most expected tokens per unit of time:

    a_b        = (accepted_b + prior * prior_weight) / (judged_b + prior_weight)
    tokens_b(K)= (1 - a_b^(K+1)) / (1 - a_b)      (Leviathan et al. 2022)
    K*         = argmax_K min_b tokens_b(K) / cost(K)
                 b over the critical rows (active, with the most tokens to go);
                 cost(K) = time of one whole round at K (cost(0): a plain round)

A drafter that can have fewer drafts than K (n-gram lookup: as many as the match
gives) is credited tokens(min(K, count)). The loop keeps its current K while that
K's rate stays within `switch_margin` of the best: a change of K leaves the inner
loop for the outer one (a conditional, and the draft model's catch-up call), and
when two K are nearly tied, or the lookup's count moves from round to round, a
schedule without that margin changed K every two to four rounds on the shipped pair.

`accepted` and `judged` count drafts per row and decay by `decay` every round that
brings evidence. A drafter with `lookup` brings some in K = 0 rounds too: its first
draft, free to compute, is scored against the token the target emitted (see
`fixed_round`); a draft model's K = 0 rounds leave the counts alone. After
`probe_every` rounds in a row without drafting, one round drafts at the best K >= 1
anyway, so an estimate that once fell too low is corrected by new evidence rather
than frozen; each probe that does not bring drafting back doubles the wait (up to
16x). The costs are whole rounds (drafting, verification, acceptance, commit) timed
per batch size by a short in-loop pass (`round_costs`, cached on disk per machine and
models). Sums of the calls alone (`call_costs`) understate a round by 20-40% at batch
8-64 on XLA CPU, and the schedule then speculates where it loses.

Exactness: the K of a round is a function of earlier rounds only, and every branch
is a complete exact round (its drafts are all judged; none is dropped), so each
emitted token still follows the target's distribution given the tokens before it.

The drafter is not called in K = 0 rounds, so its state falls behind the committed
tokens. A drafter with state (a draft model's KV cache) may define

    sync(state, context, synced) -> state

which brings the state up to the decode-state invariant from `synced` [B], the
number of leading slots known to be current; the loop calls it before a drafting
round. `DraftModel.sync` feeds the missed tokens in fixed-size chunks.

    state = init_state(target, drafter, tokens, prompt_lengths, max_new_tokens, params,
                       eos_ids, seeds, costs, config, auto)
    state = decode_loop(target, drafter, state, config, auto)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jspec import decode, streaming
from jspec.drafter import DraftContext
from jspec.model import Model


MAX_GAP_FACTOR = 16  # probes back off to at most this many times `probe_every`


@dataclasses.dataclass(frozen=True)
class AutoK:
  """Static settings of dynamic speculation. Changing them recompiles.

  choices: the K values compiled into the loop; 0 (speculation off) should be one.
  prior: acceptance assumed before any evidence.
  prior_weight: how many judged drafts the prior is worth.
  decay: factor on the evidence per drafting round (1 = never forget).
  probe_every: after this many rounds in a row at K = 0, draft once at the best
    K >= 1 to refresh the estimate (0: never); each probe that does not bring
    drafting back doubles the wait, up to 16 x probe_every.
  ceiling: the most optimistic acceptance; a K that loses to plain decoding even
    at this acceptance is not compiled, and when every K > 0 loses the call runs
    the plain decoding program (no drafter at all).
  switch_margin: keep the current K while its expected rate is at least
    (1 - switch_margin) of the best K's (hysteresis; 0 changes K whenever another
    is ahead). It bounds what staying can lose per round.
  costs: optional per-choice round costs (any time unit, same order as
    `choices`); None measures them (`round_costs`).
  """

  choices: tuple[int, ...] = (0, 1, 2, 3, 4, 6)
  prior: float = 0.6
  prior_weight: float = 4.0
  decay: float = 0.95
  probe_every: int = 64
  ceiling: float = 0.9
  switch_margin: float = 0.05
  costs: tuple[float, ...] | None = None

  def __post_init__(self):
    ks = self.choices
    if (not isinstance(ks, tuple) or not ks or len(set(ks)) != len(ks)
        or any(isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in ks)):
      raise ValueError(f"AutoK.choices must be a tuple of distinct integers >= 0, got {ks!r}")
    if max(ks) < 1:
      raise ValueError(f"AutoK.choices needs at least one K >= 1, got {ks!r}")
    for name in ("prior", "ceiling"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"AutoK.{name} must lie in [0, 1), got {getattr(self, name)!r}")
    if not self.prior_weight > 0 or not 0.0 < self.decay <= 1.0:
      raise ValueError(f"AutoK needs prior_weight > 0 and decay in (0, 1], got "
                       f"{self.prior_weight!r}, {self.decay!r}")
    if not 0.0 <= self.switch_margin < 1.0:
      raise ValueError(f"AutoK.switch_margin must lie in [0, 1), got {self.switch_margin!r}")
    if isinstance(self.probe_every, bool) or not isinstance(self.probe_every, int) \
        or self.probe_every < 0:
      raise ValueError(f"AutoK.probe_every must be an integer >= 0, got {self.probe_every!r}")
    if self.costs is not None and (len(self.costs) != len(ks)
                                   or not all(float(c) > 0 for c in self.costs)):
      raise ValueError(f"AutoK.costs must hold one positive cost per choice {ks}, "
                       f"got {self.costs!r}")

  @property
  def max_k(self) -> int:
    """The largest K compiled (sets the cache slack and the accept histogram's size)."""
    return max(self.choices)


def expected_tokens(a, ks):
  """Expected tokens per round at per-draft acceptance a with K drafts: (1-a^(K+1))/(1-a).

  NumPy in, NumPy out (host-side pruning, no device round trip); traced in, traced out.
  """
  xp = jnp if any(isinstance(x, jax.Array) for x in (a, ks)) else np
  a = xp.clip(a, 0.0, 0.999)
  return (1.0 - a ** (ks + 1.0)) / (1.0 - a)


def worthwhile(auto: AutoK, costs) -> tuple[tuple[int, ...], tuple[float, ...]]:
  """The choices (and their costs) that can beat plain decoding at `auto.ceiling`.

  0 is always kept when it was offered. Returns the pruned (choices, costs).
  """
  ks = np.asarray(auto.choices, np.float64)
  c = np.asarray(costs, np.float64)
  rate = expected_tokens(np.float64(auto.ceiling), ks) / c
  base = rate[ks == 0][0] if np.any(ks == 0) else 0.0
  keep = (ks == 0) | (rate > base)
  return (tuple(int(k) for k in ks[keep]), tuple(float(x) for x in c[keep]))


# ----------------------------------------------------------------------------- loop


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ScheduleState:
  """The running acceptance estimate and the drafter's catch-up point."""

  costs: jax.Array  # [C] f32 round cost per choice
  accepted: jax.Array  # [B] f32 decayed count of accepted drafts, per row
  judged: jax.Array  # [B] f32 decayed count of judged drafts, per row
  synced: jax.Array  # [B] int32 leading slots the drafter's state is current for
  idle: jax.Array  # [] int32 rounds in a row without drafting
  gap: jax.Array  # [] int32 idle rounds before the next probe (doubles after each probe)
  rounds: jax.Array  # [C] int32 rounds run with each choice
  # [B] int32 drafts a lookup drafter has for each row's next round (`proposal_counts`,
  # computed once per round, after it); max_k for other drafters.
  counts: jax.Array
  # [B] int32 the lookup's first draft for that round (0 for other drafters): a round
  # at K = 0 scores it against the token the target emits (`fixed_round`).
  first: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AutoState:
  """The decode state of a dynamic loop: the usual `DecodeState` plus the schedule's."""

  decode: decode.DecodeState
  schedule: ScheduleState


def init_state(target: Model, drafter, tokens, prompt_lengths, max_new_tokens, params, eos_ids,
               seeds, costs, config: decode.DecodeConfig, auto: AutoK) -> AutoState:
  """`decode.init_state` for a dynamic loop (config K = the largest choice).

  A drafter that can `sync` is not prefilled here: its state is made from the
  first token only, and the first drafting round feeds the prompt. A call where
  speculation never pays (K = 0 throughout) then never runs the drafter at all.
  """
  lazy = hasattr(drafter, "sync")
  target, drafter = decode.prepared(target), decode.prepared(drafter)
  state = decode.init_state(target, None, tokens, prompt_lengths, max_new_tokens, params,
                            eos_ids, seeds, config)
  if lazy:
    B = tokens.shape[0]
    drafter_state = drafter.init(tokens[:, :1], jnp.ones((B,), jnp.int32), config.cache_length)
    synced = jnp.zeros((B,), jnp.int32)
  else:
    drafter_state = drafter.init(tokens, prompt_lengths, config.cache_length)
    synced = jnp.maximum(prompt_lengths.astype(jnp.int32) - 1, 0)
  state = dataclasses.replace(state, drafter_state=drafter_state)
  costs = jnp.asarray(costs, jnp.float32).reshape(len(auto.choices))
  zero = jnp.zeros((tokens.shape[0],), jnp.float32)
  lookup = proposal_counts(drafter, state, auto.max_k)
  B = tokens.shape[0]
  counts, first = lookup or (jnp.full((B,), auto.max_k, jnp.int32), jnp.zeros((B,), jnp.int32))
  return AutoState(state, ScheduleState(costs, zero, zero, synced, jnp.zeros((), jnp.int32),
                                        jnp.asarray(auto.probe_every, jnp.int32),
                                        jnp.zeros((len(auto.choices),), jnp.int32), counts,
                                        first))


def _rates(schedule: ScheduleState, auto: AutoK, remaining, counts):
  """(rate [C] expected tokens per unit cost of each choice for the critical rows,
  the chosen index, whether a probe is due); see `choose`."""
  rows = ((schedule.accepted + auto.prior * auto.prior_weight)
          / (schedule.judged + auto.prior_weight))  # [B]
  critical = (remaining > 0) & (remaining == jnp.max(remaining))  # [B]
  ks = jnp.asarray(auto.choices, jnp.float32)[None, :]  # [1, C]
  drafts = ks if counts is None else jnp.minimum(ks, counts[:, None].astype(ks.dtype))  # [B|1, C]
  tokens = expected_tokens(rows[:, None], drafts)  # [B, C]
  # The critical row that gains least sets the pace (1 token: all rows done).
  pace = jnp.min(jnp.where(critical[:, None], tokens, jnp.inf), axis=0)  # [C]
  rate = jnp.where(jnp.any(critical), pace, 1.0) / schedule.costs  # [C]
  best = jnp.argmax(rate).astype(jnp.int32)
  if not auto.probe_every:
    return rate, best, jnp.zeros((), jnp.bool_)
  # Only a K with drafts to judge: some critical row has one.
  judged = jnp.any(critical[:, None] & (drafts > 0), axis=0)  # [C]
  probe_rate = jnp.where(judged, rate, -jnp.inf)
  probe = jnp.argmax(probe_rate).astype(jnp.int32)
  due = (schedule.idle >= schedule.gap) & jnp.any(judged)
  return rate, jnp.where(due, probe, best), due


def choose(schedule: ScheduleState, auto: AutoK, remaining, counts=None) -> jax.Array:
  """Index into `auto.choices` of the K with the most expected tokens per unit cost
  for the critical rows: the active rows with the most tokens still to generate, and
  among them the one whose expected tokens at that K are fewest.

  remaining: [B] int32 tokens each row still has to generate (<= 0: done). The loop
  runs until its last row is done, so the batch advances at the pace of the row
  furthest behind, not at the batch's mean acceptance: rows that copy their context
  finish early and then idle while a row the drafter cannot guess sets the length.
  Rows tied for the most tokens to go (every row of a batch that asked for one
  length, at the start) are all behind: the one the drafts serve worst sets the pace.
  counts: optional [B] int32, how many drafts the drafter proposes for each row this
  round (`proposal_counts`). A K above a row's count is credited only the drafts it
  has (at a K's cost), so it never beats K = count; with no drafts at all every K > 0
  is a plain step at a higher cost.
  """
  return _rates(schedule, auto, remaining, counts)[1]


def stays(schedule: ScheduleState, auto: AutoK, remaining, counts, index: int) -> jax.Array:
  """Whether the loop keeps choice `index` (static) for the next round: it is the
  best, or within `auto.switch_margin` of the best's rate and no probe is due."""
  rate, best, due = _rates(schedule, auto, remaining, counts)
  close = rate[index] >= (1.0 - auto.switch_margin) * jnp.max(rate)
  return (best == index) | (close & ~due)


def proposal_counts(drafter, state: decode.DecodeState, max_k: int):
  """(count [B] int32, first [B] int32) for a drafter with `lookup` (n-gram,
  datastore): how many drafts it proposes for each row this round (0 when nothing
  matches) and the first of them; None for other drafters.

  A round then drafts only when the critical rows have something to draft, and the
  acceptance estimate is built from rounds whose drafts were proposed. The counts
  are a function of committed tokens only, so the round's K still depends on the
  past alone (exactness, module docstring).
  """
  if not hasattr(drafter, "lookup"):
    return None
  context = DraftContext(tokens=state.tokens, lengths=state.lengths)
  drafts, count = drafter.lookup(context, max_k)
  return count.astype(jnp.int32), drafts[:, 0].astype(jnp.int32)


def fixed_round(target: Model, drafter, state: AutoState, config: decode.DecodeConfig,
                auto: AutoK, index: int, sync: bool = False) -> AutoState:
  """One round at K = auto.choices[index] (static), and the schedule's update.

  sync: first bring the drafter up to date (after rounds that did not draft).
  """
  k = auto.choices[index]
  s, sched = state.decode, state.schedule
  active = ~s.done
  if k > 0 and sync and hasattr(drafter, "sync"):
    context = DraftContext(tokens=s.tokens, lengths=s.lengths)
    s = dataclasses.replace(s, drafter_state=drafter.sync(s.drafter_state, context,
                                                          sched.synced))
  # Evidence comes from proposed drafts only: a round kept at a K above what a lookup
  # drafter had (`stays`) judges its placeholders too, and they say nothing about it.
  real = jnp.minimum(sched.counts, k)  # [B]
  new = decode.decode_round(target, drafter, s, dataclasses.replace(config, num_draft_tokens=k))
  lookup = proposal_counts(drafter, new, auto.max_k)  # for the next round's choice
  if k > 0:
    n = jnp.minimum(new.stats.accepted - s.stats.accepted, real)  # [B] accepted this round
    judged = jnp.where(active, jnp.minimum(n + 1, real), 0)
  elif lookup is not None:
    # Shadow evidence: a lookup's drafts cost nothing to compute, so a round at K = 0
    # still scores the first one against the token the target emitted. Greedy, the
    # draft would have been accepted exactly when they match; sampled, a one-hot q
    # accepts d with probability p(d), the chance that the emitted token is d. So
    # the estimate keeps moving while the loop does not draft, and it leaves K = 0
    # as soon as the text turns repetitive, not at the next probe.
    emitted = jnp.take_along_axis(new.tokens, s.lengths[:, None], axis=1)[:, 0]  # [B]
    judged = jnp.where(active & (sched.counts > 0), 1, 0)
    n = jnp.where(emitted == sched.first, judged, 0)
  else:
    n = judged = jnp.zeros_like(s.lengths)
  # Evidence decays per round that brings some (per row): rounds without any say
  # nothing about the drafts, and letting the estimate drift back to the prior during
  # them would make the loop oscillate between K = 0 and a K the drafts do not deserve.
  decay = (auto.decay if k > 0 else 1.0 if lookup is None
           else jnp.where(judged > 0, auto.decay, 1.0))
  # A probe (a drafting round forced after `gap` idle rounds) doubles the gap, up to
  # MAX_GAP_FACTOR x probe_every: on text the drafter cannot guess, probes and the
  # drafter's catch-up they need then cost a vanishing share of the rounds. A round
  # that drafts by choice resets it.
  if k > 0:
    probing = sched.idle >= sched.gap
    gap = jnp.where(probing, jnp.minimum(2 * sched.gap, MAX_GAP_FACTOR * auto.probe_every),
                    auto.probe_every).astype(jnp.int32)
  else:
    gap = sched.gap
  schedule = ScheduleState(
      costs=sched.costs,
      accepted=decay * sched.accepted + jnp.where(active, n, 0).astype(jnp.float32),
      judged=decay * sched.judged + judged.astype(jnp.float32),
      synced=jnp.where(active, s.lengths, sched.synced) if k > 0 else sched.synced,
      idle=jnp.zeros((), jnp.int32) if k > 0 else sched.idle + 1,
      gap=gap,
      rounds=sched.rounds.at[index].add(jnp.any(active).astype(jnp.int32)),
      counts=sched.counts if lookup is None else lookup[0],
      first=sched.first if lookup is None else lookup[1],
  )
  if config.stream:  # committed tokens to the host, as the fixed-K loop sends them
    streaming.emit(new.tokens, new.lengths, new.prompt_lengths)
  return AutoState(new, schedule)


def decode_loop(target: Model, drafter, state: AutoState, config: decode.DecodeConfig,
                auto: AutoK) -> AutoState:
  """Run dynamic rounds until every row is done.

  The outer `lax.while_loop` runs phases; a phase `lax.switch`es to the chosen K and
  runs rounds at that K in an inner `while_loop` for as long as it `stays` (the best
  K, or within `switch_margin` of it). The switch is entered once per change of K, not once per round: on
  XLA CPU a conditional around the round cost about 10% of a batch-1 step, as the
  whole decode state (KV caches included) passes in and out of it.
  """
  target, drafter = decode.prepared(target), decode.prepared(drafter)

  def not_done(s: AutoState):
    return jnp.any(~s.decode.done)

  def remaining(s: AutoState):
    return jnp.where(s.decode.done, -1, s.decode.max_lengths - s.decode.lengths)

  def pick(s: AutoState):
    return choose(s.schedule, auto, remaining(s), s.schedule.counts)

  def phase(index: int):
    def run(s: AutoState) -> AutoState:
      finished = jnp.sum(s.decode.done)  # rows done when the phase began
      s = fixed_round(target, drafter, s, config, auto, index, sync=True)
      if auto.choices[index] == 0 and not hasattr(drafter, "lookup"):
        # Plain rounds of a drafter without a lookup bring no evidence, and every active
        # row moves one token (the critical rows stay the same), so the choice can only
        # change when a row finishes or a probe falls due: test just that, not `stays`,
        # whose few dozen scalar ops cost a few percent of a small model's step on a CPU.
        def same(s):
          go = not_done(s) & (jnp.sum(s.decode.done) == finished)
          return go & (s.schedule.idle < s.schedule.gap) if auto.probe_every else go
      else:
        same = lambda s: not_done(s) & stays(s.schedule, auto, remaining(s), s.schedule.counts,
                                             index)
      return lax.while_loop(same, lambda s: fixed_round(target, drafter, s, config, auto, index),
                            s)
    return run

  phases = [phase(i) for i in range(len(auto.choices))]
  with jax.named_scope("auto_loop"):
    return lax.while_loop(not_done, lambda s: lax.switch(pick(s), phases, s), state)


# ----------------------------------------------------------------------------- costs


def _loop(fn, calls: int, models):
  """`fn(models, carry, i) -> (carry, out)` run `calls` times in one jitted fori_loop,
  so dispatch is paid once, as inside the decode loop. The models are arguments of the
  program, not constants of it: closed over, a 135M model's weights were folded as
  constants for minutes at compile time."""

  @jax.jit
  def many(models, carry):
    def body(i, c):
      carry, acc = c
      carry, out = fn(models, carry, i)
      return carry, acc + jnp.sum(out).astype(jnp.float32)
    return lax.fori_loop(0, calls, body, (carry, jnp.zeros((), jnp.float32)))

  return functools.partial(many, models)


def _interleaved_times(loops: dict, carries: dict, calls: int, repeats: int) -> dict:
  """Seconds per call of each loop: compiled first, then timed in turns, so a burst of
  load on a shared machine hits every K alike; the minimum over turns is kept."""
  for k, many in loops.items():
    carries[k], acc = many(carries[k])  # compile
    jax.block_until_ready(acc)
  best = dict.fromkeys(loops, float("inf"))
  for _ in range(repeats):
    for k, many in loops.items():
      t0 = time.perf_counter()
      carries[k], acc = many(carries[k])
      jax.block_until_ready(acc)
      best[k] = min(best[k], (time.perf_counter() - t0) / calls)
  return best


def _measure_costs(role: str, obj, vocab_size: int, batch: int, cache_length: int, ks,
                   greedy: bool, prefix: int, calls: int, repeats: int,
                   filtered: bool = False) -> dict[int, float]:
  """Seconds per call, in-loop: role "target" times a call on K+1 tokens for each K,
  role "drafter" one `propose` of K drafts (K >= 1) after a realistic prefix, role
  "pair" (obj = (target, drafter)) both calls back to back (K >= 1), role "round"
  (obj = (target, drafter)) one whole `decode_round` at each K. Sampled (greedy
  False) at temperature 1, with a top-p of 0.95 when `filtered`."""
  from jspec import sampling  # local: keeps the module's import surface small

  B, S = batch, cache_length
  obj = decode.prepared(obj)  # as the decoding loops run it
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
    target, drafter = decode.prepared(target), decode.prepared(drafter)
    for k in ks:
      def whole_round(models, state, i, k=k):
        # Every round starts from the same committed length (moved by i % 2 so the
        # work is not loop-invariant): slots stay in bounds however much is accepted.
        state = dataclasses.replace(state, lengths=lengths + i % 2,
                                    done=jnp.zeros((B,), jnp.bool_))
        target, drafter = models
        state = decode.decode_round(target, drafter if k else None, state,
                                    dataclasses.replace(config, num_draft_tokens=k))
        return state, state.lengths

      loops[k] = _loop(whole_round, calls, (target, drafter))
      carries[k] = state
    return _interleaved_times(loops, carries, calls, repeats)
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

      loops[k] = _loop(pair, calls, (target, drafter))
      carries[k] = (target.init_cache(B, S), jax.jit(lambda d: d.init(tokens, lengths, S))(drafter))
    return _interleaved_times(loops, carries, calls, repeats)
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

      loops[k] = _loop(verify, calls, obj)
      carries[k] = (obj.init_cache(B, S), jnp.ones((B, k + 1), jnp.int32))
      if k == 0:
        # A whole plain round (step, argmax or sampling, commit): what it costs beyond
        # the step is paid by every round, whatever its K.
        def plain(obj, state, i):
          state = decode.decode_round(obj, None, state, decode.DecodeConfig(0, S))
          return state, state.lengths

        loops[ROUND] = _loop(plain, calls, obj)
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

      loops[k] = _loop(propose, calls, obj)
      carries[k] = jax.jit(lambda d: d.init(tokens, lengths, S))(obj)
  out = _interleaved_times(loops, carries, calls, repeats)
  return {k: out.get(k, 0.0) for k in list(ks) + ([ROUND] if ROUND in out else [])}


ROUND = -1  # key of a whole plain round's time in the target's measurements
# Part of every cache key: bump it when jspec's own code changes what a round costs
# (times measured before no longer describe the loop).
COSTS_VERSION = 3


def _fingerprint(obj) -> Any:
  """Shapes, dtypes and static settings of a model or drafter (not its values)."""
  leaves, treedef = jax.tree_util.tree_flatten(obj)
  return [str(treedef), [(tuple(x.shape), str(x.dtype)) for x in leaves if hasattr(x, "shape")]]


def cache_path() -> str:
  """Where measured costs are kept: $JSPEC_CACHE_DIR/costs.json (default ~/.cache/jspec)."""
  root = os.environ.get("JSPEC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "jspec")
  return os.path.join(root, "costs.json")


def _machine() -> list:
  dev = jax.devices()[0]
  return [platform.node(), platform.machine(), os.cpu_count(), dev.platform,
          getattr(dev, "device_kind", ""), len(jax.devices()), jax.__version__]


_TABLES: dict = {}  # path -> ((mtime_ns, size), table): the file parsed once, not per call


def _read_table(path: str) -> dict:
  """The cost file as a dict (a copy); {} when absent or damaged (then remeasured)."""
  try:
    st = os.stat(path)
  except OSError:
    return {}
  stamp = (st.st_mtime_ns, st.st_size)
  memo = _TABLES.get(path)
  if memo is None or memo[0] != stamp:
    try:
      with open(path) as f:
        table = json.load(f)
    except (OSError, ValueError):
      table = {}  # a damaged cache is remeasured, not trusted
    if not isinstance(table, dict):
      table = {}
    memo = _TABLES[path] = (stamp, table)
  return dict(memo[1])


def _cached_times(parts, batch: int, cache_length: int, greedy: bool, prefix: int, calls: int,
                  repeats: int, use_cache: bool, vocab_size: int,
                  filtered: bool = False) -> list[dict[int, float]]:
  """Measured seconds per K for each (role, obj, wanted Ks), through the disk cache."""
  filtered = filtered and not greedy
  path = cache_path()
  table = _read_table(path) if use_cache else {}
  out, measured = [], False
  for role, obj, wanted in parts:
    key_obj = {"machine": _machine(), "role": role, "model": _fingerprint(obj), "batch": batch,
               "cache_length": cache_length, "greedy": greedy, "version": COSTS_VERSION}
    if filtered:  # (absent otherwise: keys measured before the filter was told apart hold)
      key_obj["filtered"] = True
    key = hashlib.sha256(json.dumps(key_obj, sort_keys=True).encode()).hexdigest()[:32]
    known = {int(k): float(v) for k, v in table.get(key, {}).items()}
    missing = set(wanted) - set(known)
    if ROUND in missing:  # a plain round is timed beside the 1-token step
      missing = (missing - {ROUND}) | {0}
    missing = sorted(missing)
    if missing:
      known.update(_measure_costs(role, obj, vocab_size, batch, cache_length, missing, greedy,
                                  prefix, calls, repeats, filtered))
      table[key] = {str(k): v for k, v in sorted(known.items())}
      measured = True
    out.append(known)
  if use_cache and measured:  # a call that only read the cache leaves the file alone
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump(table, f, indent=1)
    os.replace(tmp, path)
  return out


def round_costs(target: Model, drafter, batch: int, cache_length: int, choices, *,
                greedy: bool = True, filtered: bool = False, calls: int = 16,
                repeats: int = 7, use_cache: bool = True) -> tuple[float, ...]:
  """Seconds per whole round for each K in `choices` at this batch size, in-loop.

  cost(0) is a plain decoding round; cost(K) a round that drafts K tokens, verifies
  them, accepts and commits. Kept in `cache_path()` under a key of the machine, the
  target's and drafter's shapes and the call's shape, so a second call with the same
  setup measures nothing.

  greedy: every row greedy (argmax only). filtered: sampled rows use top-k or top-p,
  and every position of a round then sorts its logits; plain temperature sampling
  skips that sort, and a round at K sorts K+1 positions where a plain round sorts one
  (on the shipped pair with top-p 0.95, costs timed without it made `"auto"` draft
  n-gram rounds that ran at 0.79x of plain decoding).
  """
  prefix = max(min(64, cache_length - max(choices) - 3), 0)
  (times,) = _cached_times([("round", (target, drafter), list(choices))], batch, cache_length,
                           greedy, prefix, calls, repeats, use_cache, target.vocab_size,
                           filtered)
  return monotone(choices, [times[k] for k in choices])


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


def monotone(choices, costs) -> tuple[float, ...]:
  """The closest costs (least squares) that do not fall as K grows.

  A round with more drafts never costs less; a measurement that says so is noise
  (a burst of load during one timing), and left alone it would make the schedule
  prefer that K. Pool-adjacent-violators over the choices sorted by K.
  """
  order = np.argsort(np.asarray(choices))
  blocks = []  # [mean, weight]
  for c in np.asarray(costs, np.float64)[order]:
    blocks.append([c, 1])
    while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
      (m2, w2), (m1, w1) = blocks.pop(), blocks.pop()
      blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2])
  fitted = np.concatenate([[m] * w for m, w in blocks])
  out = np.empty_like(fitted)
  out[order] = fitted
  return tuple(float(x) for x in out)
