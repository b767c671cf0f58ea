"""Draft trees: a static topology, exact acceptance over it, and K/V compaction.

A tree round verifies N candidate nodes in one target call instead of a chain of
K + 1 (SpecInfer, Miao et al. 2023; Medusa, Cai et al. 2024; EAGLE, Li et al.
2024). Node 0 is the root, the last committed token t(L-1); every other node is
one candidate token whose context is the path from the root to it:

    depth 0        root t(L-1)                    slot L-1
    depth 1        a(rank 0)     b(rank 1)        slots L, L+1
    depth 2        c  d          e                slots L+2 .. L+4   (c, d under a; e under b)

The block goes to slots L-1 .. L-2+N in node order, with `block_mask` = the
ancestor mask (a node sees the committed prefix, its ancestors and itself) and
`depth` = node depths (RoPE positions L-1 + depth). Acceptance picks one path;
afterwards the path's K/V sit at scattered slots (a, d above at L, L+3) and
`compact` gathers them to L, L+1, ... so the chain invariant of the decode state
holds again:

    before:  ... t(L-2) | root a b c d e        (accepted path: root, a, d)
    after:   ... t(L-2) | root a d . . .        (dots: scratch, never attended)

The topology is a compile-time constant (`Tree` is a frozen, hashable
dataclass): a new tree is a new program, never a new trace of the same one.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jspec.core import sampling


@dataclasses.dataclass(frozen=True)
class Tree:
  """A static draft tree.

  parents: parents[0] == -1 (the root); 0 <= parents[i] < i; nodes are ordered by
    depth, so each depth is a contiguous range of node indices.
  ranks: node i's token is the ranks[i]-th most likely token (0 = argmax) of the
    distribution the drafter uses for it (a Medusa head at that depth, the draft
    distribution at the parent for EAGLE or a draft model). Siblings have distinct
    ranks; ranks[0] == 0.
  """

  parents: tuple[int, ...]
  ranks: tuple[int, ...]

  def __post_init__(self):
    parents, ranks = tuple(int(p) for p in self.parents), tuple(int(r) for r in self.ranks)
    object.__setattr__(self, "parents", parents)
    object.__setattr__(self, "ranks", ranks)
    if not parents or parents[0] != -1:
      raise ValueError(f"a tree needs a root: parents[0] must be -1, got {parents[:1]}")
    if len(ranks) != len(parents):
      raise ValueError(f"parents ({len(parents)}) and ranks ({len(ranks)}) differ in length")
    if len(parents) < 2:
      raise ValueError("a tree needs at least one candidate node besides the root")
    depth = [0]
    seen = set()
    for i in range(1, len(parents)):
      p, r = parents[i], ranks[i]
      if not 0 <= p < i:
        raise ValueError(f"node {i}: parent {p} must lie in [0, {i})")
      if r < 0:
        raise ValueError(f"node {i}: rank {r} must be >= 0")
      if (p, r) in seen:
        raise ValueError(f"node {i}: parent {p} already has a child of rank {r}")
      seen.add((p, r))
      depth.append(depth[p] + 1)
      if depth[i] < depth[i - 1]:
        raise ValueError(f"nodes must be ordered by depth; node {i} (depth {depth[i]}) comes "
                         f"after a node of depth {depth[i - 1]}")

  # ------------------------------------------------------------------- builders

  @classmethod
  def chain(cls, num_drafts: int) -> "Tree":
    """K nodes in a line: the tree form of chain drafting (argmax at every depth)."""
    if num_drafts < 1:
      raise ValueError(f"a chain needs at least one draft, got {num_drafts}")
    return cls(parents=tuple(range(-1, num_drafts)), ranks=(0,) * (num_drafts + 1))

  @classmethod
  def from_paths(cls, paths) -> "Tree":
    """A tree from rank paths, Medusa's "choices" style: (0,) is the argmax at depth
    1, (0, 1) the second choice at depth 2 under it, and so on. Missing prefixes
    are added."""
    nodes = set()
    for path in paths:
      path = tuple(int(r) for r in path)
      if not path:
        raise ValueError("empty path: the root is implicit")
      for d in range(1, len(path) + 1):
        nodes.add(path[:d])
    order = sorted(nodes, key=lambda p: (len(p), p))
    index = {(): 0}
    parents, ranks = [-1], [0]
    for i, path in enumerate(order, start=1):
      index[path] = i
      parents.append(index[path[:-1]])
      ranks.append(path[-1])
    return cls(parents=tuple(parents), ranks=tuple(ranks))

  @classmethod
  def best_first(cls, accuracy, num_nodes: int) -> "Tree":
    """The `num_nodes`-node tree (root included) with the largest expected number
    of accepted tokens when the rank-r candidate at depth d is right with
    probability accuracy[d-1][r], independently: each node's value is the product
    along its path, and best-first expansion picks the most valuable nodes
    (Sequoia, Chen et al. 2024, solves the same problem exactly; this is its greedy
    form). Measured per-head top-k accuracies make a good `accuracy` table."""
    acc = np.asarray(accuracy, np.float64)
    if acc.ndim != 2 or acc.size == 0:
      raise ValueError(f"accuracy must be [depth, ranks], got shape {acc.shape}")
    if np.any(acc < 0) or np.any(acc > 1):
      raise ValueError("accuracy entries must lie in [0, 1]")
    if num_nodes < 2:
      raise ValueError(f"num_nodes must be >= 2 (the root and one candidate), got {num_nodes}")
    depth_max, width = acc.shape
    heap = [(-acc[0, r], (r,)) for r in range(width)]
    heapq.heapify(heap)
    chosen = []
    while heap and len(chosen) < num_nodes - 1:
      neg, path = heapq.heappop(heap)
      chosen.append(path)
      if len(path) < depth_max:
        for r in range(width):
          heapq.heappush(heap, (neg * acc[len(path), r], path + (r,)))
    return cls.from_paths(chosen)

  # ------------------------------------------------------------------- derived

  @property
  def num_nodes(self) -> int:
    """N, the root included: the width of the verify block."""
    return len(self.parents)

  @functools.cached_property
  def depths(self) -> np.ndarray:
    """int32 [N]: 0 for the root."""
    d = np.zeros(self.num_nodes, np.int32)
    for i in range(1, self.num_nodes):
      d[i] = d[self.parents[i]] + 1
    return d

  @property
  def max_depth(self) -> int:
    """The longest path in candidates: at most this many drafts are accepted."""
    return int(self.depths[-1])

  @functools.cached_property
  def ancestors(self) -> np.ndarray:
    """bool [N, N]: ancestors[i, j] is True when j is on the path root..i (i included)."""
    a = np.eye(self.num_nodes, dtype=bool)
    for i in range(1, self.num_nodes):
      a[i] |= a[self.parents[i]]
    return a

  @functools.cached_property
  def children(self) -> np.ndarray:
    """int32 [N, C]: each node's children in rank order, -1 padded (C >= 1)."""
    kids = [[] for _ in range(self.num_nodes)]
    for i in range(1, self.num_nodes):
      kids[self.parents[i]].append(i)
    kids = [sorted(k, key=lambda i: self.ranks[i]) for k in kids]
    width = max(1, max(len(k) for k in kids))
    out = np.full((self.num_nodes, width), -1, np.int32)
    for i, k in enumerate(kids):
      out[i, :len(k)] = k
    return out

  @property
  def level_slices(self) -> tuple[tuple[int, int], ...]:
    """(start, stop) node range of each depth 0..max_depth."""
    d = self.depths
    return tuple((int(np.searchsorted(d, k)), int(np.searchsorted(d, k, side="right")))
                 for k in range(self.max_depth + 1))

  def expected_length(self, accuracy) -> float:
    """Expected tokens per round (accepted drafts + 1) under the independence model
    of `best_first`."""
    acc = np.asarray(accuracy, np.float64)
    value = np.ones(self.num_nodes)
    for i in range(1, self.num_nodes):
      d, r = self.depths[i], self.ranks[i]
      a = acc[d - 1, r] if d - 1 < acc.shape[0] and r < acc.shape[1] else 0.0
      value[i] = value[self.parents[i]] * a
    return float(value.sum())


def with_side(tree: Tree, side: Tree) -> tuple[np.ndarray, np.ndarray]:
  """The verify block of a tree plus a side branch under the same root (a
  `BranchDrafter`'s): bool [N+M, N+M] visibility and int32 [N+M] depths, side node i
  (i >= 1) at block index N-1+i. Side nodes see the root and their own ancestors;
  tree nodes never see side nodes, so the tree's logits are what they would be alone.
  """
  N, M = tree.num_nodes, side.num_nodes - 1
  mask = np.zeros((N + M, N + M), bool)
  mask[:N, :N] = tree.ancestors
  index = np.concatenate([[0], np.arange(N, N + M)])  # side node -> block index
  mask[np.ix_(index[1:], index)] = side.ancestors[1:]
  depths = np.concatenate([tree.depths, side.depths[1:]]).astype(np.int32)
  return mask, depths


# ----------------------------------------------------------------------------- ranking


def top_ranked(logits: jax.Array, count: int) -> jax.Array:
  """The `count` most likely token ids, best first: logits [..., V] -> int32 [..., count].

  What tree drafters use to turn ranks into tokens. Ties go to the lowest id, as in
  `sampling.greedy_tokens`, so rank 0 is always the argmax. For the few ranks a
  tree asks for this takes `count` argmax passes: `lax.top_k` lowers to a full
  sort of each row on XLA CPU, measured at several times a whole target step per
  call at V = 8192.
  """
  ids = []
  masked = logits
  for _ in range(count):
    best = sampling.greedy_tokens(masked)
    ids.append(best)
    ids_v = jnp.arange(logits.shape[-1], dtype=jnp.int32).reshape((1,) * best.ndim + (-1,))
    hit = ids_v == best[..., None]
    masked = jnp.where(hit, -jnp.inf, masked)
  return jnp.stack(ids, axis=-1)


# ----------------------------------------------------------------------------- acceptance


def row_arrays(tree, batch: int):
  """parents [B, N], depths [B, N], ancestors [B, N, N] and children [B, N, C] of a
  static `Tree` (the same for every row) or of a per-row `dynamic_tree.RowTree`."""
  if isinstance(tree, Tree):
    def rows(x):
      x = jnp.asarray(x)
      return jnp.broadcast_to(x[None], (batch,) + x.shape)

    return (rows(np.asarray(tree.parents, np.int32)), rows(tree.depths),
            rows(tree.ancestors), rows(tree.children))
  return tree.parents, tree.depths, tree.ancestors, tree.children


def accept_greedy(logits: jax.Array, candidates: jax.Array, tree):
  """Deepest node whose whole path matches the target's argmax.

  logits [B, N, V], candidates [B, N-1] int32 (node i's token at i-1), tree a `Tree`
  or a `RowTree` -> node [B] int32 accepted node, next_token [B] int32 the argmax
  after it. Equal depths go to the lower node index.
  """
  B, N = logits.shape[:2]
  g = sampling.greedy_tokens(logits)  # [B, N]
  parents, depths, anc, _ = row_arrays(tree, B)
  match = candidates == jnp.take_along_axis(g, jnp.maximum(parents[:, 1:], 0), axis=1)
  ok = jnp.concatenate([jnp.ones_like(match[:, :1]), match], axis=1)  # [B, N]
  path_ok = jnp.all(jnp.where(anc, ok[:, None, :], True), axis=-1)  # [B, N]
  score = depths * N - jnp.arange(N, dtype=jnp.int32)[None, :]  # deeper first
  node = jnp.argmax(jnp.where(path_ok, score, -N), axis=1).astype(jnp.int32)
  return node, jnp.take_along_axis(g, node[:, None], axis=1)[:, 0]


def accept_sampled(p: jax.Array, candidates: jax.Array, tree, keys: jax.Array):
  """Exact acceptance of deterministic candidates (SpecInfer, Miao et al. 2023).

  Walk down from the root. At a node, p' starts as the target distribution there;
  its children are tried in rank order, child c accepted with probability p'(c);
  a rejected child's token is removed from p' (zeroed, renormalised). An accepted
  child becomes the current node; when every child is rejected (or there are
  none) the next token is drawn from p'. Each step asks "is the target's token
  this candidate?" with the right conditional probability, so the emitted tokens
  follow p exactly, whichever candidates were proposed.

  p [B, N, V] processed target distributions, candidates [B, N-1] int32, tree a
  `Tree` or a `RowTree`, keys [B] -> node [B] int32 accepted node, next_token [B] int32.
  """
  B, N, V = p.shape
  u_keys, r_keys = sampling.split_rows(keys)
  u = jax.vmap(lambda k: jax.random.uniform(k, (N,), jnp.float32))(u_keys)  # [B, N] one per node
  tokens = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), candidates.astype(jnp.int32)], axis=1)
  children = row_arrays(tree, B)[3]  # [B, N, C]
  ids = jnp.arange(V, dtype=jnp.int32)[None, :]
  rows = jnp.arange(B)

  node = jnp.zeros((B,), jnp.int32)
  walking = jnp.ones((B,), bool)
  final = p[:, 0]
  # Python loops: depth and child slots are static and small.
  for _ in range(tree.max_depth + 1):
    dist = p[rows, node]  # [B, V] p' at the current node
    chosen = jnp.full((B,), -1, jnp.int32)
    for c in range(children.shape[1]):
      kid = children[rows, node, c]  # [B]
      trying = walking & (kid >= 0) & (chosen < 0)
      tok = tokens[rows, jnp.maximum(kid, 0)]
      prob = dist[rows, tok]
      hit = trying & (u[rows, jnp.maximum(kid, 0)] < prob)
      chosen = jnp.where(hit, kid, chosen)
      miss = trying & ~hit
      removed = jnp.where(ids == tok[:, None], 0.0, dist)
      mass = jnp.sum(removed, axis=-1, keepdims=True)
      removed = removed / jnp.where(mass > 0.0, mass, 1.0)
      dist = jnp.where(miss[:, None] & (mass > 0.0), removed, dist)
    stop = walking & (chosen < 0)
    final = jnp.where(stop[:, None], dist, final)
    walking = walking & ~stop
    node = jnp.where(chosen >= 0, chosen, node)
  return node, sampling.sample(r_keys, final)


def path_nodes(node: jax.Array, tree) -> jax.Array:
  """The accepted path as node indices by depth: node [B] -> int32 [B, D+1].

  Entry d is the ancestor of `node` at depth d; past the node's own depth it is d
  itself (a no-op for `compact`)."""
  D = tree.max_depth
  _, depths, ancestors, _ = row_arrays(tree, node.shape[0])
  anc = jnp.take_along_axis(ancestors, node[:, None, None], axis=1)[:, 0]  # [B, N]
  at_depth = depths[:, None, :] == jnp.arange(D + 1)[None, :, None]  # [B, D+1, N]
  hits = anc[:, None, :] & at_depth  # [B, D+1, N]
  first = jnp.argmax(hits, axis=-1).astype(jnp.int32)
  return jnp.where(jnp.any(hits, axis=-1), first, jnp.arange(D + 1, dtype=jnp.int32)[None, :])


# ----------------------------------------------------------------------------- compaction


def compact(cache, cache_axes, start: jax.Array, path: jax.Array, num_nodes: int):
  """Move the accepted path's K/V to contiguous slots, per row.

  cache: the target's K/V pytree; cache_axes: the same tree of logical axis-name
  tuples (the model's `axes_fn`), which must name "batch" and "sequence";
  start [B]: the slot of the root; path [B, D+1] from `path_nodes`. Slot
  start + d receives what slot start + path[d] held, for d = 0..D. Only a
  (D+1)-slot window per row is rewritten; the rest of the cache is untouched.
  """

  def one_leaf(leaf, axes):
    if leaf is None:
      return leaf
    if "batch" not in axes or "sequence" not in axes:
      raise ValueError(f"cache axes {axes} must name 'batch' and 'sequence' for tree decoding")
    b_ax, s_ax = axes.index("batch"), axes.index("sequence")
    s_row = s_ax - (1 if b_ax < s_ax else 0)  # the slot axis once vmap drops the batch axis

    def row(buf, s, idx):
      window = lax.dynamic_slice_in_dim(buf, s, num_nodes, axis=s_row)
      moved = jnp.take(window, idx, axis=s_row)
      return lax.dynamic_update_slice_in_dim(buf, moved, s, axis=s_row)

    return jax.vmap(row, in_axes=(b_ax, 0, 0), out_axes=b_ax)(leaf, start, path)

  return jax.tree_util.tree_map(one_leaf, cache, cache_axes,
                                is_leaf=lambda x: isinstance(x, tuple) or x is None)
