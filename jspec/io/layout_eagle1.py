"""EAGLE-1/2 heads in SafeAILab's layout (the `eagle-llm` package), into `jspec.Eagle` and back.

The directory holds a Llama config.json (the head's layer: hidden size, heads, MLP width;
`num_hidden_layers` 1) and `pytorch_model.bin` (or model.safetensors) with

    fc.weight [D, 2D], fc.bias [D]      over [e(t_j); h_{j-1}]: the embedding first
    layers.0.self_attn.{q,k,v,o}_proj   no input norm on layer 0 (the reference skips it)
    layers.0.post_attention_layernorm, layers.0.mlp.{gate,up,down}_proj
    embed_tokens.weight [V, D]          a frozen copy of the target's

The head reads the target's final (normed) hidden state and its outputs go to the
target's own LM head, as jspec's EAGLE-1 heads do; EAGLE-2 drafts with the same head over
a dynamic tree (`jspec.DynamicTree`). The reference's rotary embedding ignores the
config's `rope_theta` (base 10000), and so does this loader.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jspec.drafters.eagle import Eagle, EagleConfig, check_params
from jspec.models.hf import CheckpointError
from jspec.io import layout_tensors as T

LAYOUT = "eagle1"
ROPE_BASE = 10000.0  # eagle-llm's LlamaRotaryEmbedding default; the config's theta is unused


def recognised(tensors: T.Tensors) -> bool:
  """Whether the tensors are an EAGLE-1/2 head's (fc over two inputs and a `layers.0`)."""
  return "fc.weight" in tensors.names and "layers.0.self_attn.q_proj.weight" in tensors.names


def load(path: str, cfg: dict, tensors: T.Tensors, target, dtype=None) -> Eagle:
  """An EAGLE-1 `Eagle` for `target` from directory `path` (cfg its parsed config.json,
  tensors its weights): layer 0 without an input norm, the fc's two input blocks swapped
  into jspec's [h; e] order, the target's LM head; params cast to `dtype` (None keeps)."""
  import jax.numpy as jnp

  where = os.path.join(path, "config.json")
  if int(cfg.get("num_hidden_layers", 1)) != 1 or "layers.1.self_attn.q_proj.weight" in \
      tensors.names:
    raise CheckpointError(f"{where}: {cfg.get('num_hidden_layers')} decoder layers; jspec's "
                          f"EAGLE head has one")
  if cfg.get("rope_scaling"):
    raise CheckpointError(f"{where}: rope_scaling {cfg['rope_scaling']} is not supported for "
                          f"EAGLE-1 heads")
  try:
    D, H = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    config = EagleConfig(
        hidden_size=D, vocab_size=int(cfg["vocab_size"]), num_attention_heads=H,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or H), head_dim=D // H,
        intermediate_size=int(cfg["intermediate_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=ROPE_BASE,
        fc_bias="fc.bias" in tensors.names, attn_norm=False, zero_pair=False)
  except KeyError as e:
    raise CheckpointError(f"{where}: missing field {e}") from None
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: {e}") from None
  T.fits_target(where, D, config.vocab_size, target)
  V = config.vocab_size
  c = config
  Hkv, Dh, F = c.num_key_value_heads, c.head_dim, c.intermediate_size
  what = f"{where} (hidden {D}, heads {H}/{Hkv}x{Dh}, mlp {F})"
  if "layers.0.input_layernorm.weight" in tensors.names:
    raise CheckpointError(f"{tensors.where('layers.0.input_layernorm.weight')}: layer 0 has an "
                          f"input norm, which SafeAILab's EAGLE-1 layer 0 does not")

  def linear(name, out_dim, in_dim):
    return tensors.get(name, (out_dim, in_dim), what).T

  fc = linear("fc.weight", D, 2 * D)  # [2D, D], rows over [e; h]
  params = {
      # jspec's fc reads [h; e]: swap the two row blocks
      "fc": {"kernel": np.concatenate([fc[D:], fc[:D]], axis=0)},
      "layer": {
          "wq": linear("layers.0.self_attn.q_proj.weight", H * Dh, D).reshape(D, H, Dh),
          "wk": linear("layers.0.self_attn.k_proj.weight", Hkv * Dh, D).reshape(D, Hkv, Dh),
          "wv": linear("layers.0.self_attn.v_proj.weight", Hkv * Dh, D).reshape(D, Hkv, Dh),
          "wo": linear("layers.0.self_attn.o_proj.weight", D, H * Dh).reshape(H, Dh, D),
          "mlp_norm": {"scale": tensors.get("layers.0.post_attention_layernorm.weight", (D,),
                                            what)},
          "w_gate": linear("layers.0.mlp.gate_proj.weight", F, D),
          "w_up": linear("layers.0.mlp.up_proj.weight", F, D),
          "w_down": linear("layers.0.mlp.down_proj.weight", D, F),
      },
  }
  if c.fc_bias:
    params["fc"]["bias"] = tensors.get("fc.bias", (D,), what)
  embed = None
  if "embed_tokens.weight" in tensors.names:
    embed = tensors.get("embed_tokens.weight", (V, D), f"{where} (vocab {V}, hidden {D})")
  check_params(params, config, f"{where} tensors")
  cast = (lambda x: jnp.asarray(x, dtype)) if dtype is not None else jnp.asarray
  params = T.as_arrays(params, dtype)
  eagle = Eagle.from_target(target, params, config)
  return dataclasses.replace(eagle, token_embed=None if embed is None else cast(embed),
                             layout=LAYOUT)



def export(eagle: Eagle, out: str, *, dtype=np.float32, max_positions: int = 2048) -> str:
  """Write an EAGLE-1 head into the new directory `out` in SafeAILab's layout."""
  c = eagle.config
  if c.fused or c.input_form != "fc" or c.attn_norm or c.qk_norm or c.rope_scaling is not None:
    raise ValueError(
        "SafeAILab's EAGLE-1 layout holds heads over the final hidden state whose layer has no "
        "input norm (EagleConfig attn_norm=False, no feature_layers, no qk_norm or rope "
        f"scaling); this head has feature_layers={c.feature_layers}, attn_norm={c.attn_norm}, "
        f"qk_norm={c.qk_norm}. Train with EagleConfig.for_target(target.config, "
        "attn_norm=False)")
  if c.rope_theta != ROPE_BASE:
    raise ValueError(f"SafeAILab's EAGLE-1 layer uses rotary base {ROPE_BASE:g} whatever its "
                     f"config says; this head uses {c.rope_theta:g}")
  if eagle.ids is not None:
    raise ValueError("SafeAILab's EAGLE-1 layout drafts over the full vocabulary; export the "
                     "head before `reduced`")
  D, H, Hkv, Dh = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
  if Dh * H != D:
    raise ValueError(f"SafeAILab's EAGLE-1 layer needs head_dim * heads = hidden ({Dh} * {H} "
                     f"!= {D})")
  w, f = eagle.params["layer"], (lambda x: np.asarray(x, np.float32).astype(dtype))
  kernel = np.asarray(eagle.params["fc"]["kernel"], np.float32)  # rows over [h; e]
  tensors = {
      "fc.weight": f(np.concatenate([kernel[D:], kernel[:D]], axis=0).T),
      "layers.0.self_attn.q_proj.weight": f(np.asarray(w["wq"]).reshape(D, H * Dh).T),
      "layers.0.self_attn.k_proj.weight": f(np.asarray(w["wk"]).reshape(D, Hkv * Dh).T),
      "layers.0.self_attn.v_proj.weight": f(np.asarray(w["wv"]).reshape(D, Hkv * Dh).T),
      "layers.0.self_attn.o_proj.weight": f(np.asarray(w["wo"]).reshape(H * Dh, D).T),
      "layers.0.post_attention_layernorm.weight": f(w["mlp_norm"]["scale"]),
      "layers.0.mlp.gate_proj.weight": f(np.asarray(w["w_gate"]).T),
      "layers.0.mlp.up_proj.weight": f(np.asarray(w["w_up"]).T),
      "layers.0.mlp.down_proj.weight": f(np.asarray(w["w_down"]).T),
  }
  if c.fc_bias:
    tensors["fc.bias"] = f(eagle.params["fc"]["bias"])
  if eagle.token_embed is None and eagle.embedding_multiplier != 1.0:
    raise ValueError("the target scales its embeddings (embedding_multiplier "
                     f"{eagle.embedding_multiplier}); the EAGLE-1 layout reads them unscaled")
  tensors["embed_tokens.weight"] = f(eagle.head().dense().embed if eagle.token_embed is None
                                     else eagle.token_embed)
  out = T.new_dir(out)
  T.write_safetensors(os.path.join(out, "model.safetensors"), tensors)
  T.write_torch(os.path.join(out, "pytorch_model.bin"), tensors)  # what eagle-llm reads
  T.write_config(out, {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
      "intermediate_size": c.intermediate_size, "num_attention_heads": H,
      "num_key_value_heads": Hkv, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
      "hidden_act": "silu", "vocab_size": c.vocab_size, "max_position_embeddings": max_positions,
      "rope_theta": ROPE_BASE, "rope_scaling": None, "pretraining_tp": 1, "bias": c.fc_bias,
      "tie_word_embeddings": False, "torch_dtype": np.dtype(dtype).name})
  return out
