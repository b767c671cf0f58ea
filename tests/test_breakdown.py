"""`jspec.tools.breakdown`: a cached call's device time grouped by the weights each product
reads, from the compiled program and a profiler trace."""

import jspec
from jspec.tools import breakdown
from conftest import tiny_config


def test_groups_name_every_weight_matrix_and_the_attention():
  # Distinct sizes, so each matrix of the decoding form is recognisable by its shape:
  # q/k/v fused [48, 72], attention output [48, 48], gate-up fused [48, 192], down
  # [96, 48], output head (tied) [40, 48].
  config = tiny_config(vocab_size=40, hidden=48, heads=4, kv_heads=1, layers=2, tie=True)
  model = jspec.models.init(config, seed=0)
  report = breakdown.breakdown(model, 1, (1, 3), 64, calls=3)
  groups = report["groups"]
  assert "attention products" in groups and "other kernels" in groups
  weights = {label for label in groups if label.startswith("weights ")}
  assert {"weights 48x72", "weights 48x192", "weights 96x48", "weights 40x48"} <= weights, weights
  for label, g in groups.items():
    assert set(g["ms"]) == {1, 3}, label
    assert all(ms > 0 for ms in g["ms"].values()), label
  assert set(report["wall_ms"]) == {1, 3} and min(report["wall_ms"].values()) > 0
  table = breakdown.format_table(report)
  assert "whole call, in loop" in table and "T=3 / T=1" in table
