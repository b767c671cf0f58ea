"""jspec's programs compile with XLA CPU options of their own (`jspec.core.compilation`)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import compilation
from jspec.core import programs
from tests.conftest import tiny_config


def _step(model, cache, token, start):
  logits, _, cache = model.prepared().apply(token, cache, start)
  return jnp.argmax(logits, axis=-1), cache


def _cache_copies(jitted, model, batch: int) -> int:
  """Copies of whole cache buffers in the compiled one-token step."""
  cache = model.init_cache(batch, 64)
  hlo = jitted.lower(model, cache, jnp.ones((batch, 1), jnp.int32),
                     jnp.full((batch,), 5, jnp.int32)).compile().as_text()
  shapes = {f"f32[{','.join(map(str, a.shape))}]" for a in jax.tree_util.tree_leaves(cache)}
  return sum(1 for m in re.finditer(r"= (f32\[[\d,]+\])\{[\d,]*\} copy\(", hlo)
             if m.group(1) in shapes)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are XLA CPU's")
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_a_batch_1_step_writes_its_cache_in_place(kv_heads):
  """With plain jax.jit XLA CPU copies every layer's K and V buffers at a batch-1 step
  (the step reads them as they were and writes its slot in place); compiled as jspec
  compiles its programs, it copies none."""
  model = jspec.models.init(tiny_config(kv_heads=kv_heads), seed=0)
  plain = jax.jit(_step, donate_argnums=(1,))
  ours = compilation.program(_step, donate_argnums=(1,))
  assert _cache_copies(ours, model, 1) == 0
  copies = _cache_copies(plain, model, 1)  # the copies the options remove
  if copies == 0:
    pytest.skip("this XLA copies no cache buffer without the options either")
  assert copies >= 2 * model.config.num_hidden_layers  # every K and V buffer


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are XLA CPU's")
@pytest.mark.slow
def test_the_options_change_no_output(target, close_draft):
  """The same greedy tokens with and without the options, plain and speculative."""
  prompts = [[1, 2, 3, 4, 5]]
  outs = {}
  for options in (False, True):
    with programs.fixed.using(options):
      outs[options] = (np.asarray(jspec.generate(target, prompts, max_new_tokens=12).tokens),
                       np.asarray(jspec.speculative_generate(target, close_draft, prompts,
                                                             num_draft_tokens=3,
                                                             max_new_tokens=12).tokens))
  for a, b in zip(outs[False], outs[True]):
    np.testing.assert_array_equal(a, b)


def test_program_keeps_the_jit_interface():
  """`program` works bare and with jit arguments, and exposes `lower` and the cache size."""
  double = compilation.program(lambda x: 2 * x)
  scaled = compilation.program(static_argnames=("k",))(lambda x, k: k * x)
  np.testing.assert_array_equal(np.asarray(double(jnp.arange(3))), [0, 2, 4])
  np.testing.assert_array_equal(np.asarray(scaled(jnp.arange(3), k=3)), [0, 3, 6])
  assert "multiply" in double.lower(jnp.arange(3)).as_text()
  assert scaled._cache_size() == 1
