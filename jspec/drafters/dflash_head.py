"""The DFlash drafter's network: its config, its params tree and its pure forward pass.

`jspec.drafters.dflash` builds the drafter (`DFlash`: init, propose, propose_tree) on top of
this. A DFlash drafter (Chen et al., "DFlash: Block Diffusion for Flash Speculative Decoding",
z-lab) is a stack of Qwen3-style decoder layers that proposes a whole block in one pass:

    ctx_j   = hidden_norm(fc([h^a_j; h^b_j; ...]))   the target's features at slot j, fused
    block   = [t_{L-1}, m, m, ..., m]                 the anchor and bs-1 mask tokens, at
                                                      positions L-1 .. L-2+bs
    layer:  x = x + attn(q = block, k/v = [ctx slots < L-1 ; block]),  then the MLP

Each layer's keys and values of the context come from its own k_proj / v_proj of ctx (with
its k_norm and rotary at the context's own positions), never from the layer's input: they
depend on the target's features alone, so they are computed once per slot and kept (the
drafter's cache, `context_kv`). Inside the block attention is not causal. The final norm and
an LM head turn block slot i (1..bs-1) into the distribution of the token at position
L-1+i, the i-th draft.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core import nn as layers

# The KV order of the context cache and of the block's own keys: both [B, Hkv, S, Dh].
_KV = layers.KVLayout("bhsd", "bhsd")


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
  """Shape and constants of a DFlash drafter (Hugging Face-style names)."""

  hidden_size: int  # D, the target's
  vocab_size: int  # V, the target's
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  intermediate_size: int
  num_layers: int
  block_size: int  # bs: the anchor and bs - 1 mask tokens; at most bs - 1 drafts a round
  mask_token_id: int
  # Target layers (0-based layer outputs, jspec's numbering) whose outputs are fused.
  feature_layers: tuple[int, ...] = (0,)
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: Any = None  # jspec.core.nn.Llama3Scaling / LinearScaling, or None
  # How `init_params` draws; not part of the network (left out of equality and hashing).
  initializer_range: float = dataclasses.field(default=0.02, compare=False)

  def __post_init__(self):
    object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
    object.__setattr__(self, "rope_scaling", layers.option_from_dict(self.rope_scaling))
    for name in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "intermediate_size", "num_layers"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"DFlashConfig.{name} must be an integer >= 1, got {value!r}")
    if isinstance(self.block_size, bool) or not isinstance(self.block_size, (int, np.integer)) \
        or self.block_size < 2:
      raise ValueError(f"DFlashConfig.block_size must be an integer >= 2 (the anchor and at "
                       f"least one mask token), got {self.block_size!r}")
    if not 0 <= int(self.mask_token_id) < self.vocab_size:
      raise ValueError(f"DFlashConfig.mask_token_id {self.mask_token_id} is outside the "
                       f"vocabulary [0, {self.vocab_size})")
    if not self.feature_layers or any(i < 0 for i in self.feature_layers):
      raise ValueError(f"DFlashConfig.feature_layers must be a non-empty tuple of layer "
                       f"indices >= 0, got {self.feature_layers}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                       f"num_key_value_heads ({self.num_key_value_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")

  @property
  def max_drafts(self) -> int:
    """The most drafts a round can take: the block's mask slots, bs - 1."""
    return int(self.block_size) - 1

  @property
  def feature_width(self) -> int:
    """Width of the target features read: len(feature_layers) * D."""
    return self.hidden_size * len(self.feature_layers)


def param_shapes(config: DFlashConfig) -> dict:
  """The params tree as shapes (what `init_params` builds); layer params are stacked on a
  leading axis of num_layers."""
  c = config
  D, F, NL = c.hidden_size, c.intermediate_size, c.num_layers
  H, Hkv, Dh = c.num_attention_heads, c.num_key_value_heads, c.head_dim
  return {
      "fc": {"kernel": (c.feature_width, D)},
      "hidden_norm": {"scale": (D,)},
      "norm": {"scale": (D,)},
      "layers": {
          "input_norm": {"scale": (NL, D)}, "wq": (NL, D, H, Dh), "wk": (NL, D, Hkv, Dh),
          "wv": (NL, D, Hkv, Dh), "wo": (NL, H, Dh, D), "q_norm": {"scale": (NL, Dh)},
          "k_norm": {"scale": (NL, Dh)}, "mlp_norm": {"scale": (NL, D)},
          "w_gate": (NL, D, F), "w_up": (NL, D, F), "w_down": (NL, F, D)}}


def head_dtype(params) -> Any:
  """The dtype the drafter computes in: its attention weights'."""
  return params["layers"]["wq"].dtype


@functools.partial(jax.jit, static_argnums=(0, 2))
def init_params(config: DFlashConfig, key: jax.Array, dtype=jnp.float32) -> dict:
  """Random params: normal(0, initializer_range) matrices, unit norms."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(
      param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))
  sizes = [int(np.prod(shape)) for _, shape in flat]
  noise = config.initializer_range * jax.random.normal(key, (sum(sizes),), jnp.float32)
  leaves, offset = [], 0
  for (path, shape), size in zip(flat, sizes):
    if "scale" in jax.tree_util.keystr(path):
      leaves.append(jnp.ones(shape, dtype))
    else:
      leaves.append(noise[offset:offset + size].reshape(shape).astype(dtype))
    offset += size
  return jax.tree_util.tree_unflatten(treedef, leaves)


def check_params(params: Any, config: DFlashConfig, where: str = "DFlash params") -> None:
  """Raise ValueError naming the first missing, extra or misshapen tensor."""
  want = {jax.tree_util.keystr(p): s for p, s in jax.tree_util.tree_flatten_with_path(
      param_shapes(config), is_leaf=lambda x: isinstance(x, tuple))[0]}
  try:
    got = {jax.tree_util.keystr(p): tuple(np.shape(x))
           for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  except Exception as e:  # noqa: BLE001 (anything unflattenable is a bad input)
    raise ValueError(f"{where}: not a params tree: {e}") from e
  missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
  if missing or extra:
    raise ValueError(f"{where} do not match the DFlash config: missing tensors {missing}, "
                     f"unexpected tensors {extra}")
  for key, shape in want.items():
    if got[key] != shape:
      raise ValueError(f"{where}: tensor {key} has shape {got[key]}, but the DFlash config "
                       f"(hidden {config.hidden_size}, {config.num_layers} layers, heads "
                       f"{config.num_attention_heads}/{config.num_key_value_heads}x"
                       f"{config.head_dim}, mlp {config.intermediate_size}, "
                       f"{len(config.feature_layers)} feature layers) gives {shape}")


# ----------------------------------------------------------------------------- forward


def _layer(params, i: int):
  return jax.tree_util.tree_map(lambda x: x[i], params["layers"])


def context(config: DFlashConfig, params, features: jax.Array) -> jax.Array:
  """ctx = hidden_norm(fc(features)): features [B, T, n * D] -> [B, T, D]."""
  dtype = head_dtype(params)
  x = jnp.einsum("bti,id->btd", features.astype(dtype), params["fc"]["kernel"])
  return layers.RMSNorm()(x, params["hidden_norm"], config.rms_norm_eps)


def _keys_values(config: DFlashConfig, w, x, positions):
  """A layer's k (normed, rotated) and v of inputs x [B, T, D]: [B, Hkv, T, Dh] each."""
  k = jnp.einsum("btd,dhk->bthk", x, w["wk"])
  k = layers.RMSNorm()(k, w["k_norm"], config.rms_norm_eps)
  k = layers.rope(k, positions, config.rope_theta, config.rope_scaling)
  v = jnp.einsum("btd,dhk->bthk", x, w["wv"])
  return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def context_kv(config: DFlashConfig, params, features, positions):
  """Every layer's keys and values of the context: features [B, T, n * D] at rotary
  positions [B, T] -> (k, v), each [NL, B, Hkv, T, Dh]."""
  ctx = context(config, params, features)
  ks, vs = zip(*(_keys_values(config, _layer(params, i), ctx, positions)
                 for i in range(config.num_layers)))
  return jnp.stack(ks), jnp.stack(vs)


def block_forward(config: DFlashConfig, params, embeddings, positions, ctx_k, ctx_v,
                  ctx_visible):
  """The layers over a block: hidden states after the final norm, [B, T, D].

  embeddings [B, T, D] the block's token embeddings at rotary positions [B, T]; ctx_k,
  ctx_v [NL, B, Hkv, C, Dh] the context's keys and values (`context_kv`, or the cache);
  ctx_visible bool [B, T, C], which context slots each block position sees. Block positions
  see each other in both directions (no causal mask inside the block)."""
  c = config
  norm = layers.RMSNorm()
  dtype = head_dtype(params)
  x = embeddings.astype(dtype)
  B, T = x.shape[:2]
  visible = jnp.concatenate([ctx_visible, jnp.ones((B, T, T), bool)], axis=-1)
  for i in range(c.num_layers):
    w = _layer(params, i)
    with jax.named_scope("dflash_attention"):
      h = norm(x, w["input_norm"], c.rms_norm_eps)
      q = jnp.einsum("btd,dhk->bthk", h, w["wq"])
      q = layers.rope(norm(q, w["q_norm"], c.rms_norm_eps), positions, c.rope_theta,
                      c.rope_scaling)
      k, v = _keys_values(c, w, h, positions)
      k = jnp.concatenate([ctx_k[i].astype(dtype), k], axis=2)  # [B, Hkv, C + T, Dh]
      v = jnp.concatenate([ctx_v[i].astype(dtype), v], axis=2)
      out = layers.attention(q, k, v, visible, c.head_dim ** -0.5, layout=_KV)
      x = x + jnp.einsum("bthk,hkd->btd", out, w["wo"])
    with jax.named_scope("dflash_mlp"):
      x = x + layers.GatedMLP("silu")(norm(x, w["mlp_norm"], c.rms_norm_eps), w)
  return norm(x, params["norm"], c.rms_norm_eps)
