"""EAGLE's tree proposals: a static tree (`Eagle.propose_tree`) and a dynamic one grown
from the head's own confidences (EAGLE-2, `Eagle.propose_dynamic`).

Both start with the chain's catch-up call (`jspec.drafters.eagle`, the decode-state
invariant there). In a static tree node i sits at slot L-1+i with RoPE position
L-1+depth(i) and sees the committed prefix (slots < L-1) and its own ancestors; its
token is the ranks[i]-th most likely token of the distribution at its parent. A
dynamic tree's e-th expanded node sits at slot L + e (`propose_dynamic`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import dynamic_tree
from jspec.core.dynamic_tree import DynamicTree
from jspec.core.tree import top_ranked
from jspec.drafters.eagle_head import tree_visibility


def propose_tree(head, cache, context, tree):
  """Tree drafting: candidates [B, N-1] int32 (node i's token at column i-1) and the cache.

  Deterministic top-k (no q): node i's token is the ranks[i]-th most likely
  token of the draft distribution at node parents[i] (the loop accepts tree
  candidates without a draft distribution).
  """
  parents = np.asarray(tree.parents, np.int64)
  ranks = np.asarray(tree.ranks, np.int64)
  depths = np.asarray(tree.depths, np.int64)
  ancestors = np.asarray(tree.ancestors, bool)
  N = parents.shape[0]
  if N < 2:
    raise ValueError("a draft tree needs at least one node besides the root")
  levels = list(tree.level_slices)
  R = int(ranks[1:].max()) + 1
  drafted = head.vocab_size if head.ids is None else int(head.ids.shape[0])
  if R > drafted:
    raise ValueError(f"tree ranks go up to {R - 1}, beyond the {drafted} ids this head drafts")
  S = cache["k"].shape[3]
  L = context.lengths.astype(jnp.int32)
  root = L - 1  # [B] slot of node 0
  anc = jnp.asarray(ancestors)  # [N, N]

  with jax.named_scope("eagle_propose_tree"):
    f_root, cache = head._catch_up(cache, context)
    feats = {0: f_root}  # node -> predicted feature [B, D] (only nodes with children)
    tokens = {}  # node -> token [B]
    top = {}  # parent node -> top-R tokens [B, R]

    def top_tokens(nodes):
      f = jnp.stack([feats[i] for i in nodes], axis=1)  # [B, n, D]
      idx = head._token(top_ranked(head.draft_scores(f), R))  # ties: lowest id first
      for col, i in enumerate(nodes):
        top[i] = idx[:, col].astype(jnp.int32)

    top_tokens([0])
    for d, (a, b) in enumerate(levels):
      if d == 0:
        continue
      nodes = list(range(a, b))
      for i in nodes:
        tokens[i] = top[int(parents[i])][:, int(ranks[i])]
      expanding = [i for i in nodes if np.any(parents == i)]
      if not expanding:
        continue
      # Feed the level's expanding nodes: (parent's feature, own token) at slot L-1+i.
      idx = np.asarray(expanding, np.int32)
      f_in = jnp.stack([feats[int(parents[i])] for i in expanding], axis=1)  # [B, T, D]
      t_in = jnp.stack([tokens[i] for i in expanding], axis=1)  # [B, T]
      slots = root[:, None] + jnp.asarray(idx)[None, :]  # [B, T]
      positions = root[:, None] + jnp.asarray(depths[idx].astype(np.int32))[None, :]
      visible = tree_visibility(root, anc[idx], S)
      out, cache = head.forward(head.params, f_in, t_in, cache, slots, positions, visible)
      for col, i in enumerate(expanding):
        feats[i] = out[:, col]
      top_tokens(expanding)
  candidates = jnp.stack([tokens[i] for i in range(1, N)], axis=1)  # [B, N-1]
  return candidates.astype(jnp.int32), cache

def propose_dynamic(head, cache, context, budget: DynamicTree):
  """Dynamic tree drafting (EAGLE-2; `jspec.core.dynamic_tree`): candidates [B, N-1]
  int32, the rows' `RowTree` and the cache.

  One catch-up call, then one call per level of k expanded candidates: the e-th
  expanded node (e = (level - 1) k + j) sits at slot L + e with RoPE position
  L - 1 + level and sees the committed prefix (the root included), its expanded
  ancestors and ithead. Deterministic (no q), like `propose_tree`.
  """
  k, D = budget.top_k, budget.max_depth
  drafted = head.vocab_size if head.ids is None else int(head.ids.shape[0])
  if k > drafted:
    raise ValueError(f"top_k {k} exceeds the {drafted} ids this head drafts")
  S = cache["k"].shape[3]
  E = max(D - 1, 1) * k  # expanded nodes, at slots L .. L + E - 1
  L = context.lengths.astype(jnp.int32)
  s = jnp.arange(S, dtype=jnp.int32)[None, :]
  rel = s - L[:, None]  # [B, S] expanded node held in each slot
  in_expanded = (rel >= 0) & (rel < E)
  rel = jnp.broadcast_to(jnp.clip(rel, 0, E - 1)[:, None, :], (L.shape[0], k, S))
  prefix = (s <= (L - 1)[:, None])[:, None, :]  # [B, 1, S]

  with jax.named_scope("eagle_propose_dynamic"):
    f_root, cache = head._catch_up(cache, context)
    root_scores = jax.nn.log_softmax(head.draft_scores(f_root[:, None])[:, 0], axis=-1)

    def expand(level, index, up, carry):
      cache_, feats, anc = carry if carry is not None else (cache, None, None)
      B = index.shape[0]
      if feats is None:  # level 1: every node hangs under the root
        f_in = jnp.broadcast_to(f_root[:, None], (B, k, f_root.shape[-1]))
        anc = jnp.zeros((B, k, E), bool)
      else:
        f_in = jnp.take_along_axis(feats, up[:, :, None], axis=1)
        anc = jnp.take_along_axis(anc, up[:, :, None], axis=1)
      own = (level - 1) * k + jnp.arange(k, dtype=jnp.int32)
      anc = anc | (jnp.arange(E)[None, None, :] == own[None, :, None])  # [B, k, E]
      visible = prefix | (jnp.take_along_axis(anc, rel, axis=2) & in_expanded[:, None, :])
      slots = L[:, None] + own[None, :]
      positions = jnp.broadcast_to((L - 1 + level)[:, None], (B, k))
      out, cache_ = head.forward(head.params, f_in, head._token(index), cache_, slots,
                                 positions, visible)
      scores = jax.nn.log_softmax(head.draft_scores(out), axis=-1)  # [B, k, V or N]
      return scores, (cache_, out, anc)

    index, tree, carry = dynamic_tree.grow(budget, root_scores, expand)
    if carry is not None:  # D > 1: the cache after the last level's call
      cache = carry[0]
  return head._token(index).astype(jnp.int32), tree, cache
