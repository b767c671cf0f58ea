"""`jspec.Lookahead`: Jacobi lookahead decoding (the n-gram pool, the window, the engine's
side branch), greedy equality and what the lookahead branch finds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import tree as tree_lib
from jspec.core.drafter import BranchDrafter, DraftContext
from jspec.drafters import ngram_pool
from jspec.drafters.lookahead import Lookahead, _side
from conftest import ragged_prompts


# ----------------------------------------------------------------------------- the pool

# Jitted once per shape: eagerly, each of these runs dozens of small programs.
_insert = jax.jit(ngram_pool.insert)
_newest = jax.jit(ngram_pool.newest, static_argnums=2)


def test_pool_keeps_unique_ngrams_newest_first():
  pool = ngram_pool.NGramPool.empty(1, 4, 2)
  keys = jnp.asarray([[5, 5, 6, 5]])
  grams = jnp.asarray([[[1, 2], [3, 4], [1, 2], [1, 2]]])
  valid = jnp.asarray([[True, True, True, False]])
  pool = _insert(pool, keys, grams, valid)
  assert int(pool.write[0]) == 3
  got, found = _newest(pool, jnp.asarray([5]), 3)
  assert found.tolist() == [[True, True, False]]
  assert got.tolist()[0][:2] == [[3, 4], [1, 2]]  # newest first
  # (5: 1 2) again, twice in one batch: written once, now the newest.
  pool = _insert(pool, jnp.asarray([[5, 5]]), jnp.asarray([[[1, 2], [1, 2]]]),
                           jnp.asarray([[True, True]]))
  got, found = _newest(pool, jnp.asarray([5]), 3)
  assert found.tolist() == [[True, True, False]] and got.tolist()[0][:2] == [[1, 2], [3, 4]]
  # The ring: more than P entries keep the newest P.
  many = _insert(pool, jnp.arange(6)[None, :] + 10, jnp.zeros((1, 6, 2), jnp.int32),
                           jnp.ones((1, 6), bool))
  assert sorted(np.asarray(many.keys)[0].tolist()) == [12, 13, 14, 15]


def test_side_branch_shape_and_mask():
  """W = 3, n = 4: a0 a1 under the root; columns b_i, c_i hang under a(i-1)."""
  side, cells = _side(3, 4)
  assert side.num_nodes == 1 + 2 + 3 * 2
  where = {cell: j for j, cell in enumerate(cells, start=1)}
  assert side.parents[where[(0, 0)]] == 0 and side.parents[where[(0, 1)]] == where[(0, 0)]
  assert side.parents[where[(1, 0)]] == 0 and side.parents[where[(1, 2)]] == where[(0, 1)]
  assert side.parents[where[(2, 1)]] == where[(1, 1)]
  assert side.depths[where[(2, 2)]] == 4  # a0 a1 b2 c2
  tree = Lookahead(64, window=3, ngram=4, guesses=2).verify_tree(2)
  mask, depths = tree_lib.with_side(tree, side)
  N = tree.num_nodes
  assert mask.shape == (N + 8, N + 8) and depths.tolist()[:N] == tree.depths.tolist()
  assert not mask[:N, N:].any() and not mask[N:, 1:N].any()  # branches never see each other
  assert mask[N:, 0].all()  # every side node sees the root


def test_settings_are_checked(target):
  with pytest.raises(ValueError, match="ngram"):
    Lookahead(16, ngram=2)
  with pytest.raises(ValueError, match="window"):
    Lookahead(16, window=0)
  assert isinstance(Lookahead(16), BranchDrafter)
  prompts = [[1, 2, 3]]
  la = Lookahead(target.vocab_size)
  with pytest.raises(ValueError, match="auto"):
    jspec.speculative_generate(target, la, prompts, num_draft_tokens="auto", max_new_tokens=4)
  with pytest.raises(ValueError, match="own tree"):
    jspec.speculative_generate(target, la, prompts, tree=jspec.Tree.chain(2), max_new_tokens=4)


# ----------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("batch", [1] + [pytest.param(b, marks=pytest.mark.slow) for b in (3, 8)])
@pytest.mark.parametrize("K,window,ngram,guesses", [(1, 4, 3, 3)] + [
    pytest.param(*c, marks=pytest.mark.slow) for c in ((3, 3, 4, 2), (5, 2, 5, 1))])
def test_greedy_equals_baseline(target, batch, K, window, ngram, guesses):
  prompts = ragged_prompts(batch, target.vocab_size, seed=batch, min_len=2, max_len=10)
  prompts = [p + p[: len(p) // 2] for p in prompts]
  base = jspec.generate(target, prompts, max_new_tokens=14)
  la = Lookahead(target.vocab_size, window=window, ngram=ngram, guesses=guesses)
  spec = jspec.speculative_generate(target, la, prompts, num_draft_tokens=K, max_new_tokens=14)
  np.testing.assert_array_equal(base.tokens, spec.tokens)
  assert np.all(np.asarray(spec.stats.accepted) <= np.asarray(spec.stats.target_calls) * K)


def _scripted_target(script, V):
  """A target whose argmax at position q is script[q + 1], whatever the tokens: the
  text it writes is fixed by position, so Jacobi guesses settle one position per
  round while the tokens themselves recur at random (V = 64), which is what
  n-gram lookup needs and does not get here."""
  table = jax.nn.one_hot(jnp.asarray(script), V) * 20.0  # [S, V]

  def apply(config, params, tokens, cache, start, block_mask=None, depth=None):
    T = tokens.shape[1]
    depth = jnp.arange(T, dtype=jnp.int32) if depth is None else depth
    pos = start[:, None] + depth[None, :]  # [B, T]
    logits = params["table"][jnp.minimum(pos + 1, params["table"].shape[0] - 1)]
    return logits, logits, cache

  def init_cache(config, batch, length, dtype=jnp.float32):
    return {"k": jnp.zeros((batch, length, 1), dtype)}

  config = type("Config", (), {"vocab_size": V})()
  axes = lambda config: ({"table": (None, None)}, {"k": ("batch", "sequence", None)})
  return jspec.Model(params={"table": table}, config=config, apply_fn=apply,
                     init_cache_fn=init_cache, axes_fn=axes)


def test_lookahead_finds_what_lookup_cannot():
  """On a target whose text is fixed by position, the Jacobi window computes the text
  ahead and its n-grams are accepted when the text gets there (tau near 2),
  while n-gram lookup over the row finds only chance repeats: the lookahead
  mechanism, isolated from model quality."""
  V = 64
  script = np.random.default_rng(0).integers(0, V, size=256)
  target = _scripted_target(script, V)
  prompts = [[5, 9], [7, 3, 1]]
  base = jspec.generate(target, prompts, max_new_tokens=60, eos_id=())
  np.testing.assert_array_equal(np.asarray(base.tokens)[0], script[2:62])
  kw = dict(num_draft_tokens=3, max_new_tokens=60, eos_id=())
  look = jspec.speculative_generate(target, Lookahead(V, window=5, ngram=4, guesses=3), prompts,
                                    **kw)
  lookup = jspec.speculative_generate(target, jspec.NGram(V), prompts, **kw)
  np.testing.assert_array_equal(base.tokens, look.tokens)
  np.testing.assert_array_equal(base.tokens, lookup.tokens)
  tau = lambda out: float(np.sum(out.lengths)) / float(np.sum(out.stats.target_calls))
  assert tau(look) > 1.7 and tau(lookup) < 1.2, (tau(look), tau(lookup))  # 1.97 and 1.0


def test_window_moves_with_accepted_drafts():
  """after_verify: level 0 takes level 1 shifted by 1 + accepted, the top takes the
  target's argmax shifted by accepted, and the columns' n-grams are pooled."""
  la = Lookahead(16, window=3, ngram=3, guesses=1)
  tokens = jnp.asarray([[1, 2, 3, 0, 0, 0, 0, 0]], jnp.int32)
  state = jax.jit(la.init, static_argnums=2)(tokens, jnp.asarray([3]), 8)
  state = dataclasses.replace(state, window=jnp.asarray([[[4, 5, 0], [6, 7, 8]]], jnp.int32))
  side, cells = _side(3, 3)
  predictions = jnp.zeros((1, side.num_nodes - 1), jnp.int32)
  top = [cells.index((1, i)) for i in range(3)]
  predictions = predictions.at[0, jnp.asarray(top)].set(jnp.asarray([9, 10, 11]))
  context = DraftContext(tokens=tokens, lengths=jnp.asarray([3]))
  moved = jax.jit(la.after_verify)(state, context, predictions, jnp.asarray([1]))
  assert moved.window.tolist() == [[[8, 6, 7], [10, 11, 9]]]
  # Columns' n-grams: (root 3: 6 9), (a0 4: 7 10), (a1 5: 8 11).
  for key, gram in ((3, [6, 9]), (4, [7, 10]), (5, [8, 11])):
    got, found = _newest(moved.pool, jnp.asarray([key]), 1)
    assert bool(found[0, 0]) and got.tolist()[0][0] == gram
