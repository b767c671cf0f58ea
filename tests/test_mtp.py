"""MTP modules (`jspec.MTP`, `jspec.io.layout_mtp`): a module written here with NumPy in vLLM
speculators' MTP layout loads as a `jspec.MTP`, decodes greedily to the target's own output
(chain, static tree, dynamic tree), gives the target's log-probabilities and honours a
constraint, exports and loads back to the same params; bad input is a clear error before
tracing. Parity with speculators' own module: tests/test_drafter_parity.py; whole-sequence
distributions: tests/test_distribution.py."""

import json
import os

import numpy as np
import pytest

import jax

import jspec
from jspec.drafters import eagle as E
from jspec.drafters.mtp import MTP, mtp_config
from jspec.io import drafter_layouts as PD
from jspec.io import layout_tensors as T
from conftest import numpy_drawn_target, require, tiny_config

V, D, H, HKV, DH, F = 40, 32, 4, 2, 8, 64
P = "mtp_layers.0."


@pytest.fixture(scope="module")
def target():
  return numpy_drawn_target(V)


def _tensors(seed=0, scale=0.3):
  rng = np.random.default_rng(seed)
  n = lambda *s: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
  one = lambda *s: (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
  return {P + "token_layernorm.weight": one(D), P + "hidden_layernorm.weight": one(D),
          P + "input_proj.weight": n(D, 2 * D), P + "input_layernorm.weight": one(D),
          P + "self_attn.q_proj.weight": n(H * DH, D), P + "self_attn.k_proj.weight": n(HKV * DH, D),
          P + "self_attn.v_proj.weight": n(HKV * DH, D), P + "self_attn.o_proj.weight": n(D, H * DH),
          P + "self_attn.q_norm.weight": one(DH), P + "self_attn.k_norm.weight": one(DH),
          P + "post_attention_layernorm.weight": one(D), P + "mlp.gate_proj.weight": n(F, D),
          P + "mlp.up_proj.weight": n(F, D), P + "mlp.down_proj.weight": n(D, F),
          P + "final_layernorm.weight": one(D)}


def _config(**layer):
  fields = {"model_type": "qwen3", "hidden_size": D, "intermediate_size": F,
            "num_attention_heads": H, "num_key_value_heads": HKV, "head_dim": DH,
            "num_hidden_layers": 2, "rms_norm_eps": 1e-6, "vocab_size": V,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, **layer}
  return {"architectures": ["MTPDraftModel"], "speculators_model_type": "mtp",
          "num_nextn_predict_layers": 1, "transformer_layer_config": fields}


def mtp_dir(path, tensors=None, **config):
  os.makedirs(path, exist_ok=True)
  T.write_safetensors(os.path.join(path, "model.safetensors"),
                      _tensors() if tensors is None else tensors)
  cfg = _config()
  cfg.update(config)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(cfg, f)
  return str(path)


@pytest.fixture(scope="module")
def module(target, tmp_path_factory):
  return jspec.load_drafter(mtp_dir(tmp_path_factory.mktemp("mtp") / "m"), target)


def test_loads_as_an_mtp_module_and_exports_back(module, target, tmp_path):
  assert isinstance(module, MTP) and isinstance(module, jspec.Eagle)
  c = module.config
  assert (c.input_form, c.qk_norm, c.zero_pair, c.feature_layers) == ("mtp", True, False, ())
  # input_proj [D, 2D] over [norm(e); norm(h)] is stored as the kernel [2D, D], rows in order
  np.testing.assert_array_equal(np.asarray(module.params["mtp_in"]["kernel"]),
                                _tensors()[P + "input_proj.weight"].T)
  out = PD.export_drafter(module, tmp_path / "out", "speculators", verifier="verifier-dir")
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["speculators_model_type"] == "mtp" and cfg["num_nextn_predict_layers"] == 1
  back = jspec.load_drafter(out, target)
  jax.tree_util.tree_map(np.testing.assert_array_equal, back.params, module.params)
  with pytest.raises(ValueError, match="--format speculators writes it"):
    PD.export_drafter(module, tmp_path / "x", "specforge")
  # jspec's own format keeps the kind
  E.save_eagle(module, tmp_path / "own")
  assert isinstance(jspec.load_drafter(tmp_path / "own", target), MTP)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_greedy_decoding_equals_the_target_with_logprobs(module, target):
  """Chain, static tree and dynamic tree: the target's own greedy output and log-probabilities;
  the module's drafts are accepted often enough to exercise the rewinds."""
  prompts = [[3, 1, 4, 1, 5], [9], [2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
  kw = dict(max_new_tokens=16, eos_id=(), return_logprobs=True)
  ref = jspec.generate(target, prompts, **kw)
  for shape in (dict(num_draft_tokens=3),
                dict(tree=jspec.Tree(parents=(-1, 0, 0, 1, 1, 2, 3), ranks=(0, 0, 1, 0, 1, 0, 0))),
                dict(tree=jspec.DynamicTree(depth=3, top_k=2, nodes=6))):
    out = jspec.speculative_generate(target, module, prompts, **shape, **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens), str(shape))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=1e-4)
    assert int(np.sum(np.asarray(out.stats.accepted))) > 0, shape


def test_a_constraint_holds_under_mtp_drafting(module, target):
  vocab = [chr(ord("a") + i % 26) + str(i // 26) for i in range(V - 1)] + ["<eos>"]
  regex = jspec.Constraint.from_regex(r"(a0|b0)+c0", vocab, eos_ids=[V - 1])
  kw = dict(max_new_tokens=10, eos_id=[V - 1], constraint=regex)
  ref = jspec.generate(target, [[3, 1, 4]], **kw)
  out = jspec.speculative_generate(target, module, [[3, 1, 4]], num_draft_tokens=3, **kw)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  text = "".join(vocab[t] for t in np.asarray(out.tokens[0, :int(out.lengths[0])]))
  assert text.startswith(("a0", "b0")) and set(text.replace("<eos>", "")) <= set("abc0")


def test_random_module_from_the_target_config(target):
  config = mtp_config(target.config, qk_norm=True)
  module = MTP.from_target(target, E.init_params(config, jax.random.key(0)), config)
  assert module.config.input_form == "mtp"
  with pytest.raises(ValueError, match="input_form='mtp'"):
    MTP.from_target(target, module.params, E.EagleConfig.for_target(target.config))
  with pytest.raises(ValueError, match="reads the target's final hidden state"):
    mtp_config(target.config, feature_layers=(0,))


def _edit(path, **tensors):
  t = T.open_tensors(str(path))
  kept = {n: t.get(n) for n in t.names}
  for name, value in tensors.items():
    if value is None:
      kept.pop(P + name)
    else:
      kept[P + name] = value
  T.write_safetensors(os.path.join(path, "model.safetensors"), kept)


def test_bad_input_is_a_clear_error(target, tmp_path):
  big = jspec.models.init(tiny_config(vocab_size=V, hidden=48, heads=4), seed=0)
  with pytest.raises(ValueError, match=r"config.json: hidden size 32, but the target's is 48"):
    jspec.load_drafter(mtp_dir(tmp_path / "hidden"), big)
  d = mtp_dir(tmp_path / "vocab", transformer_layer_config=dict(
      _config()["transformer_layer_config"], vocab_size=V + 1))
  with pytest.raises(ValueError, match=r"vocabulary size 41, but the target's is 40"):
    jspec.load_drafter(d, target)
  with pytest.raises(ValueError, match=r"num_nextn_predict_layers 2"):
    jspec.load_drafter(mtp_dir(tmp_path / "two", num_nextn_predict_layers=2), target)
  d = mtp_dir(tmp_path / "next", transformer_layer_config=dict(
      _config()["transformer_layer_config"], model_type="qwen3_next"))
  with pytest.raises(ValueError, match=r"model_type 'qwen3_next'.*hybrid"):
    jspec.load_drafter(d, target)
  d = mtp_dir(tmp_path / "missing")
  _edit(d, **{"final_layernorm.weight": None})
  with pytest.raises(ValueError, match=r"tensor mtp_layers.0.final_layernorm.weight is missing"):
    jspec.load_drafter(d, target)
  d = mtp_dir(tmp_path / "shape")
  _edit(d, **{"input_proj.weight": np.zeros((D, D), np.float32)})
  with pytest.raises(ValueError, match=r"tensor mtp_layers.0.input_proj.weight has shape "
                                       r"\(32, 32\), but .* gives \(32, 64\)"):
    jspec.load_drafter(d, target)
  d = mtp_dir(tmp_path / "trunc")
  file = os.path.join(d, "model.safetensors")
  with open(file, "r+b") as f:
    f.truncate(os.path.getsize(file) - 100)
  with pytest.raises(ValueError, match=r"model.safetensors is truncated: tensor"):
    jspec.load_drafter(d, target)


def test_a_hub_id_is_downloaded_when_no_such_folder_exists(target, tmp_path, monkeypatch):
  """`load_drafter("org/name", target)`: a repo id that is not a local path goes through
  huggingface_hub's snapshot_download (replaced here: no network in tests), config and weights
  only; a local folder of that name wins."""
  hub = require("huggingface_hub")  # in the hub extra; transformers (dev) installs it too
  folder = mtp_dir(tmp_path / "snapshot")
  calls = []

  def fake(repo_id, allow_patterns=None, **kw):
    calls.append((repo_id, tuple(allow_patterns)))
    return folder

  monkeypatch.setattr(hub, "snapshot_download", fake)
  monkeypatch.chdir(tmp_path)
  assert isinstance(jspec.load_drafter("some-org/qwen3-mtp", target), MTP)
  assert calls and calls[0][0] == "some-org/qwen3-mtp"
  assert "config.json" in calls[0][1] and "*.safetensors" in calls[0][1]
  os.makedirs(tmp_path / "some-org")
  mtp_dir(tmp_path / "some-org" / "local-mtp")
  jspec.load_drafter("some-org/local-mtp", target)
  assert len(calls) == 1
