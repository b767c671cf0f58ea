"""Processed distributions (temperature, min-p, top-k, top-p, greedy) against NumPy, and
the sort-free filters against the sort-based definition they replace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import sampling
from conftest import tiny_config
from reference import processed_probs, sorted_filter


def _params(t, k, p, m=None):
  return sampling.SamplingParams(temperature=jnp.asarray(t, jnp.float32),
                                 top_k=jnp.asarray(k, jnp.int32),
                                 top_p=jnp.asarray(p, jnp.float32),
                                 min_p=None if m is None else jnp.asarray(m, jnp.float32))


@pytest.mark.parametrize("vocab", [11, 64, 300])
def test_probabilities_match_reference(vocab):
  rng = np.random.default_rng(vocab)
  settings = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 3, 1.0, 0.0), (1.3, 0, 0.6, 0.0),
              (0.5, 5, 0.8, 0.0), (1.0, vocab + 5, 1.0, 0.0), (2.0, 1, 1.0, 0.0),
              (1.0, 0, 1e-6, 0.0), (1.0, 0, 1.0, 0.1), (0.8, 0, 0.9, 0.05), (1.5, 4, 0.7, 0.2),
              (3.0, 0, 0.99, 0.0), (3.0, 100, 0.95, 0.01), (1.0, 0, 1.0, 1.0)]
  t, k, p, m = map(list, zip(*settings))
  logits = rng.normal(size=(len(settings), 3, vocab)).astype(np.float32) * 2
  got = np.asarray(jax.jit(sampling.probabilities)(jnp.asarray(logits), _params(t, k, p, m)))
  for b, (tb, kb, pb, mb) in enumerate(settings):
    for n in range(3):
      want = processed_probs(logits[b, n], tb, kb, pb, mb)
      np.testing.assert_allclose(got[b, n], want, atol=2e-6, err_msg=f"row {settings[b]}")
      assert np.all(got[b, n][want == 0] == 0)


def _branch_spy(monkeypatch):
  """`probabilities`, compiled once, telling which of its branches ran at run time: each
  branch records itself with a callback, which runs only in the branch `lax.switch` takes.
  Returns run(logits, params) -> (probs, branches), a branch named "argmax" or
  (filtered, mixed)."""
  ran = []
  argmax, processed = sampling._one_hot_argmax, sampling._processed

  def spy_argmax(logits, params):
    jax.debug.callback(lambda: ran.append("argmax"))
    return argmax(logits, params)

  def spy_processed(logits, params, filtered, mixed):
    jax.debug.callback(lambda: ran.append((filtered, mixed)))
    sampling._one_hot_argmax = argmax  # a mixed branch's greedy rows are not the argmax branch
    try:
      return processed(logits, params, filtered, mixed)
    finally:
      sampling._one_hot_argmax = spy_argmax

  monkeypatch.setattr(sampling, "_one_hot_argmax", spy_argmax)
  monkeypatch.setattr(sampling, "_processed", spy_processed)
  # A fresh function, so that jit traces the spies rather than reusing a program.
  compiled = jax.jit(lambda l, p: sampling.probabilities(l, p))

  def run(logits, params):
    ran.clear()
    probs = np.asarray(compiled(jnp.asarray(logits), params))
    jax.effects_barrier()
    return probs, list(ran)

  return run


def test_unfiltered_batch_skips_the_filters_but_agrees(monkeypatch):
  """A batch with no top-k, top-p or min-p runs the softmax branch, not the filters (and a
  filtered, a mixed and an all-greedy batch each run theirs), with the reference's numbers."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 1, 11)).astype(np.float32)
  run = _branch_spy(monkeypatch)
  got, ran = run(logits, _params([1.0, 0.5], [0, 0], [1.0, 1.0]))
  assert ran == [(False, False)]  # unfiltered, no greedy row
  for b, t in enumerate([1.0, 0.5]):
    np.testing.assert_allclose(got[b, 0], processed_probs(logits[b, 0], t), atol=2e-6)
  # The spy tells the branches apart: filtered batches, a mixed one and an all-greedy one.
  for (t, k, p), branch in ((([1.0, 0.5], [3, 0], [1.0, 1.0]), (True, False)),
                            (([1.0, 0.5], [0, 0], [1.0, 0.9]), (True, False)),
                            (([0.0, 0.5], [0, 0], [1.0, 1.0]), (False, True)),
                            (([0.0, 0.5], [0, 4], [1.0, 1.0]), (True, True)),
                            (([0.0, 0.0], [3, 0], [0.5, 1.0]), "argmax")):
    got, ran = run(logits, _params(t, k, p))
    assert ran == [branch], (t, k, p, ran)
    for b in range(2):
      np.testing.assert_allclose(got[b, 0], processed_probs(logits[b, 0], t[b], k[b], p[b]),
                                 atol=2e-6)


def test_sample_never_draws_zero_probability():
  probs = np.zeros((4000, 7), np.float32)
  probs[:, [1, 4]] = [0.25, 0.75]
  keys = sampling.row_keys(jnp.arange(4000, dtype=jnp.int32))
  draws = np.asarray(sampling.sample(keys, jnp.asarray(probs)))
  assert set(np.unique(draws)) == {1, 4}
  assert abs(np.mean(draws == 4) - 0.75) < 6 * np.sqrt(0.75 * 0.25 / 4000)


def test_static_greedy_params_none_is_one_hot():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(3, 2, 11)).astype(np.float32)
  logits[0, 0, [2, 7]] = 9.0  # a tie: the lowest id, as with per-row temperature 0
  got = np.asarray(jax.jit(sampling.probabilities)(jnp.asarray(logits), None))
  np.testing.assert_array_equal(got, np.eye(11, dtype=np.float32)[np.argmax(logits, axis=-1)])
  per_row = sampling.probabilities(jnp.asarray(logits), _params([0.0] * 3, [0] * 3, [1.0] * 3))
  np.testing.assert_array_equal(got, per_row)
  assert got[0, 0, 2] == 1.0


def _random_rows(rng, B, N, V):
  """Logits [B, N, V] of many kinds (spread, peaked, flat, tied, partly -inf as under a
  constraint) and per-row settings that reach every path of the filters."""
  scale = rng.choice([0.05, 0.5, 2.0, 8.0], size=(B, 1, 1))
  logits = rng.normal(size=(B, N, V)) * scale
  kind = rng.integers(0, 4, size=B)
  logits[kind == 1] = np.round(logits[kind == 1] * 4) / 4  # many ties
  logits[kind == 2] = np.asarray(jnp.asarray(logits[kind == 2], jnp.bfloat16), np.float32)
  masked = (kind == 3)[:, None, None] & (rng.random((B, N, V)) < 0.5)
  logits = np.where(masked, -np.inf, logits).astype(np.float32)
  temperature = rng.choice([1e-3, 0.3, 1.0, 1e3], size=B).astype(np.float32)
  top_k = rng.choice([0, 1, 2, 10, 63, 64, 65, 150, V - 1, V, V + 5], size=B).astype(np.int32)
  top_p = rng.choice([1e-7, 0.1, 0.5, 0.9, 0.99, 0.9999, 1.0], size=B).astype(np.float32)
  min_p = rng.choice([0.0, 0.0, 0.0, 0.05, 0.3, 1.0], size=B).astype(np.float32)
  return logits, temperature, top_k, top_p, min_p


def _explained(z, got, want, top_k, top_p, min_p):
  """Whether two kept sets of one row differ only where the definition compares floats:
  every value kept by one and not the other sits at the min-p boundary (p = min_p * max
  p) or at the top-p boundary (mass strictly above it = top_p), within float32 rounding.
  Top-k compares values only and must match exactly."""
  z64 = z.astype(np.float64)
  finite = np.isfinite(z64)
  zmax = z64[finite].max()
  ulps = 8 * np.spacing(np.float32(max(abs(zmax), 1.0)))
  allowed = finite.copy()
  if min_p > 0:
    allowed &= z64 - zmax >= np.log(min_p) - ulps
  if 0 < top_k < z.size:
    allowed &= z64 >= np.sort(z64[finite])[::-1][min(top_k, finite.sum()) - 1]
  e = np.where(allowed, np.exp(z64 - zmax), 0.0)
  mass = e / e.sum()
  for v in np.unique(z64[got != want]):
    at_min_p = min_p > 0 and abs(v - zmax - np.log(min_p)) <= 1e-5 + ulps
    at_top_p = top_p < 1 and abs(mass[z64 > v].sum() - top_p) <= 1e-4
    if not (at_min_p or at_top_p):
      return False
  return True


@pytest.mark.parametrize("positions", [5, pytest.param(7, marks=pytest.mark.slow)],
                         ids=["chain-K4", "tree-N7"])
def test_kept_sets_equal_the_sorting_definition(positions):
  """The sort-free filters keep exactly the tokens the sort-based ones kept (min-p in
  front, vLLM's order), on >= 10,000 rows at chain and tree positions ([B, N, V], N >
  1): ties, -inf, temperatures 1e-3 and 1e3, top_k 1 to past V, top_p near 0 and 1,
  min_p 0 to 1. A difference is allowed only at a float comparison's boundary (and
  must be rare); each row's set is the same whatever else is in its batch."""
  rng = np.random.default_rng(positions)
  B, V = 128, 300
  scale = jax.jit(lambda x, t: x / t[:, None, None])
  kept = jax.jit(sampling.kept)
  reference = jax.jit(sorted_filter)
  rows = differing = 0
  for _ in range(-(-10_000 // (B * positions))):
    logits, temperature, top_k, top_p, min_p = _random_rows(rng, B, positions, V)
    # Both read the same scaled values: temperature is a division, the filters are
    # what is compared.
    z = scale(jnp.asarray(logits), jnp.asarray(temperature))
    params = _params(np.ones(B), top_k, top_p, min_p)
    got = np.asarray(kept(z, params))
    want = np.asarray(reference(z, jnp.asarray(top_k), jnp.asarray(top_p), jnp.asarray(min_p)))
    assert got.shape == (B, positions, V)
    z = np.asarray(z)
    for b, n in zip(*np.nonzero(np.any(got != want, axis=-1))):
      assert _explained(z[b, n], got[b, n], want[b, n], top_k[b], top_p[b], min_p[b]), (
          f"row {b}, position {n}: top_k {top_k[b]}, top_p {top_p[b]}, min_p {min_p[b]}, "
          f"T {temperature[b]}: kept {np.flatnonzero(got[b, n]).tolist()[:20]} "
          f"!= {np.flatnonzero(want[b, n]).tolist()[:20]}")
      differing += 1
    assert np.all(np.any(got, axis=-1)), "a row kept nothing"
    # The same rows in another batch (reversed, half of them) keep the same sets.
    half = slice(None, B // 2)
    alone = np.asarray(kept(jnp.asarray(z[::-1][half]),
                            _params(np.ones(B // 2), top_k[::-1][half], top_p[::-1][half],
                                    min_p[::-1][half])))
    np.testing.assert_array_equal(alone, got[::-1][half])
    rows += B * positions
  assert rows >= 10_000
  assert differing <= rows // 1000, f"{differing} of {rows} rows differ at a boundary"


def test_search_checks_what_it_reads():
  """The bracket search trusts its count estimate only as far as the values it reads:
  told that every bracket is small (a lightest weight far too high), it reads C values,
  finds the test still passing and goes on below them, to the exact answer."""
  rng = np.random.default_rng(5)
  R, V, C = 6, 500, 8
  z = jnp.asarray(np.round(rng.normal(size=(R, V)) * 8) / 8, jnp.float32)  # ties
  weigh = lambda v: jnp.where(jnp.isfinite(v), jnp.exp(v - 3.0), 0.0)
  w_all = jnp.sum(weigh(z), axis=-1, keepdims=True)
  target = w_all * jnp.asarray([[0.5], [0.9], [0.99], [0.2], [0.999], [0.7]], jnp.float32)
  hi = jnp.max(z, axis=-1, keepdims=True)
  found = jax.jit(lambda z, target, hi, w_all: sampling._search(
      z, weigh, lambda lo: jnp.full_like(lo, 1e30), target, hi, jnp.zeros_like(hi), w_all,
      jnp.ones_like(hi, bool), C))(z, target, hi, w_all)
  for r in range(R):
    values = np.unique(np.asarray(z[r]))
    w = np.asarray(weigh(z[r]), np.float64)
    above = [w[np.asarray(z[r]) > v].sum() for v in values]
    want = values[np.argmax(np.asarray(above) < float(target[r, 0]))]
    assert float(found[r, 0]) == want


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_min_p_one_is_the_argmax():
  """min_p = 1 keeps the most likely token alone: sampling at any temperature is then
  greedy decoding, plain and speculative, per row beside rows that sample."""
  model = jspec.models.init(tiny_config(), seed=3)
  prompts = [[1, 2, 3], [4, 5], [6]]
  greedy = jspec.generate(model, prompts, max_new_tokens=8)
  kw = dict(max_new_tokens=8, temperature=[1.0, 2.0, 0.7], min_p=[1.0, 1.0, 0.0], seed=1)
  plain = jspec.generate(model, prompts, **kw)
  spec = jspec.speculative_generate(model, jspec.NGram(model.vocab_size), prompts,
                                    num_draft_tokens=3, **kw)
  np.testing.assert_array_equal(plain.tokens[:2], greedy.tokens[:2])
  np.testing.assert_array_equal(spec.tokens[:2], greedy.tokens[:2])
