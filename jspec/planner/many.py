"""`generate_many`: N prompts through B slots in one compiled program.

A fixed batch (`generate`) decodes its rows together until the longest ends: rows
that finish early keep computing, and the next prompts wait for the whole call. Here
every row is a slot that holds one request at a time (`jspec.core.slots`): a request
that ends frees its slot, and the next queued prompt is prefilled into it inside the
same `lax.while_loop`, while the other slots keep decoding. Long-tailed answer lengths
(evaluation sweeps, RL rollouts) then keep every slot busy.

The queue's length is a bucket (a power of two, at least 8; the count is traced), as
are the prompt width and the cache, so new prompts and new N that fit the same
buckets reuse the compiled program.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import decode, logprobs, programs, schedule
from jspec.core import slots as slots_lib
from jspec.core.model import Model
from jspec.planner import inputs, outputs, placement, plan
from jspec.planner.outputs import GenerateOutput

QUEUE_BUCKET_MIN = 8
WIDTH_BUCKET = 16  # the results' width (the largest max_new_tokens) rounds up to this


def generate_many(target: Model, drafter, prompts, *, slots: int = 32, max_new_tokens,
                  num_draft_tokens=None, tree=None, temperature=0.0, top_k=0, top_p=1.0,
                  min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
                  frequency_penalty=0.0, logit_bias=None, eos_id=None, seed=0,
                  cache_length=None, return_logprobs=False, constraint=None,
                  order: str = "longest_first") -> GenerateOutput:
  """Decode N prompts (N may be far above `slots`) through `slots` rows at once.

  Each request runs alone in its slot: its output does not depend on its slot, its
  neighbours or N. Greedy requests equal `generate` / `speculative_generate` on that
  prompt alone; sampled ones draw from their own seed (`seed` one int: request i uses
  the stream (seed, i), as row i of `generate` does; or one int per request).

  Args:
    target: the `jspec.Model`.
    drafter: None (plain decoding), a `jspec.Model` (a draft model) or any drafter
      (`jspec.NGram`, `jspec.Eagle`, ...), as for `speculative_generate`.
    prompts: a list of N token-id lists (lengths may differ).
    slots: B, the rows decoded at once (static; the batch of every round).
    max_new_tokens, sampling settings, logit_bias, eos_id, seed, constraint: one value
      for every request or one per request, as in `generate`.
    num_draft_tokens, tree: as in `speculative_generate` (a fixed K or a tree).
    cache_length: slots per row (default: a bucket that holds the longest prompt plus
      the largest max_new_tokens plus a verify block). Rounds read the cache only up to
      the longest live row (`jspec.models.TransformerConfig.min_attention_span`), so a
      long cache costs memory, not time per round.
    return_logprobs: as in `generate`.
    order: which waiting request takes a free slot first. "longest_first" (the
      default): the largest prompt + max_new_tokens first, so the longest requests do
      not start last and run alone at the end (longest-processing-time scheduling;
      EOS may still end any request early); "in_order": as given. Outputs come back
      in input order either way, and no request's output depends on it.

  Returns a `GenerateOutput` with one row per prompt, in input order: tokens
  [N, max(max_new_tokens)], lengths, per-request stats (`target_calls` counts the
  rounds each request was in a slot) and log-probabilities.
  """
  if not isinstance(target, Model):
    raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
  if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
    raise ValueError(f"slots must be an integer >= 1, got {slots!r}")
  if not isinstance(prompts, (list, tuple)) or not prompts:
    raise ValueError("prompts must be a non-empty list of token-id lists")
  speculation = None
  if drafter is not None or num_draft_tokens is not None or tree is not None:
    if drafter is None:
      raise ValueError("num_draft_tokens / tree need a drafter")
    speculation = plan.speculation(target, drafter, num_draft_tokens, tree)
    if isinstance(speculation.k, schedule.AutoK):
      raise ValueError('generate_many drafts a fixed K or tree; num_draft_tokens="auto" runs '
                       'through jspec.Engine')
  spec = logprobs.as_spec(return_logprobs)
  d, tree_, side, K = None, None, None, 0
  if speculation is not None:
    d, tree_, side, K = (speculation.drafter, speculation.tree, speculation.side,
                         speculation.max_k)
  N = len(prompts)
  request = inputs.request(target, list(prompts), None, max_new_tokens,
                           eos_id=eos_id, seed=seed, cache_length=cache_length,
                           block=decode.block_width(K, tree_, side), temperature=temperature,
                           top_k=top_k, top_p=top_p, min_p=min_p,
                           repetition_penalty=repetition_penalty,
                           presence_penalty=presence_penalty,
                           frequency_penalty=frequency_penalty, logit_bias=logit_bias)
  if order not in ("longest_first", "in_order"):
    raise ValueError(f'order must be "longest_first" or "in_order", got {order!r}')
  served = np.arange(N)
  if order == "longest_first":
    served = np.argsort(-(request.lengths + request.max_new), kind="stable")
  request = _rows(request, served)
  bucket = max(QUEUE_BUCKET_MIN, 1 << (N - 1).bit_length())
  request = _rows(request, np.concatenate([np.arange(N), np.zeros(bucket - N, np.int64)]))
  if constraint is not None and isinstance(constraint, (list, tuple)):
    if len(constraint) != N:
      raise ValueError(f"constraint: one per prompt ({N}) or one for all, got {len(constraint)}")
    constraint = [constraint[i] for i in served] + [None] * (bucket - N)
  target, d, rows = placement.place(target, d, request, constraint, None)
  target, d = target.decoding_form(), plan.decoding_form(d)
  most_new = int(request.max_new[:N].max())
  width = min(inputs.round_up(most_new, WIDTH_BUCKET), request.cache_length)
  config = decode.DecodeConfig(num_draft_tokens=K, cache_length=request.cache_length,
                               tree=tree_, logprobs=spec, side=side)
  queue = slots_lib.Queue(tokens=rows.tokens, prompt_lengths=rows.lengths, max_new=rows.max_new,
                          seeds=rows.seeds, params=rows.params, constraint=rows.constraint)
  tokens, lengths, stats, records, memory = programs.many(
      target, d, queue, np.int32(N), rows.eos_ids, config=config, slots=int(slots),
      width=width)
  back = np.argsort(served)  # queue position of each input row
  cut = lambda tree: jax.tree_util.tree_map(lambda x: jnp.asarray(x)[back], tree)
  return outputs.collect(cut(tokens), cut(lengths), cut(stats),
                         None if records is None else cut(records), most_new, None, memory)


def _rows(request: inputs.Request, index: np.ndarray) -> inputs.Request:
  """The request's rows taken at `index` (a permutation, or with repeats: the padding of
  a queue bucket, which the program never serves). Seeds were fixed per input row
  before, so a request keeps its own stream wherever it is served."""
  N = request.batch
  fields = {}
  for f in dataclasses.fields(request):
    value = getattr(request, f.name)
    if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == N and \
        f.name != "eos_ids":
      fields[f.name] = value[index]
  return dataclasses.replace(request, **fields)
