"""Published drafter layouts (`jspec.load_drafter`, `jspec.io.drafter_layouts`): checkpoints written
here with NumPy in each layout (SpecForge and speculators EAGLE-3, SafeAILab EAGLE-1, medusa-llm
Medusa) load into jspec's drafters, decode greedily to the target's own output (chains, a static
tree, a dynamic tree), export and load back to the same params; bad input is a clear error
before tracing. Parity with the reference packages is tests/test_drafter_parity.py."""

import dataclasses
import json
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jspec
from jspec.io import drafter_layouts as PD
from jspec.io import layout_tensors as T
from conftest import numpy_drawn_target, tiny_config

V, D, H, HKV, DH, F = 40, 32, 4, 2, 8, 64


@pytest.fixture(scope="module")
def target():
  # 3 layers: the heads read layers 0 and 1, and speculators' ids for them (1, 2) name layer
  # outputs; its id 3 (= L) would be the final normed hidden state, which the loader refuses
  return numpy_drawn_target(V, layers=3)


def _rng(seed):
  return np.random.default_rng(seed)


def _llama_fields(**extra):
  return {"hidden_size": D, "intermediate_size": F, "num_attention_heads": H,
          "num_key_value_heads": HKV, "head_dim": DH, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
          "vocab_size": V, "max_position_embeddings": 512, "hidden_act": "silu", **extra}


def _eagle3_tensors(prefix, rng, draft_ids, qk_norm=False, scale=0.3):
  n = lambda *s: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
  one = lambda *s: (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
  N = len(draft_ids)
  t = {prefix + "input_layernorm.weight": one(D), prefix + "hidden_norm.weight": one(D),
       prefix + "self_attn.q_proj.weight": n(H * DH, 2 * D),
       prefix + "self_attn.k_proj.weight": n(HKV * DH, 2 * D),
       prefix + "self_attn.v_proj.weight": n(HKV * DH, 2 * D),
       prefix + "self_attn.o_proj.weight": n(D, H * DH),
       prefix + "post_attention_layernorm.weight": one(D),
       prefix + "mlp.gate_proj.weight": n(F, D), prefix + "mlp.up_proj.weight": n(F, D),
       prefix + "mlp.down_proj.weight": n(D, F),
       "fc.weight": n(D, 3 * D), "norm.weight": one(D), "lm_head.weight": n(N, D),
       "embed_tokens.weight": n(V, D),
       "d2t": (np.asarray(draft_ids) - np.arange(N)).astype(np.int64)}
  t2d = np.zeros(V, np.bool_)
  t2d[draft_ids] = True
  t["t2d"] = t2d
  if qk_norm:
    t[prefix + "self_attn.q_norm.weight"] = one(DH)
    t[prefix + "self_attn.k_norm.weight"] = one(DH)
  return t


def _later_layer_tensors(prefix, rng, qk_norm=False, scale=0.3):
  """A decoder layer after the first (speculators' `layers.i.*`, i >= 1): D wide, its own
  input norm, no hidden_norm."""
  n = lambda *s: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
  one = lambda *s: (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
  t = {prefix + "input_layernorm.weight": one(D),
       prefix + "self_attn.q_proj.weight": n(H * DH, D),
       prefix + "self_attn.k_proj.weight": n(HKV * DH, D),
       prefix + "self_attn.v_proj.weight": n(HKV * DH, D),
       prefix + "self_attn.o_proj.weight": n(D, H * DH),
       prefix + "post_attention_layernorm.weight": one(D),
       prefix + "mlp.gate_proj.weight": n(F, D), prefix + "mlp.up_proj.weight": n(F, D),
       prefix + "mlp.down_proj.weight": n(D, F)}
  if qk_norm:
    t[prefix + "self_attn.q_norm.weight"] = one(DH)
    t[prefix + "self_attn.k_norm.weight"] = one(DH)
  return t


def _write(path, config, tensors, file="model.safetensors"):
  os.makedirs(path, exist_ok=True)
  T.write_safetensors(os.path.join(path, file), tensors)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  return str(path)


DRAFT_IDS = list(range(0, V, 2)) + [1, 3, 5]  # 23 of the 40 ids
DRAFT_IDS.sort()


def specforge_dir(path, seed=0, layers=(0, 1, 1), **cfg_extra):
  cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
         **_llama_fields(num_hidden_layers=1), "draft_vocab_size": len(DRAFT_IDS),
         **({"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers)}}
            if layers is not None else {}), **cfg_extra}
  return _write(path, cfg, _eagle3_tensors("midlayer.", _rng(seed), DRAFT_IDS))


def speculators_dir(path, seed=1, layers=(1, 2, 2), qwen3=True, num_layers=1, layer_extra=None,
                    **cfg_extra):
  """A speculators EAGLE-3 folder; num_layers > 1 adds ordinary layers `layers.1.*` ...,
  layer_extra goes into transformer_layer_config (sliding windows), and the config flags
  norm_before_fc / fc_norm (in cfg_extra) add their norms' tensors."""
  layer = {"model_type": "qwen3" if qwen3 else "llama",
           **_llama_fields(num_hidden_layers=num_layers), **(layer_extra or {})}
  cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
         "transformer_layer_config": layer, "draft_vocab_size": len(DRAFT_IDS),
         "norm_before_residual": True, "eagle_aux_hidden_state_layer_ids": layers, **cfg_extra}
  rng = _rng(seed)
  tensors = _eagle3_tensors("layers.0.", rng, DRAFT_IDS, qk_norm=qwen3)
  for i in range(1, num_layers):
    tensors.update(_later_layer_tensors(f"layers.{i}.", rng, qk_norm=qwen3))
  n = len(layers) if layers is not None else 3
  if cfg_extra.get("norm_before_fc"):
    tensors["input_norm.weight"] = (1 + 0.1 * rng.standard_normal(n * D)).astype(np.float32)
  if cfg_extra.get("fc_norm"):
    for i in range(n):
      tensors[f"fc_norm.{i}.weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(np.float32)
  return _write(path, cfg, tensors)


def eagle1_dir(path, seed=2):
  rng = _rng(seed)
  n = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
  t = {"fc.weight": n(D, 2 * D), "fc.bias": n(D),
       "layers.0.self_attn.q_proj.weight": n(H * DH, D),
       "layers.0.self_attn.k_proj.weight": n(HKV * DH, D),
       "layers.0.self_attn.v_proj.weight": n(HKV * DH, D),
       "layers.0.self_attn.o_proj.weight": n(D, H * DH),
       "layers.0.post_attention_layernorm.weight": 1 + n(D),
       "layers.0.mlp.gate_proj.weight": n(F, D), "layers.0.mlp.up_proj.weight": n(F, D),
       "layers.0.mlp.down_proj.weight": n(D, F), "embed_tokens.weight": n(V, D)}
  cfg = {"architectures": ["LlamaForCausalLM"], **_llama_fields(num_hidden_layers=1)}
  return _write(path, cfg, t)


def medusa_dir(path, heads=3, layers=1, seed=3):
  rng = _rng(seed)
  t = {}
  for k in range(heads):
    w, b = (0.3 * rng.standard_normal((D, D))).astype(np.float32), \
        (0.1 * rng.standard_normal(D)).astype(np.float32)
    for r in range(layers):
      t[f"{k}.{r}.linear.weight"], t[f"{k}.{r}.linear.bias"] = w, b
    t[f"{k}.{layers}.weight"] = (0.5 * rng.standard_normal((V, D))).astype(np.float32)
  cfg = {"medusa_num_heads": heads, "medusa_num_layers": layers,
         "base_model_name_or_path": "tiny"}
  return _write(path, cfg, t, "medusa_lm_head.safetensors")


# ----------------------------------------------------------------------------- loading


def test_layouts_are_recognised_and_load_into_jspec_drafters(target, tmp_path):
  sf = jspec.load_drafter(specforge_dir(tmp_path / "sf"), target)
  sp = jspec.load_drafter(speculators_dir(tmp_path / "sp"), target)
  e1 = jspec.load_drafter(eagle1_dir(tmp_path / "e1"), target)
  md = jspec.load_drafter(medusa_dir(tmp_path / "md", layers=2), target)
  assert [PD.detect_layout(tmp_path / d) for d in ("sf", "sp", "e1", "md")] == [
      "specforge", "speculators", "eagle1", "medusa"]
  assert isinstance(sf, jspec.Eagle) and sf.feature_layers == (0, 1, 1)
  assert sf.config.input_form == "concat" and not sf.config.qk_norm
  # speculators' ids index hidden_states (input of layer i): jspec's layers are one lower
  assert sp.feature_layers == (0, 1, 1) and sp.config.qk_norm and sp.config.norm_before_residual
  assert np.asarray(sf.ids).tolist() == DRAFT_IDS and sf.rows.shape == (len(DRAFT_IDS), D)
  with pytest.raises(ValueError, match="drafts over its own vocabulary"):
    sf.reduced([0, 1])  # its LM head is its own, not the target's rows
  assert e1.feature_layers == () and not e1.config.attn_norm and e1.config.fc_bias
  assert isinstance(md, jspec.Medusa) and md.num_heads == 3 and md.blocks == 2
  assert md.head_out.shape == (3, V, D)
  half = jspec.load_drafter(tmp_path / "sf", target, dtype="bfloat16")
  assert {half.params["layer"]["wq"].dtype, half.rows.dtype, half.token_embed.dtype} == {
      jnp.dtype(jnp.bfloat16)}
  # jspec's own head folders load through the same call
  jspec.drafters.medusa.save_medusa(md.heads, tmp_path / "own", vocab_size=V)
  assert isinstance(jspec.load_drafter(tmp_path / "own", target), jspec.Medusa)


def test_layout_options_survive_jspec_save_and_load(target, tmp_path):
  """A head of the published form with every option saved in jspec's own format loads back
  with the same config (the options' defaults stay out of the file)."""
  from jspec.core import nn

  config = jspec.EagleConfig.for_target(
      target.config, feature_layers=(0, 1, 1), input_form="concat", qk_norm=True,
      norm_before_residual=True, rope_scaling=nn.Llama3Scaling(8.0, 1.0, 4.0, 64))
  assert jspec.EagleConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
  plain = jspec.EagleConfig.for_target(target.config)
  assert set(plain.to_dict()) == {"hidden_size", "vocab_size", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "intermediate_size",
                                  "rms_norm_eps", "rope_theta", "initializer_range",
                                  "feature_layers"}
  head = jspec.Eagle.from_target(target, jspec.drafters.eagle.init_params(
      config, jax.random.key(0)), config)
  jspec.drafters.eagle.save_eagle(head, tmp_path / "head")
  assert jspec.load_drafter(tmp_path / "head", target).config == config


def test_published_heads_never_see_the_zero_pair(target, tmp_path):
  """Loaded heads (zero_pair False) ignore the pair at slot 0: changing its token changes
  nothing at later slots, through a cache as in drafting; jspec's own heads do see it."""
  head = jspec.load_drafter(specforge_dir(tmp_path / "sf"), target)
  assert not head.config.zero_pair
  f = jnp.asarray(_rng(7).standard_normal((1, 6, D)), jnp.float32)
  slots = jnp.arange(6, dtype=jnp.int32)[None]
  visible = slots[:, :, None] >= jnp.arange(8)[None, None, :]

  def outputs(eagle, first):
    tokens = jnp.asarray([[first, 5, 6, 7, 8, 9]], jnp.int32)
    return np.asarray(eagle.forward(eagle.params, f, tokens, eagle.init_cache(1, 8), slots,
                                    slots, visible)[0])

  a, b = outputs(head, 1), outputs(head, 2)
  np.testing.assert_array_equal(a[:, 1:], b[:, 1:])
  assert not np.allclose(a[:, 0], b[:, 0])
  own = dataclasses.replace(head, config=dataclasses.replace(head.config, zero_pair=True))
  assert not np.allclose(outputs(own, 1)[:, 1:], outputs(own, 2)[:, 1:])


def test_default_aux_layers_follow_each_reference(tmp_path):
  """No ids in the config: SpecForge's default [1, L//2 - 1, L - 4] (layer outputs) and
  speculators' [2, L//2, L - 3] (hidden_states entries) name the same layers."""
  deep = jspec.models.init(tiny_config(vocab_size=V, layers=8), seed=0)
  sf = jspec.load_drafter(specforge_dir(tmp_path / "sf", layers=None), deep)
  sp = jspec.load_drafter(speculators_dir(tmp_path / "sp", layers=None), deep)
  assert sf.feature_layers == sp.feature_layers == (1, 3, 4)


def _greedy_runs(target, tmp_path, runs):
  prompts = [[3, 1, 4, 1, 5], [9], [2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
  ref = np.asarray(jspec.generate(target, prompts, max_new_tokens=16, eos_id=()).tokens)
  heads = {"sf": jspec.load_drafter(specforge_dir(tmp_path / "sf"), target),
           "sp": jspec.load_drafter(speculators_dir(tmp_path / "sp"), target),
           "e1": jspec.load_drafter(eagle1_dir(tmp_path / "e1"), target),
           "md": jspec.load_drafter(medusa_dir(tmp_path / "md"), target)}
  for name, shape in runs:
    out = jspec.speculative_generate(target, heads[name], prompts, max_new_tokens=16, eos_id=(),
                                     **shape)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref, err_msg=f"{name} {shape}")
  return heads, prompts


TREE = jspec.Tree(parents=(-1, 0, 0, 1, 1, 2, 3), ranks=(0, 0, 1, 0, 1, 0, 0))


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_greedy_equality_with_loaded_heads(target, tmp_path):
  """Every layout's head decodes to the target's own greedy output: chains of each kind and
  a static tree of the SpecForge EAGLE-3 head."""
  _greedy_runs(target, tmp_path, [("sf", dict(num_draft_tokens=3)), ("sf", dict(tree=TREE)),
                                  ("sp", dict(num_draft_tokens=3)),
                                  ("e1", dict(num_draft_tokens=3)),
                                  ("md", dict(num_draft_tokens=3))])


@pytest.mark.slow  # four more programs
def test_trees_and_sampling_with_loaded_heads(target, tmp_path):
  """Dynamic trees (EAGLE-2) over the speculators EAGLE-3 and the EAGLE-1 heads, a static
  tree of Medusa heads: greedy equality; a sampled run with the reduced-vocabulary head
  (q over the draft vocabulary spread to V; exactness of reduced-vocabulary drafting is
  tested by enumeration in tests/test_reduced_vocab.py) completes."""
  dynamic = jspec.DynamicTree(6, 3, 2)
  heads, prompts = _greedy_runs(target, tmp_path, [("sp", dict(tree=dynamic)),
                                                   ("e1", dict(tree=dynamic)),
                                                   ("md", dict(tree=TREE))])
  sampled = jspec.speculative_generate(target, heads["sf"], prompts, num_draft_tokens=3,
                                       max_new_tokens=16, eos_id=(), temperature=1.0, seed=3)
  assert np.all(np.asarray(sampled.lengths) == 16)


def test_export_round_trips(target, tmp_path):
  """Loaded heads written back in each layout (and the other EAGLE-3 one) load to the same
  params, draft vocabulary and embedding."""
  sf = jspec.load_drafter(specforge_dir(tmp_path / "sf"), target)
  sp = jspec.load_drafter(speculators_dir(tmp_path / "sp", qwen3=False,
                                          norm_before_residual=False), target)
  e1 = jspec.load_drafter(eagle1_dir(tmp_path / "e1"), target)
  md = jspec.load_drafter(medusa_dir(tmp_path / "md", layers=2), target)
  for head, fmt in ((sf, "speculators"), (sf, "specforge"), (sp, "specforge"),
                    (e1, "eagle1"), (md, "medusa")):
    out = PD.export_drafter(head, tmp_path / f"out-{fmt}-{id(head)}", fmt)
    back = jspec.load_drafter(out, target)
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           back.params if fmt != "medusa" else back.heads,
                           head.params if fmt != "medusa" else head.heads)
    if fmt == "medusa":
      np.testing.assert_array_equal(back.head_out, head.head_out)
      assert back.blocks == head.blocks
    else:
      assert back.config == head.config
      np.testing.assert_array_equal(back.token_embed, head.token_embed)
      if head.ids is not None:
        np.testing.assert_array_equal(back.ids, head.ids)
        np.testing.assert_array_equal(back.rows, head.rows)


def test_speculators_options_load_and_export(target, tmp_path):
  """speculators' Eagle3DraftModel options: more decoder layers, norm_before_fc, fc_norm,
  norm_output and sliding-window layers (Llama's layer_types with sliding_window; Qwen3's only
  under use_sliding_window, with layer_types by default from max_window_layers on) load into
  the head's config, export back to the same config and tensors, and SpecForge's layout,
  which holds none of them, refuses them."""
  full, sliding = "full_attention", "sliding_attention"
  cases = {
      "llama": (dict(qwen3=False, norm_before_residual=False, num_layers=3, fc_norm=True,
                     norm_output=True,
                     layer_extra={"layer_types": [full, sliding, sliding], "sliding_window": 5}),
                dict(num_layers=3, fc_norm=True, norm_output=True, sliding_window=5,
                     window_layers=(1, 2))),
      "qwen3 off": (dict(num_layers=2, norm_before_fc=True,
                         layer_extra={"layer_types": [sliding, sliding], "sliding_window": 5}),
                    dict(num_layers=2, norm_before_fc=True, sliding_window=None,
                         window_layers=())),
      "qwen3 on": (dict(num_layers=3, layer_extra={"use_sliding_window": True,
                                                   "sliding_window": 6, "max_window_layers": 1}),
                   dict(num_layers=3, sliding_window=6, window_layers=(1, 2))),
  }
  for name, (written, want) in cases.items():
    folder = tmp_path / name.replace(" ", "-")
    head = jspec.load_drafter(speculators_dir(folder, **written), target)
    assert {k: getattr(head.config, k) for k in want} == want, name
    out = PD.export_drafter(head, tmp_path / f"out-{folder.name}", "speculators")
    with open(os.path.join(out, "config.json")) as f:
      layer = json.load(f)["transformer_layer_config"]
    assert layer["num_hidden_layers"] == want["num_layers"]
    back = jspec.load_drafter(out, target)
    assert back.config == head.config, name
    jax.tree_util.tree_map(np.testing.assert_array_equal, back.params, head.params)
    if name == "llama":  # else refused already for its q/k norms and residual
      with pytest.raises(ValueError, match=r"decoder layers.*--format speculators writes it"):
        PD.export_drafter(head, tmp_path / f"sf-{folder.name}", "specforge")


def test_jspec_heads_export_when_their_layer_is_a_published_one(target, tmp_path):
  """A jspec EAGLE-3 head of the published layer form (input_form 'concat', reduced vocab)
  exports; jspec's own fc form is refused with a message that says how to train one."""
  cfg = jspec.EagleConfig.for_target(target.config, feature_layers=(0, 1, 1),
                                     input_form="concat", initializer_range=0.3)
  head = jspec.Eagle.from_target(target, jspec.drafters.eagle.init_params(
      cfg, jax.random.key(0)), cfg).reduced(DRAFT_IDS)
  back = jspec.load_drafter(PD.export_drafter(head, tmp_path / "sp", "speculators"), target)
  np.testing.assert_array_equal(back.ids, head.ids)
  np.testing.assert_array_equal(back.rows, head.rows)
  f = jnp.asarray(_rng(5).standard_normal((1, 4, D)), jnp.float32)
  np.testing.assert_allclose(back.draft_scores(f), head.draft_scores(f), rtol=1e-6)
  medusa = jspec.Medusa.from_target(target, jspec.drafters.medusa.init_heads(2, D))
  again = jspec.load_drafter(PD.export_drafter(medusa, tmp_path / "md", "medusa"), target)
  np.testing.assert_allclose(again.logits(f), medusa.logits(f), rtol=1e-6, atol=1e-6)
  own = jspec.EagleConfig.for_target(target.config, feature_layers=(0, 1, 1))
  own_head = jspec.Eagle.from_target(target, jspec.drafters.eagle.init_params(
      own, jax.random.key(0)), own)
  with pytest.raises(ValueError, match="input_form='concat'"):
    PD.export_drafter(own_head, tmp_path / "no", "specforge")
  with pytest.raises(ValueError, match="attn_norm=False"):
    PD.export_drafter(jspec.Eagle.from_target(target, jspec.drafters.eagle.init_params(
        jspec.EagleConfig.for_target(target.config), jax.random.key(0))), tmp_path / "no1",
        "eagle1")


# ----------------------------------------------------------------------------- bad input


def _edit_config(path, **changes):
  file = os.path.join(path, "config.json")
  with open(file) as f:
    cfg = json.load(f)
  for key, value in changes.items():
    if value is None:
      cfg.pop(key, None)
    else:
      cfg[key] = value
  with open(file, "w") as f:
    json.dump(cfg, f)


def _edit_tensors(path, file="model.safetensors", **changes):
  full = os.path.join(path, file)
  t = T.open_tensors(path, (file.split(".")[0],))
  tensors = {n: t.get(n) for n in t.names}
  for key, value in changes.items():
    if value is None:
      tensors.pop(key.replace("__", "."))
    else:
      tensors[key.replace("__", ".")] = value
  T.write_safetensors(full, tensors)


def test_bad_input_is_a_clear_error(target, tmp_path):
  big = jspec.models.init(tiny_config(vocab_size=V, hidden=48, heads=4), seed=0)
  d = specforge_dir(tmp_path / "hidden")
  with pytest.raises(ValueError, match=r"config.json: hidden size 32, but the target's is 48"):
    jspec.load_drafter(d, big)
  d = specforge_dir(tmp_path / "vocab")
  _edit_config(d, vocab_size=V + 1)
  with pytest.raises(ValueError, match=r"vocabulary size 41, but the target's is 40"):
    jspec.load_drafter(d, target)
  d = specforge_dir(tmp_path / "aux", layers=(0, 1, 3))
  with pytest.raises(ValueError, match=r"auxiliary layer ids \[0, 1, 3\] do not fit the "
                                       r"target's 3 layers"):
    jspec.load_drafter(d, target)
  d = speculators_dir(tmp_path / "aux0", layers=(0, 1, 2))
  with pytest.raises(ValueError, match=r"id 0, the embeddings"):
    jspec.load_drafter(d, target)
  d = speculators_dir(tmp_path / "auxL", layers=(1, 2, 3))  # id 3 = L: after the final norm
  with pytest.raises(ValueError, match=r"ids must lie in \[1, 2\].*final hidden state after "
                                       r"the norm"):
    jspec.load_drafter(d, target)
  d = speculators_dir(tmp_path / "types", num_layers=2,
                      layer_extra={"layer_types": ["chunked_attention", "full_attention"]})
  with pytest.raises(ValueError, match=r"layer_types \['chunked_attention'\] are not attention "
                                       r"kinds jspec reads"):
    jspec.load_drafter(d, target)
  d = speculators_dir(tmp_path / "later", num_layers=3)
  _edit_tensors(d, layers__2__input_layernorm__weight=None)
  with pytest.raises(ValueError, match=r"tensor layers.2.input_layernorm.weight is missing"):
    jspec.load_drafter(d, target)
  d = speculators_dir(tmp_path / "norms", norm_before_fc=True, fc_norm=True)
  with pytest.raises(ValueError, match=r"norm_before_fc and fc_norm exclude each other"):
    jspec.load_drafter(d, target)
  d = specforge_dir(tmp_path / "d2t")
  d2t = (np.asarray(DRAFT_IDS) - np.arange(len(DRAFT_IDS))).astype(np.int64)
  d2t[-1] += 5
  _edit_tensors(d, d2t=d2t)
  with pytest.raises(ValueError, match=r"model.safetensors: d2t maps draft id 22 to target id "
                                       r"43, outside the target's vocabulary of 40"):
    jspec.load_drafter(d, target)
  d = specforge_dir(tmp_path / "missing")
  _edit_tensors(d, midlayer__hidden_norm__weight=None)
  with pytest.raises(ValueError, match=r"tensor midlayer.hidden_norm.weight is missing"):
    jspec.load_drafter(d, target)
  d = specforge_dir(tmp_path / "shape")
  _edit_tensors(d, fc__weight=np.zeros((D, 2 * D), np.float32))
  with pytest.raises(ValueError, match=r"model.safetensors: tensor fc.weight has shape "
                                       r"\(32, 64\), but .* gives \(32, 96\)"):
    jspec.load_drafter(d, target)
  d = medusa_dir(tmp_path / "medusa_vocab")
  _edit_tensors(d, "medusa_lm_head.safetensors",
                **{"0__1__weight": np.zeros((V + 2, D), np.float32)})
  with pytest.raises(ValueError, match=r"tensor 0.1.weight has shape \(42, 32\): vocabulary 42, "
                                       r"but the target's is 40"):
    jspec.load_drafter(d, target)
  d = eagle1_dir(tmp_path / "trunc")
  file = os.path.join(d, "model.safetensors")
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) - 100)
  with pytest.raises(ValueError, match=r"model.safetensors is truncated: tensor"):
    jspec.load_drafter(d, target)
  d = _write(tmp_path / "unknown", {"architectures": ["GPT2LMHeadModel"]},
             {"x": np.zeros(3, np.float32)})
  with pytest.raises(ValueError, match=r"not a drafter layout jspec recognises; recognised: "
                                       r"specforge: .*speculators: .*eagle1: .*medusa: "):
    jspec.load_drafter(d, target)
  with pytest.raises(FileNotFoundError, match="has no config.json"):
    jspec.load_drafter(tmp_path, target)


def test_command_line_drafter_resolution(target, tmp_path):
  """`--drafter DIR` / `--draft DIR` (`chat.drafter_from_flag` over `jspec.bench.methods`,
  shared by generate, chat, measure, serve and profile) reads published layouts; a misfit is
  a SystemExit naming the folder."""
  from jspec.tools import chat

  drafter, k = chat.drafter_from_flag(target, specforge_dir(tmp_path / "sf"))
  assert isinstance(drafter, jspec.Eagle) and k is None
  drafter, k = chat.drafter_from_flag(target, str(medusa_dir(tmp_path / "md")) + "@k=2")
  assert isinstance(drafter, jspec.Medusa) and k == 2
  big = jspec.models.init(tiny_config(vocab_size=V, hidden=48, heads=4, layers=3), seed=0)
  with pytest.raises(SystemExit, match=r"--drafter .*sp cannot draft for the target: .*hidden "
                                       r"size 32, but the target's is 48"):
    chat.drafter_from_flag(big, speculators_dir(tmp_path / "sp"))


@pytest.mark.slow  # the CLI on the shipped target: two programs compiled
def test_export_drafter_command_and_generate_with_its_output(tmp_path, capsys):
  """`jspec export-drafter` writes a jspec EAGLE-3 head (the published layer form) for the
  shipped target as speculators; `jspec generate --draft OUT` prints what plain greedy does."""
  from jspec.drafters import eagle as E
  from jspec.io import shipped
  from jspec.tools import cli

  target = shipped.load(shipped.TARGET)
  config = E.EagleConfig.for_target(target.config, feature_layers=(0, 1, 2), input_form="concat")
  head = E.Eagle.from_target(target, E.init_params(config, jax.random.key(0)), config)
  E.save_eagle(head.reduced(np.arange(512)), tmp_path / "head")
  assert cli.main(["export-drafter", str(tmp_path / "head"), str(tmp_path / "sp"),
                   "--format", "speculators"]) == 0
  assert PD.detect_layout(tmp_path / "sp") == "speculators"
  capsys.readouterr()
  prompt = ["generate", "--prompt", "def add(a, b):", "--max-new-tokens", "12"]
  assert cli.main(prompt + ["--draft", "none"]) == 0
  plain = capsys.readouterr().out
  assert cli.main(prompt + ["--draft", str(tmp_path / "sp"), "--k", "3"]) == 0
  assert capsys.readouterr().out == plain
  with pytest.raises(SystemExit, match="input_form='concat'"):
    own = E.EagleConfig.for_target(target.config, feature_layers=(0, 1, 2))
    E.save_eagle(E.Eagle.from_target(target, E.init_params(own, jax.random.key(0)), own),
                 tmp_path / "own")
    cli.main(["export-drafter", str(tmp_path / "own"), str(tmp_path / "x"), "--format",
              "specforge"])


@pytest.mark.slow  # training
def test_a_trained_head_of_the_published_form_exports():
  """jspec's trainer takes a head of the published EAGLE-3 layer form (input_form 'concat')
  as it is: held-out cross-entropy falls, and the trained head exports to both EAGLE-3
  layouts and loads back drafting the same scores."""
  import tempfile

  from jspec.training import train_eagle as TE

  target = numpy_drawn_target(V, output_scale=0.02, layers=3)
  prompts = _rng(3).integers(0, V, size=(48, 4)).astype(np.int32)
  text = np.asarray(jspec.generate(target, prompts.tolist(), max_new_tokens=28,
                                   eos_id=()).tokens)
  windows = np.concatenate([prompts, text], axis=1)
  head = jspec.EagleConfig.for_target(target.config, feature_layers=(0, 1, 1),
                                      input_form="concat")
  cfg = TE.EagleTrainConfig(steps=40, batch_size=8, seq_len=32, learning_rate=2e-2,
                            warmup_steps=5, checkpoint_every=1000, feature_noise=0.0,
                            ttt_steps=3)
  order = _rng(4)
  result = TE.train_eagle(target, cfg, lambda step: windows[order.permutation(40)[:8]],
                          config=head, progress=False)
  initial = jspec.Eagle.from_target(target, jspec.drafters.eagle.init_params(
      head, jax.random.key(0)), head)
  before, after = (TE.evaluate(e, target, windows[40:]) for e in (initial, result.eagle))
  assert after["ce"] < before["ce"] - 1.0, (before, after)
  trained = result.eagle.reduced(DRAFT_IDS)
  f = jnp.asarray(_rng(5).standard_normal((1, 4, D)), jnp.float32)
  with tempfile.TemporaryDirectory() as tmp:
    for fmt in ("speculators", "specforge"):
      back = jspec.load_drafter(PD.export_drafter(trained, os.path.join(tmp, fmt), fmt), target)
      np.testing.assert_allclose(back.draft_scores(f), trained.draft_scores(f), rtol=1e-6)
