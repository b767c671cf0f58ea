"""`jspec bench serve`: request-rate sweeps against any OpenAI-compatible server.

    jspec bench serve --url http://127.0.0.1:8000 --rates 0.5,2,8 --requests 64 \
        --workload restate --max-tokens 64 --label jspec-auto --json out.jsonl
    jspec bench serve --report a.jsonl b.jsonl --plot load.png      # tables and plot only

At each rate, requests arrive as a Poisson process (exponential gaps drawn from `--seed`;
`--burst`: all at once) and stream their answers (chat completions by default). Every
request is recorded as it went, one `jspec.bench.records.Record` (study "serve", method the
run's label, prompt the workload's prompt id, axes {"rate", "index"}): when it was sent, its
HTTP status (a refusal is counted, not dropped), the arrival time of every streamed chunk,
its tokens from `usage`, and, from a jspec server, its target calls and accepted drafts. Per
rate, as pure functions of those records (`summary`): requests completed and refused, output
tokens/s from the first send to the last answer, and time to first token (TTFT), time per
output token after the first (TPOT) and end-to-end latency at p50 / p90 / p99. What is the
rate's and not a request's (the server's /metrics counters before and after it) is in the
file's header, under "rates". Rates run one after another, each after the previous drained,
with the same prompts and arrival gaps for every server, so two servers' rows are the same
experiment.

The same prompts go to every engine (`jspec.bench.workloads`); `--ignore-eos` (honoured by
vLLM and jspec) makes every answer `--max-tokens` long, so engines do the same work whatever
their numerics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

from jspec.bench import metrics as M
from jspec.bench import records as R
from jspec.bench import workloads as W

STUDY = "serve"
COUNTER = "jspec_rounds_by_k_total"  # jspec's /metrics: rounds by the K they drafted
BURST = "inf"  # the rate axis of a burst (JSON has no infinity)


def rate_axis(rate: float) -> float | str:
  """A rate as a record's axis: the number, or "inf" for a burst."""
  return BURST if rate == float("inf") else float(rate)


def rate_key(rate) -> str:
  """A rate's key in the header's "rates" ("0.25", "1.0", "inf")."""
  return str(rate_axis(float(rate)))


def arrivals(rate: float, count: int, seed: int) -> np.ndarray:
  """Send times (s) of `count` requests: a Poisson process of `rate` per second starting
  at 0 (the same gaps for every server given the seed), or all at 0 for rate inf."""
  if count < 1:
    raise ValueError(f"requests must be >= 1, got {count}")
  if rate == float("inf"):
    return np.zeros(count)
  if not rate > 0:
    raise ValueError(f"rates must be > 0, got {rate}")
  gaps = np.random.default_rng(seed).exponential(1.0, size=count) / rate
  return np.concatenate([[0.0], np.cumsum(gaps[1:])])


def body(prompt: W.Prompt) -> dict:
  """A request body's prompt part: {"messages": [...]} (chat completions) or {"prompt":
  text} (completions, for a plain-text prompt). Later turns are not sent."""
  if prompt.text is not None:
    return {"prompt": prompt.text}
  if prompt.messages:
    return {"messages": [dict(m) for m in prompt.messages]}
  raise ValueError(f"prompt {prompt.id!r} is token ids only; a server is sent text")


# ------------------------------------------------------------------ client


async def _one(client, url: str, request: dict, got: dict, t0: float, timeout: float) -> None:
  """Send one request and fill `got` (status, error, chunk_times, end, tokens, text, calls,
  accepted) as it streams; times in seconds from t0."""
  chat = "messages" in request
  try:
    async with client.stream("POST", url, json=request, timeout=timeout) as response:
      got["status"] = response.status_code
      if response.status_code != 200:
        got["error"] = (await response.aread()).decode("utf-8", "replace")[:300]
        got["end"] = time.perf_counter() - t0
        return
      parts, usage, finished = [], None, False
      async for line in response.aiter_lines():
        if not line.startswith("data:"):
          continue
        data = line[5:].strip()
        if data == "[DONE]":
          finished = True
          break
        chunk = json.loads(data)
        if chunk.get("error"):
          got["error"] = json.dumps(chunk["error"])[:300]
          break
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
          piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
          if piece:
            parts.append(piece)
            got["chunk_times"].append(time.perf_counter() - t0)
      got["end"] = time.perf_counter() - t0
      if not finished and not got["error"]:
        got["error"] = "the stream ended before data: [DONE]"
      got["text"] = "".join(parts)
      got["tokens"] = int(usage["completion_tokens"]) if usage else len(parts)
      usage = usage or {}
      if "target_calls" in usage:  # jspec's usage extension
        got["calls"] = int(usage["target_calls"])
        got["accepted"] = int(usage.get("accepted_draft_tokens", 0))
  except Exception as e:  # a request the server never answered is recorded, not lost
    got["error"] = f"{type(e).__name__}: {e}"[:300]
    got["end"] = time.perf_counter() - t0


def request_record(got: dict, *, label: str, workload: str, prompt: str, rate: float,
                   index: int) -> R.Record:
  """One request as the harness records it: tokens the output tokens, calls the target
  calls (0 where the server does not report them), seconds (end - sent,), and in extra
  when it was sent and ended, its HTTP status, error, chunk arrival times, text and the
  accepted drafts the server reported (None: not reported)."""
  end = got.get("end")
  extra = {"sent": got["sent"], "end": end, "status": got.get("status", 0),
           "error": got.get("error", ""), "chunk_times": list(got.get("chunk_times", ())),
           "text": got.get("text", ""), "accepted": got.get("accepted")}
  extra.update({k: v for k, v in got.items() if k not in extra and k not in ("tokens", "calls")})
  return R.Record(study=STUDY, method=label, workload=workload, prompt=prompt,
                  axes={"rate": rate_axis(rate), "index": index},
                  tokens=int(got.get("tokens", 0)), calls=int(got.get("calls") or 0),
                  seconds=() if end is None else (end - got["sent"],), extra=extra)


async def _rate(base: str, model: str, workload: W.Workload, label: str, rate: float,
                count: int, seed: int, max_tokens: int, ignore_eos: bool, timeout: float,
                extra: dict) -> list[R.Record]:
  import httpx

  prompts = workload.prompts
  if not prompts:
    raise ValueError(f"workload {workload.name!r} has no prompts")
  times = arrivals(rate, count, seed)
  order = np.random.default_rng(seed + 1).permutation(count) % len(prompts)
  sent = []
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
  async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
    t0 = time.perf_counter()
    tasks = []
    for at, p in zip(times, order):
      delay = t0 + at - time.perf_counter()
      if delay > 0:
        await asyncio.sleep(delay)
      request = dict(body(prompts[int(p)]), model=model, max_tokens=max_tokens,
                     temperature=0.0, stream=True, stream_options={"include_usage": True},
                     **extra)
      if ignore_eos:
        request["ignore_eos"] = True
      path = "/v1/chat/completions" if "messages" in request else "/v1/completions"
      got = {"sent": time.perf_counter() - t0, "status": 0, "error": "", "chunk_times": []}
      sent.append((prompts[int(p)].id, got))
      tasks.append(asyncio.create_task(_one(client, base + path, request, got, t0, timeout)))
    await asyncio.gather(*tasks)
  return [request_record(got, label=label, workload=workload.name, prompt=pid, rate=rate,
                         index=i) for i, (pid, got) in enumerate(sent)]


def served_model(base: str) -> str:
  """The first model id of the server's /v1/models."""
  import httpx

  models = httpx.get(base + "/v1/models", timeout=30).json()["data"]
  return models[0]["id"]


def metrics_text(base: str) -> str:
  """The server's /metrics page ("" where it has none)."""
  import httpx

  try:
    response = httpx.get(base + "/metrics", timeout=30)
  except httpx.HTTPError:
    return ""
  return response.text if response.status_code == 200 else ""


def counters(text: str, name: str) -> dict[str, float]:
  """{label text: value} of a Prometheus counter family in `text` ("" for no labels)."""
  out = {}
  for line in text.splitlines():
    if line.startswith(name) and not line.startswith("#"):
      head, _, value = line.rpartition(" ")
      labels = head[len(name):]
      if labels and not labels.startswith("{"):
        continue  # another family whose name starts with this one
      try:
        out[labels.strip("{}")] = float(value)
      except ValueError:
        pass
  return out


def sweep(base: str, rates: list[float], workload: W.Workload, *, label: str, requests: int,
          seed: int, max_tokens: int, ignore_eos: bool = True, timeout: float = 600.0,
          extra: dict | None = None, model: str | None = None,
          log=print) -> tuple[dict, list[R.Record]]:
  """Every rate in turn against the server at `base`: ({rate key: the server's /metrics
  counters before and after the rate}, every request's record)."""
  base = base.rstrip("/")
  model = model or served_model(base)
  per_rate, recs = {}, []
  for rate in rates:
    before = counters(metrics_text(base), COUNTER)
    mine = asyncio.run(_rate(base, model, workload, label, rate, requests, seed, max_tokens,
                             ignore_eos, timeout, extra or {}))
    after = counters(metrics_text(base), COUNTER)
    entry = {"model": model, "counters_before": before, "counters_after": after}
    per_rate[rate_key(rate)] = entry
    recs += mine
    log(line(dict(rate=rate, **summary(mine), rounds_by_k=rounds_by_k(entry))))
  return per_rate, recs


def run_header(label: str, settings: dict, per_rate: dict, command=None) -> dict:
  """A run's file header: the settings, the label, the server's command (where known) and
  what each rate saw that no request did ({rate key: /metrics counters})."""
  return R.header(STUDY, settings, label=label, command=command, counter=COUNTER,
                  rates=per_rate)


# ------------------------------------------------------------------ metrics


def ok(r) -> bool:
  """The request was answered in full (HTTP 200, no error, the stream finished)."""
  return r.extra.get("status") == 200 and not r.extra.get("error")


def _pcts(values) -> dict:
  values = [v for v in values if v is not None]
  return {k: (v if values else None) for k, v in M.percentiles(values).items()}


def summary(records) -> dict:
  """One rate's figures from its request records (pure: records in, numbers out)."""
  rs = list(records)
  done = [r for r in rs if ok(r)]
  refused = sum(r.extra.get("status") == 429 for r in rs)
  seconds = M.span(rs)
  tokens = sum(r.tokens for r in done)
  row = dict(requests=len(rs), completed=len(done), refused=refused,
             failed=len(rs) - len(done) - refused, seconds=seconds, output_tokens=tokens,
             tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
             requests_per_s=len(done) / seconds if seconds > 0 else 0.0)
  for name, fn in (("ttft", M.ttft), ("tpot", M.tpot), ("e2e", M.e2e)):
    for q, v in _pcts(fn(r) for r in done).items():
      row[f"{name}_{q}"] = v
  counted = [r for r in done if r.calls]  # the server reported its target calls
  row["tau"] = M.tau(counted) if counted else None
  return row


def rounds_by_k(entry: dict | None) -> dict | None:
  """The server's rounds by K over one rate ({label text: rounds}) from the header's entry
  for it: the counters after less those before (a converted run's difference as it was
  recorded); None where the server counted none."""
  if not entry:
    return None
  if "rounds_by_k" in entry:
    return entry["rounds_by_k"] or None
  before, after = entry.get("counters_before") or {}, entry.get("counters_after") or {}
  out = {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0)}
  return out or None


def rows(header: dict, records) -> list[dict]:
  """Per rate (in increasing order): its summary, with the rate and its rounds by K."""
  out = []
  per_rate = header.get("rates") or {}
  for rate, mine in sorted(M.group(records, "rate").items(), key=lambda kv: float(kv[0])):
    out.append(dict(rate=float(rate), **summary(mine),
                    rounds_by_k=rounds_by_k(per_rate.get(rate_key(rate)))))
  return out


def runs_of(header: dict, records) -> list[tuple[str, dict, list]]:
  """(label, header, records) of each run, in the order first seen. header: one file's, or
  {"files": [header, ...]} of several (`jspec.bench.tables.read`); a run's header is the
  one naming its label."""
  heads = header.get("files", [header])
  by_label = {h.get("label"): h for h in heads}
  return [(label, by_label.get(label, heads[0] if len(heads) == 1 else {}), recs)
          for label, recs in M.group(records, "method").items()]


# ------------------------------------------------------------------ reports


def _ms(x):
  return "-" if x is None else f"{1000 * x:.0f}"


def _s(x):
  return "-" if x is None else f"{x:.2f}"


def line(row: dict) -> str:
  """One rate's summary as a log line."""
  return (f"{row['rate']:g} req/s: {row['completed']}/{row['requests']} done "
          f"({row['refused']} refused, {row['failed']} failed), {row['tokens_per_s']:.1f} tok/s, "
          f"TTFT p50/p99 {_s(row['ttft_p50'])}/{_s(row['ttft_p99'])} s, TPOT p50/p99 "
          f"{_ms(row['tpot_p50'])}/{_ms(row['tpot_p99'])} ms"
          + (f", tau {row['tau']:.2f}" if row.get("tau") else ""))


def _k(label: str) -> str:
  return label.split("=")[-1].strip('"')


def table(runs: list[tuple[str, dict, list]]) -> str:
  """Markdown: one line per (label, rate), with tokens/s against the first run's at the
  same rate. runs: (label, header, records) each (`runs_of`)."""
  out = ["| server | req/s | done / refused | tok/s | x first | TTFT p50 / p99 s | "
         "TPOT p50 / p99 ms | E2E p50 / p99 s | tau | rounds by K |",
         "|---|---|---|---|---|---|---|---|---|---|"]
  by = [(label, {row["rate"]: row for row in rows(head, recs)}) for label, head, recs in runs]
  first = by[0][1] if by else {}
  for rate in sorted({rate for _, mine in by for rate in mine}):
    for label, mine in by:
      row = mine.get(rate)
      if row is None:
        continue
      base = first.get(rate)
      ratio = row["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] else None
      tau = f"{row['tau']:.2f}" if row.get("tau") else "-"
      rounds = row.get("rounds_by_k")
      rounds = ", ".join(f"{_k(k)}: {v:g}" for k, v in rounds.items()) if rounds else "-"
      out.append(f"| {label} | {rate:g} | {row['completed']} / {row['refused']} | "
                 f"{row['tokens_per_s']:.1f} | {'-' if ratio is None else f'{ratio:.2f}'} | "
                 f"{_s(row['ttft_p50'])} / {_s(row['ttft_p99'])} | {_ms(row['tpot_p50'])} / "
                 f"{_ms(row['tpot_p99'])} | {_s(row['e2e_p50'])} / {_s(row['e2e_p99'])} | "
                 f"{tau} | {rounds} |")
  return "\n".join(out)


def plot(runs: list[tuple[str, dict, list]], path: str) -> None:
  """Throughput, p50/p99 TTFT and p50/p99 TPOT against the request rate, a line per run."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  every = set()
  for label, head, recs in runs:
    mine = rows(head, recs)
    rates = [r["rate"] for r in mine]
    every.update(rates)
    (l,) = axes[0].plot(rates, [r["tokens_per_s"] for r in mine], "o-", label=label)
    for ax, key, scale in ((axes[1], "ttft", 1.0), (axes[2], "tpot", 1000.0)):
      ax.plot(rates, [scale * (r[f"{key}_p50"] or np.nan) for r in mine], "o-",
              color=l.get_color(), label=f"{label} p50")
      ax.plot(rates, [scale * (r[f"{key}_p99"] or np.nan) for r in mine], "x--",
              color=l.get_color(), label=f"{label} p99")
  for ax, title in zip(axes, ("output tokens/s", "time to first token (s)",
                              "time per output token (ms)")):
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(sorted(every), [f"{r:g}" for r in sorted(every)])
    ax.set_xlabel("request rate (req/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  axes[2].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _rates(text: str) -> list[float]:
  rates = [float(x) for x in text.split(",") if x.strip()]
  if not rates or any(not r > 0 for r in rates):
    raise SystemExit(f"--rates must be positive numbers (inf: a burst), got {text!r}")
  return rates


def main(argv=None) -> int:
  """`jspec bench serve`'s command line."""
  p = argparse.ArgumentParser(prog="jspec bench serve", description=__doc__.splitlines()[0])
  p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
  p.add_argument("--model", default=None, help="model name (default: the server's first)")
  p.add_argument("--label", default=None, help="this run's name in tables (default: the URL)")
  p.add_argument("--rates", default="0.5,2,8", help="requests per second, comma-separated")
  p.add_argument("--burst", action="store_true", help="send each rate's requests all at once")
  p.add_argument("--requests", type=int, default=64, help="requests per rate")
  p.add_argument("--workload", default="restate", help=W.HELP)
  p.add_argument("--max-tokens", type=int, default=64)
  p.add_argument("--no-ignore-eos", action="store_true",
                 help="let answers end at EOS (default: every answer --max-tokens long)")
  p.add_argument("--extra", default=None,
                 help="JSON object merged into every request body (e.g. '{\"speculate\": false}')")
  p.add_argument("--seed", type=int, default=0, help="arrival gaps and prompt order")
  p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
  p.add_argument("--json", default=None,
                 help="write the run here: the harness's JSON lines (a header, a record a request)")
  p.add_argument("--report", nargs="+", default=None, metavar="RUN_JSONL",
                 help="print one table over these runs' --json files (and --plot); run nothing")
  p.add_argument("--plot", default=None, help="PNG of throughput and latency against rate")
  args = p.parse_args(argv)
  if args.report:
    runs = []
    for path in args.report:
      try:
        head, recs = R.read(path)
      except ValueError as e:
        raise SystemExit(f"{e} (a run written before the harness: python -m "
                         f"jspec.bench.legacy serve OLD.json NEW.jsonl)") from None
      runs += runs_of(head, recs)
  else:
    rates = [float("inf")] if args.burst else _rates(args.rates)
    extra = json.loads(args.extra) if args.extra else {}
    if not isinstance(extra, dict):
      raise SystemExit("--extra must be a JSON object")
    try:
      workload = W.load(args.workload)
    except ValueError as e:
      raise SystemExit(str(e)) from None
    label = args.label or args.url
    per_rate, recs = sweep(args.url, rates, workload, label=label, requests=args.requests,
                           seed=args.seed, max_tokens=args.max_tokens,
                           ignore_eos=not args.no_ignore_eos, timeout=args.timeout,
                           extra=extra, model=args.model)
    settings = dict(url=args.url, workload=args.workload, rates=[rate_axis(r) for r in rates],
                    requests=args.requests, max_tokens=args.max_tokens,
                    ignore_eos=not args.no_ignore_eos, seed=args.seed, timeout=args.timeout,
                    extra=extra)
    head = run_header(label, settings, per_rate)
    if args.json:
      R.write(args.json, head, recs)
    runs = runs_of(head, recs)
  print(table(runs))
  if args.plot:
    plot(runs, args.plot)
  return 0
