"""Slots: a batch of B rows in which every row is an independent request.

A fixed batch decodes its rows together until the longest ends; here a row (a slot)
holds one request at a time, and a request that ends frees its slot for the next:

    insert    a queued request prefilled on its own (batch 1, a cache of its prompt's
              bucket) and written over one slot of the batch state: target K/V,
              tokens, lengths, drafter state, sampling settings, penalty counts,
              constraint state, counters and random stream all come from the new
              request; nothing of the slot's previous request stays visible (K/V
              past the new prompt is stale and never attended to: the decode-state
              invariant of docs/architecture.md)
    round     `decode.decode_round` over all B slots, as in a fixed batch
    harvest   rows that ended (EOS, stop ids, max tokens) copy their tokens, counts
              and log-probabilities into per-request outputs and free their slot

`decode_queue` runs N requests through B slots in one `lax.while_loop` (a device-side
queue, refilled inside the loop: `jspec.generate_many`); `jspec.Engine` calls `insert`
and rounds from the host for live traffic.

Which axis of each state leaf is the batch axis is found, not assumed: `row_axes`
compares the state's shapes at batch 1 and 2 (`jax.eval_shape`), so any drafter's
state and any cache layout slot in. A leaf with no batch axis is shared by the rows
(EOS ids, a constraint's table, token recycling's matrix): `insert` keeps the batch's.
A request's row state is built at its prompt's width (P slots); writing it over a slot
of S >= P slots leaves that slot's later positions stale, which the invariant allows.

A request's output does not depend on its slot, its neighbours or N: its row keys
come from its own seed and its rounds are counted from its insertion (the counters
reset), so greedy requests equal `generate` on the prompt alone and sampled ones draw
from their own seed.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from jspec.core import constrained, decode, dynamic, logprobs as logprobs_lib, sampling
from jspec.core import stats as stats_lib

SHARED = -1  # `row_axes` entry of a leaf the rows share


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Queue:
  """N requests waiting for slots, in the order they are served."""

  tokens: jax.Array  # [N, P] int32 right-padded prompts
  prompt_lengths: jax.Array  # [N] int32 in 1..P
  max_new: jax.Array  # [N] int32 >= 1
  seeds: jax.Array  # [N] int32
  params: sampling.SamplingParams | None  # [N] rows; None: every request greedy (static)
  constraint: constrained.ConstraintRows | None = None  # shared table, state [N]
  caps: jax.Array | None = None  # [N] int32 drafts each request's rounds judge; None: all K
  eos_ids: jax.Array | None = None  # [N, E] int32 each request's own (-1: none); None: the batch's

  @property
  def size(self) -> int:
    return self.tokens.shape[0]


def request(queue: Queue, i) -> Queue:
  """Request i ([] int32, traced) as a queue of one."""
  take = lambda x: lax.dynamic_slice_in_dim(x, i, 1, axis=0)
  params = None if queue.params is None else jax.tree_util.tree_map(take, queue.params)
  rows = queue.constraint
  if rows is not None:
    rows = dataclasses.replace(rows, state=take(rows.state))
  return Queue(tokens=take(queue.tokens), prompt_lengths=take(queue.prompt_lengths),
               max_new=take(queue.max_new), seeds=take(queue.seeds), params=params,
               constraint=rows, caps=None if queue.caps is None else take(queue.caps),
               eos_ids=None if queue.eos_ids is None else take(queue.eos_ids))


def repeated(one: Queue, B: int) -> Queue:
  """A queue of B copies of a queue of one (the shapes of an empty batch)."""
  rep = lambda x: jnp.repeat(x, B, axis=0)
  params = None if one.params is None else jax.tree_util.tree_map(rep, one.params)
  rows = one.constraint
  if rows is not None:
    rows = dataclasses.replace(rows, state=rep(rows.state))
  return Queue(tokens=rep(one.tokens), prompt_lengths=rep(one.prompt_lengths),
               max_new=rep(one.max_new), seeds=rep(one.seeds), params=params, constraint=rows,
               caps=None if one.caps is None else rep(one.caps),
               eos_ids=None if one.eos_ids is None else rep(one.eos_ids))


def state_of(target, drafter, rows: Queue, eos_ids, config: decode.DecodeConfig, auto=None,
             costs=None, catch_up=0.0):
  """The decode state of `rows`, prefilled: a `decode.DecodeState`, or with `auto` (an
  `AutoK`; costs [C], catch_up [] its round costs) a `dynamic.AutoState`. eos_ids [E]:
  every row's, unless the rows carry their own."""
  if rows.eos_ids is not None:
    eos_ids = rows.eos_ids
  if auto is None:
    return decode.init_state(target, drafter, rows.tokens, rows.prompt_lengths, rows.max_new,
                             rows.params, eos_ids, rows.seeds, config, rows.constraint,
                             rows.caps)
  return dynamic.init_state(target, drafter, rows.tokens, rows.prompt_lengths, rows.max_new,
                            rows.params, eos_ids, rows.seeds, costs, config, auto,
                            rows.constraint, catch_up, rows.caps)


def row_state(target, drafter, one: Queue, eos_ids, config: decode.DecodeConfig, auto=None,
              costs=None, catch_up=0.0):
  """The state of one request alone: prefilled, at its prompt's width (a cache of P
  slots; `insert` writes it over a slot of the batch). auto, costs, catch_up: `state_of`."""
  row_config = dataclasses.replace(config, cache_length=one.tokens.shape[1], layout=None)
  return state_of(target, drafter, one, eos_ids, row_config, auto, costs, catch_up)


def stand_ins(one: Queue, B: int) -> Queue:
  """B copies of request `one` cut to a one-token prompt with nothing to generate: the
  rows of an empty batch (done from the start, nothing to prefill)."""
  stand_in = dataclasses.replace(one, tokens=one.tokens[:, :1],
                                 prompt_lengths=jnp.ones((1,), jnp.int32),
                                 max_new=jnp.zeros((1,), jnp.int32))
  return repeated(stand_in, B)


def empty_state(target, drafter, one: Queue, B: int, eos_ids, config: decode.DecodeConfig,
                auto=None, costs=None, catch_up=0.0):
  """B free slots: every row done, holding a one-token stand-in prompt (no prefill).
  one: any request (a queue of one), for the shapes of the per-row settings; auto,
  costs, catch_up: `state_of`."""
  return state_of(target, drafter, stand_ins(one, B), eos_ids, config, auto, costs, catch_up)


def row_axes(target, drafter, queue: Queue, eos_ids, config: decode.DecodeConfig):
  """For each leaf of the decode state: its batch axis, or SHARED (`axes_of`)."""
  return axes_of(lambda B: empty_state(target, drafter, request(queue, jnp.int32(0)), B,
                                       eos_ids, config))


def axes_of(make):
  """For each leaf of the state `make(B)` builds: its batch axis, or SHARED. Found by
  comparing the state's shapes at batch 1 and 2 (static; nothing is computed)."""
  one, two = jax.eval_shape(lambda: make(1)), jax.eval_shape(lambda: make(2))

  def axis(a, b):
    differ = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
    if len(differ) > 1 or (differ and (a.shape[differ[0]], b.shape[differ[0]]) != (1, 2)):
      raise ValueError(f"a decode-state leaf of shape {b.shape} at batch 2 ({a.shape} at "
                       f"batch 1) has no single batch axis")
    return differ[0] if differ else SHARED

  return jax.tree_util.tree_map(axis, one, two)


def insert(state: decode.DecodeState, row: decode.DecodeState, slot, axes) -> decode.DecodeState:
  """`state` with slot `slot` ([] int32) replaced by the request in `row` (batch 1,
  `row_state`). Leaves the rows share keep the batch's value."""
  def put(big, small, axis):
    if axis == SHARED:
      return big
    index = [jnp.int32(0)] * big.ndim
    index[axis] = slot.astype(jnp.int32)
    return lax.dynamic_update_slice(big, small if small.dtype == big.dtype
                                    else small.astype(big.dtype), index)

  return jax.tree_util.tree_map(put, state, row, axes)


def resized(state, index, axes):
  """A state of len(index) rows: row j is `state`'s row index[j] ([b] int32; -1: a free
  row, a copy of row 0 that the caller parks). Leaves the rows share are kept."""
  take = jnp.maximum(index, 0)

  def gather(leaf, axis):
    return leaf if axis == SHARED else jnp.take(leaf, take, axis=axis)

  return jax.tree_util.tree_map(gather, state, axes)


def parked(state: decode.DecodeState, free) -> decode.DecodeState:
  """Rows `free` [B] bool marked done and parked (`freed`)."""
  return freed(dataclasses.replace(state, done=state.done | free), free)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Results:
  """What each of N requests produced, in queue order."""

  tokens: jax.Array  # [N, M] int32 new tokens; -1 past each request's end
  lengths: jax.Array  # [N] int32 new tokens
  stats: stats_lib.DecodeStats  # [N] rows
  logprobs: logprobs_lib.LogprobBuffers | None  # [N, M] records (`logprobs.output`)


def empty_results(N: int, M: int, K: int, spec) -> Results:
  return Results(tokens=jnp.full((N, M), -1, jnp.int32), lengths=jnp.zeros((N,), jnp.int32),
                 stats=stats_lib.init(N, K),
                 logprobs=None if spec is None else logprobs_lib.init_buffers(spec, N, M))


def harvest(results: Results, state: decode.DecodeState, owner, finished) -> Results:
  """`results` with the rows `finished` [B] bool copied to their requests `owner` [B]."""
  N, M = results.tokens.shape
  out, new_lengths = decode.output_tokens(state)
  records = None
  if state.logprobs is not None:
    records = logprobs_lib.output(state.logprobs, state.prompt_lengths, state.lengths)
  rows = Results(tokens=out[:, :M], lengths=new_lengths, stats=state.stats,
                 logprobs=None if records is None else jax.tree_util.tree_map(
                     lambda x: x[:, :M], records))
  target = jnp.where(finished, owner, N)  # out of range: dropped

  def scatter(buffer, values):
    return buffer.at[target].set(values.astype(buffer.dtype), mode="drop")

  return jax.tree_util.tree_map(scatter, results, rows)


def freed(state: decode.DecodeState, finished) -> decode.DecodeState:
  """Finished rows parked at length 1 until a request takes the slot: a free row's
  (discarded) rounds then write at slot 0, and the attention span follows the live
  rows only (`models.transformer`: rounds read the cache up to the longest row)."""
  return dataclasses.replace(state, lengths=jnp.where(finished, 1, state.lengths),
                             prompt_lengths=jnp.where(finished, 1, state.prompt_lengths))


def decode_queue(target, drafter, queue: Queue, count, eos_ids, config: decode.DecodeConfig,
                 B: int, M: int) -> tuple[Results, decode.DecodeState]:
  """The first `count` ([] int32, traced) requests of `queue` decoded through B slots in
  one `lax.while_loop`; the queue's later rows are padding (its length is a bucket).

  Each iteration first fills every free slot from the queue (in order), then runs one
  round over all B slots, then harvests the rows that ended. M: the width of the
  results (the largest max_new). Returns the results in queue order and the final
  state (a drafter's memory is read from it).
  """
  target, drafter = decode.prepared(target, drafter)
  N = count.astype(jnp.int32)
  axes = row_axes(target, drafter, queue, eos_ids, config)
  state = empty_state(target, drafter, request(queue, jnp.int32(0)), B, eos_ids, config)
  owner = jnp.full((B,), -1, jnp.int32)  # the request in each slot; -1: free
  results = empty_results(queue.size, M, config.num_draft_tokens, config.logprobs)

  def refill(carry):
    state, owner, following = carry
    slot = jnp.argmax(owner < 0).astype(jnp.int32)  # the first free slot
    row = row_state(target, drafter, request(queue, following), eos_ids, config)
    return insert(state, row, slot, axes), owner.at[slot].set(following), following + 1

  def body(carry):
    state, owner, following, results = carry
    state, owner, following = lax.while_loop(
        lambda c: jnp.any(c[1] < 0) & (c[2] < N), refill, (state, owner, following))
    state, _ = decode.decode_round(target, drafter, state, config)
    finished = state.done & (owner >= 0)
    # Every round, with nothing to copy in most: a conditional would take the whole
    # decode state as an operand, and XLA CPU copies a conditional's operands.
    results = harvest(results, state, owner, finished)
    return freed(state, finished), jnp.where(finished, -1, owner), following, results

  def busy(carry):
    _, owner, following, _ = carry
    return (following < N) | jnp.any(owner >= 0)

  carry = (state, owner, jnp.zeros((), jnp.int32), results)
  state, _, _, results = lax.while_loop(busy, body, carry)
  return results, state
