"""Log-probabilities of emitted tokens (`return_logprobs`): each equals a full forward's
log-softmax of the processed distribution at that token, for every way of decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from jspec import Tree
from reference import penalized_logits, processed_probs

from conftest import ragged_prompts, tiny_config

BINARY = Tree.from_paths([(0, 0), (0, 1), (1, 0), (1, 1)])


def _reference(target, prompts, out, temperature, top_k, raw):
  """[B, T] log p of each emitted token from one full forward over prompt + output."""
  expected = np.zeros(out.tokens.shape, np.float64)
  for b, prompt in enumerate(prompts):
    n = int(out.lengths[b])
    new = np.asarray(out.tokens[b, :n])
    context = np.asarray(list(prompt) + new.tolist(), np.int32)[None]
    logits = np.asarray(target.logits(context), np.float64)[0]  # [P + n, V]
    for j in range(n):
      row = logits[len(prompt) - 1 + j]
      if raw:
        lse = np.log(np.sum(np.exp(row - row.max()))) + row.max()
        expected[b, j] = row[new[j]] - lse
      else:
        expected[b, j] = np.log(processed_probs(row, temperature[b], top_k)[new[j]])
  return expected


def _drafters(target, close_draft):
  return {
      "baseline": None,
      "draft_model": dict(draft=close_draft, num_draft_tokens=3),
      "ngram": dict(draft=jspec.NGram(target.vocab_size, max_ngram=2), num_draft_tokens=4),
      "tree": dict(draft=close_draft, tree=BINARY),
  }


@pytest.mark.parametrize("method", ["baseline"] + [pytest.param(m, marks=pytest.mark.slow)
                                               for m in ("draft_model", "ngram", "tree")])
@pytest.mark.parametrize("sampled", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["greedy", "sampled"])
def test_logprobs_equal_a_full_forward(target, close_draft, method, sampled):
  prompts = ragged_prompts(3, target.vocab_size, seed=11, min_len=2, max_len=9)
  # Repeats in the prompt give the n-gram drafter something to propose.
  prompts[0] = prompts[0] + prompts[0]
  temperature = [0.8, 0.0, 1.0] if sampled else [0.0, 0.0, 0.0]
  top_k = 8
  spec = _drafters(target, close_draft)[method]
  kwargs = dict(max_new_tokens=12, temperature=temperature, top_k=top_k if sampled else 0,
                seed=3)
  for raw in (False, True):
    request = jspec.Logprobs(raw=raw)
    if spec is None:
      out = jspec.generate(target, prompts, return_logprobs=request, **kwargs)
    else:
      out = jspec.speculative_generate(target, prompts=prompts, return_logprobs=request,
                                       **spec, **kwargs)
    got = np.asarray(out.logprobs, np.float64)
    assert got.shape == out.tokens.shape
    expected = _reference(target, prompts, out, temperature, top_k if sampled else 0, raw)
    np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=f"{method} raw={raw}")
    past_end = np.arange(got.shape[1])[None, :] >= np.asarray(out.lengths)[:, None]
    assert np.all(got[past_end] == 0.0)
    if not raw:
      greedy_rows = np.asarray(temperature) == 0
      assert np.all(got[greedy_rows] == 0.0)  # the argmax is drawn with probability 1
    else:
      assert np.all(got[~past_end] < 0.0)


@pytest.mark.slow
def test_speculative_records_what_baseline_records(target, close_draft):
  """Greedy: the same tokens, so the same raw log-probabilities, round by round or not."""
  prompts = ragged_prompts(4, target.vocab_size, seed=5)
  request = jspec.Logprobs(raw=True, top=3)
  base = jspec.generate(target, prompts, max_new_tokens=10, return_logprobs=request)
  spec = jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=4,
                                    max_new_tokens=10, return_logprobs=request)
  np.testing.assert_array_equal(base.tokens, spec.tokens)
  np.testing.assert_allclose(base.logprobs, spec.logprobs, atol=1e-5)
  np.testing.assert_array_equal(base.top_ids, spec.top_ids)
  np.testing.assert_allclose(base.top_logprobs, spec.top_logprobs, atol=1e-5)
  # The greedy token is the most likely one, and the top list is sorted.
  valid = np.asarray(base.tokens) >= 0
  np.testing.assert_array_equal(np.asarray(base.top_ids)[..., 0][valid],
                                np.asarray(base.tokens)[valid])
  top = np.asarray(base.top_logprobs)[valid]
  assert np.all(np.diff(top, axis=-1) <= 0.0)
  np.testing.assert_allclose(top[:, 0], np.asarray(base.logprobs)[valid], atol=1e-6)


def test_logprobs_off_by_default_and_bad_requests(target):
  out = jspec.generate(target, [[1, 2]], max_new_tokens=3)
  assert out.logprobs is None and out.top_ids is None
  with pytest.raises(TypeError, match="return_logprobs"):
    jspec.generate(target, [[1, 2]], max_new_tokens=3, return_logprobs="yes")
  with pytest.raises(ValueError, match="top"):
    jspec.Logprobs(top=-1)


@pytest.mark.slow
def test_auto_k_records_logprobs_and_per_row_counters(target, close_draft):
  """One row, K switching between 0 and 4: the log-probabilities are plain decoding's;
  position 0 is judged in every drafting round, position i only in rounds that drafted
  it and accepted the i before it."""
  prompts = [[3, 1, 4, 1, 5]]
  request = jspec.Logprobs(raw=True)
  base = jspec.generate(target, prompts, max_new_tokens=24, return_logprobs=request)
  out = jspec.speculative_generate(target, close_draft, prompts, max_new_tokens=24,
                                   num_draft_tokens=jspec.AutoK(choices=(0, 2, 4),
                                                                costs=(1.0, 1.1, 1.2)),
                                   return_logprobs=request)
  np.testing.assert_array_equal(base.tokens, out.tokens)
  np.testing.assert_allclose(base.logprobs, out.logprobs, atol=1e-5)
  stats = out.stats
  judged = np.asarray(stats.position_judged)[0]
  drafting = sum(r for k, r in out.rounds_by_k.items() if k >= 1)
  assert drafting > 0 and judged[0] == drafting
  assert int(np.sum(stats.row_hist)) == int(stats.target_calls[0])
  accepted = np.asarray(stats.position_accepted)[0]
  assert np.all(accepted <= judged) and np.all(np.diff(judged) <= 0)
  assert int(np.sum(accepted)) == int(stats.accepted[0])


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_greedy_row_records_do_not_depend_on_the_batch(target, close_draft):
  """A greedy row's top ids and log-probabilities are the same alone (the all-greedy
  program), beside a sampled row (the per-row program), plain or speculative: the ids of
  its largest logits in order, log p 0 then -inf."""
  prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8]]
  n = 4
  kw = dict(max_new_tokens=8, return_logprobs=jspec.Logprobs(top=n), seed=1)
  alone = jspec.generate(target, prompts[:1], **kw)
  runs = {
      "plain mixed": jspec.generate(target, prompts, temperature=[0.0, 1.0], **kw),
      "speculative alone": jspec.speculative_generate(target, close_draft, prompts[:1],
                                                      num_draft_tokens=3, **kw),
      "speculative mixed": jspec.speculative_generate(target, close_draft, prompts,
                                                      num_draft_tokens=3,
                                                      temperature=[0.0, 1.0], **kw),
  }
  # The reference, from one full forward over the greedy row's output.
  tokens = np.asarray(alone.tokens)[0]
  logits = np.asarray(target.logits(np.asarray([prompts[0] + tokens.tolist()], np.int32)))[0]
  want_ids = np.argsort(-logits[len(prompts[0]) - 1:-1], axis=-1, kind="stable")[:, :n]
  np.testing.assert_array_equal(np.asarray(alone.top_ids)[0], want_ids)
  want_values = np.where(np.arange(n) == 0, 0.0, -np.inf)
  np.testing.assert_array_equal(np.asarray(alone.top_logprobs)[0],
                                np.broadcast_to(want_values, want_ids.shape))
  for name, out in runs.items():
    np.testing.assert_array_equal(np.asarray(out.tokens)[0], tokens, err_msg=name)
    np.testing.assert_array_equal(np.asarray(out.top_ids)[0], want_ids, err_msg=name)
    np.testing.assert_array_equal(np.asarray(out.top_logprobs)[0],
                                  np.asarray(alone.top_logprobs)[0], err_msg=name)
    np.testing.assert_array_equal(np.asarray(out.logprobs)[0], 0.0, err_msg=name)
  # The sampled row beside it records its own processed distribution (not the greedy form).
  assert np.all(np.asarray(runs["plain mixed"].top_logprobs)[1, :, 1] > -np.inf)


# ----------------------------------------------------------------------------- every drafter

# V = 8: the random drafters below are right often enough in every row (greedy, sampled,
# filtered) that rounds accept drafts, and one target serves them all, so plain decoding's
# programs compile once.
SMALL_V = 8
MIXED = dict(temperature=[0.0, 1.0, 0.7], top_k=[0, 0, 4], seed=9)  # greedy, sampled, filtered
KIND_PROMPTS = [[3, 1, 4, 1, 5, 3, 1], [2, 7, 1, 0, 2], [1, 1, 2, 6]]
KIND_NEW = 8


@pytest.fixture(scope="module")
def small_target():
  config = tiny_config(vocab_size=SMALL_V, layers=1, hidden=16, heads=2, kv_heads=1, scale=0.3)
  return jspec.models.init(config, seed=21)


def _plain_distributions(target, prompts, out):
  """Plain `jspec.generate`'s processed log-distribution [B, T, V] at each position `out`
  emitted, and its top-3 ids there: one row per position (the prompt and the tokens
  before it), one new token each, recording every id (Logprobs(top=V)). The rows are
  padded to a fixed count, so every caller shares one program."""
  V = target.vocab_size
  rows, temps, top_ks, where = [], [], [], []
  for b, prompt in enumerate(prompts):
    new = np.asarray(out.tokens[b, :int(out.lengths[b])]).tolist()
    for j in range(len(new)):
      rows.append(prompt + new[:j])
      temps.append(MIXED["temperature"][b])
      top_ks.append(MIXED["top_k"][b])
      where.append((b, j))
  pad = len(prompts) * KIND_NEW - len(rows)
  rows, temps, top_ks = rows + rows[-1:] * pad, temps + temps[-1:] * pad, top_ks + top_ks[-1:] * pad
  ref = jspec.generate(target, rows, max_new_tokens=1, temperature=temps, top_k=top_ks,
                       return_logprobs=jspec.Logprobs(top=V))
  ids, values = np.asarray(ref.top_ids)[:, 0], np.asarray(ref.top_logprobs)[:, 0]
  dist = np.full(out.tokens.shape + (V,), np.nan)
  top3 = np.full(out.tokens.shape + (3,), -1)
  for r, (b, j) in enumerate(where):
    dist[b, j, ids[r]] = values[r]
    top3[b, j] = ids[r, :3]
  return dist, top3


def _assert_plain_records(target, prompts, out, request, plain, name):
  """`out`'s records are plain decoding's for the tokens it emitted: every row against
  `_plain_distributions`, and the greedy row (the same tokens as `plain`, plain
  decoding over the same batch) against `plain` itself."""
  dist, top3 = _plain_distributions(target, prompts, out)
  lengths = np.asarray(out.lengths)
  tokens = np.asarray(out.tokens)
  got = np.asarray(out.logprobs)
  for b in range(len(prompts)):
    n = int(lengths[b])
    want = dist[b, np.arange(n), tokens[b, :n]]
    np.testing.assert_allclose(got[b, :n], want, atol=1e-4, err_msg=f"{name} row {b}")
    if request.top:
      np.testing.assert_array_equal(np.asarray(out.top_ids)[b, :n], top3[b, :n],
                                    err_msg=f"{name} row {b}")
      want_top = np.take_along_axis(dist[b, :n], top3[b, :n], axis=-1)
      np.testing.assert_allclose(np.asarray(out.top_logprobs)[b, :n], want_top, atol=1e-4,
                                 err_msg=f"{name} row {b}")
  np.testing.assert_array_equal(tokens[0], np.asarray(plain.tokens)[0], err_msg=name)
  np.testing.assert_allclose(got[0], np.asarray(plain.logprobs)[0], atol=1e-5, err_msg=name)
  if request.top:
    np.testing.assert_array_equal(np.asarray(out.top_ids)[0], np.asarray(plain.top_ids)[0])
    np.testing.assert_array_equal(np.asarray(out.top_logprobs)[0],
                                  np.asarray(plain.top_logprobs)[0])
    # Independently of the engine: the greedy row's top ids rank a full forward's logits.
    context = np.asarray([prompts[0] + tokens[0].tolist()], np.int32)
    logits = np.asarray(target.logits(context))[0, len(prompts[0]) - 1:-1]
    np.testing.assert_array_equal(np.asarray(out.top_ids)[0],
                                  np.argsort(-logits, axis=-1, kind="stable")[:, :3], err_msg=name)


def _drafter(name, target):
  """speculative_generate's keyword arguments for one drafter kind."""
  from jspec.drafters import eagle as E
  from jspec.drafters.lookahead import Lookahead
  from jspec.drafters.medusa import Medusa
  if name.startswith("eagle"):
    eagle = E.Eagle.from_target(
        target, E.init_params(E.EagleConfig.for_target(target.config), jax.random.key(0)))
    if name == "eagle_chain":
      return dict(draft=eagle, num_draft_tokens=3)
    return dict(draft=eagle, tree=jspec.DynamicTree(nodes=8, depth=3, top_k=2))
  if name == "medusa_tree":
    rng = np.random.default_rng(10)
    D = target.config.hidden_size
    heads = {"w": jnp.asarray(0.05 * rng.standard_normal((3, D, D)), jnp.float32),
             "b": jnp.asarray(0.05 * rng.standard_normal((3, D)), jnp.float32)}
    return dict(draft=Medusa.from_target(target, heads),
                tree=jspec.Tree.from_paths([(0, 0, 0), (0, 1), (1, 0), (2,)]))
  assert name == "lookahead"
  return dict(draft=Lookahead(target.vocab_size, window=3, ngram=3, guesses=2),
              num_draft_tokens=3)


@pytest.mark.parametrize("name", ["lookahead"] + [  # one fast, the compiles of the others slow
    pytest.param(name, marks=pytest.mark.slow)
    for name in ("medusa_tree", "eagle_chain", "eagle_dynamic_tree")])
@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_every_drafter_records_what_plain_decoding_records(small_target, name):
  """Speculative `return_logprobs=True` and `Logprobs(top=3)` equal plain `jspec.generate`'s
  for the tokens emitted, in a batch of a greedy, a sampled and a top-k row."""
  target = small_target
  spec = _drafter(name, target)
  kw = dict(max_new_tokens=KIND_NEW, eos_id=(), **MIXED)
  for request in (jspec.Logprobs(), jspec.Logprobs(top=3)):
    out = jspec.speculative_generate(target, prompts=KIND_PROMPTS, return_logprobs=request,
                                     **spec, **kw)
    plain = jspec.generate(target, KIND_PROMPTS, return_logprobs=request, **kw)
    _assert_plain_records(target, KIND_PROMPTS, out, request, plain, f"{name} {request}")
    # Rounds accepted drafts (so records along accepted paths are read), sampled rows too.
    accepted = np.asarray(out.stats.accepted)
    assert accepted[0] > 0 and accepted[1:].sum() > 0, (name, accepted)


@pytest.mark.slow
def test_suffix_memory_across_calls_records_what_plain_decoding_records(small_target):
  """Suffix with a memory: the second call drafts the first one's answers from memory,
  and both calls' records are plain decoding's."""
  from jspec.drafters.suffix import Suffix, SuffixMemory, remember
  target = small_target
  kw = dict(max_new_tokens=KIND_NEW, eos_id=(), **MIXED)
  for request in (jspec.Logprobs(), jspec.Logprobs(top=3)):
    plain = jspec.generate(target, KIND_PROMPTS, return_logprobs=request, **kw)
    memory = SuffixMemory.empty(128)
    accepted = []
    for call in range(2):
      out = jspec.speculative_generate(target, Suffix(target.vocab_size, memory=memory),
                                       KIND_PROMPTS, num_draft_tokens=3,
                                       return_logprobs=request, **kw)
      _assert_plain_records(target, KIND_PROMPTS, out, request, plain,
                            f"suffix call {call} {request}")
      memory = remember(memory, out.tokens, out.lengths)
      accepted.append(np.asarray(out.stats.accepted))
    # The memory was used: the greedy row drafts its own earlier answer the second time.
    assert accepted[1][0] > accepted[0][0] and accepted[1][1:].sum() > 0, accepted


# Greedy rows, one setting each: a bias that forces id 9, then each penalty alone, strong
# enough that the penalised argmax leaves the raw one.
ADJUSTED = dict(logit_bias=[{9: 1000.0}, None, None, None],
                repetition_penalty=[1.0, 4.0, 1.0, 1.0],
                presence_penalty=[0.0, 0.0, 4.0, 0.0],
                frequency_penalty=[0.0, 0.0, 0.0, 3.0])
ADJUSTED_ROWS = ("logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty")


@pytest.mark.parametrize("method", ["generate", "chain",
                                    pytest.param("tree", marks=pytest.mark.slow)])
def test_greedy_top_lists_follow_the_bias_and_penalties(target, close_draft, method):
  """A greedy row under a logit bias or a penalty emits the argmax of its adjusted logits;
  its top list ranks the same adjusted logits, so the first id is the token emitted (log p
  0) and the rest follow the penalised logits of a full forward, not the raw ones."""
  prompts = [[3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8], [1, 1, 2, 3, 5, 8], [6, 6, 6, 6]]
  n = 3
  kw = dict(max_new_tokens=10, return_logprobs=jspec.Logprobs(top=n), eos_id=(), **ADJUSTED)
  if method == "generate":
    out = jspec.generate(target, prompts, **kw)
  else:
    spec = (dict(num_draft_tokens=3) if method == "chain" else dict(tree=BINARY))
    out = jspec.speculative_generate(target, close_draft, prompts, **spec, **kw)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  top_ids, top_values = np.asarray(out.top_ids), np.asarray(out.top_logprobs)
  assert np.all(tokens[0, :lengths[0]] == 9)  # the bias decides row 0
  for b, name in enumerate(ADJUSTED_ROWS):
    k = int(lengths[b])
    np.testing.assert_array_equal(top_ids[b, :k, 0], tokens[b, :k], err_msg=f"{method} {name}")
    np.testing.assert_array_equal(top_values[b, :k],
                                  np.broadcast_to(np.where(np.arange(n) == 0, 0.0, -np.inf),
                                                  (k, n)), err_msg=f"{method} {name}")
    np.testing.assert_array_equal(np.asarray(out.logprobs)[b, :k], 0.0)
    # The whole list, against a full forward's logits adjusted by the reference formulas.
    context = prompts[b] + tokens[b, :k].tolist()
    logits = np.asarray(target.logits(np.asarray([context], np.int32)))[0]
    bias = np.zeros(target.vocab_size, np.float32)
    for i, v in (ADJUSTED["logit_bias"][b] or {}).items():
      bias[i] = v
    for j in range(k):
      adjusted = penalized_logits(
          logits[len(prompts[b]) - 1 + j], np.asarray(prompts[b]), tokens[b, :j].tolist(),
          ADJUSTED["repetition_penalty"][b], ADJUSTED["presence_penalty"][b],
          ADJUSTED["frequency_penalty"][b], bias)
      np.testing.assert_array_equal(top_ids[b, j],
                                    np.argsort(-adjusted, kind="stable")[:n],
                                    err_msg=f"{method} {name} position {j}")
