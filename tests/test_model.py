"""The reference decoder: cached decoding equals the full forward pass."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jspec
from conftest import jit_apply, tiny_config


@pytest.mark.parametrize("heads,kv_heads", [(4, 4)] + [pytest.param(*h, marks=pytest.mark.slow)
                                                        for h in ((4, 2), (4, 1))],
                         ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("tie", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["untied", "tied"])
def test_cached_blocks_equal_full_forward(heads, kv_heads, tie):
  model = jspec.models.init(tiny_config(heads=heads, kv_heads=kv_heads, tie=tie), seed=1)
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 64, size=(3, 12)), jnp.int32)
  full = model.logits(tokens)  # [B, T, V]

  # Feed the same tokens as blocks of 5, 1, 4, 2 through a cache of 20 slots.
  cache = model.init_cache(3, 20)
  pieces, pos = [], 0
  for size in (5, 1, 4, 2):
    start = jnp.full((3,), pos, jnp.int32)
    logits, hidden, cache = jit_apply(model, tokens[:, pos:pos + size], cache, start)
    chex.assert_shape(hidden, (3, size, 32))
    pieces.append(logits)
    pos += size
  chex.assert_trees_all_close(jnp.concatenate(pieces, axis=1), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4)] + [pytest.param(*h, marks=pytest.mark.slow)
                                                        for h in ((4, 2), (4, 1))],
                         ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("window,softcap", [(None, None),
                                            pytest.param(4, 5.0, marks=pytest.mark.slow)],
                         ids=["full", "window-softcap"])
def test_batch1_steps_equal_full_forward(heads, kv_heads, window, softcap):
  """One-token steps at batch 1 (the split step attention) match the full forward pass,
  over a cache whose later slots hold stale garbage."""
  import dataclasses
  config = dataclasses.replace(tiny_config(heads=heads, kv_heads=kv_heads),
                               sliding_window=window, attn_logit_softcapping=softcap)
  model = jspec.models.init(config, seed=4)
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 64, size=(1, 10)), jnp.int32)
  full = model.logits(tokens)  # [1, T, V]
  cache = jax.tree_util.tree_map(lambda x: x + 7.0, model.init_cache(1, 16))  # stale slots
  _, _, cache = jit_apply(model, tokens[:, :3], cache, jnp.zeros((1,), jnp.int32))
  steps = []
  for pos in range(3, 10):
    logits, _, cache = jit_apply(model, tokens[:, pos:pos + 1], cache,
                                 jnp.full((1,), pos, jnp.int32))
    steps.append(logits)
  chex.assert_trees_all_close(jnp.concatenate(steps, axis=1), full[:, 3:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_step_attention_equals_attention_over_updated_cache(kv_heads):
  from jspec.core import nn as layers
  B, H, Dh, S = 2, 4, 8, 12
  rng = np.random.default_rng(5)
  q = jnp.asarray(rng.normal(size=(B, 1, H, Dh)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(B, kv_heads, Dh, S)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, kv_heads, S, Dh)), jnp.float32)
  k_new = jnp.asarray(rng.normal(size=(B, 1, kv_heads, Dh)), jnp.float32)
  v_new = jnp.asarray(rng.normal(size=(B, 1, kv_heads, Dh)), jnp.float32)
  start = np.array([5, 0])  # row 1: an empty cache, the token sees itself only
  slots = np.arange(S)
  k_up, v_up = np.array(k), np.array(v)
  for b in range(B):
    k_up[b, :, :, start[b]] = k_new[b, 0]
    v_up[b, :, start[b]] = v_new[b, 0]
  seen_all = jnp.asarray(slots[None, None, :] <= start[:, None, None])  # [B, 1, S]
  seen_old = jnp.asarray(slots[None, None, :] < start[:, None, None])
  want = layers.attention(q, jnp.asarray(k_up), jnp.asarray(v_up), seen_all, 0.3, 2.0)
  got = layers.step_attention(q, k, v, k_new, v_new, seen_old, 0.3, 2.0)
  chex.assert_trees_all_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_rows_with_different_starts():
  """Rows decode at their own offsets: each matches its own full forward pass."""
  model = jspec.models.init(tiny_config(), seed=2)
  rng = np.random.default_rng(1)
  seqs = [rng.integers(0, 64, size=n) for n in (3, 7, 1)]
  S = 16
  cache = model.init_cache(3, S)
  # Prefill each row's prefix (all but its last token) right-padded in one block.
  block = np.zeros((3, 6), np.int32)
  for b, s in enumerate(seqs):
    block[b, :len(s) - 1] = s[:-1]
  _, _, cache = jit_apply(model, jnp.asarray(block), cache, jnp.zeros((3,), jnp.int32))
  last = jnp.asarray([[s[-1]] for s in seqs], jnp.int32)
  start = jnp.asarray([len(s) - 1 for s in seqs], jnp.int32)
  step, _, _ = jit_apply(model, last, cache, start)
  for b, s in enumerate(seqs):
    full = model.logits(jnp.asarray(s, jnp.int32)[None])[0, -1]
    np.testing.assert_allclose(step[b, 0], full, atol=1e-4, rtol=1e-4)


def test_tree_block_mask_and_depth():
  """A block with a custom mask/depth sees exactly its ancestors: a branch equals its chain."""
  model = jspec.models.init(tiny_config(), seed=4)
  prefix = jnp.asarray([[5, 9, 2]], jnp.int32)
  # Tree: root r, two children a and b (both at depth 1).
  r, a, b = 11, 20, 30
  mask = jnp.asarray([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)
  depth = jnp.asarray([0, 1, 1], jnp.int32)
  cache = model.init_cache(1, 16)
  _, _, cache = jit_apply(model, prefix, cache, jnp.zeros((1,), jnp.int32))
  tree, _, _ = jit_apply(model, jnp.asarray([[r, a, b]], jnp.int32), cache,
                           jnp.asarray([3], jnp.int32), block_mask=mask, depth=depth)
  chain_b = model.logits(jnp.asarray([[5, 9, 2, r, b]], jnp.int32))[0, -1]
  np.testing.assert_allclose(tree[0, 2], chain_b, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_nnx_module_matches_model_and_trains():
  config = tiny_config()
  module = jspec.models.Transformer(config, rngs=nnx.Rngs(0))
  model = module.to_model()
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(2, 9)), jnp.int32)
  chex.assert_trees_all_close(nnx.jit(lambda m, t: m(t))(module, tokens), model.logits(tokens), atol=1e-5, rtol=1e-5)

  def loss_fn(m):
    logits = m(tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

  loss_fn = nnx.jit(loss_fn)
  before = loss_fn(module)
  grads = nnx.jit(nnx.grad(loss_fn))(module)
  flat = jax.tree_util.tree_leaves(nnx.state(grads))
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in flat)
  # One plain gradient step lowers the loss: the module is trainable as is.
  params = nnx.state(module, nnx.Param)
  nnx.update(module, jax.tree_util.tree_map(lambda p, g: p - 0.5 * g, params, nnx.state(grads)))
  assert float(loss_fn(module)) < float(before)


def test_bf16_params_keep_f32_logits():
  model = jspec.models.init(tiny_config(), seed=0, dtype=jnp.bfloat16)
  logits = model.logits(jnp.asarray([[1, 2, 3]], jnp.int32))
  assert logits.dtype == jnp.float32
  ref = jspec.models.init(tiny_config(), seed=0).logits(jnp.asarray([[1, 2, 3]], jnp.int32))
  assert float(jnp.max(jnp.abs(logits - ref))) < 0.05 * float(jnp.max(jnp.abs(ref)))


def test_config_validation():
  with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
    tiny_config(heads=4, kv_heads=3)
  with pytest.raises(ValueError, match="vocab_size must be >= 1"):
    tiny_config(vocab_size=0)
  cfg = jspec.models.TransformerConfig.from_dict(dict(
      vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
      num_attention_heads=2, model_type="llama", torch_dtype="float32"))
  assert cfg.num_key_value_heads == 2 and cfg.head_dim == 4


def test_cache_layouts_hold_the_same_k_v():
  """Both orders: the shapes and logical axes each names, and the same logits from a
  cached prefill and step (the decoding check is the slow test below)."""
  from jspec.core import nn as layers
  base = tiny_config()
  params = jspec.models.init(base, seed=3).params
  logits = {}
  for layout in (layers.CPU_KV, layers.SLOT_MAJOR_KV):
    model = jspec.models.make_model(dataclasses.replace(base, kv_layout=layout), params)
    cache = model.init_cache(2, 24)
    want = layout.shape("k", 2, 2, 24, 8), layout.shape("v", 2, 2, 24, 8)
    assert (cache["k"][0].shape, cache["v"][0].shape) == want
    assert model.axes_fn(model.config)[1]["k"][0] == layout.axis_names("k")
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 64, size=(2, 6)), jnp.int32)
    first, _, cache = jit_apply(model, tokens[:, :5], cache, jnp.zeros((2,), jnp.int32))
    rest, _, _ = jit_apply(model, tokens[:, 5:], cache, jnp.full((2,), 5, jnp.int32))
    logits[layout] = jnp.concatenate([first, rest], axis=1)
  chex.assert_trees_all_close(logits[layers.CPU_KV], logits[layers.SLOT_MAJOR_KV],
                              atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match="b first"):
    layers.KVLayout("hbsd", "bhsd")


@pytest.mark.slow  # fast: ..._hold_the_same_k_v
@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
def test_cache_layouts_decode_identically(kv_heads):
  """The CPU order (K [B, Hkv, Dh, S], V [B, Hkv, S, Dh]) and the slot-major order
  ([B, S, Hkv, Dh]) of other backends hold the same K/V: same logits, same greedy
  and sampled tokens, for a chain and for a tree (whose compaction finds the slot
  axis through the cache's logical axes)."""
  from jspec.core import nn as layers
  from conftest import perturbed
  base = tiny_config(kv_heads=kv_heads)
  assert base.cache_layout() == layers.CPU_KV  # these tests run on CPU
  params = jspec.models.init(base, seed=3).params
  models = {}
  for layout in (layers.CPU_KV, layers.SLOT_MAJOR_KV):
    config = jspec.models.TransformerConfig.from_dict(
        dataclasses.replace(base, kv_layout=layout).to_dict())  # survives a round trip
    assert config.cache_layout() == layout
    models[layout] = jspec.models.make_model(config, params)
  slot_major = models[layers.SLOT_MAJOR_KV]
  cache = slot_major.init_cache(2, 24)
  assert cache["k"][0].shape == cache["v"][0].shape == (2, 24, kv_heads, 8)
  assert slot_major.axes_fn(slot_major.config)[1]["k"][0] == ("batch", "sequence", "kv_heads", "head_dim")

  rng = np.random.default_rng(4)
  tokens = jnp.asarray(rng.integers(0, 64, size=(2, 9)), jnp.int32)
  logits = {}
  for layout, model in models.items():
    c = model.init_cache(2, 24)
    first, _, c = jit_apply(model, tokens[:, :5], c, jnp.zeros((2,), jnp.int32))
    rest, _, c = jit_apply(model, tokens[:, 5:6], c, jnp.full((2,), 5, jnp.int32))
    logits[layout] = jnp.concatenate([first, rest], axis=1)
  chex.assert_trees_all_close(logits[layers.CPU_KV], logits[layers.SLOT_MAJOR_KV],
                              atol=1e-5, rtol=1e-5)

  prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9]]
  outs = {}
  for layout, model in models.items():
    draft = perturbed(model, 0.3, seed=1)
    outs[layout] = [
        jspec.speculative_generate(model, draft, prompts, num_draft_tokens=3,
                                   max_new_tokens=12).tokens,
        jspec.speculative_generate(model, draft, prompts, num_draft_tokens=3, temperature=1.0,
                                   seed=5, max_new_tokens=12).tokens,
        jspec.speculative_generate(model, draft, prompts, tree=jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0)]),
                                   max_new_tokens=12).tokens]
  for a, b in zip(outs[layers.CPU_KV], outs[layers.SLOT_MAJOR_KV]):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("batch", [1, 3])
def test_attention_reads_a_span_that_holds_the_live_rows(batch):
  """Rounds read the shortest cache prefix that holds every row's live slots (a switch
  over static spans): the same logits and cache as reading the whole cache, for blocks
  in every span, chains, one-token steps (batch 1: the split step) and a tree mask, over
  a cache whose unwritten slots hold garbage that would show if a span were too short."""
  config = dataclasses.replace(tiny_config(), min_attention_span=8)
  assert jspec.models.transformer.layers.attention_spans(64, "cpu", 8) == (8, 16, 32, 64)
  spanned = jspec.models.init(config, seed=5)
  whole = jspec.models.init(dataclasses.replace(config, min_attention_span=0), seed=5)
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(0, 64, size=(batch, 60)), jnp.int32)
  cache = jax.tree_util.tree_map(lambda x: x + 3.0, spanned.init_cache(batch, 64))
  caches = [cache, cache]
  step = lambda m: str(jax.make_jaxpr(m.apply)(tokens[:, :1], cache, jnp.zeros((batch,),
                                                                             jnp.int32)))
  assert "cond[" in step(spanned) and "cond[" not in step(whole)  # the switch is there
  mask = jnp.asarray(np.tril(np.ones((4, 4), bool)) & ~np.eye(4, k=-2, dtype=bool))
  pos = 0
  for size in (7, 1, 6, 4, 13, 1, 20, 4):  # blocks ending in spans 8, 16, 32 and 64
    start = jnp.asarray(pos + np.arange(batch) % 2, jnp.int32)  # rows one slot apart
    tree = size == 4 and pos > 40
    args = dict(block_mask=mask, depth=jnp.asarray([0, 1, 1, 2])) if tree else {}
    outs = [jit_apply(m, tokens[:, pos:pos + size], c, start, **args)
            for m, c in zip((spanned, whole), caches)]
    chex.assert_trees_all_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(outs[0][2], outs[1][2], atol=1e-5, rtol=1e-5)
    caches = [outs[0][2], outs[1][2]]
    pos += size
