"""DFlash: a block drafter conditioned on the target's features (Chen et al., z-lab 2026).

DFlash ("DFlash: Block Diffusion for Flash Speculative Decoding") drafts a whole block in
one forward pass of a few decoder layers (`jspec.drafters.dflash_head`): the block is the
last committed token t_{L-1} (the anchor) followed by bs - 1 mask tokens, its layers attend
to the fused target features of every committed slot before the anchor, and block slot i
(1..bs-1) gives the distribution of draft d_i:

    committed:    t_0 ... t_{L-2} | t_{L-1}   d_1   d_2  ...  d_{bs-1}
    block:                          t_{L-1}   m     m         m          (one pass)
    context:      ctx_0 ... ctx_{L-2}                                    (kept per slot)

State. The drafter keeps, per layer, the keys and values of the context at every slot
([NL, B, Hkv, S, Dh] each): `init` writes the prompt's, and each round (`propose`,
`observe`) writes those of the round's feature window, entry j at slot feature_start + j.
Entries past the newest valid feature (h_{L-2}) write scratch slots that no block sees
(it sees slots < L-1 only) and that the next window rewrites before they are committed:
the decode-state invariant.

Exactness. The drafts are independent given the committed tokens: d_i is drawn from
q_i = the processed distribution at block slot i, whatever d_1..d_{i-1} are, so the chain
acceptance rule is exact with those q_i; greedy drafts are the argmaxes (q None). A static
tree (`propose_tree`) takes, for a node at depth d, the rank-r token of slot d (like
Medusa's heads), deterministic, so tree acceptance needs no q. The block always runs whole
(bs tokens: attention inside it is not causal, so fewer mask tokens would change every
slot), and K drafts take slots 1..K; K > bs - 1 is refused before tracing
(`max_draft_tokens`, a `BoundedDrafter`).

Published DFlash drafters (vLLM speculators, z-lab) load through `jspec.load_drafter`
(`jspec.io.layout_dflash`); they use the target's embedding table as stored and either the
target's LM head or their own over a reduced draft vocabulary (`ids`, `rows`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import sampling
from jspec.core.model import Model, OutputHead
from jspec.core.tree import top_ranked
from jspec.drafters import vocab_subset
from jspec.drafters.dflash_head import (DFlashConfig, block_forward, check_params, context_kv,
                                        head_dtype, init_params, param_shapes)

# The network's names (`jspec.drafters.dflash_head`) are this module's too: the drafter's face.
__all__ = ["DFlash", "DFlashConfig", "block_forward", "check_params", "context_kv", "head_dtype",
           "init_params", "param_shapes"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DFlash:
  """A DFlash drafter: its params plus the target's embedding and LM head (frozen).

  A pytree (params and the target's tables are leaves; the config static), usable as a
  `jspec` drafter: a `FeatureDrafter` (it reads `feature_layers` of the target), an
  `ObservingDrafter`, a `TreeDrafter` and `TreeCheckingDrafter`, a `BoundedDrafter` and a
  `BlockDrafter`.
  """

  params: Any  # see `param_shapes`
  # The target's own (a quantized target's as it holds them: `OutputHead`).
  embed: Any  # [V, D] the target's token embedding
  lm_head: Any  # [D, V] the target's LM head; None: tied to `embed`
  config: DFlashConfig = dataclasses.field(metadata=dict(static=True))
  embedding_multiplier: float = dataclasses.field(default=1.0, metadata=dict(static=True))
  final_logit_softcapping: float | None = dataclasses.field(
      default=None, metadata=dict(static=True))
  ids: jax.Array | None = None  # [N] int32 the token ids drafted (None: all V)
  rows: jax.Array | None = None  # [N, D] the LM-head rows of `ids`
  layout: str | None = dataclasses.field(default=None, metadata=dict(static=True))

  @classmethod
  def from_target(cls, target: Model, params, config: DFlashConfig) -> "DFlash":
    """Attach `params` (checked against `config`) to `target`'s embedding and LM head."""
    if not isinstance(target, Model):
      raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
    if not isinstance(config, DFlashConfig):
      raise TypeError(f"config must be a DFlashConfig, got {type(config).__name__}")
    head = target.head()
    V, D = head.embed.shape
    if config.hidden_size != D or config.vocab_size != V:
      raise ValueError(f"DFlash drafter (hidden {config.hidden_size}, vocab "
                       f"{config.vocab_size}) does not fit the target (hidden {D}, vocab {V})")
    target.with_features(config.feature_layers)  # clear errors for layers it lacks
    check_params(params, config)
    return cls(params=params, embed=head.embed, lm_head=head.lm_head, config=config,
               embedding_multiplier=head.embedding_multiplier,
               final_logit_softcapping=head.final_logit_softcapping)

  def reduced(self, ids, rows=None) -> "DFlash":
    """This drafter over the token ids `ids` only (FR-Spec, `jspec.drafters.vocab_subset`):
    `rows` [N, D] its own LM-head rows for them (a published layout's), or None for the
    target's."""
    ids = vocab_subset.check_ids(ids, self.vocab_size)
    if rows is None:
      rows = vocab_subset.head_rows(self.embed, self.lm_head, ids)
    elif tuple(np.shape(rows)) != (ids.shape[0], self.config.hidden_size):
      raise ValueError(f"rows must be [N, D] = {(ids.shape[0], self.config.hidden_size)}, got "
                       f"{tuple(np.shape(rows))}")
    return dataclasses.replace(self, ids=ids, rows=jnp.asarray(rows))

  # ------------------------------------------------------------------ capabilities

  @property
  def vocab_size(self) -> int:
    """V (the target's)."""
    return int(self.config.vocab_size)

  @property
  def feature_layers(self) -> tuple[int, ...]:
    """The target layers fused into the context (`FeatureDrafter`)."""
    return self.config.feature_layers

  @property
  def draft_block(self) -> int:
    """`BlockDrafter`: a round is one pass of the block, bs positions per row, whatever K."""
    return int(self.config.block_size)

  @property
  def max_draft_tokens(self) -> int:
    """`BoundedDrafter`: the block's mask slots, bs - 1."""
    return self.config.max_drafts

  def check_tree(self, tree) -> None:
    """`TreeCheckingDrafter`: depth within the block, ranks within the draft vocabulary."""
    ranks = np.asarray(tree.ranks, np.int64)
    if int(tree.max_depth) > self.max_draft_tokens:
      raise ValueError(f"the tree is {tree.max_depth} deep, but this DFlash drafter's block "
                       f"(block_size {self.config.block_size}) drafts at most "
                       f"{self.max_draft_tokens} tokens")
    size = self.vocab_size if self.ids is None else int(self.ids.shape[0])
    if ranks.size and int(ranks.max()) >= size:
      raise ValueError(f"tree rank {int(ranks.max())} is outside the drafter's vocabulary of "
                       f"{size} ids")

  # ------------------------------------------------------------------ pieces

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    """The target's embedding: tokens [B, T] -> [B, T, D]."""
    return self.head().embed_tokens(tokens)

  def head(self) -> OutputHead:
    """The target's embedding and LM head this drafter holds."""
    return OutputHead(embed=self.embed, lm_head=self.lm_head,
                      embedding_multiplier=self.embedding_multiplier,
                      final_logit_softcapping=self.final_logit_softcapping)

  def scores(self, hidden: jax.Array) -> jax.Array:
    """f32 logits from normed hidden states [B, T, D]: over V, or over `ids` [B, T, N]."""
    if self.ids is not None:
      return vocab_subset.scores(hidden, self.rows, self.final_logit_softcapping)
    return self.head().logits(hidden)

  def block_logits(self, cache, context, depth: int) -> jax.Array:
    """Logits of block slots 1..depth [B, depth, V or N], from the whole block at L-1."""
    c = self.config
    L = context.lengths.astype(jnp.int32)
    anchor = jnp.take_along_axis(context.tokens, jnp.maximum(L - 1, 0)[:, None], axis=1)
    B, bs = L.shape[0], c.block_size
    tokens = jnp.concatenate(
        [anchor.astype(jnp.int32), jnp.full((B, bs - 1), c.mask_token_id, jnp.int32)], axis=1)
    positions = (L - 1)[:, None] + jnp.arange(bs, dtype=jnp.int32)[None, :]  # [B, bs]
    S = cache["k"].shape[3]
    seen = jnp.arange(S, dtype=jnp.int32)[None, :] < (L - 1)[:, None]  # strictly before
    visible = jnp.broadcast_to(seen[:, None, :], (B, bs, S))
    with jax.named_scope("dflash_block"):
      hidden = block_forward(c, self.params, self.embed_tokens(tokens), positions, cache["k"],
                             cache["v"], visible)
    return self.scores(hidden[:, 1:depth + 1])

  def _token(self, index):
    return index if self.ids is None else vocab_subset.token_ids(self.ids, index)

  def init_cache(self, batch: int, length: int, dtype=None) -> dict:
    """Zeroed context keys and values, {"k", "v"} each [NL, B, Hkv, S, Dh]."""
    c = self.config
    dtype = head_dtype(self.params) if dtype is None else dtype
    shape = (c.num_layers, batch, c.num_key_value_heads, length, c.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}

  def write_context(self, cache, features, slots):
    """The cache with the context of features [B, T, n * D] written at slots [B, T] (their
    rotary positions too); slots outside [0, S) are dropped."""
    S = cache["k"].shape[3]
    k, v = context_kv(self.config, self.params, features, slots)
    slots = jnp.where(slots < 0, S, slots)  # negative slots do not exist: drop them

    def write(buffer, new):  # buffer [NL, B, Hkv, S, Dh], new [NL, B, Hkv, T, Dh]
      one = lambda buf, blk, idx: buf.at[:, :, idx].set(blk.astype(buf.dtype), mode="drop")
      return jax.vmap(one, in_axes=(1, 1, 0), out_axes=1)(buffer, new, slots)

    return {"k": write(cache["k"], k), "v": write(cache["v"], v)}

  # ------------------------------------------------------------------ drafter protocol

  def init(self, tokens, prompt_lengths, cache_length: int, features):
    """`Drafter.init` with features [B, P-1, n * D] (slots 0..P-2): the context cache with
    the prompt's written (rows' slots past their own L-2 get scratch, never seen)."""
    del prompt_lengths
    B, P = tokens.shape
    W = self.config.feature_width
    features = jnp.asarray(features)
    if features.ndim != 3 or features.shape[:2] != (B, P - 1) or features.shape[2] != W:
      raise ValueError(f"features must be [B, P-1, n * D] = [{B}, {P - 1}, {W}], got "
                       f"{features.shape}")
    cache = self.init_cache(B, cache_length)
    if P == 1:
      return cache
    slots = jnp.broadcast_to(jnp.arange(P - 1, dtype=jnp.int32)[None, :], (B, P - 1))
    with jax.named_scope("dflash_prefill"):
      return self.write_context(cache, features, slots)

  def observe(self, cache, context):
    """`ObservingDrafter`: the round's features written into the context cache."""
    feats = getattr(context, "features", None)
    if feats is None or getattr(context, "feature_start", None) is None:
      raise ValueError("DFlash drafts from the target's features: the context needs `features` "
                       "and `feature_start` (a decode loop that honours `FeatureDrafter`)")
    B, F, W = feats.shape
    if W != self.config.feature_width:
      raise ValueError(f"features have width {W}, the drafter expects "
                       f"{self.config.feature_width} (target layers {self.feature_layers})")
    slots = (context.feature_start.astype(jnp.int32)[:, None]
             + jnp.arange(F, dtype=jnp.int32)[None, :])
    with jax.named_scope("dflash_context"):
      return self.write_context(cache, feats, slots)

  def propose(self, cache, context, num_drafts: int, params: sampling.SamplingParams | None,
              keys):
    """`Drafter.propose`: the round's context in, one block pass, K drafts from slots 1..K.
    Returns drafts [B, K] int32, q [B, K, V] f32 (None when `params` is None) and the
    cache."""
    K = int(num_drafts)
    if not 1 <= K <= self.max_draft_tokens:
      raise ValueError(f"num_drafts = {K}: this DFlash drafter (block_size "
                       f"{self.config.block_size}) drafts 1..{self.max_draft_tokens} tokens")
    cache = self.observe(cache, context)
    scores = self.block_logits(cache, context, K)  # [B, K, V or N]
    if params is None:
      return self._token(sampling.greedy_tokens(scores)), None, cache
    q = sampling.probabilities(scores, params)  # [B, K, V or N]
    drafts = jnp.stack([sampling.sample(sampling.fold(keys, i), q[:, i]) for i in range(K)],
                       axis=1)
    if self.ids is not None:
      q = vocab_subset.spread(self.ids, q, self.vocab_size)
    return self._token(drafts), q, cache

  def propose_tree(self, cache, context, tree, params=None, keys=None):
    """Tree candidates [B, N-1] int32: node i is the ranks[i]-th most likely token of block
    slot depths[i] (deterministic), and the cache."""
    del params, keys
    self.check_tree(tree)
    depths = np.asarray(tree.depths, np.int64)
    ranks = np.asarray(tree.ranks, np.int64)
    N = int(tree.num_nodes)
    cache = self.observe(cache, context)
    B = context.lengths.shape[0]
    if N <= 1:
      return jnp.zeros((B, 0), jnp.int32), cache
    scores = self.block_logits(cache, context, int(tree.max_depth))  # [B, depth, V or N]
    nodes = np.arange(1, N)
    columns, order = [], []
    for d in range(1, int(tree.max_depth) + 1):
      at = nodes[depths[1:] == d]
      if at.size:
        top = top_ranked(scores[:, d - 1], int(ranks[at].max()) + 1)  # [B, R]
        columns.append(top[:, ranks[at]])
        order.append(at)
    candidates = jnp.concatenate(columns, axis=1)[:, np.argsort(np.concatenate(order))]
    return self._token(candidates).astype(jnp.int32), cache
