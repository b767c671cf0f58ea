"""The prior of round costs (`jspec.core.cost_model`) and the choice of compiled K
(`jspec.core.schedule.select`): host-side arithmetic on made-up device rates."""

import json

import jax
import numpy as np
import pytest

import jspec
from conftest import tiny_config
from jspec.core import schedule
from jspec.core import cost_model
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
  assert with_model[2] - cpu[2] == pytest.approx(2 * step, rel=1e-6)


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


def test_select_keeps_zero_and_the_k_that_win_most():
  auto = schedule.AutoK(choices=(0, 1, 2, 3, 4, 6), variants=3)
  # Rounds as on a small CPU: each draft adds a good part of a step.
  costs = (1.0, 1.4, 1.7, 2.0, 2.3, 2.9)
  ks, cs = schedule.select(auto, costs)
  assert len(ks) == 3 and ks[0] == 0 and cs == tuple(costs[auto.choices.index(k)] for k in ks)
  # Every kept K is the best of all six at some acceptance in [0, ceiling].
  grid = np.linspace(0, auto.ceiling, 200)
  rate = schedule.expected_tokens(grid[:, None], np.asarray(auto.choices, float)[None]) \
      / np.asarray(costs)[None]
  best = {auto.choices[i] for i in np.argmax(rate, axis=1)}
  assert set(ks) <= best
  # Fewer worthwhile choices than variants: all of them, unchanged.
  assert schedule.select(schedule.AutoK(choices=(0, 2, 4)), (1.0, 1.5, 2.0)) == (
      (0, 2, 4), (1.0, 1.5, 2.0))
  with pytest.raises(ValueError, match="variants"):
    schedule.AutoK(variants=1)


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


def test_the_device_probe_measures_sane_rates():
  rates = cost_model.DeviceRates.measure(repeats=1)
  assert rates.rows == cost_model.ROWS and rates.bandwidth > 1e9
  assert all(c > 0 for c in rates.compute)
  # More rows per streamed byte: the rate rises from one row to many.
  assert rates.compute[-1] > 4 * rates.compute[0]
