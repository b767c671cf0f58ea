"""`jspec.TokenRecycling`: the adjacency matrix of the target's top-k next ids, updated from
each verify's logits inside the loop, drafted as chains and static trees, carried across
calls as `out.memory`; exact greedy and sampled."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import decode
from jspec.core.drafter import (DraftContext, LogitsObservingDrafter, LookupDrafter,
                                PromptObservingDrafter, RememberingDrafter, TreeDrafter)
from jspec.drafters.recycling import TokenRecycling, paper_tree
from jspec.drafters.recycling import TokenRecycling as TokenRecycling_
from jspec.planner import plan
from conftest import ragged_prompts, tiny_config
from reference import assert_counts_match, processed_probs

TREE = jspec.Tree.from_paths([(0, 0, 0), (0, 1), (1, 0), (2,)])


def _tau(out):
  return float(np.sum(out.lengths)) / float(np.sum(out.stats.target_calls))


def _context(rows, S=16):
  tokens = np.zeros((len(rows), S), np.int32)
  for b, r in enumerate(rows):
    tokens[b, :len(r)] = r
  return DraftContext(tokens=jnp.asarray(tokens),
                      lengths=jnp.asarray([len(r) for r in rows], jnp.int32))


# ----------------------------------------------------------------------------- the matrix


def _reference_update(adjacency, block, top_ids, on_path, update):
  """NumPy: rows written in (row, position) order, later writes winning; "all" writes the
  positions off the path first, so a committed position wins over any other."""
  adjacency = np.array(adjacency)
  B, W = block.shape
  passes = [on_path] if update == "path" else [~on_path, on_path]
  for chosen in passes:
    for b, j in itertools.product(range(B), range(W)):
      if chosen[b, j]:
        adjacency[block[b, j]] = top_ids[b, j]
  return adjacency


@pytest.mark.parametrize("update", ["path", "all"])
def test_update_matches_numpy_reference(update):
  rng = np.random.default_rng(0)
  V, k, B, W = 11, 3, 3, 5
  drafter = TokenRecycling(V, top_k=k, update=update)
  step = jax.jit(drafter.after_verify_logits)
  adjacency = np.asarray(drafter.init(None, None, 0))
  assert adjacency.shape == (V, k) and np.all(adjacency == -1)
  for _ in range(6):  # few distinct tokens: rows written twice in a round, across rows too
    block = rng.integers(0, 5, size=(B, W)).astype(np.int32)
    top_ids = rng.integers(0, V, size=(B, W, k)).astype(np.int32)
    on_path = rng.random((B, W)) < 0.5
    expected = _reference_update(adjacency, block, top_ids, on_path, update)
    adjacency = np.asarray(step(jnp.asarray(adjacency), jnp.asarray(block), jnp.asarray(top_ids),
                                jnp.asarray(on_path)))
    np.testing.assert_array_equal(adjacency, expected)


def test_prompt_logits_fill_only_rows_no_verify_wrote():
  rng = np.random.default_rng(1)
  V, k = 11, 2
  drafter = TokenRecycling(V, top_k=k, prompt="logits")
  adjacency = np.full((V, k), -1, np.int32)
  adjacency[[1, 3]] = [[4, 5], [6, 7]]  # written by earlier verifies
  tokens = rng.integers(0, 6, size=(2, 8)).astype(np.int32)  # [B, P]
  top_ids = rng.integers(0, V, size=(2, 7, k)).astype(np.int32)  # [B, P-1, k]
  valid = np.arange(7)[None, :] < np.asarray([[5], [7]])
  expected = adjacency.copy()
  for b, j in itertools.product(range(2), range(7)):
    if valid[b, j] and adjacency[tokens[b, j], 0] < 0:
      expected[tokens[b, j]] = top_ids[b, j]
  got = jax.jit(drafter.after_prefill_logits)(jnp.asarray(adjacency), jnp.asarray(tokens),
                                              jnp.asarray(top_ids), jnp.asarray(valid))
  np.testing.assert_array_equal(got, expected)
  assert np.array_equal(expected[1], [4, 5]) and np.array_equal(expected[3], [6, 7])
  none = TokenRecycling(V, top_k=k, prompt="none")
  np.testing.assert_array_equal(
      none.after_prefill_logits(jnp.asarray(adjacency), jnp.asarray(tokens),
                                jnp.asarray(top_ids), jnp.asarray(valid)), adjacency)


def _context_row(successor, top, k):
  """NumPy: the successor, then the top ids without it, k in all."""
  return np.asarray(([successor] + [t for t in top if t != successor])[:k], np.int32)


@pytest.mark.parametrize("k", [1, 3])
def test_prompt_context_puts_the_successor_first(k):
  """prompt="context": every valid prompt slot's token gets the token that followed it,
  then the slot's top ids without it; the latest slot (row-major) wins, and rows written
  by earlier verifies are replaced."""
  rng = np.random.default_rng(2)
  V = 11
  drafter = TokenRecycling(V, top_k=k)
  assert drafter.prompt == "context"
  adjacency = np.full((V, k), -1, np.int32)
  adjacency[[1, 3]] = 9  # written by earlier verifies
  tokens = rng.integers(0, 6, size=(2, 9)).astype(np.int32)
  # Distinct ids per slot, as a top-k is, often holding the successor: the dedup runs.
  top_ids = np.stack([np.stack([rng.permutation(6)[:k] for _ in range(8)]) for _ in range(2)])
  top_ids = top_ids.astype(np.int32)
  valid = np.arange(8)[None, :] < np.asarray([[6], [8]])
  expected = adjacency.copy()
  for b, j in itertools.product(range(2), range(8)):
    if valid[b, j]:
      expected[tokens[b, j]] = _context_row(tokens[b, j + 1], top_ids[b, j].tolist(), k)
  got = jax.jit(drafter.after_prefill_logits)(jnp.asarray(adjacency), jnp.asarray(tokens),
                                              jnp.asarray(top_ids), jnp.asarray(valid))
  np.testing.assert_array_equal(got, expected)
  assert np.any(top_ids[..., :1] == tokens[:, 1:, None])  # a duplicate was there to drop


def test_drafts_walk_the_matrix_breadth_first():
  V = 16
  adjacency = np.full((V, 3), -1, np.int32)
  adjacency[5] = [7, 9, 2]
  adjacency[7] = [3, 8, 1]
  adjacency[9] = [4, -1, -1]
  adjacency[3] = [6, 0, 0]
  drafter = TokenRecycling(V, memory=jnp.asarray(adjacency), top_k=3)
  context = _context([[1, 2, 5], [4, 4]])
  state = drafter.init(None, None, 0)
  drafts, q, _ = drafter.propose(state, context, 4, None, None)
  assert q is None
  # Row 0: 5 -> 7 -> 3 -> 6, then 6's row is unknown: the placeholder t(L-1) = 5.
  # Row 1: 4's row is unknown from the start: placeholders throughout.
  assert drafts.tolist() == [[7, 3, 6, 5], [4, 4, 4, 4]]
  candidates, _ = drafter.propose_tree(state, context, TREE, None, None)
  parents, ranks = np.asarray(TREE.parents), np.asarray(TREE.ranks)
  paths = {0: ()}
  tokens = {}
  for i in range(1, len(parents)):
    paths[i] = paths[int(parents[i])] + (int(ranks[i]),)
    tokens[paths[i]] = candidates.tolist()[0][i - 1]
  assert tokens == {(0,): 7, (1,): 9, (2,): 2, (0, 0): 3, (0, 1): 8, (1, 0): 4, (0, 0, 0): 6}
  # Under an unknown row (2's), and in row 1, every node is the placeholder.
  assert candidates.tolist()[1] == [4] * (TREE.num_nodes - 1)


def test_capabilities():
  drafter = TokenRecycling(64)
  for protocol in (LogitsObservingDrafter, PromptObservingDrafter, RememberingDrafter,
                   TreeDrafter):
    assert isinstance(drafter, protocol)
  assert not isinstance(drafter, LookupDrafter)  # its drafts depend on state
  ngram = jspec.NGram(64)
  assert not isinstance(ngram, LogitsObservingDrafter)
  assert not isinstance(ngram, RememberingDrafter)
  tree = paper_tree()
  assert (tree.num_nodes, tree.max_depth, max(tree.ranks)) == (81, 6, 7)
  assert TokenRecycling.paper_tree() == tree


def test_only_drafters_that_ask_pay_for_the_top_k(target):
  """The verify's top-k is traced for a LogitsObservingDrafter and for no other."""
  prompts = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
  config = decode.DecodeConfig(num_draft_tokens=3, cache_length=32)

  def traced(drafter):
    def round_(tokens):
      state = decode.init_state(target, drafter, tokens, jnp.asarray([4], jnp.int32),
                                jnp.asarray([8], jnp.int32), None, jnp.asarray([-1], jnp.int32),
                                jnp.asarray([0], jnp.int32), config)
      return decode.decode_round(target, drafter, state, config)[0].lengths
    return str(jax.make_jaxpr(round_)(prompts))

  assert "top_k" in traced(TokenRecycling(64))
  assert "top_k" not in traced(jspec.NGram(64))


# ----------------------------------------------------------------------------- in the loop


def test_prefill_top_ids_in_chunks(target):
  """`prefill.observed` over a prompt of several chunks (the last one overlapping): the
  top-k ids at every real prompt slot are those of a full forward pass."""
  from jspec.core import prefill
  rng = np.random.default_rng(3)
  lengths = np.asarray([150, 70], np.int32)
  tokens = rng.integers(0, target.vocab_size, size=(2, 150)).astype(np.int32)
  run = jax.jit(lambda t, n: prefill.observed(target, t, n, target.init_cache(2, 160), False, 3))
  _, hidden, ids = run(jnp.asarray(tokens), jnp.asarray(lengths))
  assert hidden is None and ids.shape == (2, 149, 3)
  for b, L in enumerate(lengths):
    logits = np.asarray(target.logits(jnp.asarray(tokens[b:b + 1, :L])))[0]
    expected = np.stack([_top_k(logits[j], 3) for j in range(L - 1)])
    np.testing.assert_array_equal(np.asarray(ids)[b, :L - 1], expected)


def _top_k(logits, k):
  return np.argsort(-np.asarray(logits, np.float64), kind="stable")[:k]


@pytest.mark.parametrize("shape,prompt", [("chain", "logits"), ("tree", "logits"),
                                          ("chain", "context")])
def test_matrix_after_a_call_holds_the_targets_top_k(target, shape, prompt):
  """Greedy, one row, a fresh matrix: a row v of out.memory is the top-k of the target's
  logits at the last committed position holding v, but the newest (the prefill's over the
  prompt, then each verify's), computed here by a full forward pass; where that position
  is in the prompt and prompt="context", the token that followed first. Positions whose
  token recurs in the drafts of the last round (greedy: the continuation) are left out:
  that round may have written them from an accepted draft past max_new_tokens."""
  V, k, K, new = target.vocab_size, 4, 3, 12
  prompt_ids = [5, 9, 17, 3, 5, 9]
  drafter = TokenRecycling(V, top_k=k, prompt=prompt)
  prompt, mode = prompt_ids, prompt
  kw = dict(num_draft_tokens=K) if shape == "chain" else dict(tree=TREE)
  out = jspec.speculative_generate(target, drafter, [prompt], max_new_tokens=new, **kw)
  tokens = out.tokens[0, :int(out.lengths[0])].tolist()
  longer = jspec.generate(target, [prompt], max_new_tokens=new + K + 1).tokens[0].tolist()
  assert longer[:new] == tokens
  sequence = prompt + longer
  logits = np.asarray(target.logits(jnp.asarray([sequence], jnp.int32)))[0]
  memory = np.asarray(out.memory)
  end = len(prompt) + new  # committed: sequence[:end]
  verified = range(end - 1)  # positions whose logits the prefill or a verify produced
  beyond = set(sequence[end - 1:end + K])
  checked = 0
  for v in range(V):
    where = [i for i in verified if sequence[i] == v]
    if not where:
      if v not in beyond:
        assert np.all(memory[v] == -1), v
      continue
    if v in beyond:
      continue
    i = where[-1]
    row = _top_k(logits[i], k)
    if mode == "context" and i < len(prompt) - 1:
      row = _context_row(sequence[i + 1], row.tolist(), k)
    np.testing.assert_array_equal(memory[v], row, err_msg=str(v))
    checked += 1
  assert checked >= 4


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_greedy_equals_baseline(target, batch, shape):
  prompts = ragged_prompts(batch, target.vocab_size, seed=batch + 20, min_len=2, max_len=11)
  base = jspec.generate(target, prompts, max_new_tokens=16)
  kw = dict(num_draft_tokens=4) if shape == "chain" else dict(tree=TREE)
  first = jspec.speculative_generate(target, TokenRecycling(target.vocab_size), prompts,
                                     max_new_tokens=16, **kw)
  np.testing.assert_array_equal(base.tokens, first.tokens)
  again = jspec.speculative_generate(target, TokenRecycling(target.vocab_size,
                                                            memory=first.memory),
                                     prompts, max_new_tokens=16, **kw)
  np.testing.assert_array_equal(base.tokens, again.tokens)
  assert int(np.sum(again.stats.accepted)) > 0


@pytest.mark.slow
def test_paper_tree_and_update_all_greedy(target):
  prompts = ragged_prompts(2, target.vocab_size, seed=5, min_len=3, max_len=9)
  base = jspec.generate(target, prompts, max_new_tokens=14)
  for drafter, tree in ((TokenRecycling(target.vocab_size), paper_tree()),
                        (TokenRecycling(target.vocab_size, update="all"), TREE)):
    out = jspec.speculative_generate(target, drafter, prompts, tree=tree, max_new_tokens=14)
    np.testing.assert_array_equal(base.tokens, out.tokens)


def test_memory_across_calls_raises_acceptance(target):
  """The same prompt twice: the second call starts from the first one's matrix, so it
  drafts from its first round and accepts more; greedy, the same answer. An all -1
  matrix drafts as no memory. prompt="logits", which keeps verified rows: "context" would
  replace the prompt tokens' rows by their successors in the prompt, which on this random
  target are noise (on SmolLM2 the second pass gains as much either way: docs/benchmarks.md)."""
  prompts = ragged_prompts(2, target.vocab_size, seed=41, min_len=4, max_len=8)
  V = target.vocab_size
  TokenRecycling = functools.partial(TokenRecycling_, prompt="logits")
  first = jspec.speculative_generate(target, TokenRecycling(V), prompts, num_draft_tokens=4,
                                     max_new_tokens=24)
  memory = np.asarray(first.memory)
  assert memory.shape == (V, 8) and memory.dtype == np.int32 and np.any(memory >= 0)
  second = jspec.speculative_generate(target, TokenRecycling(V, memory=first.memory), prompts,
                                      num_draft_tokens=4, max_new_tokens=24)
  np.testing.assert_array_equal(first.tokens, second.tokens)
  assert _tau(second) > _tau(first) + 0.15, (_tau(first), _tau(second))  # 1.04 -> 1.26
  assert int(np.sum(second.stats.accepted)) > int(np.sum(first.stats.accepted))
  empty = jspec.speculative_generate(target, TokenRecycling(V, memory=jnp.full((V, 8), -1)),
                                     prompts, num_draft_tokens=4, max_new_tokens=24)
  np.testing.assert_array_equal(first.stats.row_hist, empty.stats.row_hist)
  np.testing.assert_array_equal(first.memory, empty.memory)


@pytest.mark.slow  # two "auto" programs compiled
def test_auto_drafts_and_returns_the_memory(target):
  """"auto" with costs that make drafting pay: greedy output is the target's and the
  matrix comes back; costs under which no K pays run plain decoding and hand the memory
  back as it went in."""
  prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8]]
  V = target.vocab_size
  plain = jspec.generate(target, prompts, max_new_tokens=16)
  warm = jspec.speculative_generate(target, TokenRecycling(V), prompts, num_draft_tokens=3,
                                    max_new_tokens=16)
  auto = jspec.AutoK(choices=(0, 3), costs=(1.0, 1.1), variants=2)
  out = jspec.speculative_generate(target, TokenRecycling(V, memory=warm.memory), prompts,
                                   num_draft_tokens=auto, max_new_tokens=16)
  np.testing.assert_array_equal(plain.tokens, out.tokens)
  assert out.rounds_by_k[3] > 0 and out.memory.shape == (V, 8)
  never = jspec.AutoK(choices=(0, 3), costs=(1.0, 50.0))
  out = jspec.speculative_generate(target, TokenRecycling(V, memory=warm.memory), prompts,
                                   num_draft_tokens=never, max_new_tokens=16)
  np.testing.assert_array_equal(plain.tokens, out.tokens)
  assert set(out.rounds_by_k) == {0}
  np.testing.assert_array_equal(out.memory, warm.memory)


def test_other_drafters_return_no_memory(target):
  out = jspec.speculative_generate(target, jspec.NGram(target.vocab_size), [[1, 2, 1, 2]],
                                   num_draft_tokens=2, max_new_tokens=4)
  assert out.memory is None


# ----------------------------------------------------------------------------- bad input


def test_settings_are_checked_before_tracing(target):
  V = target.vocab_size
  with pytest.raises(ValueError, match="top_k"):
    TokenRecycling(V, top_k=0)
  with pytest.raises(ValueError, match="top_k"):
    TokenRecycling(V, top_k=V + 1)
  with pytest.raises(ValueError, match="vocab_size"):
    TokenRecycling(0)
  with pytest.raises(ValueError, match="update"):
    TokenRecycling(V, update="tree")
  with pytest.raises(ValueError, match="prompt must be one of"):
    TokenRecycling(V, prompt="copy")
  with pytest.raises(ValueError, match=r"shape \(65, 8\)"):
    TokenRecycling(V, memory=jnp.zeros((V + 1, 8), jnp.int32))  # another vocabulary
  with pytest.raises(ValueError, match=r"shape \(64, 4\)"):
    TokenRecycling(V, memory=jnp.zeros((V, 4), jnp.int32))  # another top_k
  with pytest.raises(ValueError, match="integer"):
    TokenRecycling(V, memory=jnp.zeros((V, 8), jnp.float32))
  with pytest.raises(TypeError, match="out.memory"):
    TokenRecycling(V, memory=[[0] * 8] * V)
  with pytest.raises(ValueError, match="vocab size"):  # the planner's check, before tracing
    jspec.speculative_generate(target, TokenRecycling(V + 1), [[1, 2]], max_new_tokens=2)
  with pytest.raises(ValueError, match="rank 7"):
    jspec.speculative_generate(target, TokenRecycling(V, top_k=4), [[1, 2]],
                               tree=paper_tree(), max_new_tokens=2)
  with pytest.raises(ValueError, match="rank 7"):  # raised by the planner, before tracing
    plan.speculation(target, TokenRecycling(V, top_k=4), None, paper_tree())


def test_cli_name():
  from jspec.bench import methods

  class Target:
    vocab_size = 64

  assert isinstance(methods.build("recycling", Target()).drafter, TokenRecycling)
  assert "recycling" in methods.names()


# ----------------------------------------------------------------------------- distributions

V_SMALL, NEW, ROWS, PROMPT = 6, 3, 20_000, [1, 4]


@pytest.fixture(scope="module")
def small_target():
  config = tiny_config(vocab_size=V_SMALL, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  return jspec.models.init(config, seed=21)


def _exact(model, temperature, top_k):
  """P(x1 x2 x3 | PROMPT) for all V**3 sequences, base-V order, by full forward passes."""
  pairs = list(itertools.product(range(V_SMALL), repeat=NEW - 1))
  seqs = jnp.asarray([PROMPT + list(x) for x in pairs], jnp.int32)
  logits = np.asarray(model.logits(seqs), np.float64)
  P = len(PROMPT)
  probs = np.zeros((V_SMALL,) * NEW)
  for row, (x1, x2) in enumerate(pairs):
    p1, p2, p3 = (processed_probs(logits[row, P - 1 + i], temperature, top_k) for i in range(3))
    probs[x1, x2, :] = p1[x1] * p2[x2] * p3
  return probs.reshape(-1)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
@pytest.mark.parametrize("shape,update", [("chain", "path"), ("tree", "all")])
def test_sampled_sequences_follow_the_target(small_target, temperature, top_k, shape, update):
  """20,000 rows sharing one matrix, from a memory learnt on earlier sampled calls: the
  whole 3-token sequences follow the target's processed distribution, acceptance and
  rejection both exercised."""
  target = small_target
  kw = dict(max_new_tokens=NEW, temperature=temperature, top_k=top_k)
  shape_kw = dict(num_draft_tokens=2) if shape == "chain" else dict(tree=TREE)
  drafter = TokenRecycling(V_SMALL, top_k=3, update=update)
  warm = jspec.speculative_generate(target, drafter, [[1, 4, 2], [4, 0, 5, 1]] * 4, seed=7,
                                    num_draft_tokens=2, **kw)
  drafter = TokenRecycling(V_SMALL, memory=warm.memory, top_k=3, update=update)
  spec = jspec.speculative_generate(target, drafter, [PROMPT] * ROWS, seed=2030, **shape_kw, **kw)
  hist = np.asarray(spec.stats.accept_hist)
  seen = hist[:3] if temperature == 1.0 else hist[:2]  # see test_distribution.assert_exact_counts
  assert np.all(seen > 0), f"acceptance not exercised: {hist}"
  tokens = np.asarray(spec.tokens)
  assert tokens.shape == (ROWS, NEW) and np.all(tokens >= 0)
  counts = np.bincount((tokens[:, 0] * V_SMALL + tokens[:, 1]) * V_SMALL + tokens[:, 2],
                       minlength=V_SMALL ** NEW)
  assert_counts_match(counts, _exact(target, temperature, top_k), f"token recycling, {shape}")
