"""Slots and `generate_many`: N requests through B rows, refilled inside one loop.

Every request must come out as if decoded alone: greedy tokens equal `generate` /
`speculative_generate` on its prompt, and its counters (which depend on the drafter's
state and on what the target attended to) equal the lone run's, so a slot's previous
K/V or drafter state leaking into the next request fails these tests.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import decode, programs
from jspec.core import slots as slots_lib
from jspec.drafters import eagle as E
from conftest import assert_greedy_match, ragged_prompts, tiny_config

V = 64


def _requests(n, seed):
  """n prompts of 1-13 tokens and long-tailed answer lengths (1..40)."""
  prompts = ragged_prompts(n, V, seed=seed)
  rng = np.random.default_rng(seed)
  news = np.clip(rng.lognormal(2.3, 0.9, size=n), 1, 40).astype(int).tolist()
  return prompts, news


def _eagle(target, layers=()):
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3,
                                    feature_layers=layers)
  return E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config)


def _method(name, target, close_draft):
  """(drafter, keyword arguments) of a method by name."""
  chain = dict(num_draft_tokens=3)
  return {
      "plain": (None, {}),
      "ngram": (jspec.NGram(V, max_ngram=2), chain),
      "draft_model": (close_draft, dict(num_draft_tokens=2)),
      "draft_tree": (close_draft, dict(tree=jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0)]))),
      "eagle3": (_eagle(target, (0, 1, 1)), chain),
      "eagle3_dynamic": (_eagle(target, (0, 1, 1)),
                         dict(tree=jspec.DynamicTree(nodes=6, depth=3, top_k=2))),
      "recycling": (jspec.TokenRecycling(V, top_k=2), chain),
  }[name]


def _alone(target, drafter, prompt, new, **kw):
  if drafter is None:
    kw = {k: v for k, v in kw.items() if k not in ("num_draft_tokens", "tree")}
    return jspec.generate(target, [prompt], max_new_tokens=new, **kw)
  return jspec.speculative_generate(target, drafter, [prompt], max_new_tokens=new, **kw)


@pytest.mark.parametrize("method", ["plain", "ngram", "draft_model"] + [
    pytest.param(m, marks=pytest.mark.slow)
    for m in ("draft_tree", "eagle3", "eagle3_dynamic", "recycling")])
def test_each_request_equals_its_lone_run(target, close_draft, method):
  """9 requests of mixed lengths through 3 slots: requests join while others decode
  and reuse slots that held longer ones; tokens and counters equal the lone runs."""
  drafter, kw = _method(method, target, close_draft)
  prompts, news = _requests(9, seed=3)
  out = jspec.generate_many(target, drafter, prompts, slots=3, max_new_tokens=news, eos_id=(),
                            **kw)
  assert out.tokens.shape == (9, max(news))
  np.testing.assert_array_equal(out.lengths, news)
  for i, (prompt, new) in enumerate(zip(prompts, news)):
    alone = _alone(target, drafter, prompt, new, eos_id=(), **kw)
    assert_greedy_match(target, [prompt], np.asarray(alone.tokens),
                        np.asarray(out.tokens[i:i + 1, :new]))
    assert np.all(np.asarray(out.tokens[i, new:]) == -1)
    if method != "recycling":  # its matrix is shared by the rows (its memory), by design
      for field in ("target_calls", "accepted", "row_hist", "position_judged"):
        np.testing.assert_array_equal(np.asarray(getattr(out.stats, field)[i]),
                                      np.asarray(getattr(alone.stats, field)[0]),
                                      err_msg=f"request {i}: {field}")


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_one_slot_serves_requests_in_turn_with_nothing_left_over(target, close_draft):
  """One slot: a long request, then short ones into the same row. A slot whose old K/V,
  lengths or draft-model cache survived the insert would change the next request's
  tokens or acceptance."""
  prompts = [list(range(1, 13)), [5], [7, 3, 9]]
  news = [30, 6, 11]
  out = jspec.generate_many(target, close_draft, prompts, slots=1, max_new_tokens=news,
                            num_draft_tokens=3, eos_id=())
  for i in range(3):
    alone = _alone(target, close_draft, prompts[i], news[i], num_draft_tokens=3, eos_id=())
    np.testing.assert_array_equal(np.asarray(out.tokens[i, :news[i]]),
                                  np.asarray(alone.tokens[0]))
    np.testing.assert_array_equal(np.asarray(out.stats.row_hist[i]),
                                  np.asarray(alone.stats.row_hist[0]))


def test_insert_replaces_every_row_leaf_and_keeps_the_others(target, close_draft):
  """`slots.insert` writes the new request over its slot in every per-row leaf (the
  target cache in its layout, the draft model's cache, tokens, counters, keys) and
  leaves the other slots untouched."""
  drafter = jspec.DraftModel(close_draft)
  config = decode.DecodeConfig(num_draft_tokens=2, cache_length=32)
  queue = slots_lib.Queue(tokens=jnp.asarray([[3, 4, 5, 0], [6, 7, 0, 0]], jnp.int32),
                          prompt_lengths=jnp.asarray([3, 2], jnp.int32),
                          max_new=jnp.asarray([5, 5], jnp.int32),
                          seeds=jnp.asarray([1, 2], jnp.int32), params=None)
  eos = jnp.asarray([-1], jnp.int32)

  @jax.jit
  def run(target, drafter, queue):
    target, drafter = decode.prepared(target, drafter)
    axes = slots_lib.row_axes(target, drafter, queue, eos, config)
    state = slots_lib.empty_state(target, drafter, slots_lib.request(queue, jnp.int32(0)), 3,
                                  eos, config)
    state = jax.tree_util.tree_map(lambda x: x + 1 if x.dtype == jnp.float32 else x, state)
    row = slots_lib.row_state(target, drafter, slots_lib.request(queue, jnp.int32(1)), eos,
                              config)
    return state, row, slots_lib.insert(state, row, jnp.int32(2), axes), axes

  before, row, after, axes = run(target, drafter, queue)
  checked = []

  def check(old, new, one, axis):
    old, new, one = np.asarray(old), np.asarray(new), np.asarray(one)
    if axis == slots_lib.SHARED:
      np.testing.assert_array_equal(new, old)
      return
    moved = lambda x: np.moveaxis(x, axis, 0)
    old, new, one = moved(old), moved(new), moved(one)
    np.testing.assert_array_equal(new[:2], old[:2])  # other slots untouched
    region = tuple(slice(0, n) for n in one.shape[1:])
    np.testing.assert_array_equal(new[2][region], one[0])  # the request's own part
    checked.append(axis)

  leaves = [jax.tree_util.tree_leaves(t) for t in (before, after, row)]
  key_leaves = [jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
                else x for x in leaves[0]]
  assert len(key_leaves) == len(jax.tree_util.tree_leaves(axes))
  for old, new, one, axis in zip(*leaves, jax.tree_util.tree_leaves(axes)):
    if jax.dtypes.issubdtype(old.dtype, jax.dtypes.prng_key):
      old, new, one = (jax.random.key_data(x) for x in (old, new, one))
    check(old, new, one, axis)
  # Both caches (target and draft, each K and V per layer) and the row arrays were checked,
  # and the target cache's batch axis was found in its layout.
  assert len(checked) >= 4 * target.config.num_hidden_layers + 5


@pytest.mark.parametrize("k", [2])
@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_sampled_requests_draw_from_their_own_seed(target, close_draft, k):
  """Sampled requests with per-request seeds and settings equal the lone runs with the
  same seed, whichever slot and neighbours they had."""
  prompts, news = _requests(7, seed=5)
  seeds = [11, 12, 13, 14, 15, 16, 17]
  temps = [0.8, 1.0, 0.0, 0.6, 1.2, 0.9, 0.7]
  out = jspec.generate_many(target, close_draft, prompts, slots=3, max_new_tokens=news,
                            num_draft_tokens=k, temperature=temps, top_k=[0, 5, 0, 0, 8, 0, 3],
                            seed=seeds, eos_id=())
  for i in range(7):
    alone = _alone(target, close_draft, prompts[i], news[i], num_draft_tokens=k,
                   temperature=temps[i], top_k=[0, 5, 0, 0, 8, 0, 3][i], seed=[seeds[i]],
                   eos_id=())
    np.testing.assert_array_equal(np.asarray(out.tokens[i, :news[i]]),
                                  np.asarray(alone.tokens[0]), err_msg=f"request {i}")


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_eos_penalties_and_logprobs_per_request(target):
  """EOS ends a request early and frees its slot; per-request penalties and logit bias;
  log-probabilities per request equal the lone runs'."""
  prompts, news = _requests(6, seed=8)
  kw = dict(repetition_penalty=[1.0, 1.3, 1.0, 2.0, 1.0, 1.1],
            frequency_penalty=[0.0, 0.0, 0.5, 0.0, 0.0, 0.2],
            logit_bias=[None, {3: 2.0}, None, None, {5: -1.0}, None], eos_id=[9, 17])
  out = jspec.generate_many(target, jspec.NGram(V), prompts, slots=2, max_new_tokens=news,
                            num_draft_tokens=2, return_logprobs=True, **kw)
  for i in range(6):
    one = {k: (v[i] if isinstance(v, list) and k != "eos_id" else v) for k, v in kw.items()}
    alone = _alone(target, jspec.NGram(V), prompts[i], news[i], num_draft_tokens=2,
                   return_logprobs=True, **one)
    n = int(alone.lengths[0])
    assert int(out.lengths[i]) == n
    np.testing.assert_array_equal(np.asarray(out.tokens[i, :n]), np.asarray(alone.tokens[0, :n]))
    np.testing.assert_allclose(np.asarray(out.logprobs[i, :n]),
                               np.asarray(alone.logprobs[0, :n]), atol=1e-5)
  assert np.any(np.asarray(out.lengths) < np.asarray(news))  # some request hit EOS


def test_queue_bucket_reuses_the_program(target):
  """A new N, new prompts and new lengths within the same buckets reuse the program."""
  prompts, news = _requests(9, seed=1)
  jspec.generate_many(target, None, prompts[:5], slots=2, max_new_tokens=news[:5])
  size = programs.many._cache_size()
  jspec.generate_many(target, None, prompts[2:9], slots=2, max_new_tokens=news[2:9], seed=4)
  assert programs.many._cache_size() == size


def test_bad_input_is_refused_before_tracing(target, close_draft):
  with pytest.raises(ValueError, match="slots"):
    jspec.generate_many(target, None, [[1, 2]], slots=0, max_new_tokens=4)
  with pytest.raises(ValueError, match="non-empty"):
    jspec.generate_many(target, None, [], max_new_tokens=4)
  with pytest.raises(ValueError, match="auto"):
    jspec.generate_many(target, close_draft, [[1]], max_new_tokens=4, num_draft_tokens="auto")
  with pytest.raises(ValueError, match="cache_length"):
    jspec.generate_many(target, None, [[1] * 40], max_new_tokens=30, cache_length=64)
  with pytest.raises(ValueError, match="temperature"):
    jspec.generate_many(target, None, [[1], [2]], max_new_tokens=4, temperature=[0.5, -1.0])
  with pytest.raises(ValueError, match="need a drafter"):
    jspec.generate_many(target, None, [[1]], max_new_tokens=4, num_draft_tokens=3)


def test_the_pure_layer_runs_inside_a_users_jit(target):
  """`slots.decode_queue` is a pure function: inside a user's own jitted step (params as
  arguments) it serves the queue as `generate_many` does."""
  prompts, news = _requests(5, seed=6)
  out = jspec.generate_many(target, None, prompts, slots=2, max_new_tokens=news,
                            order="in_order")
  P = 16
  tokens = jnp.asarray([p + [0] * (P - len(p)) for p in prompts], jnp.int32)
  queue = slots_lib.Queue(tokens=tokens, prompt_lengths=jnp.asarray([len(p) for p in prompts]),
                          max_new=jnp.asarray(news), seeds=jnp.arange(5), params=None)
  config = decode.DecodeConfig(num_draft_tokens=0, cache_length=64)

  @jax.jit
  def step(model, queue):
    results, _ = slots_lib.decode_queue(model, None, queue, jnp.int32(5),
                                        jnp.asarray([-1], jnp.int32), config, 2, 48)
    return results.tokens, results.lengths

  tokens, lengths = step(target, queue)
  np.testing.assert_array_equal(np.asarray(lengths), news)
  np.testing.assert_array_equal(np.asarray(tokens)[:, :max(news)], np.asarray(out.tokens))


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_capped_rows_keep_the_distribution(temperature, top_k):
  """Rows whose rounds judge only their first caps[b] of K = 2 drafts (0: opted out of
  speculation) still sample the target's exact whole-sequence distribution."""
  from test_distribution import NEW, PROMPT, ROWS, V as SMALL, exact_distribution, \
      sequence_counts
  from reference import assert_counts_match
  config = tiny_config(vocab_size=SMALL, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  target, draft = jspec.models.init(config, seed=21), jspec.models.init(config, seed=22)
  exact = exact_distribution(target, temperature, top_k)
  B = ROWS
  tokens = jnp.asarray([PROMPT] * B, jnp.int32)
  params = jspec.SamplingParams(temperature=jnp.full((B,), temperature, jnp.float32),
                                top_k=jnp.full((B,), top_k, jnp.int32),
                                top_p=jnp.ones((B,), jnp.float32))
  caps = jnp.arange(B, dtype=jnp.int32) % 3
  config = decode.DecodeConfig(num_draft_tokens=2, cache_length=16)

  @jax.jit
  def run(target, draft):
    drafter = jspec.DraftModel(draft)
    state = decode.init_state(target, drafter, tokens, jnp.full((B,), len(PROMPT)),
                              jnp.full((B,), NEW), params, jnp.asarray([-1], jnp.int32),
                              jnp.arange(B) + 99, config, caps=caps)
    state = decode.decode_loop(target, drafter, state, config)
    return decode.output_tokens(state)[0][:, :NEW], state.stats

  out, stats = run(target, draft)
  judged = np.asarray(stats.position_judged)
  assert np.all(judged[::3] == 0) and np.all(judged[1::3, 1] == 0)  # caps 0 and 1 held
  assert np.asarray(stats.accepted)[2::3].sum() > 0
  for cap in range(3):  # each group of rows on its own
    rows = np.asarray(out)[cap::3]
    codes = (rows[:, 0] * SMALL + rows[:, 1]) * SMALL + rows[:, 2]
    assert_counts_match(np.bincount(codes, minlength=SMALL ** NEW), exact, f"cap {cap}")
  assert_counts_match(sequence_counts(out), exact, "all rows")
