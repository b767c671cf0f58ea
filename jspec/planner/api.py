"""`generate` and `speculative_generate`: one decoding call, planned on the host.

A call goes through four small steps, each its own module:

    inputs      the prompts and per-row settings checked and bucketed (`Request`)
    plan        the drafter, K, tree and, for "auto", the round costs (`Speculation`)
    placement   models and rows on one device or a mesh (`Rows`)
    outputs     the program's arrays cut to what was asked (`GenerateOutput`)

and then one compiled program of `jspec.core.programs`: prefill, then a
`lax.while_loop` of decode rounds. Buckets keep the compiled program stable: a new
prompt, prompt length or `max_new_tokens` that fits the same buckets reuses it
(sampling settings, seeds, EOS ids and lengths are all traced). One thing is static:
a batch whose every row is greedy runs the argmax-only program (`params=None` in
`jspec.core.decode`); any other batch runs the per-row one.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax.numpy as jnp
import numpy as np

from jspec.core import decode, logprobs, programs, schedule, sharding
from jspec.core.drafter import remembered
from jspec.core.model import Model
from jspec.core.dynamic_tree import DynamicTree
from jspec.core.tree import Tree
from jspec.planner import inputs, outputs, placement, plan, streams, workspace
from jspec.planner.outputs import GenerateOutput

__all__ = ["GenerateOutput", "generate", "speculative_generate"]


def generate(model: Model, prompts, *, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0,
             min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
             logit_bias=None, eos_id=None, seed=0, prompt_lengths=None, cache_length=None,
             mesh=None, rules=None, stream=None, return_logprobs=False,
             constraint=None, return_features=None) -> GenerateOutput:
  """Plain autoregressive decoding (the K = 0 loop): one target call per token.

  Args:
    model: the `jspec.Model` to sample from.
    prompts: list of token-id lists (lengths may differ), or int32 `[B, P]`
      right-padded with `prompt_lengths=[B]`.
    max_new_tokens: int, or one int per row.
    temperature, top_k, top_p, min_p: scalars or one value per row; temperature 0 is
      greedy (the argmax); otherwise logits are divided by the temperature, then
      min-p keeps the tokens whose probability is at least min_p times the largest
      (0: off), top-k the k most likely (0: off; ties with the k-th kept), and top-p
      the smallest most-likely set whose probability reaches top_p (1: off), measured
      on what min-p and top-k kept: vLLM's order and definitions
      (`jspec.core.sampling.probabilities`). top_p in (0, 1], min_p in [0, 1].
    repetition_penalty, presence_penalty, frequency_penalty: scalars or one value per
      row, applied to the logits before temperature (greedy rows too), as vLLM does:
      the repetition penalty (> 0; 1: none) divides the positive logits and multiplies
      the negative ones of every id seen in the prompt or the output; then
      frequency * count and presence * (count > 0) are subtracted, counting the output
      tokens only (OpenAI's definition). `jspec.core.penalties`.
    logit_bias: None, a dict {id: bias} for every row, a list of one dict (or None)
      per row, or an array [V] or [B, V]; added to the logits before the penalties.
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
      (after the constraint's mask, the bias and penalties, temperature, min-p, top-k
      and top-p: 0 for greedy rows); `Logprobs(raw=True)` reads the model's own
      log_softmax instead, before all of those (the constraint's mask too),
      `Logprobs(top=n)` adds the n most
      likely ids per position (`jspec.core.logprobs`). Speculative decoding records
      the same numbers as plain decoding for the same tokens.
    constraint: a `jspec.Constraint` (from a regex or a JSON schema and the tokenizer)
      for every row, or one per row (None: that row free). New tokens then follow the
      model's distribution restricted to the constraint's language (masked before
      temperature and the filters; `jspec.core.constrained`). A row cut by
      max_new_tokens before its match is complete ends mid-match; give the
      constraint's EOS ids as stop ids (the default when both come from the model's
      tokenizer) so that rows end when the match does.
    return_features: decoder layer indices (a tuple; None: off). `out.features`
      [B, S, len(layers) * D] then holds the outputs of those layers (the residual
      stream after each, concatenated, `Model.with_features`) at every slot of each
      row's prompt and output, slot s being the s-th token of the row's prompt +
      output; slots 0 .. prompt_length + length - 2 are filled (the last token is
      never fed), the rest are zeros. They come from the passes that generate the
      tokens (the prefill, then each step), so a drafter's training features (EAGLE-3,
      DFlash) need no second pass over the answers.
  """
  if not isinstance(model, Model):
    raise TypeError(f"model must be a jspec.Model, got {type(model).__name__}")
  record = _record_layers(model, return_features)
  settings = _settings(temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
                       frequency_penalty, logit_bias)
  return _run(model, None, prompts, max_new_tokens, settings, eos_id, seed, prompt_lengths,
              cache_length, mesh, rules, stream, return_logprobs, constraint, record)


def _record_layers(model: Model, layers) -> tuple[int, ...]:
  """`return_features`, checked before anything traces: () when None."""
  if layers is None:
    return ()
  if isinstance(layers, (int, np.integer)) or not all(
      isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in layers):
    raise TypeError(f"return_features must be a tuple of decoder layer indices, got {layers!r}")
  layers = tuple(int(i) for i in layers)
  if not layers:
    raise ValueError("return_features=(): give at least one decoder layer index, or None")
  if model.features_fn is None:
    raise TypeError("return_features needs a jspec.Model with a features_fn (its decoder "
                    "layers' outputs)")
  model.with_features(layers)  # the architecture checks the indices (a clear ValueError)
  return layers


def speculative_generate(target: Model, draft, prompts, *, num_draft_tokens=None, max_new_tokens,
                         temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                         presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None,
                         eos_id=None, seed=0,
                         prompt_lengths=None, cache_length=None, mesh=None,
                         rules=None, tree: Tree | DynamicTree | None = None, stream=None,
                         return_logprobs=False, constraint=None) -> GenerateOutput:
  """Speculative decoding: `draft` proposes K tokens, `target` verifies them in one call.

  The output follows the target's processed distribution exactly; greedy rows
  equal `generate(target, ...)`, penalties included: each verify position counts the
  drafts before it as output tokens. `draft` is a `jspec.Model` (drafted at each
  row's own sampling settings) or any object following `jspec.core.drafter.Drafter`.
  Other arguments as in `generate`; with `mesh=`, a draft model is replicated
  unless its params are already placed on that mesh (shard it yourself with
  `jspec.core.sharding.shard_model(draft, layout)` to split it by the same rules).

  num_draft_tokens: K >= 1, or "auto" (or a `jspec.AutoK`) to choose K per round
  inside the loop from the running acceptance and round costs at this batch size:
  a profile saved by `jspec profile` when there is one for these models and shapes,
  else a prior from the models' bytes and FLOPs and the device's rates (measured once
  per machine and saved; `jspec.planner.cost_model`), shaped by how the target's call
  grows with the block (timed in loop once per machine, model and shape and saved;
  `jspec.planner.call_times`). The call never times a round; the
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
  speculation = plan.speculation(target, draft, num_draft_tokens, tree)
  settings = _settings(temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
                       frequency_penalty, logit_bias)
  return _run(target, speculation, prompts, max_new_tokens, settings, eos_id, seed,
              prompt_lengths, cache_length, mesh, rules, stream, return_logprobs, constraint)


def _settings(temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
              frequency_penalty, logit_bias) -> dict:
  """The per-row sampling arguments, by name, for `inputs.request`."""
  return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
              repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
              frequency_penalty=frequency_penalty, logit_bias=logit_bias)


def _run(target: Model, speculation: plan.Speculation | None, prompts, max_new_tokens,
         settings: dict, eos_id, seed, prompt_lengths, cache_length, mesh, rules, stream,
         return_logprobs, constraint, record: tuple[int, ...] = ()) -> GenerateOutput:
  """One call: check, plan, place, run the program, cut its outputs."""
  logprob_spec = logprobs.as_spec(return_logprobs)
  if stream is not None and not callable(stream):
    raise TypeError(f"stream must be a callable, got {type(stream).__name__}")
  layout = sharding.as_layout(mesh, rules)
  drafter, tree, side, K = None, None, None, 0
  if speculation is not None:
    drafter, tree, side, K = (speculation.drafter, speculation.tree, speculation.side,
                              speculation.max_k)
  request = inputs.request(target, prompts, prompt_lengths, max_new_tokens, eos_id=eos_id,
                           seed=seed, cache_length=cache_length,
                           block=decode.block_width(K, tree, side), **settings)
  target, drafter, rows = placement.place(target, drafter, request, constraint, layout)
  # The decoding form of the weights, built once per model rather than once per call.
  target, drafter = target.decoding_form(), plan.decoding_form(drafter)
  auto = speculation.k if speculation and isinstance(speculation.k, schedule.AutoK) else None
  costs = memory = None
  if auto is not None:
    costs = plan.round_costs(target, drafter, auto, request.batch, request.cache_length,
                             request.greedy, request.filtered)
    if costs.plain:  # speculation cannot win here: plain decoding
      # A drafter's memory comes back as it went in (`RememberingDrafter`).
      memory = remembered(drafter, None)
      drafter, auto, K = None, None, 0
    else:
      auto = dataclasses.replace(auto, choices=costs.choices, costs=None)  # costs go in traced
      K = max(costs.choices)
  config = decode.DecodeConfig(num_draft_tokens=K, cache_length=request.cache_length,
                               layout=layout, tree=tree, logprobs=logprob_spec, side=side,
                               stream=None if stream is None else streams.deliver,
                               record=record)
  listening = contextlib.nullcontext(0) if stream is None else streams.channel(stream)
  cache = (workspace.take(target, request.batch, request.cache_length)
           if workspace.active(layout) else None)
  with listening as channel:
    args = (target, drafter, rows.tokens, rows.lengths, rows.max_new, rows.params,
            rows.eos_ids, rows.seeds, rows.constraint, np.int32(channel), cache)
    if auto is None:
      *result, recorded, cache = programs.fixed(*args, config=config)
      rounds = None
    else:
      *result, rounds, cache = programs.auto(*args, jnp.asarray(costs.costs, jnp.float32),
                                             jnp.asarray(costs.catch_up, jnp.float32),
                                             config=config, auto=auto)
      recorded = None
    workspace.keep(cache)
    out, new_lengths, stats, records, returned, rounds, recorded = placement.gathered(
        layout, (*result, rounds, recorded))
  memory = memory if returned is None else returned
  by_k = None
  if rounds is not None:
    by_k = outputs.rounds_by_k(auto.choices, rounds)
  elif costs is not None:  # "auto" chose plain decoding for the whole call
    by_k = {0: int(np.max(np.asarray(stats.target_calls)))}
  return outputs.collect(out, new_lengths, stats, records, int(request.max_new.max()), by_k,
                         memory, recorded)
