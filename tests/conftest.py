"""Shared fixtures: tiny models, strict promotion so dtype/rank slips fail loudly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


@jax.jit
def jit_apply(model, tokens, cache, start, block_mask=None, depth=None):
  """The model contract, compiled (tests call it outside any jit)."""
  return model.apply(tokens, cache, start, block_mask=block_mask, depth=depth)


def tiny_config(vocab_size=64, *, heads=4, kv_heads=2, layers=2, hidden=32, scale=0.3,
                tie=False, max_len=512):
  """A 1-2 layer decoder. `scale` (initializer_range) sets how peaked logits are."""
  return jspec.models.TransformerConfig(
      vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
      rope_theta=10000.0, max_position_embeddings=max_len, tie_word_embeddings=tie,
      initializer_range=scale)


def perturbed(model, noise, seed):
  """The model with Gaussian noise (relative std `noise`) on every weight: a draft that
  agrees with the target often, but not always."""
  @jax.jit
  def noisy(params):
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [x + noise * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
           for x, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, new)

  return jspec.Model(params=noisy(model.params), config=model.config,
                     apply_fn=model.apply_fn, init_cache_fn=model.init_cache_fn)


def ragged_prompts(batch, vocab_size, seed, min_len=1, max_len=13):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(min_len, max_len + 1, size=batch)
  return [rng.integers(0, vocab_size, size=int(n)).tolist() for n in lengths]


def first_divergence_gap(target, prompt, reference, other):
  """Where two greedy continuations of `prompt` first differ, return the target's
  top-2 logit gap on the shared prefix (a near-tie excuses the difference)."""
  reference, other = np.asarray(reference), np.asarray(other)
  diff = np.flatnonzero(reference != other)
  if diff.size == 0:
    return None
  i = int(diff[0])
  context = np.asarray(list(prompt) + reference[:i].tolist(), np.int32)[None]
  logits = np.asarray(target.logits(context))[0, -1]
  top2 = np.sort(logits)[-2:]
  return float(top2[1] - top2[0])


def assert_greedy_match(target, prompts, expected, got, tol=1e-4):
  """Rows equal, or differ first at a near-tie (top-2 gap < tol), per docs/architecture.md."""
  for b, prompt in enumerate(prompts):
    gap = first_divergence_gap(target, prompt, expected[b], got[b])
    assert gap is None or gap < tol, (
        f"row {b}: greedy outputs diverge where the top-2 logit gap is {gap:.3g} >= {tol}\n"
        f"expected {expected[b]}\ngot      {got[b]}")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drop each test module's compiled programs when it ends. One process compiles
  thousands of XLA CPU executables over the suite; each maps its own code pages, and
  left alive together they can reach the kernel's limit on memory maps and abort a
  later compile."""
  yield
  jax.clear_caches()


@pytest.fixture(scope="session")
def target():
  return jspec.models.init(tiny_config(), seed=0)


@pytest.fixture(scope="session")
def close_draft(target):
  return perturbed(target, 0.35, seed=7)


@pytest.fixture(scope="session")
def far_draft():
  return jspec.models.init(tiny_config(layers=1, hidden=16, heads=2, kv_heads=1), seed=3)
