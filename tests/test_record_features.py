"""`jspec.generate(..., return_features=layers)`: the decoder layers' outputs at every slot of
each row's prompt and answer, taken from the passes that generate it (the prefill, then each
step), equal to one forward pass over the finished sequence; the tokens are those of a call
without it, greedy and sampled; bad layer lists are refused before tracing."""

import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import decode
from conftest import ragged_prompts

LAYERS = (0, 1)


def _forward_features(target, sequence, layers):
  """[T, F] the layers' outputs over `sequence` in one causal pass from an empty cache."""
  model = target.with_features(layers)
  tokens = jnp.asarray([sequence], jnp.int32)
  _, hidden, _ = model.apply(tokens, model.init_cache(1, len(sequence)), jnp.zeros((1,), jnp.int32))
  return np.asarray(hidden)[0]


@pytest.mark.parametrize("layers,temperature", [
    (LAYERS, 0.0), pytest.param((1,), 1.0, marks=pytest.mark.slow),
    pytest.param((1, 0, 1), 1.0, marks=pytest.mark.slow)])
def test_features_equal_a_forward_pass_over_the_answer(target, layers, temperature):
  prompts = ragged_prompts(3, target.vocab_size, seed=4, min_len=1, max_len=9)
  kw = dict(max_new_tokens=[7, 11, 4], temperature=temperature, seed=[3, 5, 8], eos_id=())
  plain = jspec.generate(target, prompts, **kw)
  out = jspec.generate(target, prompts, return_features=layers, **kw)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  assert plain.features is None
  D = target.config.hidden_size
  assert out.features.shape[0] == 3 and out.features.shape[2] == len(layers) * D
  for b, prompt in enumerate(prompts):
    n = int(out.lengths[b])
    sequence = prompt + np.asarray(out.tokens[b, :n]).tolist()
    expected = _forward_features(target, sequence, layers)
    got = np.asarray(out.features[b])
    T = len(sequence)
    # Every fed slot (0..T-2) as one pass over the finished row computes it.
    np.testing.assert_allclose(got[:T - 1], expected[:T - 1], rtol=2e-5, atol=2e-5)
    assert np.all(got[T - 1:] == 0)  # the last token is never fed; nothing past it


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_prompts_of_one_token_and_rows_that_stop_early(target):
  """No prefill (every prompt one token), and a row that ends at EOS before the others:
  its slots past its end stay zeros while the batch runs on."""
  prompts = [[3], [7]]
  first = jspec.generate(target, prompts, max_new_tokens=6, eos_id=())
  stop = int(first.tokens[0, 1])  # row 0's second token: it ends there
  out = jspec.generate(target, prompts, max_new_tokens=6, eos_id=stop,
                       return_features=LAYERS)
  for b, prompt in enumerate(prompts):
    n = int(out.lengths[b])
    sequence = prompt + np.asarray(out.tokens[b, :n]).tolist()
    got = np.asarray(out.features[b])
    np.testing.assert_allclose(got[:len(sequence) - 1],
                               _forward_features(target, sequence, LAYERS)[:len(sequence) - 1],
                               rtol=2e-5, atol=2e-5)
    assert np.all(got[len(sequence) - 1:] == 0)
  assert int(out.lengths[0]) <= 2 < int(out.lengths[1])


def test_bad_layer_lists_are_refused_before_tracing(target):
  with pytest.raises(ValueError, match="feature_layers"):
    jspec.generate(target, [[1, 2]], max_new_tokens=2, return_features=(0, 2))  # 2 layers
  with pytest.raises(ValueError, match="at least one"):
    jspec.generate(target, [[1, 2]], max_new_tokens=2, return_features=())
  with pytest.raises(TypeError, match="tuple of decoder layer"):
    jspec.generate(target, [[1, 2]], max_new_tokens=2, return_features=1)
  with pytest.raises(TypeError, match="tuple of decoder layer"):
    jspec.generate(target, [[1, 2]], max_new_tokens=2, return_features=(True,))
  with pytest.raises(ValueError, match="plain decoding"):
    decode.DecodeConfig(num_draft_tokens=2, cache_length=16, record=(0,))
