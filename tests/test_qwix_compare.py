"""benchmarks/qwix_compare.py on a tiny random model: jspec's int8 and Qwix's quantize every
weight within one step of each other, every product is timed on every path, and the programs
show where each applies its scales (slow lane; Qwix is not a dependency: skipped without it).
"""

import importlib.util
import math
import pathlib
import sys

import jax.numpy as jnp
import pytest

from jspec.bench import records as R
from jspec.core import quant

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "qwix_compare.py"
KINDS = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
PRODUCTS = ("qkv", "gate_up", "down", "lm_head")


def _script():
  if "qwix_compare" in sys.modules:
    return sys.modules["qwix_compare"]
  spec = importlib.util.spec_from_file_location("qwix_compare", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its Flax module looks its module up by name
  spec.loader.exec_module(module)
  return module


def test_without_qwix_it_says_how_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "qwix", None)  # `import qwix` raises ImportError
  with pytest.raises(SystemExit, match="pip install qwix"):
    _script().import_qwix()


@pytest.mark.slow  # about half a minute on 2 cores: some thirty small programs compile
def test_small_run_records_numerics_and_speed(tmp_path):
  qwix = pytest.importorskip("qwix")
  script = _script()
  path = tmp_path / "qwix.jsonl"
  assert script.main(["--small", "--repeats", "1", "--json", str(path)]) == 0
  head, recs = R.read(str(path))
  assert head["study"] == script.STUDY and head["model"] == "small"
  assert head["settings"]["repeats"] == 1 and head["qwix"] == qwix.__version__
  c = script.SMALL

  # Numerics: a record per weight matrix, each layer's own and the tied embedding.
  num = {r.prompt: r for r in recs if r.axes["section"] == "numerics"}
  assert set(num) == {f"layers.{k}.{i}" for k in KINDS
                      for i in range(c.num_hidden_layers)} | {"embed"}
  assert num["layers.wo.1"].axes["contracted"] == [0, 1]
  assert num["embed"].axes["contracted"] == [1]
  for r in num.values():
    e = r.extra
    # Both round to their nearest step, Qwix's 127/127.5 of jspec's: within one jspec step.
    assert 0 < e["max_abs_diff"] and e["max_diff_in_steps"] <= 1, r.prompt
    assert 0.5 < e["q_equal"] < 1, r.prompt
    assert not e["scales_equal"]
    assert e["scale_ratio_min"] == pytest.approx(127 / 127.5, rel=1e-6)
    assert e["scale_ratio_max"] == pytest.approx(127 / 127.5, rel=1e-6)
    assert e["q_equal_matched"] > 0.99 and e["scale_rel_matched"] < 1e-6
  # The embedding's figures, computed here without the script: |diff| <= jspec's scale.
  _, model = script.load(small=True)
  w = model.params["embed"]
  mine = quant.quantize(w, (1,))
  theirs = qwix.quantize(w, jnp.int8, channelwise_axes=(0,))
  diff = jnp.abs(quant.dequantize(mine) - qwix.dequantize(theirs))
  assert bool(jnp.all(diff <= mine.scale))
  assert float(jnp.max(diff)) == pytest.approx(num["embed"].extra["max_abs_diff"], rel=1e-6)
  assert float(jnp.mean(mine.q == theirs.qvalue)) == pytest.approx(num["embed"].extra["q_equal"])

  # Speed: every product at batch 1 and 32 on every path, once each, in positive seconds.
  speed = [r for r in recs if r.axes["section"] == "speed"]
  cells = [(r.prompt, r.axes["batch"], r.method) for r in speed]
  assert sorted(cells) == sorted((p, b, m) for p in PRODUCTS for b in (1, 32)
                                 for m in script.PATHS)
  D, F, V = c.hidden_size, c.intermediate_size, c.vocab_size
  qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
  shapes = {"qkv": [D, qkv], "gate_up": [D, 2 * F], "down": [F, D], "lm_head": [V, D]}
  for r in speed:
    assert r.axes["shape"] == shapes[r.prompt]
    assert len(r.seconds) == 1 and all(math.isfinite(s) and s > 0 for s in r.seconds)
    assert r.extra["median_s"] == r.seconds[0] and r.extra["inner"] >= 1
    ops = [op for op, _ in r.extra["program"]]
    if r.method == "f32":
      assert ops == ["dot_general"] and r.extra["max_rel_vs_f32"] == 0
      continue
    assert 0 < r.extra["max_rel_vs_f32"] < 0.02  # int8 weights, f32 activations
    mul = ops.index("mul")
    if r.method == "jspec-int8":  # the scales on the output, after the product
      assert ops.index("dot_general") < mul
    else:  # Qwix: the weight dequantized (a weight-sized multiply), then the product
      assert mul < ops.index("dot_general")
      assert r.extra["program"][mul][1] == r.axes["shape"]
      # Qwix's own PTQ route (PtqProvider, quantize_params) quantizes the weight as timed.
      assert r.extra["ptq_same_weight"] and r.extra["ptq_max_diff"] == 0
      jspec_r = next(s for s in speed if (s.prompt, s.axes["batch"], s.method)
                     == (r.prompt, r.axes["batch"], "jspec-int8"))
      assert r.extra["qwix_over_jspec"] == pytest.approx(
          r.extra["median_s"] / jspec_r.extra["median_s"])
