"""The drafter protocol: what the decode loop asks of anything that proposes drafts.

A drafter is a pytree (its params are leaves, its settings static) with:

    vocab_size: int
    init(tokens, prompt_lengths, cache_length) -> state
        tokens [B, P] int32 right-padded prompts, prompt_lengths [B];
        builds whatever per-row state the drafter keeps (a KV cache, ...).
    propose(state, context, num_drafts, params, keys) -> (drafts, q, state)
        context: `DraftContext` (committed token buffer and lengths);
        params: per-row `SamplingParams`, or None when every row is greedy
        (static; `sampling.probabilities(logits, None)` is the one-hot argmax);
        keys: [B] typed PRNG keys for this round's draws;
        drafts [B, K] int32 and q [B, K, V] f32, the processed distribution
        each draft was drawn from, so that exact acceptance holds at every
        temperature. q may be None, meaning one-hot at the drafts: what a
        deterministic drafter (greedy draft model, n-gram lookup) should return,
        since acceptance then needs no [B, K, V] array. With params None the
        loop accepts by argmax and ignores q.

Optional abilities, each an explicit protocol below. A drafter declares an ability by
having its members; the loop and the planner tell them apart with `isinstance` on
these protocols and probe nothing else, so a user's drafter gets exactly the
treatment of jspec's own:

    FeatureDrafter: feature_layers: tuple[int, ...]
        the drafter reads the target's hidden states (Medusa, EAGLE): `init` takes a
        fourth argument, the prefill's hidden states [B, P-1, D], and every
        `DraftContext` carries `features` / `feature_start`. `()` reads the final
        hidden state; a non-empty tuple (EAGLE-3) reads the outputs of those target
        layers, concatenated ([B, P-1, len * D]), through the model contract's
        `features_fn` (`target_for`).
    TreeDrafter: propose_tree(state, context, tree, params, keys) -> (candidates, state)
        candidates [B, N-1] int32: the token of each non-root node of the static
        `jspec.core.tree.Tree` (node i at column i-1), chosen deterministically (by
        rank), so that tree acceptance is exact without draft probabilities.
    TreeCheckingDrafter: check_tree(tree) -> None
        a tree drafter that drafts only some static trees: the planner asks it before
        tracing, and it raises ValueError saying why (token recycling: ranks below its
        top_k; DFlash: depth within its block).
    BoundedDrafter: max_draft_tokens: int
        a drafter that drafts at most that many tokens a round (DFlash: its block's mask
        slots): the planner refuses a larger K, "auto"'s largest choice or a deeper tree
        before tracing.
    BlockDrafter: draft_block: int
        a drafter that makes all of a round's drafts in one pass over its weights, of
        draft_block positions per row, whatever K (DFlash: its block): `"auto"`'s prior
        prices its round as that one pass, not K of them.
    DynamicTreeDrafter: propose_dynamic(state, context, budget, params, keys)
        -> (candidates, row_tree, state): a tree per row within the static budget
        `jspec.core.dynamic_tree.DynamicTree`, grown from the drafter's confidences,
        deterministic like a static tree's candidates (EAGLE-2).
    LookupDrafter: lookup(context, num_drafts) -> (drafts, count)
        a stateless drafter that knows how many of its drafts it really proposes
        (count [B] int32; n-gram and datastore lookup: 0 when nothing matches).
        `num_draft_tokens="auto"` then never drafts more than the count of the
        row furthest behind (`jspec.core.dynamic`). With a fixed K the drafts past
        the count are placeholders that are verified, and rejected, like any draft.
    ModelDrafter: models() -> tuple[Model, ...]; with_models(models) -> drafter;
        prepared() -> drafter
        a drafter that runs models of its own (a draft model): the planner places
        them on the mesh, keeps their decoding form and prices their calls through
        `models` / `with_models`; the programs call `prepared` once, before the loop.
    CatchUpDrafter: sync(state, context, synced) -> state
        a drafter with state (a draft model's KV cache) that rounds without drafting
        leave behind: `"auto"` calls it before a drafting round (`jspec.core.dynamic`).
    PricedCatchUpDrafter: a CatchUpDrafter with sync_calls(context, synced) -> []
        int32 and sync_block: int, how many calls `sync` makes and the tokens each
        call feeds: `"auto"` then prices the catch-up. A drafter with `sync` alone is
        still caught up, unpriced.
    BranchDrafter: a TreeDrafter that also has the target compute a side branch
        for it in the same call (lookahead decoding): verify_tree(K) -> Tree, the
        candidates' static tree; side_tree() -> Tree, the side branch hung under
        the same root; side_tokens(state) -> [B, M]; after_verify(state, context,
        predictions [B, M], accepted [B]) -> state, with the target's argmax at
        each side node and the round's accepted drafts. Side nodes are never
        accepted; their K/V go to scratch slots past the tree's.
    ObservingDrafter: observe(state, context) -> state
        a feature drafter with state built from the target's features (EAGLE's
        K/V cache): `"auto"` calls it at the start of each round that does not draft,
        while the context still holds the features of the round before, which the
        next round replaces.
    LogitsObservingDrafter: observed_top_k: int; after_verify_logits(state, block,
        top_ids, on_path) -> state
        a drafter that learns from the logits every verify computes anyway (token
        recycling): after each round, "auto"'s plain rounds included, the engine gives
        it the verified tokens block [B, W] (a chain's t(L-1), d1..dK; a tree's N
        nodes), the ids of the `observed_top_k` largest logits at each position,
        top_ids [B, W, k] (the model's own logits: before the constraint's mask,
        the bias and penalties, temperature and the filters), and on_path [B, W],
        True on the accepted path (the root and the accepted drafts, though EOS or
        max_new_tokens may still cut the last of them from the output; all False for
        rows that were done before the round). k is static; other drafters cost
        nothing: no top-k is computed for them.
    PromptObservingDrafter: a LogitsObservingDrafter with after_prefill_logits(state,
        tokens, top_ids, valid) -> state
        it also gets the prompt's: tokens [B, P] the prefilled prompt tokens,
        top_ids [B, P-1, k] as above for slots 0..P-2 (slot j's successor is
        tokens[:, j+1]), valid [B, P-1] True at slots 0..L-2 of each row (whose
        logits chose committed prompt tokens). Called once, after the prefill
        and `init`; only such drafters make the prefill compute the LM head and top-k.
    RememberingDrafter: remembered(state) -> memory
        a drafter whose state is worth keeping across calls (token recycling's
        matrix): the programs return `remembered` of the state after the loop, and
        `speculative_generate` hands it back as `out.memory`, for the caller to give
        the next call's drafter. state None: the call never ran the drafter
        ("auto" chose plain decoding); the drafter returns what it started from.

Drafter state must follow the decode-state invariant: it may keep anything about
committed tokens t_0..t_{L-2}, and must not trust anything past them, because the
loop rewinds to the accepted prefix without telling it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax

from jspec.core.sampling import SamplingParams


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftContext:
  """What the loop shows a drafter at the start of a round."""

  tokens: jax.Array  # [B, S] int32 committed tokens t_0..t_{L-1}; scratch beyond
  lengths: jax.Array  # [B] int32 committed length L per row
  # For a `FeatureDrafter` (None otherwise): the target's final hidden
  # states, entry j at slot feature_start[b] + j, valid for 0 <= slot <= L-2. The
  # newest valid one, h_{L-2}, produced the logits that chose t_{L-1}.
  features: jax.Array | None = None  # [B, F, D]
  feature_start: jax.Array | None = None  # [B] int32
  # Constrained decoding (`jspec.core.constrained.ConstraintRows`): the automaton and each
  # row's state after t_{L-1}. A drafter may mask its proposals with it (the draft model
  # does); drafts it forbids are rejected by verification anyway. None: unconstrained.
  constraint: Any = None


@runtime_checkable
class Drafter(Protocol):
  """What `speculative_generate` and `jspec.core.decode` ask of a drafter (see the module
  docstring). Implementations are pytrees: `DraftModel`, `NGram`, `Datastore`."""

  vocab_size: int

  def init(self, tokens: jax.Array, prompt_lengths: jax.Array, cache_length: int) -> Any:
    """The drafter's initial state for a batch (a pytree, or None).

    Args:
      tokens: [B, P] int32 right-padded prompts.
      prompt_lengths: [B] int32 in 1..P.
      cache_length: S, the static number of slots per row (for a KV cache).
    """

  def propose(self, state: Any, context: DraftContext, num_drafts: int,
              params: SamplingParams | None,
              keys: jax.Array) -> tuple[jax.Array, jax.Array | None, Any]:
    """Propose `num_drafts` (K, static) tokens per row.

    Args:
      state: what `init` or the previous `propose` returned.
      context: the committed tokens [B, S] and lengths [B] at the start of the round.
      num_drafts: K.
      params: per-row `SamplingParams`, or None when every row is greedy (static).
      keys: [B] typed PRNG keys for this round's draws.

    Returns:
      drafts [B, K] int32; q [B, K, V] f32, the distributions the drafts were drawn
      from, or None for one-hot at the drafts; the new state.
    """


@runtime_checkable
class TreeDrafter(Protocol):
  """A drafter that proposes a static tree of candidates (Medusa, EAGLE, a draft model, the
  lookup drafters)."""

  def propose_tree(self, state: Any, context: DraftContext, tree: Any,
                   params: SamplingParams | None, keys: jax.Array) -> tuple[jax.Array, Any]:
    """candidates [B, N-1] int32, node i's token at column i-1 (chosen by rank), and
    the new state."""


@runtime_checkable
class TreeCheckingDrafter(Protocol):
  """A tree drafter that drafts only some static trees (Token Recycling: ranks below its
  top_k); the planner asks it before tracing."""

  def check_tree(self, tree: Any) -> None:
    """Raise ValueError, saying why, when this drafter cannot draft `tree`."""


@runtime_checkable
class BoundedDrafter(Protocol):
  """A drafter that drafts at most `max_draft_tokens` tokens a round (DFlash: the mask
  slots of its block); the planner checks K against it before tracing."""

  max_draft_tokens: int


@runtime_checkable
class BlockDrafter(Protocol):
  """A drafter whose round is one pass of `draft_block` positions per row over its weights,
  whatever K (DFlash); `"auto"`'s prior prices it so."""

  draft_block: int


@runtime_checkable
class DynamicTreeDrafter(Protocol):
  """A drafter that grows its own tree per row each round within a static budget
  (`jspec.core.dynamic_tree`, EAGLE-2: the EAGLE head)."""

  def propose_dynamic(self, state: Any, context: DraftContext, budget: Any,
                      params: SamplingParams | None, keys: jax.Array):
    """candidates [B, N-1] int32 (deterministic), the rows' `RowTree` and the new state."""


@runtime_checkable
class LookupDrafter(Protocol):
  """A stateless drafter that knows how many drafts it really has (n-gram, datastore)."""

  def lookup(self, context: DraftContext, num_drafts: int) -> tuple[jax.Array, jax.Array]:
    """(drafts [B, K] int32, count [B] int32): the first `count` drafts are proposals,
    the rest placeholders."""


@runtime_checkable
class BranchDrafter(Protocol):
  """A tree drafter whose verify call also computes a side branch for it (lookahead)."""

  def verify_tree(self, num_drafts: int) -> Any:
    """The static `jspec.Tree` of candidates for K = num_drafts (depth <= K)."""

  def side_tree(self) -> Any:
    """The side branch as a `jspec.Tree` whose root is the verify tree's root."""

  def side_tokens(self, state: Any) -> jax.Array:
    """[B, M] int32 the side branch's tokens, node i at column i-1."""

  def after_verify(self, state: Any, context: DraftContext, predictions: jax.Array,
                   accepted: jax.Array) -> Any:
    """The state after a round: predictions [B, M] the target's argmax at each side
    node, accepted [B] the drafts the round accepted; context as the round began."""


@runtime_checkable
class CatchUpDrafter(Protocol):
  """A drafter whose state must catch up after rounds that did not call it."""

  def sync(self, state: Any, context: DraftContext, synced: jax.Array) -> Any:
    """The state brought up to the decode-state invariant from `synced` [B], the
    number of leading slots known to be current."""


@runtime_checkable
class PricedCatchUpDrafter(CatchUpDrafter, Protocol):
  """A `CatchUpDrafter` that says what its catch-up costs, so `"auto"` can price it
  (`dynamic.catch_up_fee`)."""

  sync_block: int  # tokens each catch-up call feeds per row

  def sync_calls(self, context: DraftContext, synced: jax.Array) -> jax.Array:
    """[] int32: how many calls `sync` makes from `synced` (0: nothing to catch up)."""


@runtime_checkable
class ModelDrafter(Protocol):
  """A drafter that runs models of its own (a draft model). The planner maps over them:
  placement on a mesh, the decoding form kept per model, the prior on their cost."""

  def models(self) -> tuple[Any, ...]:
    """The `jspec.Model`s this drafter calls."""

  def with_models(self, models: tuple[Any, ...]) -> Any:
    """This drafter over `models` (same order as `models()`), everything else as is."""

  def prepared(self) -> Any:
    """This drafter in decoding form (its models' `Model.prepared`, and whatever it
    derives from their params once per program). Called inside the program, before
    the loop."""


@runtime_checkable
class FeatureDrafter(Protocol):
  """A drafter that reads the target's hidden states (Medusa, EAGLE)."""

  feature_layers: tuple[int, ...]  # () the final hidden state; else those layers fused


@runtime_checkable
class ObservingDrafter(Protocol):
  """A feature drafter whose state must take in every round's features, drafting or not."""

  def observe(self, state: Any, context: DraftContext) -> Any:
    """The state with the features of `context` taken in, as `propose` would before
    drafting."""


@runtime_checkable
class LogitsObservingDrafter(Protocol):
  """A drafter that reads the target's most likely next ids at every verified position
  (token recycling's adjacency matrix)."""

  observed_top_k: int  # k, static: how many ids per position it reads

  def after_verify_logits(self, state: Any, block: jax.Array, top_ids: jax.Array,
                          on_path: jax.Array) -> Any:
    """The state after a round's verify: block [B, W] int32 the verified tokens,
    top_ids [B, W, k] int32 the ids of the k largest logits at each (best first),
    on_path [B, W] bool the accepted path: the root and the accepted drafts (module
    docstring)."""


@runtime_checkable
class PromptObservingDrafter(LogitsObservingDrafter, Protocol):
  """A `LogitsObservingDrafter` that also reads the prefill's top-k ids, over the prompt."""

  def after_prefill_logits(self, state: Any, tokens: jax.Array, top_ids: jax.Array,
                           valid: jax.Array) -> Any:
    """The state after the prefill: tokens [B, P] int32 the prefilled prompt tokens,
    top_ids [B, P-1, k] int32 (slot j's logits; its successor is tokens[:, j+1]),
    valid [B, P-1] bool the slots below each row's L-1."""


@runtime_checkable
class RememberingDrafter(Protocol):
  """A drafter whose final state a call hands back to its caller (`out.memory`)."""

  def remembered(self, state: Any) -> Any:
    """The memory to carry into the next call, from the state after the loop (None:
    the drafter never ran, the memory it started from)."""


def remembered(drafter, state) -> Any:
  """`RememberingDrafter.remembered` of `state`; None for other drafters."""
  return drafter.remembered(state) if isinstance(drafter, RememberingDrafter) else None


def uses_features(drafter) -> bool:
  """A `FeatureDrafter`: it reads the target's hidden states (`init` then takes them as
  a fourth argument)."""
  return isinstance(drafter, FeatureDrafter)


def feature_layers(drafter) -> tuple[int, ...]:
  """The target layers a feature drafter fuses; () for the final hidden state, and for
  drafters that read no features."""
  return tuple(drafter.feature_layers) if isinstance(drafter, FeatureDrafter) else ()


def prepared(drafter):
  """A drafter in decoding form (`ModelDrafter.prepared`); any other as it is."""
  return drafter.prepared() if isinstance(drafter, ModelDrafter) else drafter


def target_for(target, drafter):
  """`target` as `drafter` reads it: returning the drafter's `feature_layers` as
  `hidden` (`Model.with_features`), or unchanged. Static: cheap inside a trace."""
  layers = feature_layers(drafter)
  return target.with_features(layers) if layers else target
