"""Measured per-call costs: a target call, a drafter's round, a verify's width; the inputs of
the speedup model (`jspec.bench.metrics.predicted`); and the machine's copy bandwidth, which
with a model's weight bytes gives the floor of a step (`memory_bandwidth`, `weight_bytes`).

    ideal speedup = tau * T_step / (T_verify + K * T_draft)

with T_step one target call on 1 token, T_verify one target call on K+1 tokens
and T_draft one drafter call, all at the same batch size, measured here
(`jspec.core.stats.ideal_speedup` does the arithmetic).
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from jspec.core import compilation
from jspec.core.decode import DecodeConfig
from jspec.core.drafter import BranchDrafter, DraftContext, target_for, uses_features
from jspec.core.drafter import prepared as prepared_drafter
from jspec.core.dynamic_tree import DynamicTree
from jspec.core.model import Model
from jspec.drafters.draft_model import DraftModel


@compilation.program(donate_argnums=(2,))  # compiled as the decoding programs are
def _call(model, tokens, cache, start):
  logits, _, cache = model.apply(tokens, cache, start)
  return logits, cache


def call_time(model: Model, batch: int, block: int, cache_length: int, repeats: int = 30,
              prefix: int = 64) -> float:
  """Median wall time (seconds) of one cached call on `block` tokens per row.

  The block starts at slot `prefix`, so attention sees a realistic committed
  prefix. The cache is donated and fed back, as inside the decode loop.
  """
  if prefix + block > cache_length:
    raise ValueError(f"prefix {prefix} + block {block} exceeds cache_length {cache_length}")
  model = model.prepared()  # the params' decoding form, as inside the decode loop
  cache = model.init_cache(batch, cache_length)
  tokens = jnp.ones((batch, block), jnp.int32)
  start = jnp.full((batch,), prefix, jnp.int32)
  logits, cache = _call(model, tokens, cache, start)  # compile
  logits.block_until_ready()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    logits, cache = _call(model, tokens, cache, start)
    logits.block_until_ready()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def round_time(drafter, batch: int, k: int, cache_length: int, prefix: int = 64,
               repeats: int = 20, target: Model | None = None, tree=None) -> float:
  """Median wall time of one `drafter.propose` of k drafts (with `tree`, a static
  `jspec.Tree`: one `propose_tree`; a `jspec.DynamicTree`: one `propose_dynamic`), jitted alone (greedy), on the
  drafter in decoding form (`decode.prepared`, inside the program, as the decode loop
  runs it: per-layer weights, a reduced vocabulary's rows gathered once).
  A drafter that reads the target's features needs `target` (for their width; the
  features themselves are zeros: the cost does not depend on them)."""
  if isinstance(drafter, Model):
    drafter = DraftModel(drafter)
  tokens = jnp.ones((batch, prefix + 1), jnp.int32)
  lengths = jnp.full((batch,), prefix + 1, jnp.int32)
  buffer = jnp.zeros((batch, cache_length), jnp.int32).at[:, :prefix + 1].set(tokens)
  if uses_features(drafter):
    if target is None:
      raise ValueError(f"{type(drafter).__name__} reads the target's features: pass target=")
    seen = target_for(target, drafter)
    width = jax.eval_shape(lambda: seen.apply(tokens[:, :1], seen.init_cache(batch, 8),
                                              jnp.zeros((batch,), jnp.int32)))[1].shape[-1]
    feats = jnp.zeros((batch, prefix, width), jnp.float32)
    state = jax.jit(lambda d, t, n, f: d.init(t, n, cache_length, f))(drafter, tokens, lengths,
                                                                       feats)
    context = DraftContext(tokens=buffer, lengths=lengths,
                           features=jnp.zeros((batch, k + 1, width), jnp.float32),
                           feature_start=lengths - 2 - k)
  else:
    state = jax.jit(lambda d, t, n: d.init(t, n, cache_length))(drafter, tokens, lengths)
    context = DraftContext(tokens=buffer, lengths=lengths)
  keys = jax.vmap(jax.random.key)(jnp.arange(batch, dtype=jnp.int32))
  # Prepared once outside the timed calls: the decode loop prepares once per program,
  # before its rounds.
  drafter = jax.jit(prepared_drafter)(drafter)
  if tree is None:
    propose = jax.jit(lambda d, s, c, kk: d.propose(s, c, k, None, kk)[0])
  elif isinstance(tree, DynamicTree):  # grown from the drafter's confidences (EAGLE-2)
    propose = jax.jit(lambda d, s, c, kk: d.propose_dynamic(s, c, tree, None, kk)[0])
  else:
    propose = jax.jit(lambda d, s, c, kk: d.propose_tree(s, c, tree, None, kk)[0])
  jax.block_until_ready(propose(drafter, state, context, keys))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(propose(drafter, state, context, keys))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def verify_width(drafter, k: int) -> int:
  """Tokens in one verify call at K = k: k + 1, or a branch drafter's tree and side branch."""
  if isinstance(drafter, BranchDrafter):
    return DecodeConfig(num_draft_tokens=drafter.verify_tree(k).max_depth, cache_length=0,
                        tree=drafter.verify_tree(k), side=drafter.side_tree()).block_width
  return k + 1


def memory_bandwidth(nbytes: int = 1 << 28, repeats: int = 5) -> float:
  """Bytes per second of a large array copy (bytes read plus bytes written), the fastest of
  `repeats`, on the device that holds the weights: host memory through NumPy on the CPU, a
  jitted copy in device memory on an accelerator. A step reads its weights once, so weight
  bytes over this rate is the floor a step's time approaches (a read-only stream can beat a
  copy's rate: the copy's writes also cost reads of the lines they fill)."""
  import numpy as np

  if jax.default_backend() == "cpu":
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    copy = lambda: np.copyto(dst, src)
  else:
    src = jnp.ones(nbytes // 4, jnp.float32)
    add = jax.jit(lambda x: x + 1)  # one read, one write; not elided like a plain copy
    copy = lambda: add(src).block_until_ready()
    copy()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    copy()
    times.append(time.perf_counter() - t0)
  return 2 * nbytes / min(times)


def weight_bytes(model: Model) -> int:
  """Bytes of a model's parameters as loaded."""
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(model.params)))


def steady(target, variants: dict, prompts, new_tokens: int = 256, repeats: int = 7,
           study: str = "steady", **options) -> list:
  """Records of each variant's steady state: {name: `methods.Built` (None: plain decoding)},
  each run on `prompts` (one call, greedy, every row to the end, EOS ignored) for
  `new_tokens` and for a quarter of that on the same cache, all interleaved
  (`runner.interleave`) after an untimed run of each; axes length ("long" / "short"),
  new_tokens, k, batch. The long run's extra over the short one
  (`metrics.steady_seconds(short, long, per="tokens" | "rounds")`) leaves out the call's
  fixed part (prefill, host work, transfers), which a long run only dilutes. options: the
  calls' keyword arguments (`cache_length`, as `runner.jspec_call` takes them)."""
  from jspec.bench import records, runner

  short = max(new_tokens // 4, 1)
  if new_tokens <= short:
    raise ValueError(f"steady needs new_tokens >= 2, got {new_tokens}")
  fns = {name: runner.jspec_call(target, built, prompts, new_tokens, 0.0, 0, False, **options)
         for name, built in variants.items()}
  calls = {f"{name}/{length}": (lambda fn, n: lambda: fn(n))(fn, n)
           for name, fn in fns.items() for length, n in (("long", new_tokens), ("short", short))}
  for fn in calls.values():
    jax.block_until_ready(fn().tokens)
  outs, times = runner.interleave(calls, repeats)
  out = []
  for key, o in outs.items():
    name, length = key.split("/")
    built = variants[name]
    out.append(records.from_output(
        o, per_row=len(prompts) > 1, study=study, method=name, workload="steady",
        prompt=",".join(map(str, range(len(prompts)))), seconds=tuple(times[key]),
        axes={"length": length, "new_tokens": new_tokens if length == "long" else short,
              "k": 0 if built is None else built.k, "batch": len(prompts)}))
  return out
