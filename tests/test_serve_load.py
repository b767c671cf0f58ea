"""`jspec bench serve` (jspec.bench.serve_load): arrivals, request records and the figures
computed from them, the client against a stand-in OpenAI-compatible server on 127.0.0.1
(streamed chunks, usage, a refusal, a dropped connection) so the load generator is checked
without a model, and its file and report round trip."""

import http.server
import json
import threading

import numpy as np
import pytest

from jspec.bench import metrics as M
from jspec.bench import records as R
from jspec.bench import tables
from jspec.bench import serve_load as sb
from jspec.bench.workloads import Prompt, Workload


def test_arrivals_are_seeded_poisson_and_bursts_are_simultaneous():
  a = sb.arrivals(4.0, 4000, seed=3)
  assert a[0] == 0 and np.all(np.diff(a) >= 0)
  np.testing.assert_array_equal(a, sb.arrivals(4.0, 4000, seed=3))
  gaps = np.diff(a)
  assert abs(gaps.mean() - 0.25) < 0.02 and abs(gaps.std() - 0.25) < 0.03  # exponential
  assert not np.array_equal(a, sb.arrivals(4.0, 4000, seed=4))
  np.testing.assert_array_equal(sb.arrivals(float("inf"), 5, seed=0), np.zeros(5))
  with pytest.raises(ValueError):
    sb.arrivals(0.0, 5, seed=0)


def _record(i, status=200, sent=0.0, first=None, end=None, tokens=0, calls=None, error="",
            rate=1.0):
  got = {"sent": sent, "status": status, "end": end, "tokens": tokens, "calls": calls,
         "error": error, "chunk_times": [] if first is None else [first, end]}
  return sb.request_record(got, label="m", workload="w", prompt=str(i), rate=rate, index=i)


def test_a_request_record():
  r = _record(3, sent=1.0, first=1.5, end=3.5, tokens=5, calls=2, rate=float("inf"))
  assert (r.study, r.method, r.prompt, r.axes) == ("serve", "m", "3", {"rate": "inf",
                                                                       "index": 3})
  assert (r.tokens, r.calls, r.seconds) == (5, 2, (2.5,))
  assert r.extra["status"] == 200 and r.extra["chunk_times"] == [1.5, 3.5]
  assert R.Record.from_json(json.loads(json.dumps(r.to_json()))) == r  # plain JSON, no inf
  assert _record(0, status=0, sent=1.0, error="ConnectError").seconds == ()
  assert _record(0, calls=None).calls == 0  # a server that reports no target calls


def test_request_metrics():
  r = _record(0, sent=1.0, first=1.5, end=3.5, tokens=5)
  assert M.ttft(r) == pytest.approx(0.5) and M.tpot(r) == pytest.approx(2.0 / 4)
  assert M.e2e(r) == pytest.approx(2.5)
  one = _record(1, sent=0.0, first=0.2, end=0.2, tokens=1)
  assert M.tpot(one) is None and M.ttft(one) == pytest.approx(0.2)
  lost = _record(2, status=0, sent=0.5, error="ConnectError")
  assert M.ttft(lost) is None and M.tpot(lost) is None and M.e2e(lost) is None
  assert M.span([r, one, lost]) == pytest.approx(3.5)  # first send to last end
  assert M.span([lost]) == 0.0


def test_summary_from_records():
  records = [_record(0, sent=0.0, first=0.5, end=2.5, tokens=5, calls=2),
             _record(1, sent=1.0, first=1.2, end=3.2, tokens=11, calls=5),
             _record(2, status=429, sent=1.5, end=1.6),
             _record(3, status=0, sent=2.0, end=2.1, error="ConnectError")]
  row = sb.summary(records)
  assert (row["completed"], row["refused"], row["failed"]) == (2, 1, 1)
  assert row["output_tokens"] == 16 and row["seconds"] == pytest.approx(3.2)
  assert row["tokens_per_s"] == pytest.approx(16 / 3.2)
  assert row["ttft_p50"] == pytest.approx(np.percentile([0.5, 0.2], 50))
  assert row["tpot_p99"] == pytest.approx(np.percentile([2.0 / 4, 2.0 / 10], 99))
  assert row["e2e_p90"] == pytest.approx(np.percentile([2.5, 2.2], 90))
  assert row["tau"] == pytest.approx(16 / 7)
  vllm = sb.summary([_record(0, sent=0.0, first=0.5, end=2.5, tokens=5)])
  assert vllm["tau"] is None  # no target calls reported
  none = sb.summary([_record(0, status=429, sent=0.0, end=0.1)])
  assert none["completed"] == 0 and none["ttft_p50"] is None and none["tau"] is None


def test_rounds_by_k_from_the_header():
  entry = {"counters_before": {'k="0"': 2.0, 'k="4"': 10.0},
           "counters_after": {'k="0"': 2.0, 'k="4"': 25.0, 'k="6"': 1.0}}
  assert sb.rounds_by_k(entry) == {'k="4"': 15.0, 'k="6"': 1.0}
  assert sb.rounds_by_k({"rounds_by_k": {'k="0"': 3.0}}) == {'k="0"': 3.0}  # converted
  assert sb.rounds_by_k({"counters_before": {}, "counters_after": {}}) is None
  assert sb.rounds_by_k(None) is None


def test_prometheus_counters():
  text = ("# TYPE jspec_rounds_by_k_total counter\njspec_rounds_by_k_total{k=\"0\"} 12\n"
          "jspec_rounds_by_k_total{k=\"4\"} 30.0\njspec_rounds_by_k_totalx 5\n")
  assert sb.counters(text, "jspec_rounds_by_k_total") == {'k="0"': 12.0, 'k="4"': 30.0}


def test_request_bodies_from_workload_prompts():
  chat = Prompt("1", messages=({"role": "user", "content": "yo"},), turns=("later",))
  assert sb.body(chat) == {"messages": [{"role": "user", "content": "yo"}]}
  assert sb.body(Prompt("2", text="def f(")) == {"prompt": "def f("}
  with pytest.raises(ValueError, match="token ids"):
    sb.body(Prompt("3", ids=(1, 2)))


def test_brace_paths():
  assert tables.paths("a/x_{p,q}.jsonl") == ["a/x_p.jsonl", "a/x_q.jsonl"]
  assert tables.paths("a/x.jsonl") == ["a/x.jsonl"]
  with pytest.raises(ValueError):
    tables.paths("a/{p,q}_{r,s}.jsonl")


class _StandIn(http.server.BaseHTTPRequestHandler):
  """Streams the request's max_tokens words, one chunk each; refuses every third request
  with 429 and drops every fifth connection mid-stream."""

  count = 0
  lock = threading.Lock()
  bodies = []

  def log_message(self, *args):
    pass

  def do_GET(self):
    body = (b'{"data": [{"id": "stand-in"}]}' if self.path == "/v1/models"
            else b'jspec_rounds_by_k_total{k="4"} %d\n' % _StandIn.count)
    self.send_response(200)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def do_POST(self):
    request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    with _StandIn.lock:
      _StandIn.count += 1
      n = _StandIn.count
      _StandIn.bodies.append(request)
    if n % 3 == 0:
      body = b'{"error": {"message": "queue full", "code": 429}}'
      self.send_response(429)
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)
      return
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.end_headers()
    k = request["max_tokens"]
    for i in range(k):
      chunk = {"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
      self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
      self.wfile.flush()
      if n % 5 == 0 and i == 1:
        return  # the connection closes without [DONE] or usage
    usage = {"completion_tokens": k, "prompt_tokens": 3, "total_tokens": k + 3,
             "target_calls": k // 2, "accepted_draft_tokens": k - k // 2}
    self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
    self.wfile.write(b"data: [DONE]\n\n")


def _text_prompts(tmp_path) -> str:
  path = tmp_path / "t.jsonl"
  path.write_text('{"prompt": "def f("}\n')
  return str(path)


def test_client_against_a_stand_in_server(tmp_path, capsys):
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  workload = Workload("one", (Prompt("p0", messages=({"role": "user", "content": "x"},)),))
  try:
    base = f"http://127.0.0.1:{server.server_address[1]}"
    per_rate, records = sb.sweep(base, [50.0], workload, label="stand-in", requests=15,
                                 seed=1, max_tokens=6, timeout=30,
                                 extra={"speculate": False}, log=lambda *_: None)
    # The command line's run: its file holds a header and a record per request.
    written = str(tmp_path / "cli.jsonl")
    assert sb.main(["--url", base, "--rates", "40", "--requests", "3", "--max-tokens", "2",
                    "--label", "cli", "--json", written, "--workload",
                    f"text:{_text_prompts(tmp_path)}"]) == 0
  finally:
    server.shutdown()
  cli_head, cli_recs = R.read(written)
  assert cli_head["study"] == "serve" and cli_head["label"] == "cli"
  assert cli_head["settings"]["rates"] == [40.0] and list(cli_head["rates"]) == ["40.0"]
  assert [(r.method, r.workload, r.prompt, r.axes["index"]) for r in cli_recs] == [
      ("cli", cli_head["settings"]["workload"], "0", i) for i in range(3)]
  capsys.readouterr()
  head = sb.run_header("stand-in", {"workload": "one"}, per_rate)
  (row,) = sb.rows(head, records)
  assert len(records) == 15 and row["refused"] == 5 and row["rate"] == 50.0
  assert [r.axes for r in records] == [{"rate": 50.0, "index": i} for i in range(15)]
  assert {(r.study, r.method, r.workload, r.prompt) for r in records} == {
      ("serve", "stand-in", "one", "p0")}
  # Every fifth request, unless refused first, was cut mid-stream; none is lost.
  assert row["completed"] + row["refused"] + row["failed"] == 15
  full = [r for r in records if sb.ok(r) and r.tokens == 6 and r.calls == 3]
  assert len(full) == row["completed"] and row["tau"] == pytest.approx(2.0)
  assert all(r.extra["text"] == "w0 w1 w2 w3 w4 w5 " and len(r.extra["chunk_times"]) == 6
             for r in full)
  assert all(M.ttft(r) >= 0 and r.extra["accepted"] == 3 for r in full)
  cut = [r for r in records if r.extra["status"] == 200 and not sb.ok(r)]
  assert row["failed"] == len(cut) == 2  # the 5th and 10th; the 15th was refused
  assert all("[DONE]" in r.extra["error"] and r.tokens == 2 for r in cut)
  body = _StandIn.bodies[0]
  assert body["ignore_eos"] is True and body["speculate"] is False and body["stream"] is True
  assert body["model"] == "stand-in" and row["rounds_by_k"] == {'k="4"': 15.0}
  # The run's file, read back: the same records, and --report's table of them.
  path = R.write(str(tmp_path / "run.jsonl"), head, records)
  assert R.read(path)[1] == records
  assert sb.main(["--report", path]) == 0
  out = capsys.readouterr().out
  assert "| stand-in | 50 | 8 / 5 |" in out and "| 2.00 | 4: 15 |" in out
  assert tables.render("serve.load", path) == sb.table(sb.runs_of(head, records))


def test_a_run_written_before_the_harness_converts_unchanged():
  from jspec.bench import legacy

  old = [dict(rate=2.0, index=0, prompt=1, sent=0.0, status=200, error="",
              chunk_times=[0.5, 1.0, 2.5], end=2.5, output_tokens=5, text="abc",
              target_calls=2, accepted=3),
         dict(rate=2.0, index=1, prompt=0, sent=0.4, status=429, error="full",
              chunk_times=[], end=0.5, output_tokens=0, text="", target_calls=None,
              accepted=None)]
  run = {"study": "serve", "label": "jspec-x", "workload": "restate", "max_tokens": 5,
         "seed": 0, "command": ["jspec", "serve"],
         "rows": [dict(rate=2.0, **sb.summary([_record(0, sent=0.0, first=0.5, end=2.5,
                                                       tokens=5, calls=2),
                                               _record(1, status=429, sent=0.4, end=0.5)]),
                       rounds_by_k={'k="4"': 2.0}, records=old)]}
  head, recs = legacy.serve(run, "old.json")
  assert head["converted_from"] == "old.json" and head["label"] == "jspec-x"
  assert head["rates"] == {"2.0": {"rounds_by_k": {'k="4"': 2.0}}}
  assert [r.prompt for r in recs] == ["restate-2", "restate-1"]
  assert [r.extra["prompt_index"] for r in recs] == [1, 0]
  assert (recs[0].tokens, recs[0].calls, recs[1].calls) == (5, 2, 0)
  (row,) = sb.rows(head, recs)
  assert row["rounds_by_k"] == {'k="4"': 2.0} and row["tau"] == pytest.approx(2.5)
  run["rows"][0]["tokens_per_s"] += 1.0  # a file whose figures its records do not give
  with pytest.raises(ValueError, match="tokens_per_s"):
    legacy.serve(run, "old.json")
