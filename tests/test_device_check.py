"""benchmarks/device_check.py's dry run: every part of the accelerator check runs its code paths
on the CPU with tiny models, writes the harness's records and the tables, and its exactness
check holds (each n-gram variant's greedy answer equal to plain decoding's)."""

import importlib.util
import os
import pathlib
import sys

import pytest

from jspec.bench import metrics as M
from jspec.bench import records as R

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "device_check.py"


def _script():
  spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its dataclasses look their module up by name
  spec.loader.exec_module(module)
  return module


@pytest.mark.slow  # about a minute on 2 cores: two child processes compile their own programs
def test_dry_run_writes_every_part(tmp_path):
  check = _script()
  assert check.main(["--dry-run", "--out", str(tmp_path), "--budget", "600"]) == 0
  head, recs = R.read(str(tmp_path / "device_check.jsonl"))
  assert head["study"] == check.STUDY and head["settings"]["dry_run"] is True
  parts = {r.axes["part"] for r in recs}
  assert {"step", "verify", "auto", "span"} <= parts
  # The weights and flags parts either ran or say why not, never nothing.
  for part in ("weights", "flags"):
    assert part in parts or part in head["notes"], part
  # step: both models, every batch of the dry run's sizes, a long and a short run each.
  step = M.group([r for r in recs if r.axes["part"] == "step"], "model", "batch", "length")
  assert set(step) == {("1b", B, n) for B in check.DRY.batches for n in ("long", "short")} | {
      ("smollm2", B, n) for B in (check.DRY.batches[0], check.DRY.batches[-1])
      for n in ("long", "short")}
  # span: the whole cache against the live span, on the span part's cache.
  spans = {r.axes["min_attention_span"] for r in recs if r.axes["part"] == "span"}
  assert spans == {"0", "128"}
  # verify: a one-token call and every width as a chain, every width as a tree of that
  # many nodes.
  verify = [r for r in recs if r.axes["part"] == "verify"]
  assert {r.axes["width"] for r in verify if r.axes["shape"] == "chain"} == {1, *check.DRY.widths}
  trees = {r.axes["width"]: r.axes["depth"] for r in verify if r.axes["shape"] == "tree"}
  assert set(trees) == set(check.DRY.widths) and all(1 <= d < w for w, d in trees.items())
  assert all(len(r.seconds) == check.DRY.repeats and min(r.seconds) > 0 for r in verify)
  # auto: fixed K and "auto" over n-gram, each answer equal to plain decoding's.
  auto = {r.method: r for r in recs if r.axes["part"] == "auto"}
  assert set(auto) == {"plain", "ngram@k=2", "ngram@k=4", "ngram@k=auto"}
  assert all(auto[m].equal is True for m in auto if m != "plain")
  assert sum(auto["ngram@k=auto"].rounds_by_k.values()) > 0
  # weights: every form the tree makes, and int8 again with each product dequantizing its
  # weight first (traced anew: the swapped products were called).
  weights = {(r.axes["weights"], r.axes["product"]) for r in recs
             if r.axes["part"] == "weights"}
  assert {("int8", "scale output"), ("fp8", "scale output"), ("int4", "dequantize (groups)"),
          ("int8", "dequantize first")} <= weights
  assert head["notes"]["weights"]["dequantize_first_products_traced"] > 0
  # The loops' memory, compiled: the float and int8 targets, and int8 with its casts free
  # to be hoisted (traced anew: that loop holds more), and int8's step that way.
  memory = head["notes"]["weights"]["loop_memory_mib"]
  assert set(memory) == {check.DRY.dtype, "int8", "int8, hoistable"}
  assert memory["int8"]["weights"] < 0.3 * memory[check.DRY.dtype]["weights"]
  assert memory["int8"]["temp"] < memory["int8, hoistable"]["temp"]
  assert ("int8", "scale output, hoistable") in weights
  text = (tmp_path / "device_check.md").read_text()
  for title in ("step inside the loop", "Verify cost against width", "Fixed K against",
                "Dead cache slots", "Weight-only quantization"):
    assert title in text
  assert not [f for f in os.listdir(tmp_path) if f.startswith("flags_child")]


def test_refuses_unknown_parts_and_the_cpu_without_dry_run():
  check = _script()
  with pytest.raises(SystemExit, match="unknown"):
    check.main(["--parts", "step,warp"])
  with pytest.raises(SystemExit, match="needs an accelerator"):
    check.main(["--parts", "step"])
