"""The schedule of dynamic speculation: which K the next round uses (pure math).

`num_draft_tokens="auto"` (or an `AutoK`) compiles a round for each of a few K (0 =
plain decoding, no drafter call) into one loop (`jspec.core.dynamic`). Before every round
it picks the K with the most expected tokens per unit of time:

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

The costs come from the call (`AutoK.costs`), from a profile timed and saved before
(`jspec profile`, `jspec.tools.profile.profile_auto`), or from the prior of
`jspec.planner.cost_model` (the models' bytes and FLOPs against the device's measured
bandwidth and compute, shaped by how the target's own call grows with its block,
`jspec.planner.call_times`). A call never times a round itself. Every compiled K is a
verify program of its own, so the first call's compile time grows with their number:
`select` keeps at most `AutoK.variants`, by default 2, K = 0 and one K (on SmolLM2-135M,
2-core CPU, first calls: three programs 1.8x a fixed K's, two 1.2x).

Everything here is NumPy on the host or jnp inside the loop, with no state of its own.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

MAX_GAP_FACTOR = 16  # probes back off to at most this many times `probe_every`
DEFAULT_CHOICES = (0, 1, 2, 3, 4, 6)
DEFAULT_VARIANTS = 2  # of the default choices, compiled at most: K = 0 and one K


@dataclasses.dataclass(frozen=True)
class AutoK:
  """Static settings of dynamic speculation. Changing them recompiles.

  choices: the K values the loop may use; 0 (speculation off) should be one. Of
    these, at most `variants` are compiled (`select`).
  prior: acceptance assumed before any evidence.
  prior_weight: how many judged drafts the prior is worth.
  decay: factor on the evidence per drafting round (1 = never forget).
  probe_every: after this many rounds in a row at K = 0, draft once at the best
    K >= 1 to refresh the estimate (0: never); each probe that does not bring
    drafting back doubles the wait, up to 16 x probe_every. No probe runs when the
    critical rows have fewer tokens to go than the wait (too late to pay back).
  ceiling: the most optimistic acceptance; a K that loses to plain decoding even
    at this acceptance is not compiled, and when every K > 0 loses the call runs
    the plain decoding program (no drafter at all).
  switch_margin: keep the current K while its expected rate is at least
    (1 - switch_margin) of the best K's (hysteresis; 0 changes K whenever another
    is ahead). It bounds what staying can lose per round.
  costs: optional per-choice round costs (any time unit, same order as
    `choices`). None: a profile saved in `cache_dir` for these models and shapes
    (`jspec profile`, `jspec.tools.profile.profile_auto`), else the prior of
    `jspec.planner.cost_model` (no timing).
  variants: how many choices are compiled into the loop at most, 0 included. Each
    is a verify program of its own: compile time grows with it (module docstring).
    None: 2 of the default choices, or every one of choices given explicitly.
  cache_dir: a folder of saved profiles (`jspec profile --cache-dir`); None: the
    default, $JSPEC_CACHE_DIR or ~/.cache/jspec. Read only; nothing is timed in a call.
  itl_bound: a bound on the tail of the inter-token latency, as a multiple of plain
    decoding's (e.g. 1.1). The first token of a round waits for the whole round and
    the others arrive with it, so the p99 wait between tokens is the costliest
    round's time once rounds that deliver one token are common (they are wherever
    acceptance is low): a K whose round costs more than itl_bound plain rounds is
    never compiled. With no K left the call runs plain decoding. None: no bound.
  """

  choices: tuple[int, ...] = DEFAULT_CHOICES
  prior: float = 0.6
  prior_weight: float = 4.0
  decay: float = 0.95
  probe_every: int = 64
  ceiling: float = 0.9
  switch_margin: float = 0.05
  costs: tuple[float, ...] | None = None
  variants: int | None = None
  cache_dir: str | None = None
  itl_bound: float | None = None

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
    if self.itl_bound is not None and not float(self.itl_bound) >= 1.0:
      raise ValueError(f"AutoK.itl_bound must be >= 1 (plain decoding's own latency), "
                       f"got {self.itl_bound!r}")
    if self.variants is not None and (isinstance(self.variants, bool)
                                      or not isinstance(self.variants, int) or self.variants < 2):
      raise ValueError(f"AutoK.variants must be an integer >= 2 (K = 0 and one K >= 1), "
                       f"got {self.variants!r}")

  @property
  def compiled(self) -> int:
    """How many choices `select` keeps at most."""
    if self.variants is not None:
      return self.variants
    return DEFAULT_VARIANTS if self.choices == DEFAULT_CHOICES else len(self.choices)

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
  """The choices (and their costs) that can beat plain decoding at `auto.ceiling`,
  and whose round costs at most `auto.itl_bound` plain rounds when that is set.

  0 is always kept when it was offered. Returns the pruned (choices, costs).
  """
  ks = np.asarray(auto.choices, np.float64)
  c = np.asarray(costs, np.float64)
  rate = expected_tokens(np.float64(auto.ceiling), ks) / c
  base = rate[ks == 0][0] if np.any(ks == 0) else 0.0
  keep = (ks == 0) | (rate > base)
  if auto.itl_bound is not None and np.any(ks == 0):
    keep &= (ks == 0) | (c <= float(auto.itl_bound) * c[ks == 0][0])
  return (tuple(int(k) for k in ks[keep]), tuple(float(x) for x in c[keep]))


def select(auto: AutoK, costs) -> tuple[tuple[int, ...], tuple[float, ...]]:
  """The choices to compile (and their costs): those that can beat plain decoding at
  `auto.ceiling` (`worthwhile`), then at most `auto.compiled` of them.

  When more remain, 0 stays and the others are those with the best rate (expected
  tokens per unit cost) at `auto.prior`, the acceptance the loop assumes before it has
  evidence: a user who expects drafts to be accepted more often says so there, and a
  longer K is compiled. Two rules tried before, on n-gram drafts over the shipped pair
  (fixed two-K loops measured side by side: batch 2 best at K = 4, 1.78x against 1.50x
  at K = 1; batch 4-16 best at K = 1-2, where K = 6 ran at 0.96-1.00x):
  - the K that is the single best over the widest range of acceptance rates in
    [0, ceiling] kept K = 1 at batch 2;
  - the K that most raises the mean over that range of the best kept rate kept K = 6
    at every batch: it weighs the large gains of long K at acceptance rates that the
    batch's slowest row seldom reaches.
  """
  ks, cs = worthwhile(auto, costs)
  if len(ks) <= auto.compiled:
    return ks, cs
  k_arr, c_arr = np.asarray(ks, np.float64), np.asarray(cs, np.float64)
  rate = expected_tokens(np.float64(auto.prior), k_arr) / c_arr  # [C]
  rate[k_arr == 0] = np.inf  # plain decoding always stays
  order = sorted(range(len(ks)), key=lambda i: (-rate[i], ks[i]))  # ties: the smaller K
  keep = sorted(order[:auto.compiled])
  return tuple(ks[i] for i in keep), tuple(cs[i] for i in keep)


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
  # [] f32 what one catch-up call of the drafter costs, in the unit of `costs` (0: a
  # drafter that never catches up, or costs given without it)
  catch_up: jax.Array | float = 0.0


def waited(schedule: ScheduleState, auto: AutoK, index=None) -> jax.Array:
  """[] bool: the idle rounds since the last drafting round have reached the gap, in
  units of the probe's extra cost. A probe at choice `index` costs c_K / c_0 - 1 plain
  rounds more than a plain round; where that is above one (a K = 6 round at batch 32
  costs about five plain ones on a 2-core CPU), the wait grows by that factor, so a probe
  never takes more than one plain round's worth of extra time per `gap` idle rounds.
  Where it costs at most two plain ones the wait is `gap` rounds. index: [] int32
  (traced or static) the probe's choice; None: the cheapest drafting choice (the
  earliest any probe could be due)."""
  if 0 not in auto.choices:
    return schedule.idle >= schedule.gap
  costs = schedule.costs
  zero = auto.choices.index(0)
  if index is None:
    drafting = jnp.asarray([k > 0 for k in auto.choices])
    probe_cost = jnp.min(jnp.where(drafting, costs, jnp.inf))
  else:
    probe_cost = costs[index]
  extra = probe_cost / costs[zero] - 1.0
  wait = jnp.ceil(schedule.gap.astype(jnp.float32) * jnp.maximum(extra, 1.0))
  return schedule.idle >= wait.astype(jnp.int32)


def _rates(schedule: ScheduleState, auto: AutoK, remaining, counts, fee=None):
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
  # A drafter that must catch up before it drafts (a draft model fed nothing during
  # plain rounds: at the start, the whole prompt) pays `fee` first ([] f32: catch_up
  # times the calls it needs; 0 right after a round that drafted). It is counted
  # twice: once for the calls, once for the chance that the drafts disappoint and the
  # loop returns to K = 0 with the fee sunk (at even odds that the estimate is wrong,
  # a bet that saves s pays off only when s / 2 - fee > 0). Spread over the tokens
  # still to go, it lowers every drafting K's rate, the more the nearer the end:
  # rate = tokens / (tokens / rate + 2 fee).
  if fee is not None:
    togo = jnp.maximum(jnp.max(remaining), 1).astype(jnp.float32)
    rate = jnp.where(ks[0] > 0, togo / (togo / rate + 2.0 * fee), rate)
  best = jnp.argmax(rate).astype(jnp.int32)
  if not auto.probe_every:
    return rate, best, jnp.zeros((), jnp.bool_)
  # Only a K with drafts to judge: some critical row has one.
  judged = jnp.any(critical[:, None] & (drafts > 0), axis=0)  # [C]
  probe_rate = jnp.where(judged, rate, -jnp.inf)
  probe = jnp.argmax(probe_rate).astype(jnp.int32)
  # A probe pays back over the rounds after it: with fewer tokens to go than the gap it
  # waited, the call would end before its evidence could be used (a draft model's probe
  # also catches the drafter up on every token it missed, a prefill of the whole row).
  due = (waited(schedule, auto, probe) & jnp.any(judged)
         & (jnp.max(remaining) >= schedule.gap))
  return rate, jnp.where(due, probe, best), due


def choose(schedule: ScheduleState, auto: AutoK, remaining, counts=None, fee=None) -> jax.Array:
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
  fee: optional [] f32, what catching the drafter up before it drafts costs (in the
  unit of the costs; `_rates`).
  """
  return _rates(schedule, auto, remaining, counts, fee)[1]


def stays(schedule: ScheduleState, auto: AutoK, remaining, counts, index: int,
          fee=None) -> jax.Array:
  """Whether the loop keeps choice `index` (static) for the next round: it is the
  best, or within `auto.switch_margin` of the best's rate and no probe is due."""
  return after(schedule, auto, remaining, counts, index, fee) == index


def after(schedule: ScheduleState, auto: AutoK, remaining, counts, index: int,
          fee=None) -> jax.Array:
  """The choice for the round after one at `index` (static): `index` while it `stays`,
  else the best (`choose`); one pricing of the choices for both."""
  rate, best, due = _rates(schedule, auto, remaining, counts, fee)
  margin = auto.switch_margin
  close = rate[index] >= (1.0 - margin) * jnp.max(rate)
  keep = (best == index) | (close & ~due)
  if 0 not in auto.choices or auto.choices[index] == 0:
    return jnp.where(keep, jnp.int32(index), best)
  # A drafting K keeps its place only while it beats plain decoding by the margin, as
  # it had to in order to leave it: its cost is an estimate, plain decoding's is not,
  # and a near tie on a cost priced low (a small model's round does more than its
  # bytes say) is a loss. A due probe is not held to it.
  zero = auto.choices.index(0)
  beats = lambda i: rate[i] >= (1.0 + margin) * rate[zero]
  keep &= beats(index) | due
  return jnp.where(keep, jnp.int32(index),
                   jnp.where(beats(best) | due, best, jnp.int32(zero)))
