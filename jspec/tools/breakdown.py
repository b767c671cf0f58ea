"""Where a cached model call spends its time, kernel by kernel, at each block size.

On an accelerator a verify of a few tokens costs about one step; on a CPU it can cost two
(docs/benchmarks.md). This tool says which part of the call grows: it compiles the
model's cached call on T tokens per row exactly as the decode loop runs it
(`call_times.looped`), runs it under the JAX profiler, and sums the device time of every
kernel by what it computes. Products are named by the weight matrix they read, so the
q/k/v, attention-output, MLP and output-head products of every layer fall into one group
each; the attention's own products over the cache, and everything else, are two more
groups.

    python -m jspec.tools.breakdown --target smollm2 --blocks 1,5

prints, per group, the kernels per call, the milliseconds per call at each block and the
ratio of the largest block to the smallest, then the kernels' sum and the untraced call's
wall time. Kernel times are the profiler's: tracing slows a call (by up to 10% on a 2-core
CPU), so the sum can exceed the untraced call. The blocks' untraced calls are timed in turns
(`jspec.bench.runner.interleave`); `--json FILE` writes the records (`jspec.bench.records`:
a record per group and block, axes `group` and `block`).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import math
import re
import tempfile

import jax
import jax.numpy as jnp

from jspec.planner import call_times

# One instruction of the compiled program's text: name, output shape, opcode, operands.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = \w+\[([\d,]*)\]\S* ([\w\-]+)\((.*?)\)")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")


def kernel_groups(hlo_text: str, cache_length: int) -> dict[str, str]:
  """Instruction name -> group label for the products of a compiled program's text.

  A product is a `dot`, or a fusion whose computation holds one. One that contracts
  batched operands, or whose largest operand spans the cache's `cache_length` slots, is
  "attention products" (scores and values over the cache); any other is named by its
  largest operand, the weight matrix it reads: "weights 576x3072". Names not returned
  are the other kernels (norms, softmax, cache writes, ...).
  """
  shapes, bodies, current = {}, collections.defaultdict(list), None
  for line in hlo_text.splitlines():
    if line and not line[0].isspace():
      c = _COMPUTATION.match(line)
      current = c.group(1) if c else current
    m = _INSTRUCTION.match(line)
    if m:
      shapes[m.group(1)] = tuple(int(d) for d in m.group(2).split(",") if d)
      bodies[current].append(line)

  def batched_dot(lines):
    return any(" dot(" in l and "lhs_batch_dims" in l for l in lines)

  groups = {}
  for line in hlo_text.splitlines():
    m = _INSTRUCTION.match(line)
    if not m or m.group(3) not in ("dot", "fusion"):
      continue
    name, _, opcode, operands = m.groups()
    called = _CALLS.search(line)
    body = bodies.get(called.group(1), []) if called else []
    if opcode == "fusion" and not any(" dot(" in l for l in body):
      continue
    sizes = [shapes.get(o, ()) for o in re.findall(r"%([\w.\-]+)", operands)]
    largest = max(sizes, key=lambda d: math.prod(d) if d else 0, default=())
    if batched_dot([line] + body) or cache_length in largest:
      groups[name] = "attention products"
    else:
      groups[name] = "weights " + "x".join(str(d) for d in largest if d > 1)
  return groups


def _kernel_times(trace_dir: str) -> collections.Counter:
  """Microseconds per kernel name, summed over a perfetto trace written by jax.profiler."""
  (path,) = glob.glob(trace_dir + "/**/*.trace.json.gz", recursive=True)
  with gzip.open(path) as f:
    events = json.load(f)["traceEvents"]
  total = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and "dur" in e:
      total[e["name"]] += e["dur"]
  return total


STUDY = "breakdown"
WHOLE = "whole call, in loop"  # the group of the untraced call's wall time


def breakdown(model, batch: int, blocks, cache_length: int, calls: int = 10,
              prefix: int = call_times.PREFIX, repeats: int = 3) -> list:
  """Records (`jspec.bench.records`) of the cached call of `model` on each block of T tokens
  per row: per kernel group (axis `group`) its milliseconds per call in one traced run of
  `calls` calls after a warm-up (`seconds`: one figure; `extra["kernels"]`: how many), and
  the untraced call's wall time per call (group `WHOLE`: a figure per turn, the blocks timed
  in turns by `runner.interleave`), on the same compiled program."""
  from jspec.bench import records as R
  from jspec.bench import runner

  model = model.prepared()
  run = call_times.looped(call_times.cached_call(model.vocab_size))
  axes = lambda T, group: {"group": group, "block": T, "batch": batch,
                           "cache_length": cache_length}
  recs, compiled, carries = [], {}, {}
  for T in sorted({int(b) for b in blocks}):
    start = jnp.full((batch,), max(min(prefix, cache_length - T), 0), jnp.int32)
    carry = (model.init_cache(batch, cache_length), jnp.ones((batch, T), jnp.int32), start)
    # One compile serves the kernel names, the traced run and the untraced timing.
    compiled[T] = run.lower(model, carry, calls).compile()
    text = compiled[T].as_text()
    groups = kernel_groups(text, cache_length)
    # Kernels are the names the program defines; the rest of the trace is the runtime's.
    # (a loop or call spans the kernels inside it, so it is not one)
    kernels = {m.group(1) for m in map(_INSTRUCTION.match, text.splitlines())
               if m and m.group(3) not in ("while", "conditional", "call")}
    carry, acc = compiled[T](model, carry, calls)  # warm up
    jax.block_until_ready(acc)
    with tempfile.TemporaryDirectory() as tmp:
      with jax.profiler.trace(tmp, create_perfetto_trace=True):
        carries[T], acc = compiled[T](model, carry, calls)
        jax.block_until_ready(acc)
      times = _kernel_times(tmp)
    per_group, counts = collections.Counter(), collections.Counter()
    for name, us in times.items():
      if name in kernels:
        label = groups.get(name, "other kernels")
        per_group[label] += us / calls / 1e6
        counts[label] += 1
    recs += [R.Record(STUDY, "plain", "", "", axes=axes(T, label), seconds=(sec,),
                      extra={"kernels": counts[label]}) for label, sec in per_group.items()]

  def untraced(T):
    def go():
      carries[T], acc = compiled[T](model, carries[T], calls)
      return acc
    return go

  _, wall = runner.interleave({T: untraced(T) for T in compiled}, repeats,
                              wait=jax.block_until_ready)
  return recs + [R.Record(STUDY, "plain", "", "", axes=axes(T, WHOLE),
                          seconds=tuple(t / calls for t in wall[T])) for T in compiled]


def format_table(recs) -> str:
  """`breakdown`'s records as a text table: one row per group, largest first, then the sum of
  the kernels and the whole call's wall time (its fastest turn), with the ratio of the
  largest block to the smallest."""
  from jspec.bench import metrics as M

  ms = {key: 1e3 * min(rs[0].seconds) for key, rs in M.group(recs, "group", "block").items()}
  blocks = sorted({T for _, T in ms})
  groups = [g for g in M.group(recs, "group") if g != WHOLE]
  lo, hi = blocks[0], blocks[-1]
  head = ["group", "kernels"] + [f"T={T}, ms" for T in blocks] + [f"T={hi} / T={lo}"]
  ratio = lambda xs: f"{xs[-1] / xs[0]:.2f}x" if xs[0] > 0 else "-"
  rows = []
  for label in sorted(groups, key=lambda g: -max(ms.get((g, T), 0.0) for T in blocks)):
    xs = [ms.get((label, T), 0.0) for T in blocks]
    kernels = max(r.extra["kernels"] for r in M.select(recs, group=label))
    rows.append([label, str(kernels)] + [f"{x:.2f}" for x in xs] + [ratio(xs)])
  sums = [sum(ms.get((g, T), 0.0) for g in groups) for T in blocks]
  rows.append(["all kernels", ""] + [f"{x:.2f}" for x in sums] + [ratio(sums)])
  wall = [ms[(WHOLE, T)] for T in blocks]
  rows.append([WHOLE, ""] + [f"{x:.2f}" for x in wall] + [ratio(wall)])
  widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
  line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths)))
  return "\n".join([line(head)] + [line(r) for r in rows])


def main(argv=None) -> int:
  """`python -m jspec.tools.breakdown`: load the target, print the table (module docstring)."""
  from jspec.bench import targets

  parser = argparse.ArgumentParser(prog="python -m jspec.tools.breakdown",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--target", default="smollm2",
                      help="a target jspec.bench.targets resolves: smollm2, a GGUF file, a "
                           "checkpoint folder, a cached Hub id")
  parser.add_argument("--blocks", default="1,5", help="tokens per row of each timed call")
  parser.add_argument("--batch-size", type=int, default=1)
  parser.add_argument("--cache-length", type=int, default=384)
  parser.add_argument("--calls", type=int, default=10, help="calls in the traced run")
  parser.add_argument("--json", default=None,
                      help="write the records here (JSON lines under a header)")
  args = parser.parse_args(argv)
  blocks = [int(b) for b in args.blocks.split(",") if b.strip()]
  if not blocks or min(blocks) < 1 or max(blocks) > args.cache_length:
    parser.error(f"--blocks must lie in [1, cache length {args.cache_length}], got {args.blocks}")
  model = targets.load(args.target)
  recs = breakdown(model, args.batch_size, blocks, args.cache_length, calls=args.calls)
  print(f"{args.target}, batch {args.batch_size}, cache {args.cache_length}, "
        f"{jax.default_backend()}: device time per cached call, by kernel group")
  print(format_table(recs))
  if args.json:
    from jspec.bench import records as R

    head = R.header(STUDY, {"blocks": blocks, "batch": args.batch_size,
                            "cache_length": args.cache_length, "calls": args.calls},
                    target=args.target,
                    seconds="profiler groups: the traced run's device time per call; "
                            "whole call: the untraced wall time per call, one per turn")
    print(f"wrote {R.write(args.json, head, recs)}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
