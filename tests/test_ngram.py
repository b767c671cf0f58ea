"""Drafters without a draft model: `NGram` and `Datastore`.

The jitted lookups are checked against a plain-Python matcher on random small-vocab
buffers (hypothesis), then end to end: greedy speculative output equals greedy
baseline output (with loops the drafter catches and rows where nothing matches),
and sampled whole sequences follow the target's distribution (by enumeration, as
in test_distribution.py).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import jspec
import test_distribution as enumeration
from conftest import assert_greedy_match, ragged_prompts, tiny_config
from jspec.drafters.datastore import Datastore
from jspec.core.drafter import DraftContext
from jspec.drafters.ngram import NGram
from reference import assert_counts_match

# ----------------------------------------------------------------------------- reference


def ref_match(context, haystack, last_end, max_ngram, min_ngram):
  """Longest suffix of `context` that ends at or before `last_end` in `haystack`;
  the most recent among equals. (n, end), (0, -1) when nothing matches."""
  L = len(context)
  for n in range(max_ngram, min_ngram - 1, -1):
    if n > L:
      continue
    suffix = context[L - n:]
    for end in range(last_end, n - 2, -1):
      if haystack[end - n + 1:end + 1] == suffix:
        return n, end
  return 0, -1


def ref_allowed(n, k, per_ngram):
  if n == 0:
    return 0
  return k if per_ngram is None else min(k, per_ngram * n)


def ref_ngram(context, k, max_ngram, min_ngram, per_ngram):
  """(drafts, count) for one row: the continuation (repeating with the match's
  period), placeholder t_{L-1} past the adaptive count."""
  L = len(context)
  n, end = ref_match(context, context, L - 2, max_ngram, min_ngram)
  count = ref_allowed(n, k, per_ngram)
  drafts = [context[end + 1 + j % (L - 1 - end)] for j in range(count)]
  return drafts + [context[-1]] * (k - count), count


def ref_datastore(context, store, k, max_ngram, min_ngram, per_ngram):
  own_n, _ = ref_match(context, context, len(context) - 2, max_ngram, min_ngram)
  n, end = ref_match(context, store, len(store) - 2, max_ngram, min_ngram)
  if n <= own_n:  # the row's own context wins ties (and longer own matches)
    return ref_ngram(context, k, max_ngram, min_ngram, per_ngram)
  count = min(ref_allowed(n, k, per_ngram), len(store) - 1 - end)
  return list(store[end + 1:end + 1 + count]) + [context[-1]] * (k - count), count


def test_reference_examples():
  # "1 2" recurs ending at index 1; period 3, a_2 = 4 of K = 5, then the placeholder.
  assert ref_ngram([1, 2, 3, 1, 2], 5, 3, 1, 2) == ([3, 1, 2, 3, 2], 4)
  assert ref_ngram([5, 6, 7, 8], 3, 3, 1, 2) == ([8, 8, 8], 0)  # nothing recurs
  assert ref_ngram([7], 2, 3, 1, None) == ([7, 7], 0)
  # The datastore's 3-gram beats the row's 1-gram ("8" never recurs here, "7" does not either).
  store = [7, 8, 3, 4, 4, 0, 6, 7, 8, 1, 1]
  assert ref_datastore([5, 6, 7, 8], store, 5, 3, 1, 2) == ([1, 1, 8, 8, 8], 2)
  # Equal length: the row's own match wins.
  assert ref_datastore([4, 9, 4], [2, 4, 5], 2, 3, 1, None) == ([9, 4], 2)


# ----------------------------------------------------------------------------- property tests

B, S, N = 4, 16, 12
CASES = [  # (K, max_ngram, min_ngram, drafts_per_ngram)
    (1, 3, 1, 2),
    (3, 2, 2, None),
    (4, 3, 1, 2),
    (4, 4, 1, 1),
]


@functools.partial(jax.jit, static_argnums=(2,))
def jit_propose(drafter, context, k):
  drafts, q, _ = drafter.propose(None, context, k, None, None)
  _, count = drafter.lookup(context, k)
  return drafts, q, count


@st.composite
def buffers(draw):
  """Rows of a [B, S] buffer (scratch past each length is random too), lengths and a
  datastore of N tokens, all over a vocabulary of 2..4 ids so that matches are common."""
  v = draw(st.integers(2, 4))
  ids = st.integers(0, v - 1)
  tokens = draw(st.lists(st.lists(ids, min_size=S, max_size=S), min_size=B, max_size=B))
  lengths = draw(st.lists(st.integers(1, S), min_size=B, max_size=B))
  store = draw(st.lists(ids, min_size=N, max_size=N))
  return tokens, lengths, store


def check_rows(drafter, tokens, lengths, k, reference):
  context = DraftContext(jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths, jnp.int32))
  drafts, q, count = jit_propose(drafter, context, k)
  drafts, count = np.asarray(drafts), np.asarray(count)
  assert drafts.shape == (B, k) and drafts.dtype == np.int32
  assert q is None  # deterministic: one-hot at the drafts, never materialised
  for b in range(B):
    want, want_count = reference(tokens[b][:lengths[b]])
    assert drafts[b].tolist() == want and count[b] == want_count, (
        f"row {b}: context {tokens[b][:lengths[b]]}: got {drafts[b].tolist()} "
        f"(count {count[b]}), want {want} (count {want_count})")


@pytest.mark.parametrize("k,max_ngram,min_ngram,per_ngram", CASES)
@settings(max_examples=50, deadline=None)
@given(data=buffers())
def test_ngram_matches_reference(k, max_ngram, min_ngram, per_ngram, data):
  tokens, lengths, _ = data
  drafter = NGram(4, max_ngram=max_ngram, min_ngram=min_ngram, drafts_per_ngram=per_ngram)
  check_rows(drafter, tokens, lengths, k,
             lambda ctx: ref_ngram(ctx, k, max_ngram, min_ngram, per_ngram))


@pytest.mark.parametrize("k,max_ngram,min_ngram,per_ngram", CASES)
@settings(max_examples=50, deadline=None)
@given(data=buffers())
def test_datastore_matches_reference(k, max_ngram, min_ngram, per_ngram, data):
  tokens, lengths, store = data
  drafter = Datastore(store, 4, max_ngram=max_ngram, min_ngram=min_ngram,
                      drafts_per_ngram=per_ngram)
  check_rows(drafter, tokens, lengths, k,
             lambda ctx: ref_datastore(ctx, store, k, max_ngram, min_ngram, per_ngram))


# ----------------------------------------------------------------------------- construction


def test_pytree_leaves_and_settings():
  assert jax.tree_util.tree_leaves(NGram(8)) == []  # all settings static
  store = Datastore.from_sequences([[1, 2], [3]], 8, separator=7)
  leaves = jax.tree_util.tree_leaves(store)
  assert len(leaves) == 1 and leaves[0].dtype == jnp.int32
  np.testing.assert_array_equal(leaves[0], [1, 2, 7, 3])
  np.testing.assert_array_equal(Datastore.from_sequences([[1, 2], [], [3]], 8).tokens, [1, 2, 3])
  assert NGram(8).init(jnp.zeros((2, 4), jnp.int32), jnp.ones((2,), jnp.int32), 32) is None


@pytest.mark.parametrize("make,match", [
    (lambda: NGram(0), "vocab_size"),
    (lambda: NGram(8, max_ngram=1, min_ngram=2), "max_ngram"),
    (lambda: NGram(8, drafts_per_ngram=0), "drafts_per_ngram"),
    (lambda: Datastore([], 8), "empty"),
    (lambda: Datastore([[1, 2]], 8), "1-D"),
    (lambda: Datastore([1, 9], 8), r"\[0, 8\)"),
    (lambda: Datastore.from_sequences([[]], 8), "empty"),
    (lambda: Datastore.from_sequences([[1]], 8, separator=8), "separator"),
    (lambda: Datastore.from_sequences(["abc"], 8), "string"),
])
def test_bad_settings_raise(make, match):
  with pytest.raises((ValueError, TypeError), match=match):
    make()


# ----------------------------------------------------------------------------- greedy exactness

MAX_NEW = 24


@pytest.fixture(scope="module")
def greedy_prompts():
  """Ragged random rows, a restating row, rows whose tokens never recur (nothing
  matches at first) and a length-1 row."""
  return ragged_prompts(4, 64, seed=17) + [[5, 6, 7, 8] * 3, list(range(20, 33)), [9]]


@pytest.fixture(scope="module")
def greedy_baseline(target, greedy_prompts):
  return np.asarray(jspec.generate(target, greedy_prompts, max_new_tokens=MAX_NEW).tokens)


def test_greedy_ngram_equals_baseline(target, greedy_prompts, greedy_baseline):
  out = jspec.speculative_generate(target, NGram(64), greedy_prompts, num_draft_tokens=3,
                                   max_new_tokens=MAX_NEW)
  assert_greedy_match(target, greedy_prompts, greedy_baseline, np.asarray(out.tokens))
  np.testing.assert_array_equal(out.lengths, MAX_NEW)
  assert int(np.sum(out.stats.accept_hist)) == int(np.sum(out.stats.target_calls))


def test_greedy_datastore_equals_baseline(target, greedy_prompts, greedy_baseline):
  # The datastore holds row 0's own greedy continuation (a restated answer) and noise:
  # row 0 is drafted from it and accepted; the other rows must stay exact.
  answer = list(greedy_prompts[0]) + greedy_baseline[0].tolist()
  noise = ragged_prompts(3, 64, seed=99, min_len=20, max_len=30)
  store = Datastore.from_sequences([noise[0], answer, noise[1], noise[2]], 64, separator=0)
  out = jspec.speculative_generate(target, store, greedy_prompts, num_draft_tokens=3,
                                   max_new_tokens=MAX_NEW)
  assert_greedy_match(target, greedy_prompts, greedy_baseline, np.asarray(out.tokens))
  accepted = np.asarray(out.stats.accepted)
  assert accepted[0] >= MAX_NEW // 2, f"row 0 should copy from the datastore: {accepted}"
  assert np.asarray(out.stats.target_calls)[0] <= MAX_NEW // 2


@pytest.mark.slow  # exactness: test_greedy_ngram_equals_baseline
def test_greedy_loops_are_drafted():
  """A small-vocabulary target whose greedy output falls into loops (period 1, 2, 4):
  n-gram drafting catches them, and the output is still exactly the baseline's."""
  looping = jspec.models.init(tiny_config(vocab_size=16, layers=1, scale=0.3), seed=0)
  prompts = [[5, 6, 7, 8] * 3, [1, 2, 3], [9, 9, 4], [12, 2, 3, 5, 1, 0]]
  base = np.asarray(jspec.generate(looping, prompts, max_new_tokens=32).tokens)
  out = jspec.speculative_generate(looping, NGram(16, drafts_per_ngram=None), prompts,
                                   num_draft_tokens=4, max_new_tokens=32)
  assert_greedy_match(looping, prompts, base, np.asarray(out.tokens))
  accepted = np.asarray(out.stats.accepted)
  assert np.all(accepted > 0) and np.sum(accepted) >= 32, accepted
  assert int(np.sum(out.stats.target_calls)) < 4 * 32


# ----------------------------------------------------------------------------- distribution

V = enumeration.V
ROWS = enumeration.ROWS
MATCHING, UNMATCHED = [1, 4, 1], [1, 4]  # suffix "1" recurs / nothing recurs


@pytest.fixture(scope="module")
def small_target():
  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  return jspec.models.init(config, seed=21)


@pytest.fixture(scope="module")
def exact(small_target):
  """Exact P(x1 x2 x3 | prompt) at temperature 1 per prompt: test_distribution's
  enumeration, pointed at these prompts."""
  return {tuple(p): enumeration.exact_distribution(small_target, 1.0, 0, p)
          for p in (MATCHING, UNMATCHED)}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ngram", "datastore"])
def test_sampled_sequence_distribution(small_target, exact, kind):
  """Temperature 1, K = 2: a row whose suffix matches at once and one where nothing
  does. The datastore also beats the row's 1-gram with its 2-grams ("4 1", "1 4")."""
  if kind == "ngram":
    drafter = NGram(V)
  else:
    drafter = Datastore.from_sequences([[4, 1, 3, 5, 2], [1, 4, 2, 0]], V)
  for prompt in (MATCHING, UNMATCHED):
    out = jspec.speculative_generate(small_target, drafter, [prompt] * ROWS, num_draft_tokens=2,
                                     max_new_tokens=enumeration.NEW, temperature=1.0, seed=7)
    hist = np.asarray(out.stats.accept_hist)
    assert hist[1] > 0 and hist[2] > 0, f"{kind} {prompt}: no drafts accepted: {hist}"
    assert_counts_match(enumeration.sequence_counts(out.tokens), exact[tuple(prompt)],
                        f"{kind} {prompt}")
