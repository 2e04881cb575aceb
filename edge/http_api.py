"""The edge's OpenAI-compatible HTTP API (`kvedge serve --http HOST:PORT`), beside gRPC Ask.

Clients written for OpenAI, vLLM or SGLang talk to an edge unchanged:

- `GET /v1/models`: every KB the edge serves is a model, with its address as id:
  `NS/NAME` or `NS/NAME@VARIANT` (docs/design.md, decision 8). A request may leave out `default/`.
- `POST /v1/chat/completions`: the whole conversation is the prompt, rendered by the
  model's chat template (`edge.conversation`): system messages, the earlier turns, then the
  segments retrieved from the model's KB and the last user message, the question, answered by
  the same `EdgeEngine` as gRPC Ask. The oldest turns are dropped when the conversation does
  not fit the window (`usage.dropped_turns`), and the KV of a conversation's earlier turns is
  kept, so a next turn computes only its new tokens (`kvedge.session_reused`). Retrieval
  ranks against the last user message (`kvedge.retrieval`: "conversation" for all of them).
  `stream` (SSE) or not; `max_tokens` (or
  `max_completion_tokens`), `temperature` (default 0 = greedy, not OpenAI's 1: answers from a
  KB should repeat), `top_p`, `seed`, `stop`. The reuse strategy, its options and the number
  of segments come in the extension field `kvedge` (OpenAI's python client: `extra_body=
  {"kvedge": {"strategy": "sparsex", "options": {"ratio": 0.2}, "top_k": 3}}`). A field this
  API does not implement is refused by name (400), never ignored.
- A bearer token is a kvedge token, checked by the same TokenStore and namespace rule as gRPC.
- Errors have OpenAI's shape `{"error": {"message", "type", "param", "code"}}`; a named kvedge
  error's HTTP status follows its gRPC status (`HTTP_STATUS`), `code` is its name.
- `GET /metrics` (Prometheus) and `GET /health` need no token; every request gets an
  `x-request-id` response header and one log line (`common.metrics`).
- `usage` counts prompt and completion tokens; the extension field `kvedge` of the answer
  carries what AskResult reports (TTFT, recomputed tokens, KV bytes loaded and attended).
"""
from __future__ import annotations

import json
import logging
import re
import socket
import ssl
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Literal

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from kvedge.common.net.auth import Principal, TokenStore
from kvedge.common.errors import (BadInput, InvalidOption, InvalidRequest, KvedgeError,
                                  NotFound)
from kvedge.common.model.decoding import Sampler
from kvedge.edge import DEFAULT_STRATEGY
from kvedge.common.net.metrics import RequestLog, RequestLogMiddleware, request_log
from kvedge.edge.conversation import Conversation
from kvedge.edge.engine import MAX_NEW_TOKENS, MAX_TOP_K, AskResult, EdgeEngine
from kvedge.edge.metrics import EdgeMetrics
from kvedge.edge.strategies import UnknownStrategy
from kvedge.edge.sync import Target, manifest_path

log = logging.getLogger("kvedge.edge.http")
# the chat page at / (plain HTML and JS, package data: nothing fetched from elsewhere)
CHAT_PAGE = Path(__file__).parent / "web" / "chat.html"

# gRPC status of a named error → (HTTP status, OpenAI error type): google.rpc.Code's HTTP
# mapping, except RESOURCE_EXHAUSTED (kvedge's oversized request: 400 like OpenAI's
# context_length_exceeded, as a 429 would make clients retry it) and FAILED_PRECONDITION
# (kvedge's default, raised for the server's own state: a corrupt pack, a model mismatch)
HTTP_STATUS = {
    "INVALID_ARGUMENT": (400, "invalid_request_error"),
    "RESOURCE_EXHAUSTED": (400, "invalid_request_error"),
    "UNAUTHENTICATED": (401, "authentication_error"),
    "PERMISSION_DENIED": (403, "permission_error"),
    "NOT_FOUND": (404, "invalid_request_error"),
    "FAILED_PRECONDITION": (500, "server_error"),
    "DATA_LOSS": (500, "server_error"),  # a pack corrupted on the edge's disk (refetched)
    "INTERNAL": (500, "server_error"),
    "UNAVAILABLE": (503, "server_error"),
}
# errors the engine raises about a field of the kvedge extension
PARAM_OF = {UnknownStrategy: "kvedge.strategy", InvalidOption: "kvedge.options"}


class BadParameter(InvalidRequest):
    """A request field this API cannot honour; `param` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


class ModelNotFound(NotFound):
    """A model id that names no KB this edge serves."""

    param = "model"


def error_body(message: str, type_: str, code: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_of(err: Exception) -> tuple[int, dict]:
    """Any exception → (HTTP status, OpenAI error body); unnamed ones are internal errors."""
    if not isinstance(err, KvedgeError):
        return 500, error_body(f"internal error: {type(err).__name__}: {err}", "server_error",
                               "internal_error")
    status, type_ = HTTP_STATUS.get(err.status, (500, "server_error"))
    code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(err).__name__).lower()  # NotFound → not_found
    param = getattr(err, "param", None) or PARAM_OF.get(type(err))
    return status, error_body(str(err), type_, code, param)


# ------------------------------------------------------------------ request shapes


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")  # name, tool_call_id, ...: not part of the prompt

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            if any(part.get("type") != "text" for part in self.content):
                raise BadParameter("messages", "only text content parts are supported")
            return "".join(str(part.get("text", "")) for part in self.content)
        return self.content or ""


class KvedgeOptions(BaseModel):
    """The extension field `kvedge`: how the edge reuses the KB's KV cache."""

    model_config = ConfigDict(extra="forbid")

    strategy: str | None = None
    options: dict[str, str | int | float | bool] = {}
    top_k: int | None = Field(None, ge=1, le=MAX_TOP_K)  # segments retrieved
    # what retrieval ranks segments against: the last user message, or all of them
    retrieval: Literal["last", "conversation"] = "last"


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS)
    temperature: float | None = None  # sampling fields: Sampler checks their ranges
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None  # at most MAX_STOPS (the engine checks)
    user: str | None = None  # an end-user id for the caller's own records
    # OpenAI fields accepted only at their neutral value (clients send them by default)
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | None = None
    kvedge: KvedgeOptions = KvedgeOptions()

    def check_supported(self) -> None:
        neutral = {"n": 1, "presence_penalty": 0, "frequency_penalty": 0, "logprobs": False}
        for name, value in neutral.items():
            if getattr(self, name) not in (None, value):
                raise BadParameter(name, f"this edge supports only {name}={value}")

    def conversation(self) -> Conversation:
        """System and developer messages, the turns before the last user message, and that
        message, the question (tool messages are not part of the prompt)."""
        try:
            return Conversation.of_messages([(m.role, m.text()) for m in self.messages])
        except BadInput as err:
            raise BadParameter("messages", str(err).removeprefix("messages: ")) from None

    def sampler(self) -> Sampler:
        """Unset fields take their defaults (greedy, top_p 1, unseeded); out of range is
        Sampler's InvalidRequest, a 400 whose `param` names the field."""
        return Sampler(0.0 if self.temperature is None else self.temperature,
                       top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed)

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


# ------------------------------------------------------------------ the API


@dataclass
class OpenAIApi:
    """What the routes do, over one engine and the edge's token store."""

    engine: EdgeEngine
    tokens: TokenStore
    targets: list[Target]  # the KBs this edge serves: its models
    strategy: str = DEFAULT_STRATEGY
    top_k: int = 3
    max_new_tokens: int = 48
    metrics: EdgeMetrics = field(default_factory=EdgeMetrics)  # the daemon's, shared with gRPC

    def principal(self, authorization: str | None) -> Principal:
        scheme, _, token = (authorization or "").partition(" ")
        return self.tokens.check(token.strip() if scheme.lower() == "bearer" else None)

    def models(self, who: Principal) -> dict:
        return {"object": "list", "data": [self.model_card(t) for t in self.targets
                                           if who.may_read(t.namespace)]}

    def model_card(self, target: Target) -> dict:
        path = manifest_path(self.engine.state_dir, target)
        return {"id": target.key, "object": "model", "owned_by": target.namespace,
                "created": int(path.stat().st_mtime) if path.exists() else 0,
                "kvedge": {"synced": path.exists()}}

    def resolve(self, model: str, who: Principal) -> Target:
        """A model id → the served KB; the namespace is checked before the KB is looked up,
        so a token learns nothing about other tenants' KBs."""
        try:
            target = Target.parse(model)
        except InvalidRequest as err:
            raise BadParameter("model", str(err)) from None
        who.require(target.namespace)
        if target not in self.targets:
            raise ModelNotFound(f"this edge serves no model {target.key!r}: GET /v1/models "
                                "lists the KBs it serves")
        return target

    def ask(self, req: ChatRequest, who: Principal,
            log: RequestLog | None = None) -> tuple[str, Iterator[str | AskResult]]:
        """Start answering: (model id, events). The first event is taken here, so a request
        the engine refuses fails before any response byte, with its own HTTP status."""
        req.check_supported()
        target = self.resolve(req.model, who)
        if log is not None:
            log.note(namespace=target.namespace, kb=target.kb, variant=target.variant)
        ext = req.kvedge
        events = self.engine.ask(
            target, req.conversation(), strategy=ext.strategy or self.strategy,
            top_k=ext.top_k or self.top_k,
            max_new_tokens=req.max_completion_tokens or req.max_tokens or self.max_new_tokens,
            options={k: str(v) for k, v in ext.options.items()}, sampler=req.sampler(),
            stop=req.stops(), retrieval=ext.retrieval, keep=True)  # a chat: a next turn
        events = self.metrics.answers(events, log)
        first = next(events)
        return target.key, _chain(first, events)

    def completion(self, model: str, events: Iterator[str | AskResult]) -> dict:
        done = [e for e in events if isinstance(e, AskResult)][-1]
        return {**_head(model, "chat.completion"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": done.answer},
                             "finish_reason": done.finish_reason, "logprobs": None}],
                "usage": _usage(done), "kvedge": _costs(done)}

    def chunks(self, model: str, events: Iterator[str | AskResult],
               include_usage: bool) -> Iterator[str]:
        """Server-sent events: a role chunk, content chunks, the finish chunk (with the
        `kvedge` costs), the usage chunk if asked for, `[DONE]`. An error after the first
        byte is sent as an `error` event (the status line is gone by then)."""
        head = _head(model, "chat.completion.chunk")

        def chunk(delta: dict, finish: str | None = None, **extra) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return _sse({**head, "choices": [choice], **extra})

        yield chunk({"role": "assistant", "content": ""})
        try:
            for event in events:
                if isinstance(event, AskResult):
                    yield chunk({}, event.finish_reason, kvedge=_costs(event))
                    if include_usage:
                        yield _sse({**head, "choices": [], "usage": _usage(event)})
                else:
                    yield chunk({"content": event})
        except Exception as err:  # noqa: BLE001 - reported to the client, and logged
            log.warning("chat completion stream failed: %s: %s", type(err).__name__, err)
            yield _sse(error_of(err)[1])
        finally:
            events.close()
        yield "data: [DONE]\n\n"


def _chain(first, rest):
    yield first
    yield from rest


def _head(model: str, kind: str) -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": model}


def _usage(done: AskResult) -> dict:
    """OpenAI's counts; `dropped_turns`: the oldest conversation turns left out of the
    prompt to fit the model's window (0 when the whole conversation was read)."""
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.tokens,
            "total_tokens": done.prompt_tokens + done.tokens,
            "dropped_turns": done.dropped_turns}


def _costs(done: AskResult) -> dict:
    skip = {"answer", "tokens", "prompt_tokens", "finish_reason"}  # in choices and usage
    return {k: v for k, v in asdict(done).items() if k not in skip}


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def create_app(api: OpenAIApi) -> FastAPI:
    app = FastAPI(title="kvedge edge", docs_url=None, redoc_url=None)
    app.add_middleware(RequestLogMiddleware, metrics=api.metrics.http)

    def principal(authorization: str | None = Header(None)) -> Principal:
        return api.principal(authorization)

    @app.exception_handler(KvedgeError)
    def kvedge_error(_: Request, err: KvedgeError):
        status, body = error_of(err)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    def invalid_body(_: Request, err: RequestValidationError):
        first = err.errors()[0]
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        return JSONResponse(error_body(f"{param}: {first['msg']}" if param else first["msg"],
                                       "invalid_request_error", "invalid_parameter", param),
                            status_code=400)

    @app.exception_handler(Exception)
    def internal_error(_: Request, err: Exception):
        log.exception("request failed")
        status, body = error_of(err)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(HTTPException)
    def http_error(_: Request, err: HTTPException):
        return JSONResponse(error_body(str(err.detail), "invalid_request_error",
                                       re.sub(r"\W+", "_", str(err.detail)).lower()),
                            status_code=err.status_code)

    @app.get("/", response_class=HTMLResponse)
    def page():  # no token: the page asks for one, and every API call it makes carries it
        return HTMLResponse(CHAT_PAGE.read_text())

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics():  # no token, like /health: no label names a namespace or a KB
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(api.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    def list_models(who: Principal = Depends(principal)):
        return api.models(who)

    @app.get("/v1/models/{model:path}")
    def get_model(model: str, who: Principal = Depends(principal)):
        return api.model_card(api.resolve(model, who))

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest, request: Request, who: Principal = Depends(principal)):
        model, events = api.ask(req, who, request_log(request.state))
        if not req.stream:
            return api.completion(model, events)
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(api.chunks(model, events, usage), media_type="text/event-stream")

    return app


# ------------------------------------------------------------------ the server


class HttpServer:
    """uvicorn on its own thread, over a socket bound here (so a busy port fails at start-up
    and port 0 works); `stop()` ends it with the daemon."""

    def __init__(self, app, address: str, tls=None):
        import uvicorn

        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, int(port)), family=family)
        self.host, self.port = host, self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_config=None, timeout_graceful_shutdown=2,
                                access_log=False,  # RequestLogMiddleware logs each request
                                **_ssl_settings(tls))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, args=([self.socket],),
                                       name="http", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        scheme = "https" if self.server.config.ssl_certfile else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}/v1"

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.socket.close()


def _ssl_settings(tls) -> dict:
    """uvicorn's TLS settings from the daemon's (common.tls.ServerTLS): the same certificate,
    and with a client CA the same mutual TLS, as gRPC."""
    if tls is None:
        return {}
    settings = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    if tls.client_ca:
        settings.update(ssl_ca_certs=str(tls.client_ca), ssl_cert_reqs=ssl.CERT_REQUIRED)
    return settings


def serve_http(engine: EdgeEngine, state_dir: Path | str, targets: list[Target],
               address: str = "127.0.0.1:8000", *, tls=None, **defaults) -> HttpServer:
    """Start the OpenAI-compatible API over `engine` (the one gRPC Ask uses); tokens are the
    edge's (<state_dir>/tokens.json); `tls` (common.tls.ServerTLS, gRPC's) makes it HTTPS.
    `defaults`: strategy, top_k, max_new_tokens, metrics (the daemon's EdgeMetrics, whose
    registry /metrics serves)."""
    api = OpenAIApi(engine, TokenStore(Path(state_dir) / "tokens.json"), list(targets),
                    **defaults)
    return HttpServer(create_app(api), address, tls)
