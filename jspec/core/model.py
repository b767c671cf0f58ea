"""`jspec.Model`: a pure model function, its static config and its params.

The engine never imports an architecture. It consumes any object that follows
the model contract (see docs/architecture.md):

    logits, hidden, cache = apply(config, params, tokens, cache, start,
                                  block_mask=None, depth=None)

    tokens     int32 [B, T]  a block of T new tokens per row
    start      int32 [B]     cache slot where each row's block begins
    block_mask bool  [T, T]  which block tokens a block token sees (causal default)
    depth      int32 [T]     RoPE offset of each block token (arange(T) default)
    logits     f32   [B, T, V]
    hidden           [B, T, D]
    cache      a pytree of static-shape K/V buffers, no lengths

    cache = init_cache(config, batch, length, dtype)

Optionally, `head(config, params) -> OutputHead` gives the token embedding and
output head, for drafters that share them with the target (Medusa, EAGLE).

Optionally, `features(config, layers) -> config` gives the config of the same
model whose `apply` returns, as `hidden`, the residual stream after each decoder
layer in `layers` (0-based), concatenated: [B, T, len(layers) * D]. Drafters that
fuse low, middle and high-layer features (EAGLE-3) read the target through it
(`Model.with_features`); logits and cache are unchanged.

Optionally, `prepare(config, params) -> params` gives the params in the form
`apply` decodes fastest from (e.g. per-layer arrays cut from stacked ones). The
decoding loops call it once per program, before the loop, so its cost is paid
once per call rather than once per step; `apply` accepts both forms.

`Model` is a pytree whose only leaves are the params: config and the two
functions are static, so a Model can be passed straight into `jax.jit`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import quant

ApplyFn = Callable[..., tuple[jax.Array, jax.Array, Any]]
InitCacheFn = Callable[[Any, int, int, Any], Any]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OutputHead:
  """A model's token embedding and output head, as drafters that share them read them.

  logits(h) = softcap(h @ lm_head), lm_head = embed.T when tied (`lm_head` None);
  an input embedding is embed[t] * embedding_multiplier.

  embed and lm_head are the model's own weights as it holds them: a quantized model's
  are `jspec.core.quant.QuantWeight`s, read through `quant.take` and `quant.einsum` (a
  float copy of a [V, D] table held beside the target would undo much of what quantizing
  it saved); `dense()` gives plain arrays for code that needs them (training, export).
  """

  embed: Any  # [V, D] array or QuantWeight
  lm_head: Any  # [D, V] array or QuantWeight; None: tied to embed
  embedding_multiplier: float = dataclasses.field(default=1.0, metadata=dict(static=True))
  # tanh(logits / c) * c on the output logits (Gemma 2); None: none
  final_logit_softcapping: float | None = dataclasses.field(default=None,
                                                            metadata=dict(static=True))

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    """The input embedding: tokens [B, T] -> [B, T, D] in the table's dtype."""
    x = quant.take(self.embed, tokens, axis=0)
    if self.embedding_multiplier != 1.0:
      x = x * jnp.asarray(self.embedding_multiplier, x.dtype)
    return x

  def logits(self, hidden: jax.Array) -> jax.Array:
    """f32 logits: hidden [B, T, D] (cast to the head's dtype) -> [B, T, V]."""
    if self.lm_head is None:
      out = quant.einsum("btd,vd->btv", hidden.astype(self.embed.dtype), self.embed,
                         preferred_element_type=jnp.float32)
    else:
      out = quant.einsum("btd,dv->btv", hidden.astype(self.lm_head.dtype), self.lm_head,
                         preferred_element_type=jnp.float32)
    if self.final_logit_softcapping:
      cap = self.final_logit_softcapping
      out = jnp.tanh(out / cap) * cap
    return out

  def dense(self) -> "OutputHead":
    """This head with plain arrays: a quantized weight as the values it computes with."""
    return dataclasses.replace(self, embed=quant.dequantize(self.embed),
                               lm_head=quant.dequantize(self.lm_head))


@dataclasses.dataclass(frozen=True)
class Model:
  """A decoder ready for decoding: `config` and functions static, `params` traced.

  `tokenizer` (optional, host-side only) and `eos_ids` (default stop ids) ride
  along for text helpers; the tokenizer is dropped when the model is flattened
  into a jitted program, so two loads of one checkpoint share compiled code.
  """

  params: Any
  config: Any
  apply_fn: ApplyFn
  init_cache_fn: InitCacheFn
  tokenizer: Any = None
  eos_ids: tuple[int, ...] = ()
  # axes_fn(config) -> (param axes, cache axes): trees of logical axis-name tuples
  # matching params and cache (see jspec/core/sharding.py); None: replicate everything.
  axes_fn: Callable[[Any], tuple[Any, Any]] | None = None
  # prepare_fn(config, params) -> params in the form apply decodes fastest from;
  # None: params are used as they are.
  prepare_fn: Callable[[Any, Any], Any] | None = None
  # head_fn(config, params) -> OutputHead: the embedding and output head drafters
  # share with the target (Medusa, EAGLE); None: the model does not expose them.
  head_fn: Callable[[Any, Any], OutputHead] | None = None
  # features_fn(config, layers) -> config whose apply returns the residual stream after
  # each layer in `layers` as `hidden` (concatenated); None: only the final hidden state.
  features_fn: Callable[[Any, tuple[int, ...]], Any] | None = None

  @property
  def vocab_size(self) -> int:
    """V, from `config.vocab_size`."""
    return int(self.config.vocab_size)

  @property
  def max_length(self) -> int | None:
    """Longest sequence the model supports, or None when unbounded."""
    value = getattr(self.config, "max_position_embeddings", None)
    return None if value is None else int(value)

  @property
  def dtype(self) -> jnp.dtype:
    """Compute dtype: that of the first floating-point parameter (a quantized weight's
    scales', never its float8 values)."""
    for leaf in jax.tree_util.tree_leaves(self.params, is_leaf=quant.is_quant_weight):
      if jnp.issubdtype(leaf.dtype, jnp.floating):
        return jnp.dtype(leaf.dtype)
    return jnp.dtype(jnp.float32)

  def head(self) -> OutputHead:
    """The token embedding and output head (`head_fn`), for drafters that share them."""
    if self.head_fn is None:
      raise TypeError("this jspec.Model has no head_fn: drafters that share the target's "
                      "embedding and output head (Medusa, EAGLE) need one; give the Model a "
                      "head_fn(config, params) -> jspec.OutputHead")
    return self.head_fn(self.config, self.params)

  def with_features(self, layers) -> "Model":
    """This model returning, as `hidden`, the residual stream after each decoder layer
    in `layers` concatenated ([B, T, len(layers) * D]), through `features_fn`. Params,
    logits and cache are the same; `layers` empty gives the model itself."""
    layers = tuple(int(i) for i in layers)
    if not layers:
      return self
    if self.features_fn is None:
      raise TypeError("this jspec.Model has no features_fn: drafters that fuse the target's "
                      "intermediate layers (EAGLE-3) need one; give the Model a "
                      "features_fn(config, layers) -> config")
    return dataclasses.replace(self, config=self.features_fn(self.config, layers))

  def apply(self, tokens, cache, start, block_mask=None, depth=None):
    """The model contract bound to this model's config and params."""
    return self.apply_fn(self.config, self.params, tokens, cache, start,
                         block_mask=block_mask, depth=depth)

  def prepared(self) -> "Model":
    """This model with params in decoding form (`prepare_fn`); itself without one.

    Called inside jitted code, before a decode loop: the work runs once per
    program instead of once per step. The result has no `prepare_fn`, so preparing
    it again is free; it is for `apply` only: save, shard and train the original.
    """
    if self.prepare_fn is None:
      return self
    return dataclasses.replace(self, params=self.prepare_fn(self.config, self.params),
                               prepare_fn=None)

  def decoding_form(self) -> "Model":
    """`prepared()` computed once on the device and kept with this model.

    The host-side entry points (`generate`, `speculative_generate`) pass this to
    their programs, so repeated calls do not rebuild the decoding form each time
    (on SmolLM2-135M that rebuild moved 1 GB and cost ~0.17 s per call). It holds a
    second copy of the weights for as long as this model lives; with params that
    are traced (inside a jitted function) it is `prepared()` itself.
    """
    if self.prepare_fn is None:
      return self
    leaves = tuple(jax.tree_util.tree_leaves(self.params))
    if any(isinstance(x, jax.core.Tracer) for x in leaves):
      return self.prepared()
    kept = self.__dict__.get("_decoding_form")
    if kept is None or len(kept[0]) != len(leaves) or any(
        a is not b for a, b in zip(kept[0], leaves)):
      kept = (leaves, _prepare(self))
      object.__setattr__(self, "_decoding_form", kept)  # a cache, not state: frozen stays true
    return kept[1]

  def init_cache(self, batch: int, length: int, dtype=None):
    """A zeroed K/V cache of `batch` rows and `length` slots (dtype: the model's)."""
    return self.init_cache_fn(self.config, batch, length,
                              self.dtype if dtype is None else dtype)

  def logits(self, tokens) -> jax.Array:
    """f32 logits [B, T, V] of a plain causal forward pass with no cache.

    Callable inside jitted code too (a teacher inside a training step); ids are
    range-checked only when they are concrete.
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    if tokens.ndim != 2:
      raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    if not isinstance(tokens, jax.core.Tracer):
      _check_token_range(tokens, self.vocab_size)
    return _full_logits(self, tokens)

  def num_params(self) -> int:
    """Total number of parameters (elements of every params leaf; an int8 weight counts
    its weight's elements, not its scales: `jspec.core.quant`)."""
    return quant.num_elements(self.params)

  def num_bytes(self) -> int:
    """Bytes of the params as held (an int8 weight: its int8 values and its scales)."""
    return quant.num_bytes(self.params)


def _check_token_range(tokens, vocab_size: int) -> None:
  arr = np.asarray(tokens)
  if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
    raise ValueError(
        f"token ids must lie in [0, {vocab_size}); got min {arr.min()}, max {arr.max()}")


@jax.jit
def _prepare(model: Model) -> Model:
  return model.prepared()


@jax.jit
def _full_logits(model: Model, tokens: jax.Array) -> jax.Array:
  # cache=None asks the model for a cache-free causal pass over the block.
  start = jnp.zeros((tokens.shape[0],), jnp.int32)
  logits, _, _ = model.apply(tokens, None, start)
  return logits


def _flatten(model: Model):
  return (model.params,), (model.config, model.apply_fn, model.init_cache_fn, model.eos_ids,
                           model.axes_fn, model.prepare_fn, model.head_fn, model.features_fn)


def _flatten_with_keys(model: Model):
  return ((jax.tree_util.GetAttrKey("params"), model.params),), _flatten(model)[1]


def _unflatten(aux, children):
  config, apply_fn, init_cache_fn, eos_ids, axes_fn, prepare_fn, head_fn, features_fn = aux
  return Model(params=children[0], config=config, apply_fn=apply_fn,
               init_cache_fn=init_cache_fn, eos_ids=eos_ids, axes_fn=axes_fn,
               prepare_fn=prepare_fn, head_fn=head_fn, features_fn=features_fn)


jax.tree_util.register_pytree_with_keys(Model, _flatten_with_keys, _unflatten, _flatten)
