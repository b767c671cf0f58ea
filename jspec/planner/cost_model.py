"""A prior for what a decode round costs, from bytes and FLOPs: no round is timed.

`"auto"` needs the cost of a round at each K before it has run one. A decode call at
small batch streams every weight once (memory-bound); more rows per call add work
that is free until the device runs out of compute. So, for a call on r rows of a
model with W weight bytes and P weight parameters, holding C cache bytes:

    t(r)    = max(W / bandwidth, 2 P r / compute(r)) + C / bandwidth + 4 r C_row / compute(r)
    cost(0) = t_target(B)                         a plain round
    cost(K) = t_target(B (K + 1)) + t_draft(K)    a round that drafts K tokens

with bandwidth and compute(r) measured on this device by two small probes
(`DeviceRates.measure`: 1 to 512 rows through a stack of matrices larger than the
caches, a few seconds on a 2-core CPU) rather than taken from a spec sheet. On an
accelerator compute(r) is large and a verify costs about one step; on a small CPU a
few rows already make the product compute-bound (a 5-row verify of SmolLM2-135M
costs 2-3x a step on the 2-core machine the project is developed on), and the prior
says so. A draft model costs K of its own steps; heads (Medusa, EAGLE) one pass over
their weights per draft; a `BlockDrafter` (DFlash) one pass of its block per round,
whatever K; lookup drafters (n-gram, datastore) carry no weights and cost nothing here.

The prior leaves out what a round does beyond its calls (acceptance, commit, the
loop), 20-40% of a round at batch 8-64 on XLA CPU. A profile (`jspec.tools.profile`)
measures whole rounds when that matters; what it saved is read here
(`saved_round_costs`), so a decoding call never times a round.

How a call's cost grows with its block is where bytes and FLOPs mislead most on a
small CPU (the cost of a product over a few rows depends on the matrix's shape, and a
small model's call is mostly work that is not products), so `call_time` can take that
growth timed on the model's own calls (`jspec.planner.call_times.growth`, once per
machine, model and shape).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import re
import time
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import quant
from jspec.core.drafter import BlockDrafter, ModelDrafter
from jspec.core.schedule import monotone
from jspec.planner import cache_folder

# The probe: a stack of 8 MB matrices applied one after another, 512 MB in all, like
# a model's layers (a matrix of a few MB behaves unlike one of 512 MB: a CPU's matrix
# kernels pack small operands differently), timed at each row count.
# Past 64 rows every device here is compute-bound: those run through the first 8
# matrices only, to keep the probe short.
PROBE_LAYERS, PROBE_WIDTH = 64, 1024
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 512)
FEW_LAYERS_FROM = 128


@dataclasses.dataclass(frozen=True)
class DeviceRates:
  """What this device sustains: bytes/s streaming weights and FLOP/s per row count."""

  bandwidth: float  # bytes/s, a matrix-vector product over a matrix beyond the caches
  rows: tuple[int, ...]  # row counts of `compute`
  compute: tuple[float, ...]  # FLOP/s of an f32 matrix product with that many rows

  def flops_rate(self, r: float) -> float:
    """compute(r), interpolated in log(rows) between the measured counts."""
    return float(np.interp(np.log(max(r, 1.0)), np.log(self.rows), self.compute))

  @classmethod
  def measure(cls, repeats: int = 2) -> "DeviceRates":
    """Probe the default device (about a second on a 2-core CPU; cached per process)."""
    return _measure(repeats)


def machine() -> list:
  """What identifies this machine and backend in jspec's saved measurements."""
  dev = jax.devices()[0]
  return [platform.node(), platform.machine(), os.cpu_count(), dev.platform,
          getattr(dev, "device_kind", ""), len(jax.devices()), jax.__version__]


def device_rates(cache_dir: str | None = None) -> DeviceRates:
  """This device's rates: read from <cache_dir>/device.json (jspec's cache folder by
  default) when this machine measured them before, else measured once and saved."""
  path = cache_path(cache_dir, "device.json")
  key = json.dumps(machine())
  table = {}
  try:
    with open(path) as f:
      table = json.load(f)
    saved = table[key]
    return DeviceRates(float(saved["bandwidth"]), tuple(int(r) for r in saved["rows"]),
                       tuple(float(c) for c in saved["compute"]))
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    pass  # absent or damaged: measured again
  if not isinstance(table, dict):
    table = {}
  rates = DeviceRates.measure()
  table[key] = dataclasses.asdict(rates)
  write_table(path, table)
  return rates


def write_table(path: str, table: dict) -> None:
  """Replace the JSON file at `path` whole (a reader never sees half of it)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump(table, f, indent=1)
  os.replace(tmp, path)


# Part of every cache key: bump it when jspec's own code changes what a round costs
# (times measured before no longer describe the loop).
COSTS_VERSION = 4  # 4: input-major MLP matrices in the decoding form


def per_object(table: dict, obj, make):
  """make(obj), kept in `table` for as long as `obj` lives (by identity, not equality:
  models hold arrays). Objects that cannot be weakly referenced are not kept."""
  hit = table.get(id(obj))
  if hit is not None and hit[0]() is obj:
    return hit[1]
  value = make(obj)
  key = id(obj)
  try:
    ref = weakref.ref(obj, lambda _, key=key: table.pop(key, None))
  except TypeError:
    return value
  table[key] = (ref, value)
  return value


def fingerprint(obj) -> Any:
  """Shapes, dtypes and static settings of a model or drafter (not its values).

  The same in every process: a model's functions are static fields whose repr carries
  their address ("<function apply at 0x7f..>"), which is dropped here, or nothing
  saved by one process would ever be found by the next. Kept per live object: an
  `"auto"` call keys half a dozen lookups on it."""
  return per_object(_FINGERPRINTS, obj, _work_out_fingerprint)


def _work_out_fingerprint(obj) -> Any:
  leaves, treedef = jax.tree_util.tree_flatten(obj)
  return [re.sub(r" at 0x[0-9a-fA-F]+", "", str(treedef)),
          [(tuple(x.shape), str(x.dtype)) for x in leaves if hasattr(x, "shape")]]


_FINGERPRINTS: dict = {}


def cache_path(cache_dir: str | None = None, name: str = "costs.json") -> str:
  """Where saved measurements are kept: <cache_dir>/<name> (profiles: costs.json;
  device rates: device.json; call times: calls.json), by default in jspec's
  cache folder ($JSPEC_CACHE_DIR, else ~/.cache/jspec)."""
  root = os.path.expanduser(cache_dir) if cache_dir else cache_folder.cache_root()
  return os.path.join(root, name)


_TABLES: dict = {}  # path -> ((mtime_ns, size), table): the file parsed once, not per call


def read_table(path: str) -> dict:
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


def profile_key(role: str, obj, batch: int, cache_length: int, greedy: bool,
                filtered: bool) -> str:
  """The key of one profile entry: machine, role, the models' shapes, the call's shape."""
  key_obj = {"machine": machine(), "role": role, "model": fingerprint(obj), "batch": batch,
             "cache_length": cache_length, "greedy": greedy, "version": COSTS_VERSION}
  if filtered and not greedy:  # (absent otherwise: keys saved before the filter was told apart)
    key_obj["filtered"] = True
  return hashlib.sha256(json.dumps(key_obj, sort_keys=True).encode()).hexdigest()[:32]


def saved_round_costs(target, drafter, batch: int, cache_length: int, choices, *,
                      greedy: bool = True, filtered: bool = False,
                      cache_dir: str | None = None) -> tuple[float, ...] | None:
  """Round costs at each K of `choices` as a profile saved them (`jspec profile`), or
  None when some K is missing. The models as a decoding call runs them (their decoding
  form, a draft model wrapped as `DraftModel`): the form profiles are keyed by."""
  key = profile_key("round", (target, drafter), batch, cache_length, greedy, filtered)
  known = {int(k): float(v) for k, v in read_table(cache_path(cache_dir)).get(key, {}).items()}
  if not set(choices) <= set(known):
    return None
  return monotone(choices, [known[k] for k in choices])


def _best_time(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # compile
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best


@functools.lru_cache(maxsize=None)
def _measure(repeats: int) -> DeviceRates:
  n, d = PROBE_LAYERS, PROBE_WIDTH
  ws = [jnp.full((d, 2 * d) if i % 2 == 0 else (2 * d, d), 1e-3, jnp.float32) for i in range(n)]

  @jax.jit
  def layers(x, ws):
    for w in ws:  # unrolled, as a decoding call runs a model's layers
      x = jnp.tanh(x @ w)
    return x

  compute = []
  for r in ROWS:
    used = ws if r < FEW_LAYERS_FROM else ws[:8]
    t = _best_time(layers, jnp.ones((r, d), jnp.float32), used, repeats=repeats)
    if r == 1:  # one row streams every matrix once: that is the bandwidth
      bandwidth = sum(w.nbytes for w in used) / t
    compute.append(2.0 * sum(w.size for w in used) * r / t)
  return DeviceRates(bandwidth=bandwidth, rows=ROWS, compute=tuple(compute))


def _bytes_and_params(tree) -> tuple[float, float]:
  """Bytes as held (`quant.num_bytes`: 4-bit values at half a byte, scales and offsets
  counted) and weights (a quantized weight counting as its values)."""
  leaves = [x for x in jax.tree_util.tree_leaves(tree, is_leaf=quant.is_quant_weight)
            if hasattr(x, "shape")]
  return float(quant.num_bytes(leaves)), float(quant.num_elements(leaves))


def _streamed(model) -> tuple[float, float]:
  """(bytes, parameters) one call reads: every weight, except an input embedding that
  is not also the output head (a call reads a few of its rows only)."""
  w_bytes, w_params = _bytes_and_params(model.params)
  try:
    head = model.head()
  except TypeError:  # no head_fn: count everything
    return w_bytes, w_params
  if head.lm_head is not None:
    e_bytes, e_params = _bytes_and_params(head.embed)  # as the model holds it
    w_bytes, w_params = w_bytes - e_bytes, w_params - e_params
  return w_bytes, w_params


def call_time(model, batch: int, block: int, cache_length: int, rates: DeviceRates,
              growth: dict[int, float] | None = None) -> float:
  """Prior seconds of one cached call of `model` on `block` tokens per row.

  growth: {block: cost ratio to a one-token call} timed on the model's own calls
  (`jspec.planner.call_times.growth`); the call then costs the prior's one-token call
  times growth[block], rather than the rates' estimate at batch * block rows."""
  w_bytes, w_params = _streamed(model)
  cache = jax.eval_shape(lambda: model.init_cache(batch, cache_length))
  c_bytes, c_elems = _bytes_and_params(cache)

  def estimate(block: int) -> float:
    r = batch * block
    rate = rates.flops_rate(r)
    weights = max(w_bytes / rates.bandwidth, 2.0 * w_params * r / rate)
    return weights + c_bytes / rates.bandwidth + 4.0 * block * c_elems / rate

  if growth is not None and block in growth:
    return estimate(1) * growth[block]
  return estimate(block)


@dataclasses.dataclass(frozen=True)
class TokenChoice:
  """How a round chooses its tokens from the logits, which the prior prices apart from
  the calls: greedy rows take an argmax; sampled rows a softmax, a draw and the
  acceptance ratios; filtered ones (top-k, top-p, min-p) also the thresholds
  (`jspec.core.sampling`).

  The work is a few passes over the [rows, V] f32 logits, so it is priced in passes at
  the streaming bandwidth. The pass counts are medians measured on a 2-core XLA CPU as
  multiples of one summing pass over the same array ([64, 5, 49152] and [64, 1, 49152]
  and [1, 5, 49152]): the argmax 5-12, a plain draw 6-9, a top-p draw 41-72. At batch 64
  a top-p verify of 5 positions of a 49k vocabulary is thus a third of a SmolLM2-135M
  verify call on that machine, which is why `"auto"` must know it."""

  greedy: bool = True
  filtered: bool = False

  @property
  def passes(self) -> float:
    if self.greedy:
      return 8.0
    return 50.0 if self.filtered else 8.0

  def seconds(self, rows: int, vocab: int, rates: DeviceRates) -> float:
    """Prior seconds to choose tokens at `rows` (batch x positions) rows."""
    return self.passes * 4.0 * rows * vocab / rates.bandwidth


def drafter_time(drafter, batch: int, k: int, cache_length: int, rates: DeviceRates,
                 draft_step: float = 0.0) -> float:
  """Prior seconds for `drafter` to propose k drafts per row.

  draft_step: for a draft model, a measured lower bound on one of its steps (seconds;
  see `prior_costs`)."""
  if isinstance(drafter, ModelDrafter):  # a draft model: k of its steps
    return k * sum(max(call_time(model, batch, 1, cache_length, rates), draft_step)
                   for model in drafter.models())
  w_bytes, w_params = _bytes_and_params(drafter)
  if not w_bytes:
    return 0.0
  if isinstance(drafter, BlockDrafter):  # one pass of its block, whatever k (DFlash)
    rows = batch * int(drafter.draft_block)
    return max(w_bytes / rates.bandwidth, 2.0 * w_params * rows / rates.flops_rate(rows))
  return k * max(w_bytes / rates.bandwidth, 2.0 * w_params * batch / rates.flops_rate(batch))


def prior_costs(target, drafter, batch: int, cache_length: int, choices,
                rates: DeviceRates | None = None,
                growth: dict[int, float] | None = None,
                draft_ratio: float | None = None,
                choice: TokenChoice = TokenChoice()) -> tuple[float, ...]:
  """Prior seconds of a whole round at each K in `choices` (0: a plain round).

  choice: how the round chooses tokens (`TokenChoice`); a verify chooses at K + 1
  positions per row, a draft model samples its own K drafts one at a time.

  growth: the target's `call_times.growth` at blocks K + 1 (None: the rates'
  curve alone). draft_ratio: for a draft model, `call_times.step_ratio` of it
  to the target; a draft step then costs at least that share of a plain round.
  Kept per process for the same shapes: working it out traces the models' cache
  shapes, about 20 ms of host time, which on a small model is a tenth of a call."""
  rates = rates or DeviceRates.measure()
  key = json.dumps([fingerprint(target), fingerprint(drafter), batch, cache_length,
                    list(choices), dataclasses.asdict(rates),
                    sorted((growth or {}).items()), draft_ratio,
                    dataclasses.asdict(choice)], sort_keys=True)
  if key not in _PRIORS:
    _PRIORS[key] = _prior_costs(target, drafter, batch, cache_length, choices, rates, growth,
                                draft_ratio, choice)
  return _PRIORS[key]


_PRIORS: dict[str, tuple[float, ...]] = {}


def _prior_costs(target, drafter, batch, cache_length, choices, rates, growth, draft_ratio,
                 choice):
  # A round with more drafts never costs less (`monotone`).
  step = call_time(target, batch, 1, cache_length, rates, growth)
  draft_step = step * draft_ratio if draft_ratio else 0.0
  V = target.vocab_size
  # A draft model draws its own drafts (greedy rows take its argmax); other drafters
  # choose nothing from a distribution.
  drafts_chosen = isinstance(drafter, ModelDrafter)
  return monotone(choices, [
      call_time(target, batch, k + 1, cache_length, rates, growth)
      + choice.seconds(batch * (k + 1), V, rates)
      + (drafter_time(drafter, batch, k, cache_length, rates, draft_step)
         + (k * choice.seconds(batch, V, rates) if drafts_chosen else 0.0) if k else 0.0)
      for k in choices])
