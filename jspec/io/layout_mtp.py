"""MTP modules in vLLM speculators' layout, into `jspec.MTP` and back out.

    config.json   `speculators_model_type: "mtp"`, `num_nextn_predict_layers: 1`, the
                  verifier's own config in `transformer_layer_config` (a Qwen3 layer: q/k
                  norms), the verifier's name or path under `speculators_config.verifier`
    tensors       `mtp_layers.0.`: `token_layernorm`, `hidden_layernorm`, `input_proj`
                  [D, 2D] over [norm(e); norm(h)], the decoder layer (`input_layernorm`,
                  `self_attn.{q,k,v,o}_proj`, `self_attn.{q,k}_norm`,
                  `post_attention_layernorm`, `mlp.{gate,up,down}_proj`) and
                  `final_layernorm`; the embedding and LM head are the verifier's (not stored)

The module reads the verifier's final normed hidden state, the one the target's LM head reads
(jspec's `hidden`), as the engines that serve these modules pass it. Hybrid layers (Qwen3-Next,
Qwen3.5: gated attention, partial rotary) and checkpoints of several modules are refused with
the reason.
"""

from __future__ import annotations

import os

import numpy as np

from jspec.drafters.eagle import EagleConfig, check_params
from jspec.drafters.mtp import MTP
from jspec.models.hf import CheckpointError, rope_settings
from jspec.io import layout_tensors as T

LAYOUT = "speculators-mtp"
PREFIX = "mtp_layers.0."
LAYER_TYPES = ("qwen3",)


def config_of(cfg: dict, target, where: str) -> EagleConfig:
  """The module's `EagleConfig` (input_form "mtp") from a speculators MTP config, checked
  against the target."""
  count = int(cfg.get("num_nextn_predict_layers", 1))
  if count != 1:
    raise CheckpointError(f"{where}: num_nextn_predict_layers {count}; jspec reads checkpoints "
                          f"of one MTP module (chained over the draft steps)")
  layer = cfg.get("transformer_layer_config")
  if not isinstance(layer, dict):
    raise CheckpointError(f"{where}: transformer_layer_config missing")
  kind = layer.get("model_type", "qwen2")  # speculators' default layer config is Qwen2's
  if kind not in LAYER_TYPES:
    raise CheckpointError(f"{where}: transformer_layer_config model_type {kind!r}; jspec reads "
                          f"MTP modules of {', '.join(LAYER_TYPES)} layers (hybrid Qwen3-Next / "
                          f"Qwen3.5 layers are not supported)")
  if layer.get("attention_bias"):
    raise CheckpointError(f"{where}: attention_bias=true is not supported")
  try:
    D, H = int(layer["hidden_size"]), int(layer["num_attention_heads"])
    theta, scaling = rope_settings(layer)
    config = EagleConfig(
        hidden_size=D, vocab_size=int(layer["vocab_size"]), num_attention_heads=H,
        num_key_value_heads=int(layer.get("num_key_value_heads") or H),
        head_dim=int(layer.get("head_dim") or D // H),
        intermediate_size=int(layer["intermediate_size"]),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rope_scaling=scaling, input_form="mtp", qk_norm=True, fc_bias=False, zero_pair=False)
  except KeyError as e:
    raise CheckpointError(f"{where}: missing field {e}") from None
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: {e}") from None
  T.fits_target(where, config.hidden_size, config.vocab_size, target)
  return config


def load(path: str, cfg: dict, target, dtype=None) -> MTP:
  """A `jspec.MTP` for `target` from a speculators MTP directory (cfg: its config.json),
  every tensor checked by name and shape before use; floating-point params cast to `dtype`
  (None keeps the stored dtype)."""

  where = os.path.join(path, "config.json")
  c = config_of(cfg, target, where)
  tensors = T.open_tensors(path)
  D, H, Hkv, Dh, F = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                      c.intermediate_size)
  what = f"{where} (hidden {D}, heads {H}/{Hkv}x{Dh}, mlp {F})"
  p = PREFIX

  def vector(name, size=D):
    return tensors.get(p + name, (size,), what)

  def linear(name, out_dim, in_dim):  # torch Linear [out, in] -> [in, out]
    return tensors.get(p + name, (out_dim, in_dim), what).T

  params = {
      "mtp_in": {"token_norm": {"scale": vector("token_layernorm.weight")},
                 "hidden_norm": {"scale": vector("hidden_layernorm.weight")},
                 "kernel": linear("input_proj.weight", D, 2 * D)},
      "layer": {
          "attn_norm": {"scale": vector("input_layernorm.weight")},
          "wq": linear("self_attn.q_proj.weight", H * Dh, D).reshape(D, H, Dh),
          "wk": linear("self_attn.k_proj.weight", Hkv * Dh, D).reshape(D, Hkv, Dh),
          "wv": linear("self_attn.v_proj.weight", Hkv * Dh, D).reshape(D, Hkv, Dh),
          "wo": linear("self_attn.o_proj.weight", D, H * Dh).reshape(H, Dh, D),
          "q_norm": {"scale": vector("self_attn.q_norm.weight", Dh)},
          "k_norm": {"scale": vector("self_attn.k_norm.weight", Dh)},
          "mlp_norm": {"scale": vector("post_attention_layernorm.weight")},
          "w_gate": linear("mlp.gate_proj.weight", F, D),
          "w_up": linear("mlp.up_proj.weight", F, D),
          "w_down": linear("mlp.down_proj.weight", D, F),
          "out_norm": {"scale": vector("final_layernorm.weight")}}}
  check_params(params, c, f"{where} tensors")
  params = T.as_arrays(params, dtype)
  return MTP.from_target(target, params, c)



def export(module: MTP, out: str, *, dtype=np.float32, verifier: str | None = None,
           max_positions: int = 2048) -> str:
  """Write `module` into the new directory `out` in speculators' MTP layout
  (model.safetensors + config.json; the embedding and LM head stay with the verifier)."""
  c = module.config
  if c.input_form != "mtp":
    raise ValueError(f"speculators' MTP layout holds MTP modules (input_form 'mtp'), got "
                     f"input_form {c.input_form!r}")
  if not c.qk_norm:
    raise ValueError("speculators' MTP layer is a Qwen3 layer, with q/k norms; this module has "
                     "none (qk_norm=False), which the layout cannot hold")
  if module.ids is not None or module.token_embed is not None:
    raise ValueError("speculators' MTP layout drafts over the verifier's full vocabulary with its "
                     "embedding; this module has a reduced vocabulary or its own embedding")
  D, H, Hkv, Dh = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
  w, w_in = module.params["layer"], module.params["mtp_in"]
  f = lambda x: np.asarray(x, np.float32).astype(dtype)  # noqa: E731
  p = PREFIX
  tensors = {
      p + "token_layernorm.weight": f(w_in["token_norm"]["scale"]),
      p + "hidden_layernorm.weight": f(w_in["hidden_norm"]["scale"]),
      p + "input_proj.weight": f(np.asarray(w_in["kernel"]).T),
      p + "input_layernorm.weight": f(w["attn_norm"]["scale"]),
      p + "self_attn.q_proj.weight": f(np.asarray(w["wq"]).reshape(D, H * Dh).T),
      p + "self_attn.k_proj.weight": f(np.asarray(w["wk"]).reshape(D, Hkv * Dh).T),
      p + "self_attn.v_proj.weight": f(np.asarray(w["wv"]).reshape(D, Hkv * Dh).T),
      p + "self_attn.o_proj.weight": f(np.asarray(w["wo"]).reshape(H * Dh, D).T),
      p + "self_attn.q_norm.weight": f(w["q_norm"]["scale"]),
      p + "self_attn.k_norm.weight": f(w["k_norm"]["scale"]),
      p + "post_attention_layernorm.weight": f(w["mlp_norm"]["scale"]),
      p + "mlp.gate_proj.weight": f(np.asarray(w["w_gate"]).T),
      p + "mlp.up_proj.weight": f(np.asarray(w["w_up"]).T),
      p + "mlp.down_proj.weight": f(np.asarray(w["w_down"]).T),
      p + "final_layernorm.weight": f(w["out_norm"]["scale"]),
  }
  rope = {"rope_theta": c.rope_theta, "rope_type": "default"}
  if c.rope_scaling is not None:
    raise ValueError("exporting an MTP module with rotary scaling is not supported")
  layer = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": D,
           "intermediate_size": c.intermediate_size, "num_attention_heads": H,
           "num_key_value_heads": Hkv, "head_dim": Dh, "num_hidden_layers": 1,
           "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu", "vocab_size": c.vocab_size,
           "max_position_embeddings": int(max_positions), "tie_word_embeddings": False,
           "attention_bias": False, "rope_parameters": rope, "rope_theta": c.rope_theta}
  config = {
      "architectures": ["MTPDraftModel"], "speculators_model_type": "mtp",
      "speculators_version": "0.9.0", "num_nextn_predict_layers": 1,
      "transformer_layer_config": layer, "tie_word_embeddings": False,
      "speculators_config": {
          "algorithm": "mtp", "default_proposal_method": "greedy",
          "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                "accept_tolerance": 0.0, "verifier_accept_k": 1}],
          "verifier": {"name_or_path": verifier, "architectures": ["Qwen3ForCausalLM"]}},
      "dtype": np.dtype(dtype).name}
  out = T.new_dir(out)
  T.write_safetensors(os.path.join(out, "model.safetensors"), tensors)
  T.write_config(out, config)
  return out
