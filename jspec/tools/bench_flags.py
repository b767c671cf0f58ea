"""What XLA CPU's options do to a step and a verify: one fresh process per option set.

    python -m jspec.tools.bench_flags [--target smollm2] [--blocks 1,5,24] [--json out.json]
    python -m jspec.tools.bench_flags --programs [--target smollm2] [--repeats 5]

A verify of a few tokens costs several one-token steps on a CPU, where reading the
weights once bounds it near one step; XLA CPU has options that route matrix products
to other kernels (XNNPACK, YNNPACK, oneDNN) or change its own code generation. Each
option set is read once, when XLA starts, so every set runs in a process of its own:
it loads the target, compiles a batch-1 cached call on each block size and times
`calls` calls inside one jitted loop (`jspec.planner.call_times.loop_times`), interleaved
over `repeats`. Reported per set: ms per call of each block size, each block's cost
in steps, and whether the logits equal the default set's (a kernel that changes the
numbers would change greedy answers at near-ties).

`--programs` measures the options jspec compiles its own programs with
(`jspec.core.compilation.CPU_OPTIONS`) instead: greedy decoding of one held-out chat
prompt of each kind, compiled with and without them, in one process, the two
interleaved over `repeats`; answers must be identical.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

OPTION_SETS = {
    "default": "",
    "xnnpack dots": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "xnnpack graph": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "ynnpack dots": "--xla_cpu_experimental_ynn_fusion_type=dot",
    "onednn": "--xla_cpu_experimental_onednn_custom_call=true",
    "vector width 512": "--xla_cpu_prefer_vector_width=512",
    "no xnnpack": "--xla_cpu_use_xnnpack=false",
}


def child(target: str, blocks: list[int], calls: int, repeats: int) -> dict:
  """Run inside the process whose XLA_FLAGS are set: times and a logits checksum."""
  import jax.numpy as jnp
  import numpy as np

  from jspec.bench import targets
  from jspec.planner.call_times import loop_times

  model = targets.load(target)
  times = loop_times(model, 1, blocks, 512, calls, repeats)
  prepared = model.prepared()
  logits, _, _ = prepared.apply(jnp.arange(1, 6, dtype=jnp.int32)[None, :],
                                prepared.init_cache(1, 64), jnp.zeros((1,), jnp.int32))
  return {"ms": {str(b): statistics.median(t) * 1e3 for b, t in times.items()},
          "logits": np.asarray(logits, np.float64).ravel()[::997].tolist()}


def run(target: str, blocks: list[int], calls: int = 10, repeats: int = 5, sets=None,
        rounds: int = 1, log=print) -> dict:
  """{option set: {"flags", "ms", "steps", "max_logit_diff"}}; with rounds > 1 every set
  runs that many times, the sets in turns, and "runs" keeps each round's ms."""
  report = {}
  reference = None
  names = list(OPTION_SETS) if sets is None else list(sets)
  for name in [n for _ in range(rounds) for n in names]:
    flags = OPTION_SETS[name]
    env = dict(os.environ, XLA_FLAGS=flags)
    cmd = [sys.executable, "-m", "jspec.tools.bench_flags", "--child", "--target", target,
           "--blocks", ",".join(map(str, blocks)), "--calls", str(calls),
           "--repeats", str(repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
      report[name] = {"flags": flags, "error": done.stderr.strip().splitlines()[-1:]}
      log(f"{name:<18} failed: {report[name]['error']}")
      continue
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if reference is None:
      reference = out["logits"]
    diff = max(abs(a - b) for a, b in zip(out["logits"], reference))
    step = out["ms"][str(blocks[0])]
    runs = report.get(name, {}).get("runs", []) + [out["ms"]]
    ms = {b: statistics.median(r[b] for r in runs) for b in out["ms"]}
    report[name] = {"flags": flags, "ms": ms, "runs": runs,
                    "steps": {b: v / ms[str(blocks[0])] for b, v in ms.items()},
                    "max_logit_diff": max(diff, report.get(name, {}).get("max_logit_diff", 0.0))}
    log(f"{name:<18} " + "  ".join(f"T={b}: {ms:.1f} ms ({ms / step:.2f} steps)"
                                   for b, ms in out["ms"].items())
        + f"  logits vs default: max diff {diff:.1e}")
  return report


def program_options(target: str, repeats: int = 5, max_new_tokens: int = 128,
                    log=print) -> dict:
  """Tokens/s of greedy decoding compiled with and without CPU_OPTIONS (module docstring)."""
  import time

  import numpy as np

  from jspec.core import compilation, programs
  from jspec.bench import targets
  from jspec.tools import bench_real, real_sections

  s = bench_real.Settings(max_new_tokens=max_new_tokens, per_kind=1)
  model = targets.load(target)
  prompts = bench_real.default_prompts(model, 1)
  P, S = real_sections.shapes(prompts, s)
  calls = [real_sections.jspec_call(model, [ids], P, S, s) for _, ids in prompts]
  variants = {"without": False, "with CPU_OPTIONS": True}

  def run_all(cpu_options: bool):
    with programs.fixed.using(cpu_options):
      return [np.asarray(call().tokens) for call in calls]

  answers = {name: run_all(v) for name, v in variants.items()}  # compiles both
  same = all(np.array_equal(a, b) for a, b in zip(*answers.values()))
  tokens = sum(int((a >= 0).sum()) for a in answers["without"])
  times = {name: [] for name in variants}
  for r in range(repeats):
    for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
      t0 = time.perf_counter()
      run_all(variants[name])
      times[name].append(time.perf_counter() - t0)
  report = {"tokens": tokens, "identical_answers": same, "options": compilation.CPU_OPTIONS,
            "times_s": times,
            "tokens_per_s": {n: tokens / statistics.median(t) for n, t in times.items()},
            "speedup_per_repeat": [a / b for a, b in zip(*times.values())]}
  for name, rate in report["tokens_per_s"].items():
    log(f"{name:<18} {rate:.1f} tokens/s")
  log(f"speedup per repeat: {', '.join(f'{x:.3f}' for x in report['speedup_per_repeat'])}; "
      f"answers identical: {same}")
  return report


def main(argv=None) -> int:
  """The command line (module docstring); --child is the measuring process itself."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2")
  parser.add_argument("--blocks", default="1,5,24")
  parser.add_argument("--calls", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--sets", default=None, help="comma-separated names of OPTION_SETS")
  parser.add_argument("--rounds", type=int, default=1, help="runs of every set, in turns")
  parser.add_argument("--json", default=None)
  parser.add_argument("--programs", action="store_true",
                      help="jspec's own program options, with against without")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  blocks = [int(b) for b in args.blocks.split(",")]
  if args.child:
    print(json.dumps(child(args.target, blocks, args.calls, args.repeats)))
    return 0
  sets = None if args.sets is None else args.sets.split(",")
  if args.programs:
    report = program_options(args.target, args.repeats)
  else:
    report = run(args.target, blocks, args.calls, args.repeats, sets, args.rounds)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
