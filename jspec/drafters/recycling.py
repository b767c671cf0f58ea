"""Token recycling: draft from the target's own runner-up tokens of earlier verifies
(Luo et al. 2025, "Turning Trash into Treasure: Accelerating Inference of Large Language
Models with Token Recycling", ACL).

Every verify computes the target's whole next-token distribution at every position it
feeds, and decoding keeps one token of it. Token recycling keeps more: an adjacency
matrix with, for every token id v, the ids of the k largest logits the target gave the
last time v was verified:

    adjacency   [V, k] int32   row v: the target's top-k next tokens after v, best
                               first, from the latest verify whose accepted path
                               held v; -1: v never verified (it starts all -1)
    update      after each round, for every verified position j on the accepted path
                (the root t(L-1) and the accepted drafts; `update="all"`: every
                verified position, as the reference implementation does),
                row block[j] := top-k ids of the logits at j
    prompt      after the prefill, from the prompt's slots 0..L-2 (the prefill computes
                their logits anyway), the latest slot holding a token writing its row:
                "context" (the default): row := the token that followed it in the
                prompt, then the top-k ids at that slot without it (k in all), so the
                drafts follow text the answer copies from its prompt (a translation
                restating its source, a second turn quoting the first answer);
                "logits": rows still -1 := the top-k ids at that slot, rows a verify
                wrote in an earlier call kept; "none": nothing (the paper: rows stay
                empty until a verify writes them). Both warm starts are not in the paper
    drafts      from the last committed token t(L-1), breadth first: a node's child
                of rank r is adjacency[node, r]. A chain follows rank 0; a tree takes
                its static shape (`paper_tree()`: the paper's 80 nodes, depth 6)

A node whose row is -1 (never verified), and every node under it, holds the placeholder
t(L-1), like the lookup drafters' positions past their matches: verified like any draft,
sometimes accepted by chance. Rows start at -1 rather than at the reference code's
zeros, so an untouched row proposes nothing in particular instead of token 0.

The engine computes the top-k ids inside the verify and the prefill for this drafter
alone (the `LogitsObservingDrafter` and `PromptObservingDrafter` protocols of
`jspec.core.drafter`: k is static, other drafters pay nothing; the prefill then computes
the LM head at every prompt slot, about a quarter more prefill work on SmolLM2-135M)
from the model's own logits, before any constraint, bias, penalty or sampling setting,
so the matrix describes the target and serves every later call alike. One matrix
serves the whole batch: rows learn from each other's verifies. Where several positions
of a round write the same row, one on the accepted path wins over one off it
(`update="all"`), then the later batch row, then, within a row, the later position.

Memory across calls: the matrix is the drafter's state, updated inside the loop, and
the call hands back the final one as `out.memory` (the `RememberingDrafter` protocol).
Give it to the next call's drafter, `TokenRecycling(V, memory=out.memory)`: a traced
field, so the same shape reuses the compiled program. Where `jspec.Suffix`'s memory is
built by the caller from outputs (`remember`), this one can only be built from logits,
so it comes back from the program.

Exactness: the drafts are a function of the committed tokens and of earlier verifies,
drawn from nothing random, so q is one-hot at each draft (`propose` returns q = None)
and the acceptance rule keeps the target's distribution at every temperature. The matrix
is shared by the batch, so a sampled row's drafts, and with them which random numbers
it spends, depend on its batch-mates: each row still follows the target's distribution
exactly, but its sampled tokens for a given seed are not independent of the batch as
with the other drafters (greedy rows are the target's own argmax, as always).
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core.drafter import DraftContext
from jspec.core.tree import Tree
from jspec.drafters import ngram

# The reference implementation's default tree ("2.2.2", 80 candidates in 6 levels:
# 8, 21, 25, 15, 8, 3) as rank paths, and its default k (`output_id_topk`).
PAPER_TOP_K = 8
_PAPER_PATHS = (
    [(r,) for r in range(8)]
    + [(0, r) for r in range(8)] + [(1, r) for r in range(4)] + [(2, r) for r in range(3)]
    + [(3, 0), (3, 1), (4, 0), (5, 0), (6, 0), (7, 0)]
    + [(0, 0, r) for r in range(8)] + [(0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0), (0, 2, 1),
                                       (0, 3, 0), (0, 4, 0), (0, 5, 0), (0, 6, 0), (0, 7, 0),
                                       (1, 0, 0), (1, 0, 1), (1, 1, 0), (2, 0, 0), (3, 0, 0),
                                       (4, 0, 0), (5, 0, 0)]
    + [(0, 0, 0, r) for r in range(5)] + [(0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 2, 0),
                                          (0, 0, 3, 0), (0, 0, 4, 0), (0, 1, 0, 0),
                                          (0, 2, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0),
                                          (3, 0, 0, 0)]
    + [(0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 2, 0),
       (0, 0, 1, 0, 0), (0, 1, 0, 0, 0), (1, 0, 0, 0, 0)]
    + [(0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (0, 0, 0, 1, 0, 0)])

UPDATES = ("path", "all")
PROMPTS = ("none", "logits", "context")


def paper_tree() -> Tree:
  """The static tree of the paper's reference implementation: 81 nodes (root included),
  depth 6, ranks up to 7 (needs top_k >= 8)."""
  return Tree.from_paths(_PAPER_PATHS)


def _static(default=dataclasses.MISSING):
  return dataclasses.field(default=default, metadata=dict(static=True))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenRecycling:
  """Drafts from an adjacency matrix of the target's top-k next tokens per token id,
  learnt from every verify (module docstring). Chains and static trees."""

  vocab_size: int = _static()
  memory: jax.Array | None = None  # [V, top_k] int32, traced; None: every row -1
  top_k: int = _static(PAPER_TOP_K)  # k: next-token ids kept per token id
  update: str = _static("path")  # "path": the accepted path's positions; "all": every one
  prompt: str = _static("context")  # what the prefill writes: PROMPTS, module docstring

  def __post_init__(self):
    V, k = self.vocab_size, self.top_k
    if isinstance(V, bool) or not isinstance(V, numbers.Integral) or V < 1:
      raise ValueError(f"vocab_size must be an integer >= 1, got {V!r}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= V:
      raise ValueError(f"top_k must be an integer in 1..vocab_size ({V}), got {k!r}")
    if self.update not in UPDATES:
      raise ValueError(f"update must be one of {UPDATES}, got {self.update!r}")
    if self.prompt not in PROMPTS:
      raise ValueError(f"prompt must be one of {PROMPTS}, got {self.prompt!r}")
    memory = self.memory
    if isinstance(memory, (list, tuple, numbers.Number)):
      raise TypeError(f"memory must be an integer array [vocab_size, top_k] (a call's "
                      f"out.memory), got {type(memory).__name__}")
    if not hasattr(memory, "shape"):  # None, or what pytree utilities rebuild it with
      return
    if tuple(memory.shape) != (V, k):
      raise ValueError(f"memory has shape {tuple(memory.shape)}, but this drafter keeps "
                       f"[vocab_size, top_k] = {(V, k)}: give the out.memory of a call with "
                       f"the same target vocabulary and top_k")
    if not jnp.issubdtype(memory.dtype, jnp.integer):
      raise ValueError(f"memory must hold integer token ids, got dtype {memory.dtype}")

  @staticmethod
  def paper_tree() -> Tree:
    """`paper_tree()`: the reference implementation's static tree."""
    return paper_tree()

  # ---------------------------------------------------------------- protocols

  @property
  def observed_top_k(self) -> int:
    """`LogitsObservingDrafter`: the engine gives `after_verify_logits` this many ids."""
    return self.top_k

  def init(self, tokens, prompt_lengths, cache_length: int) -> jax.Array:
    """`Drafter.init`: the state is the matrix [V, k] int32, from `memory` or all -1."""
    del tokens, prompt_lengths, cache_length
    if self.memory is None:
      return jnp.full((self.vocab_size, self.top_k), -1, jnp.int32)
    return jnp.asarray(self.memory).astype(jnp.int32)

  def propose(self, state: jax.Array, context: DraftContext, num_drafts: int, params, keys):
    """`Drafter.propose`: K drafts along rank 0 from t(L-1); q None (one-hot)."""
    del params, keys  # deterministic: the same drafts at every temperature
    placeholder = ngram.last_token(context.tokens, context.lengths)  # [B]
    token, known = placeholder, jnp.ones_like(placeholder, bool)
    drafts = []
    for _ in range(num_drafts):
      token, known = self._child(state, token, known, 0, placeholder)
      drafts.append(token)
    return jnp.stack(drafts, axis=1), None, state  # [B, K]

  def check_tree(self, tree: Tree) -> None:
    """`TreeCheckingDrafter`: every node's rank must be below top_k (the matrix keeps that
    many ids per token)."""
    top = int(np.asarray(tree.ranks).max())
    if top >= self.top_k:
      raise ValueError(f"the tree has candidates of rank {top}, but the matrix keeps top_k = "
                       f"{self.top_k} ids per token: use TokenRecycling(top_k={top + 1}) or a "
                       f"narrower tree")

  def propose_tree(self, state: jax.Array, context: DraftContext, tree: Tree, params, keys):
    """`TreeDrafter.propose_tree`: node i = adjacency[its parent's token, ranks[i]],
    expanded level by level from t(L-1); candidates [B, N-1], state unchanged."""
    del params, keys
    self.check_tree(tree)  # (the planner asked already; direct callers of the engine too)
    parents, ranks = np.asarray(tree.parents), np.asarray(tree.ranks)
    placeholder = ngram.last_token(context.tokens, context.lengths)  # [B]
    tokens, known = [placeholder[:, None]], [jnp.ones((placeholder.shape[0], 1), bool)]
    for start, stop in tree.level_slices[1:]:
      above_tokens = jnp.concatenate(tokens, axis=1)  # [B, start]
      above_known = jnp.concatenate(known, axis=1)
      p = parents[start:stop]
      level, ok = self._child(state, above_tokens[:, p], above_known[:, p],
                              ranks[start:stop][None, :], placeholder[:, None])
      tokens.append(level)
      known.append(ok)
    return jnp.concatenate(tokens[1:], axis=1), state  # [B, N-1]

  def after_verify_logits(self, state: jax.Array, block: jax.Array, top_ids: jax.Array,
                          on_path: jax.Array) -> jax.Array:
    """`LogitsObservingDrafter`: row block[b, j] := top_ids[b, j] for the positions
    `update` names, one writer per row (module docstring)."""
    committed = on_path.reshape(-1)
    order = jnp.arange(committed.shape[0], dtype=jnp.int32)  # row-major: later wins
    if self.update == "path":
      writes, priority = committed, order
    else:  # every position; one on the accepted path over one off it
      writes = jnp.ones_like(committed)
      priority = order + jnp.where(committed, committed.shape[0], 0)
    return self._write(state, block, top_ids, writes, priority)

  def after_prefill_logits(self, state: jax.Array, tokens: jax.Array, top_ids: jax.Array,
                           valid: jax.Array) -> jax.Array:
    """`PromptObservingDrafter`: the prompt's rows (module docstring). tokens [B, P],
    top_ids and valid [B, P-1]: slot j's logits, whose successor is tokens[:, j+1]."""
    if self.prompt == "none":
      return state
    here = tokens[:, :-1].astype(jnp.int32)  # [B, P-1]
    order = jnp.arange(here.size, dtype=jnp.int32)  # row-major: the later slot wins
    if self.prompt == "logits":
      writes = valid.reshape(-1) & (state[here.reshape(-1), 0] < 0)
      return self._write(state, here, top_ids, writes, order)
    # "context": the token that followed, then the target's own top-k without it.
    successor = tokens[:, 1:].astype(jnp.int32)[..., None]  # [B, P-1, 1]
    top = top_ids.astype(jnp.int32)
    candidates = jnp.concatenate([successor, top], axis=-1)  # [B, P-1, k+1]
    keep = jnp.concatenate([jnp.ones_like(successor, bool), top != successor], axis=-1)
    slot = jnp.arange(self.top_k + 1, dtype=jnp.int32)
    first = jnp.argsort(jnp.where(keep, slot, slot + self.top_k + 1), axis=-1)[..., :self.top_k]
    rows = jnp.take_along_axis(candidates, first, axis=-1)  # [B, P-1, k]
    return self._write(state, here, rows, valid.reshape(-1), order)

  def remembered(self, state: jax.Array | None) -> jax.Array:
    """`RememberingDrafter`: the matrix after the call ([V, k] int32, `out.memory`); the
    one it started from when it never ran."""
    if state is None:
      return self.init(None, None, 0)
    return state

  # ---------------------------------------------------------------- helpers

  def _write(self, state, tokens, top_ids, writes, priority):
    """state with row tokens[i] := top_ids[i] wherever writes[i], the highest priority
    winning where several write one row: tokens [B, W], top_ids [B, W, k], writes and
    priority [B*W] (row-major)."""
    flat = tokens.reshape(-1).astype(jnp.int32)
    priority = jnp.where(writes, priority, -1)
    winner = jnp.full((self.vocab_size,), -1, jnp.int32).at[flat].max(priority)
    mine = writes & (winner[flat] == priority)
    rows = jnp.where(mine, flat, self.vocab_size)  # out of range: dropped
    return state.at[rows].set(top_ids.reshape(flat.shape[0], -1).astype(jnp.int32), mode="drop")

  def _child(self, adjacency, parent, known, rank, placeholder):
    """(token, known): adjacency[parent, rank] where the parent is known and its row
    holds an id, else the placeholder (and unknown, so its subtree is placeholders too).
    Ids outside 0..V-1 in a given memory count as unknown."""
    nxt = adjacency[parent, rank]
    ok = known & (nxt >= 0) & (nxt < self.vocab_size)
    return jnp.where(ok, nxt, placeholder).astype(jnp.int32), ok
