"""The automata of an Engine's constrained requests, in one table of fixed capacity.

`generate` and `generate_many` know every constraint before they trace, and stack them
into one table (`jspec.core.constrained.for_batch`). An Engine learns of them as requests
arrive; a table whose shape followed them would recompile the engine's programs with
every new schema. So the engine keeps a table of Q states (static; `Engine(constraints=Q)`)
and writes each distinct constraint into a free range of it, its state ids offset:

    state 0           allows every id and loops to itself: unconstrained rows
    [o, o + q)        a constraint of q states, its initial state o

A constraint stays while a request waiting or decoding uses it (`acquire` / `release`
count them) and is kept afterwards for the next request that brings the same object
(a server compiles each schema once); unused ones give their room up when a new one
does not fit. Host side only: the worker uploads the table (`device`) when it changed.
"""

from __future__ import annotations

import collections
import dataclasses

import jax.numpy as jnp
import numpy as np

from jspec.core.constraint import Constraint


@dataclasses.dataclass
class _Entry:
  constraint: Constraint  # kept alive: entries are keyed by its id()
  offset: int
  size: int
  users: int = 0


class ConstraintsFull(ValueError):
  """A new constraint does not fit beside the constraints of requests in flight (their
  room frees as they end)."""


class ConstraintPool:
  """Q automaton states over V ids; not thread-safe (the Engine holds its lock)."""

  def __init__(self, capacity: int, vocab_size: int):
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 2:
      raise ValueError(f"constraints must be a number of automaton states >= 2, got {capacity!r}")
    self.capacity, self.vocab_size = int(capacity), int(vocab_size)
    self._next = np.full((self.capacity, self.vocab_size), -1, np.int32)
    self._final = np.zeros((self.capacity,), bool)
    self._next[0], self._final[0] = 0, True  # the unconstrained rows' one state
    self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()  # LRU
    self.version = 0
    self._uploaded: tuple[int, Constraint] | None = None

  def acquire(self, constraint: Constraint) -> int:
    """The initial state of `constraint` in the table, written there if new; counts one
    more user. ValueError when it cannot fit beside the constraints in use."""
    if not isinstance(constraint, Constraint):
      raise TypeError(f"constraint must be a jspec.Constraint, got {type(constraint).__name__}")
    entry = self._entries.get(id(constraint))
    if entry is None:
      if constraint.vocab_size > self.vocab_size:
        raise ValueError(f"constraint is over {constraint.vocab_size} ids but the model has "
                         f"{self.vocab_size}: build it with the model's tokenizer")
      q = constraint.num_states
      offset = self._room(q)
      if offset is None:
        in_use = sum(e.size for e in self._entries.values() if e.users)
        raise ConstraintsFull(f"a constraint of {q} automaton states does not fit: this engine "
                         f"holds {self.capacity} (Engine(constraints=...)), {in_use} of them "
                         f"used by requests waiting or decoding")
      table = np.asarray(constraint.next_state)
      self._next[offset:offset + q] = -1
      self._next[offset:offset + q, :table.shape[1]] = np.where(table >= 0, table + offset, -1)
      self._final[offset:offset + q] = np.asarray(constraint.final)
      entry = self._entries[id(constraint)] = _Entry(constraint, offset, q)
      self.version += 1
    self._entries.move_to_end(id(constraint))
    entry.users += 1
    return entry.offset

  def release(self, constraint: Constraint):
    """One user of `constraint` fewer (its rows stay until the room is needed)."""
    entry = self._entries.get(id(constraint))
    if entry is not None and entry.users > 0:
      entry.users -= 1

  def _room(self, q: int) -> int | None:
    """A free range of q states, dropping unused constraints (least recently used
    first) until one opens; None if even the constraints in use leave none."""
    while True:
      taken = sorted((e.offset, e.offset + e.size) for e in self._entries.values())
      start = 1
      for lo, hi in taken:
        if lo - start >= q:
          return start
        start = max(start, hi)
      if self.capacity - start >= q:
        return start
      unused = [k for k, e in self._entries.items() if e.users == 0]
      if not unused:
        return None
      del self._entries[unused[0]]

  def device(self) -> Constraint:
    """The table as device arrays (uploaded again only after a change)."""
    if self._uploaded is None or self._uploaded[0] != self.version:
      self._uploaded = (self.version, Constraint(next_state=jnp.asarray(self._next),
                                                 final=jnp.asarray(self._final)))
    return self._uploaded[1]
