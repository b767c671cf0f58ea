"""Weight-only int8 (`jspec.core.quant`, `jspec.models.quantize_model`, `jspec.load(...,
weights="int8")`, the "self-int8" method): the rounding bound per channel; float models
traced exactly as before; an int8 model close to its float one; speculative decoding with
an int8 target exactly that target's own output (greedy with a draft model and n-gram
lookup, and sampled, counted against the enumerated distribution); the target's int8 copy
as a draft; loading shrinks the bytes, and a bad `weights=` fails before anything is read.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import assert_greedy_match, jit_apply, perturbed, ragged_prompts, tiny_config
from jspec.core import quant
from jspec.models import transformer

DTYPES = [jnp.float32, jnp.bfloat16]
TIES = pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])


def ties(fast):
  """Untied and tied embeddings; only the case tie == `fast` runs in the fast lane (the
  decoding tests' compiles cost seconds each on 2 cores; one case of each property stays
  fast, the other runs in the slow lane)."""
  return pytest.mark.parametrize("tie", [pytest.param(t, marks=() if t == fast else
                                                      pytest.mark.slow) for t in (False, True)],
                                 ids=["untied", "tied"])


@pytest.fixture(scope="module")
def pairs():
  """{tie: (f32 target, its int8 copy)}, untied and tied embeddings, made on first use."""
  made = {}

  def get(tie):
    if tie not in made:
      target = jspec.models.init(tiny_config(tie=tie), seed=0)
      made[tie] = (target, jspec.models.quantize_model(target))
    return made[tie]

  return get


@pytest.fixture
def pair(pairs, tie):
  return pairs(tie)


# ----------------------------------------------------------------------------- the rounding


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, axes", [((2, 32, 4, 8), (1,)), ((64, 32), (1,)),
                                         ((2, 4, 8, 32), (1, 2)), ((32, 64), (0,))],
                         ids=["wq", "embed", "wo", "lm_head"])
def test_rounding_error_is_at_most_half_a_step_per_channel(shape, axes, dtype):
  w = jax.random.normal(jax.random.key(1), shape, jnp.float32).astype(dtype)
  w = w.at[(0,) * len(shape)].set(0)  # a zero entry stays exactly zero
  qw = quant.quantize(w, axes)
  assert qw.q.dtype == jnp.int8 and qw.q.shape == shape and qw.scale.dtype == dtype
  assert qw.scale.shape == tuple(1 if i in axes else n for i, n in enumerate(shape))
  w32, q = np.asarray(w, np.float32), np.asarray(qw.q, np.int32)
  s = np.asarray(qw.scale, np.float32)
  err = np.abs(w32 - q * s)
  assert np.all(err <= s / 2 * (1 + 1e-6)), float(np.max(err / s))
  assert np.all(np.abs(q) <= 127)
  # Each channel's largest weight lands on +-127 (the whole int8 range is used).
  np.testing.assert_array_equal(np.max(np.abs(q), axis=axes), 127)
  assert q[(0,) * len(shape)] == 0
  np.testing.assert_allclose(np.asarray(quant.dequantize(qw), np.float32), q * s, rtol=1e-2)


def test_an_all_zero_channel_quantizes_to_zero():
  w = jnp.zeros((4, 3)).at[:, 1].set(jnp.asarray([2.0, -1.5, 0.4, 0.0]))
  qw = quant.quantize(w, (0,))
  np.testing.assert_array_equal(np.asarray(qw.q[:, 0]), 0)
  assert np.all(np.isfinite(np.asarray(qw.scale)))
  np.testing.assert_array_equal(np.asarray(qw.q[:, 1]), [127, -95, 25, 0])  # round(127 x / 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("shape, axes, scale", [
    ((2, 64, 4, 8), (1,), (2, 2, 4, 8)), ((64, 96), (1,), (64, 3)),
    ((2, 4, 64, 32), (1, 2), (2, 4, 2, 32)), ((96, 64), (0,), (3, 64)),
    ((24, 5), (0,), (3, 5))],  # 24 inputs: groups of gcd(24, 32) = 8
    ids=["wq", "embed", "wo", "lm_head", "short"])
def test_int4_rounding_error_is_at_most_half_a_step_per_group(shape, axes, scale, dtype):
  """Affine per group of inputs along the last contracted axis (each head of wo its own
  groups): 16 levels from the group's min to its max, each weight within half a step."""
  w = jax.random.normal(jax.random.key(2), shape, jnp.float32).astype(dtype)
  qw = quant.quantize(w, axes, "int4")
  assert qw.q.dtype == jnp.uint4 and qw.q.shape == shape and qw.scale.shape == scale
  assert qw.scale.dtype == dtype and qw.offset.shape == scale and qw.offset.dtype == dtype
  w32, q = np.asarray(w, np.float32), np.asarray(qw.q, np.int32)
  s = np.asarray(quant._expand(qw.scale, shape), np.float32)
  o = np.asarray(quant._expand(qw.offset, shape), np.float32)
  tol = 1e-6 if dtype == jnp.float32 else 2.0 ** -7  # bf16 scale and offset: rounded
  assert np.all(np.abs(w32 - (q * s + o)) <= s / 2 + tol * (np.abs(o) + 15 * s))
  assert 0 <= q.min() and q.max() <= 15
  # Each group's min lands on 0 and its max on 15: the groups are where the scale says.
  a = max(axes)
  g = shape[a] // scale[a]
  split = q.reshape(shape[:a] + (shape[a] // g, g) + shape[a + 1:])
  np.testing.assert_array_equal(np.min(split, axis=a + 1), 0)
  np.testing.assert_array_equal(np.max(split, axis=a + 1), 15)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_fp8_error_is_within_e4m3s_rounding(dtype):
  """e4m3 keeps 3 mantissa bits: rounding moves a normal value by at most 2^-4 of itself,
  a subnormal one (below 2^-6) by at most 2^-10 (in units of the scale)."""
  w = jax.random.normal(jax.random.key(3), (64, 48), jnp.float32).astype(dtype)
  qw = quant.quantize(w, (0,), "fp8")
  assert qw.q.dtype == jnp.float8_e4m3fn and qw.scale.shape == (1, 48)
  w32, s = np.asarray(w, np.float32), np.asarray(qw.scale, np.float32)
  q = np.asarray(qw.q, np.float32)
  np.testing.assert_allclose(np.max(np.abs(q), axis=0), 448.0)  # the range is used
  err = np.abs(w32 / s - q)
  assert np.all(err <= np.maximum(2.0 ** -4 * np.abs(w32 / s), 2.0 ** -10) * (1 + 1e-3))
  assert 0 < np.mean(err) < 0.1 * np.mean(np.abs(q))  # rounded, and not by much


def test_forms_mix_exactly_when_fused():
  """int8 per channel, int4 (affine) in groups of 32, and an affine int8 weight in groups of 16,
  concatenated along their outputs: the fused weight dequantizes to the three dequantized
  weights side by side, and computes their products."""
  keys = jax.random.split(jax.random.key(4), 3)
  a = quant.quantize(jax.random.normal(keys[0], (64, 8)), (0,), "int8")
  b = quant.quantize(jax.random.normal(keys[1], (64, 8)), (0,), "int4")  # uint4, affine
  c = quant.QuantWeight(q=jax.random.randint(keys[2], (64, 8), 0, 31).astype(jnp.int8),
                        scale=jnp.full((4, 8), 0.01), offset=jnp.full((4, 8), -0.15))
  fused = quant.concatenate([a, b, c], axis=1)
  assert fused.q.dtype == jnp.int8 and fused.scale.shape == (4, 24)
  assert fused.offset.shape == (4, 24)
  want = jnp.concatenate([quant.dequantize(w) for w in (a, b, c)], axis=1)
  np.testing.assert_array_equal(np.asarray(quant.dequantize(fused)), np.asarray(want))
  x = jax.random.normal(jax.random.key(5), (2, 3, 64))
  np.testing.assert_allclose(np.asarray(quant.einsum("btd,df->btf", x, fused)),
                             np.asarray(jnp.einsum("btd,df->btf", x, want)), rtol=1e-5,
                             atol=1e-5)
  # A float weight beside quantized ones: all dequantized.
  mixed = quant.concatenate([a, jnp.ones((64, 2))], axis=1)
  assert not isinstance(mixed, quant.QuantWeight) and mixed.shape == (64, 10)
  np.testing.assert_array_equal(np.asarray(mixed[:, :8]), np.asarray(quant.dequantize(a)))


def test_a_per_channel_weight_takes_the_per_head_groups_of_another():
  """Stacking wo [H, Dh, D] per channel (scale [1, 1, D]) with wo in per-head groups
  ([H, Dh/32, D], as a GGUF layer holds it): both to [H, Dh/32, D], each as it was."""
  keys = jax.random.split(jax.random.key(6), 3)
  grouped = quant.QuantWeight(q=jax.random.randint(keys[0], (4, 64, 8), -8, 8).astype(jnp.int4),
                              scale=jax.random.uniform(keys[1], (4, 2, 8)))
  channel = quant.quantize(jax.random.normal(keys[2], (4, 64, 8)), (0, 1), "int8")
  a, b = quant.common_form([grouped, channel])
  assert a.scale.shape == b.scale.shape == (4, 2, 8) and a.q.dtype == b.q.dtype == jnp.int8
  for before, after in ((grouped, a), (channel, b)):
    np.testing.assert_array_equal(np.asarray(quant.dequantize(after)),
                                  np.asarray(quant.dequantize(before)))


def test_bytes_count_four_bit_values_at_half_a_byte():
  w = jnp.ones((64, 32), jnp.float32)
  # int4: half a byte a value, a scale and an offset per 32 inputs.
  assert quant.num_bytes(quant.quantize(w, (0,), "int4")) == 64 * 32 // 2 + 2 * 2 * 32 * 4
  assert quant.num_bytes(quant.quantize(w, (0,), "int8")) == 64 * 32 + 32 * 4
  assert quant.num_bytes(quant.quantize(w, (0,), "fp8")) == 64 * 32 + 32 * 4
  assert quant.num_elements(quant.quantize(w, (0,), "int4")) == 64 * 32


# ----------------------------------------------------------------------------- float models


def _direct(monkeypatch):
  """The helpers replaced by the direct calls they stand for (before int8 existed)."""
  monkeypatch.setattr(quant, "einsum", lambda eq, x, w, **kw: jnp.einsum(eq, x, w, **kw))
  monkeypatch.setattr(quant, "take", lambda w, i, axis=0: jnp.take(w, i, axis=axis))
  monkeypatch.setattr(quant, "matrix", lambda w: w.reshape(w.shape[0], -1))
  monkeypatch.setattr(quant, "concatenate", lambda ws, axis: jnp.concatenate(ws, axis=axis))


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_float_models_trace_exactly_as_with_direct_einsums(tie, monkeypatch):
  """On float weights every helper adds nothing: the cache-free scan and a cached decoding
  call (per-layer cut, fused q/k/v) trace to the same program as direct jnp calls, so the
  default path is bit-identical."""
  model = jspec.models.init(tiny_config(tie=tie), seed=0)
  c = model.config
  tokens = jnp.asarray([[1, 2, 3], [4, 5, 6]], jnp.int32)
  start = jnp.asarray([0, 2], jnp.int32)
  cache = model.init_cache(2, 16)

  def programs():  # traced afresh each time: no jitted function whose trace is cached
    scan = jax.make_jaxpr(lambda p, t, s: transformer.apply(c, p, t, None, s))
    cached = jax.make_jaxpr(lambda p, t, k, s: transformer.apply(
        c, transformer.unstack(c, p), t, k, s))
    return (str(scan(model.params, tokens, start)),
            str(cached(model.params, tokens, cache, start)))

  with_helpers = programs()
  with monkeypatch.context() as m:
    _direct(m)
    direct = programs()
  assert with_helpers == direct


# ----------------------------------------------------------------------------- int8 models


@TIES
def test_quantized_params_cover_every_matrix_and_nothing_else(pair):
  target, int8 = pair
  def flat(params):
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(
        params, is_leaf=lambda x: isinstance(x, quant.QuantWeight))[0]}

  before, flat = flat(target.params), flat(int8.params)
  assert before.keys() == flat.keys()
  quantized = sorted(k for k, x in flat.items() if isinstance(x, quant.QuantWeight))
  names = ["['layers']['" + n + "']" for n in ("w_down", "w_gate", "w_up", "wk", "wo", "wq",
                                                 "wv")]
  assert quantized == sorted(["['embed']"] + ([] if target.config.tie_word_embeddings
                                              else ["['lm_head']"]) + names)
  for k, x in flat.items():
    if not isinstance(x, quant.QuantWeight):  # norms as they were, the same values
      np.testing.assert_array_equal(np.asarray(x), np.asarray(before[k]), k)
  L = target.config.num_hidden_layers
  assert int8.params["layers"]["wq"].scale.shape == (L, 1, 4, 8)  # the layer axis kept
  assert int8.params["layers"]["wo"].scale.shape == (L, 1, 1, 32)
  assert int8.params["embed"].scale.shape == (64, 1)
  assert int8.num_params() == target.num_params()
  assert int8.dtype == target.dtype
  assert not quant.is_quantized(target.params)  # the target itself is untouched


@TIES
def test_the_decoding_form_of_int8_params_is_the_int8_decoding_form(pair):
  """Cutting and fusing quantized layers equals quantizing the cut and fused ones: the
  scales are per output column, and fusing only puts columns side by side."""
  target, int8 = pair
  a = transformer.unstack(target.config, int8.params)
  b = jspec.models.quantize_params(transformer.unstack(target.config, target.params))
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert isinstance(a["layers"][0]["wqkv"], quant.QuantWeight)
  assert a["layers"][0]["wqkv"].scale.shape == (1, (4 + 2 * 2) * 8)


def _dequantized(model):
  """The float model whose weights are the int8 model's q * scale."""
  return dataclasses.replace(model, params=jax.tree_util.tree_map(
      quant.dequantize, model.params, is_leaf=lambda x: isinstance(x, quant.QuantWeight)))


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(4, 32)), jnp.int32)


def _relative_move(target, model) -> float:
  """RMS of what quantizing moved the weights, relative to the weights' RMS (over the
  quantized matrices only)."""
  moved = [(np.asarray(w, np.float32), np.asarray(quant.dequantize(q), np.float32))
           for w, q in zip(jax.tree_util.tree_leaves(target.params),
                           jax.tree_util.tree_leaves(model.params,
                                                     is_leaf=quant.is_quant_weight))
           if isinstance(q, quant.QuantWeight)]
  return float(np.sqrt(sum(np.sum((w - d) ** 2) for w, d in moved)
                       / sum(np.sum(w ** 2) for w, _ in moved)))


@TIES
def test_an_int8_model_computes_its_dequantized_weights(pair):
  """Scaling each product's output per channel is multiplying by q * scale: the int8 model's
  logits are those of the float model holding the dequantized weights (f32 rounding apart)."""
  _, int8 = pair
  got, want = np.asarray(int8.logits(TOKENS)), np.asarray(_dequantized(int8).logits(TOKENS))
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.max(np.abs(want)))


@pytest.mark.parametrize("dtype, tie", [
    (jnp.float32, False), (jnp.float32, True), (jnp.bfloat16, False),
    pytest.param(jnp.bfloat16, True, marks=pytest.mark.slow)],  # bf16 compiles take seconds
    ids=["f32-untied", "f32-tied", "bf16-untied", "bf16-tied"])
def test_int8_logits_are_close_to_the_float_models(tie, dtype):
  """How close is close: int8 rounding moves each weight by at most half a step, about 0.55%
  of the weights' RMS here (uniform error over a step of absmax / 127, absmax of 32 normal
  draws). Gaussian noise of that same relative size on every weight is the yardstick: the int8
  model's mean logit error must be within 1.5x of the noisy model's (measured: 0.95-1.05x).
  These tiny random models amplify weight noise (initializer_range 0.3, peaked attention): both
  move the logits by 3-5% on average, up to 12% of the largest logit, so the absolute bounds are
  15% of the largest logit at any position and 85% of the argmaxes equal (measured 91-97%; the
  others were near-ties, top-2 gaps of 0.001-0.2)."""
  target = jspec.models.init(tiny_config(tie=tie), seed=0, dtype=dtype)
  int8 = jspec.models.quantize_model(target)
  relative = _relative_move(target, int8)
  assert 0.002 < relative < 0.01, relative
  want, got = np.asarray(target.logits(TOKENS)), np.asarray(int8.logits(TOKENS))
  # The target's own Model with the noisy params: the same compiled forward pass.
  noisy = dataclasses.replace(target, params=perturbed(target, float(relative), seed=1).params)
  noisy = np.asarray(noisy.logits(TOKENS))
  assert got.dtype == np.float32
  err, noise = np.abs(got - want), np.abs(noisy - want)
  assert np.mean(err) <= 1.5 * np.mean(noise), (np.mean(err), np.mean(noise))
  assert np.max(err) <= 0.15 * np.max(np.abs(want)), (np.max(err), np.max(np.abs(want)))
  agree = np.mean(np.argmax(got, -1) == np.argmax(want, -1))
  assert agree >= 0.85, agree


@TIES
def test_cached_int8_calls_equal_the_cache_free_pass(pair):
  """The decoding form (per-layer cut, fused int8 q/k/v and gate/up) computes what the
  stacked scan computes."""
  _, int8 = pair
  tokens = jnp.asarray([[3, 1, 4, 1, 5, 9, 2]], jnp.int32)
  logits, _, _ = jit_apply(int8, tokens, int8.init_cache(1, 16), jnp.zeros((1,), jnp.int32))
  np.testing.assert_allclose(np.asarray(logits), np.asarray(int8.logits(tokens)),
                             rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- exactness


@ties(fast=False)
@pytest.mark.parametrize("k", [2, 4])
def test_speculative_decoding_of_an_int8_target_is_its_own_greedy_output(pair, k):
  """A float draft model proposing to the int8 target: the output is the int8 target's
  greedy output (the near-tie rule of docs/architecture.md judged on the int8 target)."""
  _, int8 = pair
  prompts = ragged_prompts(3, 64, seed=k)
  base = jspec.generate(int8, prompts, max_new_tokens=20)
  draft = perturbed(pair[0], 0.2, seed=7)
  spec = jspec.speculative_generate(int8, draft, prompts, num_draft_tokens=k,
                                    max_new_tokens=20)
  assert_greedy_match(int8, prompts, np.asarray(base.tokens), np.asarray(spec.tokens))
  assert 0 < int(np.sum(spec.stats.accepted)) < 3 * 20  # acceptance and rejection both ran


@ties(fast=False)
def test_ngram_drafting_for_an_int8_target_is_its_own_greedy_output(pair):
  _, int8 = pair
  prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 5, 6, 5]]
  base = jspec.generate(int8, prompts, max_new_tokens=16)
  spec = jspec.speculative_generate(int8, jspec.NGram(64), prompts, num_draft_tokens=3,
                                    max_new_tokens=16)
  assert_greedy_match(int8, prompts, np.asarray(base.tokens), np.asarray(spec.tokens))


@pytest.mark.slow  # 20,000 sampled rows and the enumeration (test_distribution's sizes)
def test_sampled_speculative_decoding_follows_the_int8_targets_distribution():
  """Whole-sequence counts against the int8 target's own probabilities, enumerated from its
  full forward passes (test_distribution's helpers), with a float draft that differs."""
  from reference import assert_counts_match
  from test_distribution import NEW, PROMPT, ROWS, V, exact_distribution, sequence_counts

  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  target = jspec.models.quantize_model(jspec.models.init(config, seed=21))
  draft = jspec.models.init(config, seed=22)
  exact = exact_distribution(target, 1.0, 0)
  spec = jspec.speculative_generate(target, draft, [PROMPT] * ROWS, num_draft_tokens=2,
                                    max_new_tokens=NEW, temperature=1.0, seed=2027)
  hist = np.asarray(spec.stats.accept_hist)
  assert np.all(hist[:3] > 0), f"acceptance not exercised: {hist}"
  assert_counts_match(sequence_counts(spec.tokens), exact, "int8 target, speculative")


@ties(fast=True)
def test_self_int8_drafter_keeps_the_float_targets_greedy_output(pair):
  """The "self-int8" method: the target's own int8 copy as a DraftModel, its output the
  float target's greedy output, and it drafts well (the copy agrees with the target)."""
  from jspec.bench import methods

  target, _ = pair
  built = methods.build("self-int8", target, k=3)
  assert isinstance(built.drafter, jspec.DraftModel) and built.k == 3
  assert quant.is_quantized(built.drafter.model.params)
  assert not quant.is_quantized(target.params)
  prompts = ragged_prompts(2, 64, seed=3)
  base = jspec.generate(target, prompts, max_new_tokens=20)
  spec = jspec.speculative_generate(target, built.drafter, prompts, num_draft_tokens=3,
                                    max_new_tokens=20)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(spec.tokens))
  proposed = 3 * int(np.sum(spec.stats.target_calls))
  assert int(np.sum(spec.stats.accepted)) >= 0.5 * proposed, (spec.stats.accepted, proposed)


def test_self_int8_is_a_registered_method_and_needs_a_zoo_model(target):
  from jspec.bench import methods

  assert methods.SELF_MODES == quant.MODES
  assert {f"self-{m}" for m in quant.MODES} <= set(methods.names())
  assert methods.parse_spec("self-int8@k=auto").k == "auto"
  built = methods.build("self-int4", target, k=2)
  assert built.drafter.model.params["layers"]["wq"].q.dtype == jnp.uint4
  foreign = dataclasses.replace(target, apply_fn=lambda *a, **kw: target.apply_fn(*a, **kw))
  with pytest.raises(methods.Unavailable, match="self-int8 quantizes the target"):
    methods.build("self-int8", foreign)


# ----------------------------------------------------------------------------- loading


@TIES
def test_load_int8_shrinks_the_bytes_and_keeps_the_count(tmp_path, pair):
  target, int8 = pair
  jspec.save(target, tmp_path / "m")
  loaded = jspec.load(tmp_path / "m", weights="int8")
  assert quant.is_quantized(loaded.params)
  assert loaded.num_params() == target.num_params()
  # Every matrix a byte per weight, plus f32 norms and per-channel scales.
  assert loaded.num_bytes() < 0.35 * target.num_bytes(), (loaded.num_bytes(),
                                                           target.num_bytes())
  for x, y in zip(jax.tree_util.tree_leaves(loaded.params), jax.tree_util.tree_leaves(int8.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  bf16 = jspec.load(tmp_path / "m", dtype="bfloat16", weights="int8")
  assert bf16.dtype == jnp.bfloat16 and bf16.params["embed"].scale.dtype == jnp.bfloat16
  with pytest.raises(ValueError, match="save the model before quantizing it"):
    jspec.save(loaded, tmp_path / "again")


@pytest.mark.parametrize("bad", ["int5", "INT8", 8, ""])
def test_a_bad_weights_value_fails_before_anything_is_read(bad, tmp_path):
  from jspec.bench import targets

  missing = str(tmp_path / "no-such-checkpoint")
  with pytest.raises(ValueError, match="weights must be None"):
    jspec.load(missing, weights=bad)  # ValueError, not FileNotFoundError: checked first
  with pytest.raises(ValueError, match="weights must be None"):
    targets.load(missing, weights=bad)
  with pytest.raises(ValueError, match="weights must be None"):
    jspec.models.quantize_model(jspec.models.init(tiny_config(), seed=0), bad)


def test_the_command_line_takes_the_weights_load_takes(capsys):
  from jspec.tools import cli

  assert cli.WEIGHTS == quant.WEIGHTS
  for command in (["generate", "--prompt", "x"], ["chat"], ["serve"]):
    with pytest.raises(SystemExit) as e:
      cli.main(command + ["--weights", "int5"])
    assert e.value.code == 2
    assert "invalid choice: 'int5'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_the_weights_flag_loads_the_target_as_int8(command, tmp_path, monkeypatch):
  """--weights int8 reaches the load: the model the command goes on with is int8 (the
  command's own work is stubbed out; test_cli runs the commands)."""
  from jspec.tools import cli, serve_main
  from test_tokenizer import word_level

  model = jspec.models.init(tiny_config(), seed=0)
  jspec.save(dataclasses.replace(model, tokenizer=jspec.Tokenizer(word_level(64)),
                                 eos_ids=(5,)), tmp_path / "m")
  seen = []
  monkeypatch.setattr(jspec, "generate_text", lambda target, *a, **kw: seen.append(target)
                      or [""])
  monkeypatch.setattr(serve_main, "run", lambda target, *a, **kw: seen.append(target) or 0)
  extra = ["--prompt", "w0"] if command == "generate" else ["--drafter", "none"]
  for weights in ([], ["--weights", "int8"]):
    assert cli.main([command, "--target", str(tmp_path / "m"), *extra, *weights]) == 0
  plain, int8 = seen
  assert not quant.is_quantized(plain.params) and quant.is_quantized(int8.params)
  assert int8.num_params() == plain.num_params() and int8.num_bytes() < plain.num_bytes()


# ----------------------------------------------------------------------------- int4, fp8


@pytest.fixture(scope="module")
def modes():
  """{mode: (f32 target, its copy in mode)} for "int4" and "fp8", untied."""
  made = {}

  def get(mode):
    if mode not in made:
      target = jspec.models.init(tiny_config(), seed=0)
      made[mode] = (target, jspec.models.quantize_model(target, mode))
    return made[mode]

  return get


@pytest.mark.parametrize("mode", ["int4", "fp8"])
def test_int4_and_fp8_models_compute_their_dequantized_weights(modes, mode):
  """Per channel (fp8) or in groups (int4: wo's inputs H x Dh in groups of Dh = 8 here):
  the model's logits are those of the float model holding the dequantized weights, through
  the cache-free pass and the decoding form's cached calls; and they stay near the float
  model's (argmaxes mostly equal)."""
  target, model = modes(mode)
  storage = {"int4": jnp.uint4, "fp8": jnp.float8_e4m3fn}[mode]
  assert model.params["layers"]["wq"].q.dtype == storage
  got = np.asarray(model.logits(TOKENS))
  np.testing.assert_allclose(got, np.asarray(_dequantized(model).logits(TOKENS)), rtol=0,
                             atol=1e-4 * np.max(np.abs(got)))
  tokens = jnp.asarray([[3, 1, 4, 1, 5, 9, 2]], jnp.int32)
  logits, _, _ = jit_apply(model, tokens, model.init_cache(1, 16), jnp.zeros((1,), jnp.int32))
  np.testing.assert_allclose(np.asarray(logits), np.asarray(model.logits(tokens)), rtol=1e-5,
                             atol=1e-5)
  # Near the float model as weight noise of the same relative size puts it (the yardstick
  # of test_int8_logits_are_close_to_the_float_models; these tiny random models amplify
  # weight noise, so argmaxes are compared against chance, 1/64, only).
  relative = _relative_move(target, model)
  assert {"int4": 0.03 < relative < 0.12, "fp8": 0.005 < relative < 0.04}[mode], relative
  want = np.asarray(target.logits(TOKENS))
  noisy = dataclasses.replace(target, params=perturbed(target, float(relative), seed=1).params)
  noise = np.mean(np.abs(np.asarray(noisy.logits(TOKENS)) - want))
  assert np.mean(np.abs(got - want)) <= 1.5 * noise, (np.mean(np.abs(got - want)), noise)
  assert np.mean(np.argmax(got, -1) == np.argmax(want, -1)) >= 0.25
  assert model.num_params() == target.num_params()
  assert model.num_bytes() < {"int4": 0.25, "fp8": 0.3}[mode] * target.num_bytes()


@pytest.mark.parametrize("mode", ["int4", pytest.param("fp8", marks=pytest.mark.slow)])
def test_speculative_decoding_of_an_int4_or_fp8_target_is_its_own_greedy_output(modes, mode):
  target, model = modes(mode)
  prompts = ragged_prompts(3, 64, seed=5)
  base = jspec.generate(model, prompts, max_new_tokens=20)
  draft = perturbed(target, 0.2, seed=7)
  spec = jspec.speculative_generate(model, draft, prompts, num_draft_tokens=3,
                                    max_new_tokens=20)
  assert_greedy_match(model, prompts, np.asarray(base.tokens), np.asarray(spec.tokens))
  assert 0 < int(np.sum(spec.stats.accepted)) < 3 * 20


@pytest.mark.parametrize("mode", ["int4", "fp8"])
def test_load_takes_int4_and_fp8(tmp_path, modes, mode):
  target, model = modes(mode)
  jspec.save(target, tmp_path / "m")
  loaded = jspec.load(tmp_path / "m", weights=mode)
  for x, y in zip(jax.tree_util.tree_leaves(loaded.params),
                  jax.tree_util.tree_leaves(model.params)):
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))


@TIES
def test_int8_params_place_on_a_mesh(pair):
  """A weight's logical axes fit its scales (size 1 where contracted): the layout places
  both."""
  from jspec.core import sharding

  _, int8 = pair
  layout = sharding.as_layout(sharding.make_mesh(1, 1, jax.devices()[:1]), None)
  placed = sharding.shard_model(int8, layout)
  assert jax.tree_util.tree_structure(placed.params) == jax.tree_util.tree_structure(
      int8.params)
  assert all(isinstance(x.sharding, jax.sharding.NamedSharding)
             for x in jax.tree_util.tree_leaves(placed.params))


@pytest.mark.parametrize("mode", ["int8", "int4", "fp8"])
def test_the_cost_model_reads_the_bytes_a_quantized_call_streams(modes, mode):
  """What the prior prices a call by: every weight as held (4-bit values at half a byte,
  scales and offsets counted), less the untied input embedding (a call reads a few of its
  rows); the weights counted as weights, not their scales."""
  from jspec.planner import cost_model

  target, model = modes(mode)
  nbytes, nparams = cost_model._streamed(model)
  embed = model.params["embed"]
  assert nbytes == quant.num_bytes(model.params) - quant.num_bytes(embed)
  assert nparams == model.num_params() - embed.q.size
  assert nbytes < {"int4": 0.25, "int8": 0.3, "fp8": 0.3}[mode] * cost_model._streamed(target)[0]


@pytest.mark.parametrize("mode", ["int8", "int4", "fp8"])
def test_a_loop_of_quantized_calls_casts_each_weight_in_the_call(mode, monkeypatch):
  """`quant.in_call` ties each cast of q to its product's input: a compiled loop of an
  int8 model's calls then holds far less than its weights dequantized (on the CPU, one
  weight's cast at a time), where with the casts free (`in_call` the identity) XLA CPU
  computed them all ahead and held every weight wide; no form holds more tied than free.
  Same values either way (the predicate is never true)."""
  from jspec.planner import call_times

  model = jspec.models.init(tiny_config(vocab_size=64, layers=4, hidden=64, heads=4,
                                        kv_heads=2), seed=0)
  q = transformer.quantize_model(model, mode)
  wide = call_times.loop_memory(model, 2, 64)["weights"]  # the f32 weights' bytes
  tied = call_times.loop_memory(q, 2, 64)
  tokens = jnp.asarray([[3, 1, 4, 1, 5, 9]], jnp.int32)
  want = np.asarray(q.logits(tokens))
  monkeypatch.setattr(quant, "in_call", lambda w, x: w)
  jax.clear_caches()
  free = call_times.loop_memory(q, 2, 64)
  np.testing.assert_array_equal(np.asarray(q.logits(tokens)), want)
  monkeypatch.undo()
  jax.clear_caches()
  assert tied["temp"] <= free["temp"], (tied, free)  # free: every weight wide, measured
  if mode == "int8":
    assert tied["temp"] < 0.25 * wide, (tied, wide)
