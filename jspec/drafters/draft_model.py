"""A small autoregressive model as the drafter.

The draft keeps its own KV cache under the decode-state invariant: it holds K/V
for t_0..t_{L-2}. A round (K drafts, K draft calls):

    committed:  t0 ... t(L-3) t(L-2) | t(L-1)
    call 0:                  [t(L-2) t(L-1)]  at slots L-2, L-1   -> q_1, d_1
    call i:                  [d_i]            at slot  L-1+i      -> q_{i+1}, d_{i+1}

Call 0 re-feeds t(L-2): when the previous round accepted all K drafts, d_K (now
t(L-2)) was never fed to the draft; when it was, rewriting the same slot with the
same token is harmless. A row with L = 1 starts its two-token block at slot 0 and
reads its prediction at offset 0; the scratch slot it writes is rewritten before
anything attends to it.

With `params=None` (every row greedy, static) the drafts are the draft model's
argmax and q is None (one-hot at the drafts): no V-wide probabilities, no sampling.

Reduced vocabulary: `DraftModel.reduced(model, ids)` scores only the token ids in
`ids` (FR-Spec; `jspec.drafters.vocab_subset`), with the model's own output-head
rows for them; the V-wide head is never computed (its logits go unused and XLA
drops them). Drafts lie in `ids`, q is zero elsewhere, and acceptance stays exact.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jspec.core import constrained, prefill, sampling
from jspec.core.drafter import DraftContext
from jspec.core.model import Model
from jspec.core.tree import top_ranked
from jspec.drafters import vocab_subset

SYNC_CHUNK = 16  # tokens per catch-up call after rounds without drafting


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftModel:
  """Drafts with a `jspec.Model` sampled at the rows' own settings (argmax when
  `params` is None), over the whole vocabulary or over the ids of `reduced`."""

  model: Model
  ids: jax.Array | None = None  # [N] int32: the token ids drafted (None: all V)
  # [N, D] the output-head rows of `ids`, gathered once per call by `prepared`
  rows: jax.Array | None = None

  @classmethod
  def reduced(cls, model: Model, ids) -> "DraftModel":
    """A draft model that scores only the token ids `ids` (FR-Spec; module docstring).

    ids: distinct token ids in [0, V), e.g. `frequent_tokens(stream, N, V)`. The model
    must expose its output head (`Model.head_fn`).
    """
    ids = vocab_subset.check_ids(ids, model.vocab_size)
    model.head()  # a model without an exposed head fails here, before any tracing
    return cls(model, ids)

  @property
  def vocab_size(self) -> int:
    """The draft model's vocabulary size (must equal the target's)."""
    return self.model.vocab_size

  # PricedCatchUpDrafter: tokens each catch-up call feeds (not a field).
  sync_block: ClassVar[int] = SYNC_CHUNK

  def models(self) -> tuple[Model]:
    """`ModelDrafter.models`: the draft model."""
    return (self.model,)

  def with_models(self, models) -> "DraftModel":
    """`ModelDrafter.with_models`: this drafter over another form of its model (placed,
    in decoding form). The gathered rows are dropped: `prepared` gathers them again."""
    (model,) = models
    return DraftModel(model, self.ids)

  def prepared(self) -> "DraftModel":
    """This drafter over the draft model's decoding-form params (`Model.prepared`), with
    the output-head rows of a reduced vocabulary gathered."""
    if self.ids is None:
      return DraftModel(self.model.prepared())
    head = self.model.head()
    return DraftModel(self.model.prepared(), self.ids,
                      vocab_subset.head_rows(head.embed, head.lm_head, self.ids))

  def _scores(self, logits, hidden):
    """Logits over the drafted ids: [B, T, V] as the model gives them, or [B, T, N]
    from the gathered rows (then the model's own V-wide logits go unused)."""
    if self.ids is None:
      return logits
    head = self.model.head()
    rows = self.rows  # gathered by `prepared`; a caller that skipped it gathers here
    if rows is None:  # (without `prepared`'s copy of every weight into decoding form)
      rows = vocab_subset.head_rows(head.embed, head.lm_head, self.ids)
    return vocab_subset.scores(hidden, rows, head.final_logit_softcapping)

  def _constrained(self, scores, rows, at):
    """Scores [B, V or N] with the ids the automaton forbids in state at [B] at -inf. A
    row whose scored ids are all forbidden (a reduced vocabulary missing the allowed
    ones, or a draft already off the language) keeps its scores: verification rejects
    what it proposes."""
    ok = constrained.step_mask(rows, at)  # [B, V]
    if self.ids is not None:
      ok = ok[:, self.ids]
    ok = ok | ~jnp.any(ok, axis=-1, keepdims=True)
    return jnp.where(ok, scores, jnp.asarray(-jnp.inf, scores.dtype))

  def _token(self, index):
    """Token ids of score indices (the identity over the whole vocabulary)."""
    return index if self.ids is None else vocab_subset.token_ids(self.ids, index)

  def _full(self, q):
    """q [B, N] over the drafted ids as [B, V] (zero elsewhere)."""
    return q if self.ids is None else vocab_subset.spread(self.ids, q, self.vocab_size)

  def init(self, tokens, prompt_lengths, cache_length: int):
    """`Drafter.init`: a [B, S] KV cache with the prompts prefilled (all but the last token).

    tokens [B, P] int32 right-padded prompts; returns the draft model's cache pytree.
    """
    B, P = tokens.shape
    cache = self.model.init_cache(B, cache_length)
    if P > 1:  # prefill t_0..t_{P-2}; rows with shorter prompts overwrite the excess later
      with jax.named_scope("draft_prefill"):
        cache, _ = prefill.prefill(self.model, tokens, prompt_lengths, cache)
    return cache

  def propose(self, cache, context: DraftContext, num_drafts: int,
              params: sampling.SamplingParams | None, keys):
    """`Drafter.propose`: K draft calls (one 2-token call, then K-1 one-token calls).

    Returns drafts [B, K] int32, q [B, K, V] f32 (None when `params` is None:
    argmax drafts, one-hot q) and the updated cache.
    """
    greedy = params is None  # static
    rows = context.constraint

    def draw(scores, i, at):  # scores [B, V or N] -> d [B], q [B, V] (None when greedy)
      if rows is not None:  # at [B]: the automaton state the draft continues from
        scores = self._constrained(scores, rows, at)
      if greedy:
        return self._token(sampling.greedy_tokens(scores)), None
      q = sampling.probabilities(scores[:, None], params)[:, 0]
      return self._token(sampling.sample(sampling.fold(keys, i), q)), self._full(q)

    def after(at, d):  # the automaton state after draft d
      return None if rows is None else constrained.step(rows, at, d)

    L = context.lengths
    start = jnp.maximum(L - 2, 0)
    last_two = jax.vmap(lambda row, s: lax.dynamic_slice(row, (s,), (2,)))(context.tokens, start)
    with jax.named_scope("draft_rollout"):
      logits, hidden, cache = self.model.apply(last_two, cache, start)  # [B, 2, V]
      scores = self._scores(logits, hidden)
      offset = (L - 1) - start  # [B] 0 or 1
      scores = jnp.take_along_axis(scores, offset[:, None, None], axis=1)[:, 0]  # [B, V or N]
      at = None if rows is None else rows.state
      d_first, q_first = draw(scores, 0, at)

      def step(carry, i):
        cache, token, at = carry
        at = after(at, token)
        logits, hidden, cache = self.model.apply(token[:, None], cache, L - 1 + i)
        d, q = draw(self._scores(logits, hidden)[:, 0], i, at)
        return (cache, d, at), (d, q)

      (cache, _, _), (d_rest, q_rest) = lax.scan(
          step, (cache, d_first, at), jnp.arange(1, num_drafts, dtype=jnp.int32))
    drafts = jnp.concatenate([d_first[:, None], d_rest.T], axis=1)  # [B, K]
    if greedy:
      return drafts, None, cache
    q = jnp.concatenate([q_first[:, None], q_rest.transpose(1, 0, 2)], axis=1)  # [B, K, V]
    return drafts, q, cache

  def propose_tree(self, cache, context: DraftContext, tree, params, keys):
    """`Drafter.propose_tree`: node i's token is the ranks[i]-th most likely token
    of the draft's distribution at its parent (SpecInfer-style expansion).

    The accepted path of the previous round sits at scattered tree slots in the
    draft's cache, so a catch-up call first re-feeds the last D+1 committed
    tokens (slots L-2-D .. L-2: at most D of them were accepted drafts). Then one
    call per depth feeds the tree so far, root at slot L-1, with the ancestor mask
    (the contract shows a block every slot before it, so a level cannot be fed on
    its own without seeing its parents' siblings). Ranks do not depend on
    temperature, so `params` and `keys` are unused.

    Returns candidates [B, N-1] int32 and the updated cache.
    """
    del params, keys
    L = context.lengths
    S = context.tokens.shape[1]
    D, N = tree.max_depth, tree.num_nodes
    W = D + 1
    with jax.named_scope("draft_tree"):
      s = jnp.clip(L - 1 - W, 0, S - W)
      recent = jax.vmap(lambda row, st: lax.dynamic_slice(row, (st,), (W,)))(context.tokens, s)
      _, _, cache = self.model.apply(recent, cache, s)
      root_slot = jnp.maximum(L - 1, 0)
      root = jnp.take_along_axis(context.tokens, root_slot[:, None], axis=1)  # [B, 1]
      nodes = jnp.concatenate([root, jnp.zeros((L.shape[0], N - 1), jnp.int32)], axis=1)
      levels = tree.level_slices
      ranks = np.asarray(tree.ranks)
      for d in range(1, D + 1):
        _, stop = levels[d - 1]
        logits, hidden, cache = self.model.apply(
            nodes[:, :stop], cache, root_slot,
            block_mask=jnp.asarray(tree.ancestors[:stop, :stop]),
            depth=jnp.asarray(tree.depths[:stop]))
        lo, hi = levels[d]
        plo, _ = levels[d - 1]
        width = int(ranks[lo:hi].max()) + 1
        scores = self._scores(logits[:, plo:stop], hidden[:, plo:stop])
        top = self._token(top_ranked(scores, width))  # [B, parents' level, width]
        parents = np.asarray(tree.parents[lo:hi]) - plo
        picked = top[:, parents, ranks[lo:hi]].astype(jnp.int32)  # [B, hi-lo]
        nodes = nodes.at[:, lo:hi].set(picked)
    return nodes[:, 1:], cache

  def sync(self, cache, context: DraftContext, synced, chunk: int = SYNC_CHUNK):
    """Feed the committed tokens the draft missed while it was not called.

    synced [B]: slots below it hold current K/V. Afterwards slots below L-2 do,
    which is what `propose` expects. Rounds without drafting (dynamic K = 0) leave
    gaps; the missed tokens go in with one call per `chunk` tokens (`sync_block`
    by default), in order, each block attending to the slots already fed. A row with
    nothing to catch up rewrites slots at or beyond L-2 with the buffer's contents, which `propose`
    and later drafts overwrite before anything attends to them.

        before:  t0 .. t(synced-1) | stale ............ | t(L-2) t(L-1)
        after:   t0 ................................ t(L-3) | (fed by propose)
    """
    L = context.lengths
    S = context.tokens.shape[1]
    W = min(chunk, S)

    def missing(carry):
      pos, _ = carry
      return jnp.any(pos < L - 2)

    def feed(carry):
      pos, cache = carry
      start = jnp.clip(pos, 0, S - W)
      block = jax.vmap(lambda row, s: lax.dynamic_slice(row, (s,), (W,)))(context.tokens, start)
      with jax.named_scope("draft_sync"):
        _, _, cache = self.model.apply(block, cache, start)
      return start + W, cache

    _, cache = lax.while_loop(missing, feed, (synced.astype(jnp.int32), cache))
    return cache

  def sync_calls(self, context: DraftContext, synced):
    """[] int32: the calls `sync` makes from `synced`: the row furthest behind sets it."""
    W = min(self.sync_block, context.tokens.shape[1])
    behind = jnp.maximum(context.lengths - 2 - synced, 0)  # [B]
    return jnp.max((behind + W - 1) // W).astype(jnp.int32)
