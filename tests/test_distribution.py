"""Whole-sequence distributions by enumeration on a tiny vocabulary (docs/architecture.md).

Vocabulary 6, 3 new tokens: all 216 continuations are enumerated and their exact
probabilities under the target's processed distribution computed from full
forward passes. Many independent rows (one random stream each) are sampled by
speculative and by baseline decoding, and the counts are checked bin by bin and
with a chi-square bound. A draft that differs from the target is used, so that
rejections and residual samples really happen.
"""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import tiny_config
from reference import assert_counts_match, chi_square_ok, processed_probs

V = 6
NEW = 3
ROWS = 20_000
PROMPT = [1, 4]


@pytest.fixture(scope="module")
def pair():
  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  return jspec.models.init(config, seed=21), jspec.models.init(config, seed=22)


def exact_distribution(model, temperature, top_k, prompt=None):
  """P(x1 x2 x3 | prompt) for all V**3 sequences, flattened in base-V order (prompt:
  PROMPT unless given)."""
  prompt = PROMPT if prompt is None else prompt
  pairs = list(itertools.product(range(V), repeat=NEW - 1))
  seqs = jnp.asarray([list(prompt) + list(x) for x in pairs], jnp.int32)
  logits = np.asarray(model.logits(seqs), np.float64)  # [V*V, P+2, V]
  P = len(prompt)
  probs = np.zeros((V,) * NEW)
  for row, (x1, x2) in enumerate(pairs):
    p1 = processed_probs(logits[row, P - 1], temperature, top_k)
    p2 = processed_probs(logits[row, P], temperature, top_k)
    p3 = processed_probs(logits[row, P + 1], temperature, top_k)
    probs[x1, x2, :] = p1[x1] * p2[x2] * p3
  return probs.reshape(-1)


def sequence_counts(tokens):
  tokens = np.asarray(tokens)
  assert tokens.shape == (ROWS, NEW) and np.all(tokens >= 0)
  codes = (tokens[:, 0] * V + tokens[:, 1]) * V + tokens[:, 2]
  return np.bincount(codes, minlength=V ** NEW)


def assert_exact_counts(spec, exact, what, full_runs=True):
  """Every acceptance count 0..2 happened (the test exercises acceptance and rejection),
  and the sampled sequences follow the exact distribution.

  full_runs=False: a run of both drafts need not be among the counts. The counters hold
  emitted drafts only, and with 3 new tokens a full run is emitted only from the first
  round (a later one is cut by max_new_tokens); drafters whose first-round drafts are
  often wrong (lookup drafters at T = 0.7 with top-3) may never emit one."""
  hist = np.asarray(spec.stats.accept_hist)
  seen = hist[:3] if full_runs else hist[:2]
  assert np.all(seen > 0), f"{what}: acceptance not exercised: {hist}"
  assert_counts_match(sequence_counts(spec.tokens), exact, what)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_whole_sequence_distribution(pair, temperature, top_k):
  target, draft = pair
  exact = exact_distribution(target, temperature, top_k)
  prompts = [PROMPT] * ROWS
  kw = dict(max_new_tokens=NEW, temperature=temperature, top_k=top_k, seed=2024)

  spec = jspec.speculative_generate(target, draft, prompts, num_draft_tokens=2, **kw)
  assert_exact_counts(spec, exact, "speculative")

  base = jspec.generate(target, prompts, **kw)
  assert_counts_match(sequence_counts(base.tokens), exact, "baseline")

  # Power check: sequences sampled from the draft are rejected as target samples.
  from_draft = jspec.generate(draft, prompts, **kw)
  assert not chi_square_ok(sequence_counts(from_draft.tokens), exact)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_reduced_vocabulary_draft_keeps_the_distribution(pair, temperature, top_k):
  """A draft that scores only 4 of the 6 ids (FR-Spec): its q is zero at ids 1 and 4,
  which the target still emits through the residual, with the target's exact
  probabilities."""
  target, _ = pair
  exact = exact_distribution(target, temperature, top_k)
  # A peaked draft: q far from uniform over the set, so a q that is not the one the
  # drafts were drawn from would show in the counts.
  draft = jspec.models.init(tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1,
                                        scale=1.0), seed=23)
  reduced = jspec.DraftModel.reduced(draft, [0, 2, 3, 5])
  kw = dict(max_new_tokens=NEW, temperature=temperature, top_k=top_k, seed=2025)
  spec = jspec.speculative_generate(target, reduced, [PROMPT] * ROWS, num_draft_tokens=2, **kw)
  hist = np.asarray(spec.stats.accept_hist)
  assert hist[0] > 0 and hist[1] > 0 and hist[2] > 0, f"acceptance not exercised: {hist}"
  counts = sequence_counts(spec.tokens)
  outside = np.isin(np.arange(V), [1, 4])
  # Sequences through the ids the draft never proposes carry real mass here.
  through = np.array([outside[a] or outside[b] or outside[c]
                      for a, b, c in itertools.product(range(V), repeat=NEW)])
  assert exact[through].sum() > 0.2 and counts[through].sum() > 0.2 * ROWS
  assert_counts_match(counts, exact, "reduced-vocabulary speculative")


@pytest.mark.slow
@pytest.mark.parametrize("layers", [(), (0, 0)], ids=["eagle1", "eagle3"])
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_reduced_vocabulary_eagle_keeps_the_distribution(pair, temperature, top_k, layers):
  """An EAGLE head drafting over 4 of the 6 ids: the same exactness, through the
  feature drafter's sampled chain (q spread over V, zero at ids 1 and 4). EAGLE-3:
  the head fuses target layer outputs (the one layer twice: a [2D, D] fusion) and
  normalises its own outputs before the LM head."""
  import jax
  from jspec.drafters import eagle as E
  target, _ = pair
  exact = exact_distribution(target, temperature, top_k)
  config = E.EagleConfig.for_target(target.config, feature_layers=layers)
  head = E.init_params(config, jax.random.key(3))
  head = jax.tree_util.tree_map(lambda x: x * 3.0, head)  # peaked drafts, often wrong
  reduced = jspec.Eagle.from_target(target, head, config).reduced([0, 2, 3, 5])
  spec = jspec.speculative_generate(target, reduced, [PROMPT] * ROWS, num_draft_tokens=2,
                                    max_new_tokens=NEW, temperature=temperature, top_k=top_k,
                                    seed=2026)
  assert_exact_counts(spec, exact, "reduced-vocabulary EAGLE")


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_mtp_module_keeps_the_distribution(pair, temperature, top_k):
  """An MTP module (`jspec.MTP`: normed inputs, a Qwen3 layer, a final norm fed back as the
  next step's hidden state) with peaked, often wrong drafts: sampled chains (q from the
  module's processed distribution) and a static tree (candidates by rank) follow the target's
  distribution."""
  import jax
  from jspec.drafters import eagle as E
  from jspec.drafters.mtp import mtp_config
  target, _ = pair
  exact = exact_distribution(target, temperature, top_k)
  config = mtp_config(target.config, qk_norm=True)
  params = jax.tree_util.tree_map(lambda x: x * 3.0, E.init_params(config, jax.random.key(4)))
  module = jspec.MTP.from_target(target, params, config)
  kw = dict(max_new_tokens=NEW, temperature=temperature, top_k=top_k)
  tree = jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0), (2,)])
  for name, shape in (("chain", dict(num_draft_tokens=2)), ("tree", dict(tree=tree))):
    spec = jspec.speculative_generate(target, module, [PROMPT] * ROWS, seed=2031, **shape, **kw)
    assert_exact_counts(spec, exact, f"MTP, {name}")


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_suffix_drafter_with_memory_keeps_the_distribution(pair, temperature, top_k):
  """Suffix drafting from a memory of earlier outputs (deterministic, frequency-chosen
  drafts that are often wrong): the counts follow the target's distribution."""
  from jspec.drafters.suffix import Suffix, SuffixMemory, remember
  target, _ = pair
  exact = exact_distribution(target, temperature, top_k)
  earlier = jnp.asarray([[4, 2, 3, 1, 4, 2], [4, 0, 5, 1, 4, 2], [1, 4, 5, 5, 4, 2]], jnp.int32)
  memory = remember(SuffixMemory.empty(32), earlier, jnp.asarray([6, 6, 6]))
  drafter = Suffix(V, memory=memory, min_prob=0.0)
  kw = dict(max_new_tokens=NEW, temperature=temperature, top_k=top_k)
  # A chain, and a tree of the most frequent continuations (siblings, placeholders).
  tree = jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0), (2,)])
  for name, shape in (("chain", dict(num_draft_tokens=2)), ("tree", dict(tree=tree))):
    spec = jspec.speculative_generate(target, drafter, [PROMPT] * ROWS, seed=2028, **shape, **kw)
    assert_exact_counts(spec, exact, f"suffix drafting, {name}", full_runs=temperature == 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 3)], ids=["t1", "t0.7-top3"])
def test_lookahead_keeps_the_distribution(pair, temperature, top_k):
  """Lookahead decoding: candidates from the pool (prompt n-grams, then the Jacobi
  window's argmaxes, which ignore the sampling settings) verified as a tree of chains
  beside the side branch: the counts follow the target's distribution."""
  target, _ = pair
  prompt = [1, 4, 2, 1, 4, 0, 1, 4]  # "1 4" continues two ways: candidates from round one
  exact = exact_distribution(target, temperature, top_k, prompt=prompt)
  drafter = jspec.Lookahead(V, window=2, ngram=3, guesses=2)
  spec = jspec.speculative_generate(target, drafter, [prompt] * ROWS, num_draft_tokens=2,
                                    max_new_tokens=NEW, temperature=temperature, top_k=top_k,
                                    seed=2029)
  assert_exact_counts(spec, exact, "lookahead", full_runs=temperature == 1.0)
