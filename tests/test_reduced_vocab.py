"""Reduced-vocabulary drafting (FR-Spec): the draft scores a subset of ids, exactly.

The distribution test is in test_distribution.py (whole-sequence enumeration at
T = 1 and at T = 0.7 with top-k)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import assert_greedy_match, ragged_prompts, tiny_config
from jspec.core.drafter import DraftContext
from jspec.drafters.vocab_subset import frequent_tokens

IDS = np.arange(0, 64, 2, dtype=np.int32)  # the even ids: half the vocabulary


@pytest.mark.parametrize("tie", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["untied", "tied"])
def test_drafts_stay_in_the_set_and_q_is_zero_outside(target, far_draft, tie):
  draft = far_draft if not tie else jspec.models.init(
      tiny_config(layers=1, hidden=16, heads=2, kv_heads=1, tie=True), seed=3)
  reduced = jspec.DraftModel.reduced(draft, IDS)
  B, S, K = 3, 32, 4
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, 64, size=(B, S)), jnp.int32)
  lengths = jnp.asarray([5, 9, 2], jnp.int32)
  params = jspec.SamplingParams(temperature=jnp.full((B,), 0.8, jnp.float32),
                                top_k=jnp.zeros((B,), jnp.int32),
                                top_p=jnp.full((B,), 0.9, jnp.float32))
  keys = jax.random.split(jax.random.key(1), B)

  @jax.jit
  def run(d, params):
    d = d.prepared()
    cache = d.init(tokens[:, :10], lengths, S)
    return d.propose(cache, DraftContext(tokens, lengths), K, params, keys)[:2]

  drafts, q = run(reduced, params)
  assert np.isin(np.asarray(drafts), IDS).all()
  q = np.asarray(q)
  odd = np.setdiff1d(np.arange(64), IDS)
  assert q.shape == (B, K, 64) and np.all(q[..., odd] == 0)
  np.testing.assert_allclose(q.sum(-1), 1.0, atol=1e-5)
  # Each draft has positive probability under the q it came from.
  assert np.all(np.take_along_axis(q, np.asarray(drafts)[..., None], -1) > 0)
  # Greedy: the argmax over the set, i.e. the full model's best even id.
  greedy, none = run(reduced, None)
  assert none is None and np.isin(np.asarray(greedy), IDS).all()
  full = jax.jit(lambda d: d.prepared().propose(d.prepared().init(tokens[:, :10], lengths, S),
                                               DraftContext(tokens, lengths), 1, None, keys)[0])
  first_full = np.asarray(full(jspec.DraftModel(draft)))[:, 0]
  even = np.isin(first_full, IDS)
  np.testing.assert_array_equal(np.asarray(greedy)[even, 0], first_full[even])


@pytest.mark.slow
def test_greedy_equals_baseline_with_a_reduced_vocabulary(target, close_draft):
  prompts = ragged_prompts(3, target.vocab_size, seed=9)
  kw = dict(max_new_tokens=24, eos_id=())
  close_draft = jspec.models.make_model(close_draft.config, close_draft.params)  # with its head
  base = jspec.generate(target, prompts, **kw)
  out = jspec.speculative_generate(target, jspec.DraftModel.reduced(close_draft, IDS), prompts,
                                   num_draft_tokens=3, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))
  tree = jspec.speculative_generate(target, jspec.DraftModel.reduced(close_draft, IDS), prompts,
                                    tree=jspec.Tree.from_paths([(0, 0), (1,)]), **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(tree.tokens))


@pytest.mark.slow
def test_the_set_reaches_the_decoding_program(target, close_draft):
  """Drafting only an id the target never emits here, no draft is accepted, where the
  full draft has many accepted (a decoding call that dropped the set would not see it)."""
  prompts = ragged_prompts(2, target.vocab_size, seed=9)
  kw = dict(max_new_tokens=12, eos_id=(), num_draft_tokens=3)
  close_draft = jspec.models.make_model(close_draft.config, close_draft.params)  # with its head
  full = jspec.speculative_generate(target, close_draft, prompts, **kw)
  emitted = np.asarray(full.tokens)
  unused = int(np.setdiff1d(np.arange(64), emitted[emitted >= 0])[0])
  only = jspec.speculative_generate(target, jspec.DraftModel.reduced(close_draft, [unused]),
                                    prompts, **kw)
  np.testing.assert_array_equal(np.asarray(only.tokens), emitted)
  assert int(np.sum(only.stats.accepted)) == 0 < int(np.sum(full.stats.accepted))


def test_frequent_tokens():
  stream = np.array([5, 5, 5, 2, 2, 9, 9, 1, 7])
  np.testing.assert_array_equal(frequent_tokens(stream, 3, 10), [2, 5, 9])
  np.testing.assert_array_equal(frequent_tokens(stream, 4, 10), [1, 2, 5, 9])  # ties: lower id
  with pytest.raises(ValueError, match="count"):
    frequent_tokens(stream, 0, 10)
  with pytest.raises(ValueError, match=r"\[0, 8\)"):
    frequent_tokens(stream, 2, 8)


@pytest.mark.parametrize("ids,match", [
    ([], "non-empty"), ([[1, 2]], "1-D"), ([0, 64], r"\[0, 64\)"), ([-1, 3], r"\[0, 64\)"),
    ([3, 3], "distinct"), ([0.5, 1.0], "token ids"),
])
def test_bad_ids(far_draft, ids, match):
  with pytest.raises(ValueError, match=match):
    jspec.DraftModel.reduced(far_draft, np.asarray(ids))


@pytest.mark.slow
def test_eagle_with_a_reduced_vocabulary(target):
  """EAGLE drafting over half the ids: drafts and tree candidates in the set, q zero
  outside it, greedy chain and tree output equal to the baseline."""
  from jspec.drafters import eagle as E
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3)
  eagle = E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config)
  reduced = eagle.reduced(IDS)
  prompts = ragged_prompts(3, target.vocab_size, seed=12)
  kw = dict(max_new_tokens=16, eos_id=())
  base = jspec.generate(target, prompts, **kw)
  for extra in (dict(num_draft_tokens=3), dict(tree=jspec.Tree.from_paths([(0, 0), (1,)]))):
    out = jspec.speculative_generate(target, reduced, prompts, **extra, **kw)
    assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))
  B, F, D = 2, 3, target.config.hidden_size
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, size=(B, 16)), jnp.int32)
  lengths = jnp.asarray([6, 9], jnp.int32)
  context = DraftContext(tokens, lengths,
                         features=jax.random.normal(jax.random.key(2), (B, F, D), jnp.float32),
                         feature_start=lengths - 1 - F)
  params = jspec.SamplingParams(temperature=jnp.ones((B,), jnp.float32),
                                top_k=jnp.zeros((B,), jnp.int32), top_p=jnp.ones((B,), jnp.float32))
  cache = reduced.init_cache(B, 16)
  drafts, q, _ = jax.jit(lambda e, c: e.propose(c, context, 3, params,
                                                jax.random.split(jax.random.key(0), B)))(reduced,
                                                                                          cache)
  assert np.isin(np.asarray(drafts), IDS).all()
  odd = np.setdiff1d(np.arange(64), IDS)
  assert np.all(np.asarray(q)[..., odd] == 0)
  np.testing.assert_allclose(np.asarray(q).sum(-1), 1.0, atol=1e-5)
  candidates, _ = jax.jit(lambda e, c: e.propose_tree(c, context, jspec.Tree.from_paths(
      [(0, 0), (1,), (2,)])))(reduced, cache)
  assert np.isin(np.asarray(candidates), IDS).all()
