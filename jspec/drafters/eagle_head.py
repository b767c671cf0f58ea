"""The EAGLE head itself: its config, its params tree and its decoder layers.

`jspec.drafters.eagle` builds the drafter (`Eagle`: init, propose, propose_tree,
save/load) on top of this. What lives here is the head's shape and the pure
functions over it: the params' shapes, init and check, the target's frozen
embedding and LM head, the attention masks the drafter's rounds use (causal,
tree), the scatter of K/V into the head's cache (one K/V pair per layer), and the
layers' forward pass. Split from eagle.py to keep each module readable.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jspec.core.model import Model
from jspec.core import nn as layers

# How the head's layer takes its pair (feature f, token embedding e), `EagleConfig.input_form`:
#   "fc"      x = fc([f; e]) (+ bias), then a pre-norm decoder layer: jspec's own heads and
#             EAGLE-1/2 (Li et al. 2024), whose published layer 0 has no input norm (attn_norm off)
#   "concat"  EAGLE-3's first layer as published (Li et al. 2025; SpecForge, vLLM speculators):
#             attention reads [norm(e); norm(f)] (2D wide), the residual is f (or norm(f) with
#             norm_before_residual); no fc
#   "mtp"     a multi-token-prediction module (DeepSeek-V3, Liu et al. 2024; Qwen3-Next; vLLM
#             speculators' "mtp"): x = proj([norm(e); norm(f)]) (no bias), a pre-norm decoder
#             layer with its input norm, then a final norm; the normed output is both the
#             feature fed to the next step and what the LM head reads (`jspec.MTP`)
INPUT_FORMS = ("fc", "concat", "mtp")


# ----------------------------------------------------------------------------- config and params


@dataclasses.dataclass(frozen=True)
class EagleConfig:
  """Shape and constants of an EAGLE head (Hugging Face-style names)."""

  hidden_size: int  # D, must equal the target's
  vocab_size: int  # V, must equal the target's
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  intermediate_size: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  initializer_range: float = 0.02
  # EAGLE-3 (Li et al. 2025): target layers (0-based) whose outputs the head fuses,
  # through a [n * D, D] projection, into the feature of each true pair; the head's own
  # outputs go through a norm before the LM head. Empty: EAGLE-1 (the final hidden state).
  feature_layers: tuple[int, ...] = ()
  # Options of the published layouts (`jspec.io.drafter_layouts`); the defaults are jspec's
  # own heads.
  input_form: str = "fc"  # INPUT_FORMS
  fc_bias: bool = True  # "fc": the fc's bias ("mtp": never)
  attn_norm: bool = True  # "fc": an RMSNorm before attention (EAGLE-1's layer 0 has none; "mtp": always)
  norm_before_residual: bool = False  # "concat": the residual stream starts at norm(f)
  qk_norm: bool = False  # per-head RMSNorm of q and k before rotary (Qwen3 layers)
  rope_scaling: Any = None  # jspec.core.nn.Llama3Scaling / LinearScaling, or None
  # The pair at slot 0, (0, e(t_0)), has no target feature. jspec's heads are trained with it;
  # the published ones never see it (their engines start at (h_0, e(t_1))): False hides it from
  # every later pair.
  zero_pair: bool = True
  # More EAGLE-3 options of vLLM speculators' Eagle3DraftModel (`jspec.io.layout_eagle3`):
  num_layers: int = 1  # decoder layers: the first as `input_form` says, then ordinary
  #                      pre-norm layers over D (their own input norm, no hidden_norm)
  norm_before_fc: bool = False  # fused: one RMSNorm over the n * D target features
  fc_norm: bool = False  # fused: one RMSNorm per target layer's D features, before the fc
  norm_output: bool = False  # fused: the final norm applied to the output, which is both what
  #                            the LM head reads and the feature fed to the next step
  sliding_window: int | None = None  # the window layers see keys less than this many
  window_layers: tuple[int, ...] = ()  # positions back; which layers (0-based) do

  def __post_init__(self):
    object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
    object.__setattr__(self, "window_layers", tuple(int(i) for i in self.window_layers))
    object.__setattr__(self, "rope_scaling", layers.option_from_dict(self.rope_scaling))
    if self.input_form not in INPUT_FORMS:
      raise ValueError(f"EagleConfig.input_form must be one of {INPUT_FORMS}, got "
                       f"{self.input_form!r}")
    if self.input_form == "concat" and not self.feature_layers:
      raise ValueError("EagleConfig.input_form 'concat' (EAGLE-3's layer) needs feature_layers")
    if self.input_form == "mtp" and self.feature_layers:
      raise ValueError("EagleConfig.input_form 'mtp' reads the target's final hidden state: "
                       f"feature_layers must be empty, got {self.feature_layers}")
    if any(i < 0 for i in self.feature_layers):
      raise ValueError(f"EagleConfig.feature_layers must be >= 0, got {self.feature_layers}")
    for name in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "intermediate_size"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"EagleConfig.{name} must be an integer >= 1, got {value!r}")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                       f"num_key_value_heads ({self.num_key_value_heads})")
    if self.head_dim % 2:
      raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
    self._check_options()

  def _check_options(self):
    n = self.num_layers
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
      raise ValueError(f"EagleConfig.num_layers must be an integer >= 1, got {n!r}")
    if n > 1 and self.input_form != "concat":
      raise ValueError(f"EagleConfig.num_layers {n}: more than one decoder layer is EAGLE-3's "
                       f"published form (input_form 'concat'), not {self.input_form!r}")
    for name in ("norm_before_fc", "fc_norm", "norm_output"):
      if getattr(self, name) and not self.fused:
        raise ValueError(f"EagleConfig.{name} needs feature_layers (an EAGLE-3 head)")
    if self.norm_before_fc and self.fc_norm:
      raise ValueError("EagleConfig.norm_before_fc and fc_norm exclude each other (one norm "
                       "over the concatenated features, or one per target layer)")
    w = self.sliding_window
    if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1):
      raise ValueError(f"EagleConfig.sliding_window must be an integer >= 1 or None, got {w!r}")
    if (w is None) != (not self.window_layers):
      raise ValueError(f"EagleConfig.sliding_window ({w}) and window_layers "
                       f"({self.window_layers}) go together: both set or neither")
    if any(not 0 <= i < n for i in self.window_layers) or len(set(self.window_layers)) != len(
        self.window_layers):
      raise ValueError(f"EagleConfig.window_layers {self.window_layers} must be distinct layers "
                       f"of the head's {n}")

  @classmethod
  def for_target(cls, target_config, **overrides) -> "EagleConfig":
    """The head config that copies one layer of the target: its config's fields of the
    same names (a `jspec.models.TransformerConfig` has them all), `overrides` first.
    A target config without some of them needs them in `overrides`."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in OPTIONAL_FIELDS]
    missing = [n for n in names if n not in overrides and not hasattr(target_config, n)]
    if missing:
      raise TypeError(f"EagleConfig.for_target: the target's config "
                      f"({type(target_config).__name__}) has no {missing}; pass them as "
                      f"keyword overrides or build an EagleConfig directly")
    fields = {n: getattr(target_config, n) for n in names if n not in overrides}
    fields.update(overrides)
    return cls(**fields)

  @property
  def fused(self) -> bool:
    """An EAGLE-3 head (fuses `feature_layers`), not an EAGLE-1 head."""
    return bool(self.feature_layers)

  @property
  def feature_width(self) -> int:
    """Width of the target features the head reads: n * D fused, else D."""
    return self.hidden_size * max(1, len(self.feature_layers))

  def to_dict(self) -> dict:
    """JSON-ready fields; `from_dict` inverts it. Layout options at their defaults are
    left out, so files of jspec's own heads read as they always have."""
    fields = dataclasses.asdict(self)
    fields["feature_layers"] = list(self.feature_layers)
    fields["window_layers"] = list(self.window_layers)
    for f in dataclasses.fields(self):
      if f.name in LAYOUT_FIELDS and getattr(self, f.name) == f.default:
        del fields[f.name]
    return fields

  @classmethod
  def from_dict(cls, fields: dict) -> "EagleConfig":
    """Build from `to_dict` output; unknown fields are an error (a file from elsewhere)."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - names)
    if unknown:
      raise ValueError(f"unknown EagleConfig fields {unknown}")
    return cls(**fields)


LAYOUT_FIELDS = frozenset(("input_form", "fc_bias", "attn_norm", "norm_before_residual",
                           "qk_norm", "rope_scaling", "zero_pair", "num_layers",
                           "norm_before_fc", "fc_norm", "norm_output", "sliding_window",
                           "window_layers"))
# Fields `for_target` does not copy from the target's config.
OPTIONAL_FIELDS = LAYOUT_FIELDS | {"feature_layers"}


def param_shapes(config: EagleConfig) -> dict:
  """The head's params tree as shapes (what `init_params` builds)."""
  D, F = config.hidden_size, config.intermediate_size
  H, Hkv, Dh = config.num_attention_heads, config.num_key_value_heads, config.head_dim
  fused = {}
  if config.fused:
    fuse = {"kernel": (config.feature_width, D)}
    if config.norm_before_fc:
      fuse["norm"] = {"scale": (config.feature_width,)}
    if config.fc_norm:  # row i: the norm of target layer feature_layers[i]
      fuse["layer_norms"] = {"scale": (len(config.feature_layers), D)}
    fused = {"fuse": fuse, "norm": {"scale": (D,)}}
  mlp = {"mlp_norm": {"scale": (D,)}, "w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}
  qk = {"q_norm": {"scale": (Dh,)}, "k_norm": {"scale": (Dh,)}} if config.qk_norm else {}
  if config.input_form == "concat":
    later = {layer_name(i): {
        "attn_norm": {"scale": (D,)}, "wq": (D, H, Dh), "wk": (D, Hkv, Dh), "wv": (D, Hkv, Dh),
        "wo": (H, Dh, D), **qk, **mlp} for i in range(1, config.num_layers)}
    return {**fused, "layer": {
        "input_norm": {"scale": (D,)}, "hidden_norm": {"scale": (D,)},
        "wq": (2 * D, H, Dh), "wk": (2 * D, Hkv, Dh), "wv": (2 * D, Hkv, Dh), "wo": (H, Dh, D),
        **qk, **mlp}, **later}
  if config.input_form == "mtp":
    return {"mtp_in": {"token_norm": {"scale": (D,)}, "hidden_norm": {"scale": (D,)},
                       "kernel": (2 * D, D)},
            "layer": {"attn_norm": {"scale": (D,)}, "wq": (D, H, Dh), "wk": (D, Hkv, Dh),
                      "wv": (D, Hkv, Dh), "wo": (H, Dh, D), **qk, **mlp,
                      "out_norm": {"scale": (D,)}}}
  fc = {"kernel": (2 * D, D), **({"bias": (D,)} if config.fc_bias else {})}
  norm = {"attn_norm": {"scale": (D,)}} if config.attn_norm else {}
  return {**fused, "fc": fc, "layer": {
      **norm, "wq": (D, H, Dh), "wk": (D, Hkv, Dh), "wv": (D, Hkv, Dh), "wo": (H, Dh, D),
      **qk, **mlp}}


def layer_name(i: int) -> str:
  """The params key of decoder layer i: "layer" for the first, "layer_1", ... after it."""
  return "layer" if i == 0 else f"layer_{i}"


def cache_names(i: int) -> tuple[str, str]:
  """The cache keys of decoder layer i's K and V: ("k", "v") for the first, then ("k1", "v1"),
  ... A head with window layers also keeps each slot's rotary position under "pos"."""
  return ("k", "v") if i == 0 else (f"k{i}", f"v{i}")


def head_dtype(params) -> Any:
  """The dtype the head computes in: its attention weights'."""
  return params["layer"]["wq"].dtype


@functools.partial(jax.jit, static_argnums=(0, 2))
def init_params(config: EagleConfig, key: jax.Array, dtype=jnp.float32) -> dict:
  """Random head params: normal(0, initializer_range) matrices, zero bias, unit norms."""
  shapes = param_shapes(config)
  is_shape = lambda x: isinstance(x, tuple)
  flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=is_shape)
  sizes = [int(np.prod(shape)) for _, shape in flat]
  # One draw for every matrix: a single random op compiles in a fraction of the time.
  noise = config.initializer_range * jax.random.normal(key, (sum(sizes),), jnp.float32)
  leaves, offset = [], 0
  for (path, shape), size in zip(flat, sizes):
    name = jax.tree_util.keystr(path)
    if "scale" in name:
      leaves.append(jnp.ones(shape, dtype))
    elif "bias" in name:
      leaves.append(jnp.zeros(shape, dtype))
    else:
      leaves.append(noise[offset:offset + size].reshape(shape).astype(dtype))
    offset += size
  return jax.tree_util.tree_unflatten(treedef, leaves)


def check_params(params: Any, config: EagleConfig, where: str = "head params") -> None:
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
    raise ValueError(f"{where} do not match the EAGLE config: missing tensors {missing}, "
                     f"unexpected tensors {extra}")
  for key, shape in want.items():
    if got[key] != shape:
      raise ValueError(f"{where}: tensor {key} has shape {got[key]}, but the EAGLE config "
                       f"(hidden {config.hidden_size}, heads {config.num_attention_heads}/"
                       f"{config.num_key_value_heads}x{config.head_dim}, mlp "
                       f"{config.intermediate_size}) gives {shape}")


def target_head(target: Model) -> tuple[jax.Array, jax.Array | None]:
  """The target's token embedding [V, D] and untied LM head [D, V] (None when tied),
  through the model contract's optional `head_fn`."""
  if not isinstance(target, Model):
    raise TypeError(f"target must be a jspec.Model, got {type(target).__name__}")
  head = target.head()
  return head.embed, head.lm_head


# ----------------------------------------------------------------------------- the layer


def causal_visibility(slots: jax.Array, length: int) -> jax.Array:
  """visible [B, T, S]: each pair sees every slot up to its own (prefix and earlier block)."""
  s = jnp.arange(length, dtype=jnp.int32)[None, None, :]
  return s <= slots[:, :, None]


def tree_visibility(root: jax.Array, anc_rows: jax.Array, length: int) -> jax.Array:
  """visible [B, T, S] for tree nodes: the committed prefix (slots < root) and ancestors.

  root [B] slot of node 0; anc_rows bool [T, N], row t: which nodes the t-th fed
  node descends from (itself included); node n sits at slot root + n.
  """
  N = anc_rows.shape[1]
  s = jnp.arange(length, dtype=jnp.int32)[None, :]  # [1, S]
  rel = s - root[:, None]  # [B, S] node index held in each slot
  in_tree = (rel >= 0) & (rel < N)
  from_tree = jnp.take(anc_rows, jnp.clip(rel, 0, N - 1), axis=1)  # [T, B, S]
  return (rel < 0)[:, None, :] | (from_tree.transpose(1, 0, 2) & in_tree[:, None, :])


def _write(buffer, new, slots, axis: int):
  """Scatter new [B, ..., T, ...] into buffer [B, ..., S, ...] at slots [B, T]; slots >= S
  are dropped (a block running past the cache end writes only what fits)."""

  def one(buf, blk, idx):
    index = (slice(None),) * (axis - 1) + (idx,)
    return buf.at[index].set(blk.astype(buf.dtype), mode="drop")

  return jax.vmap(one)(buffer, new, slots)


def _without_zero_pair(visible, key_slots, slots):
  """visible [B, T, S'] less the pair at slot 0 (key_slots [B or 1, S'] hold each key's slot)
  for every pair but itself: heads trained without the zero-feature pair (published ones)
  never attend to it. A pair that would see nothing else keeps it, so softmax stays finite."""
  zero = (key_slots == 0)[:, None, :]  # [B or 1, 1, S']
  rest = visible & ~zero
  keep = (slots == 0)[:, :, None] | ~jnp.any(rest, axis=-1, keepdims=True)  # [B, T, 1]
  return rest | (zero & keep)


def _windowed(visible, key_positions, positions, window: int):
  """visible [B, T, S'] less the keys `window` or more positions behind their query
  (key_positions [B or 1, S'], positions [B, T]): a sliding-window layer's keys, as
  speculators' mask and vLLM count them. A row left with nothing keeps `visible` (a pair whose
  own slot fell past the cache end: scratch), so softmax stays finite."""
  near = key_positions[:, None, :] > positions[:, :, None] - window
  inside = visible & near
  return jnp.where(jnp.any(inside, axis=-1, keepdims=True), inside, visible)


def _attend(config: EagleConfig, w, h, cache, names, slots, positions, visible):
  """One decoder layer's attention over its input h [B, T, in]: its output [B, T, D] and
  the cache with this layer's K/V written at `slots` (cache None: the block's own K/V)."""
  c = config
  norm = layers.RMSNorm()
  q = jnp.einsum("btd,dhk->bthk", h, w["wq"])
  k = jnp.einsum("btd,dhk->bthk", h, w["wk"])
  v = jnp.einsum("btd,dhk->bthk", h, w["wv"])
  if c.qk_norm:
    q = norm(q, w["q_norm"], c.rms_norm_eps)
    k = norm(k, w["k_norm"], c.rms_norm_eps)
  q = layers.rope(q, positions, c.rope_theta, c.rope_scaling)
  k = layers.rope(k, positions, c.rope_theta, c.rope_scaling)
  k = k.transpose(0, 2, 3, 1)  # [B, Hkv, Dh, T]
  v = v.transpose(0, 2, 1, 3)  # [B, Hkv, T, Dh]
  if cache is not None:
    k = _write(cache[names[0]], k, slots, axis=3)
    v = _write(cache[names[1]], v, slots, axis=2)
    cache = {**cache, names[0]: k, names[1]: v}
  out = layers.attention(q, k, v, visible, c.head_dim ** -0.5)
  return jnp.einsum("bthk,hkd->btd", out, w["wo"]), cache


def forward(config: EagleConfig, params, features, embeddings, cache, slots, positions, visible):
  """The head's layers over T pairs per row: (predicted features [B, T, D], cache).

  features [B, T, D] the features of the pairs, embeddings [B, T, D] their tokens',
  slots / positions [B, T] where each pair is written and its rotary position, visible
  [B, T, S] which cache slots each pair attends to (`causal_visibility`, `tree_visibility`);
  every layer attends to the same slots (window layers to the recent ones among them)."""
  c = config
  norm = layers.RMSNorm()
  w = params["layer"]
  dtype = head_dtype(params)  # the head computes in its own dtype
  features, embeddings = features.astype(dtype), embeddings.astype(dtype)
  if c.input_form == "concat":  # EAGLE-3's layer: attention over both inputs, normed apart
    f_normed = norm(features, w["hidden_norm"], c.rms_norm_eps)
    h = jnp.concatenate([norm(embeddings, w["input_norm"], c.rms_norm_eps), f_normed],
                        axis=-1)  # [B, T, 2D], the embedding first as published
    x = f_normed if c.norm_before_residual else features
  elif c.input_form == "mtp":  # both inputs normed apart, the embedding first as published
    w_in = params["mtp_in"]
    x = jnp.concatenate([norm(embeddings, w_in["token_norm"], c.rms_norm_eps),
                         norm(features, w_in["hidden_norm"], c.rms_norm_eps)], axis=-1)
    x = jnp.einsum("bti,id->btd", x, w_in["kernel"])  # [B, T, D], the residual stream
    h = norm(x, w["attn_norm"], c.rms_norm_eps)
  else:
    x = jnp.concatenate([features, embeddings], axis=-1)  # [B, T, 2D]
    x = jnp.einsum("bti,id->btd", x, params["fc"]["kernel"])
    if c.fc_bias:
      x = x + params["fc"]["bias"][None, None, :]
    h = norm(x, w["attn_norm"], c.rms_norm_eps) if c.attn_norm else x
  key_slots, key_positions = slots, positions
  if cache is not None:
    key_slots = jnp.arange(visible.shape[2], dtype=jnp.int32)[None, :]
    if c.window_layers:  # each slot's rotary position, for the window layers
      cache = {**cache, "pos": _write(cache["pos"], positions, slots, axis=1)}
      key_positions = cache["pos"]
    if c.zero_pair:
      # Slot 0 is visible to every real pair anyway (prefix or ancestor); adding it keeps a
      # pair whose own slot fell past the cache end (dropped, scratch) free of NaNs.
      visible = visible | (key_slots == 0)[:, None, :]
  if not c.zero_pair:
    visible = _without_zero_pair(visible, key_slots, slots)
  near = None
  if c.window_layers:
    near = _windowed(visible, key_positions, positions, c.sliding_window)
  for i in range(c.num_layers):
    w = params[layer_name(i)]
    if i:  # an ordinary pre-norm decoder layer over the residual stream
      h = norm(x, w["attn_norm"], c.rms_norm_eps)
    with jax.named_scope("eagle_attention"):
      out, cache = _attend(c, w, h, cache, cache_names(i), slots, positions,
                           near if i in c.window_layers else visible)
      x = x + out
    with jax.named_scope("eagle_mlp"):
      x = x + layers.GatedMLP("silu")(norm(x, w["mlp_norm"], c.rms_norm_eps), w)
  if c.input_form == "mtp":  # the module's final norm: its output is a normed feature
    x = norm(x, w["out_norm"], c.rms_norm_eps)
  if c.norm_output:  # EAGLE-3.1: the normed output is what the LM head reads and what is fed back
    x = norm(x, params["norm"], c.rms_norm_eps)
  return x, cache
