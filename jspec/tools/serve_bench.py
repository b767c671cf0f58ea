"""`jspec bench serve`: request-rate sweeps against any OpenAI-compatible server.

    jspec bench serve --url http://127.0.0.1:8000 --rates 0.5,2,8 --requests 64 \
        --workload restate --max-tokens 64 --label jspec-auto --json out.json
    jspec bench serve --report a.json b.json --plot load.png      # tables and plot only

At each rate, requests arrive as a Poisson process (exponential gaps drawn from `--seed`;
`--burst`: all at once) and stream their answers (chat completions by default). Every
request is recorded as it went: when it was sent, its HTTP status (a refusal is counted,
not dropped), the arrival time of every streamed chunk, its tokens from `usage`, and, from
a jspec server, its target calls and accepted drafts. Per rate: requests completed and
refused, output tokens/s from the first send to the last answer, and time to first token
(TTFT), time per output token after the first (TPOT) and end-to-end latency at p50 / p90 /
p99. Rates run one after another, each after the previous drained, with the same prompts
and arrival gaps for every server, so two servers' rows are the same experiment.

The same prompts go to every engine; `--ignore-eos` (honoured by vLLM and jspec) makes every
answer `--max-tokens` long, so engines do the same work whatever their numerics.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import platform
import time

import numpy as np

WORKLOADS_HELP = ("restate | explain | question | free (explain + question) | chat (all "
                  "three): the held-out chat prompts of that kind; spec-bench[:FILE] / "
                  "mt-bench: first turns of Spec-Bench's (or MT-Bench's) questions; "
                  "jsonl:PATH: conversations (as `jspec measure --chat` reads them); "
                  "text:PATH: text prompts sent as completions (as `jspec measure` reads them)")


@dataclasses.dataclass
class RequestRecord:
  """One request as the client saw it (times in seconds from the rate's start)."""

  rate: float  # requests per second asked for (inf: a burst)
  index: int  # arrival order within the rate
  prompt: int  # index into the workload's prompts
  sent: float
  status: int = 0  # HTTP status; 0: no answer (connection error, timeout)
  error: str = ""
  chunk_times: list = dataclasses.field(default_factory=list)  # arrival of each text chunk
  end: float | None = None
  output_tokens: int = 0  # usage.completion_tokens (or chunks, if the server gives no usage)
  text: str = ""
  target_calls: int | None = None  # a jspec server's usage extension
  accepted: int | None = None

  @property
  def ok(self) -> bool:
    return self.status == 200 and not self.error

  @property
  def ttft(self) -> float | None:
    return self.chunk_times[0] - self.sent if self.chunk_times else None

  @property
  def tpot(self) -> float | None:
    if not self.chunk_times or self.output_tokens < 2 or self.end is None:
      return None
    return (self.end - self.chunk_times[0]) / (self.output_tokens - 1)


# ------------------------------------------------------------------ workloads


def workload(name: str) -> list[dict]:
  """Request bodies' message parts: [{"messages": [...]}] or [{"prompt": text}]."""
  if name in ("restate", "explain", "question", "free", "chat"):
    from jspec.tools.demo import chat_prompts

    kinds = {"free": ("explain", "question"), "chat": ("restate", "explain", "question")}.get(
        name, (name,))
    return [{"messages": [{"role": "user", "content": p["content"]}]}
            for p in chat_prompts() if p["kind"] in kinds]
  if name in ("mt-bench", "spec-bench") or name.startswith("spec-bench:"):
    from jspec.bench import questions as suite

    path = name.split(":", 1)[1] if ":" in name else suite.default_questions()
    return [{"messages": [{"role": "user", "content": q.turns[0]}]}
            for q in suite.read_questions(path)]
  if name.startswith(("jsonl:", "chat:")):  # conversations, through the chat template
    from jspec.tools import measure

    return [{"messages": m} for m in measure.read_chat_prompts(name.split(":", 1)[1])]
  if name.startswith("text:"):  # text prompts, as completions
    from jspec.tools import measure

    return [{"prompt": p} for p in measure.read_prompts(name.split(":", 1)[1])]
  raise ValueError(f"unknown workload {name!r}: {WORKLOADS_HELP}")


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


# ------------------------------------------------------------------ client


async def _one(client, url: str, body: dict, record: RequestRecord, t0: float,
               timeout: float) -> None:
  chat = "messages" in body
  try:
    async with client.stream("POST", url, json=body, timeout=timeout) as response:
      record.status = response.status_code
      if response.status_code != 200:
        record.error = (await response.aread()).decode("utf-8", "replace")[:300]
        record.end = time.perf_counter() - t0
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
          record.error = json.dumps(chunk["error"])[:300]
          break
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
          piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
          if piece:
            parts.append(piece)
            record.chunk_times.append(time.perf_counter() - t0)
      record.end = time.perf_counter() - t0
      if not finished and not record.error:
        record.error = "the stream ended before data: [DONE]"
      record.text = "".join(parts)
      record.output_tokens = int(usage["completion_tokens"]) if usage else len(parts)
      usage = usage or {}
      if "target_calls" in usage:  # jspec's usage extension
        record.target_calls = int(usage["target_calls"])
        record.accepted = int(usage.get("accepted_draft_tokens", 0))
  except Exception as e:  # a request the server never answered is recorded, not lost
    record.error = f"{type(e).__name__}: {e}"[:300]
    record.end = time.perf_counter() - t0


async def _rate(base: str, model: str, prompts: list[dict], rate: float, count: int,
                seed: int, max_tokens: int, ignore_eos: bool, timeout: float,
                extra: dict) -> list[RequestRecord]:
  import httpx

  times = arrivals(rate, count, seed)
  order = np.random.default_rng(seed + 1).permutation(count) % len(prompts)
  records = []
  limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
  async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
    t0 = time.perf_counter()
    tasks = []
    for i, (at, p) in enumerate(zip(times, order)):
      delay = t0 + at - time.perf_counter()
      if delay > 0:
        await asyncio.sleep(delay)
      body = dict(prompts[int(p)], model=model, max_tokens=max_tokens, temperature=0.0,
                  stream=True, stream_options={"include_usage": True}, **extra)
      if ignore_eos:
        body["ignore_eos"] = True
      path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
      record = RequestRecord(rate=rate, index=i, prompt=int(p), sent=time.perf_counter() - t0)
      records.append(record)
      tasks.append(asyncio.create_task(_one(client, base + path, body, record, t0, timeout)))
    await asyncio.gather(*tasks)
  return records


def served_model(base: str) -> str:
  """The first model id of the server's /v1/models."""
  import httpx

  models = httpx.get(base + "/v1/models", timeout=30).json()["data"]
  return models[0]["id"]


def metrics_text(base: str) -> str:
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


# ------------------------------------------------------------------ metrics


def percentile(values, q: float) -> float | None:
  values = [v for v in values if v is not None]
  return float(np.percentile(values, q)) if values else None


def summary(records: list[RequestRecord]) -> dict:
  """One rate's figures from its records (pure: records in, numbers out)."""
  ok = [r for r in records if r.ok]
  refused = sum(r.status == 429 for r in records)
  failed = len(records) - len(ok) - refused
  start = min(r.sent for r in records)
  end = max((r.end for r in records if r.end is not None), default=start)
  tokens = sum(r.output_tokens for r in ok)
  row = dict(requests=len(records), completed=len(ok), refused=refused, failed=failed,
             seconds=end - start, output_tokens=tokens,
             tokens_per_s=tokens / (end - start) if end > start else 0.0,
             requests_per_s=len(ok) / (end - start) if end > start else 0.0)
  for name, values in (("ttft", [r.ttft for r in ok]), ("tpot", [r.tpot for r in ok]),
                       ("e2e", [r.end - r.sent for r in ok])):
    for q in (50, 90, 99):
      row[f"{name}_p{q}"] = percentile(values, q)
  calls = [r.target_calls for r in ok if r.target_calls is not None]
  row["tau"] = (sum(r.output_tokens for r in ok if r.target_calls is not None) / sum(calls)
                if calls and sum(calls) else None)
  return row


def sweep(base: str, rates: list[float], prompts: list[dict], *, requests: int, seed: int,
          max_tokens: int, ignore_eos: bool = True, timeout: float = 600.0,
          extra: dict | None = None, model: str | None = None, log=print) -> list[dict]:
  """Every rate in turn against the server at `base`: per rate its summary, its records and
  the server's K counters over the rate (jspec's /metrics), as plain dicts."""
  base = base.rstrip("/")
  model = model or served_model(base)
  rows = []
  for rate in rates:
    before = counters(metrics_text(base), "jspec_rounds_by_k_total")
    records = asyncio.run(_rate(base, model, prompts, rate, requests, seed, max_tokens,
                                ignore_eos, timeout, extra or {}))
    after = counters(metrics_text(base), "jspec_rounds_by_k_total")
    row = dict(rate=rate, **summary(records))
    rounds = {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0)}
    row["rounds_by_k"] = rounds or None
    row["records"] = [dataclasses.asdict(r) for r in records]
    rows.append(row)
    log(line(row))
  return rows


# ------------------------------------------------------------------ reports


def _ms(x):
  return "-" if x is None else f"{1000 * x:.0f}"


def _s(x):
  return "-" if x is None else f"{x:.2f}"


def line(row: dict) -> str:
  return (f"{row['rate']:g} req/s: {row['completed']}/{row['requests']} done "
          f"({row['refused']} refused, {row['failed']} failed), {row['tokens_per_s']:.1f} tok/s, "
          f"TTFT p50/p99 {_s(row['ttft_p50'])}/{_s(row['ttft_p99'])} s, TPOT p50/p99 "
          f"{_ms(row['tpot_p50'])}/{_ms(row['tpot_p99'])} ms"
          + (f", tau {row['tau']:.2f}" if row.get("tau") else ""))


def table(runs: list[dict]) -> str:
  """Markdown: one line per (label, rate), with tokens/s against the first label's at
  the same rate."""
  out = ["| server | req/s | done / refused | tok/s | x first | TTFT p50 / p99 s | "
         "TPOT p50 / p99 ms | E2E p50 / p99 s | tau | rounds by K |",
         "|---|---|---|---|---|---|---|---|---|---|"]
  first = {row["rate"]: row for row in runs[0]["rows"]} if runs else {}
  rates = sorted({row["rate"] for run in runs for row in run["rows"]})
  for rate in rates:
    for run in runs:
      row = next((r for r in run["rows"] if r["rate"] == rate), None)
      if row is None:
        continue
      base = first.get(rate)
      ratio = row["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] else None
      tau = f"{row['tau']:.2f}" if row.get("tau") else "-"
      rounds = row.get("rounds_by_k")
      rounds = ", ".join(f"{k.split('=')[-1].strip(chr(34))}: {v:g}" for k, v in
                         rounds.items()) if rounds else "-"
      out.append(f"| {run['label']} | {rate:g} | {row['completed']} / {row['refused']} | "
                 f"{row['tokens_per_s']:.1f} | {'-' if ratio is None else f'{ratio:.2f}'} | "
                 f"{_s(row['ttft_p50'])} / {_s(row['ttft_p99'])} | {_ms(row['tpot_p50'])} / "
                 f"{_ms(row['tpot_p99'])} | {_s(row['e2e_p50'])} / {_s(row['e2e_p99'])} | "
                 f"{tau} | {rounds} |")
  return "\n".join(out)


def plot(runs: list[dict], path: str) -> None:
  """Throughput, p50/p99 TTFT and p50/p99 TPOT against the request rate, a line per run."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for run in runs:
    rows = sorted(run["rows"], key=lambda r: r["rate"])
    rates = [r["rate"] for r in rows]
    (l,) = axes[0].plot(rates, [r["tokens_per_s"] for r in rows], "o-", label=run["label"])
    for ax, key, scale in ((axes[1], "ttft", 1.0), (axes[2], "tpot", 1000.0)):
      ax.plot(rates, [scale * (r[f"{key}_p50"] or np.nan) for r in rows], "o-", color=l.get_color(),
              label=f"{run['label']} p50")
      ax.plot(rates, [scale * (r[f"{key}_p99"] or np.nan) for r in rows], "x--",
              color=l.get_color(), label=f"{run['label']} p99")
  rates = sorted({r["rate"] for run in runs for r in run["rows"]})
  for ax, title in zip(axes, ("output tokens/s", "time to first token (s)",
                              "time per output token (ms)")):
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(rates, [f"{r:g}" for r in rates])
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
  p = argparse.ArgumentParser(prog="jspec bench serve", description=__doc__.splitlines()[0])
  p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
  p.add_argument("--model", default=None, help="model name (default: the server's first)")
  p.add_argument("--label", default=None, help="this run's name in tables (default: the URL)")
  p.add_argument("--rates", default="0.5,2,8", help="requests per second, comma-separated")
  p.add_argument("--burst", action="store_true", help="send each rate's requests all at once")
  p.add_argument("--requests", type=int, default=64, help="requests per rate")
  p.add_argument("--workload", default="restate", help=WORKLOADS_HELP)
  p.add_argument("--max-tokens", type=int, default=64)
  p.add_argument("--no-ignore-eos", action="store_true",
                 help="let answers end at EOS (default: every answer --max-tokens long)")
  p.add_argument("--extra", default=None,
                 help="JSON object merged into every request body (e.g. '{\"speculate\": false}')")
  p.add_argument("--seed", type=int, default=0, help="arrival gaps and prompt order")
  p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
  p.add_argument("--json", default=None, help="write the run (rows and every record) here")
  p.add_argument("--report", nargs="+", default=None, metavar="RUN_JSON",
                 help="print one table over these runs' --json files (and --plot); run nothing")
  p.add_argument("--plot", default=None, help="PNG of throughput and latency against rate")
  args = p.parse_args(argv)
  if args.report:
    runs = []
    for path in args.report:
      with open(path) as f:
        runs.append(json.load(f))
  else:
    rates = [float("inf")] if args.burst else _rates(args.rates)
    extra = json.loads(args.extra) if args.extra else {}
    if not isinstance(extra, dict):
      raise SystemExit("--extra must be a JSON object")
    rows = sweep(args.url, rates, workload(args.workload), requests=args.requests,
                 seed=args.seed, max_tokens=args.max_tokens, ignore_eos=not args.no_ignore_eos,
                 timeout=args.timeout, extra=extra, model=args.model)
    runs = [dict(study="serve", label=args.label or args.url, url=args.url,
                 workload=args.workload, max_tokens=args.max_tokens, requests=args.requests,
                 seed=args.seed, extra=extra, rows=rows,
                 machine=dict(platform=platform.platform(), processor=platform.processor()))]
    if args.json:
      with open(args.json, "w") as f:
        json.dump(runs[0], f, indent=1)
  print(table(runs))
  if args.plot:
    plot(runs, args.plot)
  return 0
