"""Dynamic trees (EAGLE-2): growing and reranking on hand-made scores, the per-row
arrays, per-row masks in the model contract, greedy equality and compaction through the
decode loop with EAGLE heads, errors, and (slow lane) whole-sequence enumeration."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import decode
from jspec.core.dynamic_tree import DynamicTree, RowTree, grow
from jspec.drafters import eagle as E
from conftest import (assert_cache_equals_chain_prefill, rounds_from_prompts, numpy_drawn_target, ragged_prompts,
                      tiny_config)
from reference import assert_counts_match


def reference_arrays(parents):
  """depths, ancestors and children (node order) of one tree, by hand."""
  N = len(parents)
  depths, anc = np.zeros(N, np.int32), np.eye(N, dtype=bool)
  for i in range(1, N):
    j = i
    while parents[j] >= 0:
      j = parents[j]
      anc[i, j] = True
      depths[i] += 1
  kids = [[i for i in range(N) if parents[i] == n] for n in range(N)]
  return depths, anc, kids


def test_budget_checks():
  assert DynamicTree(nodes=8, depth=3, top_k=2).num_candidates == 2 + 2 * 4
  with pytest.raises(ValueError, match="more nodes than"):
    DynamicTree(nodes=12, depth=3, top_k=2)
  with pytest.raises(ValueError, match="nodes >= 2"):
    DynamicTree(nodes=1, depth=1)
  with pytest.raises(TypeError, match="int"):
    DynamicTree(nodes=4.0, depth=2)


def test_grow_keeps_the_most_likely_paths():
  """Root scores and per-level scores chosen by hand (V = 5, k = 2, depth 3, 6 nodes):
  the kept nodes are the 5 candidates of highest path log-probability, each with its
  parent, ordered by depth; the expand calls see the right parents."""
  logp = np.log(np.asarray([0.6, 0.3, 0.05, 0.03, 0.02]))
  root = jnp.asarray(np.stack([logp, logp[[4, 3, 2, 1, 0]]]), jnp.float32)  # two rows
  calls = []

  def expand(level, index, up, state):
    calls.append((level, np.asarray(index), np.asarray(up)))
    B, k = index.shape
    # Child distribution: the parent's token + 1 (mod 5) with prob 0.9 at level 1,
    # 0.5 at level 2; the rest spread.
    sure = 0.9 if level == 1 else 0.5
    p = np.full((B, k, 5), (1 - sure) / 4)
    idx = np.asarray(index)
    for b in range(B):
      for j in range(k):
        p[b, j, (idx[b, j] + 1) % 5] = sure
    return jnp.asarray(np.log(p), jnp.float32), (state or 0) + 1

  budget = DynamicTree(nodes=6, depth=3, top_k=2)
  cand, tree, state = grow(budget, root, expand)
  assert state == 2 and [c[0] for c in calls] == [1, 2]
  assert calls[0][2].tolist() == [[-1, -1], [-1, -1]]
  cand, parents = np.asarray(cand), np.asarray(tree.parents)
  # Row 0 by hand: level 1: 0 (.6), 1 (.3); level 2 under 0: 1 (.54), under 1: 2 (.27);
  # level 3 expands the two best of level 2: 0-1 -> 2 (.27), 1-2 -> 3 (.135).
  # Top 5 of all: 0 .6, 0-1 .54, 1 .3, 0-1-2 .27, 1-2 .27 (1-2 before 0-1-2: tie -> depth).
  tokens_by_path = {}
  for b in range(2):
    for i in range(1, 6):
      path, j = [], i
      while j > 0:
        path.append(int(cand[b, j - 1]))
        j = parents[b, j]
      tokens_by_path.setdefault(b, set()).add(tuple(reversed(path)))
  assert tokens_by_path[0] == {(0,), (1,), (0, 1), (1, 2), (0, 1, 2)}
  assert tokens_by_path[1] == {(4,), (3,), (4, 0), (3, 4), (4, 0, 1)}
  for b in range(2):
    depths, anc, kids = reference_arrays(parents[b].tolist())
    np.testing.assert_array_equal(np.asarray(tree.depths)[b], depths)
    assert np.all(np.diff(depths) >= 0)  # ordered by depth
    np.testing.assert_array_equal(np.asarray(tree.ancestors)[b], anc)
    for n in range(6):
      got = [c for c in np.asarray(tree.children)[b, n].tolist() if c >= 0]
      assert got == kids[n]


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_per_row_masks_equal_one_row_at_a_time():
  """The model contract with block_mask [B, T, T] and depth [B, T]: each row as if run
  alone with its own [T, T] mask and [T] depths."""
  target = jspec.models.init(tiny_config(vocab_size=32), seed=3)
  trees = [jspec.Tree(parents=(-1, 0, 0, 1), ranks=(0, 0, 1, 0)),
           jspec.Tree(parents=(-1, 0, 1, 2), ranks=(0, 0, 0, 0))]
  mask = jnp.asarray(np.stack([t.ancestors for t in trees]))
  depth = jnp.asarray(np.stack([t.depths for t in trees]))
  prompt = jnp.asarray([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]], jnp.int32)
  block = jnp.asarray([[3, 4, 5, 6], [7, 8, 9, 10]], jnp.int32)
  model = target.prepared()
  cache = model.init_cache(2, 16)
  _, _, cache = model.apply(prompt, cache, jnp.zeros((2,), jnp.int32))
  both, _, _ = model.apply(block, cache, jnp.full((2,), 5, jnp.int32), block_mask=mask,
                           depth=depth)
  for b in range(2):
    one, _, _ = model.apply(block, cache, jnp.full((2,), 5, jnp.int32),
                            block_mask=jnp.asarray(trees[b].ancestors),
                            depth=jnp.asarray(trees[b].depths))
    np.testing.assert_allclose(np.asarray(both[b]), np.asarray(one[b]), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def target():
  """A random tiny decoder with peaked logits (random heads' drafts are sometimes right)."""
  return numpy_drawn_target(48)


@pytest.mark.parametrize("layers", [(), pytest.param((0, 1), marks=pytest.mark.slow)],
                         ids=["eagle1", "eagle3"])
@pytest.mark.parametrize("batch", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_greedy_equals_baseline(target, layers, batch):
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3, feature_layers=layers)
  eagle = E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config)
  prompts = ragged_prompts(batch, 48, seed=5, min_len=1)
  ref = np.asarray(jspec.generate(target, prompts, max_new_tokens=24, eos_id=()).tokens)
  accepted = 0
  for budget in (DynamicTree(nodes=8, depth=3, top_k=2), DynamicTree(nodes=4, depth=1, top_k=3)):
    out = jspec.speculative_generate(target, eagle, prompts, tree=budget, max_new_tokens=24,
                                     eos_id=())
    np.testing.assert_array_equal(np.asarray(out.tokens), ref, err_msg=str(budget))
    accepted += int(np.sum(np.asarray(out.stats.accepted)))
  if not layers:  # a random EAGLE-1 head is sometimes right here: rewinds are exercised
    assert accepted > 0


@pytest.mark.slow
def test_compaction_equals_chain_prefill(target):
  """After dynamic-tree rounds, the target cache at every committed slot but the last
  equals that of feeding the committed tokens as a plain chain."""
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3)
  eagle = E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config)
  prompts = ragged_prompts(3, 48, seed=11, min_len=5)
  S = 64
  budget = DynamicTree(nodes=8, depth=3, top_k=2)
  cfg = decode.DecodeConfig(num_draft_tokens=3, cache_length=S, tree=budget)
  state = rounds_from_prompts(target, eagle, prompts, cfg)
  assert np.asarray(state.stats.accepted).sum() > 0
  assert_cache_equals_chain_prefill(target, state, S)


def test_errors(target):
  budget = DynamicTree(nodes=4, depth=2, top_k=2)
  with pytest.raises(TypeError, match="propose_dynamic"):
    jspec.speculative_generate(target, jspec.NGram(48), [[1, 2, 3]], tree=budget,
                               max_new_tokens=4)
  config = E.EagleConfig.for_target(target.config)
  eagle = E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config)
  with pytest.raises(ValueError, match="conflicts with the tree"):
    jspec.speculative_generate(target, eagle, [[1, 2, 3]], tree=budget, num_draft_tokens=3,
                               max_new_tokens=4)
  with pytest.raises(TypeError, match="jspec.Tree or a jspec.DynamicTree"):
    jspec.speculative_generate(target, eagle, [[1, 2, 3]], tree=(4, 2), max_new_tokens=4)
  assert isinstance(RowTree.from_parents(jnp.asarray([[-1, 0]]), jnp.asarray([[0, 1]]), 1, 1),
                    RowTree)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_dynamic_tree_keeps_the_distribution(temperature, top_k):
  """Whole-sequence enumeration (V = 6, 3 new tokens, 20,000 rows): an EAGLE head with
  peaked, often wrong drafts growing a 5-node tree per row; counts match the target's
  distribution bin by bin, with 0, 1 and 2 accepted drafts all exercised."""
  from test_distribution import NEW, PROMPT, ROWS, V, exact_distribution, sequence_counts

  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  target = jspec.models.init(config, seed=21)
  head = E.init_params(E.EagleConfig.for_target(config), jax.random.key(3))
  head = jax.tree_util.tree_map(lambda x: x * 3.0, head)
  eagle = jspec.Eagle.from_target(target, head)
  exact = exact_distribution(target, temperature, top_k)
  out = jspec.speculative_generate(target, eagle, [PROMPT] * ROWS, max_new_tokens=NEW,
                                   temperature=temperature, top_k=top_k, seed=12,
                                   tree=DynamicTree(nodes=5, depth=2, top_k=2))
  hist = np.asarray(out.stats.accept_hist)
  assert hist[0] > 0 and hist[1] > 0 and hist[2] > 0, f"acceptance not exercised: {hist}"
  assert_counts_match(sequence_counts(out.tokens), exact, "dynamic tree")
