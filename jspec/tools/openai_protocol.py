"""The OpenAI wire format of `jspec serve`: request bodies checked into frozen requests,
and the response, chunk, usage and error bodies.

Nothing here touches the engine, the event loop or a socket, so every rule of the
protocol is a plain function of a parsed JSON body (tests call them directly). A body
that breaks a rule raises `ProtocolError` naming the field (`param`) and the HTTP
status; `error_body` is the shape every OpenAI client reads:

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

Fields follow OpenAI's names and defaults (temperature 1, top_p 1, n 1, max_tokens 16
for completions and "all that fits" for chat). jspec's extensions beside them: top_k,
min_p, repetition_penalty, ignore_eos (vLLM's names), stop_token_ids, speculate,
max_draft_tokens and return_token_ids. Fields that OpenAI defines and this server does not do (tools, echo,
best_of > n, suffix) are refused by name rather than ignored, since ignoring them would
answer a different question than the one asked.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

MAX_N = 64  # choices per request: each is a request of its own in the engine
MAX_STOP = 16  # stop strings per request (OpenAI allows 4; the cut costs the host little)
MAX_STOP_LENGTH = 256  # characters in one stop string
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs bound, as OpenAI's
LOGIT_BIAS_LIMIT = 100.0  # OpenAI's bound on one logit bias


class ProtocolError(Exception):
  """A request the server refuses: HTTP `status`, and the OpenAI error fields."""

  def __init__(self, message: str, param: str | None = None, status: int = 400,
               type: str = "invalid_request_error", code: str | None = None):
    super().__init__(message)
    self.message, self.param, self.status, self.type, self.code = (message, param, status,
                                                                   type, code)

  def body(self) -> dict:
    """The OpenAI error body of this error."""
    return error_body(self.message, self.type, self.param, self.code)


def closing_error(detail: str = "") -> ProtocolError:
  """503: the server is shutting down (new requests, and requests it did not finish)."""
  return ProtocolError("the server is shutting down" + (f" ({detail})" if detail else ""),
                       status=503, type="server_error", code="shutting_down")


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
  """{"error": {message, type, param, code}}, as OpenAI answers an error."""
  return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ----------------------------------------------------------------------------- parsed requests


@dataclasses.dataclass(frozen=True)
class Limits:
  """What a request is checked against: the server's model and its options."""

  model_names: tuple[str, ...]  # names /v1/models lists; the first is the default
  vocab_size: int
  logprobs: int = 0  # top alternatives the engine computes per token (0: logprobs off)
  constraints: bool = False  # response_format (the engine was built with constraints)
  chat: bool = True  # the model has a chat template


@dataclasses.dataclass(frozen=True)
class Sampling:
  """The settings every choice of one request shares (seeds step by one per choice)."""

  max_tokens: int | None  # None: as many as fit the slot
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  min_p: float = 0.0
  presence_penalty: float = 0.0
  frequency_penalty: float = 0.0
  repetition_penalty: float = 1.0
  logit_bias: tuple[tuple[int, float], ...] | None = None  # (token id, bias), sorted by id
  seed: int | None = None
  stop: tuple[str, ...] = ()
  stop_token_ids: tuple[int, ...] = ()
  n: int = 1
  speculate: bool = True
  max_draft_tokens: int | None = None
  logprobs: int | None = None  # None: no logprobs; k: each token's and its top k
  ignore_eos: bool = False  # EOS does not end the answer (load generators' fixed lengths)

  def engine_kwargs(self, choice: int, max_new_tokens: int) -> dict:
    """`Engine.submit`'s keywords for choice `choice` (seed + choice when seeded)."""
    return dict(max_new_tokens=max_new_tokens, temperature=self.temperature,
                top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                repetition_penalty=self.repetition_penalty,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                logit_bias=None if self.logit_bias is None else dict(self.logit_bias),
                seed=None if self.seed is None else self.seed + choice,
                stop_ids=list(self.stop_token_ids), speculate=self.speculate,
                max_draft_tokens=self.max_draft_tokens, ignore_eos=self.ignore_eos)


@dataclasses.dataclass(frozen=True)
class ResponseFormat:
  """A constraint on the answer's text: JSON valid under `schema` (JSON text; for
  json_object, any JSON object)."""

  kind: str  # "json_object" | "json_schema"
  schema: str


# Any JSON object, as a schema (outlines-core compiles it like any other).
JSON_OBJECT_SCHEMA = json.dumps({"type": "object"})


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
  """A checked /v1/completions body."""

  model: str
  prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids, per prompt
  sampling: Sampling
  stream: bool = False
  include_usage: bool = False  # stream_options.include_usage: a last chunk with usage
  return_token_ids: bool = False
  response_format: ResponseFormat | None = None


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  """A checked /v1/chat/completions body."""

  model: str
  messages: tuple[tuple[str, str], ...]  # (role, content)
  sampling: Sampling
  stream: bool = False
  include_usage: bool = False
  return_token_ids: bool = False
  response_format: ResponseFormat | None = None

  def conversation(self) -> list[dict]:
    """The messages as the chat template takes them."""
    return [{"role": role, "content": content} for role, content in self.messages]


# ----------------------------------------------------------------------------- field readers
#
# Each reads one field of the body: absent or null gives the default; the wrong type or
# a value out of range raises ProtocolError with the field's name as `param`.

_MISSING = object()


def _get(body: dict, name: str):
  value = body.get(name, _MISSING)
  return _MISSING if value is None else value


def _kind(value) -> str:
  return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
          list: "an array", dict: "an object"}.get(type(value), type(value).__name__)


def _integer(body, name, default, low=None, high=None):
  value = _get(body, name)
  if value is _MISSING:
    return default
  if isinstance(value, bool) or not isinstance(value, int):
    raise ProtocolError(f"'{name}' must be an integer, got {_kind(value)}", name)
  if (low is not None and value < low) or (high is not None and value > high):
    raise ProtocolError(f"'{name}' must be {_range(low, high)}, got {value}", name)
  return value


def _number(body, name, default, low=None, high=None, low_open=False):
  value = _get(body, name)
  if value is _MISSING:
    return default
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ProtocolError(f"'{name}' must be a number, got {_kind(value)}", name)
  value = float(value)
  if (not math.isfinite(value) or (low is not None and (value < low or (low_open and value == low)))
      or (high is not None and value > high)):
    raise ProtocolError(f"'{name}' must be {_range(low, high, low_open)}, got {value:g}", name)
  return value


def _range(low, high, low_open=False) -> str:
  if low is not None and high is not None:
    return f"in {'(' if low_open else '['}{low:g}, {high:g}]"
  if low is not None:
    return f"{'>' if low_open else '>='} {low:g}"
  return f"<= {high:g}"


def _boolean(body, name, default):
  value = _get(body, name)
  if value is _MISSING:
    return default
  if not isinstance(value, bool):
    raise ProtocolError(f"'{name}' must be a boolean, got {_kind(value)}", name)
  return value


def _string(body, name, default):
  value = _get(body, name)
  if value is _MISSING:
    return default
  if not isinstance(value, str):
    raise ProtocolError(f"'{name}' must be a string, got {_kind(value)}", name)
  return value


def _token_id(value, name: str, vocab_size: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
    raise ProtocolError(f"'{name}' holds {value!r}, not a token id in [0, {vocab_size})", name)
  return value


def _model(body, limits: Limits) -> str:
  name = _string(body, "model", limits.model_names[0])
  if name not in limits.model_names:
    raise ProtocolError(f"the model '{name}' does not exist; this server serves "
                        f"{', '.join(repr(m) for m in limits.model_names)}", "model", 404,
                        code="model_not_found")
  return name


def _stop(body) -> tuple[str, ...]:
  value = _get(body, "stop")
  if value is _MISSING:
    return ()
  items = [value] if isinstance(value, str) else value
  if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
    raise ProtocolError("'stop' must be a string or an array of strings", "stop")
  if len(items) > MAX_STOP:
    raise ProtocolError(f"'stop' holds {len(items)} strings; at most {MAX_STOP}", "stop")
  if any(not s or len(s) > MAX_STOP_LENGTH for s in items):
    raise ProtocolError(f"every 'stop' string must hold 1 to {MAX_STOP_LENGTH} characters",
                        "stop")
  return tuple(dict.fromkeys(items))


def _logit_bias(body, vocab_size: int):
  value = _get(body, "logit_bias")
  if value is _MISSING:
    return None
  if not isinstance(value, dict):
    raise ProtocolError(f"'logit_bias' must be an object of token id -> bias, got "
                        f"{_kind(value)}", "logit_bias")
  out = {}
  for key, bias in value.items():
    try:
      token = int(key)  # JSON object keys are strings: "50256"
    except ValueError:
      raise ProtocolError(f"'logit_bias' key {key!r} is not a token id", "logit_bias") from None
    _token_id(token, "logit_bias", vocab_size)
    if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not (
        -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT):
      raise ProtocolError(f"'logit_bias' values must be numbers in [-100, 100], got {bias!r} "
                          f"for token {token}", "logit_bias")
    out[token] = float(bias)
  return tuple(sorted(out.items()))


def _stream(body) -> tuple[bool, bool]:
  stream = _boolean(body, "stream", False)
  options = _get(body, "stream_options")
  if options is _MISSING:
    return stream, False
  if not isinstance(options, dict):
    raise ProtocolError("'stream_options' must be an object", "stream_options")
  if not stream:
    raise ProtocolError("'stream_options' is only allowed with stream: true", "stream_options")
  return stream, _boolean(options, "include_usage", False)


def _refuse(body, name: str, allowed, why: str) -> None:
  """A field OpenAI defines that this server does not do: refused unless its value
  asks for nothing (`allowed(value)`)."""
  value = _get(body, name)
  if value is not _MISSING and not allowed(value):
    raise ProtocolError(f"'{name}' is not supported by this server: {why}", name)


def _sampling(body, limits: Limits, max_tokens, logprobs) -> Sampling:
  stop_ids = _get(body, "stop_token_ids")
  if stop_ids is _MISSING:
    stop_ids = ()
  elif not isinstance(stop_ids, list):
    raise ProtocolError("'stop_token_ids' must be an array of token ids", "stop_token_ids")
  stop_ids = tuple(_token_id(i, "stop_token_ids", limits.vocab_size) for i in stop_ids)
  top_k = _integer(body, "top_k", 0, low=-1)
  return Sampling(
      max_tokens=max_tokens,
      temperature=_number(body, "temperature", 1.0, low=0.0),
      top_p=_number(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True),
      top_k=max(top_k, 0),  # -1 (vLLM's "off") and 0 both turn it off
      min_p=_number(body, "min_p", 0.0, low=0.0, high=1.0),
      presence_penalty=_number(body, "presence_penalty", 0.0, low=-2.0, high=2.0),
      frequency_penalty=_number(body, "frequency_penalty", 0.0, low=-2.0, high=2.0),
      repetition_penalty=_number(body, "repetition_penalty", 1.0, low=0.0, low_open=True),
      logit_bias=_logit_bias(body, limits.vocab_size),
      seed=_integer(body, "seed", None, low=-2**63, high=2**63 - 1 - MAX_N),
      stop=_stop(body),
      stop_token_ids=stop_ids,
      n=_integer(body, "n", 1, low=1, high=MAX_N),
      speculate=_boolean(body, "speculate", True),
      max_draft_tokens=_integer(body, "max_draft_tokens", None, low=0),
      logprobs=logprobs,
      ignore_eos=_boolean(body, "ignore_eos", False))


def _object(body) -> dict:
  if not isinstance(body, dict):
    raise ProtocolError(f"the request body must be a JSON object, got {_kind(body)}")
  return body


def _response_format(body, limits: Limits) -> ResponseFormat | None:
  value = _get(body, "response_format")
  if value is _MISSING:
    return None
  if not isinstance(value, dict) or not isinstance(value.get("type"), str):
    raise ProtocolError("'response_format' must be an object with a 'type'", "response_format")
  kind = value["type"]
  if kind == "text":
    return None
  if kind not in ("json_object", "json_schema"):
    raise ProtocolError(f"'response_format.type' must be text, json_object or json_schema, got "
                        f"{kind!r}", "response_format")
  if not limits.constraints:
    raise ProtocolError("'response_format' needs a server started with --constraint-states Q",
                        "response_format")
  if kind == "json_object":
    return ResponseFormat(kind, JSON_OBJECT_SCHEMA)
  spec = value.get("json_schema")
  if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
    raise ProtocolError("'response_format.json_schema.schema' must be a JSON schema object",
                        "response_format")
  # Sorted keys: the same schema written in another key order compiles once (the cache
  # of compiled constraints is keyed by this text).
  return ResponseFormat(kind, json.dumps(spec["schema"], sort_keys=True))


def parse_completion(body: Any, limits: Limits) -> CompletionRequest:
  """A /v1/completions body, checked; raises ProtocolError."""
  body = _object(body)
  model = _model(body, limits)
  prompt = body.get("prompt")
  if isinstance(prompt, str):
    prompts = (prompt,)
  elif isinstance(prompt, list) and prompt and all(
      isinstance(t, int) and not isinstance(t, bool) for t in prompt):
    prompts = (tuple(_token_id(t, "prompt", limits.vocab_size) for t in prompt),)
  elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
    prompts = tuple(prompt)
  elif isinstance(prompt, list) and prompt and all(isinstance(p, list) and p for p in prompt):
    prompts = tuple(tuple(_token_id(t, "prompt", limits.vocab_size) for t in p) for p in prompt)
  else:
    raise ProtocolError("'prompt' must be a string, an array of token ids, or a non-empty array "
                        "of either", "prompt")
  _refuse(body, "echo", lambda v: v is False, "the answer never repeats the prompt")
  _refuse(body, "suffix", lambda v: v == "", "no insertion after the answer")
  n = body.get("n", 1)
  _refuse(body, "best_of", lambda v: v == n, "each choice is sampled once (best_of must equal n)")
  if _get(body, "logprobs") is not _MISSING and limits.logprobs <= 0:
    raise ProtocolError("'logprobs' needs a server started with --logprobs N", "logprobs")
  logprobs = _integer(body, "logprobs", None, low=0, high=limits.logprobs)
  stream, usage = _stream(body)
  return CompletionRequest(
      model=model, prompts=prompts,
      sampling=_sampling(body, limits, _integer(body, "max_tokens", 16, low=1), logprobs),
      stream=stream, include_usage=usage,
      return_token_ids=_boolean(body, "return_token_ids", False),
      response_format=_response_format(body, limits))


def _content(message: dict, i: int) -> str:
  """A message's text: a string, or the text parts of an array of content parts."""
  content = message.get("content")
  where = f"messages[{i}].content"
  if content is None:
    return ""
  if isinstance(content, str):
    return content
  if isinstance(content, list):
    texts = []
    for part in content:
      if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
          part.get("text"), str):
        raise ProtocolError(f"'{where}' may hold text parts only ({{\"type\": \"text\", "
                            f"\"text\": ...}}): this model reads text", where)
      texts.append(part["text"])
    return "".join(texts)
  raise ProtocolError(f"'{where}' must be a string or an array of text parts", where)


def parse_chat(body: Any, limits: Limits) -> ChatRequest:
  """A /v1/chat/completions body, checked; raises ProtocolError."""
  body = _object(body)
  model = _model(body, limits)
  messages = body.get("messages")
  if not isinstance(messages, list) or not messages:
    raise ProtocolError("'messages' must be a non-empty array of {role, content} objects",
                        "messages")
  parsed = []
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
      raise ProtocolError(f"'messages[{i}]' must be an object with a string 'role'",
                          f"messages[{i}]")
    if m.get("tool_calls"):
      raise ProtocolError("tool calls are not supported by this server", f"messages[{i}]")
    parsed.append((m["role"], _content(m, i)))
  if not limits.chat:
    raise ProtocolError("this model has no chat template: use /v1/completions, or start the "
                        "server with --chat-template FILE", "messages")
  for name in ("tools", "functions"):
    _refuse(body, name, lambda v: v == [], "the answer is text")
  _refuse(body, "tool_choice", lambda v: v == "none", "the answer is text")
  max_tokens = _integer(body, "max_completion_tokens", None, low=1)
  if max_tokens is None:
    max_tokens = _integer(body, "max_tokens", None, low=1)
  want = _boolean(body, "logprobs", False)
  top = _integer(body, "top_logprobs", None, low=0, high=MAX_TOP_LOGPROBS)
  if top is not None and not want:
    raise ProtocolError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
  logprobs = None
  if want:
    if limits.logprobs <= 0:
      raise ProtocolError("'logprobs' needs a server started with --logprobs N", "logprobs")
    logprobs = top or 0
    if logprobs > limits.logprobs:
      raise ProtocolError(f"'top_logprobs' must be <= {limits.logprobs} (the server's "
                          f"--logprobs), got {logprobs}", "top_logprobs")
  stream, usage = _stream(body)
  return ChatRequest(model=model, messages=tuple(parsed),
                     sampling=_sampling(body, limits, max_tokens, logprobs), stream=stream,
                     include_usage=usage,
                     return_token_ids=_boolean(body, "return_token_ids", False),
                     response_format=_response_format(body, limits))


# ----------------------------------------------------------------------------- responses


@dataclasses.dataclass(frozen=True)
class Usage:
  """Token counts of one request, with jspec's speculation figures."""

  prompt_tokens: int
  completion_tokens: int
  accepted_draft_tokens: int = 0  # drafts the target accepted (tokens it did not decode alone)
  target_calls: int = 0  # verify calls (rounds), over every choice

  def body(self) -> dict:
    """OpenAI's usage object, plus accepted_draft_tokens and target_calls."""
    return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "accepted_draft_tokens": self.accepted_draft_tokens,
            "target_calls": self.target_calls}


@dataclasses.dataclass(frozen=True)
class Choice:
  """One finished choice."""

  index: int
  text: str
  finish_reason: str  # "stop" | "length"
  token_ids: tuple[int, ...] | None = None  # with return_token_ids
  logprobs: dict | None = None  # the endpoint's logprobs object


def completion_body(rid: str, created: int, model: str, choices, usage: Usage,
                    prompt_token_ids=None) -> dict:
  """A /v1/completions answer."""
  out = {"id": rid, "object": "text_completion", "created": created, "model": model,
         "choices": [_completion_choice(c) for c in choices], "usage": usage.body()}
  if prompt_token_ids is not None:
    out["prompt_token_ids"] = prompt_token_ids
  return out


def _completion_choice(c: Choice) -> dict:
  out = {"index": c.index, "text": c.text, "finish_reason": c.finish_reason,
         "logprobs": c.logprobs}
  if c.token_ids is not None:
    out["token_ids"] = list(c.token_ids)
  return out


def chat_body(rid: str, created: int, model: str, choices, usage: Usage,
              prompt_token_ids=None) -> dict:
  """A /v1/chat/completions answer."""
  out = {"id": rid, "object": "chat.completion", "created": created, "model": model,
         "choices": [_chat_choice(c) for c in choices], "usage": usage.body()}
  if prompt_token_ids is not None:
    out["prompt_token_ids"] = prompt_token_ids
  return out


def _chat_choice(c: Choice) -> dict:
  out = {"index": c.index, "message": {"role": "assistant", "content": c.text},
         "finish_reason": c.finish_reason, "logprobs": c.logprobs}
  if c.token_ids is not None:
    out["token_ids"] = list(c.token_ids)
  return out


def completion_chunk(rid: str, created: int, model: str, index: int, text: str,
                     finish_reason: str | None = None, logprobs: dict | None = None,
                     token_ids=None) -> dict:
  """One streamed piece of a /v1/completions answer."""
  choice = {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": logprobs}
  if token_ids is not None:
    choice["token_ids"] = list(token_ids)
  return {"id": rid, "object": "text_completion", "created": created, "model": model,
          "choices": [choice]}


def chat_chunk(rid: str, created: int, model: str, index: int, delta: dict,
               finish_reason: str | None = None, logprobs: dict | None = None,
               token_ids=None) -> dict:
  """One streamed piece of a /v1/chat/completions answer."""
  choice = {"index": index, "delta": delta, "finish_reason": finish_reason,
            "logprobs": logprobs}
  if token_ids is not None:
    choice["token_ids"] = list(token_ids)
  return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
          "choices": [choice]}


def usage_chunk(rid: str, created: int, model: str, obj: str, usage: Usage) -> dict:
  """The last chunk of a stream with stream_options.include_usage: no choices, the usage."""
  return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
          "usage": usage.body()}


def sse(data: dict | str) -> bytes:
  """One server-sent event: `data: <json>` and a blank line."""
  text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
  return f"data: {text}\n\n".encode()


DONE = sse("[DONE]")


# ----------------------------------------------------------------------------- logprobs


def completion_logprobs(ids, logprobs, top, start: int, describe) -> dict:
  """Completions' logprobs object for tokens `ids`: their texts and logprobs, the top
  alternatives as {text: logprob}, and each token's character offset from `start`.
  `describe(id)` is (a token's text, its bytes)."""
  texts = [describe(i)[0] for i in ids]
  offsets, at = [], start
  for t in texts:
    offsets.append(at)
    at += len(t)
  return {"tokens": texts, "token_logprobs": [float(x) for x in logprobs],
          "top_logprobs": [{describe(i)[0]: float(lp) for i, lp in alts} for alts in top],
          "text_offset": offsets}


def chat_logprobs(ids, logprobs, top, describe) -> dict:
  """Chat's logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}; bytes
  are the token's own (a multi-byte character spread over tokens is whole again once
  the bytes are joined)."""
  def entry(i, lp):
    text, raw = describe(i)
    return {"token": text, "logprob": float(lp), "bytes": list(raw)}

  return {"content": [dict(entry(i, lp), top_logprobs=[entry(j, a) for j, a in alts])
                      for i, lp, alts in zip(ids, logprobs, top)]}
