"""Dynamic speculation (`num_draft_tokens="auto"`): exact while K changes per round.

Fixed per-choice costs (`AutoK(costs=...)`) make the schedule deterministic, so
the tests can force the loop through K = 0 rounds (the draft model then misses
tokens and must catch up) and through several K values in one generation, and
check that it did.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
import test_distribution as enumeration
from conftest import assert_greedy_match, ragged_prompts, tiny_config
from jspec.core import dynamic, schedule
from jspec.planner import call_times, cost_model
from jspec.tools import profile
from jspec.core.drafter import DraftContext
from jspec.drafters.draft_model import SYNC_CHUNK
from jspec.drafters.suffix import SuffixMemory
from reference import assert_counts_match

# Costs under which a mediocre draft flips between K = 0 and K >= 1 as the estimate
# moves: at the prior 0.6, K = 1 wins (1.6 / 1.5 > 1 / 1.0); below about 0.5, K = 0.
SWITCHING = schedule.AutoK(choices=(0, 1, 2, 4), costs=(1.0, 1.5, 1.9, 2.6))


def used(out):
  return {k for k, r in out.rounds_by_k.items() if r}


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("which", ["close", "far"])
def test_greedy_equals_baseline(target, close_draft, far_draft, batch, which):
  draft = close_draft if which == "close" else far_draft
  prompts = ragged_prompts(batch, target.vocab_size, seed=40 + batch)
  kw = dict(max_new_tokens=40, eos_id=())
  base = jspec.generate(target, prompts, **kw)
  out = jspec.speculative_generate(target, draft, prompts, num_draft_tokens=SWITCHING, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))
  np.testing.assert_array_equal(out.lengths, base.lengths)
  # The schedule really moved: both speculation and plain rounds ran.
  assert 0 in used(out) and used(out) - {0}, out.rounds_by_k
  assert sum(out.rounds_by_k.values()) == int(np.max(np.asarray(out.stats.target_calls)))


def test_catch_up_after_plain_rounds_matches_prefill(target, far_draft):
  """After rounds without drafting, `sync` leaves the draft cache equal to a prefill."""
  drafter = jspec.DraftModel(far_draft)
  B, S = 2, 64
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(0, 64, size=(B, S)), jnp.int32)
  L = jnp.asarray([41, 23], jnp.int32)
  synced = jnp.asarray([3, 22], jnp.int32)  # row 1: nothing to catch up
  # A cache that is current below `synced` only: stale garbage beyond.
  state = jax.jit(lambda t: drafter.init(t, synced + 1, S))(
      jnp.where(jnp.arange(S)[None, :] < synced[:, None] + 1, tokens, 7)[:, :48])
  synced_cache = jax.jit(lambda c: drafter.sync(c, DraftContext(tokens, L), synced, chunk=8))(
      state)
  full = jax.jit(lambda t: drafter.init(t, L, S))(tokens[:, :48])
  # The reference model keeps one buffer per layer; stacked: k [L, B, Hkv, Dh, S],
  # v [L, B, Hkv, S, Dh].
  stack = lambda cache: {name: np.stack(cache[name]) for name in ("k", "v")}
  synced_cache, full, state = stack(synced_cache), stack(full), stack(state)
  for b in range(B):
    n = int(L[b]) - 2
    np.testing.assert_allclose(synced_cache["k"][:, b, :, :, :n], full["k"][:, b, :, :, :n],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(synced_cache["v"][:, b, :, :n], full["v"][:, b, :, :n],
                               rtol=1e-5, atol=1e-5)
  # Without the catch-up the stale slots differ: the test can fail.
  assert not np.allclose(state["v"][:, 0, :, :39], full["v"][:, 0, :, :39], atol=1e-3)


@pytest.mark.slow
def test_ngram_greedy_equals_baseline(target):
  prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2]]
  kw = dict(max_new_tokens=30, eos_id=())
  base = jspec.generate(target, prompts, **kw)
  out = jspec.speculative_generate(target, jspec.NGram(vocab_size=64, max_ngram=3), prompts,
                                   num_draft_tokens=SWITCHING, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CountedLookup:
  """An n-gram drafter whose `lookup` count is replaced: `allow` drafts per round."""

  inner: jspec.NGram
  allow: int = dataclasses.field(metadata=dict(static=True))

  @property
  def vocab_size(self):
    return self.inner.vocab_size

  def init(self, tokens, prompt_lengths, cache_length):
    return self.inner.init(tokens, prompt_lengths, cache_length)

  def propose(self, state, context, num_drafts, params, keys):
    return self.inner.propose(state, context, num_drafts, params, keys)

  def lookup(self, context, num_drafts):
    drafts, _ = self.inner.lookup(context, num_drafts)
    return drafts, jnp.full(context.lengths.shape, self.allow, jnp.int32)


@pytest.mark.slow
@pytest.mark.parametrize("allow", [0, 1, 2])
def test_lookup_count_caps_k(target, allow):
  """A drafter with `lookup` never drafts more than its count: with nothing proposed
  every round is a plain step, whatever the estimate says."""
  prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2]]
  kw = dict(max_new_tokens=30, eos_id=())
  eager = schedule.AutoK(choices=(0, 1, 2, 4), costs=(1.0, 1.05, 1.1, 1.2), prior=0.95)
  drafter = CountedLookup(jspec.NGram(vocab_size=64, max_ngram=3), allow)
  out = jspec.speculative_generate(target, drafter, prompts, num_draft_tokens=eager, **kw)
  base = jspec.generate(target, prompts, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))
  assert max(used(out)) == allow, out.rounds_by_k


def test_plain_decoding_when_speculation_cannot_win(target, close_draft):
  prompts = ragged_prompts(2, target.vocab_size, seed=3)
  kw = dict(max_new_tokens=12, eos_id=())
  slow = schedule.AutoK(choices=(0, 2, 4), costs=(1.0, 4.0, 7.0))  # loses even at 0.9
  out = jspec.speculative_generate(target, close_draft, prompts, num_draft_tokens=slow, **kw)
  base = jspec.generate(target, prompts, **kw)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  assert used(out) == {0}
  assert int(np.sum(np.asarray(out.stats.accepted))) == 0


@pytest.mark.slow
def test_sampled_whole_sequences_follow_target(monkeypatch):
  """Enumeration over V^3 sequences (test_distribution.py) while K switches mid-sequence.

  The prior (0.95) starts the batch at K = 3; the measured acceptance (well below)
  moves later rounds to K = 1, so rows see both within their three tokens.
  """
  config = tiny_config(vocab_size=enumeration.V, layers=1, hidden=16, heads=2, kv_heads=1,
                       scale=0.3)
  target = jspec.models.init(config, seed=21)
  draft = jspec.models.init(config, seed=22)
  exact = enumeration.exact_distribution(target, 1.0, 0)
  # K = 3 at the prior; K = 1 once the critical row has seen a rejection.
  auto = schedule.AutoK(choices=(0, 1, 3), costs=(1.5, 1.0, 1.7), prior=0.95, prior_weight=1e-3)
  spec = jspec.speculative_generate(target, draft, [enumeration.PROMPT] * enumeration.ROWS,
                                    num_draft_tokens=auto, max_new_tokens=enumeration.NEW,
                                    temperature=1.0, seed=77, eos_id=())
  assert spec.rounds_by_k[3] > 0 and spec.rounds_by_k[1] > 0, spec.rounds_by_k
  assert_counts_match(enumeration.sequence_counts(spec.tokens), exact, "auto")


@pytest.mark.slow
def test_costs_are_cached_on_disk(tmp_path, monkeypatch, target, far_draft):
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))
  drafter = jspec.DraftModel(far_draft)
  first = profile.round_costs(target, drafter, 1, 128, (0, 2), calls=2, repeats=1)
  assert len(first) == 2 and all(c > 0 for c in first)

  def measured_again(*a, **k):
    raise AssertionError("costs were measured twice")

  monkeypatch.setattr(profile, "_measure_costs", measured_again)
  assert profile.round_costs(target, drafter, 1, 128, (2, 0)) == first[::-1]
  # The parsed file is kept per version of the file: another process's edit is seen.
  path = tmp_path / "costs.json"
  table = json.loads(path.read_text())
  path.write_text(json.dumps({key: {k: 2 * t for k, t in times.items()}
                              for key, times in table.items()}, indent=2))
  assert profile.round_costs(target, drafter, 1, 128, (0, 2)) == pytest.approx(
      tuple(2 * c for c in first))
  # A damaged cache file is remeasured, not trusted.
  (tmp_path / "costs.json").write_text("{not json")
  with pytest.raises(AssertionError, match="measured twice"):
    profile.round_costs(target, drafter, 1, 128, (0, 2))


@pytest.mark.slow
def test_call_costs_time_a_rounds_calls_together_or_apart(tmp_path, monkeypatch, target,
                                                         far_draft):
  """By default the verify and the proposal are timed back to back in one loop body
  ("pair"); apart=True times each alone and adds them. Both add a plain round's
  bookkeeping, so cost(0) is the plain round either way."""
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))
  drafter = jspec.DraftModel(far_draft)
  roles = []
  measure = profile._measure_costs

  def recording(role, *args):
    roles.append(role)
    return measure(role, *args)

  monkeypatch.setattr(profile, "_measure_costs", recording)
  together = profile.call_costs(target, drafter, 1, 64, (0, 1, 3), calls=2, repeats=1)
  assert roles == ["target", "pair"]
  table = cost_model.read_table(cost_model.cache_path(None))
  apart = profile.call_costs(target, drafter, 1, 64, (0, 1, 3), calls=2, repeats=1, apart=True)
  assert roles == ["target", "pair", "target", "drafter"]
  # The plain round and the 1-token step were read back, not timed again: the second
  # call only added the verify lengths it lacked. (cost(0) itself may still differ
  # between the two: `monotone` pools it with a noisy cost(1) that came out lower.)
  after = cost_model.read_table(cost_model.cache_path(None))
  assert len(table) == 2 and len(after) == 3  # target and pair; then the drafter alone
  assert any(str(profile.ROUND) in entry for entry in table.values())
  for key, entry in table.items():
    assert {k: after[key][k] for k in entry} == entry
  for costs in (together, apart):
    assert all(c > 0 for c in costs) and costs[0] <= costs[1] <= costs[2]


@pytest.mark.slow
def test_costs_of_filtered_sampling_are_their_own(tmp_path, monkeypatch, target, far_draft):
  """Top-k / top-p sort every position's logits, plain temperature sampling does not:
  "auto" reads costs profiled with the filter on exactly when a row uses one, kept
  under their own key, and a call times nothing itself. Both profiles are made once,
  then each setting reads its own (one profiling for the three: it took 2-3 minutes
  per setting)."""
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))

  def never(*args):
    raise AssertionError("a decoding call timed rounds")

  from jspec.planner import inputs
  S = inputs.cache_bucket(3 + 3 + 7)  # the call's cache: prompt, new tokens, K + 1
  drafter = jspec.DraftModel(far_draft)
  for f in (True, False):
    profile.profile_auto(target, drafter, 1, S, greedy=False, filtered=f, calls=2, repeats=1)
  monkeypatch.setattr(profile, "_measure_costs", never)
  asked = []
  saved = cost_model.saved_round_costs

  def recording(*args, **kw):
    asked.append(kw["filtered"])
    return saved(*args, **kw)

  monkeypatch.setattr(cost_model, "saved_round_costs", recording)
  monkeypatch.setattr(cost_model, "prior_costs", never)  # the saved profile is found
  for top_k, top_p, filtered in [(0, 1.0, False), (0, 0.9, True), (5, 1.0, True)]:
    asked.clear()
    jspec.speculative_generate(target, far_draft, [[1, 2, 3]], num_draft_tokens="auto",
                               max_new_tokens=3, temperature=0.8, top_k=top_k, top_p=top_p)
    assert asked == [filtered], (top_k, top_p)


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_auto_without_a_profile_uses_the_prior_and_times_no_round(tmp_path, monkeypatch, target,
                                                                  far_draft):
  """Without a saved profile, "auto" prices rounds with the prior: no round is timed.
  The target's call is timed in loop once for this machine, model and shape (the
  prior's growth with the block, `jspec.planner.call_times`), the draft model's at one
  token (its step beside the target's), and read back after."""
  monkeypatch.setenv("JSPEC_CACHE_DIR", str(tmp_path))

  def never(*args):
    raise AssertionError("a decoding call timed rounds")

  monkeypatch.setattr(profile, "_measure_costs", never)
  # The device's rates as if measured before (the probe has a slow test of its own).
  rates = cost_model.DeviceRates(bandwidth=20e9, rows=(1, 8, 512), compute=(10e9, 30e9, 170e9))
  monkeypatch.setattr(cost_model, "device_rates", lambda cache_dir=None: rates)
  priced, timed = [], []
  prior, loop_times = cost_model.prior_costs, call_times.loop_times
  pair_ratios = call_times.pair_ratios

  def recording(*args, **kw):
    priced.append((args[4], sorted(args[6]), args[7]))
    return prior(*args, **kw)

  def timing(model, batch, blocks, cache_length, calls=None, repeats=7):
    timed.extend((batch, b) for b in blocks)
    return loop_times(model, batch, blocks, cache_length, calls, repeats)

  def pairs(model, reference, batch, block, cache_length):
    timed.append(("pair", batch, block))
    return pair_ratios(model, reference, batch, block, cache_length)

  monkeypatch.setattr(cost_model, "prior_costs", recording)
  monkeypatch.setattr(call_times, "loop_times", timing)
  monkeypatch.setattr(call_times, "pair_ratios", pairs)
  prompts = ragged_prompts(2, target.vocab_size, seed=4)
  out = jspec.speculative_generate(target, far_draft, prompts, num_draft_tokens="auto",
                                   max_new_tokens=8, eos_id=())
  base = jspec.generate(target, prompts, max_new_tokens=8, eos_id=())
  choices = schedule.AutoK().choices
  assert [p[0] for p in priced] == [choices]
  assert priced[0][1] == sorted(k + 1 for k in choices)  # a growth per block
  # [B, T] of each timing: the target at 1, 2 and max K + 1 tokens; the draft at 1 (its
  # step) and at a catch-up call's block, each beside the target's one-token call.
  assert sorted(timed, key=str) == sorted([(2, 1), (2, 2), (2, max(choices) + 1),
                                           ("pair", 2, 1), ("pair", 2, SYNC_CHUNK)], key=str)
  assert priced[0][2] > 0.0  # the draft step priced beside the target's (a timed ratio)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))
  assert len(out.rounds_by_k) <= schedule.AutoK().compiled == 2
  # A second call reads the calls' times back.
  jspec.speculative_generate(target, far_draft, prompts, num_draft_tokens="auto",
                             max_new_tokens=8, eos_id=())
  assert len(timed) == 5 and (tmp_path / "calls.json").exists()


@pytest.mark.parametrize("bad", [
    dict(choices=(0,)), dict(choices=(1, 1)), dict(choices=(0, -1, 2)), dict(prior=1.0),
    dict(decay=0.0), dict(probe_every=-1), dict(costs=(1.0,)), dict(choices=(0, 2), costs=(1.0, -2.0)),
    dict(switch_margin=1.0), dict(switch_margin=-0.1)])
def test_bad_settings(bad):
  with pytest.raises(ValueError):
    schedule.AutoK(**bad)


def test_bad_num_draft_tokens(target, far_draft):
  with pytest.raises(ValueError, match="auto"):
    jspec.speculative_generate(target, far_draft, [[1, 2]], num_draft_tokens="fast",
                               max_new_tokens=4)


def test_monotone_costs():
  assert schedule.monotone((0, 1, 2, 4), (1.0, 2.0, 3.0, 2.5)) == pytest.approx(
      (1.0, 2.0, 2.75, 2.75))
  assert schedule.monotone((4, 0, 2), (5.0, 1.0, 3.0)) == (5.0, 1.0, 3.0)  # unsorted, fine


@pytest.mark.slow
@pytest.mark.parametrize("k,cost,unit", [(2, 2.0, 5), (4, 4.0, 15)])
def test_probes_after_idle_rounds_back_off(target, far_draft, k, cost, unit):
  """A prior that says "never speculate" still drafts after probe_every idle rounds,
  then after twice as many, and so on: gaps 5, 10, 20, 40. Where a drafting round costs
  c > 2 plain ones, each wait is c - 1 times as long (`schedule.waited`): 15, 30, ... at 4
  (where K = 4 can still pay at the ceiling: 4.5 tokens a round)."""
  never = schedule.AutoK(choices=(0, k), costs=(1.0, cost), prior=0.05, ceiling=0.95,
                        probe_every=5)
  prompts = ragged_prompts(1, target.vocab_size, seed=9)
  kw = dict(max_new_tokens=60, eos_id=())
  out = jspec.speculative_generate(target, far_draft, prompts, num_draft_tokens=never, **kw)
  base = jspec.generate(target, prompts, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))
  # With R idle rounds in all, the probes are those whose doubled gaps fit in R.
  idle, probes = out.rounds_by_k[0], out.rounds_by_k[k]
  gaps = np.cumsum([unit * 2 ** i for i in range(8)])
  assert probes == int(np.sum(gaps <= idle)) and probes >= 2, out.rounds_by_k


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_a_drafting_round_leaves_nothing_to_catch_up(target):
  """After a round that drafted, the draft model is current below L' - 2 (its next
  `propose` feeds the last two tokens): no catch-up call and no fee. After a plain
  round the fee is the catch-up calls `sync` would make, times one call's cost."""
  from jspec.core import decode

  drafter = jspec.DraftModel(target)  # the target's own drafts: all accepted
  auto = schedule.AutoK(choices=(0, 3), costs=(1.0, 1.2))
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 64, size=(2, 40)), jnp.int32)
  lengths = jnp.asarray([40, 21], jnp.int32)
  config = decode.DecodeConfig(num_draft_tokens=3, cache_length=96)
  state = dynamic.init_state(target, drafter, tokens, lengths, jnp.asarray([30, 30], jnp.int32),
                             None, jnp.asarray([-1], jnp.int32), jnp.arange(2, dtype=jnp.int32),
                             jnp.asarray(auto.costs), config, auto, None, 0.5)
  calls = lambda st: int(drafter.sync_calls(DraftContext(st.decode.tokens, st.decode.lengths),
                                            st.schedule.synced))
  fee = lambda st: float(dynamic.catch_up_fee(drafter, st))
  # Nothing fed yet: the whole prompt (38 tokens of the longer row) in calls of 16.
  assert calls(state) == 3 and fee(state) == pytest.approx(1.5)
  drafted = dynamic.fixed_round(target, drafter, state, config, auto, index=1, sync=True)
  # Rows moved by 4: counted from where the round began, they would need a call.
  assert np.all(np.asarray(drafted.decode.stats.accepted) == 3)
  assert calls(drafted) == 0 and fee(drafted) == 0.0
  plain = drafted
  for _ in range(3):
    plain = dynamic.fixed_round(target, drafter, plain, config, auto, index=0)
  assert calls(plain) == 1 and fee(plain) == pytest.approx(0.5)


def test_a_catch_up_fee_spreads_over_the_tokens_to_go():
  """A drafting K pays the fee, counted twice (the calls, and the chance they are sunk):
  its rate becomes tokens / (tokens / rate + 2 fee), so a K that beats plain decoding
  over a long call loses to it near the end."""
  auto = schedule.AutoK(choices=(0, 1), costs=(1.0, 1.2))
  # Acceptance (8 + 0.6 * 4) / (9 + 4) = 0.8: K = 1 makes 1.8 tokens for 1.2, a rate of
  # 1.5 against plain decoding's 1; with the fee, 1.5 t / (t + 12), which wins past t = 24.
  sched = one_row((1.0, 1.2), accepted=8.0, judged=9.0)
  fee = jnp.asarray(4.0, jnp.float32)
  for togo, k in ((100, 1), (25, 1), (23, 0), (2, 0)):
    assert int(schedule.choose(sched, auto, jnp.asarray([togo], jnp.int32), None, fee)) == k
  assert int(schedule.choose(sched, auto, jnp.asarray([2], jnp.int32))) == 1  # no fee


def one_row(costs, accepted, judged, idle=0, gap=64):
  """A one-row schedule with this much evidence."""
  f = lambda x: jnp.asarray([x], jnp.float32)
  return schedule.ScheduleState(costs=jnp.asarray(costs, jnp.float32), accepted=f(accepted),
                               judged=f(judged), synced=jnp.zeros((1,), jnp.int32),
                               idle=jnp.asarray(idle, jnp.int32), gap=jnp.asarray(gap, jnp.int32),
                               rounds=jnp.zeros((len(costs),), jnp.int32),
                               counts=jnp.full((1,), 4, jnp.int32),
                               first=jnp.zeros((1,), jnp.int32))


@pytest.mark.parametrize("costs,index,wait", [((1.0, 1.7), 1, 8), ((1.0, 3.0), 1, 16),
                                              ((1.0, 5.0), 1, 32), ((2.0, 3.0, 9.0), 2, 28),
                                              ((2.0, 3.0, 9.0), 1, 8), ((2.0, 3.0, 9.0), None, 8)])
def test_a_probe_waits_in_units_of_its_extra_cost(costs, index, wait):
  """gap = 8 idle rounds, scaled by the probe's c_K / c_0 - 1 where that is above 1: a probe
  never spends more than one plain round's extra time per gap idle rounds. No index: the
  cheapest drafting choice's (the earliest any probe could be due)."""
  auto = schedule.AutoK(choices=(0, 1) if len(costs) == 2 else (0, 1, 4), costs=costs,
                        probe_every=8)
  at = lambda idle: bool(schedule.waited(one_row(costs, 0.0, 0.0, idle=idle, gap=8), auto,
                                         index))
  assert not at(wait - 1) and at(wait)


def test_choice_credits_only_the_drafts_a_lookup_has():
  """With equal costs (verify as cheap as a step) and two drafts available, K = 2 and
  K = 4 expect the same tokens: the best is K = 2, and a loop already at K = 4 stays
  there. With no drafts, K = 0 is best wherever a K > 0 costs more."""
  auto = schedule.AutoK(choices=(0, 1, 2, 4), costs=(1.0,) * 4)
  sched = one_row((1.0,) * 4, accepted=8.0, judged=10.0)
  remaining = jnp.asarray([10], jnp.int32)
  two = jnp.asarray([2], jnp.int32)
  assert int(schedule.choose(sched, auto, remaining, two)) == 2
  assert bool(schedule.stays(sched, auto, remaining, two, 3))
  assert not bool(schedule.stays(sched, auto, remaining, two, 1))  # E[1] / E[2] = 1.8 / 2.44
  rising = one_row((1.0, 1.5, 1.9, 2.6), accepted=8.0, judged=10.0)
  none = jnp.asarray([0], jnp.int32)
  assert int(schedule.choose(rising, auto, remaining, none)) == 0
  assert not bool(schedule.stays(rising, auto, remaining, none, 3))
  # Without a lookup every K is credited all its drafts.
  assert int(schedule.choose(sched, auto, remaining)) == 3


def test_the_critical_row_the_drafts_serve_worst_sets_the_pace():
  """Two rows, one whose drafts are mostly accepted (a = 0.9) and one whose are not
  (a = 0.1): tied for tokens to go, the second sets the batch's pace (K = 0); once it
  is ahead, the first alone is critical (K = 2). A row with no draft this round
  (lookup count 0) gains nothing from any K."""
  auto = schedule.AutoK(choices=(0, 2), costs=(1.0, 1.5))
  f = lambda *x: jnp.asarray(x, jnp.float32)
  sched = schedule.ScheduleState(costs=f(1.0, 1.5), accepted=f(90.0, 10.0), judged=f(100.0, 100.0),
                                synced=jnp.zeros((2,), jnp.int32), idle=jnp.zeros((), jnp.int32),
                                gap=jnp.asarray(64, jnp.int32), rounds=jnp.zeros((2,), jnp.int32),
                                counts=jnp.full((2,), 2, jnp.int32), first=jnp.zeros((2,), jnp.int32))
  rem = lambda *x: jnp.asarray(x, jnp.int32)
  assert int(schedule.choose(sched, auto, rem(20, 20))) == 0
  assert int(schedule.choose(sched, auto, rem(20, 19))) == 1
  assert int(schedule.choose(sched, auto, rem(20, -1))) == 1  # the slow row is done
  assert int(schedule.choose(sched, auto, rem(20, 19), jnp.asarray([0, 2], jnp.int32))) == 0


@pytest.mark.parametrize("margin", [0.0, 0.05])
def test_switch_margin_keeps_a_near_tie(margin):
  """K = 1 at 97% of K = 2's rate: kept with a 5% margin, left with none; the best K
  is always kept, and a due probe ends a K = 0 phase whatever the margin."""
  auto = schedule.AutoK(choices=(0, 1, 2), costs=(1.0, 1.0, 1.0), switch_margin=margin,
                       probe_every=4)
  a = 0.6  # the prior, no evidence: tokens 1, 1.6, 1.96
  costs = (10.0, 1.6 / (0.97 * 1.96), 1.0)  # K = 1's rate is 0.97 of K = 2's
  sched = one_row(costs, accepted=0.0, judged=0.0)
  remaining = jnp.asarray([10], jnp.int32)
  assert auto.prior == a and int(schedule.choose(sched, auto, remaining)) == 2
  assert bool(schedule.stays(sched, auto, remaining, None, 1)) == (margin > 0)
  assert bool(schedule.stays(sched, auto, remaining, None, 2))
  near_plain = one_row((1.0, 1.6 / 1.02, 10.0), accepted=0.0, judged=0.0)
  assert int(schedule.choose(near_plain, auto, remaining)) == 1
  assert bool(schedule.stays(near_plain, auto, remaining, None, 0)) == (margin > 0)
  due = one_row((1.0, 1.6 / 1.02, 10.0), accepted=0.0, judged=0.0, idle=4, gap=4)
  assert not bool(schedule.stays(due, auto, remaining, None, 0))


@pytest.mark.slow
@pytest.mark.parametrize("allow", [0, 1, 2])
def test_evidence_counts_proposed_drafts_only(target, allow):
  """A round at K = 2 whose lookup had `allow` drafts judges its placeholders too, but
  the acceptance estimate counts at most `allow` judged and accepted drafts per row."""
  from jspec.core import decode

  drafter = CountedLookup(jspec.NGram(vocab_size=64, max_ngram=3), allow)
  auto = schedule.AutoK(choices=(0, 2), costs=(1.0, 1.0))
  tokens = jnp.asarray([[5, 6, 7, 8, 9, 5, 6, 7], [1, 2, 3, 1, 2, 3, 1, 2]], jnp.int32)
  lengths = jnp.asarray([8, 8], jnp.int32)
  config = decode.DecodeConfig(num_draft_tokens=2, cache_length=32)
  state = dynamic.init_state(target, drafter, tokens, lengths, jnp.asarray([10, 10], jnp.int32),
                             None, jnp.asarray([-1], jnp.int32), jnp.arange(2, dtype=jnp.int32),
                             jnp.asarray(auto.costs), config, auto)
  new = dynamic.fixed_round(target, drafter, state, config, auto, index=1)
  judged, accepted = np.asarray(new.schedule.judged), np.asarray(new.schedule.accepted)
  assert np.all(judged == (0 if allow == 0 else np.minimum(accepted + 1, allow)))
  assert np.all(accepted <= allow)
  # The round itself judged both drafts: one target call per row.
  assert np.all(np.asarray(new.decode.stats.target_calls) == 1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Oracle:
  """A lookup drafter that proposes a known continuation: row b's drafts for a round
  at length L are sequence[b, L:L+K] (the target's greedy output makes them all right)."""

  sequence: jax.Array  # [B, T] int32
  vocab_size: int = dataclasses.field(metadata=dict(static=True))
  count: int = dataclasses.field(default=8, metadata=dict(static=True))

  def init(self, tokens, prompt_lengths, cache_length):
    return None

  def lookup(self, context, num_drafts):
    T = self.sequence.shape[1]
    index = jnp.minimum(context.lengths[:, None] + jnp.arange(num_drafts)[None, :], T - 1)
    drafts = jnp.take_along_axis(self.sequence, index, axis=1).astype(jnp.int32)
    return drafts, jnp.full(context.lengths.shape, min(self.count, num_drafts), jnp.int32)

  def propose(self, state, context, num_drafts, params, keys):
    return self.lookup(context, num_drafts)[0], None, state


@pytest.mark.parametrize("longest", [100, 200, 500])
def test_lookup_over_the_live_span_equals_the_whole_buffer(longest):
  """`dynamic.lookup_window` looks up over the shortest span (128, 256, 512 of a 512-slot
  buffer on CPU) that holds every row's committed tokens: the same drafts and counts as
  over the whole buffer, whatever the scratch past each row holds."""
  V, S, K = 6, 512, 4
  rng = np.random.default_rng(longest)
  tokens = jnp.asarray(rng.integers(0, V, (4, S)), jnp.int32)  # scratch past L: junk
  lengths = jnp.asarray([1, 3, longest // 2, longest], jnp.int32)
  memory = SuffixMemory(jnp.asarray(rng.integers(-1, V, (64,)), jnp.int32))
  drafters = [jspec.NGram(vocab_size=V), jspec.NGram(vocab_size=V, drafts_per_ngram=None),
              jspec.Datastore.from_sequences([list(rng.integers(0, V, 50))], V),
              jspec.Suffix(vocab_size=V, memory=memory)]
  for drafter in drafters:
    want = jax.jit(lambda t, n: drafter.lookup(DraftContext(tokens=t, lengths=n), K))(
        tokens, lengths)
    got = jax.jit(lambda t, n: dynamic.lookup_window(drafter, t, n, K))(tokens, lengths)
    for w, g in zip(want, got):
      np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=type(drafter).__name__)


@pytest.mark.slow
def test_plain_rounds_score_a_lookups_first_draft(target):
  """A round at K = 0 judges a lookup's first draft against the emitted token: row 0's
  draft is the target's greedy token (accepted), row 1's is not, row 2 has none."""
  from jspec.core import decode

  prompts = ragged_prompts(3, target.vocab_size, seed=12)
  kw = dict(max_new_tokens=1, eos_id=())
  base = np.asarray(jspec.generate(target, prompts, **kw).tokens)[:, 0]
  tokens, lengths = np.zeros((3, 16), np.int32), np.asarray([len(p) for p in prompts], np.int32)
  for b, p in enumerate(prompts):
    tokens[b, :len(p)] = p
  sequence = tokens.copy()
  sequence[np.arange(3), lengths] = [base[0], (base[1] + 1) % target.vocab_size, base[2]]
  for count, want in [(8, ([1, 1, 1], [1, 0, 1])), (0, ([0, 0, 0], [0, 0, 0]))]:
    drafter = Oracle(jnp.asarray(sequence), target.vocab_size, count)
    auto = schedule.AutoK(choices=(0, 2), costs=(1.0, 1.0))
    config = decode.DecodeConfig(num_draft_tokens=2, cache_length=32)
    state = dynamic.init_state(target, drafter, jnp.asarray(tokens), jnp.asarray(lengths),
                               jnp.full((3,), 4, jnp.int32), None, jnp.asarray([-1], jnp.int32),
                               jnp.arange(3, dtype=jnp.int32), jnp.asarray(auto.costs), config,
                               auto)
    new = dynamic.fixed_round(target, drafter, state, config, auto, index=0)
    np.testing.assert_array_equal(np.asarray(new.decode.tokens)[np.arange(3), lengths], base)
    np.testing.assert_array_equal(new.schedule.judged, np.asarray(want[0], np.float32))
    np.testing.assert_array_equal(new.schedule.accepted, np.asarray(want[1], np.float32))


@pytest.mark.slow
def test_plain_rounds_evidence_brings_drafting_back(target):
  """A prior that says "do not draft" and no probes: only the evidence of plain rounds
  can move the loop to K > 0, and with a lookup that is always right it does."""
  prompts = ragged_prompts(2, target.vocab_size, seed=31)
  kw = dict(max_new_tokens=40, eos_id=())
  base = jspec.generate(target, prompts, **kw)
  P = max(len(p) for p in prompts)
  sequence = np.zeros((2, P + 48), np.int32)
  for b, p in enumerate(prompts):
    sequence[b, :len(p)] = p
    sequence[b, len(p):len(p) + 40] = np.asarray(base.tokens)[b]
  shy = schedule.AutoK(choices=(0, 2), costs=(1.0, 1.5), prior=0.1, probe_every=0)
  out = jspec.speculative_generate(target, Oracle(jnp.asarray(sequence), target.vocab_size),
                                   prompts, num_draft_tokens=shy, **kw)
  np.testing.assert_array_equal(out.tokens, base.tokens)
  assert out.rounds_by_k[0] > 0 and out.rounds_by_k[2] > 0, out.rounds_by_k


@pytest.mark.slow
def test_sampled_ngram_follows_target_with_plain_round_evidence():
  """Enumeration (test_distribution.py) with an n-gram drafter under a schedule that
  starts at K = 0 and drafts only once a plain round's first draft was right: the
  prompt 1 4 1 4 has a draft (1) from the first round on. Row 0 asks for one token
  more than the others, so the schedule follows it alone (the critical row), and seed
  79 gives it that hit; every row's first three tokens are counted."""
  config = tiny_config(vocab_size=enumeration.V, layers=1, hidden=16, heads=2, kv_heads=1,
                       scale=0.3)
  target = jspec.models.init(config, seed=21)
  prompt = (1, 4, 1, 4)
  exact = enumeration.exact_distribution(target, 1.0, 0, prompt)
  # At the prior 0.3, K = 1's rate 1.3 / 1.4 < 1; after one hit (a = 0.65), 1.65 / 1.4.
  auto = schedule.AutoK(choices=(0, 1), costs=(1.0, 1.4), prior=0.3, prior_weight=1.0,
                       probe_every=0)
  ngram = jspec.NGram(vocab_size=enumeration.V, max_ngram=2)
  lengths = [enumeration.NEW + 1] + [enumeration.NEW] * (enumeration.ROWS - 1)
  spec = jspec.speculative_generate(target, ngram, [list(prompt)] * enumeration.ROWS,
                                    num_draft_tokens=auto, max_new_tokens=lengths,
                                    temperature=1.0, seed=79, eos_id=())
  assert spec.rounds_by_k[1] > 0 and spec.rounds_by_k[0] > 0, spec.rounds_by_k
  tokens = np.asarray(spec.tokens)[:, :enumeration.NEW]
  assert_counts_match(enumeration.sequence_counts(tokens), exact, "auto n-gram")


# ----------------------------------------------------------------------------- feature drafters


def _feature_drafter(kind, target):
  from jspec.drafters import eagle as E
  from jspec.drafters import medusa
  if kind == "medusa":
    return jspec.Medusa.from_target(target, medusa.init_heads(4, target.config.hidden_size))
  config = E.EagleConfig.for_target(target.config, initializer_range=0.3)
  return E.Eagle.from_target(target, E.init_params(config, jax.random.key(1)), config)


@pytest.mark.slow  # fast: the EAGLE cache
@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_feature_drafters_greedy_equals_baseline(target, kind):
  """Medusa and EAGLE under "auto": rounds at K = 0 keep the features current (EAGLE
  takes them in through `observe`), and greedy output equals the baseline."""
  drafter = _feature_drafter(kind, target)
  prompts = ragged_prompts(3, target.vocab_size, seed=44)
  kw = dict(max_new_tokens=40, eos_id=())
  base = jspec.generate(target, prompts, **kw)
  out = jspec.speculative_generate(target, drafter, prompts, num_draft_tokens=SWITCHING, **kw)
  assert_greedy_match(target, prompts, np.asarray(base.tokens), np.asarray(out.tokens))
  assert 0 in used(out) and used(out) - {0}, out.rounds_by_k


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_eagle_cache_stays_true_through_plain_rounds(target):
  """After drafting and plain rounds in any order, EAGLE's cache holds, at every slot up
  to the state's feature_start, the pair a prefill over the committed tokens and the
  target's own features writes: `observe` keeps it so in rounds that do not draft."""
  from jspec.core import decode
  eagle = _feature_drafter("eagle", target)
  auto = schedule.AutoK(choices=(0, 2), costs=(1.0, 1.5))
  B, S = 2, 64
  rng = np.random.default_rng(6)
  tokens = jnp.asarray(rng.integers(0, target.vocab_size, size=(B, 12)), jnp.int32)
  lengths = jnp.asarray([12, 7], jnp.int32)
  config = decode.DecodeConfig(auto.max_k, S)

  @jax.jit
  def run(target, eagle, tokens, lengths):
    state = dynamic.init_state(target, eagle, tokens, lengths, jnp.full((B,), 30, jnp.int32),
                               None, jnp.zeros((0,), jnp.int32), jnp.arange(B, dtype=jnp.int32),
                               auto.costs, config, auto)
    # Every transition: draft -> plain, plain -> plain, plain -> draft, and ending plain.
    for index in (1, 0, 0, 1, 0):  # K = 2, 0, 0, 2, 0
      state = dynamic.fixed_round(target, eagle, state, config, auto, index)
    return state.decode

  s = run(target, eagle, tokens, lengths)
  assert int(s.stats.target_calls.min()) == 5
  L, fs = np.asarray(s.lengths), np.asarray(s.feature_start)
  committed = s.tokens[:, :int(L.max())]
  _, hidden, _ = target.apply(committed, None, jnp.zeros((B,), jnp.int32))
  fresh = jax.jit(lambda t, l, h: eagle.init(t, l, S, h))(committed, s.lengths, hidden[:, :-1])
  got, want = s.drafter_state, fresh
  for b in range(B):
    upto = fs[b] + 1  # slots 0 .. feature_start
    assert upto > lengths[b]  # rounds of both kinds have run past the prompt
    np.testing.assert_allclose(np.asarray(got["k"][b, ..., :upto]),
                               np.asarray(want["k"][b, ..., :upto]), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(got["v"][b, :, :upto]),
                               np.asarray(want["v"][b, :, :upto]), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_a_drafter_with_sync_alone_is_still_caught_up(target):
  """`sync_calls` is optional: a drafter that defines `sync` alone is caught up before
  a drafting round (not left drafting from a stale cache), with no fee priced."""
  from jspec.core import decode
  from jspec.core.drafter import CatchUpDrafter

  class SyncOnly:
    """The draft model's methods, without `sync_calls`; counts its catch-ups."""

    def __init__(self, inner):
      self.inner, self.syncs = inner, []

    def __getattr__(self, name):
      if name == "sync_calls":
        raise AttributeError(name)
      return getattr(self.inner, name)

    def sync(self, state, context, synced):
      jax.debug.callback(lambda: self.syncs.append(1))
      return self.inner.sync(state, context, synced)

  drafter = SyncOnly(jspec.DraftModel(target))
  assert isinstance(drafter, CatchUpDrafter) and not hasattr(drafter, "sync_calls")
  auto = schedule.AutoK(choices=(0, 3), costs=(1.0, 1.2))
  config = decode.DecodeConfig(num_draft_tokens=3, cache_length=96)
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 64, size=(1, 40)), jnp.int32)
  state = dynamic.init_state(target, drafter, tokens, jnp.asarray([40], jnp.int32),
                             jnp.asarray([30], jnp.int32), None, jnp.asarray([-1], jnp.int32),
                             jnp.arange(1, dtype=jnp.int32), jnp.asarray(auto.costs),
                             config, auto, None, 0.5)
  assert dynamic.catch_up_fee(drafter, state) is None
  after = dynamic.fixed_round(target, drafter, state, config, auto, index=1, sync=True)
  jax.effects_barrier()
  assert drafter.syncs and np.all(np.asarray(after.decode.stats.accepted) == 3)
