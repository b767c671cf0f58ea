"""Repetition, presence and frequency penalties and the logit bias: the formulas against
NumPy, greedy speculative decoding equal to plain decoding, and whole-sequence
distributions by enumeration (docs/architecture.md)."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import penalties, programs, sampling
from conftest import ragged_prompts, tiny_config
from reference import (assert_counts_match, chi_square_ok, penalized_logits, processed_probs)

BINARY = jspec.Tree.from_paths([(0, 0), (0, 1), (1, 0), (1, 1)])  # 7 nodes, 2 children each


def _params(B, V, rng):
  return sampling.SamplingParams(
      temperature=jnp.ones((B,), jnp.float32), top_k=jnp.zeros((B,), jnp.int32),
      top_p=jnp.ones((B,), jnp.float32),
      repetition_penalty=jnp.asarray(rng.choice([1.0, 1.3, 0.7], size=B), jnp.float32),
      presence_penalty=jnp.asarray(rng.choice([0.0, 0.5, -0.2], size=B), jnp.float32),
      frequency_penalty=jnp.asarray(rng.choice([0.0, 0.4], size=B), jnp.float32),
      logit_bias=jnp.asarray(rng.normal(size=(B, V)) * (rng.random((B, V)) < 0.2), jnp.float32))


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_penalized_logits_match_reference(shape):
  """Each verify position sees the committed output counts plus the drafts on its path
  (the drafts before it in a chain, its ancestors in a tree), and its logits follow
  vLLM's formulas for that history."""
  rng = np.random.default_rng(0)
  B, V, P = 5, 16, 6
  ancestors = (np.tril(np.ones((5, 5), bool)) if shape == "chain" else BINARY.ancestors)
  W = ancestors.shape[0]
  prompts = rng.integers(0, V, size=(B, P)).astype(np.int32)
  prompt_lengths = rng.integers(1, P + 1, size=B).astype(np.int32)
  outputs = [rng.integers(0, V, size=int(n)).tolist() for n in rng.integers(0, 6, size=B)]
  params = _params(B, V, rng)
  seen = penalties.init(params, jnp.asarray(prompts), jnp.asarray(prompt_lengths), V)
  for b, out in enumerate(outputs):  # commit the outputs, one row at a time, in two rounds
    half = len(out) // 2
    for part in (out[:half], out[half:]):
      emitted = np.zeros((B, 4), np.int32)
      emitted[b, :len(part)] = part
      count = np.zeros(B, np.int32)
      count[b] = len(part)
      seen = penalties.after_commit(seen, jnp.asarray(emitted), jnp.asarray(count))
  block = rng.integers(0, V, size=(B, W)).astype(np.int32)
  logits = rng.normal(size=(B, W, V)).astype(np.float32) * 2
  counts = penalties.block_counts(jnp.asarray(block), jnp.asarray(ancestors))
  got = np.asarray(penalties.apply(jnp.asarray(logits), params, seen, counts))
  for b in range(B):
    for n in range(W):
      path = [int(block[b, m]) for m in range(1, W) if ancestors[n, m]]
      want = penalized_logits(
          logits[b, n], prompts[b, :prompt_lengths[b]], outputs[b] + path,
          float(params.repetition_penalty[b]), float(params.presence_penalty[b]),
          float(params.frequency_penalty[b]), np.asarray(params.logit_bias[b]))
      np.testing.assert_allclose(got[b, n], want, rtol=1e-5, atol=1e-5,
                                 err_msg=f"row {b}, position {n}")


def _dense_block_counts(seen, block, ancestors):
  """The dense formula `block_counts` had before it went sparse: f32 [B, W, V]."""
  B, W = block.shape
  V = seen.counts.shape[-1]
  counts = seen.counts[:, None, :].astype(jnp.float32)
  ancestors = jnp.broadcast_to(ancestors, (B, W, W)).astype(jnp.float32)
  drafts = jax.nn.one_hot(block[:, 1:], V, dtype=jnp.float32)  # [B, W-1, V]
  return counts + jnp.einsum("bnm,bmv->bnv", ancestors[:, :, 1:], drafts)  # [B, W, V]


def _dense_apply(logits, params, seen, counts):
  """`apply` as it was, on dense counts [B, W, V]."""
  if params.logit_bias is not None:
    logits = logits + params.logit_bias[:, None, :].astype(logits.dtype)
  in_output = counts > 0.0
  if params.repetition_penalty is not None:
    r = params.repetition_penalty[:, None, None]
    repeated = seen.prompt[:, None, :] | in_output
    logits = jnp.where(repeated, jnp.where(logits > 0.0, logits / r, logits * r), logits)
  if params.frequency_penalty is not None:
    logits = logits - params.frequency_penalty[:, None, None] * counts
  if params.presence_penalty is not None:
    logits = logits - jnp.where(in_output, params.presence_penalty[:, None, None], 0.0)
  return logits


def _recycling_ancestors():
  from jspec.drafters.recycling import paper_tree
  return paper_tree().ancestors


@pytest.mark.parametrize("shape", ["chain", "tree", "recycling", "per_row"])
def test_sparse_counts_equal_the_dense_formula(shape):
  """The sparse path counts give bit for bit the logits of the dense [B, W, V] count they
  replaced, for each penalty alone and all together, with ids repeated along paths (V is
  small) and committed counts and prompts besides."""
  rng = np.random.default_rng(1)
  B, V = 4, 12
  if shape == "chain":
    ancestors = np.tril(np.ones((6, 6), bool))
  elif shape == "tree":
    ancestors = BINARY.ancestors
  elif shape == "recycling":
    ancestors = _recycling_ancestors()  # 81 nodes, depth 6
  else:  # a mask per row (dynamic trees): random lower-triangular, the diagonal set
    ancestors = np.tril(rng.random((B, 9, 9)) < 0.5) | np.eye(9, dtype=bool)[None]
  W = ancestors.shape[-2]
  block = jnp.asarray(rng.integers(0, V, size=(B, W)), jnp.int32)
  logits = jnp.asarray(rng.normal(size=(B, W, V)) * 2, jnp.float32)
  seen = penalties.Seen(counts=jnp.asarray(rng.integers(0, 3, size=(B, V)), jnp.int32),
                        prompt=jnp.asarray(rng.random((B, V)) < 0.3))
  full = dataclasses.replace(
      _params(B, V, rng), repetition_penalty=jnp.asarray([1.3, 0.7, 1.3, 2.0], jnp.float32),
      presence_penalty=jnp.asarray([0.5, -0.2, 0.5, 1.0], jnp.float32),
      frequency_penalty=jnp.asarray([0.4, 0.4, 0.1, 0.8], jnp.float32))
  settings = {
      "all": full,
      "repetition": dataclasses.replace(full, presence_penalty=None, frequency_penalty=None,
                                        logit_bias=None),
      "presence": dataclasses.replace(full, repetition_penalty=None, frequency_penalty=None,
                                      logit_bias=None),
      "frequency": dataclasses.replace(full, repetition_penalty=None, presence_penalty=None,
                                       logit_bias=None),
  }
  mask = jnp.asarray(ancestors)
  sparse = jax.jit(lambda l, p, s, b: penalties.apply(l, p, s, penalties.block_counts(b, mask)))
  dense = jax.jit(lambda l, p, s, b: _dense_apply(l, p, s, _dense_block_counts(s, b, mask)))
  for name, params in settings.items():
    got = np.asarray(sparse(logits, params, seen, block))
    want = np.asarray(dense(logits, params, seen, block))
    assert not np.array_equal(want, np.asarray(logits)), name  # the setting changed something
    np.testing.assert_array_equal(got, want, err_msg=f"{shape} {name}")


def test_wide_tree_penalties_form_no_vocabulary_sized_counts():
  """At the 81-node recycling tree the penalties' program allocates, besides its
  arguments and output, far less than one [B, W, V] f32 array: the drafts' counts are
  kept at the path's ids ([B, W, W-1]), not as a one-hot or a count over the vocabulary
  (which cost a [B, W, V] temporary or more; benchmarks/penalties_memory.py measures it at
  B = 64, V = 49,152)."""
  B, V = 2, 8192
  ancestors = jnp.asarray(_recycling_ancestors())
  W = ancestors.shape[0]
  row = jax.ShapeDtypeStruct((B,), jnp.float32)
  params = sampling.SamplingParams(
      temperature=row, top_k=jax.ShapeDtypeStruct((B,), jnp.int32), top_p=row,
      repetition_penalty=row, presence_penalty=row, frequency_penalty=row,
      logit_bias=jax.ShapeDtypeStruct((B, V), jnp.float32))
  seen = penalties.Seen(counts=jax.ShapeDtypeStruct((B, V), jnp.int32),
                        prompt=jax.ShapeDtypeStruct((B, V), jnp.bool_))
  compiled = jax.jit(
      lambda l, p, s, b: penalties.apply(l, p, s, penalties.block_counts(b, ancestors))).lower(
          jax.ShapeDtypeStruct((B, W, V), jnp.float32), params, seen,
          jax.ShapeDtypeStruct((B, W), jnp.int32)).compile()
  temporaries = compiled.memory_analysis().temp_size_in_bytes
  one_array = B * W * V * 4
  assert temporaries < one_array / 8, (temporaries, one_array)


PENALTIES = dict(repetition_penalty=[1.3, 1.0, 2.0], presence_penalty=[0.5, 1.5, 0.0],
                 frequency_penalty=[0.3, 0.0, 0.8],
                 logit_bias=[{3: 2.0, 7: -1.5}, None, {0: 0.5}])


@pytest.mark.parametrize("drafter,shape", [  # trees' compiles in the slow lane
    ("ngram", "chain"), ("model", "chain"), pytest.param("model", "tree", marks=pytest.mark.slow),
    pytest.param("ngram", "tree", marks=pytest.mark.slow)])
def test_greedy_speculative_equals_plain_with_penalties(target, close_draft, drafter, shape):
  """Greedy rows take the argmax of the penalised logits; speculative decoding, whose
  verify positions count the drafts before them, emits what plain decoding emits."""
  prompts = ragged_prompts(3, 64, seed=11)
  kw = dict(max_new_tokens=20, **PENALTIES)
  base = jspec.generate(target, prompts, **kw)
  plain = jspec.generate(target, prompts, max_new_tokens=20)
  assert not np.array_equal(base.tokens, plain.tokens), "the penalties changed nothing"
  draft = jspec.NGram(64) if drafter == "ngram" else close_draft
  how = dict(num_draft_tokens=3) if shape == "chain" else dict(tree=BINARY)
  spec = jspec.speculative_generate(target, draft, prompts, **how, **kw)
  np.testing.assert_array_equal(spec.tokens, base.tokens)
  if drafter == "model":  # drafts accepted in penalised rows: later positions counted them
    assert np.all(np.asarray(spec.stats.accepted)[[0, 2]] > 0), spec.stats.accepted


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_presence_penalty_forbids_repeats_under_speculation(target, close_draft):
  """A presence penalty of 1000 leaves no id twice in a row's output, even where a
  draft accepted in the same round repeats an earlier one; a bias of 1000 on one id
  makes it the only output otherwise."""
  prompts = ragged_prompts(4, 64, seed=3)
  for run in (lambda **kw: jspec.generate(target, prompts, **kw),
              lambda **kw: jspec.speculative_generate(target, close_draft, prompts,
                                                      num_draft_tokens=4, **kw)):
    out = np.asarray(run(max_new_tokens=30, presence_penalty=1000.0, temperature=[0, 0, 1, 1],
                         seed=0).tokens)
    for row in out:
      assert len(set(row.tolist())) == len(row), row
    out = np.asarray(run(max_new_tokens=10, logit_bias={9: 1000.0}, temperature=[0, 0, 1, 1],
                         seed=0).tokens)
    assert np.all(out == 9)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_no_penalties_no_counts(target, monkeypatch):
  """Settings that penalise nothing run the plain programs: all-greedy rows the static
  argmax one, and no row's tokens are counted."""
  seen = []
  program = programs.fixed

  def spy(target, drafter, tokens, lengths, max_new, params, *rest, **kw):
    seen.append(params)
    return program(target, drafter, tokens, lengths, max_new, params, *rest, **kw)

  monkeypatch.setattr(programs, "fixed", spy)
  prompts = [[1, 2, 3]]
  jspec.generate(target, prompts, max_new_tokens=3, repetition_penalty=1.0, presence_penalty=0.0)
  jspec.generate(target, prompts, max_new_tokens=3, repetition_penalty=1.1)
  jspec.generate(target, prompts, max_new_tokens=3, logit_bias={1: 1.0})
  assert seen[0] is None
  assert seen[1].penalized and seen[1].logit_bias is None
  assert not seen[2].penalized and seen[2].logit_bias.shape == (1, 64)


# ----------------------------------------------------------------------------- distributions

V = 6
NEW = 3
ROWS = 20_000
PROMPT = [1, 4, 4]


@pytest.fixture(scope="module")
def pair():
  config = tiny_config(vocab_size=V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  return jspec.models.init(config, seed=21), jspec.models.init(config, seed=22)


def exact_distribution(model, settings):
  """P(x1 x2 x3 | PROMPT) for all V**3 sequences under the penalised, processed
  distributions, each position counting the tokens before it."""
  pairs = list(itertools.product(range(V), repeat=NEW - 1))
  seqs = jnp.asarray([PROMPT + list(x) for x in pairs], jnp.int32)
  logits = np.asarray(model.logits(seqs), np.float64)  # [V*V, P+2, V]
  P = len(PROMPT)
  s = dict(settings)
  bias = None
  if s.get("logit_bias"):
    bias = np.zeros(V)
    for i, v in s["logit_bias"].items():
      bias[i] = v
  sample = [s.get(k, d) for k, d in (("temperature", 1.0), ("top_k", 0), ("top_p", 1.0),
                                      ("min_p", 0.0))]
  probs = np.zeros((V,) * NEW)
  for row, (x1, x2) in enumerate(pairs):
    p = [processed_probs(penalized_logits(logits[row, P - 1 + i], PROMPT, [x1, x2][:i],
                                          s.get("repetition_penalty", 1.0),
                                          s.get("presence_penalty", 0.0),
                                          s.get("frequency_penalty", 0.0), bias), *sample)
         for i in range(NEW)]
    probs[x1, x2, :] = p[0][x1] * p[1][x2] * p[2]
  return probs.reshape(-1)


def sequence_counts(tokens):
  tokens = np.asarray(tokens)
  assert tokens.shape == (ROWS, NEW) and np.all(tokens >= 0)
  return np.bincount((tokens[:, 0] * V + tokens[:, 1]) * V + tokens[:, 2], minlength=V ** NEW)


SETTINGS = {
    "t1-repetition": dict(temperature=1.0, repetition_penalty=2.0),
    "t0.7-top_p-presence": dict(temperature=0.7, top_p=0.8, presence_penalty=1.2),
    "t0.7-min_p-frequency": dict(temperature=0.7, min_p=0.1, frequency_penalty=1.0),
    "t1-all-bias": dict(temperature=1.0, top_p=0.9, min_p=0.05, repetition_penalty=1.5,
                        presence_penalty=0.5, frequency_penalty=0.5, logit_bias={2: 0.8, 5: -0.6}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETTINGS))
def test_whole_sequence_distribution_with_penalties(pair, name):
  """Speculative decoding (a draft model that differs from the target, and n-gram
  lookup, each as a chain and as a static tree) and plain decoding both follow the exact distribution of whole
  3-token sequences under the penalties; the penalties matter (the unpenalised
  distribution is rejected)."""
  target, draft = pair
  settings = SETTINGS[name]
  exact = exact_distribution(target, settings)
  kw = dict(max_new_tokens=NEW, **settings)
  prompts = [PROMPT] * ROWS
  for what, how in (("chain", dict(num_draft_tokens=2)), ("tree", dict(tree=BINARY))):
    spec = jspec.speculative_generate(target, draft, prompts, seed=2030, **how, **kw)
    hist = np.asarray(spec.stats.accept_hist)
    assert hist[0] > 0 and hist[1] > 0 and hist[2] > 0, f"acceptance not exercised: {hist}"
    assert_counts_match(sequence_counts(spec.tokens), exact, f"speculative {what}, {name}")
  # N-gram lookup: deterministic drafts (q one-hot) copied from the prompt's "4 4".
  ngram = jspec.NGram(V, max_ngram=2, drafts_per_ngram=None)
  for what, how in (("chain", dict(num_draft_tokens=2)), ("tree", dict(tree=BINARY))):
    spec = jspec.speculative_generate(target, ngram, prompts, seed=2032, **how, **kw)
    hist = np.asarray(spec.stats.accept_hist)
    assert hist[1:].sum() > 0, f"n-gram drafts never accepted: {hist}"
    assert_counts_match(sequence_counts(spec.tokens), exact, f"n-gram {what}, {name}")
  base = jspec.generate(target, prompts, seed=2031, **kw)
  counts = sequence_counts(base.tokens)
  assert_counts_match(counts, exact, f"plain, {name}")
  plain = {k: v for k, v in settings.items() if k in ("temperature", "top_p", "min_p")}
  assert not chi_square_ok(counts, exact_distribution(target, plain))
