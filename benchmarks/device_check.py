"""The accelerator check: one command, at most five minutes on one H100 or H200, that answers
what the decode step costs there and where it stands against the memory floor.

    python benchmarks/device_check.py                      # on the device: docs/bench/gpu/
    python benchmarks/device_check.py --dry-run --out DIR  # the same code paths on the CPU,
                                                           # tiny models, about a minute

On the device machine (no network; jax, flax, optax, orbax, chex are in its image) run it
from the repository root: when jspec is not installed it imports the tree it sits in
(`models/` as `jspec.models`, as the package installs it). Parts, in this order (`--parts` picks some), each
started only while the budget (`--budget`, seconds) leaves the time it is expected to take;
the records and the table are rewritten as each part ends, so a run stopped at its limit
keeps what it finished:

  step     plain decoding's step inside jspec's loop (`costs.steady`: a long and a short
           greedy run on one cache, the difference per round) at batch 1, 16 and 64, for a
           random-init 1.19B-parameter target (Llama shape, 24 layers, hidden 2048) and for
           SmolLM2-135M's shape (random weights: a step's time does not depend on their
           values), in bf16; the bytes a step must read (weights, and the K/V of the live
           slots) over its time, as a fraction of the device's copy bandwidth
           (`costs.memory_bandwidth`) and of its nominal peak (`PEAK_TB_S`);
  span     the same step for SmolLM2's shape at batch 64 with 4,096 cache slots and a
           ~100-token live length, attention over the whole cache (the accelerator default)
           against reading only the live span (`min_attention_span=128`): what dead cache
           slots cost there;
  verify   a cached call on W tokens per row over a call on one, in loop
           (`call_times.loop_times`, dispatch paid once), W in 2, 5, 9, 17, 33, 81, as a
           chain (causal block) and as a tree of W nodes (`Tree.best_first` on a flat
           accuracy table; ancestor mask and depths as a tree verify passes them), batch 1
           and 16, the 1.19B target;
  auto     fixed K (2, 4) against `"auto"` over n-gram lookup, whole calls at batch 1 on a
           prompt that repeats itself (lookup pays), plain decoding beside them: tokens/s,
           tau, rounds at each K, every greedy answer checked equal to plain decoding's;
  weights  bf16 against the weight-only quantized copies of the 1.19B target the tree
           makes (int8, int4 in groups of 32, fp8 e4m3), in-loop step at batch 1 and 16
           (int8) or 1, and int8 at batch 1 with every product dequantizing its weight
           first (Qwix's way) against scaling its output (jspec's); and, compiled and not
           run, the bytes a loop of the bf16 and int8 targets' calls holds
           (`call_times.loop_memory`; notes, "loop_memory_mib"), the int8 one again with
           each cast of q free to be computed ahead of its product and hoisted out of the
           loop (`quant.in_call` the identity; on the CPU XLA then held every weight
           dequantized), and int8's step at batch 1 that way: skipped, with the reason,
           when this tree has no quantized weights;
  flags    `step` at batch 1 and `auto` again in a child process with XLA options that keep
           the loop on the device (`COMMAND_BUFFER_FLAGS`: command buffers over while loops
           and conditionals), against the default in the same run.

Writes `device_check.jsonl` (the harness's records, `jspec.bench.records`, axis `part`) and
`device_check.md` (the tables, `tables`) under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _importable():
  """jspec from this tree when it is not installed (the device machine runs the tree as
  sent). `models/` installs as `jspec.models`; with the repository root on jspec's own
  search path, `import jspec.models` finds that folder the same way."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  import jspec
  try:
    importlib.import_module("jspec.models")
  except ImportError:
    jspec.__path__.append(ROOT)


_importable()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jspec  # noqa: E402
from jspec.bench import costs, runner  # noqa: E402
from jspec.bench import metrics as M  # noqa: E402
from jspec.bench import records as R  # noqa: E402
from jspec.bench import report  # noqa: E402

STUDY = "device-check"
PARTS = ("step", "verify", "auto", "weights", "span", "flags")  # in order of need
WIDTHS = (2, 5, 9, 17, 33, 81)
# Nominal HBM bandwidth by device kind, TB/s (NVIDIA's data sheets: H100 SXM 3.35, H200 4.8).
PEAK_TB_S = {"H100": 3.35, "H200": 4.8}
# XLA GPU options: command buffers (CUDA graphs) over while loops and conditionals too, so a
# decode loop's iterations need no host round trip (XLA's `xla_gpu_enable_command_buffer`).
COMMAND_BUFFER_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,"
                        "CUDNN,CONDITIONAL,WHILE --xla_gpu_graph_min_graph_size=1")


@dataclasses.dataclass(frozen=True)
class Sizes:
  """What the parts run at: the device's sizes, or the dry run's tiny ones."""

  batches: tuple[int, ...] = (1, 16, 64)
  verify_batches: tuple[int, ...] = (1, 16)
  widths: tuple[int, ...] = WIDTHS
  new_tokens: int = 128  # the steady part's long run (the short one is a quarter)
  repeats: int = 5
  prompt: int = 64
  span_cache: int = 4096
  dtype: str = "bfloat16"
  auto_new: int = 96


DRY = Sizes(batches=(1, 4), verify_batches=(1,), widths=(2, 5, 9), new_tokens=16, repeats=2,
            prompt=12, span_cache=256, dtype="float32", auto_new=16)


def configs(dry: bool) -> dict:
  """{name: TransformerConfig}: the 1.19B target and SmolLM2-135M's shape (tiny stand-ins in
  a dry run)."""
  from jspec.models import TransformerConfig

  if dry:
    tiny = lambda layers, hidden: TransformerConfig(
        vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096)
    return {"1b": tiny(2, 64), "smollm2": tiny(2, 32)}
  return {
      "1b": TransformerConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5461,
                              num_hidden_layers=24, num_attention_heads=16,
                              num_key_value_heads=4, max_position_embeddings=4096),
      # SmolLM2-135M-Instruct's config.json
      "smollm2": TransformerConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                   num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, rms_norm_eps=1e-5,
                                   rope_theta=100000.0, max_position_embeddings=8192,
                                   tie_word_embeddings=True)}


def _prompt(vocab: int, n: int, seed: int = 0) -> list[int]:
  return [int(x) for x in np.random.default_rng(seed).integers(0, vocab, n)]


def _repeating(vocab: int, n: int) -> list[int]:
  """A prompt that repeats a 16-token phrase: what lookup drafts from."""
  phrase = _prompt(vocab, 16, seed=1)
  return (phrase * (n // 16 + 1))[:n]


def _kv_bytes(model, batch: int, live: int) -> int:
  """Bytes of K/V a step reads for `live` slots per row (every layer's K and V)."""
  c = model.config
  itemsize = jnp.dtype(model.dtype).itemsize
  return 2 * c.num_hidden_layers * batch * c.num_key_value_heads * c.head_dim * live * itemsize


class Check:
  """The run: its models, records and budget; `part_*` methods add records."""

  def __init__(self, args):
    self.args, self.dry = args, args.dry_run
    self.sizes = DRY if self.dry else Sizes()
    self.t0, self.recs, self.notes = time.perf_counter(), [], {}
    self.configs = configs(self.dry)
    self.models = {}
    self.kind = jax.devices()[0].device_kind
    self.bandwidth = costs.memory_bandwidth(1 << (24 if self.dry else 30))
    peak = next((v for k, v in PEAK_TB_S.items() if k in self.kind), None)
    self.peak = None if peak is None else peak * 1e12

  def model(self, name: str, weights: str = "base"):
    """Model `name` with random weights in the run's dtype ("base") or a weight-only
    quantized copy of them ("int8", "fp8")."""
    key = (name, weights)
    if key not in self.models:
      self.models[key] = (jspec.models.init(self.configs[name], seed=0, dtype=self.sizes.dtype)
                          if weights == "base" else quantized(self.model(name), weights))
    return self.models[key]

  def left(self) -> float:
    return self.args.budget - (time.perf_counter() - self.t0)

  def add(self, part: str, recs) -> None:
    for r in recs:
      self.recs.append(dataclasses.replace(r, study=STUDY, axes={"part": part, **r.axes}))

  # ------------------------------------------------------------------- parts

  def steady_step(self, part: str, name: str, batch: int, weights: str = "base",
                  cache_length: int | None = None, label: dict | None = None, **config):
    """Plain decoding's steady step of model `name` at `batch` (records with axes model,
    batch, weights and the config changes); cache_length None: the prompt's and run's
    bucket."""
    model = self.model(name, weights)
    if config:
      model = dataclasses.replace(model, config=dataclasses.replace(model.config, **config))
    s = self.sizes
    prompts = [_prompt(model.vocab_size, s.prompt, seed=b) for b in range(batch)]
    options = {} if cache_length is None else {"cache_length": cache_length}
    recs = costs.steady(model, {runner.PLAIN: None}, prompts, s.new_tokens, s.repeats, STUDY,
                        **options)
    axes = {"model": name, "weights": weights if weights != "base" else s.dtype,
            **{k: str(v) for k, v in config.items()}, **(label or {})}
    self.add(part, [dataclasses.replace(r, axes={**r.axes, **axes}) for r in recs])

  def part_step(self):
    for name, batches in (("1b", self.sizes.batches),
                          ("smollm2", self.sizes.batches[::len(self.sizes.batches) - 1])):
      for B in batches:
        self.steady_step("step", name, B)

  def part_span(self):
    B = self.sizes.batches[-1]
    for span in (0, 128):  # 0: the whole cache, as on an accelerator by default
      self.steady_step("span", "smollm2", B, cache_length=self.sizes.span_cache,
                       min_attention_span=span)
    self.notes["span"] = {"cache_slots": self.sizes.span_cache}

  def part_verify(self):
    from jspec.core.tree import Tree
    from jspec.planner import call_times

    model = self.model("1b")
    S = 256
    for B in self.sizes.verify_batches:
      chain = call_times.loop_times(model, B, (1,) + self.sizes.widths, S,
                                    repeats=self.sizes.repeats)
      for W, seconds in chain.items():
        self.add("verify", [R.Record(study=STUDY, method="call", workload="random",
                                     prompt="-", axes={"batch": B, "width": W, "shape": "chain"},
                                     tokens=B * W, calls=1, seconds=tuple(seconds))])
      for W in self.sizes.widths:
        tree = Tree.best_first(np.full((8, 4), 0.5), W)
        seconds = tree_call_times(model, B, tree, S, self.sizes.repeats)
        self.add("verify", [R.Record(study=STUDY, method="call", workload="random", prompt="-",
                                     axes={"batch": B, "width": W, "shape": "tree",
                                           "depth": tree.max_depth},
                                     tokens=B * W, calls=1, seconds=tuple(seconds))])

  def part_auto(self, flags: str = "default"):
    from jspec.bench import methods

    model = self.model("1b")
    prompt = [_repeating(model.vocab_size, self.sizes.prompt)]
    calls, built = {}, {"plain": None}
    for spec in ("ngram@k=2", "ngram@k=4", "ngram@k=auto"):
      built[spec] = methods.build(spec, model)
    fns = {n: runner.jspec_call(model, b, prompt, self.sizes.auto_new, 0.0, 0, False)
           for n, b in built.items()}
    calls = {n: (lambda f: lambda: f(self.sizes.auto_new))(f) for n, f in fns.items()}
    for fn in calls.values():
      jax.block_until_ready(fn().tokens)
    outs, times = runner.interleave(calls, self.sizes.repeats)
    plain = runner.answers(outs["plain"])
    recs = []
    for n, o in outs.items():
      same = None if n == "plain" else all(
          np.array_equal(a, b) for a, b in zip(runner.answers(o), plain))
      recs.append(R.from_output(o, study=STUDY, method=n, workload="repeating", prompt="0",
                                seconds=tuple(times[n]), equal=same,
                                axes={"model": "1b", "batch": 1, "flags": flags}))
    self.add("auto", recs)

  def part_weights(self):
    modes = available_weights()
    if not modes:
      self.notes["weights"] = {"skipped": "this tree has no quantized weights"}
      return
    # bf16 and int8 at batch 1 and 16; the other forms at batch 1, where weight bytes
    # are the step (the budget's five minutes hold about six compiled steps here).
    for mode in ("base",) + modes:
      for B in self.sizes.batches[:2] if mode in ("base", "int8") else self.sizes.batches[:1]:
        self.steady_step("weights", "1b", B, weights=mode,
                         label={"product": {"base": "-", "int4": "dequantize (groups)"}.get(
                             mode, "scale output")})
    if "int8" not in modes:
      return
    # Then, while the budget leaves their expected seconds (compiles, mostly): the loops'
    # memory (three compiles, no run) and the products computed the other way.
    for name, need in (("loop_memory", 30), ("dequantize_first", 25)):
      if self.dry or self.left() >= need:
        getattr(self, name)()
      else:
        self.notes.setdefault("weights", {})[name] = f"skipped: {self.left():.0f} s left"

  def loop_memory(self):
    """What a loop of one-token calls of the bf16 and int8 targets holds, compiled only
    (`call_times.loop_memory`, MiB: weights, the program's arguments and temp), and the
    int8 loop again with `quant.in_call` made the identity ("int8, hoistable"): each cast
    of q then depends on its weight alone, and on the CPU XLA computed them all ahead and
    held every weight wide (the temp). With time left, int8's step at batch 1 that way
    too. Trees without `in_call` record the note "not in this tree"."""
    quant = importlib.import_module("jspec.core.quant")
    try:
      from jspec.planner.call_times import loop_memory
      real = quant.in_call
    except (ImportError, AttributeError):
      self.notes.setdefault("weights", {})["loop_memory_mib"] = "not in this tree"
      return
    mib = lambda d: {k: None if v is None else round(v / 2**20, 1) for k, v in d.items()}  # noqa: E731
    out = {self.sizes.dtype: mib(loop_memory(self.model("1b"))),
           "int8": mib(loop_memory(self.model("1b", "int8")))}
    jax.clear_caches()
    quant.in_call = lambda w, x: w
    try:
      out["int8, hoistable"] = mib(loop_memory(self.model("1b", "int8")))
      if self.dry or self.left() >= 25:
        self.steady_step("weights", "1b", self.sizes.batches[0], weights="int8",
                         label={"product": "scale output, hoistable"})
    finally:
      quant.in_call = real
      jax.clear_caches()
    self.notes.setdefault("weights", {})["loop_memory_mib"] = out

  def dequantize_first(self):
    """int8 at batch 1 again, each product computed the other way: the weight
    dequantized (q * scale, a weight-sized multiply) before a float product, as Qwix does,
    instead of scaling the product's output (`jspec.core.quant.einsum`). Which way is
    faster on the device is what `quant.einsum`'s default per backend rests on. The
    products are traced again (`jax.clear_caches`) with `quant.einsum` swapped, and
    swapped back after; the notes count the swapped products traced."""
    quant = importlib.import_module("jspec.core.quant")
    direct, traced = quant.einsum, []

    def first(eq, x, w, **kw):
      if isinstance(w, quant.QuantWeight):
        traced.append(eq)
        tie = getattr(quant, "in_call", lambda w, x: w)  # as jspec's products tie theirs
        return jnp.einsum(eq, x, quant.dequantize(tie(w, x), x.dtype), **kw)
      return direct(eq, x, w, **kw)

    jax.clear_caches()
    quant.einsum = first
    try:
      self.steady_step("weights", "1b", self.sizes.batches[0], weights="int8",
                       label={"product": "dequantize first"})
    finally:
      quant.einsum = direct
      jax.clear_caches()
    self.notes.setdefault("weights", {})["dequantize_first_products_traced"] = len(traced)

  def part_flags(self):
    """`step` at batch 1 and `auto`, each in a child process with and without
    `COMMAND_BUFFER_FLAGS`, alternating; the child's records join these."""
    for flags in ("default", "command-buffers", "command-buffers", "default"):
      env = dict(os.environ)
      if flags != "default":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + COMMAND_BUFFER_FLAGS).strip()
      out = os.path.join(self.args.out, f"flags_child_{flags}.jsonl")
      cmd = [sys.executable, os.path.abspath(__file__), "--child", flags, "--out", out,
             "--budget", str(max(self.left(), 1))] + (["--dry-run"] if self.dry else [])
      try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=max(self.left(), 1))
      except subprocess.TimeoutExpired:
        self.notes.setdefault("flags", {})[flags] = "stopped at the budget's end"
        break
      if done.returncode != 0:
        self.notes.setdefault("flags", {})[flags] = f"failed: {done.stderr.strip()[-400:]}"
        continue
      _, mine = R.read(out)
      os.remove(out)
      self.add("flags", [dataclasses.replace(r, axes={**r.axes, "flags": flags}) for r in mine])

  def child(self, flags: str) -> list:
    """The flags part's child: `step` at batch 1 for the 1.19B target and `auto`."""
    self.steady_step("flags", "1b", 1)
    self.part_auto(flags)
    return self.recs

  # ------------------------------------------------------------------- output

  def header(self) -> dict:
    return R.header(STUDY, {**dataclasses.asdict(self.sizes), "budget_s": self.args.budget,
                            "dry_run": self.dry},
                    device_kind=self.kind, bandwidth_b_s=self.bandwidth, peak_b_s=self.peak,
                    models={f"{n}/{w}": {"params": m.num_params(),
                                         "weight_bytes": costs.weight_bytes(m),
                                         "kv_bytes_per_slot": _kv_bytes(m, 1, 1)}
                            for (n, w), m in self.models.items()},
                    flags=COMMAND_BUFFER_FLAGS, notes=self.notes,
                    elapsed_s=time.perf_counter() - self.t0)

  def write(self) -> None:
    os.makedirs(self.args.out, exist_ok=True)
    head = self.header()
    R.write(os.path.join(self.args.out, "device_check.jsonl"), head, self.recs)
    with open(os.path.join(self.args.out, "device_check.md"), "w") as f:
      f.write(tables(head, self.recs))


def tree_call_times(model, batch: int, tree, cache_length: int, repeats: int) -> list[float]:
  """Seconds per cached call of `model` on the nodes of `tree` (ancestor mask and depths,
  as a tree verify passes them), in loop (`call_times.looped` / `in_turns`)."""
  from jspec.planner import call_times

  model = model.prepared()
  W, vocab = tree.num_nodes, model.vocab_size
  mask, depth = jnp.asarray(tree.ancestors), jnp.asarray(tree.depths)

  def call(model, carry, i):
    cache, block, start = carry
    logits, _, cache = model.apply((block + i) % vocab, cache, start, block_mask=mask,
                                   depth=depth)
    return (cache, block, start), jnp.argmax(logits, axis=-1)

  start = jnp.full((batch,), min(call_times.PREFIX, cache_length - W), jnp.int32)
  carries = {W: (model.init_cache(batch, cache_length), jnp.ones((batch, W), jnp.int32), start)}
  return call_times.in_turns({W: call_times.looped(call)}, model, carries, None, repeats)[W]


def available_weights() -> tuple[str, ...]:
  """The weight-only quantized forms this tree makes from float weights
  (`jspec.core.quant.MODES`; older trees: `WEIGHTS`)."""
  try:
    quant = importlib.import_module("jspec.core.quant")
  except ImportError:
    return ()
  return tuple(getattr(quant, "MODES", getattr(quant, "WEIGHTS", ())))


def quantized(model, mode: str):
  """`model` with weight-only `mode` weights (`jspec.models.transformer.quantize_model`)."""
  from jspec.models import transformer

  return transformer.quantize_model(model, mode)


# ----------------------------------------------------------------------------- tables


def _ms(x: float) -> str:
  return f"{x * 1e3:.3f}"


def tables(head: dict, recs) -> str:
  """The check's markdown: a table per part the records hold."""
  out = [f"# Device check: {head['device_kind']}", "",
         f"copy bandwidth {head['bandwidth_b_s'] / 1e12:.2f} TB/s"
         + (f", nominal peak {head['peak_b_s'] / 1e12:.2f} TB/s" if head.get("peak_b_s") else "")
         + f"; {head['elapsed_s']:.0f} s in all" + (" (dry run)" if head["settings"]["dry_run"]
                                                     else ""), ""]
  models = head["models"]
  part = lambda name: [r for r in recs if r.axes.get("part") == name]

  def step_rows(mine, label_axes):
    rows = [[*label_axes, "batch", "step ms", "tok/s", "bytes read / step", "of copy bw",
             "of peak"]]
    keyed = M.group(mine, *(["model", "weights"] + [a for a in label_axes
                                                     if a not in ("model", "weights")]
                            + ["batch"]))
    for key, rs in keyed.items():
      step = M.steady_seconds(M.select(rs, length="short"), M.select(rs, length="long"),
                              per="rounds")
      name, B, w = rs[0].axes["model"], rs[0].axes["batch"], rs[0].axes["weights"]
      m = models[f"{name}/{'base' if w == head['settings']['dtype'] else w}"]
      # The steady part's rounds run from a quarter of the run to its end: live slots
      # average the prompt plus five eighths of the new tokens.
      live = head["settings"]["prompt"] + head["settings"]["new_tokens"] * 5 // 8
      nbytes = m["weight_bytes"] + m["kv_bytes_per_slot"] * B * live
      rate = nbytes / step
      rows.append([str(rs[0].axes.get(a, "")) for a in label_axes]
                  + [str(B), _ms(step), f"{B / step:.0f}", f"{nbytes / 1e9:.3f} GB",
                     f"{rate / head['bandwidth_b_s']:.2f}",
                     f"{rate / head['peak_b_s']:.2f}" if head.get("peak_b_s") else "-"])
    return report.markdown(rows)

  if part("step"):
    out += ["## Plain decoding's step inside the loop", "", step_rows(part("step"), ["model"]),
            ""]
  if part("span"):
    out += ["## Dead cache slots (SmolLM2's shape, "
            f"{head['notes'].get('span', {}).get('cache_slots')} slots)", "",
            step_rows(part("span"), ["model", "min_attention_span"]), ""]
  if part("verify"):
    rows = [["batch", "shape", "width", "ms per call", "over a step"]]
    mine = part("verify")
    for (B, shape, W), rs in M.group(mine, "batch", "shape", "width").items():
      one = M.select(mine, batch=B, width=1)
      base = min(one[0].seconds) if one else float("nan")
      rows.append([str(B), shape, str(W), _ms(min(rs[0].seconds)),
                   f"{min(rs[0].seconds) / base:.2f}"])
    out += ["## Verify cost against width (1.19B target, in loop, fastest turn)", "",
            report.markdown(rows), ""]
  for name, title in (("auto", "Fixed K against \"auto\" (n-gram, repeating prompt, batch 1)"),
                      ("flags", "XLA command buffers over loops: default against on")):
    mine = [r for r in part(name) if r.axes.get("length") is None]
    if mine:
      rows = [["flags", "method", "tok/s", "x plain", "tau", "rounds by K", "equal"]]
      for (flags, method), rs in M.group(mine, "flags", "method").items():
        base = M.select(mine, flags=flags, method="plain")
        rows.append([flags, method, f"{M.tokens_per_s(rs):.0f}",
                     f"{M.speedup(base, rs):.2f}", f"{M.tau(rs):.2f}",
                     ", ".join(f"{k}: {n}" for k, n in M.rounds_by_k(rs).items()) or "-",
                     str(rs[0].equal)])
      out += [f"## {title}", "", report.markdown(rows), ""]
    steps = [r for r in part(name) if r.axes.get("length") is not None]
    if steps:
      out += [step_rows(steps, ["flags"]), ""]
  if part("weights"):
    out += ["## Weight-only quantization (1.19B target)", "",
            step_rows(part("weights"), ["weights", "product"]), ""]
  for name, note in head["notes"].items():
    if name != "span":
      out += [f"{name}: {json.dumps(note)}", ""]
  return "\n".join(out)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "gpu"))
  p.add_argument("--parts", default=",".join(PARTS))
  p.add_argument("--budget", type=float, default=270.0, help="seconds for every part")
  p.add_argument("--dry-run", action="store_true", help="tiny models on any backend")
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  parts = [x for x in args.parts.split(",") if x]
  unknown = set(parts) - set(PARTS)
  if unknown:
    raise SystemExit(f"--parts: unknown {', '.join(sorted(unknown))}; known: {', '.join(PARTS)}")
  if not args.dry_run and jax.default_backend() == "cpu":
    raise SystemExit("the device check needs an accelerator; jax sees only the CPU "
                     "(--dry-run runs the same code paths on tiny models)")
  check = Check(args)
  if args.child:
    R.write(args.out, check.header(), check.child(args.child))
    return 0
  # What each part is expected to take on the device, seconds (compiles included), from
  # the 2026-11-30 run's compile and step times; a part starts only when this much is left.
  expected = {"step": 100, "verify": 50, "auto": 40, "weights": 70, "span": 20, "flags": 60}
  for name in parts:
    need = 0 if args.dry_run else expected[name]
    if check.left() < need:
      check.notes[name] = {"skipped": f"{check.left():.0f} s left of the budget, {need} needed"}
      print(f"{name}: skipped ({check.left():.0f} s left)", flush=True)
      continue
    t = time.perf_counter()
    getattr(check, f"part_{name}")()
    print(f"{name}: {time.perf_counter() - t:.0f} s", flush=True)
    check.write()
  check.write()
  print(open(os.path.join(args.out, "device_check.md")).read())
  return 0


if __name__ == "__main__":
  sys.exit(main())
