"""`jspec.Suffix`: frequency-weighted suffix drafting over the row and a cross-call memory."""

import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core.drafter import DraftContext
from jspec.drafters.suffix import Suffix, SuffixMemory, remember
from conftest import ragged_prompts


def _context(rows, S=32):
  tokens = np.zeros((len(rows), S), np.int32)
  for b, r in enumerate(rows):
    tokens[b, :len(r)] = r
  return DraftContext(tokens=jnp.asarray(tokens),
                      lengths=jnp.asarray([len(r) for r in rows], jnp.int32))


def test_drafts_follow_the_most_frequent_continuation():
  # "1 2" was followed by 3 twice and by 7 once (most recently): NGram copies the most
  # recent occurrence, Suffix the majority, and its second draft follows 3's branch.
  row = [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 7, 5, 1, 2]
  drafts, count = Suffix(16, min_prob=0.4).lookup(_context([row]), 3)
  # Path estimates 2/3, 2/3, then 1/3 (9 or 8 next) < 0.4: two drafts, then t_{L-1}.
  assert drafts.tolist() == [[3, 4, 2]] and count.tolist() == [2]
  assert Suffix(16, min_prob=0.3).lookup(_context([row]), 3)[0].tolist() == [[3, 4, 8]]
  ngram_drafts, _ = jspec.NGram(16, drafts_per_ngram=None).lookup(_context([row]), 3)
  assert ngram_drafts.tolist()[0][0] == 7
  # min_prob: the path's estimate 2/3 stops at a threshold above it; no match: nothing.
  assert Suffix(16, min_prob=0.7).lookup(_context([row]), 3)[1].tolist() == [0]
  assert Suffix(16).lookup(_context([[5, 6]]), 3)[1].tolist() == [0]


def test_memory_is_searched_and_remembered():
  memory = remember(SuffixMemory.empty(12), jnp.asarray([[4, 5, 6, -1], [7, 8, -1, -1]]),
                    jnp.asarray([3, 2]))
  assert memory.tokens.tolist() == [-1] * 5 + [4, 5, 6, -1, 7, 8, -1]
  memory = remember(memory, jnp.asarray([[1, 2, 3]]), jnp.asarray([3]))
  assert memory.tokens.tolist() == [-1, 4, 5, 6, -1, 7, 8, -1, 1, 2, 3, -1]  # oldest 4 dropped
  drafter = Suffix(16, memory=memory)
  drafts, count = drafter.lookup(_context([[9, 4, 5]]), 3)
  assert drafts.tolist() == [[6, 5, 5]] and count.tolist() == [1]  # 6, then -1 ends it
  with pytest.raises(ValueError, match="memory size"):
    SuffixMemory.empty(1)


@pytest.mark.parametrize("batch", [1] + [pytest.param(b, marks=pytest.mark.slow) for b in (3, 8)])
def test_greedy_equals_baseline(target, batch):
  prompts = ragged_prompts(batch, target.vocab_size, seed=batch, min_len=2, max_len=10)
  prompts = [p + p[: len(p) // 2] for p in prompts]  # something to match
  base = jspec.generate(target, prompts, max_new_tokens=14)
  memory = remember(SuffixMemory.empty(64), base.tokens, base.lengths)
  for drafter in (Suffix(target.vocab_size), Suffix(target.vocab_size, memory=memory)):
    spec = jspec.speculative_generate(target, drafter, prompts, num_draft_tokens=4,
                                      max_new_tokens=14)
    np.testing.assert_array_equal(base.tokens, spec.tokens)


@pytest.mark.slow
def test_memory_across_calls_raises_acceptance(target):
  """The same task three times: each call remembers the last one's answer, so the
  second and third drafts it, and tau rises; an empty memory drafts as no memory."""
  prompts = ragged_prompts(2, target.vocab_size, seed=41, min_len=4, max_len=8)
  memory = SuffixMemory.empty(256)
  taus, outs = [], []
  for _ in range(3):
    out = jspec.speculative_generate(target, Suffix(target.vocab_size, memory=memory), prompts,
                                     num_draft_tokens=4, max_new_tokens=24, temperature=0.0)
    taus.append(float(np.sum(out.lengths)) / float(np.sum(out.stats.target_calls)))
    outs.append(out)
    memory = remember(memory, out.tokens, out.lengths)
  np.testing.assert_array_equal(outs[0].tokens, outs[2].tokens)  # greedy: the same answer
  assert taus[1] > taus[0] + 1.0 and taus[2] >= taus[1], taus
  # Empty memory = no memory, also when sampling (same drafts, same random numbers).
  kw = dict(num_draft_tokens=4, max_new_tokens=16, temperature=1.0, seed=5)
  plain = jspec.speculative_generate(target, Suffix(target.vocab_size), prompts, **kw)
  empty = jspec.speculative_generate(
      target, Suffix(target.vocab_size, memory=SuffixMemory.empty(256)), prompts, **kw)
  np.testing.assert_array_equal(plain.tokens, empty.tokens)
  np.testing.assert_array_equal(plain.stats.row_hist, empty.stats.row_hist)


def test_settings_are_checked():
  with pytest.raises(ValueError, match="min_prob"):
    Suffix(16, min_prob=1.0)
  with pytest.raises(ValueError, match="max_ngram"):
    Suffix(16, max_ngram=0)
  with pytest.raises(TypeError, match="SuffixMemory"):
    Suffix(16, memory=[1, 2, 3])


def test_frequency_tree_ranks_continuations():
  # After "1 2": 3 (twice, then 4 and 5), 7 (once, then 5). Root children: 3 then 7.
  row = [1, 2, 3, 4, 9, 1, 2, 3, 5, 8, 1, 2, 7, 5, 1, 2]
  tree = jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0), (2,)])
  candidates, _ = Suffix(16).propose_tree(None, _context([row]), tree, None, None)
  parents, ranks = np.asarray(tree.parents), np.asarray(tree.ranks)
  paths, tokens = {0: ()}, {}
  for i in range(1, len(parents)):  # node i's rank path -> its token
    paths[i] = paths[int(parents[i])] + (int(ranks[i]),)
    tokens[paths[i]] = candidates.tolist()[0][i - 1]
  assert tokens[(0,)] == 3 and tokens[(1,)] == 7
  assert tokens[(2,)] == 2  # no third continuation: the placeholder t_{L-1}
  assert tokens[(0, 0)] == 4 and tokens[(0, 1)] == 5  # 4 and 5 tie: lower id first
  assert tokens[(1, 0)] == 5
  # The same expansion serves n-gram lookup over the row alone.
  ngram_candidates, _ = jspec.NGram(16).propose_tree(None, _context([row]), tree, None, None)
  np.testing.assert_array_equal(ngram_candidates, candidates)


TREE = jspec.Tree.from_paths([(0, 0, 0), (0, 1), (1, 0), (2,)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ngram", "datastore", "suffix"])
def test_lookup_trees_greedy_equal_baseline(target, name):
  prompts = ragged_prompts(3, target.vocab_size, seed=12, min_len=3, max_len=10)
  prompts = [p + p for p in prompts]
  base = jspec.generate(target, prompts, max_new_tokens=14)
  V = target.vocab_size
  drafter = {"ngram": jspec.NGram(V),
             "datastore": jspec.Datastore.from_sequences(np.asarray(base.tokens)[:, :8].tolist(),
                                                         V),
             "suffix": Suffix(V, memory=remember(SuffixMemory.empty(64), base.tokens,
                                                 base.lengths))}[name]
  spec = jspec.speculative_generate(target, drafter, prompts, tree=TREE, max_new_tokens=14)
  np.testing.assert_array_equal(base.tokens, spec.tokens)
  assert int(np.sum(spec.stats.accepted)) > 0
