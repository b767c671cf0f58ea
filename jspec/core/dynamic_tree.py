"""Dynamic draft trees (EAGLE-2, Li et al. 2024b): a per-row tree grown each round from
the drafter's own confidences, inside a static node budget.

A static `jspec.Tree` fixes which ranks are tried at which depth before decoding
starts. EAGLE-2 observes that the draft model's confidence (its probability of a
token) tracks the chance that the token is accepted, and grows the tree where the
drafter is sure: in their measurements this adds ~0.3-0.7 tokens per round over the
best static tree (EAGLE-2 reaches tau 4.36 against EAGLE's 3.62 on Vicuna-7B).

A round here, for a budget `DynamicTree(nodes=N, depth=D, top_k=k)`:

    expand   level 1: the k most likely tokens under the root (k candidates);
             levels 2..D: the k candidates of the level before with the highest
             value (product of draft probabilities along the path) are fed to the
             drafter, each proposes its k most likely children (k * k candidates)
    rerank   the N - 1 candidates of highest value over all levels become the
             tree (a child's value never exceeds its parent's, and ties go to the
             earlier candidate, so the chosen set contains every chosen node's
             ancestors)

All shapes are static: k + (D-1) k^2 candidates, N nodes, D levels; only which
candidates are kept differs between rows and rounds, so nothing recompiles. The
tree travels as a `RowTree` (per-row parents, depths, ancestor mask and children);
the target verifies it with a per-row `block_mask` [B, N, N] and `depth` [B, N]
(the model contract allows either [T, T] / [T] or per-row masks), and
`jspec.core.tree`'s acceptance, path and compaction take it as they take a static
tree. The candidates are a deterministic function of the drafter's state, so the
multi-candidate exact rule holds under sampling as for static trees.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclasses.dataclass(frozen=True)
class DynamicTree:
  """The static budget of a dynamic tree: `nodes` N (root included: the verify width),
  `depth` D (levels grown, the most drafts a round can accept) and `top_k` k (children
  per expanded candidate, and candidates expanded per level)."""

  nodes: int
  depth: int
  top_k: int = 4

  def __post_init__(self):
    for name in ("nodes", "depth", "top_k"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"DynamicTree.{name} must be an int, got {value!r}")
    if self.nodes < 2 or self.depth < 1 or self.top_k < 1:
      raise ValueError(f"DynamicTree needs nodes >= 2, depth >= 1 and top_k >= 1: {self}")
    if self.nodes - 1 > self.num_candidates:
      raise ValueError(f"DynamicTree(nodes={self.nodes}) keeps more nodes than the "
                       f"{self.num_candidates} candidates depth {self.depth} and top_k "
                       f"{self.top_k} grow")

  @property
  def num_nodes(self) -> int:
    """N, the root included: the width of the verify block."""
    return int(self.nodes)

  @property
  def max_depth(self) -> int:
    """D: at most this many drafts are accepted per round."""
    return int(self.depth)

  @property
  def num_candidates(self) -> int:
    """Candidates grown per round: k at level 1, k * k at each further level."""
    return int(self.top_k + (self.depth - 1) * self.top_k ** 2)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RowTree:
  """One tree per row, as arrays (node 0 the root; nodes in any order after it)."""

  parents: jax.Array  # [B, N] int32, -1 at the root
  depths: jax.Array  # [B, N] int32, 0 at the root
  ancestors: jax.Array  # [B, N, N] bool, [b, i, j]: j on the path root..i (i included)
  children: jax.Array  # [B, N, C] int32, each node's children in try order, -1 padded
  max_depth: int = dataclasses.field(metadata=dict(static=True))

  @property
  def num_nodes(self) -> int:
    """N, the root included."""
    return int(self.parents.shape[1])

  @classmethod
  def from_parents(cls, parents: jax.Array, depths: jax.Array, max_depth: int,
                   max_children: int) -> "RowTree":
    """The derived arrays from parents [B, N] (-1 at the root) and depths [B, N];
    a node has at most `max_children` children, tried in node order."""
    B, N = parents.shape
    up = jnp.maximum(parents, 0)
    eye = jnp.broadcast_to(jnp.eye(N, dtype=bool)[None], (B, N, N))
    anc, cur = eye, jnp.broadcast_to(jnp.arange(N, dtype=jnp.int32)[None], (B, N))
    for _ in range(max_depth):  # walk every node up one level at a time
      cur = jnp.take_along_axis(up, cur, axis=1)
      anc = anc | jnp.take_along_axis(eye, cur[:, :, None], axis=1)
    is_child = parents[:, None, :] == jnp.arange(N, dtype=jnp.int32)[None, :, None]  # [B, N, N]
    order = jnp.where(is_child, jnp.cumsum(is_child.astype(jnp.int32), axis=2), 0)  # 1-based
    slots = jnp.arange(1, max_children + 1, dtype=jnp.int32)[None, None, :, None]
    hit = order[:, :, None, :] == slots  # [B, N, C, N]
    children = jnp.where(jnp.any(hit, -1), jnp.argmax(hit, -1), -1).astype(jnp.int32)
    return cls(parents=parents.astype(jnp.int32), depths=depths.astype(jnp.int32),
               ancestors=anc, children=children, max_depth=max_depth)


def grow(budget: DynamicTree, root_scores: jax.Array, expand):
  """Grow and rerank one dynamic tree per row.

  root_scores [B, V]: the drafter's log-probabilities under the root (V: whatever ids
  it scores; tokens below are indices into that axis).
  expand(level, tokens [B, k], parents [B, k], state) -> (scores [B, k, V], state):
  feeds the k candidates chosen at `level` (1-based) to the drafter (`parents`: the
  position, among the k nodes of the previous `expand` call, of each one's parent;
  -1 at level 1, whose parent is the root) and returns its log-probabilities under
  each. `expand` is called D - 1 times in order; its state starts as None.
  Returns candidates [B, N-1] int32 (node i's token at i - 1), the `RowTree` and the
  last state `expand` returned (None when D = 1).
  """
  N, D, k = budget.num_nodes, budget.max_depth, budget.top_k
  B = root_scores.shape[0]
  value, token = lax.top_k(root_scores, k)  # [B, k] ties: lower id first
  tokens, values = [token], [value]
  parents = [jnp.full((B, k), -1, jnp.int32)]  # candidate index of each one's parent
  depths = [jnp.ones((B, k), jnp.int32)]
  level_start, level = 0, (token, value)
  state = None
  for d in range(2, D + 1):
    tok, val = level
    _, pick = lax.top_k(val, k)  # the k best of the level before
    chosen_tok = jnp.take_along_axis(tok, pick, axis=1)
    chosen_val = jnp.take_along_axis(val, pick, axis=1)
    # Level d-1's candidate c hangs under node c // k of the previous expansion.
    up = jnp.full_like(pick, -1) if d == 2 else pick // k
    scores, state = expand(d - 1, chosen_tok, up.astype(jnp.int32), state)
    child_val, child_tok = lax.top_k(scores, k)  # [B, k, k]
    val = (chosen_val[:, :, None] + child_val).reshape(B, k * k)
    tok = child_tok.reshape(B, k * k)
    parent = jnp.repeat(level_start + pick, k, axis=1)  # candidate index of the parent
    tokens.append(tok)
    values.append(val)
    parents.append(parent.astype(jnp.int32))
    depths.append(jnp.full((B, k * k), d, jnp.int32))
    level_start += tokens[-2].shape[1]
    level = (tok, val)
  tokens = jnp.concatenate(tokens, axis=1)  # [B, M]
  values = jnp.concatenate(values, axis=1)
  parents = jnp.concatenate(parents, axis=1)
  depths = jnp.concatenate(depths, axis=1)
  M = tokens.shape[1]
  # A child's value is its parent's plus a log-probability <= 0; the small penalty per
  # level makes it strictly lower even when that log-probability rounds to 0, so the
  # kept set always holds the kept nodes' parents.
  _, keep = lax.top_k(values - 1e-3 * depths.astype(values.dtype), N - 1)
  keep = jnp.sort(depths_key(depths, keep, M), axis=1) % M  # by depth, then candidate index
  node_of = jnp.zeros((B, M), jnp.int32).at[jnp.arange(B)[:, None], keep].set(
      jnp.arange(1, N, dtype=jnp.int32)[None, :])  # candidate -> node (0: not kept / root)
  cand_parent = jnp.take_along_axis(parents, keep, axis=1)  # [B, N-1]
  node_parent = jnp.where(cand_parent < 0, 0,
                          jnp.take_along_axis(node_of, jnp.maximum(cand_parent, 0), axis=1))
  row_parents = jnp.concatenate([jnp.full((B, 1), -1, jnp.int32), node_parent], axis=1)
  row_depths = jnp.concatenate([jnp.zeros((B, 1), jnp.int32),
                                jnp.take_along_axis(depths, keep, axis=1)], axis=1)
  tree = RowTree.from_parents(row_parents, row_depths, D, k)
  return jnp.take_along_axis(tokens, keep, axis=1).astype(jnp.int32), tree, state


def depths_key(depths: jax.Array, keep: jax.Array, M: int) -> jax.Array:
  """Sort key of kept candidates: depth-major, candidate index minor (key % M = index)."""
  return jnp.take_along_axis(depths, keep, axis=1) * M + keep
