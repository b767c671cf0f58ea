"""Parity with PyTorch `transformers` for every supported family.

Each family: a tiny random-init model built from a config, weights re-drawn at a
larger scale (so greedy decoding is not dominated by near-ties), saved with
`save_pretrained`, loaded by jspec. Checked: logits, greedy generation,
speculative generation against HF greedy and HF assisted generation, and the
export back to a directory `transformers` loads.
"""

import numpy as np
import pytest

from conftest import require

torch = require("torch")
tf = require("transformers")

import jax.numpy as jnp  # noqa: E402

import jspec  # noqa: E402
from jspec.io import checkpoint  # noqa: E402
from jspec.models import hf  # noqa: E402
from conftest import assert_greedy_match  # noqa: E402

pytestmark = pytest.mark.slow  # torch parity, every family

V = 64
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, vocab_size=V)
DRAFT = dict(SMALL, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
             num_attention_heads=2, num_key_value_heads=1)

FAMILIES = {
    "llama": lambda kw: tf.LlamaConfig(**kw, rope_parameters=dict(rope_type="default",
                                                                  rope_theta=1000.0)),
    "llama3": lambda kw: tf.LlamaConfig(**kw, rope_parameters=dict(
        rope_type="llama3", rope_theta=50000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=16)),
    "mistral": lambda kw: tf.MistralConfig(**kw, sliding_window=8),
    "qwen2": lambda kw: tf.Qwen2Config(**kw, tie_word_embeddings=True),
    "qwen3": lambda kw: tf.Qwen3Config(**kw, head_dim=12),
    "gemma": lambda kw: tf.GemmaConfig(**kw, head_dim=8),
    "gemma2": lambda kw: tf.Gemma2Config(**kw, head_dim=8, sliding_window=8,
                                         query_pre_attn_scalar=16, final_logit_softcapping=8.0,
                                         attn_logit_softcapping=20.0),
    "gpt2": lambda kw: tf.GPT2Config(vocab_size=V, n_embd=kw["hidden_size"],
                                     n_layer=kw["num_hidden_layers"],
                                     n_head=kw["num_attention_heads"], n_positions=128),
}
PROMPTS = [[5, 17, 3], [1, 2, 3, 4, 5, 6, 7], [60, 11, 42, 9, 33, 8, 8, 21, 50, 2, 19, 40]]
NEW = 32


def _build(family, kw, seed, path):
  torch.manual_seed(seed)
  model = tf.AutoModelForCausalLM.from_config(FAMILIES[family](kw), attn_implementation="eager")
  gemma = family.startswith("gemma")
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim >= 2:
        p.normal_(0.0, 0.2)
      elif name.endswith("bias") or gemma:
        p.normal_(0.0, 0.1)  # biases, and Gemma norms (stored as w - 1)
      else:
        p.normal_(1.0, 0.1)  # norm scales
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  model.eval()
  model.save_pretrained(path)
  return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request, tmp_path_factory):
  family = request.param
  root = tmp_path_factory.mktemp(family)
  target = _build(family, SMALL, 0, root / "target")
  draft = _build(family, DRAFT, 1, root / "draft")
  return family, root, target, draft


def _hf_greedy(model, prompt, **kw):
  ids = torch.tensor([prompt])
  with torch.no_grad():
    out = model.generate(ids, max_new_tokens=NEW, do_sample=False, **kw)
  return out[0, len(prompt):].numpy()


def test_logits_match(pair):
  family, root, target, _ = pair
  model = hf.load_hf(str(root / "target"))
  tokens = np.random.default_rng(0).integers(0, V, size=(2, 40))
  with torch.no_grad():
    want = target(torch.tensor(tokens)).logits.numpy()
  got = np.asarray(model.logits(jnp.asarray(tokens, jnp.int32)))
  scale = np.abs(want).max()
  assert np.abs(got - want).max() <= 1e-4 * scale, (family, np.abs(got - want).max(), scale)


def test_greedy_and_speculative_match_transformers(pair):
  family, root, target, draft = pair
  model = hf.load_hf(str(root / "target"))
  small = hf.load_hf(str(root / "draft"))
  want = np.stack([_hf_greedy(target, p) for p in PROMPTS])
  assisted = np.stack([_hf_greedy(target, p, assistant_model=draft) for p in PROMPTS])
  base = jspec.generate(model, PROMPTS, max_new_tokens=NEW)
  spec = jspec.speculative_generate(model, small, PROMPTS, num_draft_tokens=3, max_new_tokens=NEW)
  assert_greedy_match(model, PROMPTS, want, np.asarray(base.tokens))
  assert_greedy_match(model, PROMPTS, want, np.asarray(spec.tokens))
  assert_greedy_match(model, PROMPTS, assisted, np.asarray(spec.tokens))


def test_round_trip_hf_native_hf(pair, tmp_path):
  """HF -> jspec -> orbax -> jspec -> HF export: identical logits at every step."""
  family, root, target, _ = pair
  tokens = np.random.default_rng(1).integers(0, V, size=(1, 24))
  jtokens = jnp.asarray(tokens, jnp.int32)
  with torch.no_grad():
    want = target(torch.tensor(tokens)).logits.numpy()

  from_hf = jspec.load(str(root / "target"))
  ref = np.asarray(from_hf.logits(jtokens))
  assert np.abs(ref - want).max() <= 1e-4 * np.abs(want).max()
  jspec.save(from_hf, tmp_path / "native")
  native = jspec.load(tmp_path / "native")
  np.testing.assert_array_equal(native.logits(jtokens), ref)
  checkpoint.save_hf(native, str(tmp_path / "export"))
  again = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"),
                                                  attn_implementation="eager")
  assert again.config.model_type == target.config.model_type
  with torch.no_grad():
    np.testing.assert_array_equal(again(torch.tensor(tokens)).logits.numpy(), want)
  np.testing.assert_array_equal(jspec.load(str(tmp_path / "export")).logits(jtokens), ref)
