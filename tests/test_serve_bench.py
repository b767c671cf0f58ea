"""`jspec bench serve`: arrivals, metrics from records, and the client against a stand-in
OpenAI-compatible server on 127.0.0.1 (streamed chunks, usage, a refusal, a dropped
connection), so the load generator is checked without a model."""

import http.server
import json
import threading

import numpy as np
import pytest

from jspec.tools import serve_bench as sb


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


def _record(i, status=200, sent=0.0, first=None, end=None, tokens=0, calls=None):
  r = sb.RequestRecord(rate=1.0, index=i, prompt=0, sent=sent, status=status, end=end,
                       output_tokens=tokens, target_calls=calls)
  if first is not None:
    r.chunk_times = [first, end]
  return r


def test_summary_from_records():
  records = [_record(0, sent=0.0, first=0.5, end=2.5, tokens=5, calls=2),
             _record(1, sent=1.0, first=1.2, end=3.2, tokens=11, calls=5),
             _record(2, status=429, sent=1.5, end=1.6),
             _record(3, status=0, sent=2.0, end=2.1)]
  records[3].error = "ConnectError"
  row = sb.summary(records)
  assert (row["completed"], row["refused"], row["failed"]) == (2, 1, 1)
  assert row["output_tokens"] == 16 and row["seconds"] == pytest.approx(3.2)
  assert row["tokens_per_s"] == pytest.approx(16 / 3.2)
  assert row["ttft_p50"] == pytest.approx(np.percentile([0.5, 0.2], 50))
  assert row["tpot_p99"] == pytest.approx(np.percentile([2.0 / 4, 2.0 / 10], 99))
  assert row["e2e_p90"] == pytest.approx(np.percentile([2.5, 2.2], 90))
  assert row["tau"] == pytest.approx(16 / 7)


def test_prometheus_counters():
  text = ("# TYPE jspec_rounds_by_k_total counter\njspec_rounds_by_k_total{k=\"0\"} 12\n"
          "jspec_rounds_by_k_total{k=\"4\"} 30.0\njspec_rounds_by_k_totalx 5\n")
  assert sb.counters(text, "jspec_rounds_by_k_total") == {'k="0"': 12.0, 'k="4"': 30.0}


def test_file_workloads(tmp_path):
  path = tmp_path / "w.jsonl"
  path.write_text('{"prompt": "hi"}\n\n{"messages": [{"role": "user", "content": "yo"}]}\n')
  assert sb.workload(f"jsonl:{path}") == [
      {"messages": [{"role": "user", "content": "hi"}]},
      {"messages": [{"role": "user", "content": "yo"}]}]
  text = tmp_path / "t.jsonl"
  text.write_text('{"prompt": "def f("}\n')
  assert sb.workload(f"text:{text}") == [{"prompt": "def f("}]
  path.write_text('{"x": 1}\n')
  with pytest.raises(ValueError, match="w.jsonl:1"):
    sb.workload(f"jsonl:{path}")
  with pytest.raises(ValueError, match="unknown workload"):
    sb.workload("nothing")


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


def test_client_against_a_stand_in_server():
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    base = f"http://127.0.0.1:{server.server_address[1]}"
    rows = sb.sweep(base, [50.0], [{"messages": [{"role": "user", "content": "x"}]}],
                    requests=15, seed=1, max_tokens=6, timeout=30, extra={"speculate": False},
                    log=lambda *_: None)
  finally:
    server.shutdown()
  row = rows[0]
  records = [sb.RequestRecord(**r) for r in row["records"]]
  assert len(records) == 15 and row["refused"] == 5
  # Every fifth request, unless refused first, was cut mid-stream; none is lost.
  assert row["completed"] + row["refused"] + row["failed"] == 15
  full = [r for r in records if r.ok and r.output_tokens == 6 and r.target_calls == 3]
  assert len(full) == row["completed"] and row["tau"] == pytest.approx(2.0)
  assert all(r.text == "w0 w1 w2 w3 w4 w5 " and len(r.chunk_times) == 6 for r in full)
  assert all(r.ttft >= 0 and r.accepted == 3 for r in full)
  body = _StandIn.bodies[0]
  assert body["ignore_eos"] is True and body["speculate"] is False and body["stream"] is True
  assert body["model"] == "stand-in" and row["rounds_by_k"] == {'k="4"': 15.0}
