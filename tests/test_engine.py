"""`jspec.Engine`: live requests joining and leaving the slots of one decode state."""

import threading

import numpy as np
import pytest

import jspec
from jspec.planner import engine as engine_lib
from conftest import assert_greedy_match, ragged_prompts

V = 64


@pytest.fixture(scope="module")
def ngram_engine(target):
  engine = jspec.Engine(target, jspec.NGram(V, max_ngram=2), slots=3, num_draft_tokens=3,
                        cache_length=96, rounds=2, max_queue=64)
  yield engine
  engine.close()


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_requests_from_many_threads_equal_their_lone_runs(target, ngram_engine):
  """Requests of mixed lengths submitted from 4 threads while others decode: each
  greedy answer equals speculative_generate on its prompt alone, and streaming yields
  the same tokens as the result."""
  prompts = ragged_prompts(10, V, seed=2)
  news = [int(n) for n in np.random.default_rng(2).integers(1, 40, size=10)]
  handles = [None] * 10

  def submit(ids):
    for i in ids:
      handles[i] = ngram_engine.submit(prompts[i], max_new_tokens=news[i])

  threads = [threading.Thread(target=submit, args=(range(t, 10, 4),)) for t in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  streamed = list(handles[0])
  for i, h in enumerate(handles):
    out = h.result(timeout=300)
    alone = jspec.speculative_generate(target, jspec.NGram(V, max_ngram=2), [prompts[i]],
                                       num_draft_tokens=3, max_new_tokens=news[i], eos_id=())
    assert out.finish_reason == "length" and len(out.tokens) == news[i]
    assert_greedy_match(target, [prompts[i]], np.asarray(alone.tokens),
                        np.asarray([out.tokens]))
    assert out.target_calls == int(alone.stats.target_calls[0])
    assert len(out.token_times) == news[i] and out.time_to_first_token > 0
    assert out.token_times == sorted(out.token_times)
  assert streamed == handles[0].result().tokens


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_sampled_request_and_stop_ids(target, ngram_engine):
  """A sampled request equals the lone run with the same seed; a stop id ends a request
  (kept, as EOS is) and frees its slot."""
  prompt = [5, 9, 2, 7]
  h = ngram_engine.submit(prompt, max_new_tokens=20, temperature=0.9, top_k=10, seed=42)
  alone = jspec.speculative_generate(target, jspec.NGram(V, max_ngram=2), [prompt],
                                     num_draft_tokens=3, max_new_tokens=20, temperature=0.9,
                                     top_k=10, seed=[42], eos_id=())
  assert h.result(timeout=300).tokens == np.asarray(alone.tokens[0]).tolist()
  full = ngram_engine.submit(prompt, max_new_tokens=20).result(timeout=300).tokens
  stop = full[6]
  out = ngram_engine.submit(prompt, max_new_tokens=20, stop_ids=[stop]).result(timeout=300)
  assert out.finish_reason == "stop"
  assert out.tokens == full[:full.index(stop) + 1]


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_cancel_full_queue_and_bad_input(target):
  """Cancelling a waiting and a decoding request, a full queue, and bad input: clear
  errors before any tracing; every request is answered, refused or cancelled."""
  idle = jspec.Engine(target, slots=1, cache_length=96, max_queue=2, start=False)
  # The free slot takes one, two may wait for it: the fourth is refused.
  waiting = [idle.submit([p], max_new_tokens=5) for p in (4, 6, 8)]
  with pytest.raises(engine_lib.QueueFull, match="2 requests already wait.*max_queue=2"):
    idle.submit([7], max_new_tokens=5)
  assert waiting[1].cancel() and not waiting[1].cancel()
  assert waiting[1].result(timeout=1).finish_reason == "cancelled"
  with pytest.raises(ValueError, match="not a handle of this engine"):
    jspec.Engine(target, slots=1, cache_length=32, start=False).cancel(waiting[0])
  idle.start()  # the one left waiting is served
  assert waiting[0].result(timeout=300).finish_reason == "length"
  idle.close()
  with pytest.raises(engine_lib.EngineClosed):
    idle.submit([1], max_new_tokens=4)

  engine = jspec.Engine(target, slots=1, cache_length=400, rounds=1)
  try:
    long = engine.submit([1, 2, 3], max_new_tokens=390)
    for _ in long:  # the first token: it is decoding
      break
    assert long.cancel()
    out = long.result(timeout=300)
    assert out.finish_reason == "cancelled" and len(out.tokens) < 390
    after = engine.submit([1, 2, 3], max_new_tokens=5).result(timeout=300)  # the slot is free
    assert after.finish_reason == "length" and len(after.tokens) == 5
    with pytest.raises(ValueError, match="cache_length"):
      engine.submit([1] * 20, max_new_tokens=390)
    with pytest.raises(ValueError, match="temperature"):
      engine.submit([1], max_new_tokens=4, temperature=-1)
    with pytest.raises(ValueError, match="penalties"):
      engine.submit([1], max_new_tokens=4, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="non-empty"):
      engine.submit([], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
      engine.submit([1], max_new_tokens=0)
    with pytest.raises(ValueError, match="stop_ids"):
      engine.submit([1], max_new_tokens=4, stop_ids=[V])
  finally:
    engine.close(drain=False, timeout=60)


@pytest.mark.parametrize("auto", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["fixed", "auto"])
@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_batch_follows_the_load_and_rows_survive_the_moves(target, close_draft, far_draft,
                                                           auto):
  """Four requests at once grow the state from batch 1 to 4; as they finish, the long one
  left is moved into a smaller batch mid-answer. Every answer equals its lone run (greedy:
  a row moved between batches keeps its cache, drafter state and counters). With "auto"
  (costs given, and a draft the target rarely agrees with) rounds at K = 3 give way to
  plain rounds as the evidence comes in."""
  k = jspec.AutoK(choices=(0, 3), costs=(1.0, 1.6)) if auto else 3
  draft = far_draft if auto else close_draft
  engine = jspec.Engine(target, draft, slots=4, num_draft_tokens=k, cache_length=96,
                        rounds=1)
  try:
    assert engine.buckets == (1, 2, 4) and engine.batch == 1
    prompts = ragged_prompts(4, V, seed=9)
    news = [5, 9, 60, 3]
    handles = [engine.submit(p, max_new_tokens=n) for p, n in zip(prompts, news)]
    outs = [h.result(timeout=300) for h in handles]
    assert engine.batch < 4  # moved down while the long request still decoded
    for p, n, out in zip(prompts, news, outs):
      alone = jspec.speculative_generate(target, draft, [p], num_draft_tokens=3,
                                         max_new_tokens=n, eos_id=())
      assert_greedy_match(target, [p], np.asarray(alone.tokens), np.asarray([out.tokens]))
      if not auto:
        assert out.target_calls == int(alone.stats.target_calls[0])
        assert out.position_judged == np.asarray(alone.stats.position_judged[0]).tolist()
    assert 4 in engine.runs_by_batch and min(engine.runs_by_batch) < 4
    if auto:
      assert engine.rounds_by_k[0] > 0 and engine.rounds_by_k[3] > 0, engine.rounds_by_k
  finally:
    engine.close()


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_a_request_can_opt_out_of_speculation(target, close_draft):
  """speculate=False: the request's drafts are never judged (one token per round, equal
  to plain decoding) while its neighbour drafts as usual; max_draft_tokens caps K."""
  engine = jspec.Engine(target, close_draft, slots=2, num_draft_tokens=3, cache_length=64,
                        rounds=2, buckets=[2])
  try:
    prompt = [3, 1, 4, 1, 5]
    off = engine.submit(prompt, max_new_tokens=20, speculate=False)
    on = engine.submit(prompt, max_new_tokens=20)
    one = engine.submit(prompt, max_new_tokens=20, max_draft_tokens=1)
    off, on, one = (h.result(timeout=300) for h in (off, on, one))
  finally:
    engine.close()
  plain = jspec.generate(target, [prompt], max_new_tokens=20, eos_id=())
  spec = jspec.speculative_generate(target, close_draft, [prompt], num_draft_tokens=3,
                                    max_new_tokens=20, eos_id=())
  expected = np.asarray(plain.tokens[0]).tolist()
  assert off.tokens == on.tokens == one.tokens == expected
  assert off.target_calls == 20 and off.accepted == 0 and sum(off.position_judged) == 0
  assert on.target_calls == int(spec.stats.target_calls[0])
  assert on.accepted == int(spec.stats.accepted[0])
  assert on.position_judged == np.asarray(spec.stats.position_judged[0]).tolist()
  assert on.position_judged[0] == on.target_calls  # the neighbour drafted every round
  assert one.position_judged[1:] == [0, 0] and one.position_judged[0] > 0
  with pytest.raises(ValueError, match="max_draft_tokens"):
    jspec.Engine(target, close_draft, num_draft_tokens=3, slots=1, cache_length=64,
                 start=False).submit(prompt, max_new_tokens=4, max_draft_tokens=-1)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_logprobs_per_token(target, close_draft):
  """Engine(logprobs=n): every token's log-probability under the model's own distribution
  and its top n alternatives, equal to `speculative_generate`'s records of the lone run,
  for greedy and sampled requests; a stop id cuts the records with the tokens."""
  prompts = ragged_prompts(3, V, seed=11)
  spec = jspec.Logprobs(raw=True, top=3)
  with jspec.Engine(target, close_draft, slots=2, num_draft_tokens=3, cache_length=64,
                    logprobs=3) as engine:
    handles = [engine.submit(p, max_new_tokens=9, temperature=t, seed=5)
               for p, t in zip(prompts, (0.0, 0.8, 0.0))]
    outs = [h.result(timeout=300) for h in handles]
    first = outs[0].tokens[2]
    cut = engine.submit(prompts[0], max_new_tokens=9, stop_ids=[first]).result(timeout=300)
  for h, out, p, t in zip(handles, outs, prompts, (0.0, 0.8, 0.0)):
    alone = jspec.speculative_generate(target, close_draft, [p], num_draft_tokens=3,
                                       max_new_tokens=9, temperature=t, seed=[5], eos_id=(),
                                       return_logprobs=spec)
    n = len(out.tokens)
    assert out.tokens == [int(x) for x in np.asarray(alone.tokens[0, :n])]
    np.testing.assert_allclose(out.logprobs, np.asarray(alone.logprobs[0, :n]),
                               atol=1e-5)
    np.testing.assert_array_equal([[i for i, _ in top] for top in out.top_logprobs],
                                  np.asarray(alone.top_ids[0, :n]))
    np.testing.assert_allclose([[v for _, v in top] for top in out.top_logprobs],
                               np.asarray(alone.top_logprobs[0, :n]), atol=1e-5)
    assert h.logprobs == out.logprobs and len(h.top_logprobs) == n
  k = outs[0].tokens.index(first) + 1
  assert cut.tokens == outs[0].tokens[:k] and cut.logprobs == outs[0].logprobs[:k]
  assert len(cut.top_logprobs) == k


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_ignore_eos_per_request(target):
  """Two requests side by side on an engine whose EOS id the greedy answer emits: one ends
  there (finish "stop"), the other, with ignore_eos, runs to max_new_tokens as a run
  without EOS does."""
  prompt = [3, 14, 15, 9, 2, 6]
  free = jspec.generate(target, [prompt], max_new_tokens=16, eos_id=())
  free = [int(t) for t in np.asarray(free.tokens[0])]
  eos = free[3]
  with jspec.Engine(target, slots=2, cache_length=48, eos_id=[eos]) as engine:
    stopped = engine.submit(prompt, max_new_tokens=16)
    ignoring = engine.submit(prompt, max_new_tokens=16, ignore_eos=True)
    stopped, ignoring = stopped.result(timeout=300), ignoring.result(timeout=300)
  assert stopped.tokens == free[:free.index(eos) + 1] and stopped.finish_reason == "stop"
  assert ignoring.tokens == free and ignoring.finish_reason == "length"


def test_auto_prices_by_its_own_round_times(target):
  """"auto" starts from the prior's costs; once the engine has timed runs of both choices
  at a batch (runs of one choice only; the first run at a batch, which may compile, not
  counted), their ratio replaces the prior's there, and other batches keep the prior."""
  engine = jspec.Engine(target, jspec.NGram(V, max_ngram=2), slots=4, cache_length=64,
                        num_draft_tokens="auto", start=False)
  prior, _ = engine._bucket_costs(4)
  k = engine._auto.choices[1]
  engine._timed(4, {}, {0: 4}, 0.4)  # 0.1 s per plain round
  np.testing.assert_array_equal(engine._bucket_costs(4)[0], prior)  # one choice seen: prior
  engine._timed(4, {0: 4}, {0: 4, k: 2}, 0.6)  # 0.3 s per drafting round
  engine._timed(4, {0: 4, k: 2}, {0: 6, k: 3}, 9.9)  # two choices in one run: not counted
  costs, _ = engine._bucket_costs(4)
  np.testing.assert_allclose(costs, [prior[0], 3 * prior[0]], rtol=1e-6)
  engine._timed(4, {0: 6, k: 3}, {0: 6, k: 5}, 0.2)  # 0.1 s: the running mean moves
  mean = 0.7 * 0.3 + 0.3 * 0.1
  np.testing.assert_allclose(engine._bucket_costs(4)[0], [prior[0], mean / 0.1 * prior[0]],
                             rtol=1e-5)
  np.testing.assert_array_equal(engine._bucket_costs(2)[0], engine._costs[2][0])
