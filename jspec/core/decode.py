"""The pure, jittable decoding layer: state, one round, the loop.

Baseline decoding is the same loop with K = 0 and no drafter. One round:

    committed (row b):  t0 .. t(L-2) | t(L-1)           cache holds slots < L-1
    drafter:            d1 .. dK  and q1 .. qK
    target, one call:   [t(L-1) d1 .. dK] at slots L-1 .. L+K-1  -> p0 .. pK
    acceptance:         n drafts kept, then one more token (residual or bonus)
    commit:             t(L) .. t(L+n) = d1 .. dn, next     L' = L + n + 1
                        cache valid for slots < L'-1: the invariant holds again

Sampling params `None` mean every row is greedy, known when the program is built:
the round then takes the target's argmax of the verify logits and accepts while the
drafts equal it (the exact rule at temperature 0), with no probabilities and no
random numbers; K = 0 is a plain argmax step. jit specialises on the pytree
structure, so this is a separate compiled program with no runtime branch. Mixed or
sampled batches pass `SamplingParams` (greedy rows are then per-row one-hots).

EOS and max_new_tokens cut the committed run short (the EOS itself is kept). Rows
that are done keep computing under static shapes with their state frozen; the
loop ends when every row is done.

Everything here is a pure function of pytrees, for users who embed decoding in
their own jitted code:

    state = init_state(target, drafter, tokens, prompt_lengths, max_new_tokens,
                       params, eos_ids, seeds, config)
    state, did = decode_round(target, drafter, state, config)   # one round
    state = decode_loop(target, drafter, state, config)    # until all rows are done
    out, lengths = output_tokens(state)

`init_state` and `decode_loop` run on `prepared(target)` and `prepared(drafter)`:
params in the form their models decode fastest from (`Model.prepare_fn`), made
once per program. A loop of your own around `decode_round` should do the same
before the loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jspec.core import acceptance, constrained, prefill, sampling, sharding, streaming
from jspec.core import logprobs as logprobs_lib, stats as stats_lib, tree as tree_lib
from jspec.core import penalties as penalties_lib
from jspec.core.stats import DecodeStats
from jspec.core.drafter import (DraftContext, LogitsObservingDrafter, PromptObservingDrafter,
                                target_for, uses_features)
from jspec.core.drafter import prepared as prepared_drafter
from jspec.core.model import Model
from jspec.core.dynamic_tree import DynamicTree
from jspec.core.tree import Tree


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Static shape of a decoding program. Changing it recompiles."""

  num_draft_tokens: int  # K; 0 = baseline decoding, no drafter; the tree's depth with a tree
  cache_length: int  # S slots per row, >= prompt + max_new_tokens + (K + 1 or N)
  layout: sharding.Layout | None = None  # mesh + rules for the target cache; None: one device
  # Verify a draft tree of N nodes instead of a chain: a static `Tree`, or a
  # `DynamicTree` budget that the drafter fills per row each round (EAGLE-2).
  tree: Tree | DynamicTree | None = None
  # A host function that gets the committed tokens after every round (`streaming.emit`);
  # None: no callback. Static: a program is shared by every call that streams to it.
  stream: streaming.Callback | None = None
  logprobs: logprobs_lib.Logprobs | None = None  # record emitted tokens' log-probabilities
  # A BranchDrafter's side branch (lookahead): M more nodes in each verify call, computed
  # for the drafter only (`tree.with_side`). Needs a tree.
  side: Tree | None = None
  # Decoder layers whose outputs plain decoding records at every slot (`Model.with_features`,
  # concatenated), for training drafters on the answers as they are generated; () : none.
  record: tuple[int, ...] = ()

  def __post_init__(self):
    if self.record and (self.num_draft_tokens != 0 or self.tree is not None):
      raise ValueError("record= (the target's features at every slot) is for plain decoding "
                       "(num_draft_tokens=0, no tree)")
    if self.tree is not None and self.num_draft_tokens != self.tree.max_depth:
      raise ValueError(f"num_draft_tokens ({self.num_draft_tokens}) must equal the tree's depth "
                       f"({self.tree.max_depth})")
    if self.side is not None and not isinstance(self.tree, Tree):
      raise ValueError("a side branch hangs under a static verify tree: give tree= as well")

  @property
  def block_width(self) -> int:
    """Tokens per verify call: K + 1 for a chain, N for a tree (+ M side nodes)."""
    return block_width(self.num_draft_tokens, self.tree, self.side)


def block_width(num_draft_tokens: int, tree=None, side=None) -> int:
  """Tokens per verify call of a config with these fields (`DecodeConfig.block_width`):
  the slots a row needs past its last committed token."""
  if tree is None:
    return num_draft_tokens + 1
  return tree.num_nodes + (0 if side is None else side.num_nodes - 1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
  """Everything a decode round reads and writes.

  Invariant (per row b): `tokens[b, :lengths[b]]` are committed; the target cache
  (and the drafter's) holds K/V for t_0..t_{L-2}; t_{L-1} is not yet in it.
  """

  tokens: jax.Array  # [B, S] int32 prompt then output; scratch past lengths
  lengths: jax.Array  # [B] int32 committed length L
  prompt_lengths: jax.Array  # [B] int32
  max_lengths: jax.Array  # [B] int32 prompt_lengths + max_new_tokens
  done: jax.Array  # [B] bool
  target_cache: Any  # the target's K/V buffers
  drafter_state: Any  # the drafter's own state (None for baseline)
  keys: jax.Array  # [B] typed PRNG keys, one stream per row
  params: sampling.SamplingParams | None  # per-row temperature / top-k / top-p; None: all greedy
  eos_ids: jax.Array  # [E] int32, or [B, E] per row (an Engine's); -1 entries never match
  stats: DecodeStats
  # Target final hidden states for drafters that read them (`uses_features`: Medusa,
  # EAGLE); None otherwise. Entry j is h at slot feature_start[b] + j, valid for
  # 0 <= slot <= L-2: after a round that began at L0 and accepted n drafts,
  # feature_start = L0 - 1 and entries 0..n are valid (the accepted path's states).
  features: jax.Array | None = None  # [B, F, D], F = K + 1 (chain) or depth + 1 (tree)
  feature_start: jax.Array | None = None  # [B] int32
  # Log-probabilities of the tokens at each slot (`DecodeConfig.logprobs`); None when off.
  logprobs: logprobs_lib.LogprobBuffers | None = None
  # A token-level automaton and each row's state in it (`jspec.core.constrained`); None: free.
  constraint: constrained.ConstraintRows | None = None
  # The tokens each row has seen, for the penalties (`jspec.core.penalties`); None: none.
  seen: penalties_lib.Seen | None = None
  # `DecodeConfig.record`: the recorded layers' outputs at each slot, filled for slots
  # 0..L-2 (the prefill's, then one per plain round); None when off.
  recorded: jax.Array | None = None  # [B, S, len(record) * D]
  # Per-row cap on the drafts a chain round judges (a request that opted out of
  # speculation: 0); drafts past it count as not proposed. None: every row judges K.
  caps: jax.Array | None = None  # [B] int32


def init_state(target: Model, drafter, tokens, prompt_lengths, max_new_tokens,
               params: sampling.SamplingParams | None, eos_ids, seeds, config: DecodeConfig,
               constraint: constrained.ConstraintRows | None = None,
               caps=None, cache=None) -> DecodeState:
  """Prefill target and drafter and build the initial state.

  tokens [B, P] int32 right-padded prompts; prompt_lengths [B] in 1..P;
  max_new_tokens [B] >= 1; params: per-row `SamplingParams`, or None for a
  statically all-greedy program; seeds [B] int32 (row b's random stream depends
  on seeds[b] only); eos_ids [E] int32 (or [B, E], each row its own); constraint: the
  batch's automaton with each row's initial state (`constrained.for_batch`), or None.
  The prompt itself is not checked against the constraint: it constrains the new tokens
  only. caps: optional
  [B] int32, the most drafts each row's chain rounds judge (`DecodeState.caps`).
  cache: the target cache to decode in (`target.init_cache(B, S)`'s shapes; donate it),
  or None for a new one. What its slots hold is never read before the prefill or a
  round writes them (attention masks each row's slots at and past its length).
  """
  if caps is not None and config.tree is not None:
    raise ValueError("per-row caps on K are for chains: a tree's shape is the batch's")
  B, P = tokens.shape
  S = config.cache_length
  K = config.num_draft_tokens
  target, drafter = prepared(target, drafter)
  target = target_for(target, drafter)
  if config.record:
    target = target.with_features(config.record)
  tokens = tokens.astype(jnp.int32)
  prompt_lengths = prompt_lengths.astype(jnp.int32)
  buffer = jnp.zeros((B, S), jnp.int32).at[:, :P].set(tokens)
  cache = target.init_cache(B, S) if cache is None else cache
  cache = sharding.constrain_cache(target, cache, config.layout)
  hidden = prompt_ids = None
  observing = isinstance(drafter, PromptObservingDrafter)
  if P > 1:  # all-length-1 batches have nothing to prefill (static skip)
    with jax.named_scope("target_prefill"):
      cache, hidden, prompt_ids = prefill.observed(
          target, tokens, prompt_lengths, cache, uses_features(drafter) or bool(config.record),
          drafter.observed_top_k if observing else 0)
  recorded = None
  if config.record:  # slots 0..P-2 from the prefill; each plain round adds its slot
    width = jax.eval_shape(lambda c: target.apply(tokens[:, :1], c, prompt_lengths * 0),
                           cache)[1].shape[-1]
    recorded = jnp.zeros((B, S, width), target.dtype)
    if hidden is not None:  # the padding's slots, past a row's L-2, hold nothing
      fed = jnp.arange(P - 1, dtype=jnp.int32)[None, :] < (prompt_lengths - 1)[:, None]
      recorded = recorded.at[:, :P - 1].set(
          jnp.where(fed[:, :, None], hidden, 0).astype(target.dtype))
  features = feature_start = None
  if drafter is None:
    drafter_state = None
  elif uses_features(drafter):
    F = config.num_draft_tokens + 1
    if hidden is None:
      width = jax.eval_shape(lambda c: target.apply(tokens[:, :1], c, prompt_lengths * 0),
                             cache)[1].shape[-1]  # D, or the fused layers' width
      hidden = jnp.zeros((B, 0, width), target.dtype)
    drafter_state = drafter.init(tokens, prompt_lengths, S, hidden)
    # The last F prompt slots, L-1-F .. L-2 (negative slots are invalid entries).
    feature_start = prompt_lengths - 1 - F
    padded = jnp.pad(hidden, ((0, 0), (F, 0), (0, 0)))  # slot s sits at index s + F
    features = jax.vmap(lambda h, s: lax.dynamic_slice_in_dim(h, s + F, F, axis=0))(
        padded, feature_start)
  else:
    drafter_state = drafter.init(tokens, prompt_lengths, S)
  if prompt_ids is not None:  # a PromptObservingDrafter reads the prompt's top-k ids
    with jax.named_scope("observe_logits"):
      valid = jnp.arange(P - 1, dtype=jnp.int32)[None, :] < (prompt_lengths - 1)[:, None]
      drafter_state = drafter.after_prefill_logits(drafter_state, tokens[:, :P], prompt_ids,
                                                   valid)
  return DecodeState(
      tokens=buffer,
      lengths=prompt_lengths,
      prompt_lengths=prompt_lengths,
      max_lengths=prompt_lengths + max_new_tokens.astype(jnp.int32),
      done=max_new_tokens <= 0,
      target_cache=cache,
      drafter_state=drafter_state,
      keys=sampling.row_keys(seeds.astype(jnp.int32)),
      params=params,
      eos_ids=eos_ids.astype(jnp.int32),
      stats=stats_lib.init(B, K),
      features=features,
      feature_start=feature_start,
      logprobs=(None if config.logprobs is None
                else logprobs_lib.init_buffers(config.logprobs, B, S)),
      constraint=constraint,
      seen=penalties_lib.init(params, tokens, prompt_lengths, target.vocab_size),
      recorded=recorded,
      caps=None if caps is None else jnp.asarray(caps, jnp.int32),
  )


def prepared(target: Model, drafter):
  """The target in decoding form (`Model.prepared`) and the drafter as well
  (`ModelDrafter.prepared`; any other as it is). Call it inside the jitted program,
  before the loop."""
  return target.prepared(), prepared_drafter(drafter)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RoundResult:
  """What one round did, per row (zeros for rows that were already done)."""

  proposed: jax.Array  # [B] int32 drafts judged: K for a chain, N - 1 for a tree
  accepted: jax.Array  # [B] int32 drafts accepted and committed
  committed: jax.Array  # [B] int32 tokens committed: accepted + the target's own, cut at EOS
  token: jax.Array  # [B] int32 the target's own token (the correction or the bonus)


def decode_round(target: Model, drafter, state: DecodeState,
                 config: DecodeConfig) -> tuple[DecodeState, RoundResult]:
  """One round: draft, verify in one target call (a chain of K+1 or a tree of N
  tokens), accept, commit. Returns the new state and what the round did."""
  K, S, W = config.num_draft_tokens, config.cache_length, config.block_width
  target = target_for(target, drafter)
  if config.record:
    target = target.with_features(config.record)
  L = state.lengths
  round_keys = sampling.fold(state.keys, state.stats.target_calls)
  # Drafters that draw nothing at random (all built-in ones when greedy) leave these
  # unused, and XLA drops them.
  draft_keys = sampling.fold(round_keys, 1)
  accept_keys = sampling.fold(round_keys, 2)
  context = DraftContext(tokens=state.tokens, lengths=L, features=state.features,
                         feature_start=state.feature_start, constraint=state.constraint)
  # Done rows keep a frozen L; clamp so their (discarded) block stays in bounds.
  start = jnp.minimum(L - 1, S - W)
  last = jnp.take_along_axis(state.tokens, start[:, None], axis=1)  # [B, 1]
  if config.tree is None:
    n, emitted, cache, drafter_state, hidden, scores = _chain(
        target, drafter, state, context, start, last, K, draft_keys, accept_keys)
  else:
    n, emitted, cache, drafter_state, hidden, scores = _tree(
        target, drafter, state, context, start, last, config.tree, draft_keys, accept_keys,
        config.side)
  records = None
  if config.logprobs is not None:
    with jax.named_scope("logprobs"):
      raw_logits, logits, p = scores
      records = logprobs_lib.of_round(
          config.logprobs, raw_logits if config.logprobs.raw else logits, p, emitted,
          None if state.params is None else state.params.greedy)
  state = dataclasses.replace(state, target_cache=cache, drafter_state=drafter_state)
  if state.features is not None:
    # A round narrower than the state's F (K = 0 in an "auto" loop) leaves the entries
    # past its block as zeros: they describe slots this round commits nothing at.
    width = state.features.shape[1]
    hidden = jnp.pad(hidden, ((0, 0), (0, width - hidden.shape[1]), (0, 0)))
    state = dataclasses.replace(state, features=hidden.astype(state.features.dtype),
                                feature_start=start)
  active = ~state.done
  if state.recorded is not None:  # plain decoding: the one fed slot, L-1, of active rows
    slot = jnp.where(active, start, S)  # out of range: dropped
    state = dataclasses.replace(state, recorded=jax.vmap(
        lambda buf, s, h: buf.at[s].set(h, mode="drop"))(
            state.recorded, slot, hidden[:, 0].astype(state.recorded.dtype)))
  drafts = K if config.tree is None else config.tree.num_nodes - 1
  if state.caps is not None:  # a capped row judged only its first caps drafts
    drafts = jnp.minimum(state.caps, drafts)
  state, count = _commit(state, n, emitted, K, records)
  token = jnp.take_along_axis(emitted, n[:, None], axis=1)[:, 0]
  return state, RoundResult(proposed=jnp.where(active, drafts, 0).astype(jnp.int32),
                            accepted=jnp.minimum(n, count), committed=count,
                            token=jnp.where(active, token, 0))


def _chain(target, drafter, state, context, start, last, K, draft_keys, accept_keys):
  """Draft K, verify [t(L-1) d1 .. dK]: n [B], emitted [B, K+1] (d1..dn, next, ...),
  cache, drafter state, hidden [B, K+1, D], and (raw logits, logits, p) [B, K+1, V]
  that predict `emitted` (raw: the model's own; logits: after the constraint mask, the
  logit bias and the penalties, the ones p is computed from; p None when all rows are
  greedy)."""
  B = start.shape[0]
  drafter_state = state.drafter_state
  if K > 0:
    drafts, q, drafter_state = drafter.propose(drafter_state, context, K, state.params,
                                               draft_keys)
  else:
    drafts, q = jnp.zeros((B, 0), jnp.int32), None
  block = jnp.concatenate([last, drafts.astype(jnp.int32)], axis=1)  # [B, K+1]
  with jax.named_scope("target_verify"):
    logits, hidden, cache = target.apply(block, state.target_cache, start)
  raw_logits = logits  # the model's own, for Logprobs(raw=True)
  if state.constraint is not None:
    with jax.named_scope("constraint"):
      states = constrained.along_chain(state.constraint, drafts.astype(jnp.int32))
      logits = constrained.masked(logits, state.constraint, states)
  with jax.named_scope("acceptance"):
    if state.params is None:  # static: all rows greedy
      # One-hot p accepts exactly while d_i is the argmax, whatever q is: q is unused.
      n, next_token = acceptance.accept_greedy(logits, drafts, state.caps)
      p = None
    else:
      chain = np.tril(np.ones((K + 1, K + 1), bool))  # position i sees the drafts up to d_i
      # The adjusted logits from here on: a greedy row's top list ranks these (logprobs).
      logits = _penalized(logits, state, block, chain)
      p = sampling.probabilities(logits, state.params)
      n, next_token = acceptance.accept_chain(p, q, drafts, accept_keys, state.caps)
  j = jnp.arange(K + 1, dtype=jnp.int32)[None, :]  # [1, K+1]
  drafter_state = _observe_logits(drafter, drafter_state, state, block, raw_logits,
                                  j <= n[:, None])
  drafts_padded = jnp.concatenate([drafts, jnp.zeros((B, 1), jnp.int32)], axis=1)
  emitted = jnp.where(j == n[:, None], next_token[:, None], drafts_padded)  # [B, K+1]
  return n, emitted, cache, drafter_state, hidden, (raw_logits, logits, p)


def _observe_logits(drafter, drafter_state, state: DecodeState, block, raw_logits, on_path):
  """A `LogitsObservingDrafter`'s state after the verify: it gets the ids of the k
  largest raw logits at each verified position (block [B, W], raw_logits [B, W, V]) and
  which lie on the accepted path (on_path [B, W]: the root and the accepted drafts; none
  for rows already done). Any other drafter's state as it is: no top-k is computed."""
  if not isinstance(drafter, LogitsObservingDrafter):
    return drafter_state
  with jax.named_scope("observe_logits"):
    top_ids = lax.top_k(raw_logits, drafter.observed_top_k)[1].astype(jnp.int32)  # [B, W, k]
    on_path = on_path & ~state.done[:, None]
    return drafter.after_verify_logits(drafter_state, block, top_ids, on_path)


def _tree(target, drafter, state, context, start, last, topology: Tree, draft_keys, accept_keys,
          side: Tree | None = None):
  """Draft a tree, verify its N nodes in one call with the ancestor mask, accept a
  path, compact its K/V (see `jspec.core.tree`). Returns as `_chain`, emitted and hidden
  [B, D+1] / [B, D+1, D] along the accepted path. With a side branch (a BranchDrafter)
  its M nodes ride in the same call after the tree's; the drafter gets their argmax."""
  if isinstance(topology, DynamicTree):  # a tree per row, grown by the drafter
    candidates, shape, drafter_state = drafter.propose_dynamic(
        state.drafter_state, context, topology, state.params, draft_keys)  # [B, N-1]
  else:
    candidates, drafter_state = drafter.propose_tree(state.drafter_state, context, topology,
                                                     state.params, draft_keys)  # [B, N-1]
    shape = topology
  block = jnp.concatenate([last, candidates.astype(jnp.int32)], axis=1)  # [B, N]
  N = topology.num_nodes
  if side is None:
    full, mask, depth = block, shape.ancestors, shape.depths  # [N, N] / [N], or per row
  else:
    full = jnp.concatenate([block, drafter.side_tokens(drafter_state).astype(jnp.int32)], axis=1)
    mask, depth = tree_lib.with_side(topology, side)
  with jax.named_scope("target_verify_tree"):
    logits, hidden, cache = target.apply(full, state.target_cache, start,
                                         block_mask=jnp.asarray(mask), depth=jnp.asarray(depth))
  if side is not None:
    predictions = sampling.greedy_tokens(logits[:, N:])  # [B, M]
    logits = logits[:, :N]
    hidden = None if hidden is None else hidden[:, :N]
  raw_logits = logits  # the model's own, for Logprobs(raw=True)
  if state.constraint is not None:
    with jax.named_scope("constraint"):
      states = constrained.along_tree(state.constraint, block, shape)
      logits = constrained.masked(logits, state.constraint, states)
  with jax.named_scope("acceptance"):
    if state.params is None:
      node, next_token = tree_lib.accept_greedy(logits, candidates, shape)
      p = None
    else:
      ancestors = tree_lib.row_arrays(shape, block.shape[0])[2]  # [B, N, N]
      logits = _penalized(logits, state, block, ancestors)  # as in _chain
      p = sampling.probabilities(logits, state.params)
      node, next_token = tree_lib.accept_sampled(p, candidates, shape, accept_keys)
  path = tree_lib.path_nodes(node, shape)  # [B, D+1]
  _, depths, ancestors, _ = tree_lib.row_arrays(shape, node.shape[0])  # [B, N], [B, N, N]
  n = jnp.take_along_axis(depths, node[:, None], axis=1)[:, 0]  # [B] accepted drafts
  if side is not None:
    drafter_state = drafter.after_verify(drafter_state, context, predictions, n)
  # The accepted path, root to node: the node's ancestors, itself included.
  on_path = jnp.take_along_axis(ancestors, node[:, None, None], axis=1)[:, 0]  # [B, N]
  drafter_state = _observe_logits(drafter, drafter_state, state, block, raw_logits, on_path)
  with jax.named_scope("compact"):
    cache = tree_lib.compact(cache, _cache_axes(target), start, path, topology.num_nodes)
  D = topology.max_depth
  j = jnp.arange(D + 1, dtype=jnp.int32)[None, :]
  # Path tokens at depths 1..D, shifted so emitted[j] is the token after depth j.
  path_tokens = jnp.take_along_axis(block, path, axis=1)  # [B, D+1]
  following = jnp.concatenate([path_tokens[:, 1:], jnp.zeros_like(path_tokens[:, :1])], axis=1)
  emitted = jnp.where(j == n[:, None], next_token[:, None], following)
  path_hidden = jnp.take_along_axis(hidden, path[:, :, None], axis=1)  # [B, D+1, D]
  # Node path[j] predicts emitted[j]: its logits and p are the ones to read.
  path_logits = jnp.take_along_axis(logits, path[:, :, None], axis=1)  # [B, D+1, V]
  path_p = None if p is None else jnp.take_along_axis(p, path[:, :, None], axis=1)
  path_raw = (path_logits if raw_logits is logits
              else jnp.take_along_axis(raw_logits, path[:, :, None], axis=1))
  return n, emitted, cache, drafter_state, path_hidden, (path_raw, path_logits, path_p)


def _penalized(logits, state: DecodeState, block, ancestors):
  """Verify logits [B, W, V] with each row's logit bias and penalties, every position
  counting the drafts on its path (ancestors [W, W] or [B, W, W]) as output tokens."""
  if not penalties_lib.active(state.params):
    return logits
  counts = None if state.seen is None else penalties_lib.block_counts(block, ancestors)
  return penalties_lib.apply(logits, state.params, state.seen, counts)


def _cache_axes(target: Model):
  axes = sharding.model_axes(target)
  if axes is None:
    raise ValueError("tree decoding moves accepted K/V along the cache's slot axis, found from "
                     "the model's cache axes: give the jspec.Model an `axes_fn` that names "
                     "'batch' and 'sequence' in every cache buffer")
  return axes[1]


def _commit(state: DecodeState, n, emitted, K: int, records=None):
  """Write d1..dn and the next token, cut at EOS and max length; freeze done rows.

  n [B] accepted drafts; emitted [B, K+1] with the tokens to commit first; records:
  their log-probabilities (`logprobs.of_round`) or None. Returns the state and count
  [B], the tokens committed per row."""
  S = state.tokens.shape[1]
  L = state.lengths
  active = ~state.done
  with jax.named_scope("commit"):
    j = jnp.arange(K + 1, dtype=jnp.int32)[None, :]  # [1, K+1]
    count = n + 1
    eos = state.eos_ids if state.eos_ids.ndim == 2 else state.eos_ids[None, :]  # [B|1, E]
    is_eos = jnp.any(emitted[:, :, None] == eos[:, None, :], axis=-1)
    is_eos = is_eos & (j < count[:, None])
    first_eos = jnp.where(jnp.any(is_eos, axis=1), jnp.argmax(is_eos, axis=1), K + 1)
    count = jnp.minimum(count, first_eos + 1)
    count = jnp.minimum(count, state.max_lengths - L)
    count = jnp.where(active, count, 0).astype(jnp.int32)
    # Masked scatter: a (K+1)-wide dynamic_update_slice would clamp at the end.
    positions = jnp.where(j < count[:, None], L[:, None] + j, S)
    tokens = jax.vmap(lambda row, pos, val: row.at[pos].set(val, mode="drop"))(
        state.tokens, positions, emitted)
    logprob_buffers = state.logprobs
    if records is not None:
      logprob_buffers = logprobs_lib.write(state.logprobs, positions, records)
    new_L = L + count
    hit_eos = jnp.any(is_eos & (j < count[:, None]), axis=1)
    done = state.done | hit_eos | (new_L >= state.max_lengths)

  judged_k = K if state.caps is None else jnp.minimum(state.caps, K)[:, None]
  stats = stats_lib.after_round(state.stats, active, n, count, judged_k)
  rows = state.constraint
  if rows is not None:
    rows = constrained.after_commit(rows, emitted, count)
  seen = penalties_lib.after_commit(state.seen, emitted, count)
  return dataclasses.replace(state, tokens=tokens, lengths=new_L, done=done, stats=stats,
                             logprobs=logprob_buffers, constraint=rows, seen=seen), count


def decode_loop(target: Model, drafter, state: DecodeState, config: DecodeConfig,
                channel=None) -> DecodeState:
  """Run rounds in one `lax.while_loop` until every row is done.

  channel: [] int32, what `config.stream` is told with each round's tokens (which
  call they belong to); used only with a `config.stream`."""
  target, drafter = prepared(target, drafter)

  def body(s):
    s, _ = decode_round(target, drafter, s, config)
    if config.stream is not None:
      streaming.emit(config.stream, channel, s.tokens, s.lengths, s.prompt_lengths)
    return s

  return lax.while_loop(lambda s: jnp.any(~s.done), body, state)


def output_tokens(state: DecodeState):
  """New tokens per row, left-aligned: int32 [B, S] (-1 past each row's end), lengths [B]."""
  B, S = state.tokens.shape
  j = jnp.arange(S, dtype=jnp.int32)[None, :]
  new_lengths = state.lengths - state.prompt_lengths
  idx = jnp.minimum(state.prompt_lengths[:, None] + j, S - 1)
  out = jnp.take_along_axis(state.tokens, idx, axis=1)
  return jnp.where(j < new_lengths[:, None], out, -1), new_lengths
