"""Convenience layer: `generate` and `speculative_generate`.

Both validate their inputs on the host (clear errors before any tracing), pad
prompts and the cache to buckets, and run one jitted program: prefill, then a
`lax.while_loop` of decode rounds. Buckets keep the compiled program stable: a
new prompt, prompt length or `max_new_tokens` that fits the same buckets reuses
it (sampling settings, seeds, EOS ids and lengths are all traced). One thing is
static: a batch whose every row is greedy runs the argmax-only program
(`params=None` in `jspec.core.decode`); any other batch runs the per-row one.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import decode, dynamic, schedule, sharding, streaming
from jspec.drafters.draft_model import DraftModel
from jspec.core.drafter import Drafter, TreeDrafter
from jspec.core.model import Model
from jspec.core.sampling import SamplingParams
from jspec.core.tree import Tree

PROMPT_BUCKET_MIN = 16
CACHE_BUCKET = 128
EOS_BUCKET = 4


@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """What `generate` and `speculative_generate` return: new tokens, lengths, statistics."""

  tokens: jax.Array  # [B, max_new_tokens] int32; -1 after each row's end
  lengths: jax.Array  # [B] int32 new tokens per row, EOS included when emitted
  stats: decode.DecodeStats
  # num_draft_tokens="auto": rounds run at each K, {K: rounds}; None for a fixed K.
  rounds_by_k: dict | None = None


def generate(model: Model, prompts, *, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0,
             eos_id=None, seed=0, prompt_lengths=None, cache_length=None, mesh=None,
             rules=None, stream=None) -> GenerateOutput:
  """Plain autoregressive decoding (the K = 0 loop): one target call per token.

  Args:
    model: the `jspec.Model` to sample from.
    prompts: list of token-id lists (lengths may differ), or int32 `[B, P]`
      right-padded with `prompt_lengths=[B]`.
    max_new_tokens: int, or one int per row.
    temperature, top_k, top_p: scalars or one value per row; temperature 0 is greedy.
    eos_id: an id or a list of ids; a row stops after emitting any of them. None
      (the default) uses the model's own `eos_ids` (from its checkpoint; none for
      a random-init model); `()` disables stopping on EOS.
    seed: int, or one int per row. With one int, row b uses the stream
      (seed, b); with per-row seeds a row's output depends on its own seed only.
    cache_length: optional explicit cache slots per row (default: a bucket that fits).
    mesh: optional `jax.sharding.Mesh` (axes `data`, `model`) or `jspec.core.sharding.Layout`:
      params are placed by `rules` (default `jspec.core.sharding.HYBRID`), prompts and the
      KV cache split over the batch. Results equal the one-device results.
    stream: optional callable; after every round it gets, on the host, a list with
      each row's newly committed token ids (`jspec.core.streaming`). The output is the
      same with or without it.
  """
  return _run(model, None, prompts, 0, max_new_tokens, temperature, top_k, top_p, eos_id, seed,
              prompt_lengths, cache_length, mesh, rules, stream=stream)


def speculative_generate(target: Model, draft, prompts, *, num_draft_tokens=None, max_new_tokens,
                         temperature=0.0, top_k=0, top_p=1.0, eos_id=None, seed=0,
                         prompt_lengths=None, cache_length=None, mesh=None,
                         rules=None, tree: Tree | None = None, stream=None) -> GenerateOutput:
  """Speculative decoding: `draft` proposes K tokens, `target` verifies them in one call.

  The output follows the target's processed distribution exactly; greedy rows
  equal `generate(target, ...)`. `draft` is a `jspec.Model` (drafted at each
  row's own sampling settings) or any object following `jspec.core.drafter.Drafter`.
  Other arguments as in `generate`; with `mesh=`, a draft model is replicated
  unless its params are already placed on that mesh (shard it yourself with
  `jspec.core.sharding.shard_model(draft, layout)` to split it by the same rules).

  num_draft_tokens: K >= 1, or "auto" (or a `jspec.AutoK`) to choose K per round
  inside the loop from the running acceptance and round costs at this batch size:
  a profile saved by `jspec profile` when there is one for these models and shapes,
  else a prior from the models' bytes and FLOPs and the device's rates (measured once
  per machine and saved; `jspec.core.cost_model`). The call itself times nothing; the
  choice is `jspec.core.schedule`, the loop `jspec.core.dynamic`. When no K can beat plain decoding
  at this batch size, even at `AutoK.ceiling` acceptance, the call runs plain
  decoding. `rounds_by_k` in the output says which K ran how often. Default: 4.

  tree: a `jspec.Tree` to verify a static draft tree of N nodes per round instead
  of a chain (the drafter needs `propose_tree`: Medusa, EAGLE, a draft model).
  `num_draft_tokens` may then be omitted; if given it must equal the tree's depth.
  The cache needs N slots of slack instead of K + 1. Tree decoding moves accepted
  K/V along the cache's slot axis, so the target must declare its cache axes
  (`Model.axes_fn`; every model in `jspec.models` does).
  """
  K = num_draft_tokens
  if tree is not None:
    if not isinstance(tree, Tree):
      raise TypeError(f"tree must be a jspec.Tree, got {type(tree).__name__}")
    if K is not None and (isinstance(K, (str, schedule.AutoK)) or K != tree.max_depth):
      raise ValueError(f"num_draft_tokens={K!r} conflicts with the tree, whose depth is "
                       f"{tree.max_depth}: omit it when passing a tree")
    K = tree.max_depth
  elif K is None:
    K = 4
  if isinstance(K, str) and K == "auto":
    K = schedule.AutoK()
  if not isinstance(K, schedule.AutoK):
    if isinstance(K, bool) or not isinstance(K, numbers.Integral) or K < 1:
      raise ValueError(f"num_draft_tokens must be an integer >= 1, \"auto\" or a jspec.AutoK, "
                       f"got {K!r}")
    K = int(K)
  drafter = DraftModel(draft) if isinstance(draft, Model) else draft
  if drafter is None or not isinstance(drafter, Drafter):
    raise TypeError(f"draft must be a jspec.Model or a Drafter, got {type(draft).__name__}")
  if drafter.vocab_size != target.vocab_size:
    raise ValueError(f"draft vocab size {drafter.vocab_size} != target vocab size "
                     f"{target.vocab_size}: drafts must be scored in the target's vocabulary")
  if tree is not None:
    if not isinstance(drafter, TreeDrafter):
      raise TypeError(f"{type(drafter).__name__} cannot draft trees (it has no propose_tree); "
                      f"use a chain (num_draft_tokens) or a tree drafter")
    if sharding.model_axes(target) is None:
      raise ValueError("tree decoding needs the target's cache axes (Model.axes_fn) to find "
                       "the slot axis of its K/V buffers")
  return _run(target, drafter, prompts, K, max_new_tokens, temperature, top_k, top_p, eos_id,
              seed, prompt_lengths, cache_length, mesh, rules, tree, stream=stream)


# ----------------------------------------------------------------------------- host side


def _run(target, drafter, prompts, K, max_new_tokens, temperature, top_k, top_p, eos_id, seed,
         prompt_lengths, cache_length, mesh, rules, tree=None, stream=None) -> GenerateOutput:
  if stream is not None and stream is not True:
    if not callable(stream):
      raise TypeError(f"stream must be a callable, got {type(stream).__name__}")
    with streaming.listening(stream):
      return _run(target, drafter, prompts, K, max_new_tokens, temperature, top_k, top_p,
                  eos_id, seed, prompt_lengths, cache_length, mesh, rules, tree, stream=True)
  auto = K if isinstance(K, schedule.AutoK) else None
  if auto is not None:
    K = auto.max_k
  if not isinstance(target, Model):
    raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
  layout = sharding.as_layout(mesh, rules)
  tokens, lengths = _prompts_to_array(prompts, prompt_lengths, target.vocab_size)
  B = tokens.shape[0]
  max_new = _per_row_int(max_new_tokens, B, "max_new_tokens", minimum=1)
  # Host-side NumPy until placement: checked here, moved to the device once below.
  temps = _per_row_float(temperature, B, "temperature")
  top_ks = _per_row_int(top_k, B, "top_k", minimum=0)
  top_ps = _per_row_float(top_p, B, "top_p")
  if np.any(temps < 0):
    raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature!r}")
  if np.any(~((top_ps > 0) & (top_ps <= 1))):
    raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
  eos = _eos_array(target.eos_ids if eos_id is None else eos_id, target.vocab_size)
  seeds = _seeds(seed, B)

  block = K + 1 if tree is None else tree.num_nodes  # slots one verify block needs
  needed = int(lengths.max()) + int(max_new.max()) + block
  if target.max_length is not None and int(lengths.max()) + int(max_new.max()) > target.max_length:
    raise ValueError(
        f"longest prompt ({int(lengths.max())}) + max_new_tokens ({int(max_new.max())}) exceeds "
        f"the model's max_position_embeddings ({target.max_length})")
  if cache_length is None:
    S = cache_bucket(needed)
  else:
    S = int(cache_length)
    if S < needed:
      raise ValueError(
          f"cache_length {S} is too small: the longest prompt ({int(lengths.max())}) + "
          f"max_new_tokens ({int(max_new.max())}) + a verify block of {block} = {needed} slots "
          f"are needed")
  # The prompt bucket never outgrows the cache; what is cut here is padding only.
  tokens = tokens[:, :S]
  # All rows greedy (known here, on the host): the static argmax-only program.
  greedy = bool(np.all(temps == 0))
  rows = [tokens, lengths, max_new, seeds] + ([] if greedy else [temps, top_ks, top_ps])
  if layout is None:
    rows = [jnp.asarray(x) for x in rows]
    eos_ids = jnp.asarray(eos)
  else:
    target = _placed(target, layout, replicate=False)
    if isinstance(drafter, DraftModel):
      drafter = dataclasses.replace(drafter, model=_placed(drafter.model, layout, replicate=True))
    rows = [sharding.put(x, layout.batch(x.shape)) for x in rows]
    eos_ids = sharding.put(eos, layout.sharding(eos.shape, (None,)))
  # The decoding form of the weights, built once per model rather than once per call.
  target = target.decoding_form()
  if isinstance(drafter, DraftModel):
    drafter = dataclasses.replace(drafter, model=drafter.model.decoding_form())
  costs = None
  if auto is not None:
    # Top-k / top-p make every position of a round sort its logits (costs differ).
    filtered = bool(np.any((top_ks > 0) | (top_ps < 1.0)))
    costs = auto.costs or _auto_costs(target, drafter, B, S, auto, greedy, filtered)
    choices, costs = schedule.select(auto, costs)
    if max(choices) == 0:
      drafter, auto, K = None, None, 0  # speculation cannot win here: plain decoding
    else:
      auto = dataclasses.replace(auto, choices=choices, costs=None)  # costs go in traced
      K = max(choices)
  config = decode.DecodeConfig(num_draft_tokens=K, cache_length=S, layout=layout, tree=tree,
                               stream=stream is True)
  tokens_, lengths_, max_new_, seeds_ = rows[:4]
  params = None
  if not greedy:
    temp_, top_k_, top_p_ = rows[4:]
    params = SamplingParams(temperature=temp_, top_k=top_k_, top_p=top_p_)
  if auto is None:
    out, new_lengths, stats = _program(target, drafter, tokens_, lengths_, max_new_, params,
                                       eos_ids, seeds_, config)
    rounds = None
  else:
    out, new_lengths, stats, rounds = _auto_program(
        target, drafter, tokens_, lengths_, max_new_, params, eos_ids, seeds_,
        jnp.asarray(costs, jnp.float32), config, auto)
  width = int(max_new.max())
  if layout is not None and not out.is_fully_addressable:  # multi-host: every process gets all
    out, new_lengths, stats, rounds = jax.tree_util.tree_map(
        lambda x: jnp.asarray(sharding.fetch(x)), (out, new_lengths, stats, rounds))
  rounds_by_k = None
  if rounds is not None:
    rounds_by_k = {k: int(r) for k, r in zip(auto.choices, np.asarray(rounds))}
  elif costs is not None:  # "auto" chose plain decoding for the whole call
    rounds_by_k = {0: int(np.max(np.asarray(stats.target_calls)))}
  return GenerateOutput(tokens=out[:, :width], lengths=new_lengths, stats=stats,
                        rounds_by_k=rounds_by_k)


def _auto_costs(target, drafter, B: int, S: int, auto, greedy: bool, filtered: bool):
  """Round costs for "auto" without timing anything: a profile saved for these models
  and shapes (`jspec profile`), else the prior from bytes, FLOPs and the device's rates."""
  from jspec.core import cost_model

  saved = cost_model.saved_round_costs(target, drafter, B, S, auto.choices, greedy=greedy,
                                    filtered=filtered, cache_dir=auto.cache_dir)
  if saved is not None:
    return saved
  return cost_model.prior_costs(target, drafter, B, S, auto.choices,
                                cost_model.device_rates(auto.cache_dir))


def _placed(model: Model, layout, replicate: bool) -> Model:
  """The model on the layout's mesh: kept as is when already placed there."""
  leaves = jax.tree_util.tree_leaves(model.params)
  on_mesh = all(isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
                and x.sharding.mesh.devices.tolist() == layout.mesh.devices.tolist()
                for x in leaves)
  return model if on_mesh else sharding.shard_model(model, layout, replicate=replicate)


@functools.partial(jax.jit, static_argnames=("config",))
def _program(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids, seeds, config):
  state = decode.init_state(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids,
                            seeds, config)
  state = decode.decode_loop(target, drafter, state, config)
  out, new_lengths = decode.output_tokens(state)
  return out, new_lengths, state.stats


@functools.partial(jax.jit, static_argnames=("config", "auto"))
def _auto_program(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids, seeds, costs,
                  config, auto):
  state = dynamic.init_state(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids,
                             seeds, costs, config, auto)
  state = dynamic.decode_loop(target, drafter, state, config, auto)
  out, new_lengths = decode.output_tokens(state.decode)
  return out, new_lengths, state.decode.stats, state.schedule.rounds


def _prompts_to_array(prompts, prompt_lengths, vocab_size):
  if prompt_lengths is None:
    if isinstance(prompts, (np.ndarray, jax.Array)):
      arr = np.asarray(prompts)
      if arr.ndim != 2:
        raise ValueError(f"a prompt array must be [B, P], got shape {arr.shape}")
      rows = [list(r) for r in arr]
    elif isinstance(prompts, Sequence) and not isinstance(prompts, (str, bytes)):
      rows = [list(np.asarray(r).reshape(-1)) if not isinstance(r, (str, bytes)) else None
              for r in prompts]
      if any(r is None for r in rows):
        raise TypeError("prompts must hold token ids, not strings")
    else:
      raise TypeError(f"prompts must be a list of token-id lists or an int array, "
                      f"got {type(prompts).__name__}")
    if not rows:
      raise ValueError("prompts is empty: give at least one prompt")
    lengths = np.array([len(r) for r in rows], np.int32)
    if np.any(lengths == 0):
      raise ValueError(f"empty prompt in row(s) {np.flatnonzero(lengths == 0).tolist()}: every "
                       f"prompt needs at least one token (e.g. a BOS id)")
    P = _prompt_bucket(int(lengths.max()))
    tokens = np.zeros((len(rows), P), np.int64)
    for b, r in enumerate(rows):
      tokens[b, :len(r)] = r
  else:
    tokens = np.asarray(prompts)
    lengths = np.asarray(prompt_lengths).astype(np.int64).reshape(-1)
    if tokens.ndim != 2 or lengths.shape[0] != tokens.shape[0]:
      raise ValueError(f"prompts must be [B, P] with prompt_lengths [B]; got {tokens.shape} "
                       f"and {lengths.shape}")
    if np.any(lengths < 1) or np.any(lengths > tokens.shape[1]):
      raise ValueError(f"prompt_lengths must lie in [1, {tokens.shape[1]}] (empty prompts are "
                       f"not allowed), got {lengths.tolist()}")
    P = _prompt_bucket(tokens.shape[1])
    tokens = np.pad(tokens, ((0, 0), (0, P - tokens.shape[1])))
    # Padding beyond each row's length is never attended to; zero it so ids check cleanly.
    tokens = np.where(np.arange(P)[None, :] < lengths[:, None], tokens, 0)
  if not np.issubdtype(tokens.dtype, np.integer):
    raise TypeError(f"token ids must be integers, got dtype {tokens.dtype}")
  if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
    raise ValueError(f"token ids must lie in [0, {vocab_size}); got min {tokens.min()}, "
                     f"max {tokens.max()}")
  return tokens.astype(np.int32), lengths.astype(np.int32)


def _per_row(value, B, name, dtype):
  arr = np.asarray(value)
  if arr.ndim == 0:
    arr = np.full((B,), arr)
  if arr.shape != (B,):
    raise ValueError(f"{name} must be a scalar or one value per row ({B}), got shape {arr.shape}")
  return arr


def _per_row_float(value, B, name):
  arr = _per_row(value, B, name, np.float32)
  if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
    raise TypeError(f"{name} must be numeric, got {value!r}")
  arr = arr.astype(np.float32)
  if not np.all(np.isfinite(arr)):
    raise ValueError(f"{name} must be finite, got {value!r}")
  return arr


def _per_row_int(value, B, name, minimum):
  arr = _per_row(value, B, name, np.int32)
  if not np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
    raise TypeError(f"{name} must be an integer (or one per row), got {value!r}")
  if np.any(arr < minimum):
    raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
  return arr.astype(np.int32)


def _eos_array(eos_id, vocab_size):
  ids = [] if eos_id is None else np.asarray(eos_id).reshape(-1).tolist()
  for i in ids:
    if not isinstance(i, numbers.Integral) or not 0 <= i < vocab_size:
      raise ValueError(f"eos_id must be ids in [0, {vocab_size}), got {eos_id!r}")
  width = _round_up(max(len(ids), 1), EOS_BUCKET)
  return np.array(ids + [-1] * (width - len(ids)), np.int32)


def _seeds(seed, B):
  arr = np.asarray(seed)
  if not np.issubdtype(arr.dtype, np.integer):
    raise TypeError(f"seed must be an int or one int per row, got {seed!r}")
  if arr.ndim == 0:
    # One stream per row index: (seed, b) hashed into a 31-bit seed.
    return np.array([_mix(int(arr), b) for b in range(B)], np.int32)
  if arr.shape != (B,):
    raise ValueError(f"seed must be an int or one per row ({B}), got shape {arr.shape}")
  return (arr.astype(np.int64) & 0x7FFFFFFF).astype(np.int32)


def _mix(seed: int, row: int) -> int:
  x = (seed * 0x9E3779B1 + row * 0x85EBCA77 + 0x632BE5AB) & 0xFFFFFFFF
  x ^= x >> 15
  x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
  x ^= x >> 12
  return x & 0x7FFFFFFF


def _prompt_bucket(P: int) -> int:
  return max(PROMPT_BUCKET_MIN, 1 << (P - 1).bit_length())


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def cache_bucket(slots: int) -> int:
  """The cache length `generate` picks when `slots` are needed (a multiple of
  CACHE_BUCKET): calls in the same bucket share a compiled program."""
  return _round_up(slots, CACHE_BUCKET)
