"""Reference decoder: the Llama family and its relatives, written once as pure functions.

Default options give Llama (RMSNorm, rotary embeddings with configurable theta,
grouped-query attention, SwiGLU MLP, tied or untied embeddings). Small option
types (`jspec/core/nn.py`) and a few fields that mirror Hugging Face config fields
cover Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm), Gemma (GeGLU, (1 + w) norms,
scaled embeddings), Gemma 2 (soft-capping, sliding-window layers, post norms) and
GPT-2 (learned positions, LayerNorm, GELU MLP, biases). The config speaks Hugging
Face `LlamaConfig` field names.

Two faces over the same math:
  * `apply(config, params, tokens, cache, start, block_mask, depth)`: the pure
    model contract the decoding engine calls (docs/architecture.md), with a static-shape
    KV cache;
  * `Transformer`, a Flax NNX module holding the same params as `nnx.Param`s,
    trainable with optax like any NNX model.

Params are a plain nested dict with every layer stacked on a leading axis L, so
a cache-free pass (training) is one `lax.scan` over layers (compile time
independent of depth):

    embed [V, D]                 pos_embed [P, D]        (Learned positions only)
    layers/attn_norm/scale [L, D]    (+ /bias for LayerNorm; same for every norm)
    layers/wq [L, D, H, Dh]   layers/wk, wv [L, D, Hkv, Dh]   layers/wo [L, H, Dh, D]
    layers/bq [L, H, Dh]      layers/bk, bv [L, Hkv, Dh]      layers/bo [L, D]   (biases)
    layers/q_norm, k_norm     [L, Dh]                         (qk_norm)
    layers/post_attn_norm, post_mlp_norm                      (post_norms)
    layers/mlp_norm
    layers/w_gate, w_up [L, D, F]   layers/w_down [L, F, D]   (+ b_gate, b_up, b_down)
    final_norm
    lm_head [D, V]                                            (absent when tied)

`quantize_params` (and `quantize_model`, what `jspec.load(..., weights="int8")` calls)
stores each of those matrices, the embedding and the LM head as narrow values with scales
(`jspec.core.quant.QuantWeight`: int8 or fp8 per output channel, int4 affine in groups of
32; the scales keep the layer axis).
Every weight product and the embedding lookup go through `jspec.core.quant`, which calls
exactly `jnp.einsum` / `jnp.take` on float weights, so float models compute as before.

Decoding unrolls the layers instead, over per-layer weights that `unstack`
(the model's `prepare_fn`) cuts once per decoding program, before the loop. A
scan slices each layer's weights out of the stacked arrays on every step, and
XLA CPU copies those slices: 12.6 MB per step for the shipped 5.3M-parameter
target, which made a batch-1 step about 1.7x slower.

The decoding form also fuses q, k, v into one wqkv [D, (H + 2 Hkv) Dh] and gate,
up into one w_gate_up [D, 2F] (biases likewise); the cut copies each layer once
anyway, so the concatenations ride on that copy. One product where there were three
(q, k, v) or two (gate, up): on SmolLM2-135M's shapes, 30 layers at one row took
16-18 ms fused against 25-26 ms apart (two interleaved runs, medians of 20 calls).
Every matrix keeps its input axis major, as stored. Which layout XLA CPU multiplies
fastest depends on the machine and on the rows: with output-major MLP matrices
([out, in]) a 5-token SmolLM2-135M call cost 2.04-2.10x a 1-token one on an AMD EPYC
against 1.63-1.75x input-major, at the same 1-token time (four layouts compiled in
one process and timed in turns, twice; docs/benchmarks.md). And written [H, Dh, D],
the attention projections made XLA CPU emit a loop ten times slower than the product.

Cache: one K and one V buffer per layer ({"k": [L arrays], "v": [L arrays]}), in the
axis order of the config's `kv_layout` (`jspec.core.nn.KVLayout`), by default chosen
by the backend. On CPU, K is [B, Hkv, Dh, S] and V [B, Hkv, S, Dh]: the slot axis
minor in K, the head dim minor in V, which is how XLA CPU's batched attention matmuls
read their right operand. With per-layer buffers the opposite layouts (K [.., S, Dh],
V [.., Dh, S]) made XLA transpose every layer's cache on every step: a batch-8 / 32
decode step took 1.25x / 1.38x as long (5 interleaved runs of 128-256 tokens each); at
batch 1 the two layouts time the same. On other backends the buffers are slot-major,
[B, S, Hkv, Dh] for both, the order GPU and TPU attention kernels expect. Separate
buffers per layer let each step write its new slots in place and read the layer's
cache without a copy, which one stacked [L, ...] buffer did not allow once the layers
are unrolled.

One case differs: a one-token step at batch 1 (plain decoding, a draft model's
steps). There XLA drops the size-1 batch axis from the attention matmuls, and the
reshaped read of the just-written buffer made it copy every layer's K/V buffers
at each step. That step attends to the cache as it was before the step and to its
own K/V apart (`layers.step_attention`), then writes them: 1.17-1.23x faster
batch-1 steps (three interleaved comparisons, 256 tokens, 7-9 repeats). At batch 8
the same split was 0.77x and for verify blocks 0.93x, so they keep one attention
over the updated cache. Even so, XLA CPU's default copy insertion still copied
each buffer twice per step (it cannot prove the read precedes the in-place
write); jspec's programs compile with the region analysis that removes those
copies (`jspec.core.compilation.CPU_OPTIONS`: 10% more tokens/s at batch 1 on
SmolLM2-135M).

Attention reads only a prefix of the cache: the shortest of the static spans 128,
256, 512, ... slots (then the whole cache) that holds every row's live slots,
max(start) + T, chosen once per call and applied by a `lax.switch` around each
layer's attention (`min_attention_span`; the CPU backend's default). Before, a
round read all S slots of every row: SmolLM2-135M at batch 32 ran the same 48 new
tokens 4.1x slower with 4,096 slots than with 256. The switch's branches only read
the cache, so XLA passes it to them without a copy (a 6 GB cache at batch 32 and
4,096 slots would show one at once); their per-round cost at 4,096 slots was
within noise of 256 slots' (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jspec.core.model import Model, OutputHead
from jspec.core import nn as layers
from jspec.core import quant
from jspec.core.nn import DenseMLP, GatedMLP, KVLayout, LayerNorm, Learned, RMSNorm, Rotary

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Decoder hyperparameters under Hugging Face `LlamaConfig` names, plus options."""

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int | None = None  # None: MHA (= num_attention_heads)
  head_dim: int | None = None  # None: hidden_size // num_attention_heads
  rms_norm_eps: float = 1e-6  # the eps of every norm, RMS or LayerNorm
  rope_theta: float = 10000.0
  max_position_embeddings: int = 2048
  tie_word_embeddings: bool = False
  initializer_range: float = 0.02
  # Architecture options; the defaults are Llama's.
  norm: RMSNorm | LayerNorm = RMSNorm()
  positions: Rotary | Learned = Rotary()
  mlp: GatedMLP | DenseMLP = GatedMLP()
  qkv_bias: bool = False  # biases on q, k, v projections (Qwen2, GPT-2)
  o_bias: bool = False  # bias on the attention output projection (GPT-2)
  mlp_bias: bool = False  # biases on the MLP projections (GPT-2)
  qk_norm: bool = False  # per-head norm of q and k before rotary (Qwen3)
  post_norms: bool = False  # norms on attention and MLP outputs too (Gemma 2)
  embedding_multiplier: float = 1.0  # Gemma: sqrt(hidden_size)
  query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma 2)
  attn_logit_softcapping: float | None = None  # Gemma 2
  final_logit_softcapping: float | None = None  # Gemma 2
  sliding_window: int | None = None  # window of "sliding_attention" layers
  layer_types: tuple[str, ...] | None = None  # per layer; None: all sliding if window set
  # Axis order of the K/V cache buffers; None: chosen by the backend the cache is made
  # on (`layers.kv_layout_for`: XLA CPU's order on CPU, slot-major elsewhere).
  kv_layout: KVLayout | None = None
  # The shortest cache prefix a round's attention reads (`layers.attention_spans`): rounds
  # read the smallest power-of-two multiple of it that holds every row's live slots.
  # None: the backend's default (128 slots on CPU; the whole cache elsewhere); 0: always
  # the whole cache.
  min_attention_span: int | None = None
  # Layers (0-based) whose outputs `apply` returns as `hidden`, concatenated along the
  # last axis; empty: the final normed hidden state (`with_feature_layers`).
  feature_layers: tuple[int, ...] = ()

  def __post_init__(self):
    if self.num_key_value_heads is None:
      object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
    if self.head_dim is None:
      object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
    if self.layer_types is not None:
      object.__setattr__(self, "layer_types", tuple(self.layer_types))
    object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
    bad = [i for i in self.feature_layers if not 0 <= i < int(self.num_hidden_layers)]
    if bad:
      raise ValueError(f"feature_layers {bad} outside the model's {self.num_hidden_layers} "
                       f"layers (0-based)")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim",
                 "max_position_embeddings"):
      if int(getattr(self, name)) < 1:
        raise ValueError(f"TransformerConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
          f"num_key_value_heads ({self.num_key_value_heads})")
    if isinstance(self.positions, Rotary) and self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    if self.layer_types is not None:
      if len(self.layer_types) != self.num_hidden_layers:
        raise ValueError(f"layer_types has {len(self.layer_types)} entries for "
                         f"{self.num_hidden_layers} layers")
      unknown = set(self.layer_types) - {FULL, SLIDING}
      if unknown:
        raise ValueError(f"unknown layer types {sorted(unknown)}; known: {FULL}, {SLIDING}")
      if SLIDING in self.layer_types and not self.sliding_window:
        raise ValueError("sliding_attention layers need sliding_window")

  def cache_layout(self) -> KVLayout:
    """The K/V layout this config's caches have on the current default backend."""
    return self.kv_layout or layers.kv_layout_for(jax.default_backend())

  def windows(self) -> tuple[int, ...]:
    """Attention window per layer; 0 means the whole prefix."""
    window = int(self.sliding_window or 0)
    types = self.layer_types or ((SLIDING if window else FULL),) * self.num_hidden_layers
    return tuple(window if t == SLIDING else 0 for t in types)

  def to_dict(self) -> dict:
    """JSON-ready fields; `from_dict` inverts it."""
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, fields: dict) -> "TransformerConfig":
    """Build from `to_dict` output or a Llama-style dict, ignoring fields it does not use."""
    names = {f.name for f in dataclasses.fields(cls)}
    kept = {k: layers.option_from_dict(v) for k, v in fields.items() if k in names}
    return cls(**kept)


# ----------------------------------------------------------------------------- params


@functools.partial(jax.jit, static_argnums=(0, 2))
def init_params(config: TransformerConfig, key: jax.Array, dtype=jnp.float32) -> dict:
  """Random params: normal(0, initializer_range) weights, unit norms, zero biases."""
  c = config
  L, D, F, V = c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.vocab_size
  H, Hkv, Dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  shapes = {"wq": (L, D, H, Dh), "wk": (L, D, Hkv, Dh), "wv": (L, D, Hkv, Dh),
            "wo": (L, H, Dh, D), "w_down": (L, F, D)}
  for name in c.mlp.weight_names():
    shapes[name] = (L, D, F)
  keys = jax.random.split(key, len(shapes) + 3)

  def normal(k, shape):
    return (c.initializer_range * jax.random.normal(k, shape, jnp.float32)).astype(dtype)

  lay = {name: normal(k, shape) for k, (name, shape) in zip(keys[3:], shapes.items())}
  zeros = lambda *shape: jnp.zeros(shape, dtype)
  if c.qkv_bias:
    lay.update(bq=zeros(L, H, Dh), bk=zeros(L, Hkv, Dh), bv=zeros(L, Hkv, Dh))
  if c.o_bias:
    lay["bo"] = zeros(L, D)
  if c.mlp_bias:
    lay.update({"b_" + n[2:]: zeros(L, F) for n in c.mlp.weight_names()}, b_down=zeros(L, D))
  norms = ["attn_norm", "mlp_norm"] + (["post_attn_norm", "post_mlp_norm"] if c.post_norms else [])
  for name in norms:
    lay[name] = c.norm.params((L, D), dtype)
  if c.qk_norm:
    lay["q_norm"] = c.norm.params((L, Dh), dtype)
    lay["k_norm"] = c.norm.params((L, Dh), dtype)
  params = {"embed": normal(keys[0], (V, D)), "layers": lay,
            "final_norm": c.norm.params((D,), dtype)}
  if isinstance(c.positions, Learned):
    params["pos_embed"] = normal(keys[2], (c.max_position_embeddings, D))
  if not c.tie_word_embeddings:
    params["lm_head"] = normal(keys[1], (D, V))
  return params


def init_cache(config: TransformerConfig, batch: int, length: int, dtype=jnp.float32) -> dict:
  """Zeroed K/V buffers for `batch` rows of `length` slots, one pair per layer, in the
  config's `cache_layout()` (on CPU: L x K [B, Hkv, Dh, S], L x V [B, Hkv, S, Dh])."""
  c = config
  L, Hkv, Dh = c.num_hidden_layers, c.num_key_value_heads, c.head_dim
  layout = c.cache_layout()
  return {name: [jnp.zeros(layout.shape(name, batch, Hkv, length, Dh), dtype) for _ in range(L)]
          for name in ("k", "v")}


def unstack(config: TransformerConfig, params: dict) -> dict:
  """Params with `layers` as a list of L per-layer dicts, q/k/v and gate/up fused (the
  decoding form; module docstring).

  `apply` accepts either form; already-unstacked params come back unchanged.
  """
  if isinstance(params["layers"], list):
    return params
  L = config.num_hidden_layers

  def fuse(w):
    """q, k, v as one [D, (H + 2 Hkv) Dh] matrix; gate and up as one [D, 2F]."""
    w = dict(w)
    # quant's reshape and concatenation: an int8 weight's scales are fused with its values.
    w["wqkv"] = quant.concatenate([quant.matrix(w.pop(n)) for n in ("wq", "wk", "wv")], axis=1)
    if "bq" in w:
      w["bqkv"] = jnp.concatenate([w.pop(n).reshape(-1) for n in ("bq", "bk", "bv")])
    if "w_gate" in w:
      w["w_gate_up"] = quant.concatenate([w.pop("w_gate"), w.pop("w_up")], axis=1)
      if "b_gate" in w:
        w["b_gate_up"] = jnp.concatenate([w.pop("b_gate"), w.pop("b_up")])
    return w

  out = dict(params)
  out["layers"] = [fuse(jax.tree_util.tree_map(lambda a, i=i: a[i], params["layers"]))
                   for i in range(L)]
  return out


# The axes each product contracts, per weight name: of one layer's weight (the decoding
# form's fused wqkv and w_gate_up included); a stacked weight has the layer axis before
# them. Everything else (norms, biases, learned positions) stays as stored.
_CONTRACTED = types.MappingProxyType({
    "wq": (0,), "wk": (0,), "wv": (0,), "wo": (0, 1), "wqkv": (0,),
    "w_gate": (0,), "w_up": (0,), "w_down": (0,), "w_gate_up": (0,)})
# Top-level weights: the embedding is scaled per row (the tied product "btd,vd->btv"
# contracts D; the lookup gathers rows and their scales), the untied head per column.
_CONTRACTED_TOP = types.MappingProxyType({"embed": (1,), "lm_head": (0,)})


def contracted_axes(path: str) -> tuple[int, ...] | None:
  """The axes a product contracts of param `path` ("embed", "lm_head", "layers/wq", ...;
  a layer's param without its layer axis), or None for a param no product takes as a
  weight (norms, biases)."""
  name = path.split("/")[-1]
  table = _CONTRACTED if path.startswith("layers/") else _CONTRACTED_TOP
  return table.get(name)


@functools.partial(jax.jit, static_argnames=("mode",))
def quantize_params(params: dict, mode: str = "int8") -> dict:
  """params with every matrix (q, k, v, o, the MLP's; the embedding and LM head) as a
  `jspec.core.quant.QuantWeight` in `mode` (`jspec.core.quant.MODES`: "int8" and "fp8" per
  output channel, "int4" affine in groups of 32 inputs); norms, biases and learned positions as
  they are. Takes the stored form (layers stacked, the scales keep the layer axis:
  [L, 1, H, Dh] for wq [L, D, H, Dh]) or the decoding form (a list of layers); weights
  already quantized are kept."""
  if mode is None:
    return params
  if mode not in quant.MODES:
    raise ValueError(f"quantize mode must be one of {quant.MODES}, got {mode!r}")

  def one(w, axes):
    return w if isinstance(w, quant.QuantWeight) else quant.quantize(w, axes, mode)

  def layer(w, shift):
    return {n: one(x, tuple(a + shift for a in _CONTRACTED[n])) if n in _CONTRACTED else x
            for n, x in w.items()}

  out = {n: one(x, _CONTRACTED_TOP[n]) if n in _CONTRACTED_TOP else x
         for n, x in params.items()}
  if isinstance(params["layers"], list):
    out["layers"] = [layer(w, 0) for w in params["layers"]]
  else:
    out["layers"] = layer(params["layers"], 1)  # [L, ...]: the layer axis comes first
  return out


def quantize_model(model: Model, weights: str = "int8") -> Model:
  """`model` (of this architecture) with quantized weights (`quantize_params`): a new
  Model, nothing shared with `model` but its immutable config, functions, tokenizer and
  the arrays left as stored (jax arrays are never written in place); `weights` None gives
  `model` itself. ValueError for anything but None or one of `jspec.core.quant.MODES`, or a
  model of another architecture, before any tracing."""
  if weights is None:
    return model
  if not (isinstance(weights, str) and weights in quant.MODES):
    raise ValueError(f"weights must be None or one of "
                     f"{', '.join(repr(m) for m in quant.MODES)}, got {weights!r}")
  if model.apply_fn is not apply or not isinstance(model.config, TransformerConfig):
    raise ValueError(f"quantized weights are for models of jspec.models (the reference "
                     f"decoder); this model's apply is "
                     f"{getattr(model.apply_fn, '__qualname__', '?')}")
  return dataclasses.replace(model, params=quantize_params(model.params, weights))


def _qkv(h, w, c):
  """q [B, T, H, Dh], k, v [B, T, Hkv, Dh]: three projections (training form) or one
  product with the fused matrix (decoding form)."""
  if "wqkv" not in w:
    return (_project(h, w["wq"], w.get("bq")), _project(h, w["wk"], w.get("bk")),
            _project(h, w["wv"], w.get("bv")))
  y = quant.einsum("btd,dn->btn", h, w["wqkv"])  # [B, T, (H + 2 Hkv) Dh]
  if "bqkv" in w:
    y = y + w["bqkv"][None, None, :]
  H, Hkv, Dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  q, k, v = jnp.split(y, [H * Dh, (H + Hkv) * Dh], axis=-1)
  B, T = h.shape[:2]
  return q.reshape(B, T, H, Dh), k.reshape(B, T, Hkv, Dh), v.reshape(B, T, Hkv, Dh)


# ----------------------------------------------------------------------------- forward


def _visibility(start, block_mask, depth, slots: int):
  """Which slots each block token sees, and the position held in every slot.

  Returns visible bool [B, T, S] (the contract of docs/architecture.md) and kv_pos int32 [B, S].
  """
  T = block_mask.shape[-1]  # block_mask [B, T, T], depth [B, T]
  s = jnp.arange(slots, dtype=jnp.int32)[None, :]  # [1, S]
  rel = s - start[:, None]  # [B, S] slot offset inside the block
  in_block = (rel >= 0) & (rel < T)
  rel_c = jnp.clip(rel, 0, T - 1)
  from_block = jnp.take_along_axis(block_mask, rel_c[:, None, :], axis=2) & in_block[:, None, :]
  visible = (rel < 0)[:, None, :] | from_block
  kv_pos = jnp.where(in_block, start[:, None] + jnp.take_along_axis(depth, rel_c, axis=1), s)
  return visible, kv_pos


def _write(buffer, new, start, axis: int):
  """Write new [B, ..., T, ...] into buffer [B, ..., S, ...] at per-row slot start[b]."""

  def one(buf, blk, s):
    index = [jnp.int32(0)] * buf.ndim
    index[axis - 1] = s
    return lax.dynamic_update_slice(buf, blk, index)

  return jax.vmap(one)(buffer, new.astype(buffer.dtype), start)


def _project(h, w, b=None):
  y = quant.einsum("btd,dhk->bthk", h, w)
  return y if b is None else y + b[None, None]


def apply(config: TransformerConfig, params: dict, tokens, cache, start,
          block_mask=None, depth=None):
  """The model contract. See module docstring and docs/architecture.md."""
  c = config
  B, T = tokens.shape
  layout = c.cache_layout()
  if block_mask is None:
    block_mask = jnp.tril(jnp.ones((T, T), bool))
  if depth is None:
    depth = jnp.arange(T, dtype=jnp.int32)
  # A mask [T, T] and depths [T] shared by the rows, or per row ([B, T, T], [B, T]: a
  # dynamic tree, different in every row).
  block_mask = jnp.broadcast_to(block_mask, (B, T, T))
  depth = jnp.broadcast_to(depth, (B, T)).astype(jnp.int32)
  start = start.astype(jnp.int32)
  positions = start[:, None] + depth  # [B, T]

  x = quant.take(params["embed"], tokens, axis=0)  # [B, T, D]
  if c.embedding_multiplier != 1.0:
    x = x * jnp.asarray(c.embedding_multiplier, x.dtype)
  if isinstance(c.positions, Learned):
    x = x + jnp.take(params["pos_embed"], positions, axis=0)
  rotary = c.positions if isinstance(c.positions, Rotary) else None

  if cache is None:  # cache-free pass over the block alone (training, tests)
    visible = block_mask
    kv_pos = positions
  else:
    slots = cache["k"][0].shape[layout.slot_axis("k")]
    visible, kv_pos = _visibility(start, block_mask, depth, slots)
  # Attention reads the shortest static span of the cache that holds every row's live
  # slots (a lax.switch over spans; module docstring): the round's cost follows the
  # longest live row, not the cache's capacity.
  spans = (() if cache is None else
           layers.attention_spans(slots, jax.default_backend(), c.min_attention_span))
  if len(spans) > 1:
    which_span = layers.span_index(spans, jnp.max(start) + T)
  sliding = any(c.windows())  # static: full-attention models skip the window mask
  # One token at batch 1 attends to the cache as it was, and to its own K/V apart
  # (module docstring: 1.17-1.23x faster steps on XLA CPU here).
  split_step = cache is not None and B == 1 and T == 1  # static
  if split_step:
    before_start = jnp.arange(visible.shape[2])[None, None, :] < start[:, None, None]  # [B,1,S]
  behind = positions[:, :, None] - kv_pos[:, None, :]  # [B, T, S] distance back
  scale = (c.query_pre_attn_scalar if c.query_pre_attn_scalar else c.head_dim) ** -0.5
  norm = functools.partial(c.norm, eps=c.rms_norm_eps)

  def layer(x, w, layer_cache, window):
    """One decoder layer; layer_cache {"k", "v"} of this layer or None."""
    with jax.named_scope("attention"):
      h = norm(x, w["attn_norm"])
      q, k, v = _qkv(h, w, c)
      if c.qk_norm:
        q, k = norm(q, w["q_norm"]), norm(k, w["k_norm"])
      if rotary is not None:
        q = layers.rope(q, positions, c.rope_theta, rotary.scaling)
        k = layers.rope(k, positions, c.rope_theta, rotary.scaling)
      seen = visible & ((window == 0) | (behind < window)) if sliding else visible
      new = {"k": k, "v": v}  # [B, T, Hkv, Dh]
      arranged = {n: layout.arrange(n, new[n]) for n in new}  # the layout, T for S
      if layer_cache is not None:
        old = layer_cache
        layer_cache = {n: _write(old[n], arranged[n], start, layout.slot_axis(n)) for n in new}
      if split_step:
        kv, seen = old, seen & before_start
      else:
        kv = arranged if layer_cache is None else layer_cache

      def attend(span, q, kv, seen):
        ks = layers.read_span(kv["k"], span, layout.slot_axis("k"))
        vs = layers.read_span(kv["v"], span, layout.slot_axis("v"))
        if split_step:
          return layers.step_attention(q, ks, vs, k, v, seen[..., :span], scale,
                                       c.attn_logit_softcapping, layout)
        return layers.attention(q, ks, vs, seen[..., :span], scale, c.attn_logit_softcapping,
                                layout)

      if len(spans) > 1:
        out = lax.switch(which_span, [functools.partial(attend, n) for n in spans], q, kv, seen)
      else:
        out = attend(seen.shape[-1], q, kv, seen)
      out = quant.einsum("bthk,hkd->btd", out, w["wo"])
      if "bo" in w:
        out = out + w["bo"][None, None, :]
      if c.post_norms:
        out = norm(out, w["post_attn_norm"])
      x = x + out
    with jax.named_scope("mlp"):
      out = c.mlp(norm(x, w["mlp_norm"]), w)
      if c.post_norms:
        out = norm(out, w["post_mlp_norm"])
      x = x + out
    return x, layer_cache

  stacked = not isinstance(params["layers"], list)
  if cache is None and stacked:
    # Training and full-sequence passes: one scan, compile time independent of depth.
    def scanned(x, inputs):
      w, window = inputs
      x = layer(x, w, None, window)[0]
      return x, (x if c.feature_layers else None)

    windows = jnp.asarray(c.windows(), jnp.int32)
    x, every = lax.scan(scanned, x, (params["layers"], windows))
    features = [every[i] for i in c.feature_layers]
  else:
    # Decoding: layers unrolled over per-layer weights and per-layer cache buffers.
    per_layer = unstack(c, params)["layers"]
    new_k, new_v, features = [], [], []
    for i, window in enumerate(c.windows()):
      layer_cache = None if cache is None else {"k": cache["k"][i], "v": cache["v"][i]}
      x, layer_cache = layer(x, per_layer[i], layer_cache, window)
      features += [x] * c.feature_layers.count(i)
      if layer_cache is not None:
        new_k.append(layer_cache["k"])
        new_v.append(layer_cache["v"])
    if cache is not None:
      cache = {"k": new_k, "v": new_v}
  hidden = norm(x, params["final_norm"])  # [B, T, D]
  if c.tie_word_embeddings:
    # Contract against embed [V, D] as stored: writing it as embed.T made XLA CPU copy
    # the whole transposed matrix on every call (8 MB at V 8192, D 256).
    logits = quant.einsum("btd,vd->btv", hidden, params["embed"],
                          preferred_element_type=jnp.float32)
  else:
    logits = quant.einsum("btd,dv->btv", hidden, params["lm_head"],
                          preferred_element_type=jnp.float32)
  if c.final_logit_softcapping:
    logits = jnp.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
  if c.feature_layers:  # intermediate features instead of the final hidden state
    hidden = jnp.concatenate(features, axis=-1)  # [B, T, len(feature_layers) * D]
  return logits, hidden, cache


# ----------------------------------------------------------------------------- NNX module


class _Group(nnx.Module):
  """A nested group of params (e.g. all layers, stacked on a leading axis)."""

  def __init__(self, params: dict):
    for name, value in params.items():
      setattr(self, name, _Group(value) if isinstance(value, dict) else nnx.Param(value))


class Transformer(nnx.Module):
  """Flax NNX face of the reference decoder: trainable, same params as `apply`.

      module = Transformer(config, rngs=nnx.Rngs(0))
      logits = module(tokens)                 # [B, T, V] f32, causal
      model = module.to_model()               # jspec.Model for decoding
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
    self.config = config
    for name, value in init_params(config, rngs.params(), dtype).items():
      setattr(self, name, _Group(value) if isinstance(value, dict) else nnx.Param(value))

  def params(self) -> dict:
    """The plain nested dict that `apply` consumes."""
    return nnx.to_pure_dict(nnx.state(self, nnx.Param))

  def __call__(self, tokens: jax.Array) -> jax.Array:
    start = jnp.zeros((tokens.shape[0],), jnp.int32)
    logits, _, _ = apply(self.config, self.params(), tokens, None, start)
    return logits

  def to_model(self) -> Model:
    """A `jspec.Model` holding this module's current params (for decoding)."""
    return make_model(self.config, self.params())


def logical_axes(config: TransformerConfig) -> tuple[dict, dict]:
  """Logical axis names of every param and cache dimension (jspec/core/sharding.py)."""
  params = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
  by_name = {
      "embed": ("vocab", "embed"), "pos_embed": ("sequence", "embed"),
      "lm_head": ("embed", "vocab"),
      "wq": ("layers", "embed", "heads", "head_dim"),
      "wk": ("layers", "embed", "kv_heads", "head_dim"),
      "wv": ("layers", "embed", "kv_heads", "head_dim"),
      "wo": ("layers", "heads", "head_dim", "embed"),
      "bq": ("layers", "heads", "head_dim"), "bk": ("layers", "kv_heads", "head_dim"),
      "bv": ("layers", "kv_heads", "head_dim"), "bo": ("layers", "embed"),
      "w_gate": ("layers", "embed", "mlp"), "w_up": ("layers", "embed", "mlp"),
      "w_down": ("layers", "mlp", "embed"), "b_gate": ("layers", "mlp"),
      "b_up": ("layers", "mlp"), "b_down": ("layers", "embed"),
  }

  def axes(path, leaf):
    names = [getattr(k, "key", None) for k in path]
    if names[-1] in by_name:
      return by_name[names[-1]]
    # Norm params: [L, D] in layers (q/k norms: [L, Dh]), [D] at the top.
    last = "head_dim" if names[-2] in ("q_norm", "k_norm") else "embed"
    return ("layers", last) if names[0] == "layers" else (last,)

  param_axes = jax.tree_util.tree_map_with_path(axes, params)
  L = config.num_hidden_layers
  layout = config.cache_layout()
  cache_axes = {name: [layout.axis_names(name)] * L for name in ("k", "v")}
  return param_axes, cache_axes


def output_head(config: TransformerConfig, params: dict) -> OutputHead:
  """The model contract's optional head: token embedding [V, D], untied LM head [D, V]."""
  softcap = config.final_logit_softcapping
  # As held: drafters that share the head (Medusa, EAGLE, DFlash, a reduced vocabulary)
  # read a quantized model's through quant.take / quant.einsum, and hold no float copy.
  return OutputHead(embed=params["embed"],
                    lm_head=None if config.tie_word_embeddings else params["lm_head"],
                    embedding_multiplier=float(config.embedding_multiplier),
                    final_logit_softcapping=float(softcap) if softcap else None)


def with_feature_layers(config: TransformerConfig, layers) -> TransformerConfig:
  """The model contract's optional `features_fn`: `config` returning the outputs of
  decoder layers `layers` (0-based) as `hidden`, concatenated."""
  return dataclasses.replace(config, feature_layers=tuple(layers))


def make_model(config: TransformerConfig, params: dict, **extra) -> Model:
  """Wrap `params` of this architecture as a `jspec.Model` (with sharding axes, the
  decoding form and the output head).

  `extra`: other `Model` fields, e.g. tokenizer= or eos_ids=.
  """
  return Model(params=params, config=config, apply_fn=apply, init_cache_fn=init_cache,
               axes_fn=logical_axes, prepare_fn=unstack, head_fn=output_head,
               features_fn=with_feature_layers, **extra)


def init(config: TransformerConfig, seed: int = 0, dtype=jnp.float32) -> Model:
  """A random-init `jspec.Model` of this architecture."""
  return make_model(config, init_params(config, jax.random.key(seed), dtype))

