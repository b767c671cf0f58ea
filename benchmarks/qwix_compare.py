"""jspec's weight-only int8 (`jspec.core.quant`) against Qwix's (google/qwix), in one process:
the same weights quantized by both, and the products of decoding timed side by side.

    python benchmarks/qwix_compare.py [--repeats 21] [--json PATH] [--small]

Qwix is not a dependency of jspec (`pip install qwix`; imported only when this script runs).
It supersedes AQT, in AQT's own words: "AQT is reaching end-of-life. github.com/google/qwix is
replacing AQT." (README of github.com/google/aqt). `--small`: a tiny random model instead of
SmolLM2-135M-Instruct, for the tests.

Numerics. Every weight matrix of SmolLM2 in f32 (each layer's wq, wk, wv, wo, w_gate, w_up,
w_down, and the tied embedding), quantized per output channel over the axes jspec's int8 model
contracts (those its scales collapse, `jspec.models.quantize_model`): by jspec
(`quant.quantize`) and by Qwix (`qwix.quantize(w, int8, channelwise_axes=the other axes)`, the
weight Qwix's PTQ provider builds for such a product: checked under Speed). Per weight: max
|dequant_jspec - dequant_qwix| (also in jspec steps, `scale`), the share of equal q values,
each one's max |dequant - w|, whether the scales are equal and their ratio. Both are
symmetric absmax, but with another bound:

    jspec  scale = absmax / 127     q = round(w / scale), in -127..127
    Qwix   scale = absmax / 127.5   q = round(w / scale) cast to int8, in -128..127

(Qwix: `numerics.get_symmetric_bound`, "qmax + 0.5" for integer types, and
`numerics.convert_to`, where the int8 cast's saturation is the clip; qwix/_src/core/.) So
Qwix's step is 127/127.5 of jspec's, its largest entry lands on 127 half a step off, and -128
occurs; both keep |dequant - w| <= step / 2, so the two dequantized weights differ by less
than one jspec step, and the q values differ where the finer step rounds otherwise. The
"matched" columns quantize with Qwix's calibration "absmax,127.5/127" (a scale of absmax /
127, rounded otherwise): the q values then agree, but where w / scale sits on a tie and the
scale's last bit tips it.

Speed. The products of decoding at batch 1 and 32, x [B, D] times one layer's fused qkv
[D, (H + 2 Hkv) Dh], gate_up [D, 2F], down [F, D] ("bd,dn->bn") and the tied LM head
[V, D] ("btd,vd->btv", T = 1), layer 0's weights, jitted with the weight an argument (a
constant weight would let XLA fold the dequantization away): the f32 weight (`jnp.einsum`),
jspec int8 (`quant.einsum`) and Qwix int8 weight-only (`qwix.einsum` over the QArray, f32
activations). Compiled and run twice untimed, then `--repeats` timed calls of each,
interleaved with the order reversed every other repeat (`jspec.bench.runner.interleave`);
each timed call runs the product back to back for at least TIMED_SECONDS (the same count
for the three), and its time is reported per product. Medians, and Qwix / jspec per shape.

What Qwix's weight-only product computes (qwix 0.1.8). `qwix.einsum`
(qwix/_src/core/einsum.py) turns the einsum into `qwix.dot_general` along opt_einsum's path
(in each product here the weight becomes the left operand, and the output is transposed).
`dot_general` (qwix/_src/core/dot_general.py) takes `_slow_dot_general` whenever an operand is
a plain float array, bf16 to f64 ("Always dequantize on inputs if any of the operands is in
bf16/fp32, because XLA is able to fuse the dequantize and the matmul"): it dequantizes the
weight first (`qarray.dequantize`: q cast to the scale's dtype, times the scale: a
weight-sized multiply), then runs a float dot_general. jspec casts q, runs the product and
scales its output (an output-sized multiply). Qwix's `_fast_dot_general` (the product over
q, the scales on the output) runs only when no operand is a plain float array, e.g. with
activations quantized too (`act_qtype`, w8a8). The PTQ provider (qwix/_src/providers/ptq.py,
`PtqProvider.einsum`) with `weight_qtype` alone quantizes the weight
(`einsum.get_how_to_quantize`: every uncontracted axis channelwise, absmax) and calls that
same einsum. The records show it: each product's `program` (the jaxpr's converts,
multiplies, dot and transpose), and, per product, whether a one-product Flax model under
`qwix.PtqProvider` gets the very weight this script times, and its output's largest
difference from the direct call's.

Records (`jspec.bench.records`, study "qwix-compare"): numerics, one per weight (method
"jspec-vs-qwix", axes section, weight, layer, shape, contracted; extra the figures above);
speed, one per product, batch and path (method "f32" / "jspec-int8" / "qwix-int8", seconds per
product of each repeat; extra median_s, inner, max_rel_vs_f32, program, and for Qwix
qwix_over_jspec, ptq_same_weight, ptq_max_diff).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

import jspec
from jspec.bench import records as R
from jspec.bench import runner, targets
from jspec.bench.report import markdown
from jspec.core import quant

STUDY = "qwix-compare"
PATHS = ("f32", "jspec-int8", "qwix-int8")
BATCHES = (1, 32)
# Qwix's int8 bound is 127.5, jspec's 127: this calibration factor gives Qwix jspec's scale.
MATCHED = f"absmax,{127.5 / 127!r}"
# A timed call repeats its product for at least this long: one product at batch 1 takes
# microseconds, less than the clock and a call's dispatch can tell apart.
TIMED_SECONDS = 0.05
SMALL = jspec.models.TransformerConfig(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    tie_word_embeddings=True)


def import_qwix():
  """The qwix module, or a SystemExit saying how to install it (jspec does not need it)."""
  try:
    import qwix
  except ImportError as e:
    raise SystemExit(f"benchmarks/qwix_compare.py compares jspec's int8 with Qwix's, which "
                     f"is not installed ({e}): pip install qwix") from None
  return qwix


def load(small: bool):
  """(name, f32 model): SmolLM2-135M-Instruct, or with `small` a tiny random decoder."""
  if small:
    return "small", jspec.models.init(SMALL, seed=0)
  return targets.SMOLLM2, targets.load(targets.resolve_or_exit(targets.SMOLLM2), dtype="float32")


# ----------------------------------------------------------------------------- numerics


def _quantized(x) -> bool:
  return hasattr(x, "q") and hasattr(x, "scale")


def weights(model) -> list[tuple[str, str, int | None, jax.Array, tuple[int, ...]]]:
  """(name, kind, layer, f32 weight, contracted axes) for every matrix jspec's int8 model
  quantizes, each layer's on its own. The axes are read off the int8 model's scales (size 1
  where a product contracts), shapes only: nothing is quantized here."""
  shapes = jax.eval_shape(
      lambda p: jspec.models.quantize_model(dataclasses.replace(model, params=p), "int8").params,
      model.params)
  out = []

  def walk(w, s, path):
    if _quantized(s):
      kind = path[-1]
      if path[0] == "layers" and isinstance(model.params["layers"], dict):  # [L, ...]
        for layer in range(w.shape[0]):
          out.append((f"layers.{kind}.{layer}", kind, layer, w[layer],
                      _collapsed(w.shape[1:], s.scale.shape[1:])))
      else:
        layer = next((p for p in path if isinstance(p, int)), None)
        out.append((".".join(map(str, path)), kind, layer, w, _collapsed(w.shape, s.scale.shape)))
    elif isinstance(s, dict):
      for k in s:
        walk(w[k], s[k], path + (k,))
    elif isinstance(s, (list, tuple)):
      for i, (a, b) in enumerate(zip(w, s)):
        walk(a, b, path + (i,))

  walk(model.params, shapes, ())
  return out


def _collapsed(shape, scale_shape) -> tuple[int, ...]:
  return tuple(i for i, (n, s) in enumerate(zip(shape, scale_shape)) if s != n)


def qwix_int8(qwix, w, axes, calibration: str = "absmax"):
  """w as Qwix's weight-only int8: symmetric, a scale per index of every axis not in `axes`."""
  kept = tuple(a for a in range(w.ndim) if a not in axes)
  return qwix.quantize(w, jnp.int8, channelwise_axes=kept, calibration_method=calibration)


def compare(qwix, w, axes) -> dict:
  """The figures of one weight (module docstring), as jax scalars."""
  mine, theirs = quant.quantize(w, axes), qwix_int8(qwix, w, axes)
  matched = qwix_int8(qwix, w, axes, MATCHED)
  dm, dt = quant.dequantize(mine), qwix.dequantize(theirs)
  diff = jnp.abs(dm - dt)
  ratio = theirs.scale / mine.scale
  return {"max_abs_diff": jnp.max(diff),
          "max_diff_in_steps": jnp.max(diff / mine.scale),
          "q_equal": jnp.mean(mine.q == theirs.qvalue),
          "err_jspec": jnp.max(jnp.abs(dm - w)),
          "err_qwix": jnp.max(jnp.abs(dt - w)),
          "scales_equal": jnp.all(mine.scale == theirs.scale),
          "scale_ratio_min": jnp.min(ratio), "scale_ratio_max": jnp.max(ratio),
          "qwix_q_at_minus_128": jnp.sum(theirs.qvalue == -128),
          "q_equal_matched": jnp.mean(mine.q == matched.qvalue),
          "scale_rel_matched": jnp.max(jnp.abs(matched.scale / mine.scale - 1))}


def numerics(qwix, name: str, model) -> list[R.Record]:
  """A record per weight matrix (module docstring)."""
  fn = jax.jit(functools.partial(compare, qwix), static_argnums=1)  # compiled per shape
  recs = []
  for label, kind, layer, w, axes in weights(model):
    figures = {k: v.item() for k, v in jax.device_get(fn(w, axes)).items()}
    recs.append(R.Record(study=STUDY, method="jspec-vs-qwix", workload=name, prompt=label,
                         axes={"section": "numerics", "weight": kind, "layer": layer,
                               "shape": list(w.shape), "contracted": list(axes)},
                         extra=figures))
  return recs


def numerics_table(recs) -> str:
  """Per kind of weight, the worst over its layers (the least for the shares)."""
  rows = [["weight", "count", "max abs diff", "in jspec steps", "q equal", "max err jspec",
           "max err Qwix", "scales equal", "Qwix / jspec scale", "q = -128",
           "q equal (matched)"]]
  for kind in dict.fromkeys(r.axes["weight"] for r in recs):
    e = [r.extra for r in recs if r.axes["weight"] == kind]
    worst = lambda k: max(x[k] for x in e)
    least = lambda k: min(x[k] for x in e)
    rows.append([kind, str(len(e)), f"{worst('max_abs_diff'):.3g}",
                 f"{worst('max_diff_in_steps'):.4f}", f"{least('q_equal'):.4f}",
                 f"{worst('err_jspec'):.3g}", f"{worst('err_qwix'):.3g}",
                 str(all(x["scales_equal"] for x in e)),
                 f"{least('scale_ratio_min'):.5f}-{worst('scale_ratio_max'):.5f}",
                 str(sum(x["qwix_q_at_minus_128"] for x in e)),
                 f"{least('q_equal_matched'):.5f}"])
  return markdown(rows)


# ----------------------------------------------------------------------------- speed


def products(model) -> dict[str, tuple[str, jax.Array]]:
  """{name: (einsum, f32 weight)}: the decoding form's products of layer 0 and the tied LM
  head (the embedding), from the stored params (layers stacked)."""
  c, p = model.config, model.params
  lay = {n: p["layers"][n][0] for n in ("wq", "wk", "wv", "w_gate", "w_up", "w_down")}
  D = c.hidden_size
  qkv = jnp.concatenate([lay[n].reshape(D, -1) for n in ("wq", "wk", "wv")], axis=1)
  gate_up = jnp.concatenate([lay["w_gate"], lay["w_up"]], axis=1)
  return {"qkv": ("bd,dn->bn", qkv), "gate_up": ("bd,dn->bn", gate_up),
          "down": ("bd,dn->bn", lay["w_down"]), "lm_head": ("btd,vd->btv", p["embed"])}


def _specs(eq: str) -> tuple[str, str, str]:
  inputs, out = eq.split("->")
  x, w = inputs.split(",")
  return x, w, out


def contracted(eq: str) -> tuple[int, ...]:
  """The weight's axes the product contracts."""
  _, w, out = _specs(eq)
  return tuple(i for i, a in enumerate(w) if a not in out)


def activation(eq: str, w, batch: int, seed: int = 0):
  """x for the product: `batch` rows, one token (T = 1), N(0, 1)."""
  x, w_spec, _ = _specs(eq)
  sizes = dict(zip(w_spec, w.shape), b=batch, t=1)
  return jax.random.normal(jax.random.key(seed), tuple(sizes[a] for a in x), jnp.float32)


def program(fn, *args) -> list[list]:
  """[primitive, output shape] of the converts, multiplies, dots and transposes `fn` traces
  to, in order (inner jaxprs included): where each path applies its scales."""
  kept = {"convert_element_type", "mul", "dot_general", "transpose"}
  out = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name in kept:
        out.append([eqn.primitive.name, list(eqn.outvars[0].aval.shape)])
      for v in eqn.params.values():
        inner = getattr(v, "jaxpr", v)
        if hasattr(inner, "eqns"):
          walk(inner)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return out


class _Product(nn.Module):
  """One weight product, as a Flax model for Qwix's PTQ provider to quantize."""

  eq: str
  shape: tuple[int, ...]

  @nn.compact
  def __call__(self, x):
    return jnp.einsum(self.eq, x, self.param("w", nn.initializers.zeros, self.shape, x.dtype))


def ptq(qwix, eq: str, w, x):
  """(QArray, output) of `_Product` under `qwix.PtqProvider` with weight-only int8 (no
  act_qtype), its weight quantized by `qwix.quantize_params`: Qwix's own PTQ route."""
  rule = qwix.QuantizationRule(module_path=".*", weight_qtype=jnp.int8)
  model = qwix.quantize_model(_Product(eq, tuple(w.shape)), qwix.PtqProvider([rule]))
  abstract = jax.eval_shape(model.init, jax.random.key(0), x)["params"]
  params = qwix.quantize_params({"w": w}, abstract)
  return params["w"].array, jax.jit(model.apply)({"params": params}, x)


def _calls(fns: dict, inner: int) -> dict:
  def repeat(f, args):
    def call():
      for _ in range(inner):
        out = f(*args)
      return out
    return call
  return {name: repeat(f, args) for name, (f, args) in fns.items()}


def _inner(fns: dict) -> int:
  """Products per timed call: enough for TIMED_SECONDS of the fastest path (each run twice
  first, compiling it)."""
  fastest = math.inf
  for f, args in fns.values():
    for _ in range(2):
      jax.block_until_ready(f(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    fastest = min(fastest, time.perf_counter() - t0)
  return max(1, math.ceil(TIMED_SECONDS / max(fastest, 1e-9)))


def speed(qwix, name: str, model, repeats: int) -> list[R.Record]:
  """Records per product, batch and path (module docstring)."""
  recs = []
  for product, (eq, w) in products(model).items():
    axes = contracted(eq)
    mine, theirs = quant.quantize(w, axes), qwix_int8(qwix, w, axes)
    paths = {"f32": (jnp.einsum, w), "jspec-int8": (quant.einsum, mine),
             "qwix-int8": (qwix.einsum, theirs)}
    for batch in BATCHES:
      x = activation(eq, w, batch)
      fns = {p: (jax.jit(functools.partial(f, eq)), (x, wp)) for p, (f, wp) in paths.items()}
      inner = _inner(fns)
      outs, times = runner.interleave(_calls(fns, inner), repeats, wait=jax.block_until_ready)
      ref = jnp.max(jnp.abs(outs["f32"]))
      ptq_w, ptq_y = ptq(qwix, eq, w, x)
      per = {p: tuple(t / inner for t in times[p]) for p in paths}
      med = {p: statistics.median(per[p]) for p in paths}
      for p, (f, wp) in paths.items():
        extra = {"median_s": med[p], "inner": inner,
                 "max_rel_vs_f32": (jnp.max(jnp.abs(outs[p] - outs["f32"])) / ref).item(),
                 "program": program(functools.partial(f, eq), x, wp)}
        if p == "qwix-int8":
          extra["qwix_over_jspec"] = med[p] / med["jspec-int8"]
          extra["ptq_same_weight"] = bool(jnp.array_equal(ptq_w.qvalue, theirs.qvalue)
                                          and jnp.array_equal(ptq_w.scale, theirs.scale))
          extra["ptq_max_diff"] = jnp.max(jnp.abs(ptq_y - outs[p])).item()
        recs.append(R.Record(study=STUDY, method=p, workload=name, prompt=product,
                             axes={"section": "speed", "product": product, "batch": batch,
                                   "eq": eq, "shape": list(w.shape)},
                             seconds=per[p], extra=extra))
      print(f"{product:8s} B={batch:<3d} "
            + ", ".join(f"{p} {med[p] * 1e6:.1f} us" for p in paths)
            + f"; Qwix / jspec {med['qwix-int8'] / med['jspec-int8']:.2f}", flush=True)
  return recs


def speed_table(recs) -> str:
  """Medians per product and batch, µs per product, and the ratios."""
  rows = [["product", "weight", "B", "f32 us", "jspec int8 us", "Qwix int8 us", "Qwix / jspec",
           "jspec / f32"]]
  cells = dict.fromkeys((r.axes["product"], r.axes["batch"]) for r in recs)
  for product, batch in cells:
    at = {r.method: r for r in recs if (r.axes["product"], r.axes["batch"]) == (product, batch)}
    med = {p: at[p].extra["median_s"] for p in PATHS}
    rows.append([product, "x".join(map(str, at["f32"].axes["shape"])), str(batch)]
                + [f"{med[p] * 1e6:.1f}" for p in PATHS]
                + [f"{at['qwix-int8'].extra['qwix_over_jspec']:.2f}",
                   f"{med['jspec-int8'] / med['f32']:.2f}"])
  return markdown(rows)


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--repeats", type=int, default=21, help="timed calls of each path per shape")
  p.add_argument("--json", default=None, help="write the records here (JSON lines)")
  p.add_argument("--small", action="store_true",
                 help="a tiny random model instead of SmolLM2-135M-Instruct (for the tests)")
  args = p.parse_args(argv)
  if args.repeats < 1:
    p.error("--repeats must be at least 1")
  qwix = import_qwix()
  name, model = load(args.small)
  num = numerics(qwix, name, model)
  print(f"numerics, {len(num)} weights of {name} (worst over each kind's layers):")
  print(numerics_table(num), flush=True)
  fast = speed(qwix, name, model, args.repeats)
  print(f"speed on {jax.default_backend()} ({jax.devices()[0].device_kind}), medians of "
        f"{args.repeats} interleaved repeats, us per product:")
  print(speed_table(fast))
  same = all(r.extra["ptq_same_weight"] for r in fast if r.method == "qwix-int8")
  print(f"Qwix's PTQ provider quantizes every timed weight as timed here: {same}")
  if args.json:
    R.write(args.json, R.header(STUDY, vars(args), model=name, qwix=qwix.__version__,
                                timed_seconds=TIMED_SECONDS), num + fast)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
