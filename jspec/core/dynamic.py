"""Dynamic speculation: the loop that runs a round at the K the schedule picks
(`num_draft_tokens="auto"`; the choice itself is `jspec.core.schedule`).

`accepted` and `judged` count drafts per row and decay by `decay` every round that
brings evidence. A drafter with `lookup` brings some in K = 0 rounds too: its first
draft, cheap to compute, is scored against the token the target emitted (see
`fixed_round`; the lookup reads only the span of the buffer the rows fill,
`lookup_window`); a draft model's K = 0 rounds leave the counts alone. After
`probe_every` rounds in a row without drafting, one round drafts at the best K >= 1
anyway, so an estimate that once fell too low is corrected by new evidence rather
than frozen; each probe that does not bring drafting back doubles the wait (up to
16x).

Exactness: the K of a round is a function of earlier rounds only, and every branch
is a complete exact round (its drafts are all judged; none is dropped), so each
emitted token still follows the target's distribution given the tokens before it.

The drafter is not called in K = 0 rounds, so its state falls behind the committed
tokens. A drafter with state (a draft model's KV cache) may define

    sync(state, context, synced) -> state

which brings the state up to the decode-state invariant from `synced` [B], the
number of leading slots known to be current; the loop calls it before a drafting
round. `DraftModel.sync` feeds the missed tokens in fixed-size chunks.

Feature drafters (Medusa, EAGLE) read the target's hidden states of the round
before, which every round replaces, K = 0 rounds included (`decode_round` pads their
one entry to the state's F = max K + 1). Medusa keeps nothing else; a drafter with a
state built from features (EAGLE's cache) defines `observe(state, context) -> state`,
which the loop calls at the start of each K = 0 round, before its features are gone.

    state = init_state(target, drafter, tokens, prompt_lengths, max_new_tokens, params,
                       eos_ids, seeds, costs, config, auto)
    state = decode_loop(target, drafter, state, config, auto)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from jspec.core import decode, nn, streaming
from jspec.core.drafter import (CatchUpDrafter, DraftContext, LookupDrafter, ObservingDrafter,
                                PricedCatchUpDrafter)
from jspec.core.model import Model
from jspec.core.schedule import MAX_GAP_FACTOR, AutoK, ScheduleState, after, choose, waited


# ----------------------------------------------------------------------------- loop

REPICK = -1  # a choice that sends the loop back to price the choices (`decode_loop`)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AutoState:
  """The decode state of a dynamic loop: the usual `DecodeState` plus the schedule's."""

  decode: decode.DecodeState
  schedule: ScheduleState


def init_state(target: Model, drafter, tokens, prompt_lengths, max_new_tokens, params, eos_ids,
               seeds, costs, config: decode.DecodeConfig, auto: AutoK,
               constraint=None, catch_up=0.0, caps=None, cache=None) -> AutoState:
  """`decode.init_state` for a dynamic loop (config K = the largest choice).

  A drafter that can `sync` is not prefilled here: its state is made from the
  first token only, and the first drafting round feeds the prompt. A call where
  speculation never pays (K = 0 throughout) then never runs the drafter at all.
  catch_up: what one of its catch-up calls costs, in the unit of `costs`: the
  schedule charges the calls it still needs to the next drafting round.
  """
  lazy = isinstance(drafter, CatchUpDrafter)
  target, drafter = decode.prepared(target, drafter)
  if lazy:
    state = decode.init_state(target, None, tokens, prompt_lengths, max_new_tokens, params,
                              eos_ids, seeds, config, constraint, caps, cache)
    B = tokens.shape[0]
    drafter_state = drafter.init(tokens[:, :1], jnp.ones((B,), jnp.int32), config.cache_length)
    state = dataclasses.replace(state, drafter_state=drafter_state)
    synced = jnp.zeros((B,), jnp.int32)
  else:  # as a fixed-K call at the largest K (feature drafters get F = max K + 1 entries)
    state = decode.init_state(target, drafter, tokens, prompt_lengths, max_new_tokens, params,
                              eos_ids, seeds, config, constraint, caps, cache)
    synced = jnp.maximum(prompt_lengths.astype(jnp.int32) - 1, 0)
  costs = jnp.asarray(costs, jnp.float32).reshape(len(auto.choices))
  zero = jnp.zeros((tokens.shape[0],), jnp.float32)
  lookup = proposal_counts(drafter, state, auto.max_k)
  B = tokens.shape[0]
  counts, first = lookup or (jnp.full((B,), auto.max_k, jnp.int32), jnp.zeros((B,), jnp.int32))
  catch_up = jnp.asarray(catch_up if lazy else 0.0, jnp.float32)
  return AutoState(state, ScheduleState(costs, zero, zero, synced, jnp.zeros((), jnp.int32),
                                        jnp.asarray(auto.probe_every, jnp.int32),
                                        jnp.zeros((len(auto.choices),), jnp.int32), counts,
                                        first, catch_up))


def catch_up_fee(drafter, state: AutoState):
  """[] f32 what catching `drafter` up would cost before its next draft, in the unit of
  the costs; None for a drafter that never catches up. Worked out only where the
  schedule prices the choices, not every round. None too for one that catches up
  without saying how many calls it makes (not a `PricedCatchUpDrafter`): it is not
  priced."""
  if not isinstance(drafter, PricedCatchUpDrafter):
    return None
  s, sched = state.decode, state.schedule
  context = DraftContext(tokens=s.tokens, lengths=s.lengths)
  return sched.catch_up * drafter.sync_calls(context, sched.synced).astype(jnp.float32)


def proposal_counts(drafter, state: decode.DecodeState, max_k: int):
  """(count [B] int32, first [B] int32) for a drafter with `lookup` (n-gram,
  datastore): how many drafts it proposes for each row this round (0 when nothing
  matches) and the first of them; None for other drafters.

  A round then drafts only when the critical rows have something to draft, and the
  acceptance estimate is built from rounds whose drafts were proposed. The counts
  are a function of committed tokens only, so the round's K still depends on the
  past alone (exactness, module docstring).

  Computed after every round, K = 0 rounds included, so its cost is part of a plain
  round's (`lookup_window`).
  """
  if not isinstance(drafter, LookupDrafter):
    return None
  drafts, count = lookup_window(drafter, state.tokens, state.lengths, max_k)
  return count.astype(jnp.int32), drafts[:, 0].astype(jnp.int32)


def lookup_window(drafter, tokens, lengths, max_k: int):
  """`drafter.lookup` over the shortest of the attention spans (`nn.attention_spans`:
  128, 256, ... slots on CPU, the whole cache elsewhere) that holds every row's
  committed tokens. A lookup reads committed tokens only (`DraftContext`), so the
  result is the same as over the whole buffer, at a cost that follows the longest row
  rather than the cache length. NGram's compares [B, S] windows per n-gram length; on a
  2-core CPU at B = 32 a one-off microbenchmark put that at 60 / 150 us a round at
  S = 1024 / 2048 over the whole buffer and 20-30 us over the span, against a
  SmolLM2-135M round of about 170 ms: small either way, and now bounded by the rows.
  """
  S = tokens.shape[1]
  spans = nn.attention_spans(S, jax.default_backend())

  def over(span: int):
    return lambda t: drafter.lookup(DraftContext(tokens=nn.read_span(t, span, 1),
                                                 lengths=lengths), max_k)

  if len(spans) == 1:
    return over(S)(tokens)
  return lax.switch(nn.span_index(spans, jnp.max(lengths)), [over(s) for s in spans], tokens)


def fixed_round(target: Model, drafter, state: AutoState, config: decode.DecodeConfig,
                auto: AutoK, index: int, sync: bool = False, channel=None) -> AutoState:
  """One round at K = auto.choices[index] (static), and the schedule's update.

  sync: first bring the drafter up to date (after rounds that did not draft).
  channel: what `config.stream` is told with the round's tokens (`decode.decode_loop`).
  """
  k = auto.choices[index]
  s, sched = state.decode, state.schedule
  active = ~s.done
  if k > 0 and sync and isinstance(drafter, CatchUpDrafter):
    context = DraftContext(tokens=s.tokens, lengths=s.lengths)
    s = dataclasses.replace(s, drafter_state=drafter.sync(s.drafter_state, context,
                                                          sched.synced))
  if k == 0 and isinstance(drafter, ObservingDrafter):
    # The features of the round before are in the state now and gone after this round.
    context = DraftContext(tokens=s.tokens, lengths=s.lengths, features=s.features,
                           feature_start=s.feature_start)
    s = dataclasses.replace(s, drafter_state=drafter.observe(s.drafter_state, context))
  # Evidence comes from proposed drafts only: a round kept at a K above what a lookup
  # drafter had (`stays`) judges its placeholders too, and they say nothing about it.
  real = jnp.minimum(sched.counts, k)  # [B]
  if s.caps is not None:  # a capped row (opted out of speculation: 0) judges no more
    real = jnp.minimum(real, s.caps)
  new, did = decode.decode_round(target, drafter, s,
                                 dataclasses.replace(config, num_draft_tokens=k))
  lookup = proposal_counts(drafter, new, auto.max_k)  # for the next round's choice
  if k > 0:
    n = jnp.minimum(did.accepted, real)  # [B] accepted this round
    judged = jnp.where(active, jnp.minimum(n + 1, real), 0)
  elif lookup is not None:
    # Shadow evidence: a lookup's drafts cost next to nothing, so a round at K = 0
    # still scores the first one against the token the target emitted. Greedy, the
    # draft would have been accepted exactly when they match; sampled, a one-hot q
    # accepts d with probability p(d), the chance that the emitted token is d. So
    # the estimate keeps moving while the loop does not draft, and it leaves K = 0
    # as soon as the text turns repetitive, not at the next probe.
    judged = jnp.where(active & (sched.counts > 0), 1, 0)
    n = jnp.where(did.token == sched.first, judged, 0)
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
    probing = waited(sched, auto, index)
    gap = jnp.where(probing, jnp.minimum(2 * sched.gap, MAX_GAP_FACTOR * auto.probe_every),
                    auto.probe_every).astype(jnp.int32)
  else:
    gap = sched.gap
  # A round that drafted leaves the drafter current below L' - 2 (its next `propose`
  # feeds the last two committed tokens, as in a fixed-K loop): nothing to catch up.
  synced = (jnp.where(active, jnp.maximum(new.lengths - 2, 0), sched.synced) if k > 0
            else sched.synced)
  schedule = ScheduleState(
      costs=sched.costs,
      accepted=decay * sched.accepted + jnp.where(active, n, 0).astype(jnp.float32),
      judged=decay * sched.judged + judged.astype(jnp.float32),
      synced=synced,
      idle=jnp.zeros((), jnp.int32) if k > 0 else sched.idle + 1,
      gap=gap,
      rounds=sched.rounds.at[index].add(jnp.any(active).astype(jnp.int32)),
      counts=sched.counts if lookup is None else lookup[0],
      first=sched.first if lookup is None else lookup[1],
      catch_up=sched.catch_up,
  )
  if config.stream is not None:  # committed tokens to the host, as decode_loop sends them
    streaming.emit(config.stream, channel, new.tokens, new.lengths, new.prompt_lengths)
  return AutoState(new, schedule)


def decode_loop(target: Model, drafter, state: AutoState, config: decode.DecodeConfig,
                auto: AutoK, channel=None, limit=None) -> AutoState:
  """Run dynamic rounds until every row is done.

  One `lax.while_loop` per choice of K, run one after another inside an outer
  `while_loop`; the carry holds the current choice, and loop i runs rounds at K_i for as
  long as that is it. After each round the choice stays (the best K, or within
  `switch_margin` of it) or moves to the best. No conditional holds a round: on XLA
  CPU a `lax.switch` over phases copied the whole decode state (KV caches included)
  each time a phase began, as branch operands cannot be updated in place, and at batch
  64 those copies cost more than the drafting rounds they began gained. Loops in
  sequence hand their carry over in place.

  limit: optional [] int32: stop (at a round's end) once the rounds run over the
  state's life, `sum(schedule.rounds)`, reach it (`jspec.Engine` runs R rounds at a time).
  """
  target, drafter = decode.prepared(target, drafter)

  def not_done(s: AutoState):
    going = jnp.any(~s.decode.done)
    return going if limit is None else going & (jnp.sum(s.schedule.rounds) < limit)

  def remaining(s: AutoState):
    return jnp.where(s.decode.done, -1, s.decode.max_lengths - s.decode.lengths)

  def pick(s: AutoState):
    return choose(s.schedule, auto, remaining(s), s.schedule.counts,
                  catch_up_fee(drafter, s)).astype(jnp.int32)

  def finished(s: AutoState):
    return jnp.sum(s.decode.done.astype(jnp.int32))

  def next_choice(s: AutoState, index: int, at_start):
    """The choice after a round at `index`, or REPICK; at_start: rows done when the phase
    began."""
    if auto.choices[index] == 0 and not isinstance(drafter, LookupDrafter):
      # Plain rounds of a drafter without a lookup bring no evidence, and every active
      # row moves one token (the critical rows stay the same), so the choice can only
      # change when a row finishes or a probe falls due: test just that, and leave the
      # pricing (a few dozen scalar ops, a few percent of a small model's step on a
      # CPU) to the outer loop.
      same = finished(s) == at_start
      if auto.probe_every:
        same &= ~waited(s.schedule, auto)
      return jnp.where(same, jnp.int32(index), REPICK)
    return after(s.schedule, auto, remaining(s), s.schedule.counts, index,
                 catch_up_fee(drafter, s)).astype(jnp.int32)

  def phase(index: int):
    def go(carry):
      s, choice, _ = carry
      return (choice == index) & not_done(s)

    def body(carry):
      s, _, at_start = carry
      # Catching the drafter up is a test that finds nothing to feed after a drafting round.
      s = fixed_round(target, drafter, s, config, auto, index, sync=True, channel=channel)
      choice = next_choice(s, index, at_start)
      return s, choice, jnp.where(choice == index, at_start, finished(s))

    return lambda carry: lax.while_loop(go, body, carry)

  phases = [phase(i) for i in range(len(auto.choices))]

  def outer(carry):
    s, choice, at_start = carry
    repick = choice == REPICK
    carry = (s, jnp.where(repick, pick(s), choice), jnp.where(repick, finished(s), at_start))
    for run in phases:  # each loop runs zero rounds unless the choice is its K
      carry = run(carry)
    return carry

  def first(s: AutoState):
    # The loop starts as if in plain decoding and leaves it as any round would: only for
    # a K that beats it by more than `switch_margin`, a draft model's catch-up (the
    # whole prompt, here) included.
    if 0 not in auto.choices:
      return pick(s)
    return after(s.schedule, auto, remaining(s), s.schedule.counts, auto.choices.index(0),
                 catch_up_fee(drafter, s)).astype(jnp.int32)

  with jax.named_scope("auto_loop"):
    carry = (state, first(state), finished(state))
    return lax.while_loop(lambda c: not_done(c[0]), outer, carry)[0]
