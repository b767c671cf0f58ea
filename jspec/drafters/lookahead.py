"""Lookahead decoding: the target drafts for itself by Jacobi iteration (Fu et al. 2024,
"Break the Sequential Dependency of LLM Inference Using Lookahead Decoding").

No draft model and no training. Each round's one target call carries two branches
beside the root t(L-1) (the last committed token):

  * the verification branch: G candidate n-grams that start with t(L-1), taken
    from an n-gram pool, verified as G chains of D = min(K, n - 1) tokens (an
    ordinary `jspec.Tree`, accepted by the exact tree rule);
  * the lookahead branch: a window of W columns by n - 1 levels of guesses for
    the tokens after t(L-1), whose outputs the target computes for the drafter
    only (a side branch: never accepted, K/V left in scratch slots).

The lookahead branch, for W = 4 columns and n = 4 (levels 0..2); a token sees the
committed prefix and the path above it, and sits at the position after it:

    root t(L-1)
     |-- a0 -- a1 -- a2                level 0: one chain (W - 1 tokens)
     |    |     |     |
     b0   b1    b2    b3               level 1: column i hangs under a(i-1) (b0 under the root)
     |    |     |     |
     c0   c1    c2    c3               level 2 (top): the target's argmax at c_i is new_i

Each column is a Jacobi trajectory: after the round, the n-gram
(a(i-1), b_i, c_i, new_i) (the root in place of a(-1)) goes into the pool, and
the window moves down a level: level 0 takes level 1 shifted left by one, each
level takes the one above, the top takes new, all shifted further left by the
round's accepted drafts so that every guess keeps its position in the text. Tokens
shifted in at the right end are old guesses (filler, as in the reference
implementation, which fills with random tokens). The pool also takes every n-gram
of the prompt and of the committed output, so copying is found as well.

Exactness: candidates are a function of earlier rounds only (the pool and the
window are built from committed tokens and earlier argmaxes), so the tree rule
with deterministic candidates keeps the target's distribution at any temperature,
and greedy output equals the target's. Guesses are argmaxes whatever the sampling
settings, as in the reference implementation.

Costs: the block is 1 + G*D + (W - 1) + W*(n - 2) tokens. On an accelerator a block
of tens of tokens costs about one step (the published 1.5-2x comes from that);
on a CPU where several rows cost several times one row (docs/benchmarks.md), small
windows are the only ones that can pay.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp

from jspec.core.drafter import DraftContext
from jspec.core.tree import Tree
from jspec.drafters import ngram_pool
from jspec.drafters.ngram_pool import NGramPool


def _static(default=dataclasses.MISSING):
  return dataclasses.field(default=default, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LookaheadState:
  """The drafter's state per row, carried by the decode state."""

  window: jax.Array  # [B, n-1, W] int32 guesses; level 0 uses columns 0..W-2
  pool: NGramPool  # n-grams keyed by first token: G = n - 1 tokens each
  seen: jax.Array  # [B] int32 committed tokens whose n-grams are pooled
  rounds: jax.Array  # [B] int32 rounds observed (the window fills over n - 3 rounds)


@functools.lru_cache(maxsize=None)
def _side(window: int, ngram: int) -> tuple[Tree, tuple[tuple[int, int], ...]]:
  """The lookahead branch as a tree under the root, and the (level, column) of each
  non-root node in node order."""
  cells = [((0, i), (0, i - 1) if i else None, i + 1) for i in range(window - 1)]
  for i in range(window):
    for lv in range(1, ngram - 1):
      parent = (lv - 1, i) if lv >= 2 else ((0, i - 1) if i else None)
      cells.append(((lv, i), parent, i + lv))
  cells.sort(key=lambda c: c[2])  # stable: by depth, so parents come first
  index, kids = {None: 0}, collections.Counter()
  parents, ranks = [-1], [0]
  for j, (cell, parent, _) in enumerate(cells, start=1):
    index[cell] = j
    parents.append(index[parent])
    ranks.append(kids[parent])  # siblings in order
    kids[parent] += 1
  return Tree(parents=tuple(parents), ranks=tuple(ranks)), tuple(c[0] for c in cells)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Lookahead:
  """Lookahead (Jacobi) decoding as a drafter: pass it as `draft=` with a K.

  window: W, the columns of the lookahead branch (guessed positions per round).
  ngram: n >= 3, the n-gram length: n - 1 levels of guesses, candidates of n - 1
    tokens (cut to K when K is smaller).
  guesses: G, the candidate n-grams verified per round.
  pool_size: P, the n-grams kept per row (prompt, output and lookahead ones).
  """

  vocab_size: int = _static()
  window: int = _static(4)
  ngram: int = _static(3)
  guesses: int = _static(3)
  pool_size: int = _static(512)

  def __post_init__(self):
    for name, low in (("window", 1), ("ngram", 3), ("guesses", 1), ("pool_size", 2)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"Lookahead {name} must be an integer >= {low}, got {value!r}")

  # ------------------------------------------------------------------ shapes

  def verify_tree(self, num_drafts: int) -> Tree:
    """G chains of D = min(K, n - 1) candidates under the root."""
    depth = min(int(num_drafts), self.ngram - 1)
    return Tree.from_paths([(g,) + (0,) * (depth - 1) for g in range(self.guesses)])

  def side_tree(self) -> Tree:
    """The lookahead branch (see the module docstring): (W - 1) + W*(n - 2) nodes."""
    return _side(self.window, self.ngram)[0]

  # ------------------------------------------------------------------ the protocol

  def init(self, tokens, prompt_lengths, cache_length):
    """The pool holds the prompt's n-grams; the window starts from prompt tokens."""
    del cache_length
    tokens = tokens.astype(jnp.int32)
    B, P = tokens.shape
    n, W = self.ngram, self.window
    lengths = prompt_lengths.astype(jnp.int32)
    starts = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32)[None, :], (B, P))
    valid = starts + n - 1 < lengths[:, None]
    keys, grams, valid = ngram_pool.ngrams_of(tokens, starts, n - 1, valid)
    pool = ngram_pool.insert(NGramPool.empty(B, self.pool_size, n - 1), keys, grams, valid)
    # Any tokens will do as first guesses; recent prompt tokens are cheap and varied.
    cell = jnp.arange((n - 1) * W, dtype=jnp.int32).reshape(1, n - 1, W)
    pos = lengths[:, None, None] - 1 - cell % lengths[:, None, None]
    window = jax.vmap(lambda row, p: row[p])(tokens, pos)
    return LookaheadState(window=window, pool=pool, seen=lengths,
                          rounds=jnp.zeros((B,), jnp.int32))

  def propose(self, state, context: DraftContext, num_drafts, params, keys):
    """Not a chain drafter: the loop calls `propose_tree` and the side-branch methods."""
    raise TypeError("Lookahead drafts a tree with a side branch; speculative_generate "
                    "builds it from num_draft_tokens")

  def propose_tree(self, state: LookaheadState, context: DraftContext, tree: Tree, params, keys):
    """Pool the newly committed n-grams, then verify the newest G that start with
    t(L-1); missing ones are the window's level-0 chain (the Jacobi guess itself)."""
    del params, keys
    G = self.guesses
    D = tree.max_depth
    if tree != self.verify_tree(D):
      raise ValueError("Lookahead verifies its own tree (Lookahead.verify_tree); do not pass tree=")
    n = self.ngram
    L = context.lengths
    ends = state.seen[:, None] + jnp.arange(D + 1, dtype=jnp.int32)[None, :]  # [B, D+1]
    valid = (ends <= L[:, None] - 1) & (ends - (n - 1) >= 0)
    keys_, grams, valid = ngram_pool.ngrams_of(context.tokens, ends - (n - 1), n - 1, valid)
    pool = ngram_pool.insert(state.pool, keys_, grams, valid)
    last = jnp.take_along_axis(context.tokens, (L - 1)[:, None], axis=1)[:, 0]
    found_grams, found = ngram_pool.newest(pool, last, G)  # [B, G, n-1]
    guess = jnp.pad(state.window[:, 0], ((0, 0), (0, max(0, D - self.window))),
                    mode="edge")[:, :D]  # [B, D] level 0, the Jacobi guess
    chains = jnp.where(found[..., None], found_grams[:, :, :D], guess[:, None, :])  # [B, G, D]
    # from_paths orders nodes depth-major, then by chain: node 1 + d*G + g.
    candidates = jnp.transpose(chains, (0, 2, 1)).reshape(chains.shape[0], D * G)
    return candidates, dataclasses.replace(state, pool=pool, seen=L)

  def side_tokens(self, state: LookaheadState) -> jax.Array:
    """[B, M] the lookahead branch's tokens in `side_tree` node order."""
    cells = _side(self.window, self.ngram)[1]
    levels = jnp.asarray([c[0] for c in cells], jnp.int32)
    cols = jnp.asarray([c[1] for c in cells], jnp.int32)
    return state.window[:, levels, cols]

  def after_verify(self, state: LookaheadState, context: DraftContext, predictions: jax.Array,
                   accepted: jax.Array) -> LookaheadState:
    """Take in the target's argmax at each side node (predictions [B, M]): pool the
    columns' n-grams and move the window down a level and left by 1 + accepted."""
    cells = _side(self.window, self.ngram)[1]
    n, W = self.ngram, self.window
    top = n - 2
    top_nodes = jnp.asarray([cells.index((top, i)) for i in range(W)], jnp.int32)
    new = predictions[:, top_nodes]  # [B, W]
    window = state.window
    L = context.lengths
    root = jnp.take_along_axis(context.tokens, (L - 1)[:, None], axis=1)  # [B, 1]
    keys = jnp.concatenate([root, window[:, 0, :W - 1]], axis=1)  # [B, W]: a(i-1)
    grams = jnp.concatenate([jnp.transpose(window[:, 1:, :], (0, 2, 1)), new[:, :, None]],
                            axis=2)  # [B, W, n-1]
    ready = (state.rounds >= n - 3)[:, None] & jnp.ones((1, W), bool)
    pool = ngram_pool.insert(state.pool, keys, grams, ready)
    col = jnp.arange(W, dtype=jnp.int32)[None, :]
    shift = lambda row, by: jnp.take_along_axis(row, (col + by[:, None]) % W, axis=1)
    a = accepted.astype(jnp.int32)
    levels = [shift(window[:, 1], a + 1)]
    levels += [shift(window[:, lv + 1], a) for lv in range(1, top)]
    levels.append(shift(new, a))
    return dataclasses.replace(state, window=jnp.stack(levels, axis=1), pool=pool,
                               rounds=state.rounds + 1)
