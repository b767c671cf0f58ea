"""EAGLE: a one-layer head that drafts in the target's feature space (Li et al. 2024).

The head reads the target's own final hidden state (its "feature") and predicts
the next one; the target's frozen LM head turns predicted features into draft
distributions, and the target's frozen token embedding feeds the tokens back in:

    pair at slot j:   (h_{j-1}, e(t_j))       h_{-1} = 0 for slot 0
    x_j  = fc([h_{j-1}; e(t_j)])              fc: [2D, D] + bias
    f^_j = decoder_layer(x_j | pairs at slots <= j)   ~ h_j
    logits(f^_j) = LM_head(f^_j)              predicts t_{j+1}

The decoder layer is the target family's (RMSNorm pre-norm, RoPE, GQA, SwiGLU),
with its own K/V cache of one layer, [B, Hkv, Dh, S] and [B, Hkv, S, Dh]. (Published
EAGLE-3 heads may stack more layers after the first, each with its own K/V in the cache:
`EagleConfig.num_layers`; the rounds below are the same.)

Decode-state invariant: at the start of `propose` the cache holds the true pairs
for slots <= feature_start (everything before the catch-up block); anything past
that is scratch. A chain round (K drafts):

    catch-up, one call:  pairs (h_{fs+j}, e(t_{fs+1+j})), j < F, at slots fs+1 .. fs+F
                         -> f^_{L-1} (entry L-1-(fs+1))  -> d_1
    step i = 1..K-1:     pair (f^_{L-2+i}, e(d_i)) at slot L-1+i  -> f^_{L-1+i} -> d_{i+1}

Catch-up entries past the newest valid feature (h_{L-2}) write scratch slots,
which the next catch-up overwrites before anything attends to them: the next
round starts at fs' = L0 - 1, one slot past the last trusted one. The steps
feed predicted features into slots the verify round may commit; the next
catch-up replaces those with the target's own.

Tree rounds (`propose_tree`, `propose_dynamic`) run the same catch-up, then draft
level by level (`jspec.drafters.eagle_tree`).

Heads published by other projects (`jspec.io.drafter_layouts`) take the pair another way
(`EagleConfig.input_form`, `jspec.drafters.eagle_head.INPUT_FORMS`: EAGLE-3's layer reads
[norm(e); norm(f)] with f as its residual, no fc) and may carry their own LM head over a draft
vocabulary (`rows`, `ids`) and their own copy of the embedding (`token_embed`); the rounds
above are the same.

On disk (`save_eagle`, `load_eagle`): params/ (orbax) and eagle_config.json with the
head's config, the reduced vocabulary it drafts over (if any) and free-form meta.
Loading checks the config, the fit to the target and every tensor's shape before
reading a tensor.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jspec.core import nn as layers
from jspec.core import sampling
from jspec.drafters import vocab_subset
from jspec.core.model import Model, OutputHead
from jspec.core.dynamic_tree import DynamicTree
from jspec.drafters import eagle_tree
# The head's config, params and layer (eagle_head); EagleConfig and init_params are public here.
from jspec.drafters import params_io
# The head's configuration, params and layers; its names are this module's too
# (`eagle.EagleConfig`, `eagle.init_params`, ...), the drafter's public face.
from jspec.drafters.eagle_head import (  # noqa: F401
    EagleConfig, cache_names, causal_visibility, check_params, forward, head_dtype, init_params,
    param_shapes, target_head)

FORMAT = "jspec-eagle"
FORMAT_VERSION = 1
CONFIG_FILE = "eagle_config.json"
PARAMS_DIR = "params"


# ----------------------------------------------------------------------------- the head


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle:
  """An EAGLE drafter: head params plus the target's frozen embedding and LM head.

  A pytree (params, embedding and LM head are leaves; shapes and constants
  static), usable as a `jspec` drafter with target features (a `FeatureDrafter`).
  """

  params: Any  # head params (see `param_shapes`)
  # The target's own (a quantized target's as it holds them: `OutputHead`).
  embed: Any  # [V, D] the target's token embedding (frozen)
  lm_head: Any  # [D, V] the target's LM head; None: tied to `embed`
  config: EagleConfig = dataclasses.field(metadata=dict(static=True))
  embedding_multiplier: float = dataclasses.field(default=1.0, metadata=dict(static=True))
  final_logit_softcapping: float | None = dataclasses.field(
      default=None, metadata=dict(static=True))
  ids: jax.Array | None = None  # [N] int32: the token ids drafted (None: all V; `reduced`)
  rows: jax.Array | None = None  # [N, D] the LM-head rows of `ids`
  # Heads loaded from a published layout (`jspec.io.drafter_layouts`) carry their own copy of
  # the token embedding [V, D] (used as stored: no embedding multiplier) and their own LM
  # head over the draft vocabulary (`rows`); `layout` names where they came from.
  token_embed: jax.Array | None = None
  layout: str | None = dataclasses.field(default=None, metadata=dict(static=True))

  @classmethod
  def from_target(cls, target: Model, head_params, config: EagleConfig | None = None) -> "Eagle":
    """Attach head params to `target`'s embedding and LM head (shared, not copied).

    config: the head's `EagleConfig`; None derives it from the target (one of its layers).
    """
    if not isinstance(target, Model):
      raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
    head = target.head()
    if config is None:
      config = EagleConfig.for_target(target.config)
    V, D = head.embed.shape
    if config.hidden_size != D or config.vocab_size != V:
      raise ValueError(f"EAGLE head (hidden {config.hidden_size}, vocab {config.vocab_size}) does "
                       f"not fit the target (hidden {D}, vocab {V})")
    if config.fused:  # the target must expose those layers (clear errors before tracing)
      target.with_features(config.feature_layers)
    check_params(head_params, config)
    return cls(params=head_params, embed=head.embed, lm_head=head.lm_head, config=config,
               embedding_multiplier=head.embedding_multiplier,
               final_logit_softcapping=head.final_logit_softcapping)

  def reduced(self, ids) -> "Eagle":
    """This head drafting over the token ids `ids` only (FR-Spec,
    `jspec.drafters.vocab_subset`): the LM head's rows for them, q zero elsewhere."""
    if self.layout is not None and self.ids is not None:
      raise ValueError(f"this head ({self.layout} layout) drafts over its own vocabulary with "
                       f"its own LM head rows; it cannot be reduced to the target's rows")
    ids = vocab_subset.check_ids(ids, self.vocab_size)
    return dataclasses.replace(self, ids=ids,
                               rows=vocab_subset.head_rows(self.embed, self.lm_head, ids))

  @property
  def feature_layers(self) -> tuple[int, ...]:
    """Target layers this head fuses (`jspec.core.drafter.target_for`); () for EAGLE-1."""
    return self.config.feature_layers

  def fuse(self, params, features: jax.Array) -> jax.Array:
    """Target features [..., n * D] as the head's input features [..., D]: EAGLE-3's
    fusion of low, middle and high layers; EAGLE-1's final hidden state as it is."""
    c = self.config
    if not c.fused:
      return features
    fuse = params["fuse"]
    kernel = fuse["kernel"]
    x = features.astype(kernel.dtype)
    if c.norm_before_fc:  # one norm over the concatenation (speculators' input_norm)
      x = layers.RMSNorm()(x, fuse["norm"], c.rms_norm_eps)
    elif c.fc_norm:  # one norm per target layer (speculators' fc_norm.i)
      parts = x.reshape(*x.shape[:-1], len(c.feature_layers), c.hidden_size)
      x = layers.RMSNorm()(parts, fuse["layer_norms"], c.rms_norm_eps).reshape(x.shape)
    return jnp.einsum("...i,id->...d", x, kernel)

  def head_input(self, params, features: jax.Array) -> jax.Array:
    """What the LM head reads from the head's output features: EAGLE-3 normalises them
    first (its outputs are residual streams, fed back as they are); EAGLE-1 predicts the
    target's final (normed) hidden state and reads it directly; an EAGLE-3 head with
    `norm_output` has normed them already (`eagle_head.forward`)."""
    if not self.config.fused or self.config.norm_output:
      return features
    return layers.RMSNorm()(features, params["norm"], self.config.rms_norm_eps)

  def draft_scores(self, features: jax.Array, params=None) -> jax.Array:
    """Logits the head drafts from: over all V (`logits`), or over `ids` [..., N].
    params: the head's (default: its own; training passes the traced ones)."""
    features = self.head_input(self.params if params is None else params, features)
    if self.ids is None:
      return self.logits(features)
    return vocab_subset.scores(features, self.rows, self.final_logit_softcapping)

  def _token(self, index):
    return index if self.ids is None else vocab_subset.token_ids(self.ids, index)

  @property
  def vocab_size(self) -> int:
    """V (the target's)."""
    return int(self.config.vocab_size)

  # ------------------------------------------------------------------ pieces

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    """e(t) as the target computes it (or the head's own copy): tokens [B, T] -> [B, T, D]."""
    if self.token_embed is not None:
      return jnp.take(self.token_embed, tokens, axis=0)
    return self.head().embed_tokens(tokens)

  def head(self) -> OutputHead:
    """The target's embedding and LM head this head holds (shared, as the target holds
    them: a quantized target's stay quantized)."""
    return OutputHead(embed=self.embed, lm_head=self.lm_head,
                      embedding_multiplier=self.embedding_multiplier,
                      final_logit_softcapping=self.final_logit_softcapping)

  def logits(self, features: jax.Array) -> jax.Array:
    """The target's LM head: features [B, T, D] -> f32 logits [B, T, V]."""
    return self.head().logits(features)

  def init_cache(self, batch: int, length: int, dtype=None) -> dict:
    """Zeroed K/V of each of the head's layers for `batch` rows of `length` slots (dtype:
    the head's; keys `eagle_head.cache_names`), and with window layers each slot's rotary
    position."""
    c = self.config
    dtype = head_dtype(self.params) if dtype is None else dtype
    cache = {}
    for i in range(c.num_layers):
      k, v = cache_names(i)
      cache[k] = jnp.zeros((batch, c.num_key_value_heads, c.head_dim, length), dtype)
      cache[v] = jnp.zeros((batch, c.num_key_value_heads, length, c.head_dim), dtype)
    if c.window_layers:
      cache["pos"] = jnp.zeros((batch, length), jnp.int32)
    return cache

  def forward(self, params, features, tokens, cache, slots, positions, visible):
    """The head on a block of pairs.

    features [B, T, D] (h_{j-1} per pair), tokens [B, T] int32 (t_j);
    slots [B, T] cache slots the pairs' K/V go to (>= S: dropped);
    positions [B, T] RoPE positions; visible bool [B, T, S] (with a cache) or
    [B, T, T] (cache None: attention inside the block only, for training).
    Returns predicted features [B, T, D] and the cache.
    """
    return forward(self.config, params, features, self.embed_tokens(tokens), cache, slots,
                    positions, visible)

  # ------------------------------------------------------------------ drafter protocol

  def init(self, tokens, prompt_lengths, cache_length: int, features):
    """`Drafter.init` with features: the head's cache with the prompt's pairs prefilled.

    tokens [B, P] int32 right-padded; features [B, P-1, D] target hidden at slots
    0..P-2. Slot j <= P-1 gets (h_{j-1}, e(t_j)); rows with shorter prompts get
    scratch beyond their own, which catch-up blocks rewrite before use.
    """
    del prompt_lengths  # rows' excess slots are scratch under the invariant
    B, P = tokens.shape
    D, W = self.config.hidden_size, self.config.feature_width
    features = jnp.asarray(features)
    if features.ndim != 3 or features.shape[:2] != (B, P - 1) or features.shape[2] != W:
      raise ValueError(f"features must be [B, P-1, {'n * D' if self.config.fused else 'D'}] = "
                       f"[{B}, {P - 1}, {W}], got {features.shape}")
    cache = self.init_cache(B, cache_length)
    features = self.fuse(self.params, features)
    feats = jnp.concatenate([jnp.zeros((B, 1, D), features.dtype), features], axis=1)
    slots = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32)[None, :], (B, P))
    with jax.named_scope("eagle_prefill"):
      _, cache = self.forward(self.params, feats,
                              tokens.astype(jnp.int32), cache, slots, slots,
                              causal_visibility(slots, cache_length))
    return cache

  def _catch_up(self, cache, context):
    """Feed the F pairs the features describe; returns f^_{L-1} [B, D] and the cache."""
    feats = getattr(context, "features", None)
    if feats is None or getattr(context, "feature_start", None) is None:
      raise ValueError("EAGLE drafts from the target's features: the context needs `features` "
                       "and `feature_start` (a decode loop that honours `FeatureDrafter`)")
    B, F, D = feats.shape
    if F < 1:
      raise ValueError("EAGLE needs at least one feature entry per round (F >= 1)")
    if D != self.config.feature_width:
      raise ValueError(f"features have width {D}, the head expects {self.config.feature_width}"
                       + (f" (target layers {self.feature_layers} fused)"
                          if self.config.fused else ""))
    L = context.lengths.astype(jnp.int32)
    fs = context.feature_start.astype(jnp.int32)
    S_tok = context.tokens.shape[1]
    start = jnp.maximum(fs + 1, 0)  # slots below 0 do not exist: shift the block right
    j = jnp.arange(F, dtype=jnp.int32)[None, :]
    slots = start[:, None] + j  # [B, F]
    entry = slots - 1 - fs[:, None]  # feature entry holding h_{slot-1}
    valid = (slots >= 1) & (entry >= 0) & (entry < F)  # slot 0's pair has no feature (zeros)
    f_in = jnp.take_along_axis(feats, jnp.clip(entry, 0, F - 1)[:, :, None], axis=1)
    f_in = self.fuse(self.params, f_in)  # [B, F, D]
    f_in = jnp.where(valid[:, :, None], f_in, jnp.zeros((), f_in.dtype))
    toks = jnp.take_along_axis(context.tokens, jnp.clip(slots, 0, S_tok - 1), axis=1)
    with jax.named_scope("eagle_catch_up"):
      out, cache = self.forward(self.params, f_in, toks, cache, slots,
                                slots, causal_visibility(slots, cache["k"].shape[3]))
    at = jnp.clip(L - 1 - start, 0, F - 1)
    f_last = jnp.take_along_axis(out, at[:, None, None], axis=1)[:, 0]  # f^_{L-1} [B, D]
    return f_last, cache

  def observe(self, cache, context):
    """The catch-up of `propose` without drafting (`ObservingDrafter`): rounds that do
    not draft (`num_draft_tokens="auto"` at K = 0) keep the cache's true pairs current,
    at the cost of the head's layers over F pairs."""
    return self._catch_up(cache, context)[1]

  def propose(self, cache, context, num_drafts: int, params: sampling.SamplingParams | None,
              keys):
    """`Drafter.propose`: one catch-up call, then K-1 one-pair steps.

    context: a `DraftContext` with `features` [B, F, D] and `feature_start` [B].
    Returns drafts [B, K] int32, q [B, K, V] f32 (None when `params` is None:
    argmax drafts) and the updated cache.
    """
    greedy = params is None  # static
    S = cache["k"].shape[3]

    def draw(f, i):  # f [B, D] -> d [B], q [B, V] or None
      scores = self.draft_scores(f[:, None])[:, 0]  # [B, V or N]
      if greedy:
        return self._token(sampling.greedy_tokens(scores)), None
      q = sampling.probabilities(scores[:, None], params)[:, 0]
      d = self._token(sampling.sample(sampling.fold(keys, i), q))
      return d, (q if self.ids is None else vocab_subset.spread(self.ids, q, self.vocab_size))

    with jax.named_scope("eagle_propose"):
      f_last, cache = self._catch_up(cache, context)
      d_first, q_first = draw(f_last, 0)
      L = context.lengths.astype(jnp.int32)

      def step(carry, i):
        cache, f_prev, token = carry
        slot = (L - 1 + i)[:, None]  # [B, 1]
        out, cache = self.forward(self.params, f_prev[:, None], token[:, None], cache, slot, slot,
                                  causal_visibility(slot, S))
        f = out[:, 0]
        d, q = draw(f, i)
        return (cache, f, d), (d, q)

      (cache, _, _), (d_rest, q_rest) = lax.scan(
          step, (cache, f_last, d_first), jnp.arange(1, num_drafts, dtype=jnp.int32))
    drafts = jnp.concatenate([d_first[:, None], d_rest.T], axis=1)  # [B, K]
    if greedy:
      return drafts, None, cache
    q = jnp.concatenate([q_first[:, None], q_rest.transpose(1, 0, 2)], axis=1)  # [B, K, V]
    return drafts, q, cache

  def propose_tree(self, cache, context, tree, params=None, keys=None):
    """Tree drafting: candidates [B, N-1] int32 (node i's token at column i-1) and the
    cache; deterministic top-k, no q (`jspec.drafters.eagle_tree.propose_tree`)."""
    del params, keys
    return eagle_tree.propose_tree(self, cache, context, tree)

  def propose_dynamic(self, cache, context, budget: DynamicTree, params=None, keys=None):
    """Dynamic tree drafting (EAGLE-2): candidates [B, N-1] int32, the rows' `RowTree`
    and the cache (`jspec.drafters.eagle_tree.propose_dynamic`)."""
    del params, keys
    return eagle_tree.propose_dynamic(self, cache, context, budget)


# ----------------------------------------------------------------------------- save / load


def save_eagle(params, path, meta: dict | None = None, *, config: EagleConfig | None = None,
               dtype=None) -> None:
  """Write an EAGLE head into `path` (new or empty): params/ (orbax) and eagle_config.json.

  params: an `Eagle` (its head params and config are saved) or a head-params dict
  together with its `config`.
  meta: JSON-ready extra information kept in the config file.
  dtype: cast floating-point params to this dtype on disk (e.g. "bfloat16").
  The config file is written last (`jspec.drafters.params_io`): a directory without it never loads.
  """
  ids = None
  if isinstance(params, Eagle) and params.layout is not None:
    raise ValueError(f"this head was loaded from the {params.layout} layout and keeps its own "
                     f"LM head and embedding, which jspec's format does not hold: write it "
                     f"back with jspec.io.drafter_layouts.export_drafter")
  if isinstance(params, Eagle):
    config = params.config if config is None else config
    ids = None if params.ids is None else np.asarray(params.ids).tolist()
    params = params.params
  if not isinstance(params, dict):
    raise TypeError(f"save_eagle takes an Eagle or a head-params dict, got "
                    f"{type(params).__name__}")
  if config is None:
    raise ValueError("save_eagle needs config= (an EagleConfig) with a bare params dict: the "
                     "vocabulary size and constants are not in the shapes")
  check_params(params, config)
  if dtype is not None:
    dt = jnp.dtype(dtype)
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x).astype(dt), params)
  params_io.save_dir(path, PARAMS_DIR, params, CONFIG_FILE,
                     {"format": FORMAT, "version": FORMAT_VERSION, "config": config.to_dict(),
                      "meta": meta or {}, **({"draft_ids": ids} if ids is not None else {})})


def read_config(path) -> tuple[EagleConfig, dict]:
  """The `EagleConfig` and meta dict of a saved head, checked."""
  path, meta = params_io.open_dir(path, CONFIG_FILE, FORMAT, FORMAT_VERSION, "EAGLE head")
  config_path = os.path.join(path, CONFIG_FILE)
  if not isinstance(meta.get("config"), dict):
    raise ValueError(f"{config_path}: missing field 'config'")
  try:
    config = EagleConfig.from_dict(meta["config"])
  except (TypeError, ValueError) as e:
    raise ValueError(f"{config_path}: invalid EAGLE config: {e}") from e
  return config, meta.get("meta") or {}


def read_draft_ids(path) -> np.ndarray | None:
  """The reduced vocabulary a saved head drafts over (`Eagle.reduced`), or None: all ids."""
  path, meta = params_io.open_dir(path, CONFIG_FILE, FORMAT, FORMAT_VERSION, "EAGLE head")
  ids = meta.get("draft_ids")
  return None if ids is None else np.asarray(ids, np.int32)


def load_eagle(path, target: Model, dtype="float32") -> Eagle:
  """An `Eagle` for `target` from a directory written by `save_eagle`.

  Checks, before reading any tensor: the config file, that the head fits the
  target (hidden size and vocabulary), and every stored tensor's shape. A head saved
  with a reduced vocabulary comes back reduced to the same ids.
  dtype: floating-point params are cast to it (default f32; None keeps stored).
  """
  config, _ = read_config(path)
  path = os.path.abspath(os.path.expanduser(os.fspath(path)))
  embed, _ = target_head(target)  # a clear error for a target without an output head
  V, D = embed.shape
  if config.hidden_size != D or config.vocab_size != V:
    raise ValueError(f"EAGLE head in {path} was made for hidden size {config.hidden_size} and "
                     f"vocab {config.vocab_size}; the target has hidden size {D} "
                     f"and vocab {V}")
  params = params_io.restore_checked(os.path.join(path, PARAMS_DIR), param_shapes(config), dtype,
                                     "params", CONFIG_FILE)
  eagle = Eagle.from_target(target, params, config)
  ids = read_draft_ids(path)  # saved with a reduced-vocabulary head: it drafts over them again
  return eagle if ids is None else eagle.reduced(ids)
