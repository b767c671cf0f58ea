"""The request-rate experiment against servers on this machine: jspec's and vLLM's, one at a time.

    python benchmarks/serve_load.py --hf /tmp/smollm2-hf --vllm benchmarks/.vllm-venv \
        [--configs jspec-plain,jspec-ngram4,jspec-auto,vllm-plain,vllm-ngram4] \
        [--rates 0.25,1,2,4] [--duration 40] [--requests 32] [--workload restate] \
        [--max-tokens 48] [--out docs/bench/serve]

Each config starts its server on 127.0.0.1 (jspec: `jspec serve` on SmolLM2-135M-Instruct,
32 slots, every program compiled before the first request; vLLM: its OpenAI server on the same
weights exported as a Hugging Face folder, f32, 32 sequences, prefix caching off),
waits for /health, runs `jspec bench serve`'s sweep (jspec/bench/serve_load.py: Poisson
arrivals at each rate, the same prompts and gaps for every server, greedy, EOS ignored,
streamed), stops the server, and writes one run per config into --out as the harness's
JSON lines (WORKLOAD_CONFIG.jsonl: a header naming the server's command and each rate's
/metrics counters, a record per request). At each rate min(--requests, max(12, rate x
--duration)) requests are sent. Then one table over all configs (tokens/s against the
first config's at the same rate; `jspec.bench.tables.TABLES["serve.load"]`, which
docs/benchmarks.md quotes), the ratio of jspec's "auto" to the better of its plain and
fixed-K runs, and a plot.

vLLM needs `benchmarks/vllm_setup.sh` (its own venv) and `jspec convert` + `jspec
export-hf` of the GGUF (--hf).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from jspec.bench import records, serve_load, workloads

CONFIGS = ("jspec-plain", "jspec-ngram4", "jspec-auto", "vllm-plain", "vllm-ngram4")


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _command(config: str, args, port: int) -> tuple[list[str], dict]:
  env = dict(os.environ)
  if config.startswith("jspec-"):
    method = config.split("-", 1)[1]
    command = [sys.executable, "-m", "jspec.tools.cli", "serve", "--target", "smollm2",
               "--slots", str(args.slots), "--cache-length", str(args.cache_length),
               "--port", str(port), "--warmup", "--log-level", "warning"]
    if method == "plain":
      command += ["--drafter", "none"]
    else:
      command += ["--drafter", "ngram", "--num-draft-tokens",
                  "auto" if method == "auto" else method.removeprefix("ngram")]
    return command, env
  if not args.vllm or not args.hf:
    raise SystemExit("vLLM configs need --vllm VENV (benchmarks/vllm_setup.sh) and --hf DIR")
  env.update(VLLM_CPU_OMP_THREADS_BIND=args.vllm_cores, VLLM_CPU_KVCACHE_SPACE="4")
  # The module, not the `vllm` script: the script reads the version of a package named
  # "vllm", and the CPU build is installed as "vllm-cpu".
  command = [os.path.join(args.vllm, "bin", "python"), "-m", "vllm.entrypoints.openai.api_server",
             "--model", args.hf, "--dtype", "float32",
             "--max-num-seqs", str(args.slots), "--max-model-len", str(args.cache_length),
             "--no-enable-prefix-caching", "--port", str(port), "--host", "127.0.0.1",
             "--served-model-name", "smollm2"]
  method = config.split("-", 1)[1]
  if method != "plain":
    k = int(method.removeprefix("ngram"))
    command += ["--speculative-config", json.dumps(
        {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1})]
  return command, env


def _wait(base: str, server: subprocess.Popen, limit: float) -> None:
  import httpx

  end = time.time() + limit
  while time.time() < end:
    if server.poll() is not None:
      raise SystemExit(f"the server exited ({server.returncode}) before it was ready")
    try:
      if httpx.get(base + "/health", timeout=5).status_code == 200:
        return
    except httpx.HTTPError:
      pass
    time.sleep(2)
  raise SystemExit(f"the server was not ready within {limit:.0f} s")


def _stop(server: subprocess.Popen) -> None:
  if server.poll() is None:
    server.send_signal(signal.SIGINT)
    try:
      server.wait(timeout=60)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait()


def run_config(config: str, args, workload) -> tuple[dict, list]:
  port = _port()
  base = f"http://127.0.0.1:{port}"
  command, env = _command(config, args, port)
  # Server logs beside the run, not in the records' folder.
  log = open(os.path.join(tempfile.gettempdir(), f"jspec-serve-load-{config}.log"), "w")
  started = time.perf_counter()
  server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
  try:
    _wait(base, server, args.ready_timeout)
    print(f"{config}: ready in {time.perf_counter() - started:.0f} s", flush=True)
    per_rate, recs = {}, []
    for rate in args.rates:
      count = min(args.requests, max(12, round(rate * args.duration)))
      mine, got = serve_load.sweep(base, [rate], workload, label=config, requests=count,
                                   seed=args.seed, max_tokens=args.max_tokens, model=None,
                                   log=lambda line: print(f"  {config} {line}", flush=True))
      per_rate.update(mine)
      recs += got
  finally:
    _stop(server)
    log.close()
  settings = dict(workload=args.workload, rates=[serve_load.rate_axis(r) for r in args.rates],
                  requests=args.requests, duration=args.duration, max_tokens=args.max_tokens,
                  ignore_eos=True, seed=args.seed, slots=args.slots,
                  cache_length=args.cache_length)
  return serve_load.run_header(config, settings, per_rate, command=command), recs


def auto_against_best(runs: list[tuple[str, dict, list]]) -> list[str]:
  """Per rate: jspec auto's tokens/s over the better of jspec plain and fixed K.
  runs: (label, header, records) each (`serve_load.runs_of`)."""
  by = {label: {row["rate"]: row for row in serve_load.rows(head, recs)}
        for label, head, recs in runs}
  if "jspec-auto" not in by:
    return []
  fixed = [c for c in by if c.startswith("jspec-") and c != "jspec-auto"]
  out = []
  for rate, row in sorted(by["jspec-auto"].items()):
    best = max((by[c][rate] for c in fixed if rate in by[c]), key=lambda r: r["tokens_per_s"],
               default=None)
    if best is not None and best["tokens_per_s"]:
      plain = by.get("jspec-plain", {}).get(rate)
      tpot = ""
      if plain and plain.get("tpot_p99") and row.get("tpot_p99"):
        tpot = f"; p99 TPOT {row['tpot_p99'] / plain['tpot_p99']:.2f}x plain's"
      out.append(f"{rate:g} req/s: auto {row['tokens_per_s'] / best['tokens_per_s']:.2f}x the "
                 f"better of plain and fixed K{tpot}")
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--configs", default=",".join(CONFIGS))
  p.add_argument("--rates", default="0.25,1,2,4")
  p.add_argument("--duration", type=float, default=40.0)
  p.add_argument("--requests", type=int, default=32)
  p.add_argument("--workload", default="restate", help=workloads.HELP)
  p.add_argument("--max-tokens", type=int, default=48)
  p.add_argument("--slots", type=int, default=32)
  p.add_argument("--cache-length", type=int, default=512)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--hf", default=None, help="the model as a Hugging Face folder (for vLLM)")
  p.add_argument("--vllm", default=None, help="vLLM's venv")
  p.add_argument("--vllm-cores", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
  p.add_argument("--ready-timeout", type=float, default=900.0)
  p.add_argument("--out", default="docs/bench/serve")
  args = p.parse_args(argv)
  args.rates = [float(x) for x in args.rates.split(",")]
  os.makedirs(args.out, exist_ok=True)
  workload = workloads.load(args.workload)
  runs = []
  for config in args.configs.split(","):
    head, recs = run_config(config, args, workload)
    records.write(os.path.join(args.out, f"{args.workload}_{config}.jsonl"), head, recs)
    runs.append((config, head, recs))
  print(serve_load.table(runs))
  for line in auto_against_best(runs):
    print(line)
  serve_load.plot(runs, os.path.join(args.out, f"{args.workload}.png"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
