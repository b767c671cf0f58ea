"""Flax integration: decoding inside a jitted NNX training loop, custom and Linen models.

The two examples under examples/ run here on tiny sizes: the distillation loop
must show acceptance rising, with one compiled eval step across evaluations;
the custom architectures must decode exactly (greedy output equal to their own
plain argmax loop over full forwards without a cache).
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jspec
import jspec.io.linen
import jspec.io.nnx
from conftest import assert_greedy_match, jit_apply, load_example





# ----------------------------------------------------------------------------- training loop


@pytest.fixture(scope="module")
def distill_run():
  example = load_example("distill_while_measuring")
  traces = []
  settings = example.Settings(steps=60, eval_every=20, target_steps=60, seed=0)
  history = example.run(settings, log=None, on_trace=lambda: traces.append(1))
  return history, len(traces)


@pytest.mark.slow  # trains a draft
def test_acceptance_rises_as_the_draft_distils(distill_run):
  history, _ = distill_run
  assert [e["step"] for e in history] == [0, 20, 40, 60]
  first, last = history[0], history[-1]
  # Measured over seeds 0-2: about 0.03-0.07 before, 0.30-0.50 after 60 steps.
  assert last["acceptance"] > first["acceptance"] + 0.15, history
  assert last["tokens_per_call"] > first["tokens_per_call"] + 0.15, history
  assert all(0.0 <= e["acceptance"] <= 1.0 for e in history)


@pytest.mark.slow
def test_eval_step_compiles_once_for_every_draft_state(distill_run):
  history, traces = distill_run
  # Four evaluations, each with the state the optimizer had just written (the
  # changing acceptance shows the weights differ): one trace, one compilation.
  assert len(history) == 4 and len({e["acceptance"] for e in history}) > 1
  assert traces == 1


def test_model_from_state_needs_to_model():
  graphdef, state = nnx.split(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
  with pytest.raises(TypeError, match="to_model"):
    jspec.io.nnx.model_from_state(graphdef, state)


def test_model_from_state_matches_to_model():
  example = load_example("distill_while_measuring")
  module = jspec.models.Transformer(example.draft_config(example.Settings()), rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(module)
  model = jspec.io.nnx.model_from_state(graphdef, state)
  expected = module.to_model()
  assert model.config == expected.config
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b),
                         model.params, expected.params)


# ----------------------------------------------------------------------------- custom models


@pytest.fixture(scope="module")
def custom():
  return load_example("custom_model")


@pytest.fixture(scope="module")
def plain_model(custom):
  config = custom.TinyConfig()
  return custom.make_model(config, custom.init_params(config, jax.random.key(0)))


@pytest.fixture(scope="module")
def linen_model(custom):
  return custom.make_linen_model(custom.LinenLM(), seed=0)


PROMPTS = [[3], [5, 9, 1, 40, 2], [7, 7, 7, 8, 9, 10, 11, 12, 13]]
NEW = 16


def _check_exact(custom, model):
  expected = custom.greedy_reference(model, PROMPTS, NEW)
  base = jspec.generate(model, PROMPTS, max_new_tokens=NEW)
  assert np.asarray(base.lengths).tolist() == [NEW] * len(PROMPTS)
  assert_greedy_match(model, PROMPTS, expected, np.asarray(base.tokens))
  draft = custom.perturbed(model, 0.3, 1)
  spec = jspec.speculative_generate(model, draft, PROMPTS, num_draft_tokens=3,
                                    max_new_tokens=NEW)
  assert_greedy_match(model, PROMPTS, expected, np.asarray(spec.tokens))
  # The draft is close enough that some drafts are accepted: the verify path ran.
  assert int(np.sum(spec.stats.accepted)) > 0


def test_custom_architecture_decodes_exactly(custom, plain_model):
  _check_exact(custom, plain_model)


# plain fast, Linen slow
@pytest.mark.parametrize("kind", ["plain", pytest.param("linen", marks=pytest.mark.slow)])
def test_medusa_and_eagle_decode_custom_models(custom, plain_model, linen_model, kind):
  """Heads reach the target's embedding and LM head through `Model.head_fn` only: no
  reference-decoder params, no import of the model zoo. Random heads, greedy: the
  output equals the model's own greedy decoding whatever they propose."""
  model = plain_model if kind == "plain" else linen_model
  D = model.head().embed.shape[1]
  base = jspec.generate(model, PROMPTS, max_new_tokens=NEW)
  heads = jax.tree_util.tree_map(lambda x: x + 0.05, jspec.drafters.medusa.init_heads(3, D))
  medusa = jspec.Medusa.from_target(model, heads)
  config = jspec.EagleConfig(hidden_size=D, vocab_size=model.vocab_size, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=8, intermediate_size=2 * D)
  eagle = jspec.Eagle.from_target(model, jspec.drafters.eagle.init_params(config, jax.random.key(3)),
                                  config)
  for drafter in (medusa, eagle):
    out = jspec.speculative_generate(model, drafter, PROMPTS, num_draft_tokens=3,
                                     max_new_tokens=NEW)
    assert_greedy_match(model, PROMPTS, np.asarray(base.tokens).tolist(),
                        np.asarray(out.tokens))
    assert int(np.max(np.asarray(out.stats.target_calls))) <= NEW


def test_custom_architecture_honours_block_mask_and_depth(plain_model):
  # A tree block [a, b, c] with b and c both children of a (siblings at depth 1)
  # must score c as the chain [a, c] does.
  prefix = jnp.asarray([[4, 8, 15, 16]], jnp.int32)
  cache = plain_model.init_cache(1, 16)
  _, _, cache = jit_apply(plain_model, prefix, cache, jnp.zeros((1,), jnp.int32))
  start = jnp.full((1,), 4, jnp.int32)
  tree = jnp.asarray([[23, 42, 7]], jnp.int32)
  mask = jnp.asarray([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
  depth = jnp.asarray([0, 1, 1], jnp.int32)
  tree_logits, _, _ = jit_apply(plain_model, tree, cache, start, mask, depth)
  chain_logits, _, _ = jit_apply(plain_model, jnp.asarray([[23, 7]], jnp.int32), cache, start)
  np.testing.assert_allclose(np.asarray(tree_logits[0, 2]), np.asarray(chain_logits[0, 1]),
                             rtol=1e-5, atol=1e-5)


def test_linen_adapter_decodes_exactly(custom, linen_model):
  assert isinstance(linen_model.config, jspec.io.linen.LinenConfig)
  assert linen_model.vocab_size == 64 and linen_model.max_length == 512
  _check_exact(custom, linen_model)


def test_linen_cached_logits_equal_a_full_forward(linen_model):
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 64, size=(2, 12)), jnp.int32)
  full = np.asarray(linen_model.logits(tokens))
  cache = linen_model.init_cache(2, 16)
  zeros = jnp.zeros((2,), jnp.int32)
  first, _, cache = jit_apply(linen_model, tokens[:, :7], cache, zeros)
  # Stale K/V past the committed prefix (a rejected draft, say) must be invisible:
  # write junk at slots 7..11, then the real block over it.
  junk = jnp.asarray(rng.integers(0, 64, size=(2, 5)), jnp.int32)
  _, _, cache = jit_apply(linen_model, junk, cache, zeros + 7)
  second, _, _ = jit_apply(linen_model, tokens[:, 7:], cache, zeros + 7)
  cached = np.concatenate([np.asarray(first), np.asarray(second)], axis=1)
  np.testing.assert_allclose(cached, full, rtol=1e-5, atol=1e-5)


def test_from_linen_rejects_incomplete_modules(custom):
  import flax.linen as nn

  class NoCache(nn.Module):
    vocab_size: int = 8

    def __call__(self, tokens, cache, start, block_mask=None, depth=None):
      raise NotImplementedError

  with pytest.raises(TypeError, match="init_cache"):
    jspec.io.linen.from_linen(NoCache(), {})
  with pytest.raises(TypeError, match="flax.linen.Module"):
    jspec.io.linen.from_linen(object(), {})
