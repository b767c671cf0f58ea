"""EAGLE-3 heads in the two published layouts, into `jspec.Eagle` and back out.

Both hold a first decoder layer whose attention reads [norm(e); norm(f)] (`input_form`
"concat" of `jspec.drafters.eagle_head`), an fc fusing n auxiliary target layers
(n * D -> D, no bias), a final norm, and an LM head over a draft vocabulary of N ids with
`d2t` offsets (target id = draft id + d2t[draft id]) and a `t2d` mask over the target's V:

    SpecForge / SafeAILab   config `architectures: ["LlamaForCausalLMEagle3"]`, a Llama config
                            with `draft_vocab_size` and `eagle_config.
                            eagle_aux_hidden_state_layer_ids`; tensors `midlayer.*`
    vLLM speculators        config `speculators_model_type: "eagle3"`, the layer's config in
                            `transformer_layer_config` (llama or qwen3), `draft_vocab_size`,
                            `norm_before_residual`, `eagle_aux_hidden_state_layer_ids`;
                            tensors `layers.0.*`

speculators' Eagle3DraftModel also builds (and jspec reads and writes back):
`transformer_layer_config.num_hidden_layers` L > 1, the first layer then L - 1 ordinary
decoder layers (`layers.1.*` ..., `EagleConfig.num_layers`); `norm_before_fc` (one RMSNorm over
the n * D features, `input_norm.weight`); `fc_norm` (one per auxiliary layer, `fc_norm.i.weight`);
`norm_output` (the output normed before it is fed back, EAGLE-3.1); and sliding-window layers
(`layer_types` "sliding_attention" with `sliding_window`, Qwen3's only under
`use_sliding_window`, as transformers' Qwen3Config reads them).

Auxiliary layers. jspec's `feature_layers` are 0-based layer outputs. SpecForge's ids are
the same (SGLang captures the input of layer i + 1; default [1, L//2 - 1, L - 4]).
speculators' ids index Hugging Face's `hidden_states` tuple, whose entry i is the input of
layer i (0: the embeddings), so jspec's layer is the id minus 1 (default ids
[2, L//2, L - 3], the same layers as SpecForge's).
"""

from __future__ import annotations

import os

import numpy as np

from jspec.drafters import vocab_subset
from jspec.drafters.eagle import Eagle, EagleConfig, check_params
from jspec.drafters.eagle_head import layer_name
from jspec.models.hf import CheckpointError, rope_settings
from jspec.io import layout_tensors as T

SPECFORGE = "specforge"
SPECULATORS = "speculators"


def _layers(target) -> int | None:
  return getattr(target.config, "num_hidden_layers", None)


def _feature_layers(ids, target, shift: int, where: str, default) -> tuple[int, ...]:
  """jspec feature layers from a layout's aux ids (None: the layout's default), checked
  against the target's depth."""
  L = _layers(target)
  if ids is None:
    if L is None:
      raise CheckpointError(f"{where} names no auxiliary layers and the target's depth is "
                            f"unknown; give eagle_aux_hidden_state_layer_ids")
    ids = default(L)
  ids = [int(i) for i in ids]
  layers = tuple(i - shift for i in ids)
  # speculators' ids index Hugging Face's hidden_states, whose last entry (id L) is the final
  # hidden state after the model's norm, not the last layer's output: refused, not misread.
  top = L - 2 if shift else L - 1
  if L is not None and any(not 0 <= j <= top for j in layers):
    lo, hi = shift, top + shift
    raise CheckpointError(f"{where}: auxiliary layer ids {ids} do not fit the target's {L} "
                          f"layers (this layout's ids must lie in [{lo}, {hi}]"
                          + (": id 0, the embeddings, and id L, the final hidden state after "
                             "the norm, are not layer outputs jspec reads" if shift else "")
                          + ")")
  return layers


def _specforge_config(cfg: dict, target, where: str) -> tuple[EagleConfig, dict]:
  for flag, ok in (("fc_norm", False), ("norm_output", True), ("norm_before_fc", False)):
    if flag in cfg and bool(cfg[flag]) != ok:
      raise CheckpointError(f"{where}: {flag}={cfg[flag]} is not supported (jspec reads "
                            f"SpecForge heads with {flag}={ok})")
  if int(cfg.get("num_hidden_layers", 1)) != 1:
    raise CheckpointError(f"{where}: num_hidden_layers {cfg['num_hidden_layers']}; the "
                          f"EAGLE-3 layout has one decoder layer (midlayer)")
  eagle_cfg = cfg.get("eagle_config") or {}
  ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
  layers = _feature_layers(ids, target, 0, where, lambda L: [1, L // 2 - 1, L - 4])
  return _config(cfg, target, where, layers, qk_norm=False, norm_before_residual=False), cfg


def _window(layer: dict, kind: str, num_layers: int, where: str) -> dict:
  """EagleConfig's sliding_window and window_layers from a layer config, as transformers
  reads it (Qwen3Config: the window only with use_sliding_window, layer_types by default
  "sliding_attention" from max_window_layers on) and speculators uses it (a layer type
  "sliding_attention" without a window attends to everything)."""
  if kind == "qwen3":
    window = layer.get("sliding_window", 4096) if layer.get("use_sliding_window") else None
    types = layer.get("layer_types") or [
        "sliding_attention" if window is not None and i >= int(layer.get("max_window_layers", 28))
        else "full_attention" for i in range(num_layers)]
  else:
    window, types = layer.get("sliding_window"), layer.get("layer_types") or []
  unknown = sorted({t for t in types} - {"sliding_attention", "full_attention"})
  if unknown:
    raise CheckpointError(f"{where}: layer_types {unknown} are not attention kinds jspec reads "
                          f"(full_attention, sliding_attention)")
  sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention" and i < num_layers)
  if window is None or not sliding:
    return {}
  return {"sliding_window": int(window), "window_layers": sliding}


def _speculators_config(cfg: dict, target, where: str) -> tuple[EagleConfig, dict]:
  layer = cfg.get("transformer_layer_config")
  if not isinstance(layer, dict):
    raise CheckpointError(f"{where}: transformer_layer_config missing")
  kind = layer.get("model_type", "qwen3")  # speculators' default layer config is Qwen3's
  if kind not in ("llama", "qwen3"):
    raise CheckpointError(f"{where}: transformer_layer_config model_type {kind!r}; jspec reads "
                          f"llama and qwen3 layers")
  num_layers = int(layer.get("num_hidden_layers", 1))
  if layer.get("attention_bias"):
    raise CheckpointError(f"{where}: attention_bias=true is not supported")
  target_hidden = cfg.get("target_hidden_size")
  if target_hidden is not None and int(target_hidden) != int(layer["hidden_size"]):
    raise CheckpointError(f"{where}: target_hidden_size {target_hidden} differs from the "
                          f"head's hidden size {layer['hidden_size']}; jspec's head reads "
                          f"features of its own width")
  layers = _feature_layers(cfg.get("eagle_aux_hidden_state_layer_ids"), target, 1, where,
                           lambda L: [2, L // 2, L - 3])
  merged = dict(layer, draft_vocab_size=cfg.get("draft_vocab_size"))
  options = {flag: bool(cfg.get(flag, False)) for flag in ("norm_before_fc", "fc_norm",
                                                             "norm_output")}
  return _config(merged, target, where, layers, qk_norm=(kind == "qwen3"),
                 norm_before_residual=bool(cfg.get("norm_before_residual", False)),
                 num_layers=num_layers, **options,
                 **_window(layer, kind, num_layers, where)), merged


def _config(cfg: dict, target, where: str, layers, *, qk_norm, norm_before_residual,
            **options):
  try:
    D, H = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    theta, scaling = rope_settings(cfg)
    config = EagleConfig(
        hidden_size=D, vocab_size=int(cfg["vocab_size"]), num_attention_heads=H,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or H),
        head_dim=int(cfg.get("head_dim") or D // H),
        intermediate_size=int(cfg["intermediate_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        feature_layers=layers, input_form="concat", qk_norm=qk_norm,
        norm_before_residual=norm_before_residual, rope_scaling=scaling, zero_pair=False,
        **options)
  except KeyError as e:
    raise CheckpointError(f"{where}: missing field {e}") from None
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: {e}") from None
  T.fits_target(where, config.hidden_size, config.vocab_size, target)
  return config


def _prefix(layout: str, i: int = 0) -> str:
  """The tensor name prefix of the head's decoder layer i in `layout`."""
  return "midlayer." if layout == SPECFORGE else f"layers.{i}."


def draft_ids(tensors: T.Tensors, N: int, V: int) -> np.ndarray:
  """The target ids of the N draft ids, from d2t (offsets), checked against t2d."""
  if "d2t" not in tensors.names:
    if N != V:
      raise CheckpointError(f"{tensors.origin}: draft vocabulary {N} differs from the target's "
                            f"{V}, but the file has no d2t map")
    return np.arange(V, dtype=np.int32)
  d2t = tensors.get("d2t", (N,), f"draft_vocab_size {N}").astype(np.int64)
  ids = np.arange(N, dtype=np.int64) + d2t
  bad = np.flatnonzero((ids < 0) | (ids >= V))
  if bad.size:
    i = int(bad[0])
    raise CheckpointError(f"{tensors.where('d2t')}: d2t maps draft id {i} to target id "
                          f"{int(ids[i])}, outside the target's vocabulary of {V}")
  if np.unique(ids).size != N:
    raise CheckpointError(f"{tensors.where('d2t')}: d2t maps two draft ids to one target id")
  if "t2d" in tensors.names:
    t2d = tensors.get("t2d", (V,), f"the target's vocabulary {V}").astype(bool)
    if not np.array_equal(np.flatnonzero(t2d), np.sort(ids)):
      raise CheckpointError(f"{tensors.where('t2d')}: t2d marks {int(t2d.sum())} target ids, "
                            f"not the {N} that d2t maps to")
  return ids.astype(np.int32)


def load(path: str, cfg: dict, layout: str, target, dtype=None) -> Eagle:
  """An `Eagle` for `target` from an EAGLE-3 directory of `layout` (SPECFORGE or SPECULATORS),
  cfg its parsed config.json: the published layer (`input_form` "concat"), the draft
  vocabulary's own LM head rows (`Eagle.rows`, ids from d2t) and the head's copy of the
  embedding when the file holds one; floating-point params cast to `dtype` (None keeps)."""
  import jax.numpy as jnp

  where = os.path.join(path, "config.json")
  read_config = _specforge_config if layout == SPECFORGE else _speculators_config
  config, merged = read_config(cfg, target, where)
  tensors = T.open_tensors(path)
  c = config
  D, H, Hkv, Dh, F = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                      c.intermediate_size)
  V = c.vocab_size
  N = int(merged.get("draft_vocab_size") or V)
  n = len(c.feature_layers)
  what = (f"{where} (hidden {D}, heads {H}/{Hkv}x{Dh}, mlp {F}, {n} aux layers, "
          f"{c.num_layers} decoder layer{'s' if c.num_layers > 1 else ''})")

  def linear(name, out_dim, in_dim):  # torch Linear [out, in] -> [in, out]
    return tensors.get(name, (out_dim, in_dim), what).T

  def decoder_layer(i):  # the first reads [e; f] (2D wide), the later ones D
    p, wide = _prefix(layout, i), (2 * D if i == 0 else D)
    layer = {
        "wq": linear(p + "self_attn.q_proj.weight", H * Dh, wide).reshape(wide, H, Dh),
        "wk": linear(p + "self_attn.k_proj.weight", Hkv * Dh, wide).reshape(wide, Hkv, Dh),
        "wv": linear(p + "self_attn.v_proj.weight", Hkv * Dh, wide).reshape(wide, Hkv, Dh),
        "wo": linear(p + "self_attn.o_proj.weight", D, H * Dh).reshape(H, Dh, D),
        "mlp_norm": {"scale": tensors.get(p + "post_attention_layernorm.weight", (D,), what)},
        "w_gate": linear(p + "mlp.gate_proj.weight", F, D),
        "w_up": linear(p + "mlp.up_proj.weight", F, D),
        "w_down": linear(p + "mlp.down_proj.weight", D, F),
    }
    norm = tensors.get(p + "input_layernorm.weight", (D,), what)
    if i == 0:
      layer["input_norm"] = {"scale": norm}
      layer["hidden_norm"] = {"scale": tensors.get(p + "hidden_norm.weight", (D,), what)}
    else:
      layer["attn_norm"] = {"scale": norm}
    if c.qk_norm:
      layer["q_norm"] = {"scale": tensors.get(p + "self_attn.q_norm.weight", (Dh,), what)}
      layer["k_norm"] = {"scale": tensors.get(p + "self_attn.k_norm.weight", (Dh,), what)}
    return layer

  fuse = {"kernel": linear("fc.weight", D, n * D)}
  if c.norm_before_fc:
    fuse["norm"] = {"scale": tensors.get("input_norm.weight", (n * D,), what)}
  if c.fc_norm:
    fuse["layer_norms"] = {"scale": np.stack([tensors.get(f"fc_norm.{i}.weight", (D,), what)
                                              for i in range(n)])}
  params = {"fuse": fuse, "norm": {"scale": tensors.get("norm.weight", (D,), what)},
            **{layer_name(i): decoder_layer(i) for i in range(c.num_layers)}}
  rows = tensors.get("lm_head.weight", (N, D), f"{where} (draft_vocab_size {N}, hidden {D})")
  ids = draft_ids(tensors, N, V)
  embed = None
  if "embed_tokens.weight" in tensors.names:  # the head's own copy of the target's embedding
    embed = tensors.get("embed_tokens.weight", (V, D), f"{where} (vocab {V}, hidden {D})")
  check_params(params, config, f"{where} tensors")
  cast = (lambda x: jnp.asarray(x, dtype)) if dtype is not None else jnp.asarray
  params = T.as_arrays(params, dtype)
  eagle = Eagle.from_target(target, params, config)
  head_dtype = params["layer"]["wq"].dtype
  return _with_vocab(eagle, ids, cast(rows).astype(head_dtype),
                     None if embed is None else cast(embed), layout)


def _with_vocab(eagle: Eagle, ids, rows, embed, layout: str) -> Eagle:
  import dataclasses

  ids = vocab_subset.check_ids(ids, eagle.vocab_size)
  return dataclasses.replace(eagle, ids=ids, rows=rows, token_embed=embed, layout=layout)



# ----------------------------------------------------------------------------- export


def exportable(eagle: Eagle) -> None:
  """Raise unless `eagle` is a head the published EAGLE-3 layouts can hold exactly."""
  c = eagle.config
  if c.input_form != "concat" or not c.fused:
    raise ValueError(
        "the published EAGLE-3 layouts hold heads whose layer reads [norm(e); norm(f)] "
        "(EagleConfig input_form='concat', with feature_layers); this head's layer takes "
        f"input_form={c.input_form!r}, which no published layout holds exactly. Train with "
        "EagleConfig.for_target(target.config, feature_layers=..., input_form='concat')")


def tensors_of(eagle: Eagle, layout: str, dtype) -> dict[str, np.ndarray]:
  """The head's tensors in `layout`'s names (torch Linear layout [out, in])."""
  c = eagle.config
  D, H, Hkv, Dh = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
  f = lambda x: np.asarray(x, np.float32).astype(dtype)  # noqa: E731
  out = {}
  for i in range(c.num_layers):
    w, p, wide = eagle.params[layer_name(i)], _prefix(layout, i), (2 * D if i == 0 else D)
    out.update({
        p + "input_layernorm.weight": f(w["input_norm" if i == 0 else "attn_norm"]["scale"]),
        p + "self_attn.q_proj.weight": f(np.asarray(w["wq"]).reshape(wide, H * Dh).T),
        p + "self_attn.k_proj.weight": f(np.asarray(w["wk"]).reshape(wide, Hkv * Dh).T),
        p + "self_attn.v_proj.weight": f(np.asarray(w["wv"]).reshape(wide, Hkv * Dh).T),
        p + "self_attn.o_proj.weight": f(np.asarray(w["wo"]).reshape(H * Dh, D).T),
        p + "post_attention_layernorm.weight": f(w["mlp_norm"]["scale"]),
        p + "mlp.gate_proj.weight": f(np.asarray(w["w_gate"]).T),
        p + "mlp.up_proj.weight": f(np.asarray(w["w_up"]).T),
        p + "mlp.down_proj.weight": f(np.asarray(w["w_down"]).T)})
    if i == 0:
      out[p + "hidden_norm.weight"] = f(w["hidden_norm"]["scale"])
    if c.qk_norm:
      out[p + "self_attn.q_norm.weight"] = f(w["q_norm"]["scale"])
      out[p + "self_attn.k_norm.weight"] = f(w["k_norm"]["scale"])
  fuse = eagle.params["fuse"]
  out["fc.weight"] = f(np.asarray(fuse["kernel"]).T)
  if c.norm_before_fc:
    out["input_norm.weight"] = f(fuse["norm"]["scale"])
  if c.fc_norm:
    for i, scale in enumerate(np.asarray(fuse["layer_norms"]["scale"])):
      out[f"fc_norm.{i}.weight"] = f(scale)
  out["norm.weight"] = f(eagle.params["norm"]["scale"])
  V = eagle.vocab_size
  ids = np.arange(V) if eagle.ids is None else np.asarray(eagle.ids).astype(np.int64)
  order = np.argsort(ids, kind="stable")  # draft ids ascending in target id, as published
  ids = ids[order]
  if eagle.rows is not None:
    rows = np.asarray(eagle.rows, np.float32)[order]
  else:
    rows = np.asarray(vocab_subset.head_rows(eagle.embed, eagle.lm_head, ids), np.float32)
  out["lm_head.weight"] = f(rows)
  embed = eagle.token_embed if eagle.token_embed is not None else eagle.head().dense().embed
  if eagle.token_embed is None and eagle.embedding_multiplier != 1.0:
    raise ValueError("the target scales its embeddings (embedding_multiplier "
                     f"{eagle.embedding_multiplier}); the published layouts read them unscaled")
  out["embed_tokens.weight"] = f(embed)
  N = ids.size
  out["d2t"] = (ids - np.arange(N)).astype(np.int64)
  t2d = np.zeros((V,), np.bool_)
  t2d[ids] = True
  out["t2d"] = t2d
  return out


def _rope_fields(c: EagleConfig) -> dict:
  s = c.rope_scaling
  if s is None:
    return {"rope_theta": c.rope_theta, "rope_scaling": None}
  if s.kind == "llama3":
    spec = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings}
  else:
    spec = {"rope_type": "linear", "factor": s.factor}
  return {"rope_theta": c.rope_theta, "rope_scaling": spec}


def layer_config(eagle: Eagle, model_type: str, max_positions: int) -> dict:
  """The decoder layer's config (Hugging Face names) shared by both layouts."""
  c = eagle.config
  window = {}
  if c.window_layers:  # as transformers reads it back (Qwen3Config only with use_sliding_window)
    window = {"sliding_window": c.sliding_window,
              "layer_types": ["sliding_attention" if i in c.window_layers else "full_attention"
                              for i in range(c.num_layers)],
              **({"use_sliding_window": True} if model_type == "qwen3" else {})}
  return {
      "model_type": model_type, "hidden_size": c.hidden_size,
      "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
      "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
      "num_hidden_layers": c.num_layers, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
      "vocab_size": c.vocab_size, "max_position_embeddings": int(max_positions),
      "tie_word_embeddings": False, "attention_bias": False, **_rope_fields(c), **window}


def export(eagle: Eagle, out: str, layout: str, *, dtype=np.float32, verifier: str | None = None,
           max_positions: int = 2048) -> str:
  """Write `eagle` into the new directory `out` in `layout` (model.safetensors + config.json)."""
  exportable(eagle)
  c = eagle.config
  if layout == SPECFORGE and (c.qk_norm or c.norm_before_residual):
    raise ValueError("SpecForge's EAGLE-3 layer has no q/k norms and keeps f as its residual; "
                     "this head (qk_norm or norm_before_residual) needs --format speculators")
  speculators_only = [name for name, on in (
      (f"{c.num_layers} decoder layers", c.num_layers > 1), ("norm_before_fc", c.norm_before_fc),
      ("fc_norm", c.fc_norm), ("norm_output", c.norm_output),
      ("sliding-window layers", bool(c.window_layers))) if on]
  if layout == SPECFORGE and speculators_only:
    raise ValueError(f"SpecForge's EAGLE-3 layout holds one decoder layer (midlayer) without "
                     f"speculators' options; this head has {', '.join(speculators_only)}: "
                     f"--format speculators writes it")
  tensors = tensors_of(eagle, layout, dtype)
  N = tensors["lm_head.weight"].shape[0]
  out = T.new_dir(out)
  T.write_safetensors(os.path.join(out, "model.safetensors"), tensors)
  if layout == SPECFORGE:
    config = {"architectures": ["LlamaForCausalLMEagle3"],
              **layer_config(eagle, "llama", max_positions), "draft_vocab_size": N,
              "pretraining_tp": 1, "dtype": np.dtype(dtype).name,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.feature_layers)}}
  else:
    kind = "qwen3" if c.qk_norm else "llama"
    layer = layer_config(eagle, kind, max_positions)
    layer["architectures"] = ["Qwen3ForCausalLM" if c.qk_norm else "LlamaForCausalLM"]
    config = {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0", "transformer_layer_config": layer,
        "draft_vocab_size": N, "norm_before_residual": c.norm_before_residual,
        "target_hidden_size": None,
        # speculators' ids index hidden_states (entry i: the input of layer i)
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in c.feature_layers],
        "norm_before_fc": c.norm_before_fc, "fc_norm": c.fc_norm, "norm_output": c.norm_output,
        "embed_requires_grad": False, "has_no_defaults_at_init": False,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": verifier,
                         "architectures": [layer["architectures"][0]]}},
        "dtype": np.dtype(dtype).name}
  T.write_config(out, config)
  return out
