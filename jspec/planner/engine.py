"""`jspec.Engine`: live requests on the slots of one decode state.

`generate_many` serves a queue known in advance inside one compiled loop. An Engine
serves requests as they arrive: callers `submit` from any thread and read tokens as
they are committed; one worker thread owns the decode state (B slots, `jspec.core.slots`)
on the device and alternates two kinds of compiled program:

    insert   one request prefilled and written over a free slot (one program per
             prompt bucket; `Engine.warmup` compiles them all up front)
    run      R rounds over every slot, then the tokens and counters back to the host

Neither recompiles as requests come and go: prompts, lengths, settings and seeds are
all traced. After each `run` the worker hands every request its new tokens (with the
time they reached the host), finishes those that ended (EOS, a stop id, max tokens,
cancelled) and refills their slots from the queue.

Stop ids are the request's own: the host cuts the output at the first one (kept, as
EOS is) and frees the slot; a stop inside a run's R rounds costs at most R - 1 rounds
of that slot. A request's output does not depend on its slot or neighbours: greedy
requests equal `generate` on the prompt alone.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import compilation, constrained, decode, dynamic, schedule
from jspec.core import logprobs as logprobs_lib
from jspec.core import slots as slots_lib
from jspec.core.constraint import Constraint
from jspec.core.model import Model
from jspec.planner import inputs, placement, plan
from jspec.planner.constraint_pool import ConstraintPool, ConstraintsFull  # submit raises it


SHRINK_AFTER = 4  # runs in a row with the load in a smaller bucket before moving to it
MEASURED_WEIGHT = 0.3  # "auto": weight of a new run's round time in its running mean


class QueueFull(RuntimeError):
  """`Engine.submit` when the queue already holds `max_queue` waiting requests."""


class EngineClosed(RuntimeError):
  """`Engine.submit` after `close`."""


@dataclasses.dataclass(frozen=True)
class RequestOutput:
  """What one request produced and how it went."""

  tokens: list[int]  # new tokens, the stop id or EOS included when one ended it
  finish_reason: str  # "stop" (EOS or a stop id), "length" (max_new_tokens), "cancelled"
  prompt_length: int
  submitted: float  # time.perf_counter() at submit
  token_times: list[float]  # seconds from submit to each token's arrival on the host
  target_calls: int  # rounds the request was in a slot (verify calls)
  accepted: int  # drafts accepted and emitted
  position_judged: list[int]  # per draft position, rounds that judged it
  position_accepted: list[int]  # per draft position, rounds that accepted it
  # With `Engine(logprobs=...)`: each token's log-probability and its top alternatives
  # [(id, log p), ...] (`jspec.Logprobs`: the model's own distribution for an int).
  logprobs: list[float] | None = None
  top_logprobs: list[list[tuple[int, float]]] | None = None

  @property
  def time_to_first_token(self) -> float | None:
    return self.token_times[0] if self.token_times else None

  @property
  def tokens_per_call(self) -> float:
    """Tau: new tokens per target call."""
    return len(self.tokens) / max(self.target_calls, 1)


class Handle:
  """One submitted request: iterate it for tokens as they come, or wait for `result`."""

  def __init__(self, engine: "Engine", rid: int, prompt_length: int, max_new: int,
               stop_ids: frozenset[int], constraint: Constraint | None = None,
               ignore_eos: bool = False):
    self.id = rid
    self._engine = engine
    self._prompt_length = prompt_length
    self._max_new = max_new
    self._stop_ids = stop_ids
    self._submitted = time.perf_counter()
    self._constraint = constraint
    self._ignore_eos = ignore_eos
    self._tokens: list[int] = []
    self._times: list[float] = []
    # With `Engine(logprobs=...)`, one entry per token, appended with it: a reader that
    # saw token i finds its entries at i.
    self.logprobs: list[float] = []
    self.top_logprobs: list[list[tuple[int, float]]] = []
    self._listeners: list = []
    self._cond = threading.Condition()
    self._output: RequestOutput | None = None
    self._error: BaseException | None = None

  @property
  def done(self) -> bool:
    return self._output is not None or self._error is not None

  def cancel(self) -> bool:
    """Cancel the request (its slot is freed at the next step). False if it had ended."""
    return self._engine.cancel(self)

  def result(self, timeout: float | None = None) -> RequestOutput:
    """Wait for the request to end; TimeoutError after `timeout` seconds."""
    with self._cond:
      if not self._cond.wait_for(lambda: self.done, timeout):
        raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
    if self._error is not None:
      raise self._error
    return self._output

  def on_update(self, listener) -> None:
    """Call `listener()` (no arguments) whenever tokens arrive or the request ends, and
    once now; then `read` says what is new. It runs on the engine's worker thread: it
    must return at once (an event loop's `call_soon_threadsafe`, a queue put), so that
    thousands of requests in flight need no thread each."""
    with self._cond:
      self._listeners.append(listener)
    listener()

  def read(self, start: int = 0):
    """(tokens[start:], their logprobs, their top lists, output or None, error or None),
    one consistent view: the output or error is set once every token is in."""
    with self._cond:
      return (self._tokens[start:], self.logprobs[start:], self.top_logprobs[start:],
              self._output, self._error)

  def _notify(self):
    for listener in list(self._listeners):
      listener()

  def __iter__(self):
    """The new tokens, each as soon as it reaches the host."""
    i = 0
    while True:
      with self._cond:
        self._cond.wait_for(lambda: len(self._tokens) > i or self.done)
        ready = self._tokens[i:]
        finished = self.done
      yield from ready
      i += len(ready)
      if finished and i >= len(self._tokens):
        if self._error is not None:
          raise self._error
        return

  # Worker side.
  def _push(self, tokens, now: float, records=None) -> bool:
    """Append new tokens (and their log-probability records: chosen [n], top ids and
    values [n, m] or None); True when a stop id ended the request (cut after it)."""
    stopped = False
    kept = []
    for t in tokens:
      kept.append(int(t))
      if int(t) in self._stop_ids:
        stopped = True
        break
    with self._cond:
      if records is not None:
        chosen, top_ids, top_values = records
        n = len(kept)
        self.logprobs.extend(float(x) for x in chosen[:n])
        if top_ids is not None:
          self.top_logprobs.extend([(int(i), float(v)) for i, v in zip(ids, values)]
                                   for ids, values in zip(top_ids[:n], top_values[:n]))
      self._tokens.extend(kept)
      self._times.extend([now - self._submitted] * len(kept))
      self._cond.notify_all()
    self._notify()
    return stopped

  def _finish(self, reason: str, stats=None):
    K = 0 if stats is None else len(stats["position_judged"])
    judged = [0] * K if stats is None else [int(x) for x in stats["position_judged"]]
    accepted_at = [0] * K if stats is None else [int(x) for x in stats["position_accepted"]]
    with self._cond:
      self._output = RequestOutput(
          tokens=list(self._tokens), finish_reason=reason, prompt_length=self._prompt_length,
          submitted=self._submitted, token_times=list(self._times),
          target_calls=0 if stats is None else int(stats["target_calls"]),
          accepted=0 if stats is None else int(stats["accepted"]),
          position_judged=judged, position_accepted=accepted_at,
          logprobs=list(self.logprobs) if self._engine.logprobs is not None else None,
          top_logprobs=(list(self.top_logprobs)
                        if self._engine.logprobs is not None and self._engine.logprobs.top
                        else None))
      self._cond.notify_all()
    self._notify()

  def _fail(self, error: BaseException):
    with self._cond:
      self._error = error
      self._cond.notify_all()
    self._notify()


@dataclasses.dataclass
class _Pending:
  handle: Handle
  queue: slots_lib.Queue  # the request as a queue of one, placed
  start: int = 0  # its initial state in the engine's constraint table (0: unconstrained)
  cancelled: bool = False


# ---------------------------------------------------------------------- programs
#
# The engine's state is a `decode.DecodeState` (a fixed K, or plain) or a
# `dynamic.AutoState` ("auto"), of one of a few batch sizes (`Engine` buckets). costs
# [C] and catch_up [] are "auto"'s round costs at the state's batch (traced; unused
# otherwise).


def _decode_of(state) -> decode.DecodeState:
  return state.decode if isinstance(state, dynamic.AutoState) else state


def _with_decode(state, d: decode.DecodeState):
  return dataclasses.replace(state, decode=d) if isinstance(state, dynamic.AutoState) else d


def _empty(target, drafter, one, eos_ids, costs, catch_up, config, auto, B):
  return slots_lib.empty_state(target, drafter, one, B, eos_ids, config, auto, costs, catch_up)


def _axes(target, drafter, one, eos_ids, costs, catch_up, config, auto):
  return slots_lib.axes_of(lambda B: _empty(target, drafter, one, eos_ids, costs, catch_up,
                                            config, auto, B))


@compilation.program(static_argnames=("config", "auto", "slots"))
def _empty_program(target, drafter, one, eos_ids, costs, catch_up, config, auto, slots):
  target, drafter = decode.prepared(target, drafter)
  return _empty(target, drafter, one, eos_ids, costs, catch_up, config, auto, slots)


@compilation.program(static_argnames=("config", "auto"))
def _row_program(target, drafter, one, eos_ids, costs, catch_up, config, auto):
  """One request alone, prefilled, at its prompt's width (one program per prompt
  bucket, whatever the engine's batch)."""
  target, drafter = decode.prepared(target, drafter)
  return slots_lib.row_state(target, drafter, one, eos_ids, config, auto, costs, catch_up)


@compilation.program(static_argnames=("config", "auto"), donate_argnums=(2,))
def _put_program(target, drafter, state, row, slot, one, eos_ids, costs, catch_up, config, auto):
  """`state` with `row` written over slot `slot` (`slots.insert`)."""
  axes = _axes(target, drafter, one, eos_ids, costs, catch_up, config, auto)
  return slots_lib.insert(state, row, slot, axes)


@compilation.program(static_argnames=("config", "auto"))
def _resize_program(target, drafter, state, index, one, eos_ids, costs, catch_up, config, auto):
  """A state of len(index) rows holding `state`'s rows `index` (-1: a free row)."""
  axes = _axes(target, drafter, one, eos_ids, costs, catch_up, config, auto)
  out = slots_lib.resized(state, index, axes)
  return _with_decode(out, slots_lib.parked(_decode_of(out), index < 0))


@compilation.program(static_argnames=("config", "auto"), donate_argnums=(2,))
def _run_program(target, drafter, state, stop, rounds, costs, catch_up, config, auto):
  """Rows `stop` [B] ended first (cancelled or stopped on the host), then up to `rounds`
  rounds (fewer once every row is done). Returns the state with finished rows parked
  (`slots.freed`) and, from before parking, tokens [B, S], lengths, done and stats."""
  target, drafter = decode.prepared(target, drafter)
  d = _decode_of(state)
  state = _with_decode(state, dataclasses.replace(d, done=d.done | stop))
  if auto is None:
    def body(carry):
      s, i = carry
      s, _ = decode.decode_round(target, drafter, s, config)
      return s, i + 1

    state, _ = jax.lax.while_loop(lambda c: (c[1] < rounds) & jnp.any(~c[0].done), body,
                                  (state, jnp.zeros((), jnp.int32)))
  else:
    sched = dataclasses.replace(state.schedule, costs=costs, catch_up=catch_up)
    limit = jnp.sum(sched.rounds) + rounds
    state = dynamic.decode_loop(target, drafter, dataclasses.replace(state, schedule=sched),
                                config, auto, limit=limit)
  d = _decode_of(state)
  rounds_by_k = state.schedule.rounds if auto is not None else None
  seen = (d.tokens, d.lengths, d.done, d.stats, rounds_by_k, d.logprobs)
  return _with_decode(state, slots_lib.freed(d, d.done)), seen


class Engine:
  """B slots of live decoding over a target and an optional drafter.

      engine = jspec.Engine(model, jspec.NGram(model.vocab_size), slots=32,
                            num_draft_tokens=4, cache_length=1024)
      handle = engine.submit(prompt_ids, max_new_tokens=64, temperature=0.7, seed=1)
      for token in handle: ...               # streamed as rounds commit them
      out = handle.result()                   # tokens, finish_reason, timings, tau
      engine.close()

  Args:
    target: the `jspec.Model`.
    drafter: None (plain decoding), a `jspec.Model` or any drafter, as for
      `speculative_generate`; num_draft_tokens / tree as there: a fixed K, a tree, or
      "auto" (a `jspec.AutoK`), which chooses K = 0 or its largest choice every round,
      priced at the batch size the engine runs at that moment: speculation where the
      load leaves spare compute, plain decoding where it does not.
    slots: B, the most requests decoded at once. The engine runs at the smallest batch
      of `buckets` (default: powers of two up to B, and B) that holds its requests,
      moving the rows when the load crosses one: a lone request decodes at batch 1.
    cache_length: slots of cache per row: a request needs its prompt + max_new_tokens +
      a verify block. Rounds read the cache up to the longest live row only.
    max_queue: requests that may wait for a slot (beyond those the free slots take at
      the worker's next step); `submit` raises `QueueFull` past it.
    rounds: R, the rounds of each run between host visits (streaming granularity).
    eos_id: the EOS ids every request stops at (None: the model's).
    buckets: the batch sizes the engine may run at (each compiles its programs once).
    penalties, logit_bias: whether requests may set penalties / a logit bias (static:
      counting tokens costs every round something).
    logprobs: None, or record every token's log-probability (`RequestOutput.logprobs`,
      and `Handle.logprobs` as tokens stream): an int n records the model's own
      distribution (its log_softmax, before sampling settings and constraints, as
      OpenAI-compatible servers report) with the top n alternatives; a
      `jspec.Logprobs` chooses as in `generate`.
    constraints: 0, or the automaton states Q of a table that holds the constraints of
      requests waiting or decoding (`submit(constraint=...)`; one table of fixed shape,
      so new constraints never recompile; `jspec.planner.constraint_pool`).
  """

  def __init__(self, target: Model, drafter=None, *, slots: int = 32, cache_length: int = 1024,
               num_draft_tokens=None, tree=None, max_queue: int = 1024, rounds: int = 4,
               eos_id=None, penalties: bool = False, logit_bias: bool = False,
               logprobs=None, constraints: int = 0, buckets=None, start: bool = True):
    if not isinstance(target, Model):
      raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
    for name, value, low in (("slots", slots, 1), ("cache_length", cache_length, 2),
                             ("max_queue", max_queue, 0), ("rounds", rounds, 1)):
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    K, tree_, side, d, auto = 0, None, None, None, None
    self._given_costs = None
    if drafter is not None:
      speculation = plan.speculation(target, drafter, num_draft_tokens, tree)
      d, tree_, side, K = (speculation.drafter, speculation.tree, speculation.side,
                           speculation.max_k)
      if isinstance(speculation.k, schedule.AutoK):
        if tree_ is not None:
          raise ValueError('num_draft_tokens="auto" runs chains: give no tree')
        # One drafting K beside plain rounds, so that every batch size shares the state's
        # shape; each batch prices the two itself (`_bucket_costs`).
        auto = dataclasses.replace(speculation.k, choices=(0, speculation.k.max_k), costs=None)
        given = speculation.k
        if given.costs:  # the caller's costs at 0 and the largest K, for every batch
          by_k = dict(zip(given.choices, given.costs))
          if 0 not in by_k:
            raise ValueError("AutoK costs for an Engine must include K = 0's")
          self._given_costs = (by_k[0], by_k[given.max_k])
    elif num_draft_tokens is not None or tree is not None:
      raise ValueError("num_draft_tokens / tree need a drafter")
    self.slots, self.cache_length, self.max_queue, self.rounds = (int(slots), int(cache_length),
                                                                  int(max_queue), int(rounds))
    self.num_draft_tokens = K
    self._block = decode.block_width(K, tree_, side)
    if self.cache_length <= self._block:
      raise ValueError(f"cache_length {cache_length} leaves no room past a verify block of "
                       f"{self._block} slots")
    self._penalties, self._bias = bool(penalties), bool(logit_bias)
    if logprobs is None or isinstance(logprobs, logprobs_lib.Logprobs):
      self.logprobs = logprobs
    elif isinstance(logprobs, bool) or not isinstance(logprobs, (int, np.integer)):
      raise TypeError(f"logprobs must be None, an int (top alternatives) or a jspec.Logprobs, "
                      f"got {logprobs!r}")
    else:
      self.logprobs = logprobs_lib.Logprobs(raw=True, top=int(logprobs))
    self._pool = ConstraintPool(constraints, target.vocab_size) if constraints else None
    self._state_table = None  # the pool's version the state's table holds
    self._capped = K > 0 and tree_ is None  # per-request caps on K (chains)
    self._eos_id = eos_id
    self._target = target.decoding_form()
    self._drafter = plan.decoding_form(d)
    self._config = decode.DecodeConfig(num_draft_tokens=K, cache_length=self.cache_length,
                                       tree=tree_, side=side, logprobs=self.logprobs)
    self._eos = jnp.asarray(inputs.eos_array(target.eos_ids if eos_id is None else eos_id,
                                             target.vocab_size))
    self._eos_set = frozenset(int(i) for i in np.asarray(self._eos) if i >= 0)
    self._auto = auto
    if buckets is None:
      buckets = [1 << i for i in range(self.slots.bit_length()) if 1 << i < self.slots]
      buckets.append(self.slots)
    buckets = sorted({int(b) for b in buckets})
    if buckets[0] < 1 or buckets[-1] != self.slots:
      raise ValueError(f"buckets must be batch sizes >= 1 ending at slots ({self.slots}), "
                       f"got {buckets}")
    self.buckets = tuple(buckets)
    self._costs: dict[int, tuple] = {}
    # "auto": seconds per round measured at each batch and choice, from runs that ran one
    # choice only (a running mean); they replace the prior once both choices are measured.
    self.round_seconds: dict[int, dict[int, float]] = {}
    self._low_runs = 0  # runs in a row the load would fit half the batch
    self._lock = threading.Condition()
    self._pending: collections.deque[_Pending] = collections.deque()
    self._owner: list[_Pending | None] = []  # per row of the state: its request or None
    self._seen = np.zeros(0, np.int64)  # tokens already handed out per row
    self._stop = np.zeros(0, bool)  # rows to end at the next run
    self._ids = itertools.count()
    self._closing = False
    self._drain = True
    self._error: BaseException | None = None
    # Counters for metrics (`stats`).
    self.completed = 0
    self.generated_tokens = 0
    self.target_calls = 0
    self.runs = 0
    self.runs_by_batch: dict[int, int] = {}  # runs (of up to R rounds) at each batch size
    self.rounds_by_k: dict[int, int] = {}  # "auto": rounds at each K since the engine began
    self._state = None
    self._thread = None
    if start:
      self.start()

  # ------------------------------------------------------------------ requests

  def _one(self, prompt, max_new_tokens, settings: dict, seed,
           cap: int | None = None, ignore_eos: bool = False) -> tuple[slots_lib.Queue, int]:
    """A request checked (clear errors before any tracing) and placed as a queue of one."""
    if not isinstance(prompt, (list, tuple, np.ndarray)) or len(prompt) == 0:
      raise ValueError("prompt must be a non-empty list of token ids")
    if not self._penalties and (settings["repetition_penalty"] != 1.0
                                or settings["presence_penalty"] != 0.0
                                or settings["frequency_penalty"] != 0.0):
      raise ValueError("this Engine was built without penalties=True")
    if not self._bias and settings["logit_bias"] is not None:
      raise ValueError("this Engine was built without logit_bias=True")
    request = inputs.request(self._target, [list(prompt)], None, max_new_tokens,
                             eos_id=self._eos_id, seed=[int(seed)],
                             cache_length=self.cache_length, block=self._block, **settings)
    view = _Always(request, self._penalties, self._bias, self._target.vocab_size)
    _, _, rows = placement.place(self._target, None, view, None, None)
    caps = None
    if self._capped:  # chains: every request carries its cap (K when it sets none)
      caps = jnp.asarray([self.num_draft_tokens if cap is None else cap], jnp.int32)
    # Every request carries its EOS ids (none when it ignores EOS): rows of [1, E].
    eos = jnp.full_like(self._eos, -1) if ignore_eos else self._eos
    queue = slots_lib.Queue(tokens=rows.tokens, prompt_lengths=rows.lengths,
                            max_new=rows.max_new, seeds=rows.seeds, params=rows.params,
                            caps=caps, eos_ids=eos[None, :])
    return queue, int(request.max_new[0])

  def submit(self, prompt, *, max_new_tokens: int, temperature=0.0, top_k=0, top_p=1.0,
             min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
             logit_bias=None, seed: int | None = None, stop_ids=(), speculate: bool = True,
             max_draft_tokens: int | None = None, constraint: Constraint | None = None,
             ignore_eos: bool = False) -> Handle:
    """Queue one request; returns its `Handle`. Safe from any thread.

    Settings as in `jspec.generate`, for this request alone; stop_ids: token ids that
    end this request (kept in its output) besides the engine's EOS ids. seed None: a
    fresh seed per request. speculate=False: this request's drafts are never judged (it
    decodes one token per round, exactly as plain decoding, beside drafting rows);
    max_draft_tokens: at most this many of each round's drafts are judged (chains only);
    constraint: a `jspec.Constraint` the new tokens follow (an engine built with
    `constraints=Q`); ignore_eos: the engine's EOS ids do not end this request (it runs
    to max_new_tokens or a stop id; load generators use it for answers of a set length).
    Raises ValueError / TypeError for bad input, `QueueFull` when `max_queue` requests
    already wait beyond the free slots, `ConstraintsFull` when its constraint does not fit
    beside those in use, `EngineClosed` after `close`."""
    rid = next(self._ids)
    settings = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                    frequency_penalty=frequency_penalty, logit_bias=logit_bias)
    stops = frozenset(int(i) for i in np.asarray(stop_ids, np.int64).reshape(-1))
    if any(not 0 <= i < self._target.vocab_size for i in stops):
      raise ValueError(f"stop_ids must be ids in [0, {self._target.vocab_size})")
    if not self._capped and self.num_draft_tokens and (not speculate
                                                        or max_draft_tokens is not None):
      raise ValueError("speculate=False / max_draft_tokens are per-request caps on a chain's "
                       "K; this engine verifies a tree")
    cap = self.num_draft_tokens if speculate else 0
    if max_draft_tokens is not None:
      if isinstance(max_draft_tokens, bool) or not isinstance(
          max_draft_tokens, (int, np.integer)) or max_draft_tokens < 0:
        raise ValueError(f"max_draft_tokens must be an integer >= 0, got {max_draft_tokens!r}")
      cap = min(cap, int(max_draft_tokens))
    if constraint is not None:
      if self._pool is None:
        raise ValueError("this Engine was built without constraints=Q (automaton states)")
      if not isinstance(constraint, Constraint):
        raise TypeError(f"constraint must be a jspec.Constraint, got "
                        f"{type(constraint).__name__}")
    queue, max_new = self._one(prompt, max_new_tokens, settings,
                               inputs.mix(rid, 0x5EED) if seed is None else seed, cap,
                               bool(ignore_eos))
    handle = Handle(self, rid, len(prompt), max_new, stops, constraint, bool(ignore_eos))
    with self._lock:
      if self._closing:
        raise EngineClosed("the engine is closed")
      if self._error is not None:
        raise EngineClosed(f"the engine stopped on an error: {self._error!r}")
      # Requests that free slots will take at the worker's next step are not waiting for
      # one: a burst into an idle engine is not refused for the worker being busy.
      waiting = len(self._pending) - (self.slots - self.active)
      if waiting >= self.max_queue:
        raise QueueFull(f"{waiting} requests already wait for a slot "
                        f"(max_queue={self.max_queue})")
      start = 0 if constraint is None else self._pool.acquire(constraint)
      self._pending.append(_Pending(handle, queue, start))
      self._lock.notify_all()
    return handle

  def _ended(self, handle: Handle, reason: str, stats=None):
    """Finish `handle` and give its constraint back."""
    if handle._constraint is not None:
      with self._lock:  # reentrant: `cancel` calls this holding it
        self._pool.release(handle._constraint)
    handle._finish(reason, stats)

  def cancel(self, handle: Handle) -> bool:
    """End `handle`'s request now (waiting or decoding). False if it had already ended;
    ValueError for a handle of another engine."""
    if not isinstance(handle, Handle) or handle._engine is not self:
      raise ValueError("not a handle of this engine")
    with self._lock:
      if handle.done:
        return False
      for p in self._pending:
        if p.handle is handle:
          self._pending.remove(p)
          self._ended(handle, "cancelled")
          return True
      for b, p in enumerate(self._owner):
        if p is not None and p.handle is handle:
          p.cancelled = True
          self._stop[b] = True
          self._lock.notify_all()
          return True
    return False

  @property
  def queued(self) -> int:
    """Requests waiting for a slot."""
    return len(self._pending)

  @property
  def active(self) -> int:
    """Requests in a slot now (decoding, or ended and about to be handed back)."""
    return sum(p is not None for p in self._owner)

  # ------------------------------------------------------------------ worker

  def start(self):
    """Build the decode state and start the worker thread (the constructor does, unless
    start=False)."""
    if self._thread is not None:
      return
    self._one_shape = self._placeholder()
    self._resize(self.buckets[0])
    self._thread = threading.Thread(target=self._work, name="jspec-engine", daemon=True)
    self._thread.start()

  def _placeholder(self) -> slots_lib.Queue:
    return self._with_table(self._one([0], 1, dict(
        temperature=0.5, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
        presence_penalty=0.0, frequency_penalty=0.0,
        logit_bias=({} if self._bias else None)), 0)[0])

  def _with_table(self, queue: slots_lib.Queue, start: int = 0) -> slots_lib.Queue:
    """`queue` (of one) starting at state `start` of the constraint table as it is now
    (an engine with constraints; otherwise `queue` itself)."""
    if self._pool is None:
      return queue
    with self._lock:
      table = self._pool.device()
    rows = constrained.ConstraintRows(table=table, state=jnp.asarray([start], jnp.int32))
    return dataclasses.replace(queue, constraint=rows)

  def _sync_table(self, force: bool = False):
    """Give the state the constraint table as it is now, if it changed since (the rows
    share it; same shape, nothing recompiles). The state's copy is its own: the programs
    donate the state, and the pool's array (or a placeholder's) must outlive them."""
    if self._pool is None:
      return
    with self._lock:
      version, table = self._pool.version, self._pool.device()
    if not force and version == self._state_table:
      return
    table = jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), table)
    d = _decode_of(self._state)
    self._state = _with_decode(self._state, dataclasses.replace(
        d, constraint=dataclasses.replace(d.constraint, table=table)))
    self._state_table = version

  def _bucket_costs(self, B: int):
    """(costs [C], catch_up []) of "auto"'s two choices at batch B: the prior of
    `speculative_generate` at this batch and cache (`plan.round_costs`) until this engine
    has timed its own rounds of both choices at B (`round_seconds`), then those. The
    prior comes from calls timed once per machine over a full cache; the engine's rounds
    read only the live rows' span, share the machine with its host work, and run at the
    load of the moment, so where the two disagree the measurement decides. Where no K
    can beat plain decoding at B, the drafting choice is priced out (it never wins, and
    is never measured). Costs the caller gave (`AutoK(costs=...)`) are used as given."""
    if self._auto is None:
      return np.zeros((1,), np.float32), np.float32(0.0)
    if B not in self._costs:
      auto = dataclasses.replace(self._auto, costs=self._given_costs)
      priced = plan.round_costs(self._target, self._drafter, auto, B, self.cache_length,
                                greedy=False, filtered=False)
      by_k = dict(zip(priced.choices, priced.costs))
      plain = by_k.get(0, min(priced.costs))
      costs = [plain, by_k.get(self._auto.choices[1], 1e6 * plain)]
      self._costs[B] = (np.asarray(costs, np.float32), np.float32(priced.catch_up))
    prior, catch_up = self._costs[B]
    seen = self.round_seconds.get(B, {})
    if self._given_costs is not None or len(seen) < len(prior):
      return prior, catch_up
    # In the prior's units (a plain round's), so that its catch-up price still applies.
    return (np.asarray([seen[i] / seen[0] * prior[0] for i in range(len(prior))], np.float32),
            catch_up)

  def _timed(self, B: int, before: dict, after: dict, seconds: float):
    """Fold a run's time into `round_seconds` when it ran one choice only."""
    ran = {i: after.get(k, 0) - before.get(k, 0) for i, k in enumerate(self._auto.choices)}
    ran = {i: n for i, n in ran.items() if n > 0}
    if len(ran) != 1:
      return
    (i, n), = ran.items()
    per_round = seconds / n
    seen = self.round_seconds.setdefault(B, {})
    seen[i] = per_round if i not in seen else (
        (1 - MEASURED_WEIGHT) * seen[i] + MEASURED_WEIGHT * per_round)

  def _statics(self, B: int):
    costs, catch_up = self._bucket_costs(B)
    return (self._one_shape, self._eos, costs, catch_up)

  @property
  def batch(self) -> int:
    """The batch the engine runs at now (one of `buckets`)."""
    return len(self._owner)

  def _resize(self, B: int):
    """Move the live requests into a state of B rows (the smallest bucket that holds
    them): a lone request then decodes at batch 1, a busy engine at its slots."""
    one, eos, costs, catch_up = self._statics(B)
    with self._lock:
      live = [b for b, p in enumerate(self._owner) if p is not None]
      owner = [self._owner[b] for b in live] + [None] * (B - len(live))
      seen = np.concatenate([self._seen[live], np.zeros(B - len(live), np.int64)])
      stop = np.concatenate([self._stop[live], np.zeros(B - len(live), bool)])
    if self._state is None:
      self._state = _empty_program(self._target, self._drafter, one, eos, costs, catch_up,
                                   config=self._config, auto=self._auto, slots=B)
      self._sync_table(force=True)  # not `one`'s table, which the program may pass through
    else:
      index = np.asarray(live + [-1] * (B - len(live)), np.int32)
      self._state = _resize_program(self._target, self._drafter, self._state, index, one, eos,
                                    costs, catch_up, config=self._config, auto=self._auto)
    with self._lock:
      self._owner, self._seen, self._stop = owner, seen, stop
    self._low_runs = 0

  def _fitting(self, n: int) -> int:
    """The smallest bucket that holds n requests."""
    return next((b for b in self.buckets if b >= n), self.buckets[-1])

  def warmup(self, prompt_buckets=None):
    """Compile now what requests would compile as they come: for every batch bucket the
    run, resize and insert programs, and the row program of each prompt bucket
    (default: every bucket up to the cache). Call it before submitting anything."""
    P, prompts = inputs.PROMPT_BUCKET_MIN, []
    while P < self.cache_length - self._block:
      prompts.append(P)
      P *= 2
    prompts = list(prompt_buckets or prompts)
    with self._lock:  # the worker waits on this lock while nothing is queued
      if self._pending or self.active:
        raise RuntimeError("warmup() before submitting requests")
      rows = [_row_program(self._target, self._drafter, self._with_table(self._one([0] * min(
          P, self.cache_length - self._block - 1), 1, dict(
              temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
              presence_penalty=0.0, frequency_penalty=0.0,
              logit_bias=({} if self._bias else None)), 0)[0]), *self._statics(1)[1:],
          config=self._config, auto=self._auto) for P in prompts]
      for B in self.buckets:
        self._resize(B)
        one, eos, costs, catch_up = self._statics(B)
        for row in rows:
          self._state = _put_program(self._target, self._drafter, self._state, row,
                                     np.int32(0), one, eos, costs, catch_up,
                                     config=self._config, auto=self._auto)
        stop = np.ones(B, bool)  # the row put in ends at once: nothing decodes
        self._state, _ = _run_program(self._target, self._drafter, self._state, stop,
                                      np.int32(self.rounds), costs, catch_up,
                                      config=self._config, auto=self._auto)
      for B in reversed(self.buckets[:-1]):  # the moves down, as the load falls
        self._resize(B)

  def _work(self):
    try:
      while True:
        with self._lock:
          self._lock.wait_for(lambda: self._closing or self._pending or self.active)
          if self._closing and (not self._drain or (not self._pending and not self.active)):
            break
        self._admit()
        if self.active:
          self._step()
    except BaseException as e:  # the engine is broken: every request hears why
      with self._lock:
        self._error = e
        waiting = [p.handle for p in self._pending] + [p.handle for p in self._owner if p]
        self._pending.clear()
        self._owner = [None] * len(self._owner)
      for h in waiting:
        h._fail(RuntimeError(f"the engine stopped on an error: {e!r}"))
      return
    with self._lock:  # closed without draining: what remains is cancelled
      leftover = [p.handle for p in self._pending] + [p.handle for p in self._owner if p]
      self._pending.clear()
      self._owner = [None] * len(self._owner)
    for h in leftover:
      self._ended(h, "cancelled")

  def _admit(self):
    """Grow the batch to hold what waits (up to `slots`), then fill free rows from the
    queue, in order."""
    with self._lock:
      wanted = self._fitting(min(self.active + len(self._pending), self.slots))
    if wanted > self.batch:
      self._resize(wanted)
    while True:
      with self._lock:
        free = [b for b, p in enumerate(self._owner) if p is None]
        if not free or not self._pending:
          return
        pending = self._pending.popleft()
        slot = free[0]
        self._owner[slot] = pending
        self._seen[slot] = 0
        self._stop[slot] = False  # the insert replaces whatever the row was doing
      one, eos, costs, catch_up = self._statics(self.batch)
      queue = self._with_table(pending.queue, pending.start)
      self._sync_table()  # the batch reads the table its new row was made with
      row = _row_program(self._target, self._drafter, queue, eos, costs, catch_up,
                         config=self._config, auto=self._auto)
      self._state = _put_program(self._target, self._drafter, self._state, row, np.int32(slot),
                                 one, eos, costs, catch_up, config=self._config,
                                 auto=self._auto)

  def _step(self):
    with self._lock:
      stop = self._stop.copy()
      self._stop[:] = False
    _, eos, costs, catch_up = self._statics(self.batch)
    began = time.perf_counter()
    self._state, seen = _run_program(self._target, self._drafter, self._state, stop,
                                     np.int32(self.rounds), costs, catch_up,
                                     config=self._config, auto=self._auto)
    tokens, lengths, done, stats, rounds_by_k, records = jax.device_get(seen)
    now = time.perf_counter()
    self.runs += 1
    self.runs_by_batch[self.batch] = self.runs_by_batch.get(self.batch, 0) + 1
    if rounds_by_k is not None:  # the state's counts since it was made (a resize keeps them)
      counts = {k: int(r) for k, r in zip(self._auto.choices, rounds_by_k)}
      if self.runs_by_batch[self.batch] > 1:  # a batch's first run may have compiled it
        self._timed(self.batch, self.rounds_by_k, counts, now - began)
      self.rounds_by_k = counts
    accepted_at = np.asarray(stats.position_accepted)
    for b in range(self.batch):
      with self._lock:
        pending = self._owner[b]
      if pending is None:
        continue
      handle = pending.handle
      P = handle._prompt_length
      start = P + int(self._seen[b])
      new = tokens[b, start:int(lengths[b])]
      got = None
      if records is not None:
        cut = lambda x: None if x is None else x[b, start:int(lengths[b])]
        got = (cut(records.chosen), cut(records.top_ids), cut(records.top_values))
      stopped = handle._push(new, now, got) if len(new) else False
      self._seen[b] += len(new)
      if pending.cancelled or stopped or done[b]:
        row = {f: np.asarray(getattr(stats, f))[b] for f in
               ("target_calls", "accepted", "position_judged")}
        row["position_accepted"] = accepted_at[b]
        if pending.cancelled:
          reason = "cancelled"
        elif stopped:
          reason = "stop"
        else:
          last = handle._tokens[-1] if handle._tokens else -1
          reason = ("stop" if last in self._eos_set and not handle._ignore_eos
                    else "length")
        self._ended(handle, reason, row)
        self.completed += 1
        self.generated_tokens += len(handle._tokens)
        self.target_calls += int(row["target_calls"])
        with self._lock:
          self._owner[b] = None
          # A row that the host ended (stop id, cancel) is still decoding on the device.
          self._stop[b] = not done[b]
    # Shrink once the load has fit half the batch for a few runs in a row (not at once:
    # a load that hovers at a bucket's edge would move the rows back and forth).
    with self._lock:
      fits = self._fitting(self.active + len(self._pending))
    self._low_runs = self._low_runs + 1 if fits < self.batch else 0
    if self._low_runs >= SHRINK_AFTER:
      self._resize(fits)

  def close(self, drain: bool = True, timeout: float | None = None):
    """Stop the worker: drain=True finishes every submitted request first, False cancels
    what is waiting or decoding. New submits raise `EngineClosed` from now on."""
    with self._lock:
      self._closing = True
      self._drain = drain
      self._lock.notify_all()
    if self._thread is not None:
      self._thread.join(timeout)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close(drain=exc[0] is None)


class _Always:
  """A `Request` view for an Engine's state, which always holds `SamplingParams` (greedy
  requests are per-row one-hots), so that greedy and sampled requests share one
  program: never `greedy`, `penalized` as the engine says, and with a [1, V] logit bias
  (zeros when the request has none) where the engine has one."""

  def __init__(self, request: inputs.Request, penalties: bool, bias: bool, vocab_size: int):
    self._r = request
    self.penalized = penalties
    self.greedy = False
    self.logit_bias = request.logit_bias
    if bias and self.logit_bias is None:
      self.logit_bias = np.zeros((request.batch, vocab_size), np.float32)

  def __getattr__(self, name):
    return getattr(self._r, name)
