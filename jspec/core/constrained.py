"""Constrained decoding inside the round: one automaton state per row.

A `jspec.core.constraint.Constraint` (compiled on the host) is a table
`next_state [Q, V]`. The decode state carries it with each row's state after its
committed tokens. A round then:

    row state           s0                  (after t_0 .. t_{L-1})
    along the draft     s_j = next(s_{j-1}, d_j)        j = 1 .. K   (-1: d_j not allowed)
    verify logits       position j masked to the ids allowed in s_j
    acceptance          on the masked distributions, unchanged
    commit              s' = the state after the committed tokens

Masking the target's logits before temperature, top-k and top-p defines the
constrained distribution; baseline decoding (K = 0) masks the same way, so
speculative output follows that distribution exactly and greedy output equals
constrained greedy baseline output. A draft that the constraint forbids has
probability 0 under the masked target, so it is rejected and the positions after
it (dead states, left unmasked) are never used. Drafters that sample (a draft
model) are masked as they propose (`DraftContext.constraint`), which keeps their q
on allowed tokens; lookup drafters propose what they find and verification cuts it.

Several constraints in one batch are one automaton: their tables stacked with
state ids offset, each row starting at its own constraint's initial state; rows
without one get a one-state automaton that allows every id.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core.constraint import Constraint, advance, allowed, mask_logits


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ConstraintRows:
  """The batch's automaton and where each row stands in it."""

  table: Constraint  # next_state [Q, V], final [Q]
  state: jax.Array  # [B] int32 state after each row's committed tokens (-1: left the language)


def for_batch(constraint, batch: int, vocab_size: int) -> tuple[Constraint, np.ndarray]:
  """One table and initial states [B] from a `Constraint` (every row) or a sequence
  of B entries, each a `Constraint` or None (that row unconstrained). Host side."""
  if isinstance(constraint, Constraint):
    per_row: Sequence = [constraint] * batch
  elif isinstance(constraint, (list, tuple)):
    per_row = list(constraint)
    if len(per_row) != batch:
      raise ValueError(f"constraint: one per row ({batch}) or one for all, got {len(per_row)}")
  else:
    raise TypeError(f"constraint must be a jspec.Constraint or one per row, "
                    f"got {type(constraint).__name__}")
  distinct: list[Constraint] = []
  for c in per_row:
    if c is None:
      continue
    if not isinstance(c, Constraint):
      raise TypeError(f"constraint entries must be jspec.Constraint or None, "
                      f"got {type(c).__name__}")
    if c.vocab_size > vocab_size:
      raise ValueError(f"constraint is over {c.vocab_size} ids but the model has {vocab_size}: "
                       f"build it with the model's tokenizer")
    if not any(c is d for d in distinct):
      distinct.append(c)
  if len(distinct) == 1 and all(c is not None for c in per_row) and \
      distinct[0].vocab_size == vocab_size:
    # One constraint for every row: its table as it is (no host copy of Q x V ids per call).
    return distinct[0], np.zeros((batch,), np.int32)
  tables, finals, offsets = [], [], []
  for c in distinct:
    offsets.append(sum(t.shape[0] for t in tables))
    table = np.asarray(c.next_state)
    # Ids the tokenizer does not have (a model vocabulary padded past it) are never allowed.
    table = np.pad(table, ((0, 0), (0, vocab_size - table.shape[1])), constant_values=-1)
    tables.append(np.where(table >= 0, table + offsets[-1], -1))
    finals.append(np.asarray(c.final))
  free = sum(t.shape[0] for t in tables)  # the one-state automaton for unconstrained rows
  if any(c is None for c in per_row):
    tables.append(np.full((1, vocab_size), free, np.int32))
    finals.append(np.ones((1,), bool))
  initial = np.array([free if c is None else
                      offsets[next(i for i, d in enumerate(distinct) if d is c)]
                      for c in per_row], np.int32)
  table = Constraint(next_state=jnp.asarray(np.concatenate(tables).astype(np.int32)),
                     final=jnp.asarray(np.concatenate(finals)))
  return table, initial


def along_chain(rows: ConstraintRows, drafts: jax.Array) -> jax.Array:
  """States at each verify position of a chain: drafts [B, K] -> [B, K+1] (s_0 .. s_K)."""
  states = [rows.state]
  for j in range(drafts.shape[1]):
    states.append(advance(rows.table, states[-1], drafts[:, j]))
  return jnp.stack(states, axis=1)


def along_tree(rows: ConstraintRows, block: jax.Array, tree) -> jax.Array:
  """States at each node of a tree block [B, N] (node 0 the last committed token,
  whose state is the row's): [B, N], one level at a time from the parents'."""
  from jspec.core.tree import row_arrays  # a static Tree or a dynamic tree's RowTree

  parents, depths, _, _ = row_arrays(tree, block.shape[0])  # [B, N] each
  parents = jnp.maximum(parents, 0)
  states = jnp.broadcast_to(rows.state[:, None], block.shape)
  for d in range(1, tree.max_depth + 1):
    stepped = advance(rows.table, jnp.take_along_axis(states, parents, axis=1), block)
    states = jnp.where(depths == d, stepped, states)
  return states


def masked(logits: jax.Array, rows: ConstraintRows, states: jax.Array) -> jax.Array:
  """logits [B, W, V] with the ids each position's state forbids at -inf."""
  return mask_logits(logits, rows.table, states)


def step(rows: ConstraintRows, state: jax.Array, tokens: jax.Array) -> jax.Array:
  """int32 [B]: the states after tokens [B] from state [B] (-1 where not allowed)."""
  return advance(rows.table, state, tokens)


def step_mask(rows: ConstraintRows, state: jax.Array) -> jax.Array:
  """bool [B, V]: the ids allowed next in state [B] (a drafter's one step)."""
  return allowed(rows.table, state)


def after_commit(rows: ConstraintRows, emitted: jax.Array, count: jax.Array) -> ConstraintRows:
  """The rows' states after committing emitted[:, :count] (emitted [B, W], count [B])."""
  state = rows.state
  for j in range(emitted.shape[1]):
    state = jnp.where(j < count, advance(rows.table, state, emitted[:, j]), state)
  return dataclasses.replace(rows, state=state)
