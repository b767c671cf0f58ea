"""`jspec serve`: an OpenAI-compatible HTTP server over one `jspec.Engine`.

    POST /v1/completions         prompt text or token ids -> text (SSE with stream: true)
    POST /v1/chat/completions    messages through the model's chat template -> text
    GET  /v1/models              the served model
    GET  /health                 200 while serving, 503 once shutting down
    GET  /metrics                Prometheus text (jspec/tools/serve_metrics.py)

One asyncio loop (Starlette on uvicorn) answers every request; the engine's worker thread
decodes. What blocks (tokenizing, chat templates, compiling a JSON schema, submitting to
the engine) runs on worker threads, and tokens come back through `engine_bridge`. Each
choice is one engine request: n > 1 submits n of them. Stop strings are cut on the host
(`stop_text`), and the request is cancelled as soon as one is seen, so its slot frees at
the engine's next step; a client that leaves (mid-stream, or while waiting for a
non-streamed answer) has its requests cancelled the same way.

Statuses: 400 for a body that is not JSON, a field of the wrong type or out of range (the
field named in `param`), a prompt that does not fit a slot; 404 for an unknown model or
path; 429 when the engine's queue is full; 503 while shutting down; every error body is
OpenAI's `{"error": {...}}` (`openai_protocol`). Shutdown (SIGINT / SIGTERM) stops
accepting connections, lets the requests in flight finish for up to `drain_timeout`
seconds (uvicorn's graceful shutdown), cancels what is left, then closes the engine.
docs/serving.md is the user's page.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import time
import uuid

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from jspec.planner import engine as engine_lib
from jspec.tools import engine_bridge
from jspec.tools import openai_protocol as proto
from jspec.tools import serve_choices, serve_metrics

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT, "/v1/models", "/health", "/metrics")
CLIENT_CLOSED = 499  # nginx's status for a client that left before its answer (metrics only)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
  """What the server needs to know besides the engine and the tokenizer."""

  model_name: str
  vocab_size: int  # token ids of prompts, stop_token_ids and logit_bias are checked against it
  max_length: int  # prompt + max_tokens one slot holds (the engine checks the exact bound)
  eos_ids: tuple[int, ...]  # ids that end an answer and are not text
  penalties: bool = True  # the engine was built with penalties=True
  logit_bias: bool = True  # ... with logit_bias=True
  logprobs: int = 0  # ... with logprobs=N
  constraints: int = 0  # ... with constraints=Q (automaton states)


def _error(e: proto.ProtocolError) -> JSONResponse:
  return JSONResponse(e.body(), status_code=e.status)


class Service:
  """The endpoints' logic over one engine, tokenizer and config."""

  def __init__(self, engine: engine_lib.Engine, tokenizer, config: ServerConfig,
               metrics: serve_metrics.Metrics | None = None, constraint_for=None):
    if tokenizer is None:
      raise ValueError("the served model needs a tokenizer (text in, text out)")
    self.engine, self.tokenizer, self.config = engine, tokenizer, config
    self.metrics = metrics or serve_metrics.Metrics()
    self.bridge = engine_bridge.Bridge(engine, self.metrics, logprobs=config.logprobs > 0)
    self.limits = proto.Limits(model_names=(config.model_name,), vocab_size=config.vocab_size,
                               logprobs=config.logprobs, constraints=config.constraints > 0,
                               chat=tokenizer.chat_template is not None)
    self._constraint_for = constraint_for  # ResponseFormat -> a jspec.Constraint (cached)
    self._bytes: list | None = None  # each id's bytes, for logprobs (`_ready_logprobs`)
    self.started = int(time.time())
    self.closing = False

  # ------------------------------------------------------------------ preparing

  def _max_new(self, prompt_length: int, max_tokens: int | None, param: str) -> int:
    """max_tokens, checked to fit a slot beside the prompt (None: all that fits)."""
    room = self.config.max_length - prompt_length
    if max_tokens is None:
      if room < 1:
        raise proto.ProtocolError(
            f"the prompt ({prompt_length} tokens) leaves no room for an answer in a slot of "
            f"{self.config.max_length} tokens", param)
      return room
    if max_tokens > room:
      raise proto.ProtocolError(
          f"the prompt ({prompt_length} tokens) + max_tokens ({max_tokens}) = "
          f"{prompt_length + max_tokens} tokens do not fit a slot of {self.config.max_length}; "
          f"shorten the prompt or lower max_tokens", "max_tokens")
    return max_tokens

  def _check_settings(self, s: proto.Sampling) -> None:
    if not self.config.penalties:
      for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                        ("repetition_penalty", 1.0)):
        if getattr(s, name) != off:
          raise proto.ProtocolError(f"'{name}' needs a server started without --no-penalties",
                                    name)
    if not self.config.logit_bias and s.logit_bias is not None:
      raise proto.ProtocolError("'logit_bias' needs a server started without --no-logit-bias",
                                "logit_bias")

  def _choices(self, prompts: list[list[int]], s: proto.Sampling, constraint, param: str):
    """(index, prompt ids, submit keywords) for every choice: n per prompt."""
    self._check_settings(s)
    out = []
    for p, ids in enumerate(prompts):
      max_new = self._max_new(len(ids), s.max_tokens, param)
      for j in range(s.n):
        kwargs = s.engine_kwargs(j, max_new)
        if constraint is not None:
          kwargs["constraint"] = constraint
        out.append((p * s.n + j, ids, kwargs))
    return out

  def _encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text)[0]

  def prepare_completion(self, req: proto.CompletionRequest):
    """(prompt ids per prompt, choices); blocking (tokenizer, schema compile)."""
    self._ready_logprobs(req.sampling)
    prompts = [list(p) if isinstance(p, tuple) else self._encode(p) for p in req.prompts]
    if any(not p for p in prompts):
      raise proto.ProtocolError("'prompt' encodes to no tokens", "prompt")
    constraint = self._constraint(req.response_format)
    return prompts, self._choices(prompts, req.sampling, constraint, "prompt")

  def prepare_chat(self, req: proto.ChatRequest):
    """(prompt ids, choices) of a conversation; blocking (template, tokenizer)."""
    import jinja2

    self._ready_logprobs(req.sampling)
    try:
      ids = self.tokenizer.apply_chat_template(req.conversation(), add_generation_prompt=True,
                                               tokenize=True)
    except (jinja2.TemplateError, ValueError, TypeError) as e:
      raise proto.ProtocolError(f"the chat template refused the messages: {e}",
                                "messages") from None
    if not ids:
      raise proto.ProtocolError("the messages render to no tokens", "messages")
    constraint = self._constraint(req.response_format)
    return [ids], self._choices([ids], req.sampling, constraint, "messages")

  def _constraint(self, fmt: proto.ResponseFormat | None):
    if fmt is None:
      return None
    try:
      constraint = self._constraint_for(fmt)
    except ValueError as e:
      raise proto.ProtocolError(f"'response_format' cannot be compiled: {e}",
                                "response_format") from None
    # State 0 of the engine's table is the unconstrained rows'.
    if constraint.num_states > self.config.constraints - 1:
      raise proto.ProtocolError(
          f"'response_format' compiles to {constraint.num_states} automaton states; this "
          f"server holds {self.config.constraints - 1} (--constraint-states)", "response_format")
    return constraint

  def submit(self, choices, loop, queue) -> list[engine_bridge.Submitted]:
    """Submit every choice (blocking); the engine's refusals as `ProtocolError`s."""
    try:
      return self.bridge.submit(choices, loop, queue)
    except engine_lib.QueueFull as e:
      raise proto.ProtocolError(f"the server is at capacity: {e}; retry later", status=429,
                                type="rate_limit_error", code="queue_full") from None
    except engine_lib.EngineClosed as e:
      raise proto.closing_error(str(e)) from None
    except engine_lib.ConstraintsFull as e:
      # Its size was checked against the whole table: the constraints of requests in
      # flight hold the room, which frees as they end.
      raise proto.ProtocolError(
          f"the server's constraint table is full: {e}; retry later", "response_format",
          status=429, type="rate_limit_error", code="constraints_full") from None
    except (ValueError, TypeError) as e:
      raise proto.ProtocolError(str(e)) from None

  # ------------------------------------------------------------------ answering

  def _ready_logprobs(self, s: proto.Sampling) -> None:
    """Every id's bytes, read once from the tokenizer (on a worker thread: a large
    vocabulary takes a moment) before the first answer with logprobs names tokens."""
    if s.logprobs is not None and self._bytes is None:
      from jspec.core import constraint as constraint_lib

      self._bytes = constraint_lib.token_bytes(self.tokenizer)[0]

  def describe(self, token: int) -> tuple[str, bytes]:
    """(text, bytes) of one token, as logprobs name it."""
    return self._describe(int(token))

  @functools.lru_cache(maxsize=65536)
  def _describe(self, token: int) -> tuple[str, bytes]:
    text = self.tokenizer.decode([token], skip_special_tokens=False)
    raw = self._bytes[token] if self._bytes is not None and token < len(self._bytes) else None
    return text, text.encode() if raw is None else raw


# ---------------------------------------------------------------------- the app


class _EventStream(StreamingResponse):
  """Server-sent events that notice a client leaving at once, even while nothing is due
  to be sent (a request waiting in the queue), and always close their generator, whose
  `finally` cancels the engine requests."""

  media_type = "text/event-stream"

  async def __call__(self, scope, receive, send):
    async def stream():
      try:
        await self.stream_response(send)
      except OSError:  # the client went away mid-write
        pass
      finally:
        with anyio.CancelScope(shield=True):
          await self.body_iterator.aclose()
      tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
      tg.start_soon(stream)
      await self.listen_for_disconnect(receive)
      tg.cancel_scope.cancel()


async def _watch_disconnect(request: Request, queue: asyncio.Queue) -> None:
  """Post ("disconnect",) once the client of a non-streamed request leaves."""
  while True:
    message = await request.receive()
    if message["type"] == "http.disconnect":
      queue.put_nowait(("disconnect", None))
      return


class App:
  """The Starlette application of one `Service`."""

  def __init__(self, service: Service, on_shutdown=None):
    self.service = service
    self._on_shutdown = on_shutdown
    routes = [Route(COMPLETIONS, self.completions, methods=["POST"]),
              Route(CHAT, self.chat, methods=["POST"]),
              Route("/v1/models", self.models, methods=["GET"]),
              Route("/v1/models/{model:path}", self.model, methods=["GET"]),
              Route("/health", self.health, methods=["GET"]),
              Route("/metrics", self.metrics, methods=["GET"])]
    self.starlette = Starlette(routes=routes, lifespan=self._lifespan, exception_handlers={
        HTTPException: self._http_error, Exception: self._server_error})

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.starlette(scope, receive, send)
    endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"

    async def counted(message):
      if message["type"] == "http.response.start":
        self.service.metrics.request(endpoint, message["status"])
      await send(message)

    await self.starlette(scope, receive, counted)

  @contextlib.asynccontextmanager
  async def _lifespan(self, app):
    yield
    # uvicorn has drained (or given up on) the requests in flight by now.
    self.service.closing = True
    if self._on_shutdown is not None:
      await asyncio.to_thread(self._on_shutdown)

  async def _http_error(self, request, exc: HTTPException):
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = (f"no such endpoint: {request.method} {request.url.path}"
               if exc.status_code in (404, 405) else str(exc.detail))
    return JSONResponse(proto.error_body(message, "invalid_request_error", None, code),
                        status_code=exc.status_code)

  async def _server_error(self, request, exc: Exception):
    return JSONResponse(proto.error_body(f"internal error: {exc!r}", "server_error", None,
                                         "internal_error"), status_code=500)

  # ------------------------------------------------------------------ small endpoints

  async def health(self, request: Request):
    s, engine = self.service, self.service.engine
    body = {"status": "closing" if s.closing else "ok", "model": s.config.model_name,
            "active": engine.active, "queued": engine.queued, "batch": engine.batch,
            "slots": engine.slots}
    return JSONResponse(body, status_code=503 if s.closing else 200)

  async def metrics(self, request: Request):
    return PlainTextResponse(self.service.metrics.render(self.service.engine),
                             media_type="text/plain; version=0.0.4")

  def _card(self) -> dict:
    s = self.service
    return {"id": s.config.model_name, "object": "model", "created": s.started,
            "owned_by": "jspec", "max_model_len": s.config.max_length}

  async def models(self, request: Request):
    return JSONResponse({"object": "list", "data": [self._card()]})

  async def model(self, request: Request):
    name = request.path_params["model"]
    if name != self.service.config.model_name:
      return _error(proto.ProtocolError(f"the model '{name}' does not exist", "model", 404,
                                        code="model_not_found"))
    return JSONResponse(self._card())

  # ------------------------------------------------------------------ generation

  async def completions(self, request: Request):
    return await self._generate(request, chat=False)

  async def chat(self, request: Request):
    return await self._generate(request, chat=True)

  async def _generate(self, request: Request, chat: bool):
    s = self.service
    try:
      if s.closing:
        raise proto.closing_error()
      try:
        body = json.loads(await request.body())
      except (ValueError, UnicodeDecodeError) as e:
        raise proto.ProtocolError(f"the request body is not valid JSON: {e}") from None
      req = (proto.parse_chat if chat else proto.parse_completion)(body, s.limits)
      prepare = s.prepare_chat if chat else s.prepare_completion
      prompts, choices = await asyncio.to_thread(prepare, req)
      loop, queue = asyncio.get_running_loop(), asyncio.Queue()
      submitted = await asyncio.to_thread(s.submit, choices, loop, queue)
    except proto.ProtocolError as e:
      return _error(e)
    run = serve_choices.Run(
        submitted, s.tokenizer, s.config.eos_ids + req.sampling.stop_token_ids, s.metrics,
        req.sampling.stop)
    answer = _Answer(s, req, run, prompts, queue, chat)
    if req.stream:
      return _EventStream(answer.events())
    return await answer.whole(request)


class _Answer:
  """One request's answer, whole or as server-sent events."""

  def __init__(self, service: Service, req, run: serve_choices.Run, prompts, queue, chat: bool):
    self.s, self.req, self.run, self.prompts, self.queue, self.chat = (service, req, run,
                                                                       prompts, queue, chat)
    self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    self.created = int(time.time())

  def _logprobs(self, index: int, start: int, end: int, offset: int):
    if self.req.sampling.logprobs is None:
      return None
    c = self.run.choices[index]
    k = self.req.sampling.logprobs
    ids, top = c.ids[start:end], [alts[:k] for alts in c.top[start:end]]
    if self.chat:
      return proto.chat_logprobs(ids, c.logprobs[start:end], top, self.s.describe)
    return proto.completion_logprobs(ids, c.logprobs[start:end], top, offset, self.s.describe)

  async def whole(self, request: Request) -> Response:
    """Wait for every choice; cancel them if the client leaves first."""
    watcher = asyncio.ensure_future(_watch_disconnect(request, self.queue))
    texts: dict[int, list[str]] = {i: [] for i in self.run.choices}
    finish: dict[int, str] = {}
    try:
      while not self.run.over:
        event = await self.queue.get()
        if event[0] == "disconnect":
          self.run.cancel()
          return Response(status_code=CLIENT_CLOSED)
        for p in self.run.on(event):
          texts[p.index].append(p.text)
          if p.finish is not None:
            finish[p.index] = p.finish
    except serve_choices.Aborted as e:
      self.run.cancel()
      return _error(e.error)
    except BaseException:
      self.run.cancel()
      raise
    finally:
      watcher.cancel()
    choices = []
    for i in sorted(self.run.choices):
      c = self.run.choices[i]
      choices.append(proto.Choice(
          index=i, text="".join(texts[i]), finish_reason=finish[i],
          token_ids=self.run.token_ids(i) if self.req.return_token_ids else None,
          logprobs=self._logprobs(i, 0, c.text.tokens, 0)))
    build = proto.chat_body if self.chat else proto.completion_body
    prompt_ids = self.prompts if self.req.return_token_ids else None
    if prompt_ids is not None and len(prompt_ids) == 1:
      prompt_ids = prompt_ids[0]
    return JSONResponse(build(self.id, self.created, self.req.model, choices,
                              self.run.usage(self.prompts), prompt_ids))

  def _chunk(self, index: int, text: str, finish: str | None, tokens, first: bool = False,
             offset: int = 0) -> dict:
    logprobs = self._logprobs(index, *tokens, offset) if tokens[1] > tokens[0] else None
    ids = (self.run.choices[index].ids[tokens[0]:tokens[1]] if self.req.return_token_ids
           else None)
    if not self.chat:
      return proto.completion_chunk(self.id, self.created, self.req.model, index, text, finish,
                                    logprobs, ids)
    delta = {"role": "assistant", "content": text} if first else (
        {"content": text} if text or finish is None else {})
    return proto.chat_chunk(self.id, self.created, self.req.model, index, delta, finish,
                            logprobs, ids)

  async def events(self):
    """The answer as SSE: chunks as text is decided, finish chunks, usage, [DONE]."""
    sent: dict[int, int] = {i: 0 for i in self.run.choices}  # characters per choice
    try:
      if self.chat:  # OpenAI opens each choice with the assistant's role
        for i in sorted(self.run.choices):
          yield proto.sse(self._chunk(i, "", None, (0, 0), first=True))
      while not self.run.over:
        event = await self.queue.get()
        for p in self.run.on(event):
          yield proto.sse(self._chunk(p.index, p.text, p.finish, p.tokens,
                                      offset=sent[p.index]))
          sent[p.index] += len(p.text)
      if self.req.include_usage:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        yield proto.sse(proto.usage_chunk(self.id, self.created, self.req.model, obj,
                                          self.run.usage(self.prompts)))
      yield proto.DONE
    except serve_choices.Aborted as e:
      yield proto.sse(e.error.body())
      yield proto.DONE
    finally:  # the client left (cancelled here) or the answer failed: free the slots
      self.run.cancel()
