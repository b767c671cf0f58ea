"""End-to-end decoding: greedy exactness, per-row settings, EOS, lengths, seeds, jit cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec.core import programs
from conftest import assert_greedy_match, perturbed, ragged_prompts, tiny_config


@pytest.mark.parametrize("batch", [1] + [pytest.param(b, marks=pytest.mark.slow) for b in (3, 8)])
@pytest.mark.parametrize("k", [1] + [pytest.param(k, marks=pytest.mark.slow) for k in (3, 7)])
def test_greedy_speculative_equals_baseline(target, close_draft, far_draft, batch, k):
  prompts = ragged_prompts(batch, 64, seed=batch * 10 + k)
  base = jspec.generate(target, prompts, max_new_tokens=24)
  for draft in (close_draft, far_draft):
    spec = jspec.speculative_generate(target, draft, prompts, num_draft_tokens=k,
                                      max_new_tokens=24)
    assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(spec.tokens))
    np.testing.assert_array_equal(spec.lengths, 24)
    # Every target call emits 1..K+1 tokens; the histogram counts every active round.
    calls = np.asarray(spec.stats.target_calls)
    assert np.all(calls >= -(-24 // (k + 1))) and np.all(calls <= 24)
    assert int(np.sum(spec.stats.accept_hist)) == int(np.sum(calls))
  # The close draft gets accepted part of the time: the run exercises partial acceptance.
  spec = jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=k,
                                    max_new_tokens=24)
  assert 0 < int(np.sum(spec.stats.accepted)) < batch * 24


@pytest.mark.slow
def test_greedy_speculative_equals_baseline_bf16():
  """bf16 params and caches (what TPU/GPU users run). Block shapes change bf16
  rounding more than f32's, so the near-tie tolerance scales with bf16's precision
  (8 mantissa bits: ~0.4% of a logit of size ~5)."""
  target = jspec.models.init(tiny_config(), seed=0, dtype=jnp.bfloat16)
  draft = perturbed(target, 0.35, seed=7)
  prompts = ragged_prompts(3, 64, seed=1)
  base = jspec.generate(target, prompts, max_new_tokens=24)
  spec = jspec.speculative_generate(target, draft, prompts, num_draft_tokens=3,
                                    max_new_tokens=24)
  assert int(np.sum(spec.stats.accepted)) > 0
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(spec.tokens), tol=0.05)


def test_near_tie_rule_is_checked(target):
  """The near-tie check flags a real divergence (it is not a skip)."""
  prompts = [[1, 2, 3]]
  base = np.asarray(jspec.generate(target, prompts, max_new_tokens=8).tokens)
  wrong = base.copy()
  wrong[0, 3] = (wrong[0, 3] + 1) % 64
  with pytest.raises(AssertionError, match="top-2 logit gap"):
    assert_greedy_match(target, prompts, base, wrong)


@pytest.mark.parametrize("k", [1, 4])
def test_identical_draft_accepts_everything(target, k):
  prompts = ragged_prompts(4, 64, seed=5)
  out = jspec.speculative_generate(target, target, prompts, num_draft_tokens=k,
                                   max_new_tokens=20)
  rounds = -(-20 // (k + 1))
  np.testing.assert_array_equal(out.stats.target_calls, rounds)
  hist = np.asarray(out.stats.accept_hist)
  assert hist[k] == 4 * rounds and hist[:k].sum() == 0
  # Accepted drafts that were committed: all but the trimmed tail of the last round.
  np.testing.assert_array_equal(out.stats.accepted, 20 - rounds)


@pytest.mark.slow
def test_identical_draft_sampled_acceptance_near_one(target):
  out = jspec.speculative_generate(target, target, ragged_prompts(8, 64, seed=6),
                                   num_draft_tokens=4, max_new_tokens=30, temperature=1.0)
  proposed = 4 * int(np.sum(out.stats.target_calls))
  # p == q up to float rounding between block shapes: acceptance is ~1.
  assert int(np.sum(out.stats.accept_hist[:4])) <= 0.02 * proposed


@pytest.mark.slow
def test_mixed_greedy_and_sampled_rows(target, close_draft):
  prompts = ragged_prompts(4, 64, seed=8)
  temps = [0.0, 1.0, 0.0, 0.7]
  top_k = [0, 0, 0, 5]
  top_p = [1.0, 0.9, 1.0, 1.0]
  mixed = jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=3,
                                     max_new_tokens=16, temperature=temps, top_k=top_k,
                                     top_p=top_p, seed=3)
  greedy = jspec.generate(target, prompts, max_new_tokens=16)
  got, want = np.asarray(mixed.tokens), np.asarray(greedy.tokens)
  assert_greedy_match(target, [prompts[0], prompts[2]], want[[0, 2]], got[[0, 2]])
  # Sampled rows really sample: a different seed changes them, never the greedy rows.
  other = jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=3,
                                     max_new_tokens=16, temperature=temps, top_k=top_k,
                                     top_p=top_p, seed=4)
  other = np.asarray(other.tokens)
  np.testing.assert_array_equal(other[[0, 2]], got[[0, 2]])
  assert not np.array_equal(other[[1, 3]], got[[1, 3]])
  # Row 3 uses top-k 5: every token it emits is in the target's top 5 at that point.
  P = len(prompts[3])
  seq = jnp.asarray([list(prompts[3]) + got[3].tolist()], jnp.int32)
  logits = np.asarray(target.logits(seq))[0]
  for i, tok in enumerate(got[3]):
    assert tok in np.argsort(logits[P - 1 + i])[-5:]


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 7])
def test_eos_inside_accepted_run_truncates(target, k):
  prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
  base = np.asarray(jspec.generate(target, prompts, max_new_tokens=20).tokens)
  # Choose, for row 0, a token whose first occurrence is mid-sequence as the EOS.
  j = next(i for i in range(3, 20) if base[0, i] not in base[0, :i])
  eos = int(base[0, j])
  spec = jspec.speculative_generate(target, target, prompts, num_draft_tokens=k,
                                    max_new_tokens=20, eos_id=[eos, 63])
  tokens, lengths = np.asarray(spec.tokens), np.asarray(spec.lengths)
  assert lengths[0] == j + 1
  np.testing.assert_array_equal(tokens[0, :j + 1], base[0, :j + 1])
  assert np.all(tokens[0, j + 1:] == -1)
  # Row 1 stops at its own first EOS (or runs to the budget), independently of row 0.
  stops = [i for i in range(20) if base[1, i] in (eos, 63)]
  want = stops[0] + 1 if stops else 20
  assert lengths[1] == want
  np.testing.assert_array_equal(tokens[1, :want], base[1, :want])
  # Baseline honours the same EOS.
  b2 = jspec.generate(target, prompts, max_new_tokens=20, eos_id=[eos, 63])
  np.testing.assert_array_equal(b2.tokens, tokens)


@pytest.mark.parametrize("max_new", [1, 5, 13])
def test_max_new_tokens_exact(target, max_new):
  prompts = ragged_prompts(3, 64, seed=max_new)
  out = jspec.speculative_generate(target, target, prompts, num_draft_tokens=7,
                                   max_new_tokens=max_new)
  np.testing.assert_array_equal(out.lengths, max_new)
  assert out.tokens.shape == (3, max_new) and np.all(np.asarray(out.tokens) >= 0)


def test_per_row_max_new_tokens(target, close_draft):
  out = jspec.speculative_generate(target, close_draft, [[1, 2], [3], [4, 5, 6]],
                                   num_draft_tokens=3, max_new_tokens=[2, 9, 5])
  np.testing.assert_array_equal(out.lengths, [2, 9, 5])
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (3, 9)
  assert np.all(tokens[0, 2:] == -1) and np.all(tokens[2, 5:] == -1)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_same_seed_same_output_and_rows_independent(target, close_draft):
  prompts = ragged_prompts(4, 64, seed=11)
  kw = dict(num_draft_tokens=3, max_new_tokens=16, temperature=1.0, seed=123)
  a = np.asarray(jspec.speculative_generate(target, close_draft, prompts, **kw).tokens)
  b = np.asarray(jspec.speculative_generate(target, close_draft, prompts, **kw).tokens)
  np.testing.assert_array_equal(a, b)
  # Change every other row (contents, lengths, settings): row 2 is unchanged.
  others = ragged_prompts(4, 64, seed=12)
  others[2] = prompts[2]
  temps = [0.0, 0.5, 1.0, 1.3]
  c = jspec.speculative_generate(target, close_draft, others, num_draft_tokens=3,
                                 max_new_tokens=16, temperature=temps, seed=123)
  np.testing.assert_array_equal(np.asarray(c.tokens)[2], a[2])
  # Different seed, different samples.
  d = np.asarray(jspec.speculative_generate(target, close_draft, prompts,
                                            **{**kw, "seed": 124}).tokens)
  assert not np.array_equal(a, d)


@pytest.mark.slow
def test_per_row_seed_independent_of_batch_position(target, close_draft):
  prompt = [5, 6, 7]
  alone = jspec.speculative_generate(target, close_draft, [prompt], num_draft_tokens=3,
                                     max_new_tokens=12, temperature=1.0, seed=[77])
  batch = jspec.speculative_generate(target, close_draft, [[1], [2, 3], prompt],
                                     num_draft_tokens=3, max_new_tokens=12, temperature=1.0,
                                     seed=[1, 2, 77])
  np.testing.assert_array_equal(np.asarray(batch.tokens)[2], np.asarray(alone.tokens)[0])


def test_array_prompts_with_lengths(target):
  arr = np.array([[4, 5, 6, 0], [7, 0, 0, 0]], np.int32)
  a = jspec.generate(target, arr, prompt_lengths=[3, 1], max_new_tokens=6)
  b = jspec.generate(target, [[4, 5, 6], [7]], max_new_tokens=6)
  np.testing.assert_array_equal(a.tokens, b.tokens)


@pytest.mark.slow
def test_no_recompile_within_buckets(target, close_draft):
  program = programs.fixed
  jspec.speculative_generate(target, close_draft, [[1, 2, 3], [4, 5]], num_draft_tokens=3,
                             max_new_tokens=10, temperature=[0.0, 0.9])
  size = program._cache_size()
  # New contents, prompt lengths, max_new_tokens, sampling settings, seed, EOS ids:
  # all traced, all within the same buckets.
  jspec.speculative_generate(target, close_draft, [[9, 8, 7, 6, 5, 4, 3], [2]],
                             num_draft_tokens=3, max_new_tokens=21, temperature=[0.5, 0.0],
                             top_k=[3, 0], top_p=0.8, eos_id=[7], seed=5)
  assert program._cache_size() == size
  # All-greedy batches are the one static distinction: their own (argmax-only)
  # program, compiled once and then reused with everything else traced as above.
  jspec.speculative_generate(target, close_draft, [[1, 2, 3], [4, 5]], num_draft_tokens=3,
                             max_new_tokens=10)
  greedy_size = program._cache_size()
  assert greedy_size <= size + 1
  jspec.speculative_generate(target, close_draft, [[9, 8, 7, 6, 5, 4, 3], [2]],
                             num_draft_tokens=3, max_new_tokens=21, top_k=[3, 0], top_p=0.8,
                             eos_id=[7], seed=5)
  assert program._cache_size() == greedy_size
  # A new K is a new program: the check above can see a recompile (K = 6 at batch 2
  # is used by no other test, so it cannot already be cached).
  jspec.speculative_generate(target, close_draft, [[1, 2, 3], [4, 5]], num_draft_tokens=6,
                             max_new_tokens=10)
  assert program._cache_size() == greedy_size + 1


@pytest.mark.slow
def test_static_greedy_only_when_every_row_is_greedy(target, close_draft, monkeypatch):
  """api passes params=None (the argmax-only program) exactly when every row's
  temperature is 0; mixed and sampled batches keep per-row SamplingParams."""
  seen = []
  program = programs.fixed

  def spy(target, drafter, tokens, lengths, max_new, params, *rest, **static):
    seen.append(params)
    return program(target, drafter, tokens, lengths, max_new, params, *rest, **static)

  monkeypatch.setattr(programs, "fixed", spy)
  prompts = [[1, 2, 3], [4, 5]]
  jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=3, max_new_tokens=4)
  jspec.generate(target, prompts, max_new_tokens=4, temperature=[0.0, 0.0], top_k=3)
  jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=3, max_new_tokens=4,
                             temperature=[0.0, 0.7])
  jspec.generate(target, prompts, max_new_tokens=4, temperature=1.0)
  assert seen[0] is None and seen[1] is None
  assert all(isinstance(p, jspec.SamplingParams) for p in seen[2:])
  np.testing.assert_array_equal(seen[2].temperature, np.float32([0.0, 0.7]))


def _decode(target, drafter, prompts, lengths, params, k, max_new):
  B = prompts.shape[0]
  config = jspec.core.decode.DecodeConfig(num_draft_tokens=k, cache_length=64)

  @jax.jit
  def run(target, drafter, params):
    state = jspec.core.decode.init_state(target, drafter, prompts, lengths,
                                    jnp.full((B,), max_new, jnp.int32), params,
                                    jnp.full((1,), -1, jnp.int32), jnp.arange(B), config)
    one, _ = jspec.core.decode.decode_round(target, drafter, state, config)
    state = jspec.core.decode.decode_loop(target, drafter, one, config)
    out, new_lengths = jspec.core.decode.output_tokens(state)
    return one.tokens, one.lengths, out, new_lengths, state.stats

  return run(target, drafter, params)


@pytest.mark.parametrize("kind", ["baseline"] + [pytest.param(k, marks=pytest.mark.slow)
                                                for k in ("draft_model", "ngram")])
def test_static_greedy_equals_zero_temperature_params(target, close_draft, kind):
  """params=None (argmax-only rounds) gives the same tokens, lengths and statistics
  as explicit all-zero-temperature SamplingParams (one-hot p and q, the general rule),
  after one round and after the whole loop."""
  prompts = np.array([[1, 2, 3, 1, 2, 0], [4, 0, 0, 0, 0, 0], [7, 7, 7, 7, 7, 7]], np.int32)
  lengths = np.array([5, 1, 6], np.int32)
  drafter, k = {"baseline": (None, 0), "draft_model": (jspec.DraftModel(close_draft), 3),
                "ngram": (jspec.NGram(64), 3)}[kind]
  zero = jspec.SamplingParams(temperature=jnp.zeros((3,), jnp.float32),
                              top_k=jnp.zeros((3,), jnp.int32), top_p=jnp.ones((3,), jnp.float32))
  fast = _decode(target, drafter, prompts, lengths, None, k, 20)
  general = _decode(target, drafter, prompts, lengths, zero, k, 20)
  for a, b in zip(jax.tree_util.tree_leaves(fast), jax.tree_util.tree_leaves(general)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(fast[3], 20)
  if k:  # partial acceptance happened, so the comparison covers rejections
    assert 0 < int(np.sum(fast[4].accepted)) < 3 * 20


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_pure_layer_inside_user_jit(target, close_draft):
  """init_state / decode_loop compose inside a user's own jitted function."""
  prompts = np.array([[1, 2, 3, 0], [4, 0, 0, 0]], np.int32)
  lengths = np.array([3, 1], np.int32)
  config = jspec.core.decode.DecodeConfig(num_draft_tokens=3, cache_length=32)
  params = jspec.SamplingParams(temperature=jnp.zeros((2,), jnp.float32),
                                top_k=jnp.zeros((2,), jnp.int32),
                                top_p=jnp.ones((2,), jnp.float32))

  @jax.jit
  def user_step(target, draft, prompts, lengths):
    drafter = jspec.DraftModel(draft)
    state = jspec.core.decode.init_state(target, drafter, prompts, lengths,
                                    jnp.full((2,), 10, jnp.int32), params,
                                    jnp.full((1,), -1, jnp.int32), jnp.arange(2), config)
    state, _ = jspec.core.decode.decode_round(target, drafter, state, config)  # one by hand
    state = jspec.core.decode.decode_loop(target, drafter, state, config)
    return jspec.core.decode.output_tokens(state)

  out, new_lengths = user_step(target, close_draft, prompts, lengths)
  ref = jspec.generate(target, [[1, 2, 3], [4]], max_new_tokens=10)
  np.testing.assert_array_equal(new_lengths, 10)
  assert_greedy_match(target, [[1, 2, 3], [4]], np.asarray(ref.tokens), np.asarray(out)[:, :10])


@pytest.mark.parametrize("k", [0] + [pytest.param(k, marks=pytest.mark.slow) for k in (3, "auto")])
def test_stream_sends_every_committed_token_in_order(k):
  """`stream=` hears each round's new tokens; joined, they are the output, which is the same
  as without streaming."""
  config = jspec.models.TransformerConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2)
  model = jspec.models.init(config, seed=0)
  prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5]]
  heard = []
  kw = dict(max_new_tokens=10, eos_id=())
  if k == 0:
    out = jspec.generate(model, prompts, stream=heard.append, **kw)
    plain = jspec.generate(model, prompts, **kw)
  else:
    kw.update(num_draft_tokens=k)
    out = jspec.speculative_generate(model, jspec.NGram(32), prompts, stream=heard.append, **kw)
    plain = jspec.speculative_generate(model, jspec.NGram(32), prompts, **kw)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(plain.tokens))
  assert len(heard) >= 1 and all(len(rows) == 2 for rows in heard)
  for b in range(2):
    joined = [t for rows in heard for t in rows[b]]
    assert joined == np.asarray(out.tokens)[b, :int(out.lengths[b])].tolist()
  if k == 0:  # one token per row per round
    assert len(heard) == 10


def test_stream_must_be_callable():
  model = jspec.models.init(jspec.models.TransformerConfig(
      vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
      num_attention_heads=2), seed=0)
  with pytest.raises(TypeError, match="stream must be a callable"):
    jspec.generate(model, [[1, 2]], max_new_tokens=2, stream="yes")


@pytest.mark.parametrize("k", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_round_result_reports_what_the_round_did(target, close_draft, k):
  """`decode_round` returns, beside the state, what it did: per row the drafts judged,
  those accepted, the tokens committed and the target's own token; rows already done
  report zeros."""
  decode = jspec.core.decode
  config = decode.DecodeConfig(num_draft_tokens=k, cache_length=64)
  drafter = jspec.DraftModel(close_draft)
  B = 3
  prompts = jnp.asarray([[1, 2, 3, 4], [5, 6, 0, 0], [7, 8, 9, 0]], jnp.int32)
  max_new = jnp.asarray([12, 12, 1], jnp.int32)  # row 2 is done after its first round

  @jax.jit
  def rounds(target, drafter):
    state = decode.init_state(target, drafter, prompts, jnp.asarray([4, 2, 3]), max_new, None,
                              jnp.full((1,), -1, jnp.int32), jnp.arange(B), config)
    out = []
    for _ in range(3):
      new, did = decode.decode_round(target, drafter, state, config)
      out.append((state, new, did))
      state = new
    return out

  for before, after, did in rounds(target, drafter):
    active = ~np.asarray(before.done)
    L0, L1 = np.asarray(before.lengths), np.asarray(after.lengths)
    np.testing.assert_array_equal(did.committed, L1 - L0)
    np.testing.assert_array_equal(did.accepted,
                                  np.asarray(after.stats.accepted - before.stats.accepted))
    np.testing.assert_array_equal(did.proposed, np.where(active, k, 0))
    tokens = np.asarray(after.tokens)
    for b in np.flatnonzero(active):
      if did.committed[b] > did.accepted[b]:  # the target's own token was committed
        assert tokens[b, L0[b] + did.accepted[b]] == did.token[b]
    assert np.all(np.asarray(did.committed)[~active] == 0)
    assert np.all(np.asarray(did.token)[~active] == 0)
