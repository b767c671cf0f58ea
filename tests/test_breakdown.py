"""`jspec.tools.breakdown`: a cached call's device time grouped by the weights each product
reads, from the compiled program and a profiler trace, as records."""

import jspec
from jspec.bench import metrics as M
from jspec.tools import breakdown
from conftest import tiny_config


def test_groups_name_every_weight_matrix_and_the_attention():
  # Distinct sizes, so each matrix of the decoding form is recognisable by its shape:
  # q/k/v fused [48, 72], attention output [48, 48], gate-up fused [48, 192], down
  # [96, 48], output head (tied) [40, 48].
  config = tiny_config(vocab_size=40, hidden=48, heads=4, kv_heads=1, layers=2, tie=True)
  model = jspec.models.init(config, seed=0)
  recs = breakdown.breakdown(model, 1, (1, 3), 64, calls=3, repeats=2)
  groups = M.group(recs, "group")
  assert "attention products" in groups and "other kernels" in groups
  weights = {label for label in groups if label.startswith("weights ")}
  assert {"weights 48x72", "weights 48x192", "weights 96x48", "weights 40x48"} <= weights, weights
  for label, mine in groups.items():
    assert sorted(r.axes["block"] for r in mine) == [1, 3], label
    assert all(t > 0 for r in mine for t in r.seconds), label
    if label != breakdown.WHOLE:
      assert all(len(r.seconds) == 1 and r.extra["kernels"] >= 1 for r in mine), label
  wall = groups[breakdown.WHOLE]
  assert all(len(r.seconds) == 2 for r in wall)  # a time per turn, the blocks in turns
  table = breakdown.format_table(recs)
  assert "whole call, in loop" in table and "T=3 / T=1" in table
  ms = 1e3 * min(M.select(wall, block=3)[0].seconds)
  assert f"{ms:.2f}" in table.splitlines()[-1]
