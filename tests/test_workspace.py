"""The target cache kept from one `generate` call to the next (`jspec.planner.workspace`).

A call on the CPU backend decodes in the cache the previous call of its shape handed
back. What its slots held must never be read: these tests fill the kept cache with
large values and require the next call's tokens, log-probabilities and counters to
equal a call that got a fresh zeroed cache, for every kind of loop.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.planner import workspace
from conftest import ragged_prompts

V = 64


def _poison_kept():
  """Replace the kept cache's values by large ones (same shapes: it stays usable)."""
  (key, cache), = workspace._kept
  poisoned = jax.tree_util.tree_map(lambda x: jnp.full_like(x, 1e3), cache)
  workspace._kept[:] = [(key, poisoned)]
  return poisoned


def _fresh(call):
  """The call's output with no kept cache to take (a new zeroed one)."""
  workspace.release_caches()
  return call()


CASES = {
    "plain": lambda t, d: dict(),
    "ngram_k3": lambda t, d: dict(draft=jspec.NGram(V, max_ngram=2), num_draft_tokens=3),
    "draft_tree": lambda t, d: dict(draft=d, tree=jspec.Tree.from_paths([(0, 0), (0, 1), (1,)])),
    "auto": lambda t, d: dict(draft=d, num_draft_tokens="auto"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_kept_cache_contents_are_never_read(target, close_draft, case, temperature):
  prompts = ragged_prompts(3, V, seed=4, max_len=9)
  kwargs = CASES[case](target, close_draft)
  draft = kwargs.pop("draft", None)

  def call():
    fn = jspec.generate if draft is None else (
        lambda *a, **k: jspec.speculative_generate(a[0], draft, *a[1:], **k))
    return fn(target, prompts, max_new_tokens=12, cache_length=48, temperature=temperature,
              seed=3, return_logprobs=True, **kwargs)

  expected = _fresh(call)
  assert len(workspace._kept) == 1  # the call handed its cache back
  poisoned = _poison_kept()
  got = call()
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(expected.tokens))
  np.testing.assert_array_equal(np.asarray(got.logprobs),
                                np.asarray(expected.logprobs))
  np.testing.assert_array_equal(np.asarray(got.stats.accepted),
                                np.asarray(expected.stats.accepted))
  # The poisoned buffers were the ones decoded in: donated to the program, not copied.
  assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(poisoned))


def _call(target, cache_length):
  jspec.generate(target, [[1, 2, 3], [4, 5]], max_new_tokens=4, cache_length=cache_length)


def test_two_shapes_kept_the_least_recent_dropped_and_released(target):
  workspace.release_caches()
  _call(target, 32)
  (k32, c32), = workspace._kept
  _call(target, 64)
  assert [k for k, _ in workspace._kept][1] == k32  # both kept, the last first
  _call(target, 32)  # takes the kept one: donated to the call, handed back
  assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(c32))
  assert workspace._kept[0][0] == k32 and len(workspace._kept) == 2
  (k64, c64) = workspace._kept[1]
  _call(target, 96)  # a third shape: the least recently used (64) is dropped, not donated
  assert [k for k, _ in workspace._kept][1:] == [k32] and len(workspace._kept) == 2
  assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(c64))
  held = sum(x.nbytes for _, c in workspace._kept for x in jax.tree_util.tree_leaves(c))
  assert jspec.release_caches() == held > 0
  assert workspace._kept == [] and jspec.release_caches() == 0


def test_kept_caches_dropped_before_passing_half_the_memory(target, monkeypatch):
  workspace.release_caches()
  _call(target, 32)
  one = sum(x.nbytes for x in jax.tree_util.tree_leaves(workspace._kept[0][1]))
  monkeypatch.setattr(workspace, "_memory", lambda: 3 * one)  # room for one, not two
  _call(target, 40)
  assert len(workspace._kept) == 1  # the 32-slot cache was dropped before allocating
  workspace.release_caches()
