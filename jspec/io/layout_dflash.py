"""DFlash drafters in the two published layouts, into `jspec.DFlash` and back out.

Both hold `num_hidden_layers` Qwen3-style decoder layers (`layers.{i}.*`, q/k norms always),
`fc` (n * D -> D, no bias) and `hidden_norm` over the fused target features, and a final
`norm`; the token embedding and, at the full vocabulary, the LM head are the target's and are
not stored:

    vLLM speculators   config `speculators_model_type: "dflash"`, the layers' config in
                       `transformer_layer_config` (llama or qwen3), `draft_vocab_size`,
                       `block_size`, `mask_token_id`, `aux_hidden_state_layer_ids`,
                       `target_hidden_size`, `sample_from_anchor`; with a reduced draft
                       vocabulary also `lm_head.weight` [N, D], `d2t` (offsets: target id =
                       draft id + d2t[draft id]) and `t2d`
    z-lab              config `architectures: ["DFlashDraftModel"]`, a Qwen3 config with
                       `block_size`, `num_target_layers` and `dflash_config: {mask_token_id,
                       target_layer_ids}` (each read from dflash_config first, then the config,
                       as z-lab's `dflash` package reads them); DFlash 2 (its convolutions and
                       candidate selector), scaled embeddings or logits and causal layers refused

Auxiliary layers. jspec's `feature_layers` are 0-based layer outputs. speculators' ids index
Hugging Face's `hidden_states` tuple (entry i: the input of layer i), so jspec's layer is the
id minus 1; z-lab's `target_layer_ids` are layer outputs already (its engine reads
`hidden_states[id + 1]`), jspec's numbering.

Only what both references run is read: full attention layers (sliding-window `layer_types`
are refused) and `sample_from_anchor` false (the anchor slot predicts nothing).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jspec.drafters.dflash import DFlash, DFlashConfig, check_params
from jspec.models.hf import CheckpointError, rope_settings
from jspec.io import layout_tensors as T
from jspec.io.layout_eagle3 import draft_ids

SPECULATORS = "speculators-dflash"
ZLAB = "zlab-dflash"


def detect(cfg: dict) -> str | None:
  """SPECULATORS, ZLAB or None for a parsed config.json."""
  if cfg.get("speculators_model_type") == "dflash":
    return SPECULATORS
  if "speculators_model_type" not in cfg and (
      "dflash_config" in cfg or "DFlashDraftModel" in (cfg.get("architectures") or ())):
    return ZLAB
  return None


def _zlab_default_ids(num_target: int, num_draft: int) -> list[int]:
  """z-lab's default target layers: one in the middle, or spread evenly over 1 .. L-3."""
  if num_draft == 1:
    return [num_target // 2]
  start, end = 1, num_target - 3
  return [int(round(start + i * (end - start) / (num_draft - 1))) for i in range(num_draft)]


def _feature_layers(ids, target, shift: int, where: str) -> tuple[int, ...]:
  L = getattr(target.config, "num_hidden_layers", None)
  try:
    ids = [int(i) for i in ids]
  except (TypeError, ValueError):
    raise CheckpointError(f"{where}: auxiliary layer ids must be a list of integers, got "
                          f"{ids!r}") from None
  if not ids:
    raise CheckpointError(f"{where}: no auxiliary layer ids")
  layers = tuple(i - shift for i in ids)
  # Both references read Hugging Face's hidden_states, whose last entry is the final hidden
  # state after the model's norm, not the last layer's output: jspec reads layer outputs.
  if L is not None and any(not 0 <= j <= L - 2 for j in layers):
    raise CheckpointError(
        f"{where}: auxiliary layer ids {ids} do not fit the target's {L} layers (this "
        f"layout's ids must lie in [{shift}, {L - 2 + shift}]: "
        + ("id 0 is the embeddings, and " if shift else "")
        + f"id {L - 1 + shift} reads the final normed hidden state, not a layer output)")
  return layers


def _layer_checks(layer: dict, where: str) -> None:
  types = layer.get("layer_types") or ()
  if any(t != "full_attention" for t in types):
    raise CheckpointError(f"{where}: layer_types {list(types)}: jspec's DFlash runs full "
                          f"attention layers only (sliding-window layers are not supported)")
  if layer.get("attention_bias"):
    raise CheckpointError(f"{where}: attention_bias=true is not supported")
  act = layer.get("hidden_act", "silu")
  if act != "silu":
    raise CheckpointError(f"{where}: hidden_act {act!r}; DFlash's layers use silu")


def _speculators_config(cfg: dict, target, where: str) -> tuple[dict, tuple, int]:
  if cfg.get("sample_from_anchor"):
    raise CheckpointError(f"{where}: sample_from_anchor=true is not supported (jspec drafts "
                          f"from the mask slots; the anchor is the last committed token)")
  layer = cfg.get("transformer_layer_config")
  if not isinstance(layer, dict):
    raise CheckpointError(f"{where}: transformer_layer_config missing")
  kind = layer.get("model_type", "qwen3")
  if kind not in ("llama", "qwen3"):
    raise CheckpointError(f"{where}: transformer_layer_config model_type {kind!r}; jspec reads "
                          f"llama and qwen3 layer configs")
  _layer_checks(layer, where)
  hidden = cfg.get("target_hidden_size")
  if hidden is not None and int(hidden) != int(layer.get("hidden_size", -1)):
    raise CheckpointError(f"{where}: target_hidden_size {hidden} differs from the drafter's "
                          f"hidden size {layer.get('hidden_size')}; jspec's DFlash embeds "
                          f"with the target's table, so both must be equal")
  ids = cfg.get("aux_hidden_state_layer_ids")
  if ids is None:
    raise CheckpointError(f"{where}: aux_hidden_state_layer_ids missing")
  fields = dict(layer, block_size=cfg.get("block_size", 8), mask_token_id=cfg.get("mask_token_id"))
  N = int(cfg.get("draft_vocab_size") or layer.get("vocab_size") or 0)
  return fields, _feature_layers(ids, target, 1, where), N


# z-lab's DFlash 2 (`DFlash2DraftModel`): causal convolutions in every layer and a candidate
# selector over the LM head's top ids, which jspec's DFlash does not run.
_ZLAB_DFLASH2 = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def _zlab_config(cfg: dict, target, where: str) -> tuple[dict, tuple, int]:
  _layer_checks(cfg, where)
  extra = cfg.get("dflash_config") or {}
  if not isinstance(extra, dict):
    raise CheckpointError(f"{where}: dflash_config must be an object")
  # z-lab's code reads each of these from dflash_config first, then from the config itself.
  value = lambda name, default=None: extra.get(name, cfg.get(name, default))  # noqa: E731
  found = [n for n in _ZLAB_DFLASH2 if value(n) is not None]
  if "DFlash2DraftModel" in (cfg.get("architectures") or ()) or found:
    what = ", ".join(found) or "DFlash2DraftModel"
    raise CheckpointError(f"{where}: a z-lab DFlash 2 drafter ({what}: convolutions and a "
                          f"candidate selector), which jspec does not run; jspec reads DFlash "
                          f"(DFlashDraftModel)")
  for name, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0)):
    if float(value(name, default)) != default:
      raise CheckpointError(f"{where}: {name} {value(name)} is not supported (jspec's DFlash "
                            f"embeds and reads the LM head unscaled)")
  if value("final_logit_softcapping") is not None and float(value("final_logit_softcapping")):
    raise CheckpointError(f"{where}: final_logit_softcapping is not supported")
  if cfg.get("is_causal"):
    raise CheckpointError(f"{where}: is_causal=true is not supported (jspec's DFlash block "
                          f"attends both ways, as z-lab's full-attention layers do)")
  ids = value("target_layer_ids")
  if ids is None:
    try:
      ids = _zlab_default_ids(int(cfg["num_target_layers"]), int(cfg["num_hidden_layers"]))
    except KeyError as e:
      raise CheckpointError(f"{where}: no dflash_config.target_layer_ids and no {e} to derive "
                            f"them from") from None
  # block_size: z-lab's default when it is named nowhere
  fields = dict(cfg, mask_token_id=value("mask_token_id"), block_size=value("block_size", 16))
  return fields, _feature_layers(ids, target, 0, where), int(cfg.get("vocab_size") or 0)


def read_config(cfg: dict, layout: str, target, where: str) -> tuple[DFlashConfig, int]:
  """The checked `DFlashConfig` of a config.json and its draft vocabulary size N."""
  read = _speculators_config if layout == SPECULATORS else _zlab_config
  fields, layers, N = read(cfg, target, where)
  if fields.get("mask_token_id") is None:
    raise CheckpointError(f"{where}: mask_token_id missing: the drafter's block needs it")
  try:
    D, H = int(fields["hidden_size"]), int(fields["num_attention_heads"])
    theta, scaling = rope_settings(fields)
    config = DFlashConfig(
        hidden_size=D, vocab_size=int(fields["vocab_size"]), num_attention_heads=H,
        num_key_value_heads=int(fields.get("num_key_value_heads") or H),
        head_dim=int(fields.get("head_dim") or D // H),
        intermediate_size=int(fields["intermediate_size"]),
        num_layers=int(fields["num_hidden_layers"]), block_size=int(fields["block_size"]),
        mask_token_id=int(fields["mask_token_id"]), feature_layers=layers,
        rms_norm_eps=float(fields.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rope_scaling=scaling)
  except KeyError as e:
    raise CheckpointError(f"{where}: missing field {e}") from None
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: {e}") from None
  T.fits_target(where, config.hidden_size, config.vocab_size, target)
  V = config.vocab_size
  if not 1 <= N <= V:
    raise CheckpointError(f"{where}: draft vocabulary size {N} must lie in [1, {V}]")
  return config, N


def load(path: str, cfg: dict, layout: str, target, dtype=None) -> DFlash:
  """A `DFlash` for `target` from a directory of `layout` (cfg its parsed config.json);
  floating-point params cast to `dtype` (None keeps the stored dtype)."""
  import jax.numpy as jnp

  where = os.path.join(path, "config.json")
  config, N = read_config(cfg, layout, target, where)
  tensors = T.open_tensors(path)
  c = config
  D, H, Hkv, Dh, F, NL = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                          c.head_dim, c.intermediate_size, c.num_layers)
  n = len(c.feature_layers)
  what = (f"{where} (hidden {D}, {NL} layers, heads {H}/{Hkv}x{Dh}, mlp {F}, "
          f"{n} aux layers)")

  def get(name, shape):
    return tensors.get(name, shape, what)

  def stacked(name, shape, linear=True):  # torch Linear [out, in] -> [in, out], per layer
    xs = [get(f"layers.{i}.{name}", shape) for i in range(NL)]
    return np.stack([x.T for x in xs] if linear else xs)

  params = {
      "fc": {"kernel": get("fc.weight", (D, n * D)).T},
      "hidden_norm": {"scale": get("hidden_norm.weight", (D,))},
      "norm": {"scale": get("norm.weight", (D,))},
      "layers": {
          "input_norm": {"scale": stacked("input_layernorm.weight", (D,), False)},
          "wq": stacked("self_attn.q_proj.weight", (H * Dh, D)).reshape(NL, D, H, Dh),
          "wk": stacked("self_attn.k_proj.weight", (Hkv * Dh, D)).reshape(NL, D, Hkv, Dh),
          "wv": stacked("self_attn.v_proj.weight", (Hkv * Dh, D)).reshape(NL, D, Hkv, Dh),
          "wo": stacked("self_attn.o_proj.weight", (D, H * Dh)).reshape(NL, H, Dh, D),
          "q_norm": {"scale": stacked("self_attn.q_norm.weight", (Dh,), False)},
          "k_norm": {"scale": stacked("self_attn.k_norm.weight", (Dh,), False)},
          "mlp_norm": {"scale": stacked("post_attention_layernorm.weight", (D,), False)},
          "w_gate": stacked("mlp.gate_proj.weight", (F, D)),
          "w_up": stacked("mlp.up_proj.weight", (F, D)),
          "w_down": stacked("mlp.down_proj.weight", (D, F))}}
  check_params(params, config, f"{where} tensors")
  cast = (lambda x: jnp.asarray(x, dtype)) if dtype is not None else jnp.asarray
  params = T.as_arrays(params, dtype)
  # The references embed with the table as stored and read a plain linear LM head.
  drafter = dataclasses.replace(DFlash.from_target(target, params, config), layout=layout,
                                embedding_multiplier=1.0, final_logit_softcapping=None)
  V = c.vocab_size
  if N == V and "lm_head.weight" not in tensors.names:
    return drafter  # the target's own LM head
  rows = tensors.get("lm_head.weight", (N, D), f"{where} (draft_vocab_size {N}, hidden {D})")
  ids = draft_ids(tensors, N, V)
  return drafter.reduced(ids, cast(rows).astype(params["layers"]["wq"].dtype))



# ----------------------------------------------------------------------------- export


def _rope_fields(c: DFlashConfig) -> dict:
  s = c.rope_scaling
  if s is None:
    return {"rope_theta": c.rope_theta}
  if s.kind == "llama3":
    spec = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings}
  else:
    spec = {"rope_type": "linear", "factor": s.factor}
  return {"rope_theta": c.rope_theta, "rope_scaling": spec}


def tensors_of(drafter: DFlash, dtype) -> dict[str, np.ndarray]:
  """The drafter's tensors in the published names (torch Linear layout [out, in])."""
  c = drafter.config
  D, H, Hkv, Dh = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
  p, w = drafter.params, drafter.params["layers"]
  f = lambda x: np.asarray(x, np.float32).astype(dtype)  # noqa: E731
  out = {"fc.weight": f(np.asarray(p["fc"]["kernel"]).T),
         "hidden_norm.weight": f(p["hidden_norm"]["scale"]), "norm.weight": f(p["norm"]["scale"])}
  linear = {  # name -> (param, rows, cols) of the [in, out] matrix before the transpose
      "self_attn.q_proj.weight": ("wq", D, H * Dh), "self_attn.k_proj.weight": ("wk", D, Hkv * Dh),
      "self_attn.v_proj.weight": ("wv", D, Hkv * Dh), "self_attn.o_proj.weight": ("wo", H * Dh, D),
      "mlp.gate_proj.weight": ("w_gate", D, -1), "mlp.up_proj.weight": ("w_up", D, -1),
      "mlp.down_proj.weight": ("w_down", -1, D)}
  norms = {"input_layernorm.weight": "input_norm", "post_attention_layernorm.weight": "mlp_norm",
           "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm"}
  for i in range(c.num_layers):
    for name, (key, rows, cols) in linear.items():
      x = np.asarray(w[key][i], np.float32)
      out[f"layers.{i}.{name}"] = f(x.reshape(rows, cols).T)
    for name, key in norms.items():
      out[f"layers.{i}.{name}"] = f(w[key]["scale"][i])
  if drafter.ids is not None:
    ids = np.asarray(drafter.ids).astype(np.int64)
    order = np.argsort(ids, kind="stable")  # draft ids ascending in target id
    ids = ids[order]
    out["lm_head.weight"] = f(np.asarray(drafter.rows, np.float32)[order])
    out["d2t"] = (ids - np.arange(ids.size)).astype(np.int64)
    t2d = np.zeros((drafter.vocab_size,), np.bool_)
    t2d[ids] = True
    out["t2d"] = t2d
  return out


def export(drafter: DFlash, out: str, *, dtype=np.float32, verifier: str | None = None,
           max_positions: int = 2048) -> str:
  """Write `drafter` into the new directory `out` in the speculators layout (model.safetensors
  + config.json). verifier: the target's name or path, from which the reference rebuilds the
  embedding and the full-vocabulary LM head, which are not stored."""
  c = drafter.config
  if drafter.embedding_multiplier != 1.0:
    raise ValueError("the target scales its embeddings (embedding_multiplier "
                     f"{drafter.embedding_multiplier}); the published layouts read them unscaled")
  if drafter.final_logit_softcapping:
    raise ValueError("the target soft-caps its logits; the published DFlash layouts' LM head "
                     "does not")
  tensors = tensors_of(drafter, dtype)
  N = c.vocab_size if drafter.ids is None else int(drafter.ids.shape[0])
  layer = {
      "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": c.hidden_size,
      "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
      "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
      "num_hidden_layers": c.num_layers, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
      "vocab_size": c.vocab_size, "max_position_embeddings": int(max_positions),
      "tie_word_embeddings": False, "attention_bias": False, **_rope_fields(c)}
  config = {
      "architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash",
      "speculators_version": "0.9.0", "transformer_layer_config": layer,
      "draft_vocab_size": N, "block_size": c.block_size, "target_hidden_size": None,
      # speculators' ids index hidden_states (entry i: the input of layer i)
      "aux_hidden_state_layer_ids": [i + 1 for i in c.feature_layers],
      "mask_token_id": c.mask_token_id, "sliding_window_non_causal": False,
      "sample_from_anchor": False,
      "speculators_config": {
          "algorithm": "dflash", "default_proposal_method": "greedy",
          "proposal_methods": [{"proposal_type": "greedy",
                                "speculative_tokens": c.block_size - 1}],
          "verifier": {"name_or_path": verifier, "architectures": ["Qwen3ForCausalLM"]}},
      "dtype": np.dtype(dtype).name}
  out = T.new_dir(out)
  T.write_safetensors(os.path.join(out, "model.safetensors"), tensors)
  T.write_config(out, config)
  return out
