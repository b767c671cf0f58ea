"""EAGLE-3 heads with speculators' options (`EagleConfig.num_layers`, `norm_before_fc`,
`fc_norm`, `norm_output`, `sliding_window` / `window_layers`): drafting through the cache
(chains with random acceptance, static trees, whose slots are not their positions) equals a
cache-free recompute, the options change the drafts, greedy decoding through the loop equals
the target's own, save/load keeps them, and bad option sets are refused. Parity with
speculators' own Eagle3DraftModel: tests/test_drafter_parity.py (slow lane)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core.drafter import DraftContext, target_for
from jspec.drafters import eagle as E
from jspec.training import train_eagle as TE
from conftest import numpy_drawn_target

V, K, S = 40, 3, 48
LAYERS = (0, 1, 1)
# A window of 2 positions: the window layers of a tree's deeper nodes see fewer keys than
# their slots would suggest (a node's slot is past its position), so a window counted in
# slots would draft otherwise.
OPTIONS = {
    "three layers": dict(num_layers=3),
    "norm_before_fc": dict(norm_before_fc=True),
    "fc_norm": dict(fc_norm=True),
    "norm_output": dict(norm_output=True, num_layers=2),
    "sliding window": dict(num_layers=3, sliding_window=2, window_layers=(0, 2)),
    "all": dict(num_layers=3, fc_norm=True, norm_output=True, sliding_window=2,
                window_layers=(1,), qk_norm=True, norm_before_residual=True),
}


@pytest.fixture(scope="module")
def target():
  return numpy_drawn_target(V)


def head(target, seed=1, **options):
  """A random published-form EAGLE-3 head (speculators' layer: concat input, no zero pair)
  with `options`; its norms drawn around 1, so that each one matters."""
  cfg = E.EagleConfig.for_target(target.config, initializer_range=0.3, feature_layers=LAYERS,
                                 input_form="concat", zero_pair=False, **options)
  params = E.init_params(cfg, jax.random.key(seed))
  rng = np.random.default_rng(seed)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: (x + 0.2 * rng.standard_normal(x.shape).astype(np.float32)
                       if "scale" in jax.tree_util.keystr(path) else x), params)
  return E.Eagle.from_target(target, params, cfg)


@pytest.fixture(scope="module")
def sequences(target):
  """Token rows [3, 40] and the target's fused features over them [3, 40, 3 D]."""
  tokens = np.random.default_rng(0).integers(0, V, size=(3, 40)).astype(np.int32)
  probe = head(target)
  feats, _ = jax.jit(TE.target_features)(target_for(target, probe), jnp.asarray(tokens))
  return tokens, np.asarray(feats)


_init = jax.jit(lambda e, t, l, f: e.init(t, l, S, f))
_propose = jax.jit(lambda e, st, ctx, k: e.propose(st, ctx, k, None, None), static_argnums=3)
_propose_tree = jax.jit(lambda e, st, ctx, tree: e.propose_tree(st, ctx, tree, None, None),
                        static_argnums=3)


@jax.jit
def _plain(eagle, feats, toks):
  """The head over pairs (feats[j], toks[j]) at positions 0..T-1, no cache."""
  T = toks.shape[1]
  pos = jnp.arange(T, dtype=jnp.int32)[None]
  out, _ = eagle.forward(eagle.params, feats, toks, None, pos, pos,
                         jnp.tril(jnp.ones((T, T), bool))[None])
  return eagle.draft_scores(out)[0], out[0]


def reference_chain(eagle, tokens_row, feats_row, L, drafts):
  """The draft scores before each of `drafts` by full recompute: committed pairs
  (fuse(h_{j-1}), t_j) (slot 0: zeros), then (f^ previous, d_i); padded to one width."""
  D = eagle.config.hidden_size
  fused = np.asarray(eagle.fuse(eagle.params, jnp.asarray(feats_row)))
  feats = [np.zeros(D, np.float32)] + [fused[j - 1] for j in range(1, L)]
  toks = list(tokens_row[:L])
  scores = []
  for d in list(drafts) + [None]:
    n = len(toks)
    f = np.zeros((1, 64, D), np.float32)
    f[0, :n] = np.stack(feats)
    t = np.zeros((1, 64), np.int32)
    t[0, :n] = toks
    s, out = _plain(eagle, jnp.asarray(f), jnp.asarray(t))
    scores.append(np.asarray(s[n - 1]))
    if d is not None:
      feats.append(np.asarray(out[n - 1]))
      toks.append(int(d))
  return scores


def to_target(eagle, index):
  return int(index) if eagle.ids is None else int(np.asarray(eagle.ids)[index])


def context(tokens, feats, L, fs, F, rng):
  """The loop's context: committed tokens then junk, features fs..fs+F-1 (junk where no
  valid entry)."""
  B = tokens.shape[0]
  buf = rng.integers(0, V, size=(B, S)).astype(np.int32)
  f = rng.normal(size=(B, F, feats.shape[2])).astype(np.float32) * 3
  for b in range(B):
    buf[b, :L[b]] = tokens[b, :L[b]]
    for j in range(F):
      if 0 <= fs[b] + j <= L[b] - 2:
        f[b, j] = feats[b, fs[b] + j]
  return DraftContext(tokens=jnp.asarray(buf), lengths=jnp.asarray(L, jnp.int32),
                      features=jnp.asarray(f), feature_start=jnp.asarray(fs, jnp.int32))


def start(eagle, tokens, feats, lengths, rng):
  P = 16
  prompt = rng.integers(0, V, size=(3, P)).astype(np.int32)
  f = rng.normal(size=(3, P - 1, feats.shape[2])).astype(np.float32)
  for b in range(3):
    prompt[b, :lengths[b]] = tokens[b, :lengths[b]]
    f[b, :lengths[b] - 1] = feats[b, :lengths[b] - 1]
  return _init(eagle, jnp.asarray(prompt), jnp.asarray(lengths, jnp.int32), jnp.asarray(f))


# "all" holds every option but norm_before_fc (exclusive with fc_norm); the single options
# run in the slow lane.
FAST = ("all", "norm_before_fc", "sliding window")


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow)
                                  for n in OPTIONS])
def test_chain_rounds_equal_a_plain_recompute(target, sequences, name):
  """Rounds with random acceptance and junk in every invalid entry: every layer's cache and
  the window's positions carried across rounds give the drafts a cache-free pass gives."""
  eagle = head(target, **OPTIONS[name])
  tokens, feats = sequences
  rng = np.random.default_rng(2)
  F = K + 1
  L = np.array([1, 2, 9])
  state = start(eagle, tokens, feats, L, rng)
  assert set(state) == ({"k", "v"} | {f"{kv}{i}" for i in range(1, eagle.config.num_layers)
                                      for kv in "kv"}
                        | ({"pos"} if eagle.config.window_layers else set()))
  fs = L - 1 - F
  for _ in range(4):
    drafts, _, state = _propose(eagle, state, context(tokens, feats, L, fs, F, rng), K)
    for b in range(3):
      scores = reference_chain(eagle, tokens[b], feats[b], int(L[b]), np.asarray(drafts[b]))
      assert [to_target(eagle, np.argmax(s)) for s in scores[:K]] == \
          np.asarray(drafts[b]).tolist(), f"{name}: row {b} at L={L[b]}"
    n = rng.integers(0, K + 1, size=3)
    fs, L = L - 1, L + n + 1


@pytest.mark.parametrize("name", ["sliding window", "all"])
def test_tree_candidates_follow_each_parents_recompute(target, sequences, name):
  """A static tree of depth 4 under a window of 2 positions: each node's token is the
  ranked choice of the cache-free recompute of its path (the window counts positions, which
  the cache keeps beside the keys, not slots)."""
  eagle = head(target, **OPTIONS[name])
  tokens, feats = sequences
  rng = np.random.default_rng(4)
  # Node 7 (depth 3, position root + 3, fed: node 8 hangs under it) has its ancestor node 2 at
  # slot root + 2 but position root + 1: outside a window of 2 positions, inside one counted
  # in slots.
  tree = jspec.Tree(parents=(-1, 0, 0, 1, 1, 2, 3, 5, 7), ranks=(0, 0, 1, 0, 2, 0, 0, 0, 0))
  F = tree.max_depth + 1
  L = np.array([1, 5, 8])
  state = start(eagle, tokens, feats, L, rng)
  fs = L - 1 - F
  for _ in range(2):
    candidates, state = _propose_tree(eagle, state, context(tokens, feats, L, fs, F, rng), tree)
    cand = np.asarray(candidates)
    for b in range(3):
      for i in range(1, tree.num_nodes):
        path, node = [], tree.parents[i]
        while node > 0:
          path.append(int(cand[b, node - 1]))
          node = tree.parents[node]
        scores = reference_chain(eagle, tokens[b], feats[b], int(L[b]), path[::-1])[-1]
        ranked = np.argsort(-scores, kind="stable")
        assert cand[b, i - 1] == to_target(eagle, ranked[tree.ranks[i]]), \
            f"{name}: row {b} node {i}"
    fs, L = L - 1, L + rng.integers(0, tree.max_depth + 1, size=3) + 1


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_each_option_changes_the_drafts(target, sequences):
  """No option is a no-op: the scores of a chain differ from those of the same params read
  without it (the window: with it hidden, i.e. every layer seeing everything)."""
  tokens, feats = sequences
  for name, options in OPTIONS.items():
    eagle = head(target, **options)
    scores = reference_chain(eagle, tokens[2], feats[2], 12, [3, 4])
    for flag in ("norm_before_fc", "fc_norm", "norm_output", "window_layers"):
      if not options.get(flag):
        continue
      off = {"window_layers": dict(window_layers=(), sliding_window=None)}.get(flag, {flag: False})
      plain = dataclasses.replace(eagle, config=dataclasses.replace(eagle.config, **off))
      other = reference_chain(plain, tokens[2], feats[2], 12, [3, 4])
      assert not np.allclose(np.stack(scores), np.stack(other), atol=1e-3), f"{name}: {flag}"


def _greedy_runs(target, shapes):
  """A three-layer head with every option (but norm_before_fc) decodes to the target's own
  greedy output in each of `shapes`; returns the drafts accepted in all."""
  eagle = head(target, **OPTIONS["all"])
  prompts = [[3, 1, 4, 1, 5], [9], [2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
  ref = np.asarray(jspec.generate(target, prompts, max_new_tokens=24, eos_id=()).tokens)
  accepted = 0
  for shape in shapes:
    out = jspec.speculative_generate(target, eagle, prompts, max_new_tokens=24, eos_id=(),
                                     **shape)
    np.testing.assert_array_equal(np.asarray(out.tokens), ref, err_msg=str(shape))
    accepted += int(np.sum(np.asarray(out.stats.accepted)))
  return accepted


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_greedy_equality_through_the_decode_loop(target):
  """A chain of 3 and a static tree: the target's own greedy output, with some drafts accepted
  (the loop's rewinds and the cache's hand-over exercised)."""
  tree = jspec.Tree(parents=(-1, 0, 0, 1, 1, 2, 3), ranks=(0, 0, 1, 0, 1, 0, 0))
  assert _greedy_runs(target, [dict(num_draft_tokens=3), dict(tree=tree)]) > 0


@pytest.mark.slow  # two more programs
def test_greedy_equality_of_single_drafts_and_dynamic_trees(target):
  _greedy_runs(target, [dict(num_draft_tokens=1), dict(tree=jspec.DynamicTree(6, 3, 2))])


def test_options_survive_save_and_load(target, tmp_path):
  eagle = head(target, **OPTIONS["all"])
  E.save_eagle(eagle, tmp_path / "head")
  back = E.load_eagle(tmp_path / "head", target)
  assert back.config == eagle.config
  jax.tree_util.tree_map(np.testing.assert_array_equal, back.params, eagle.params)
  one = E.EagleConfig.for_target(target.config, feature_layers=LAYERS, input_form="concat")
  assert not {"num_layers", "norm_before_fc", "fc_norm", "norm_output", "sliding_window",
              "window_layers"} & set(one.to_dict())  # defaults stay out of jspec's files


@pytest.mark.parametrize("options,message", [
    (dict(num_layers=0), "num_layers must be an integer >= 1"),
    (dict(num_layers=2, input_form="fc"), "more than one decoder layer"),
    (dict(norm_before_fc=True, fc_norm=True), "exclude each other"),
    (dict(norm_output=True, feature_layers=()), "needs feature_layers"),
    (dict(sliding_window=4), "go together"),
    (dict(window_layers=(0,)), "go together"),
    (dict(sliding_window=0, window_layers=(0,)), "sliding_window must be an integer >= 1"),
    (dict(num_layers=2, sliding_window=4, window_layers=(2,)), "distinct layers"),
])
def test_bad_option_sets_are_refused(target, options, message):
  fields = {"feature_layers": LAYERS, "input_form": "concat", **options}
  if not fields["feature_layers"]:  # an EAGLE-1 head: jspec's own fc form
    fields["input_form"] = "fc"
  with pytest.raises(ValueError, match=message):
    E.EagleConfig.for_target(target.config, **fields)
