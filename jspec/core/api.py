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
import numbers
import os

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import (compilation, constrained, cost_model, decode, dynamic, logprobs, schedule,
                        sharding, streaming)
from jspec.core.inputs import (cache_bucket, eos_array, per_row_float, per_row_int,
                               prompts_to_array, row_seeds)
from jspec.drafters.draft_model import SYNC_CHUNK, DraftModel
from jspec.core.drafter import BranchDrafter, Drafter, DynamicTreeDrafter, TreeDrafter
from jspec.core.model import Model
from jspec.core.sampling import SamplingParams
from jspec.core.dynamic_tree import DynamicTree
from jspec.core.tree import Tree

@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """What `generate` and `speculative_generate` return: new tokens, lengths, statistics."""

  tokens: jax.Array  # [B, max_new_tokens] int32; -1 after each row's end
  lengths: jax.Array  # [B] int32 new tokens per row, EOS included when emitted
  stats: decode.DecodeStats
  # num_draft_tokens="auto": rounds run at each K, {K: rounds}; None for a fixed K.
  rounds_by_k: dict | None = None
  # return_logprobs (`jspec.core.logprobs`): log p of each new token, 0 after a row's end,
  # so a row's sum is the log-probability of its sequence. None when not asked for.
  logprobs: jax.Array | None = None  # [B, max_new_tokens] f32
  top_ids: jax.Array | None = None  # [B, max_new_tokens, n] int32 (Logprobs(top=n)); -1 after the end
  top_logprobs: jax.Array | None = None  # [B, max_new_tokens, n] f32


def generate(model: Model, prompts, *, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0,
             eos_id=None, seed=0, prompt_lengths=None, cache_length=None, mesh=None,
             rules=None, stream=None, return_logprobs=False, constraint=None) -> GenerateOutput:
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
    return_logprobs: True (or a `jspec.Logprobs`) fills `out.logprobs` with the
      log-probability of each new token under the distribution it was drawn from
      (after the constraint's mask, temperature, top-k and top-p: 0 for greedy rows);
      `Logprobs(raw=True)` reads the model's own log_softmax instead, before all of
      those (the constraint's mask too), `Logprobs(top=n)` adds the n most
      likely ids per position (`jspec.core.logprobs`). Speculative decoding records
      the same numbers as plain decoding for the same tokens.
    constraint: a `jspec.Constraint` (from a regex or a JSON schema and the tokenizer)
      for every row, or one per row (None: that row free). New tokens then follow the
      model's distribution restricted to the constraint's language (masked before
      temperature, top-k and top-p; `jspec.core.constrained`). A row cut by
      max_new_tokens before its match is complete ends mid-match; give the
      constraint's EOS ids as stop ids (the default when both come from the model's
      tokenizer) so that rows end when the match does.
  """
  return _run(model, None, prompts, 0, max_new_tokens, temperature, top_k, top_p, eos_id, seed,
              prompt_lengths, cache_length, mesh, rules, stream=stream,
              logprob_spec=logprobs.as_spec(return_logprobs), constraint=constraint)


def speculative_generate(target: Model, draft, prompts, *, num_draft_tokens=None, max_new_tokens,
                         temperature=0.0, top_k=0, top_p=1.0, eos_id=None, seed=0,
                         prompt_lengths=None, cache_length=None, mesh=None,
                         rules=None, tree: Tree | DynamicTree | None = None, stream=None,
                         return_logprobs=False, constraint=None) -> GenerateOutput:
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
  per machine and saved; `jspec.core.cost_model`), shaped by how the target's call
  grows with the block (timed in loop once per machine, model and shape and saved;
  `jspec.core.call_times`). The call never times a round; the
  choice is `jspec.core.schedule`, the loop `jspec.core.dynamic`. When no K can beat plain decoding
  at this batch size, even at `AutoK.ceiling` acceptance, the call runs plain
  decoding. `rounds_by_k` in the output says which K ran how often. Default: 4.

  `jspec.Lookahead` (Jacobi lookahead) needs no draft model: it builds its own verify
  tree of candidate n-grams of at most K tokens and a lookahead branch from K.

  tree: a `jspec.Tree` to verify a static draft tree of N nodes per round instead
  of a chain (the drafter needs `propose_tree`: Medusa, EAGLE, a draft model, and the
  lookup drafters NGram, Datastore and Suffix).
  Or a `jspec.DynamicTree(nodes=N, depth=D, top_k=k)`: a node budget the drafter fills
  per row and round from its own confidences (EAGLE-2; the drafter needs
  `propose_dynamic`: EAGLE), verified with a per-row mask (`block_mask` [B, N, N],
  which the target must accept: every model in `jspec.models` does).
  `num_draft_tokens` may then be omitted; if given it must equal the tree's depth.
  The cache needs N slots of slack instead of K + 1. Tree decoding moves accepted
  K/V along the cache's slot axis, so the target must declare its cache axes
  (`Model.axes_fn`; every model in `jspec.models` does).
  """
  K = num_draft_tokens
  if tree is not None:
    if not isinstance(tree, (Tree, DynamicTree)):
      raise TypeError(f"tree must be a jspec.Tree or a jspec.DynamicTree, got "
                      f"{type(tree).__name__}")
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
  side = None
  if isinstance(drafter, BranchDrafter):  # lookahead: the drafter shapes the whole block
    if tree is not None:
      raise ValueError(f"{type(drafter).__name__} verifies its own tree; give num_draft_tokens "
                       f"and not tree=")
    if isinstance(K, schedule.AutoK):
      raise ValueError(f"num_draft_tokens=\"auto\" does not serve {type(drafter).__name__}: "
                       f"give an integer K")
    tree, side = drafter.verify_tree(K), drafter.side_tree()
    K = tree.max_depth
  if isinstance(tree, DynamicTree) and not isinstance(drafter, DynamicTreeDrafter):
    raise TypeError(f"{type(drafter).__name__} cannot grow dynamic trees (it has no "
                    f"propose_dynamic); use a static jspec.Tree or an EAGLE head")
  if isinstance(tree, Tree):
    if not isinstance(drafter, TreeDrafter):
      raise TypeError(f"{type(drafter).__name__} cannot draft trees (it has no propose_tree); "
                      f"use a chain (num_draft_tokens) or a tree drafter")
  if tree is not None:
    if sharding.model_axes(target) is None:
      raise ValueError("tree decoding needs the target's cache axes (Model.axes_fn) to find "
                       "the slot axis of its K/V buffers")
  return _run(target, drafter, prompts, K, max_new_tokens, temperature, top_k, top_p, eos_id,
              seed, prompt_lengths, cache_length, mesh, rules, tree, stream=stream,
              logprob_spec=logprobs.as_spec(return_logprobs), constraint=constraint, side=side)


# ----------------------------------------------------------------------------- host side


def _run(target, drafter, prompts, K, max_new_tokens, temperature, top_k, top_p, eos_id, seed,
         prompt_lengths, cache_length, mesh, rules, tree=None, stream=None,
         logprob_spec=None, constraint=None, side=None) -> GenerateOutput:
  if stream is not None and stream is not True:
    if not callable(stream):
      raise TypeError(f"stream must be a callable, got {type(stream).__name__}")
    with streaming.listening(stream):
      return _run(target, drafter, prompts, K, max_new_tokens, temperature, top_k, top_p,
                  eos_id, seed, prompt_lengths, cache_length, mesh, rules, tree, stream=True,
                  logprob_spec=logprob_spec, constraint=constraint, side=side)
  auto = K if isinstance(K, schedule.AutoK) else None
  if auto is not None:
    K = auto.max_k
  if not isinstance(target, Model):
    raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
  layout = sharding.as_layout(mesh, rules)
  tokens, lengths = prompts_to_array(prompts, prompt_lengths, target.vocab_size)
  B = tokens.shape[0]
  max_new = per_row_int(max_new_tokens, B, "max_new_tokens", minimum=1)
  # Host-side NumPy until placement: checked here, moved to the device once below.
  temps = per_row_float(temperature, B, "temperature")
  top_ks = per_row_int(top_k, B, "top_k", minimum=0)
  top_ps = per_row_float(top_p, B, "top_p")
  if np.any(temps < 0):
    raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature!r}")
  if np.any(~((top_ps > 0) & (top_ps <= 1))):
    raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")
  eos = eos_array(target.eos_ids if eos_id is None else eos_id, target.vocab_size)
  seeds = row_seeds(seed, B)

  block = decode.DecodeConfig(num_draft_tokens=K, cache_length=0, tree=tree,
                              side=side).block_width  # slots one verify block needs
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
  rows_constraint = None
  if constraint is not None:  # checked and stacked on the host, placed like the rows
    table, initial = constrained.for_batch(constraint, B, target.vocab_size)
    if layout is None:
      initial = jnp.asarray(initial)
    else:
      table = jax.tree_util.tree_map(
          lambda x: sharding.put(x, layout.sharding(x.shape, (None,) * x.ndim)), table)
      initial = sharding.put(initial, layout.batch(initial.shape))
    rows_constraint = constrained.ConstraintRows(table=table, state=initial)
  # The decoding form of the weights, built once per model rather than once per call.
  target = target.decoding_form()
  if isinstance(drafter, DraftModel):  # one wrapper per drafter: costs are keyed on it
    drafter = cost_model.per_object(
        _DECODING_DRAFTERS, drafter, lambda d: dataclasses.replace(d, model=d.model.decoding_form()))
  costs = None
  if auto is not None:
    # Top-k / top-p make every position of a round sort its logits (costs differ).
    filtered = bool(np.any((top_ks > 0) | (top_ps < 1.0)))
    costs, catch_up = (auto.costs, 0.0) if auto.costs else _auto_costs(
        target, drafter, B, S, auto, greedy, filtered)
    choices, costs = schedule.select(auto, costs)
    if max(choices) == 0:
      drafter, auto, K = None, None, 0  # speculation cannot win here: plain decoding
    else:
      auto = dataclasses.replace(auto, choices=choices, costs=None)  # costs go in traced
      K = max(choices)
  config = decode.DecodeConfig(num_draft_tokens=K, cache_length=S, layout=layout, tree=tree,
                               stream=stream is True, logprobs=logprob_spec, side=side)
  tokens_, lengths_, max_new_, seeds_ = rows[:4]
  params = None
  if not greedy:
    temp_, top_k_, top_p_ = rows[4:]
    params = SamplingParams(temperature=temp_, top_k=top_k_, top_p=top_p_)
  if auto is None:
    out, new_lengths, stats, records = _program(target, drafter, tokens_, lengths_, max_new_,
                                                params, eos_ids, seeds_, rows_constraint, config)
    rounds = None
  else:
    out, new_lengths, stats, records, rounds = _auto_program(
        target, drafter, tokens_, lengths_, max_new_, params, eos_ids, seeds_, rows_constraint,
        jnp.asarray(costs, jnp.float32), jnp.asarray(catch_up, jnp.float32), config, auto)
  width = int(max_new.max())
  if layout is not None and not out.is_fully_addressable:  # multi-host: every process gets all
    out, new_lengths, stats, records, rounds = jax.tree_util.tree_map(
        lambda x: jnp.asarray(sharding.fetch(x)), (out, new_lengths, stats, records, rounds))
  rounds_by_k = None
  if rounds is not None:
    rounds_by_k = {k: int(r) for k, r in zip(auto.choices, np.asarray(rounds))}
  elif costs is not None:  # "auto" chose plain decoding for the whole call
    rounds_by_k = {0: int(np.max(np.asarray(stats.target_calls)))}
  extra = {}
  if records is not None:
    extra = dict(logprobs=records.chosen[:, :width],
                 top_ids=None if records.top_ids is None else records.top_ids[:, :width],
                 top_logprobs=None if records.top_values is None else records.top_values[:, :width])
  return GenerateOutput(tokens=out[:, :width], lengths=new_lengths, stats=stats,
                        rounds_by_k=rounds_by_k, **extra)


def _auto_costs(target, drafter, B: int, S: int, auto, greedy: bool, filtered: bool):
  """Round costs for "auto": a profile saved for these models and shapes (`jspec
  profile`), else the prior from bytes, FLOPs and the device's rates, shaped by how the
  target's call grows with the block and, for a draft model, what its step costs beside
  the target's (`jspec.core.call_times`: timed once per machine, model and shape, then
  read from the cache folder).

  Returns (costs, catch_up): catch_up is what one catch-up call of a draft model costs
  in the same unit (a draft call on `SYNC_CHUNK` tokens over the target's one-token
  call, timed alike, times a plain round; `dynamic.init_state`), 0 for other drafters."""
  from jspec.core import call_times

  # Worked out once per process for the same models, shapes and saved files: the
  # lookups below cost about a millisecond, 2% of a 64-token call of a small model.
  files = [cost_model.cache_path(auto.cache_dir, name)
           for name in ("costs.json", "calls.json", "device.json")]
  key = (B, S, auto.choices, greedy, filtered, tuple(files), tuple(_stamp(f) for f in files))
  memo = cost_model.per_object(cost_model.per_object(_AUTO_COSTS, target, lambda _: {}),
                               drafter, lambda _: {})
  if key in memo:
    return memo[key]
  saved = cost_model.saved_round_costs(target, drafter, B, S, auto.choices, greedy=greedy,
                                       filtered=filtered, cache_dir=auto.cache_dir)
  if saved is None:
    growth = call_times.growth(target, B, [k + 1 for k in auto.choices], S, auto.cache_dir)
    ratio = None
    if isinstance(drafter, DraftModel):
      ratio = call_times.step_ratio(drafter.model, target, B, S, auto.cache_dir)
    saved = cost_model.prior_costs(target, drafter, B, S, auto.choices,
                                   cost_model.device_rates(auto.cache_dir), growth, ratio)
  catch_up = 0.0
  if isinstance(drafter, DraftModel) and 0 in auto.choices:
    chunk = min(SYNC_CHUNK, S)
    catch_up = saved[auto.choices.index(0)] * call_times.step_ratio(
        drafter.model, target, B, S, auto.cache_dir, block=chunk)
  saved = (saved, catch_up)
  # Keyed on the files as they are now that any measurement above has been written.
  key = key[:-1] + (tuple(_stamp(f) for f in files),)
  memo[key] = saved
  return saved


def _stamp(path: str):
  try:
    st = os.stat(path)
  except OSError:
    return None
  return st.st_mtime_ns, st.st_size


_AUTO_COSTS: dict = {}
_DECODING_DRAFTERS: dict = {}


def _placed(model: Model, layout, replicate: bool) -> Model:
  """The model on the layout's mesh: kept as is when already placed there."""
  leaves = jax.tree_util.tree_leaves(model.params)
  on_mesh = all(isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)
                and x.sharding.mesh.devices.tolist() == layout.mesh.devices.tolist()
                for x in leaves)
  return model if on_mesh else sharding.shard_model(model, layout, replicate=replicate)


@compilation.program(static_argnames=("config",))
def _program(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids, seeds, constraint,
             config):
  state = decode.init_state(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids,
                            seeds, config, constraint)
  state = decode.decode_loop(target, drafter, state, config)
  out, new_lengths = decode.output_tokens(state)
  return out, new_lengths, state.stats, _records(state)


def _records(state: decode.DecodeState):
  if state.logprobs is None:
    return None
  return logprobs.output(state.logprobs, state.prompt_lengths, state.lengths)


@compilation.program(static_argnames=("config", "auto"))
def _auto_program(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids, seeds,
                  constraint, costs, catch_up, config, auto):
  state = dynamic.init_state(target, drafter, tokens, prompt_lengths, max_new, params, eos_ids,
                             seeds, costs, config, auto, constraint, catch_up)
  state = dynamic.decode_loop(target, drafter, state, config, auto)
  out, new_lengths = decode.output_tokens(state.decode)
  return out, new_lengths, state.decode.stats, _records(state.decode), state.schedule.rounds
