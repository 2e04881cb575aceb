"""Request logs and Prometheus metrics for both daemons (issue 16; the table: docs/metrics.md).

- Every gRPC call goes through `RequestInterceptor` (`rpc.serve_grpc` installs it) and every
  HTTP request through `RequestLogMiddleware`. A request gets an id (the client's
  `x-request-id` when it sends a well-formed one, else a new one), returned in trailing
  metadata or a response header, and one `key=value` line is logged when it ends (logger
  `kvedge.requests`): id, method, namespace, status, duration, and what the handler noted on
  its `RequestLog` (an answer's kb, strategy, ttft_s, tokens).
- Each daemon owns one `CollectorRegistry` (`daemon_registry`; not prometheus_client's global
  one, so a test runs several daemons in one process). `RequestMetrics` counts requests by
  method and final status; the tiers add theirs (`edge.metrics`, `cloud.metrics`);
  `MetricsServer` serves the registry at /metrics (`--metrics HOST:PORT`) with the daemon's TLS
  and listen check. No label names a namespace or a KB, so /metrics tells nothing about
  tenants and asks for no token.
"""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

from kvedge.common.errors import InvalidRequest
from kvedge.common.net.tls import ServerTLS, check_listen, host_of

REQUEST_ID = "x-request-id"
_WELL_FORMED_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # it is logged: no spaces, no newlines
_PLAIN_VALUE = re.compile(r"[\w.,:/@+*-]+")
DURATION_BUCKETS = (.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300)
QUIET = {"grpc.health.v1.Health", "/health", "/metrics"}  # probes and scrapes: logged at DEBUG
HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}
_HANDLER_KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")

log = logging.getLogger("kvedge.requests")


def daemon_registry() -> CollectorRegistry:
    """A daemon's own registry, with the process's CPU, memory and open files."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    return registry


def request_id(given: str | None) -> str:
    """The client's id when it is well formed, else a new one."""
    return given if given and _WELL_FORMED_ID.fullmatch(given) else uuid.uuid4().hex


@dataclass
class RequestLog:
    """One request's log line: filled in while the request runs, written once when it ends."""

    id: str
    method: str
    fields: dict = field(default_factory=dict)
    start: float = field(default_factory=time.perf_counter)

    def note(self, **fields) -> None:
        self.fields.update({k: v for k, v in fields.items() if v not in (None, "")})

    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def write(self, status, quiet: bool = False) -> None:
        line = {"id": self.id, "method": self.method, **self.fields, "status": status,
                "duration_s": self.seconds()}
        log.log(logging.DEBUG if quiet else logging.INFO, " ".join(
            f"{key}={_shown(value)}" for key, value in line.items()))


def _shown(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if _PLAIN_VALUE.fullmatch(text) else json.dumps(text)


def request_log(holder) -> RequestLog | None:
    """The RequestLog of a gRPC call (its servicer context) or an HTTP request (`request.state`);
    None when the call came in without the interceptor or middleware."""
    return getattr(holder, "request_log", None)


class RequestMetrics:
    """Requests by what was called and the status they ended with, and their durations:
    `kvedge_<protocol>_requests_total` and `kvedge_<protocol>_request_duration_seconds`."""

    def __init__(self, registry: CollectorRegistry, protocol: str, labels: tuple[str, str]):
        self.count = Counter(f"kvedge_{protocol}_requests", f"{protocol} requests by "
                             f"{labels[0]}, {labels[1]} and final status code", [*labels, "code"],
                             registry=registry)
        self.seconds = Histogram(f"kvedge_{protocol}_request_duration_seconds",
                                 f"{protocol} request durations (a stream's whole length)",
                                 list(labels), buckets=DURATION_BUCKETS, registry=registry)

    def observe(self, called: tuple[str, str], code: str, seconds: float) -> None:
        self.count.labels(*called, code).inc()
        self.seconds.labels(*called).observe(seconds)


# ---------------------------------------------------------------------- gRPC


class RequestInterceptor(grpc.ServerInterceptor):
    """Every call: a request id (sent back in trailing metadata), one log line when it ends,
    and with `metrics` its count and duration by final status code (for a streaming method,
    the status the stream ended with, not the one it started with)."""

    def __init__(self, metrics: RequestMetrics | None = None):
        self.metrics = metrics

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None:
            return None
        kind = next(k for k in _HANDLER_KINDS if getattr(handler, k) is not None)
        given = dict(details.invocation_metadata or ()).get(REQUEST_ID)
        call = _Call(details.method, request_id(given), self.metrics)
        return handler._replace(**{kind: call.wrap(getattr(handler, kind),
                                                   handler.response_streaming)})


class _Call:
    def __init__(self, path: str, rid: str, metrics: RequestMetrics | None):
        self.service, _, self.method = path.lstrip("/").rpartition("/")
        self.log, self.metrics = RequestLog(rid, path.lstrip("/")), metrics

    def wrap(self, behavior, streaming: bool):
        if streaming:
            def stream(request, context):
                ok, logged = False, self.begin(request, context)
                try:
                    yield from behavior(request, logged)
                    ok = True
                finally:  # also when the client goes away mid-stream (GeneratorExit)
                    self.end(context, ok)
            return stream

        def unary(request, context):
            ok, logged = False, self.begin(request, context)
            try:
                response = behavior(request, logged)
                ok = True
                return response
            finally:
                self.end(context, ok)
        return unary

    def begin(self, request, context) -> "_LoggedContext":
        context.set_trailing_metadata(((REQUEST_ID, self.log.id),))
        # a unary request names its namespace and KB; a request stream's handler notes them
        self.log.note(peer=context.peer(), namespace=getattr(request, "namespace", None),
                      kb=getattr(request, "kb", None))
        return _LoggedContext(context, self.log)

    def end(self, context, ok: bool) -> None:
        code = _final_code(context, ok).name
        self.log.write(code, quiet=self.service in QUIET)
        if self.metrics is not None:
            self.metrics.observe((self.service, self.method), code, self.log.seconds())


def _final_code(context, ok: bool) -> grpc.StatusCode:
    """What the client is told: the code abort()/set_code() set; else CANCELLED if it went
    away, OK if the handler returned, UNKNOWN (gRPC's code for an exception) if it raised."""
    code = context.code()
    if code is not None:
        return code
    if not context.is_active():
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.OK if ok else grpc.StatusCode.UNKNOWN


class _LoggedContext:
    """The servicer's context, carrying the call's RequestLog (`request_log(context)`)."""

    def __init__(self, context, log: RequestLog):
        self._context, self.request_log = context, log

    def __getattr__(self, name):
        return getattr(self._context, name)


# ---------------------------------------------------------------------- HTTP


class RequestLogMiddleware:
    """ASGI middleware, the HTTP twin of RequestInterceptor: a request id (`x-request-id`,
    also a response header), `request.state.request_log`, one log line when the response has
    ended, and with `metrics` counts by method, route template (not the path: bounded labels)
    and status."""

    def __init__(self, app, metrics: RequestMetrics | None = None):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or ()).get(REQUEST_ID.encode(), b"")
        req = RequestLog(request_id(given.decode("latin-1")), scope["method"])
        req.note(path=scope["path"], peer=":".join(map(str, scope.get("client") or ())))
        scope.setdefault("state", {})["request_log"] = req
        status = 500  # if the app raises before it starts a response

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), (REQUEST_ID.encode(), req.id.encode())]
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:  # a streamed response has ended here too
            req.write(status, quiet=scope["path"] in QUIET)
            if self.metrics is not None:
                method = scope["method"] if scope["method"] in HTTP_METHODS else "other"
                route = getattr(scope.get("route"), "path", "unmatched")
                self.metrics.observe((method, route), str(status), req.seconds())


# ---------------------------------------------------------------------- /metrics


class MetricsServer:
    """/metrics (`--metrics HOST:PORT`): prometheus_client's HTTP server over a daemon's
    registry on its own thread, over the daemon's TLS (and mutual TLS) when it has one, under
    the daemon's listen rule: plaintext off loopback only with `insecure`."""

    def __init__(self, address: str, registry: CollectorRegistry, tls: ServerTLS | None = None,
                 insecure: bool = False):
        from prometheus_client import start_http_server

        host, port = self.check(address, tls, insecure)
        ssl = {} if tls is None else {
            "certfile": str(tls.cert), "keyfile": str(tls.key),
            "client_cafile": str(tls.client_ca) if tls.client_ca else None,
            "client_auth_required": tls.client_ca is not None}
        self.server, self.thread = start_http_server(port, host, registry, **ssl)
        self.host, self.port = host, self.server.server_address[1]
        self.scheme = "http" if tls is None else "https"

    @staticmethod
    def check(address: str, tls: ServerTLS | None, insecure: bool) -> tuple[str, int]:
        """(host, port) of a good address; a daemon checks before its slow start-up."""
        _, colon, port = address.rpartition(":")
        if not (colon and port.isdigit()) or address.startswith("unix:"):
            raise InvalidRequest(f"--metrics takes HOST:PORT (e.g. 127.0.0.1:9090), got "
                                 f"{address!r}")
        check_listen(address, tls, insecure)
        return host_of(address) or "0.0.0.0", int(port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout)

