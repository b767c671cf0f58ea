"""Tree verification: topologies, exact acceptance over a tree, K/V compaction.

Exactness follows docs/architecture.md: greedy tree output equals greedy baseline output (up
to near-ties); the whole-sequence distribution of tree decoding at temperature 1,
with two children per node, matches enumeration; after a tree round the target's
cache equals the cache of feeding the accepted tokens as a chain.
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import decode, tree as tree_lib
from jspec.core.tree import Tree
from conftest import (assert_cache_equals_chain_prefill, assert_greedy_match, perturbed,
                      ragged_prompts, rounds_from_prompts, tiny_config)
from reference import assert_counts_match, processed_probs

BINARY = Tree.from_paths([(0, 0), (0, 1), (1, 0), (1, 1)])  # 7 nodes, 2 children per node
WIDE = Tree.from_paths([(0, 0, 0), (0, 1), (1, 0), (2,), (0, 0, 1)])


# ----------------------------------------------------------------------------- topology


def test_topology_from_paths():
  t = BINARY
  assert t.parents == (-1, 0, 0, 1, 1, 2, 2) and t.ranks == (0, 0, 1, 0, 1, 0, 1)
  np.testing.assert_array_equal(t.depths, [0, 1, 1, 2, 2, 2, 2])
  assert t.max_depth == 2 and t.num_nodes == 7
  assert t.level_slices == ((0, 1), (1, 3), (3, 7))
  np.testing.assert_array_equal(t.children[0], [1, 2])
  np.testing.assert_array_equal(t.children[2], [5, 6])
  np.testing.assert_array_equal(t.children[4], [-1, -1])
  # Node 6 = (1, 1): its path is root, node 2, node 6.
  np.testing.assert_array_equal(np.flatnonzero(t.ancestors[6]), [0, 2, 6])
  # Missing prefixes are added: (2,) implies nothing more, (0, 0, 1) needs (0,) and (0, 0).
  assert WIDE.num_nodes == 9 and WIDE.max_depth == 3


def test_chain_is_a_line():
  t = Tree.chain(4)
  assert t.parents == (-1, 0, 1, 2, 3) and t.max_depth == 4
  assert np.array_equal(t.ancestors, np.tril(np.ones((5, 5), bool)))


def test_best_first_expected_length():
  acc = [[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.1, 0.05]]
  t = Tree.best_first(acc, 8)
  assert t.num_nodes == 8
  # Every chosen node is worth at least every node left out whose parent was chosen.
  values = np.ones(t.num_nodes)
  for i in range(1, t.num_nodes):
    values[i] = values[t.parents[i]] * acc[t.depths[i] - 1][t.ranks[i]]
  assert abs(t.expected_length(acc) - values.sum()) < 1e-12
  for i in range(t.num_nodes):
    if t.depths[i] < 3:
      used = {t.ranks[c] for c in t.children[i] if c >= 0}
      for r in set(range(3)) - used:
        assert values[i] * acc[t.depths[i]][r] <= values[1:].min() + 1e-12
  # A bigger budget never expects fewer tokens; the chain expects 1 + .6 + .3 + .12.
  assert Tree.best_first(acc, 16).expected_length(acc) > t.expected_length(acc)
  assert abs(Tree.chain(3).expected_length(acc) - (1 + 0.6 + 0.3 + 0.12)) < 1e-12


@pytest.mark.parametrize("parents,ranks,match", [
    ((0, 0), (0, 0), "parents\\[0\\] must be -1"),
    ((-1,), (0,), "at least one candidate"),
    ((-1, 0, 0), (0, 0, 0), "already has a child of rank 0"),
    ((-1, 0, 2), (0, 0, 0), "parent 2 must lie"),
    ((-1, 0, 1, 0), (0, 0, 0, 1), "ordered by depth"),
    ((-1, 0), (0, -1), "rank -1"),
])
def test_bad_topologies(parents, ranks, match):
  with pytest.raises(ValueError, match=match):
    Tree(parents=parents, ranks=ranks)


# ----------------------------------------------------------------------------- acceptance


def test_greedy_acceptance_takes_deepest_matching_path():
  V = 8
  argmax = np.array([3, 5, 1, 2, 6, 0, 4])  # target argmax at each node of BINARY
  logits = jax.nn.one_hot(jnp.asarray(argmax)[None], V)
  # Root's argmax is 3: node 2 (rank 1) holds 3, node 1 does not; under node 2 the
  # argmax is 1, held by node 6.
  cands = jnp.asarray([[4, 3, 0, 0, 7, 1]], jnp.int32)
  node, nxt = tree_lib.accept_greedy(logits, cands, BINARY)
  assert int(node[0]) == 6 and int(nxt[0]) == argmax[6]
  np.testing.assert_array_equal(tree_lib.path_nodes(node, BINARY)[0], [0, 2, 6])
  # Nothing matches: the root's argmax comes next, path is the root alone.
  node, nxt = tree_lib.accept_greedy(logits, jnp.asarray([[0, 1, 0, 0, 0, 0]]), BINARY)
  assert int(node[0]) == 0 and int(nxt[0]) == 3
  np.testing.assert_array_equal(tree_lib.path_nodes(node, BINARY)[0], [0, 1, 2])


def test_sampled_acceptance_first_token_follows_p():
  """Whatever the candidates, the first emitted token follows the root's p, and the
  second follows p at the accepted child given the first."""
  V, rows = 5, 40_000
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(V), size=BINARY.num_nodes).astype(np.float32)  # [N, V]
  cands = np.array([1, 3, 0, 2, 4, 1], np.int32)  # children of root: 1 and 3
  P = jnp.broadcast_to(jnp.asarray(p)[None], (rows, BINARY.num_nodes, V))
  C = jnp.broadcast_to(jnp.asarray(cands)[None], (rows, BINARY.num_nodes - 1))
  keys = jax.vmap(jax.random.key)(jnp.arange(rows, dtype=jnp.int32))
  node, nxt = jax.jit(tree_lib.accept_sampled, static_argnums=2)(P, C, BINARY, keys)
  node, nxt = np.asarray(node), np.asarray(nxt)
  tokens = np.concatenate([[0], cands])
  depth_one = np.where(node <= 2, node, np.asarray(BINARY.parents)[node])  # depth-1 ancestor
  first = np.where(node == 0, nxt, tokens[depth_one])
  assert_counts_match(np.bincount(first, minlength=V), p[0].astype(np.float64), "first token")
  # Given the first token was child 1's token (1), the second follows p at node 1.
  sel = (node == 1) | (node == 3) | (node == 4)
  second = np.where(node[sel] == 1, nxt[sel], tokens[node[sel]])
  assert_counts_match(np.bincount(second, minlength=V), p[1].astype(np.float64), "second token")


# ----------------------------------------------------------------------------- decoding


@pytest.fixture(scope="module")
def gqa_target():
  return jspec.models.init(tiny_config(), seed=0)


@pytest.mark.parametrize("topology", [BINARY, pytest.param(WIDE, marks=pytest.mark.slow),
                                      pytest.param(Tree.chain(3), marks=pytest.mark.slow)],
                         ids=["binary", "wide", "chain3"])
@pytest.mark.parametrize("batch,kv_heads", [(1, 2), pytest.param(3, 4, marks=pytest.mark.slow)],
                         ids=["b1-gqa", "b3-mha"])
def test_greedy_tree_equals_baseline(topology, batch, kv_heads):
  target = jspec.models.init(tiny_config(kv_heads=kv_heads), seed=0)
  draft = perturbed(target, 0.2, seed=7)
  prompts = ragged_prompts(batch, 64, seed=batch + 10 * kv_heads)
  base = jspec.generate(target, prompts, max_new_tokens=24)
  spec = jspec.speculative_generate(target, draft, prompts, tree=topology, max_new_tokens=24)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(spec.tokens))
  np.testing.assert_array_equal(spec.lengths, 24)
  hist = np.asarray(spec.stats.accept_hist)
  assert hist.shape == (topology.max_depth + 1,) and hist[1:].sum() > 0, hist
  assert int(hist.sum()) == int(np.sum(spec.stats.target_calls))


@pytest.mark.slow
def test_tree_accepts_more_than_its_chain(gqa_target):
  """Second choices rescue rounds where the draft's argmax is wrong: the binary tree
  emits more tokens per target call than the depth-2 chain on the same prompts."""
  draft = perturbed(gqa_target, 0.6, seed=5)
  prompts = ragged_prompts(8, 64, seed=3)
  tau = {}
  for name, t in (("chain", Tree.chain(2)), ("tree", BINARY)):
    out = jspec.speculative_generate(gqa_target, draft, prompts, tree=t, max_new_tokens=32)
    tau[name] = float(np.sum(out.lengths) / np.sum(out.stats.target_calls))
  assert tau["tree"] > tau["chain"], tau


@pytest.mark.slow
def test_compaction_equals_chain_prefill(gqa_target):
  """After a tree round, the target cache for every committed slot but the last
  equals the cache of feeding the committed tokens as a plain chain."""
  target = gqa_target
  draft = perturbed(target, 0.2, seed=1)
  drafter = jspec.DraftModel(draft)
  prompts = ragged_prompts(4, 64, seed=11, min_len=5)
  S = 64
  config = decode.DecodeConfig(num_draft_tokens=WIDE.max_depth, cache_length=S, tree=WIDE)
  state = rounds_from_prompts(target, drafter, prompts, config)
  assert np.asarray(state.stats.accepted).sum() > 0  # some paths went past the root
  assert_cache_equals_chain_prefill(target, state, S)


# ----------------------------------------------------------------------------- distribution

V = 6
NEW = 3
ROWS = 20_000
PROMPT = [1, 4]


def exact_distribution(model):
  pairs = list(itertools.product(range(V), repeat=NEW - 1))
  seqs = jnp.asarray([PROMPT + list(x) for x in pairs], jnp.int32)
  logits = np.asarray(model.logits(seqs), np.float64)
  P = len(PROMPT)
  probs = np.zeros((V,) * NEW)
  for row, (x1, x2) in enumerate(pairs):
    p1, p2, p3 = (processed_probs(logits[row, P - 1 + i], 1.0, 0) for i in range(3))
    probs[x1, x2, :] = p1[x1] * p2[x2] * p3
  return probs.reshape(-1)


@pytest.mark.slow
def test_tree_whole_sequence_distribution():
  """Temperature 1, two children per node: every emitted 3-token sequence follows
  the target's distribution, bin by bin over all 216 sequences."""
  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  target, draft = jspec.models.init(config, seed=21), jspec.models.init(config, seed=22)
  exact = exact_distribution(target)
  out = jspec.speculative_generate(target, draft, [PROMPT] * ROWS, tree=BINARY,
                                   max_new_tokens=NEW, temperature=1.0, seed=7)
  hist = np.asarray(out.stats.accept_hist)
  assert hist[0] > 0 and hist[1] > 0 and hist[2] > 0, f"acceptance not exercised: {hist}"
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (ROWS, NEW) and np.all(tokens >= 0)
  codes = (tokens[:, 0] * V + tokens[:, 1]) * V + tokens[:, 2]
  assert_counts_match(np.bincount(codes, minlength=V ** NEW), exact, "tree")


# ----------------------------------------------------------------------------- errors


def test_tree_errors(gqa_target):
  prompts = [[1, 2, 3]]
  with pytest.raises(ValueError, match="conflicts with the tree"):
    jspec.speculative_generate(gqa_target, gqa_target, prompts, tree=BINARY, num_draft_tokens=4,
                               max_new_tokens=4)
  class ChainOnly:  # a drafter with propose but no propose_tree
    vocab_size = 64

    def init(self, tokens, prompt_lengths, cache_length):
      return None

    def propose(self, state, context, num_drafts, params, keys):
      return jnp.zeros((context.lengths.shape[0], num_drafts), jnp.int32), None, state

  with pytest.raises(TypeError, match="cannot draft trees"):
    jspec.speculative_generate(gqa_target, ChainOnly(), prompts, tree=BINARY, max_new_tokens=4)
  with pytest.raises(TypeError, match="jspec.Tree"):
    jspec.speculative_generate(gqa_target, gqa_target, prompts, tree=(0, 1), max_new_tokens=4)
  with pytest.raises(ValueError, match="verify block of 7"):
    jspec.speculative_generate(gqa_target, gqa_target, prompts, tree=BINARY, max_new_tokens=4,
                               cache_length=12)


# ----------------------------------------------------------------------------- features


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Recorder:
  """A drafter that reads target features: it files every valid feature it is shown
  under its slot, and drafts the token that follows in a fixed text."""

  text: jax.Array  # [S] int32 the drafts come from here
  vocab_size: int = dataclasses.field(default=64, metadata=dict(static=True))
  feature_layers = ()  # a FeatureDrafter over the final hidden state

  def init(self, tokens, prompt_lengths, cache_length, features):
    B, P = tokens.shape
    seen = jnp.zeros((B, cache_length, features.shape[-1]), jnp.float32)
    # Prompt features: slots 0..P-2, valid below prompt_lengths - 1.
    slots = jnp.arange(P - 1)[None, :]
    ok = slots < (prompt_lengths - 1)[:, None]
    return seen.at[:, :P - 1].set(jnp.where(ok[..., None], features, 0.0))

  def _file(self, seen, context):
    F = context.features.shape[1]
    slots = context.feature_start[:, None] + jnp.arange(F)[None, :]  # [B, F]
    ok = (slots >= 0) & (slots <= (context.lengths - 2)[:, None])
    S = seen.shape[1]
    where = jnp.where(ok, slots, S)  # out of range: dropped
    return jax.vmap(lambda row, pos, val: row.at[pos].set(val, mode="drop"))(
        seen, where, context.features)

  def propose(self, seen, context, num_drafts, params, keys):
    seen = self._file(seen, context)
    idx = jnp.minimum(context.lengths[:, None] + jnp.arange(num_drafts)[None, :],
                      self.text.shape[0] - 1)
    return jnp.take(self.text, idx), None, seen

  def propose_tree(self, seen, context, tree, params, keys):
    seen = self._file(seen, context)
    depth = jnp.asarray(tree.depths[1:])[None, :]
    idx = jnp.minimum(context.lengths[:, None] - 1 + depth, self.text.shape[0] - 1)
    rank = jnp.asarray(tree.ranks[1:])[None, :]
    return (jnp.take(self.text, idx) + rank) % self.vocab_size, seen


@pytest.mark.parametrize("topology", [None, pytest.param(BINARY, marks=pytest.mark.slow)],
                         ids=["chain", "tree"])
def test_features_reach_the_drafter(gqa_target, topology):
  """Every target hidden state a feature drafter is shown is the full forward's
  hidden state at that slot, and every committed slot is shown at least once."""
  target = gqa_target
  prompts = ragged_prompts(3, 64, seed=5, min_len=2)
  base = jspec.generate(target, prompts, max_new_tokens=20)
  # Drafting the target's own greedy text makes most drafts land.
  text = np.asarray(base.tokens)[0]
  B, P = len(prompts), max(len(p) for p in prompts)
  tokens = np.zeros((B, P), np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
  rec = _Recorder(text=jnp.asarray(np.concatenate([tokens[0, :len(prompts[0])], text]), jnp.int32))
  K = 3 if topology is None else topology.max_depth
  config = decode.DecodeConfig(num_draft_tokens=K, cache_length=64, tree=topology)

  @jax.jit
  def run(tokens):
    state = decode.init_state(target, rec, tokens, lengths, jnp.full((B,), 20, jnp.int32),
                              None, jnp.asarray([-1], jnp.int32), jnp.zeros((B,), jnp.int32),
                              config)
    state = decode.decode_loop(target, rec, state, config)
    return state

  state = run(jnp.asarray(tokens))
  assert np.asarray(state.stats.accepted)[0] > 0
  L = np.asarray(state.lengths)
  _, hidden, _ = jax.jit(lambda t: target.apply(t, None, jnp.zeros((B,), jnp.int32)))(
      state.tokens[:, :int(L.max())])
  seen, hidden = np.asarray(state.drafter_state), np.asarray(hidden)
  for b in range(B):
    # The last round's features were never shown (no round followed): slots up to
    # the start of the final round's block.
    shown = np.flatnonzero(np.any(seen[b] != 0, axis=-1))
    assert shown.size >= L[b] - 1 - (K + 1), (b, shown.size, L[b])
    np.testing.assert_array_equal(shown, np.arange(shown.size))  # no gaps
    np.testing.assert_allclose(seen[b, shown], hidden[b, shown], rtol=1e-4, atol=1e-4)


def test_top_ranked_matches_a_sort():
  logits = jax.random.normal(jax.random.key(0), (3, 5, 50))
  got = np.asarray(tree_lib.top_ranked(logits, 4))
  want = np.argsort(-np.asarray(logits), axis=-1, kind="stable")[..., :4]
  np.testing.assert_array_equal(got, want)
  # Ties go to the lowest id, as greedy_tokens does: rank 0 is the argmax.
  tied = jnp.zeros((1, 6)).at[0, 4].set(1.0)
  np.testing.assert_array_equal(tree_lib.top_ranked(tied, 3)[0], [4, 0, 1])


@pytest.mark.slow
@pytest.mark.parametrize("topology", [None, BINARY], ids=["eagle-chain-sampled-q", "eagle-tree"])
def test_feature_drafter_whole_sequence_distribution(topology):
  """A random EAGLE head on a tiny target, temperature 1: as a chain it samples its
  drafts and passes q (the residual path of chain acceptance); as a tree its ranked
  candidates go through tree acceptance. Both emit the target's distribution."""
  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  target = jspec.models.init(config, seed=21)
  head = jspec.drafters.eagle.init_params(jspec.drafters.eagle.EagleConfig.for_target(config), jax.random.key(3))
  head = jax.tree_util.tree_map(lambda x: x * 3.0, head)  # peaked drafts, often wrong
  eagle = jspec.Eagle.from_target(target, head)
  exact = exact_distribution(target)
  kw = dict(num_draft_tokens=2) if topology is None else dict(tree=topology)
  out = jspec.speculative_generate(target, eagle, [PROMPT] * ROWS, max_new_tokens=NEW,
                                   temperature=1.0, seed=11, **kw)
  hist = np.asarray(out.stats.accept_hist)
  assert hist[0] > 0 and hist[1] > 0 and hist[2] > 0, f"acceptance not exercised: {hist}"
  tokens = np.asarray(out.tokens)
  codes = (tokens[:, 0] * V + tokens[:, 1]) * V + tokens[:, 2]
  assert_counts_match(np.bincount(codes, minlength=V ** NEW), exact, "eagle")
