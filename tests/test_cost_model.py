"""The prior of round costs (`jspec.planner.cost_model`) and the choice of compiled K
(`jspec.core.schedule.select`): host-side arithmetic on made-up device rates."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jspec
from conftest import tiny_config
from jspec.core import schedule
from jspec.planner import call_times, cost_model
from jspec.models import transformer

# A CPU-like device: 20 GB/s, compute that grows slowly with rows (a 5-row product
# costs about 2.5x one row of a model that streams at 20 GB/s).
CPU = cost_model.DeviceRates(bandwidth=20e9, rows=(1, 2, 4, 8, 64, 512),
                             compute=(10e9, 14e9, 20e9, 30e9, 120e9, 170e9))
# An accelerator-like one: 4 TB/s and compute far beyond what a few rows need.
GPU = cost_model.DeviceRates(bandwidth=4e12, rows=(1, 512), compute=(2e12, 5e14))


def abstract(config):
  """A model whose params are shapes only: the prior reads nothing else."""
  params = jax.eval_shape(lambda: transformer.init_params(config, jax.random.key(0)))
  return transformer.make_model(config, params)


@pytest.fixture(scope="module")
def tied():
  return abstract(tiny_config(64, layers=2, hidden=64, tie=True))


@pytest.fixture(scope="module")
def draft():
  return abstract(tiny_config(64, layers=1, hidden=32))


def test_rates_interpolate_in_log_rows():
  assert CPU.flops_rate(1) == 10e9 and CPU.flops_rate(512) == 170e9
  assert CPU.flops_rate(3) == pytest.approx(14e9 + (20e9 - 14e9) * np.log(1.5) / np.log(2))
  assert CPU.flops_rate(1000) == 170e9  # flat past the last count


@pytest.mark.parametrize("batch", [1, 8])
def test_prior_costs_follow_bytes_and_flops(tied, draft, batch):
  target = tied
  ks = (0, 1, 2, 4, 6)
  ngram = jspec.NGram(target.vocab_size)
  cpu = cost_model.prior_costs(target, ngram, batch, 128, ks, CPU)
  gpu = cost_model.prior_costs(target, ngram, batch, 128, ks, GPU)
  assert all(c > 0 for c in cpu) and list(cpu) == sorted(cpu)
  # On the CPU the verify is compute-bound: K = 4 costs well over a step; on the
  # accelerator a few rows are free (the same weights streamed once).
  assert cpu[3] / cpu[0] > (1.5 if batch == 1 else 1.2)
  assert gpu[1] / gpu[0] < 1.05
  # A draft model pays K steps of its own; a lookup drafter nothing.
  with_model = cost_model.prior_costs(target, jspec.DraftModel(draft), batch, 128, ks, CPU)
  assert with_model[0] == cpu[0] and all(m > c for m, c in zip(with_model[1:], cpu[1:]))
  step = cost_model.call_time(draft, batch, 1, 128, CPU)
  argmax = cost_model.TokenChoice().seconds(batch, target.vocab_size, CPU)
  assert with_model[2] - cpu[2] == pytest.approx(2 * (step + argmax), rel=1e-6)


@pytest.mark.parametrize("batch", [1, 64])
def test_prior_prices_how_tokens_are_chosen(tied, draft, batch):
  """A sampled round costs more than a greedy one, a filtered (top-p) one more again,
  and the gap grows with K: the verify chooses at K + 1 positions, a draft model at
  each of its K drafts."""
  ks = (0, 1, 4)
  V = tied.vocab_size
  for drafter in (jspec.NGram(V), jspec.DraftModel(draft)):
    greedy, sampled, filtered = (
        cost_model.prior_costs(tied, drafter, batch, 128, ks, CPU, choice=choice)
        for choice in (cost_model.TokenChoice(), cost_model.TokenChoice(greedy=False),
                       cost_model.TokenChoice(greedy=False, filtered=True)))
    assert all(f > s >= g for f, s, g in zip(filtered, sampled, greedy))
    per_row = cost_model.TokenChoice(greedy=False, filtered=True).seconds(batch, V, CPU)
    chosen = 5 + (4 if isinstance(drafter, jspec.DraftModel) else 0)  # rows chosen at K = 4
    assert filtered[2] - filtered[0] > greedy[2] - greedy[0]
    assert filtered[2] - greedy[2] == pytest.approx(
        chosen * (per_row - cost_model.TokenChoice().seconds(batch, V, CPU)), rel=1e-6)


def test_weight_bytes_count_a_tied_embedding_once(tied, draft):
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))
  w_bytes, _ = cost_model._streamed(tied)
  assert tied.head().lm_head is None and w_bytes == nbytes(tied.params)  # the embedding is the head
  w_bytes, _ = cost_model._streamed(draft)  # untied: a lookup reads a few rows of the embedding
  assert w_bytes == nbytes(draft.params) - nbytes(draft.params["embed"])


def test_device_rates_are_measured_once_per_machine(tmp_path, monkeypatch):
  calls = []

  def fake(cls, repeats=2):
    calls.append(1)
    return CPU

  monkeypatch.setattr(cost_model.DeviceRates, "measure", classmethod(fake))
  assert cost_model.device_rates(str(tmp_path)) == CPU
  assert cost_model.device_rates(str(tmp_path)) == CPU
  assert len(calls) == 1
  saved = json.loads((tmp_path / "device.json").read_text())
  assert list(saved) == [json.dumps(cost_model.machine())]
  (tmp_path / "device.json").write_text("{damaged")
  assert cost_model.device_rates(str(tmp_path)) == CPU and len(calls) == 2


def test_select_keeps_zero_and_the_k_best_at_the_prior():
  auto = schedule.AutoK(choices=(0, 1, 2, 3, 4, 6), variants=3)
  # Rounds as on a small CPU: each draft adds a good part of a step.
  costs = (1.0, 1.4, 1.7, 2.0, 2.3, 2.9)
  ks, cs = schedule.select(auto, costs)
  assert len(ks) == 3 and ks[0] == 0 and cs == tuple(costs[auto.choices.index(k)] for k in ks)
  # The two K >= 1 kept have the best expected tokens per cost at the prior acceptance.
  rate = {k: float(schedule.expected_tokens(auto.prior, k)) / c
          for k, c in zip(auto.choices, costs) if k}
  assert set(ks[1:]) == set(sorted(rate, key=rate.get)[-2:])
  # Fewer worthwhile choices than variants: all of them, unchanged.
  assert schedule.select(schedule.AutoK(choices=(0, 2, 4)), (1.0, 1.5, 2.0)) == (
      (0, 2, 4), (1.0, 1.5, 2.0))
  with pytest.raises(ValueError, match="variants"):
    schedule.AutoK(variants=1)


@pytest.mark.parametrize("costs,prior,kept", [
    # n-gram rounds on the shipped pair (a call's growth timed in loop): batch 2, where
    # two-K loops measured K = 4 best (1.78x; K = 1 1.50x, K = 6 1.66x) ...
    ((1.0, 1.16, 1.34, 1.47, 1.57, 1.72), 0.6, (0, 3)),
    # ... and batch 8, where K = 1-2 did (1.03-1.05x; K = 6 1.00x)
    ((1.0, 1.34, 1.7, 1.95, 2.15, 2.44), 0.6, (0, 1)),
    # the same costs for a user who expects most drafts to be accepted
    ((1.0, 1.34, 1.7, 1.95, 2.15, 2.44), 0.85, (0, 6)),
    # SmolLM2-135M at batch 1 (profiled rounds): a verify's cost grows slowly past K = 1
    ((1.0, 1.70, 1.75, 1.85, 1.93, 2.01), 0.6, (0, 6)),
    # an accelerator-like device: a verify costs about a step
    ((1.0, 1.02, 1.03, 1.04, 1.05, 1.07), 0.6, (0, 6))])
def test_select_keeps_the_k_that_pays_best_at_the_prior(costs, prior, kept):
  assert schedule.select(schedule.AutoK(prior=prior), costs)[0] == kept


def test_an_itl_bound_drops_the_rounds_that_would_break_it():
  costs = (1.0, 1.08, 1.3, 1.6)
  assert schedule.select(schedule.AutoK(choices=(0, 1, 2, 4), itl_bound=1.1), costs) == (
      (0, 1), (1.0, 1.08))
  assert schedule.select(schedule.AutoK(choices=(0, 1, 2, 4), itl_bound=2.0), costs)[0] == (
      0, 1, 2, 4)
  # Nothing within the bound: plain decoding only (the call then runs no drafter).
  assert schedule.select(schedule.AutoK(choices=(0, 2, 4), itl_bound=1.1), (1.0, 1.3, 1.6))[0] \
      == (0,)
  with pytest.raises(ValueError, match="itl_bound"):
    schedule.AutoK(itl_bound=0.9)


@pytest.mark.slow  # 512 MB, several compiles
def test_the_device_probe_measures_sane_rates():
  """What the probe reports holds together on any machine (no speed is assumed): a finite,
  positive rate per row count, and a bandwidth that is the one-row pass read as bytes (that
  pass does 2 FLOPs per f32 weight of 4 bytes: bandwidth = 2 x the one-row FLOP rate)."""
  rates = cost_model.DeviceRates.measure(repeats=1)
  assert rates.rows == cost_model.ROWS and len(rates.compute) == len(rates.rows)
  assert all(np.isfinite(x) and x > 0 for x in (rates.bandwidth, *rates.compute))
  assert rates.bandwidth == pytest.approx(2 * rates.compute[0], rel=1e-9)
  assert [rates.flops_rate(r) for r in rates.rows] == pytest.approx(list(rates.compute))
  assert cost_model.DeviceRates.measure(repeats=1) is rates  # probed once per process


# ----------------------------------------------------------------------------- call times


@pytest.fixture(scope="module")
def small():
  """A real (not abstract) tiny target in decoding form: its calls can be timed."""
  return jspec.models.init(tiny_config(64, layers=2, hidden=32), seed=3).decoding_form()


class FakeClock:
  """perf_counter for `call_times.in_turns`: a run of `calls` calls of program `key`
  advances it by calls * cost[key] seconds (and records the run)."""

  def __init__(self, cost):
    self.now, self.cost, self.runs = 0.0, cost, []

  def program(self, key):
    def run(models, carry, calls):
      self.runs.append((key, calls))
      self.now += calls * self.cost[key]
      return carry, jnp.zeros(())
    return run


def test_turns_alternate_and_size_themselves(monkeypatch):
  clock = FakeClock({"fast": 1e-4, "slow": 0.05})
  monkeypatch.setattr(call_times.time, "perf_counter", lambda: clock.now)
  runs = {k: clock.program(k) for k in ("fast", "slow")}
  times = call_times.in_turns(runs, None, {"fast": 0, "slow": 0}, None, repeats=3)
  assert times == {"fast": [pytest.approx(1e-4)] * 3, "slow": [pytest.approx(0.05)] * 3}
  # Compile and size each (one call each, twice), then turns in alternating order, as
  # many calls per turn as fill TURN_SECONDS, within [MIN_CALLS, MAX_CALLS].
  count = lambda cost: int(np.clip(np.ceil(call_times.TURN_SECONDS / cost),
                                   call_times.MIN_CALLS, call_times.MAX_CALLS))
  fast, slow = count(1e-4), count(0.05)
  assert fast == call_times.MAX_CALLS and slow == max(2, call_times.MIN_CALLS)
  assert clock.runs == [("fast", 1), ("fast", 1), ("slow", 1), ("slow", 1),
                        ("fast", fast), ("slow", slow), ("slow", slow), ("fast", fast),
                        ("fast", fast), ("slow", slow)]
  clock.runs.clear()  # a fixed count is used as given
  call_times.in_turns(runs, None, {"fast": 0, "slow": 0}, 5, repeats=1)
  assert clock.runs == [("fast", 1), ("slow", 1), ("fast", 5), ("slow", 5)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loop_times_run_the_models_own_call(small, dtype, tmp_path):
  model = small
  if dtype == "bfloat16":
    model = dataclasses.replace(small, params=jax.tree_util.tree_map(
        lambda x: x.astype(jnp.bfloat16), small.params))
  times = call_times.loop_times(model, 2, [3, 1], 32, calls=2, repeats=3)
  assert sorted(times) == [1, 3] and all(len(t) == 3 and min(t) > 0 for t in times.values())
  # The growth from real timings: one entry per timed block, more tokens never cheaper.
  got = call_times.growth(model, 2, [1, 2, 3, 5], 32, str(tmp_path))
  assert sorted(got) == [1, 2, 3, 5] and got[1] == 1.0
  assert got[2] >= 1.0 and got[2] <= got[3] <= got[5]
  assert len(json.loads((tmp_path / "calls.json").read_text())) == 3  # 1, 2 and 5


def test_growth_is_measured_once_and_interpolated(small, tmp_path, monkeypatch):
  timed = []

  def fake(model, batch, blocks, cache_length, calls=None, repeats=7):
    timed.append(sorted(blocks))  # a call costing 1 + T ** 0.5 units, best turn first
    return {t: [1.0 + t ** 0.5, 2.0 + t] for t in blocks}

  monkeypatch.setattr(call_times, "loop_times", fake)
  got = call_times.growth(small, 1, [1, 2, 3, 5, 7], 32, str(tmp_path))
  assert timed == [[1, 2, 7]]  # 1, 2 and the largest block only, in one set of turns
  f = lambda t: 1.0 + t ** 0.5
  assert got[1] == 1.0 and got[2] == pytest.approx(f(2) / f(1))
  assert got[7] == pytest.approx(f(7) / f(1))
  w = np.log(5 / 2) / np.log(7 / 2)  # log-linear between 2 and 7
  assert got[5] == pytest.approx(((1 - w) * f(2) + w * f(7)) / f(1))
  assert all(got[a] <= got[b] for a, b in zip([1, 2, 3, 5], [2, 3, 5, 7]))
  # Kept on disk: a second call (another process alike) times nothing.
  monkeypatch.setattr(call_times, "loop_times", lambda *a, **k: 1 / 0)
  assert call_times.growth(small, 1, [1, 2, 3, 5, 7], 32, str(tmp_path)) == got
  # Another cache length is another shape: timed anew.
  with pytest.raises(ZeroDivisionError):
    call_times.growth(small, 1, [1, 2, 3, 5, 7], 64, str(tmp_path))


def test_the_prior_follows_the_measured_growth(tied):
  ks = (0, 1, 4)
  ngram = jspec.NGram(tied.vocab_size)
  plain = cost_model.prior_costs(tied, ngram, 1, 128, ks, CPU)
  steep = cost_model.prior_costs(tied, ngram, 1, 128, ks, CPU, {1: 1.0, 2: 3.0, 5: 3.5})
  assert steep[0] == pytest.approx(plain[0])  # a one-token call is the rates' own
  # A call on K + 1 tokens: the one-token call, times its timed growth (the argmax
  # over the K + 1 positions priced apart).
  argmax = lambda rows: cost_model.TokenChoice().seconds(rows, tied.vocab_size, CPU)
  call = plain[0] - argmax(1)
  assert steep[1] == pytest.approx(3.0 * call + argmax(2))
  assert steep[2] == pytest.approx(3.5 * call + argmax(5))
  assert steep[1] / steep[0] > plain[1] / plain[0]


def test_a_measured_draft_step_raises_the_draft_models_price(tied, draft):
  """With `draft_ratio` (the draft's one-token call over the target's, timed), a draft step
  costs at least that share of a plain round; below its own roofline it changes nothing."""
  ks = (0, 1, 2)
  model = jspec.DraftModel(draft)
  roofline = cost_model.prior_costs(tied, model, 1, 128, ks, CPU)
  step = cost_model.call_time(tied, 1, 1, 128, CPU)
  heavy = cost_model.prior_costs(tied, model, 1, 128, ks, CPU, None, 0.6)
  verify = cost_model.prior_costs(tied, jspec.NGram(tied.vocab_size), 1, 128, ks, CPU)
  assert heavy[0] == pytest.approx(roofline[0])
  argmax = cost_model.TokenChoice().seconds(1, tied.vocab_size, CPU)  # each draft's
  assert heavy[2] == pytest.approx(verify[2] + 2 * (0.6 * step + argmax))
  assert heavy[2] > roofline[2]
  assert cost_model.prior_costs(tied, model, 1, 128, ks, CPU, None, 1e-6) == \
      pytest.approx(roofline)


def test_step_ratio_times_both_models_in_the_same_turns(small, tmp_path, monkeypatch):
  """`step_ratio` times the draft's call and the target's side by side, once, and keeps the
  median of the turns' ratios; a target time cached alone (by `growth`) does not enter."""
  draft = jspec.models.init(tiny_config(vocab_size=small.vocab_size, layers=1, hidden=16,
                                        heads=2, kv_heads=1), seed=5).decoding_form()
  timed = []

  def fake(model, reference, batch, block, cache_length):
    timed.append((model is draft, reference is small, batch, block))
    # A busy stretch over turns 2-3 slows both; taken apart, the target's fastest turn and
    # the draft's slowest would give 0.6 / 2.0 = 0.30, the draft's fastest over the
    # target's slowest 0.5 / 4.0 = 0.125.
    return [m / r for m, r in zip([0.5, 1.0, 0.6, 0.55, 0.5], [2.0, 4.0, 2.4, 2.2, 2.0])]

  monkeypatch.setattr(call_times, "pair_ratios", fake)
  monkeypatch.setattr(call_times, "loop_times",
                      lambda model, batch, blocks, *a, **k: {b: [9.0 * b] for b in blocks})
  call_times.growth(small, 1, [1, 2], 32, str(tmp_path))  # the target's own entry, alone
  assert call_times.step_ratio(draft, small, 1, 32, str(tmp_path)) == pytest.approx(0.25)
  assert timed == [(True, True, 1, 1)]
  assert call_times.step_ratio(draft, small, 1, 32, str(tmp_path)) == pytest.approx(0.25)
  assert len(timed) == 1  # read back
  assert call_times.step_ratio(draft, small, 1, 32, str(tmp_path), block=3) == \
      pytest.approx(0.25)
  assert timed[-1] == (True, True, 1, 3)  # a catch-up block is its own pair


def test_pair_ratios_runs_each_model_in_every_turn(small, monkeypatch):
  """The real timing: both programs (the draft's block call, the target's one-token
  call) run in every turn, and each ratio is one turn's draft time over the same turn's
  target time. Only the pairing is asserted: how the two times compare depends on the
  machine's load while the test runs."""
  draft = jspec.models.init(tiny_config(vocab_size=small.vocab_size, layers=1, hidden=16,
                                        heads=2, kv_heads=1), seed=5)
  seen = {}
  real = call_times.in_turns

  def spy(runs, models, carries, calls, repeats):
    times = real(runs, models, carries, calls, repeats)
    seen.update(keys=sorted(runs), widths={k: carries[k][1].shape for k in carries},
                times=times)
    return times

  monkeypatch.setattr(call_times, "in_turns", spy)
  ratios = call_times.pair_ratios(draft, small, 2, 3, 32, repeats=3)
  assert seen["keys"] == ["model", "reference"]
  assert seen["widths"] == {"model": (2, 3), "reference": (2, 1)}  # block 3 vs one token
  times = seen["times"]
  assert all(len(times[k]) == 3 and all(t > 0 for t in times[k]) for k in times), times
  assert ratios == pytest.approx([m / r for m, r in zip(times["model"], times["reference"])])


def test_fingerprints_hold_no_addresses(small):
  """Saved costs are keyed by the models' fingerprint: an object address in it (a
  function's repr) would differ in every process, and nothing saved would be found."""
  for obj in (small, (small, jspec.NGram(small.vocab_size)), jspec.DraftModel(small)):
    assert "0x" not in json.dumps(cost_model.fingerprint(obj))


# What both processes below build, and this one too: a tiny target in decoding form with a
# lookup drafter and with a draft model (a model's functions are fields of its pytree).
_KEY_MODELS = """
import jspec

def profile_keys(cost_model):
  config = lambda **kw: jspec.models.TransformerConfig(
      vocab_size=64, intermediate_size=2 * kw["hidden_size"], num_attention_heads=4,
      num_key_value_heads=2, **kw)
  target = jspec.models.init(config(hidden_size=32, num_hidden_layers=2), seed=0).decoding_form()
  draft = jspec.models.init(config(hidden_size=16, num_hidden_layers=1), seed=1).decoding_form()
  drafters = {"ngram": jspec.NGram(64), "draft_model": jspec.DraftModel(draft)}
  return {name: cost_model.profile_key("round", (target, d), 2, 64, True, False)
          for name, d in drafters.items()}
"""


@pytest.mark.slow  # two fresh processes
def test_profile_keys_are_the_same_in_every_process():
  """A profile saved by one process (`jspec profile`) is found by the next only if its key,
  machine and the models' fingerprint, comes out the same there: two fresh Python processes
  (each with its own hash seed and object addresses) and this one agree."""
  import os
  import subprocess
  import sys

  script = _KEY_MODELS + (
      "\nimport importlib, json, sys\n"
      "print(json.dumps(profile_keys(importlib.import_module(sys.argv[1]))))\n")
  runs = []
  for seed in ("1", "2"):
    proc = subprocess.run([sys.executable, "-c", script, cost_model.__name__],
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONHASHSEED=seed))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
  namespace = {}
  exec(_KEY_MODELS, namespace)
  here = namespace["profile_keys"](cost_model)
  assert set(here) == {"ngram", "draft_model"} and here["ngram"] != here["draft_model"]
  assert runs[0] == runs[1] == here


def test_loop_memory_counts_the_weights_as_held_and_the_compiled_loops_bytes(small):
  """`call_times.loop_memory` compiles the timed loop without running it: the weights at
  their held bytes (int8: one byte per weight and its f32 scales), the program's
  arguments (weights and cache) at least that, and its temp as the compiler reports it."""
  int8 = transformer.quantize_model(small, "int8")
  got = {name: call_times.loop_memory(m, 2, 32) for name, m in (("f32", small), ("int8", int8))}
  floats = sum(x.size for x in jax.tree_util.tree_leaves(small.params))
  assert got["f32"]["weights"] == 4 * floats
  assert got["f32"]["weights"] / 4 < got["int8"]["weights"] < 0.35 * got["f32"]["weights"]
  for name, m in got.items():
    assert m["arguments"] >= m["weights"] and m["temp"] >= 0, (name, m)
