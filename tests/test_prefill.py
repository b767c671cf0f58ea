"""Chunked prefill: the cache and hidden states it leaves equal one call's, rows of any
length, a cache with no room past the prompt; decoding over it is unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import prefill

from conftest import assert_greedy_match, ragged_prompts


def _padded(prompts, P):
  tokens = np.zeros((len(prompts), P), np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  return jnp.asarray(tokens), jnp.asarray([len(p) for p in prompts], jnp.int32)


@pytest.fixture
def chunk(monkeypatch):
  """A 4-token chunk, so tiny prompts take several chunks; programs traced with it are
  dropped afterwards."""
  monkeypatch.setattr(prefill, "CHUNK", 4)
  jax.clear_caches()
  yield 4
  jax.clear_caches()


@pytest.mark.parametrize("slack", [0, 9])
@pytest.mark.parametrize("lengths", [(15, 3, 9), (5, 2, 1), (16, 16, 16)])
def test_chunks_leave_the_cache_of_one_call(target, chunk, lengths, slack):
  P = 16
  rng = np.random.default_rng(sum(lengths))
  prompts = [rng.integers(0, target.vocab_size, n).tolist() for n in lengths]
  tokens, L = _padded(prompts, P)
  # slack 0: a cache of exactly P - 1 slots, so a chunk written past slot P - 2 could not
  # fit. slack 9: the prompt goes into a cache of its own size, copied into this one.
  cache0 = target.init_cache(len(prompts), P - 1 + slack)
  one = jax.jit(lambda c: target.apply(tokens[:, :-1], c, jnp.zeros((3,), jnp.int32)))(cache0)
  chunked, hidden = jax.jit(lambda c: prefill.prefill(target, tokens, L, c, hidden=True))(cache0)
  for name in ("k", "v"):
    for layer, (a, b) in enumerate(zip(one[2][name], chunked[name])):
      slot_axis = 3 if name == "k" else 2
      for row, n in enumerate(lengths):  # slots of the row's own prompt (all but its last token)
        idx = [row] + [slice(None)] * (a.ndim - 1)
        idx[slot_axis] = slice(0, n - 1)
        np.testing.assert_allclose(np.asarray(b[tuple(idx)]), np.asarray(a[tuple(idx)]),
                                   rtol=1e-5, atol=1e-5, err_msg=f"{name} layer {layer} row {row}")
  for row, n in enumerate(lengths):
    np.testing.assert_allclose(np.asarray(hidden[row, :n - 1]), np.asarray(one[1][row, :n - 1]),
                               rtol=1e-5, atol=1e-5)
  for name, slot_axis in (("k", 3), ("v", 2)):  # the full size back, nothing past P - 2
    for buf in chunked[name]:
      assert buf.shape[slot_axis] == P - 1 + slack
      assert not np.any(np.asarray(jnp.take(buf, jnp.arange(P - 1, P - 1 + slack), axis=slot_axis)))


def test_decoding_form_is_built_once_per_model(target):
  assert target.prepare_fn is not None  # the reference decoder has a decoding form
  form = target.decoding_form()
  assert isinstance(form.params["layers"], list)
  assert form.prepare_fn is None and form.prepared() is form
  assert target.decoding_form() is form  # kept with the model
  in_program = jax.jit(lambda m: m.prepared().params)(target)
  assert jax.tree_util.tree_structure(form.params) == jax.tree_util.tree_structure(in_program)
  for a, b in zip(jax.tree_util.tree_leaves(form.params), jax.tree_util.tree_leaves(in_program)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  other = jax.tree_util.tree_map(lambda x: x + 0, target)  # new arrays: a new form
  assert other.decoding_form() is not form


def test_only_chunks_with_real_tokens_run(target, chunk):
  """A 3-token prompt in a 64 bucket runs one 4-token chunk, not sixteen: the traced loop
  stops at the longest row's last chunk (counted through a model that records calls)."""
  calls = []

  def counting(config, params, tokens, cache, start, block_mask=None, depth=None):
    jax.debug.callback(lambda: calls.append(1))
    return target.apply_fn(config, params, tokens, cache, start, block_mask=block_mask,
                           depth=depth)

  model = jspec.Model(params=target.params, config=target.config, apply_fn=counting,
                      init_cache_fn=target.init_cache_fn)
  tokens, L = _padded([[1, 2, 3]], 64)
  cache, _ = jax.jit(lambda c: prefill.prefill(model, tokens, L, c))(model.init_cache(1, 64))
  jax.block_until_ready(cache)
  assert len(calls) == 1
  calls.clear()
  tokens, L = _padded([[1, 2, 3], list(range(1, 11))], 64)  # the longer row: slots 0..8
  cache, _ = jax.jit(lambda c: prefill.prefill(model, tokens, L, c))(model.init_cache(2, 64))
  jax.block_until_ready(cache)
  assert len(calls) == 3


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3])
def test_decoding_over_chunked_prefill_is_unchanged(target, close_draft, batch):
  prompts = ragged_prompts(batch, target.vocab_size, seed=batch, min_len=5, max_len=30)
  ref = jspec.generate(target, prompts, max_new_tokens=12, eos_id=())
  old = prefill.CHUNK
  try:
    prefill.CHUNK = 4
    jax.clear_caches()
    base = jspec.generate(target, prompts, max_new_tokens=12, eos_id=())
    spec = jspec.speculative_generate(target, jspec.DraftModel(close_draft), prompts,
                                      num_draft_tokens=3, max_new_tokens=12, eos_id=())
  finally:
    prefill.CHUNK = old
    jax.clear_caches()
  assert_greedy_match(target, prompts, np.asarray(ref.tokens), np.asarray(base.tokens))
  np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(base.tokens))
