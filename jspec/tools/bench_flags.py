"""What XLA CPU's options do to a step and a verify: one fresh process per option set.

    python -m jspec.tools.bench_flags [--target smollm2] [--blocks 1,5,24] [--rounds 1]
                                      [--json out.jsonl]
    python -m jspec.tools.bench_flags --programs [--target smollm2] [--repeats 5]

A verify of a few tokens costs several one-token steps on a CPU, where reading the
weights once bounds it near one step; XLA CPU has options that route matrix products
to other kernels (XNNPACK, YNNPACK, oneDNN) or change its own code generation. Each
option set is read once, when XLA starts, so every set runs in a process of its own:
it loads the target, compiles a batch-1 cached call on each block size and times
`calls` calls inside one jitted loop (`jspec.planner.call_times.loop_times`), interleaved
over `repeats`; with `--rounds N` every set runs N times, the sets in turns
(`jspec.bench.runner.interleave`). Reported per set: ms per call of each block size, each
block's cost in steps, and how far the logits are from the first set's (`default`, unless
--sets says otherwise: a kernel that changes the numbers would change greedy answers at
near-ties).

`--programs` measures the options jspec compiles its own programs with
(`jspec.core.compilation.CPU_OPTIONS`) instead: greedy decoding of one held-out chat
prompt of each kind, compiled with and without them, in one process, timed by the
harness's runner (`jspec.bench.runner.run`: interleaved over `repeats`, the answers
compared token for token: they must be identical).

`--json FILE` writes the records (`jspec.bench.records`, JSON lines under a header): a
record per option set, block and round (study `xla-flags`), or per variant and prompt
(study `cpu-options`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

STUDY = "xla-flags"
OPTION_SETS = {
    "default": "",
    "xnnpack dots": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "xnnpack graph": "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
    "ynnpack dots": "--xla_cpu_experimental_ynn_fusion_type=dot",
    "onednn": "--xla_cpu_experimental_onednn_custom_call=true",
    "vector width 512": "--xla_cpu_prefer_vector_width=512",
    "no xnnpack": "--xla_cpu_use_xnnpack=false",
}


CACHE_LENGTH = 512  # of the timed calls


def child(target: str, blocks: list[int], calls: int, repeats: int) -> dict:
  """Run inside the process whose XLA_FLAGS are set: seconds per call of each block, one a
  turn, and a logits checksum."""
  import jax.numpy as jnp
  import numpy as np

  from jspec.bench import targets
  from jspec.planner.call_times import loop_times

  model = targets.load(target)
  times = loop_times(model, 1, blocks, CACHE_LENGTH, calls, repeats)
  prepared = model.prepared()
  logits, _, _ = prepared.apply(jnp.arange(1, 6, dtype=jnp.int32)[None, :],
                                prepared.init_cache(1, 64), jnp.zeros((1,), jnp.int32))
  return {"seconds": {str(b): t for b, t in times.items()},
          "logits": np.asarray(logits, np.float64).ravel()[::997].tolist()}


def run(target: str, blocks: list[int], calls: int = 10, repeats: int = 5, sets=None,
        rounds: int = 1, log=print) -> tuple[list, dict]:
  """(records, {option set: error}): every set in a process of its own, `rounds` times, the
  sets in turns (`runner.interleave`: the order reversed every other round). A record per
  set, block and round (axes `flags`, `block`, `round`), seconds per call one per turn;
  extra: the flags and the largest logit difference from the first set run."""
  from jspec.bench import records as R
  from jspec.bench import runner

  names = list(OPTION_SETS) if sets is None else list(sets)
  recs, errors, reference, done = [], {}, [], {n: 0 for n in names}

  def process(name):
    def go():
      flags = OPTION_SETS[name]
      cmd = [sys.executable, "-m", "jspec.tools.bench_flags", "--child", "--target", target,
             "--blocks", ",".join(map(str, blocks)), "--calls", str(calls),
             "--repeats", str(repeats)]
      ran = subprocess.run(cmd, env=dict(os.environ, XLA_FLAGS=flags), capture_output=True,
                           text=True)
      if ran.returncode != 0:
        errors[name] = ran.stderr.strip().splitlines()[-1:]
        log(f"{name:<18} failed: {errors[name]}")
        return
      out = json.loads(ran.stdout.strip().splitlines()[-1])
      reference[:] = reference or [out["logits"]]
      diff = max(abs(a - b) for a, b in zip(out["logits"], reference[0]))
      mine = [R.Record(STUDY, "plain", "", "", axes={
          "flags": name, "block": int(b), "round": done[name], "batch": 1,
          "cache_length": CACHE_LENGTH}, seconds=tuple(t), extra={
              "xla_flags": flags, "max_logit_diff": diff}) for b, t in out["seconds"].items()]
      done[name] += 1
      recs.extend(mine)
      log(f"{name:<18} " + "  ".join(_ms_line(mine, blocks))
          + f"  logits vs the first set: max diff {diff:.1e}")
    return go

  runner.interleave({n: process(n) for n in names}, rounds, wait=lambda out: None)
  return recs, errors


def _ms_line(recs, blocks) -> list[str]:
  ms = {b: 1e3 * statistics.median(t for r in recs if r.axes["block"] == b for t in r.seconds)
        for b in blocks}
  return [f"T={b}: {ms[b]:.1f} ms ({ms[b] / ms[blocks[0]]:.2f} steps)" for b in blocks]


def table(recs, blocks) -> str:
  """Per option set: ms per call of each block (the median of its turns, every round
  pooled), its cost in steps, and the largest logit difference from the first set."""
  from jspec.bench import metrics as M

  return "\n".join(f"{name:<18} " + "  ".join(_ms_line(mine, blocks))
                   + f"  max logit diff {max(r.extra['max_logit_diff'] for r in mine):.1e}"
                   for name, mine in M.group(recs, "flags").items())


def program_options(target: str, repeats: int = 5, max_new_tokens: int = 128,
                    log=print) -> tuple[list, list]:
  """(records, mismatches): greedy decoding of one held-out chat prompt of each kind,
  compiled without and with CPU_OPTIONS, by the runner (interleaved, the answers compared
  token for token); methods `without-cpu-options`, `with-cpu-options`."""
  import types

  from jspec.bench import metrics as M
  from jspec.bench import runner, targets, workloads
  from jspec.core import programs

  def call(target, built, rows, n, temperature, seed, eos, memory=None, carried=None):
    fn = runner.jspec_call(target, None, rows, n, temperature, seed, eos)

    def go(k):
      with programs.fixed.using(built.cpu_options):
        return fn(k)
    return go

  method = lambda on: types.SimpleNamespace(drafter=None, cpu_options=on)
  without = "without-cpu-options"
  variants = [runner.Variant(without, method(False), reference=None),
              runner.Variant("with-cpu-options", method(True), reference=without)]
  res = runner.run(targets.load(target), variants, workloads.load("chat").per_category(1),
                   runner.Settings(max_new_tokens=max_new_tokens, repeats=repeats),
                   "cpu-options", call=call)
  by = M.group(res.records, "method")
  for name, mine in by.items():
    log(f"{name:<18} {M.tokens_per_s(mine):.1f} tokens/s")
  per_repeat = [a / b for a, b in zip(*(M.repeat_seconds(by[v.name]) for v in variants))]
  log(f"speedup per repeat: {', '.join(f'{x:.3f}' for x in per_repeat)}; "
      f"answers identical: {not res.mismatches}")
  return res.records, res.mismatches


def main(argv=None) -> int:
  """The command line (module docstring); --child is the measuring process itself."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--target", default="smollm2")
  parser.add_argument("--blocks", default="1,5,24")
  parser.add_argument("--calls", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--sets", default=None, help="comma-separated names of OPTION_SETS")
  parser.add_argument("--rounds", type=int, default=1, help="runs of every set, in turns")
  parser.add_argument("--json", default=None,
                      help="write the records here (JSON lines under a header)")
  parser.add_argument("--programs", action="store_true",
                      help="jspec's own program options, with against without")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  blocks = [int(b) for b in args.blocks.split(",")]
  if args.child:
    print(json.dumps(child(args.target, blocks, args.calls, args.repeats)))
    return 0
  from jspec.bench import records as R
  from jspec.core import compilation

  sets = None if args.sets is None else args.sets.split(",")
  if args.programs:
    recs, bad = program_options(args.target, args.repeats)
    head = R.header("cpu-options", {"repeats": args.repeats, "max_new_tokens": 128},
                    target=args.target, options=dict(compilation.CPU_OPTIONS), mismatches=bad)
  else:
    recs, errors = run(args.target, blocks, args.calls, args.repeats, sets, args.rounds)
    print(table(recs, blocks))
    head = R.header(STUDY, {"blocks": blocks, "calls": args.calls, "repeats": args.repeats,
                            "rounds": args.rounds}, target=args.target, errors=errors,
                    option_sets={n: OPTION_SETS[n] for n in (sets or OPTION_SETS)})
  if args.json:
    print(f"wrote {R.write(args.json, head, recs)}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
