"""gRPC plumbing shared by the gateway, the edge daemon and their clients.

Named kvedge errors become clear status codes on the server side and come back as the same
named errors on the client side, so a user sees "NotFound: no knowledge base 'x' ..." and not
a gRPC stack trace. Every server starts with `serve_grpc` and every channel opens with
`channel`, each taking an optional TLS config (`kvedge.common.net.tls`); a connection that fails
its TLS handshake comes back as a `TLSError` saying which side is wrong. `run_until_signal`
is how both daemons stop: gracefully, on SIGTERM or SIGINT.
"""
from __future__ import annotations

import functools
import inspect
import os
import signal
import threading
from pathlib import Path
from typing import Callable, Iterable

import grpc

from kvedge.common import errors
from kvedge.common.net.auth import Principal, TokenStore, bearer
from kvedge.common.net.tls import ClientTLS, ServerTLS, check_listen, handshake_error

MAX_MESSAGE = 64 * 1024 * 1024
CHUNK = 1024 * 1024
# FetchPack's messages: small enough that an edge decoding a pack as it arrives gets its
# layers a few at a time (a 256-token SmolLM2 int8 pack is ~3 MB over 30 layers, ~100 KB a
# layer; 1 MiB handed them out in three steps) and computes on them (`edge.arriving`); a
# message costs tens of µs, ~2 ms of wire at 1 Gbit/s
PACK_CHUNK = 256 * 1024
MAX_HEADS = 256  # packs' first bytes one FetchHeads call asks for at most
SHUTDOWN_GRACE = 10.0   # seconds calls in flight get to finish when a daemon stops
OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE),
           ("grpc.max_receive_message_length", MAX_MESSAGE)]


class RemoteError(errors.KvedgeError):
    """A call failed on the other side for a reason with no named kvedge error."""


def _status_of(err: Exception) -> grpc.StatusCode:
    return grpc.StatusCode[err.status] if isinstance(err, errors.KvedgeError) \
        else grpc.StatusCode.INTERNAL


def named_errors() -> dict[str, type[errors.KvedgeError]]:
    """Every KvedgeError subclass by name: what a failed call's detail can be raised as again.

    All of them are defined in kvedge.common (errors, auth, pack.errors, this module), which
    this module imports, so the table is complete without a hand-kept list."""
    import kvedge.common.pack.errors  # noqa: F401 - defines the pack errors

    found, todo = {}, [errors.KvedgeError]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo.extend(cls.__subclasses__())
    return found


def rpc_errors(method):
    """Servicer decorator: kvedge errors abort the call with their status and 'Type: message'."""
    def abort(context, err):
        code = _status_of(err)
        detail = f"{type(err).__name__}: {err}" if code != grpc.StatusCode.INTERNAL \
            else f"internal error: {type(err).__name__}: {err}"
        context.abort(code, detail)

    if inspect.isgeneratorfunction(method):
        @functools.wraps(method)
        def stream(self, request, context):
            try:
                yield from method(self, request, context)
            except Exception as err:  # noqa: BLE001 - every failure becomes a status
                if isinstance(err, grpc.RpcError) or context.code() is not None:
                    raise
                abort(context, err)
        return stream

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            return method(self, request, context)
        except Exception as err:  # noqa: BLE001
            if isinstance(err, grpc.RpcError) or context.code() is not None:
                raise
            abort(context, err)
    return unary


def principal(tokens: TokenStore, context) -> Principal:
    return tokens.check(bearer(context.invocation_metadata()))


def raise_remote(err: grpc.RpcError, address: str = "", tls: ClientTLS | None = None):
    """Client side: turn a failed call back into the named error it started as (a failed TLS
    handshake with the service at `address` becomes a TLSError)."""
    detail = err.details() or ""
    name, _, message = detail.partition(": ")
    known = named_errors()
    if name in known and known[name] is not errors.KvedgeError:
        raise _rebuilt(known[name], message) from None
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        tls_error = handshake_error(detail, address, tls) if address else None
        if tls_error is not None:
            raise tls_error from None
        raise RemoteError(f"service unavailable ({detail}); is it running?") from None
    raise RemoteError(f"{err.code().name}: {detail}") from None


def _rebuilt(cls: type[errors.KvedgeError], message: str) -> errors.KvedgeError:
    """The error with the message the server formatted (some errors format in __init__)."""
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


class RpcClient:
    """A channel to one service (over TLS when `tls` is given) and the token its calls carry;
    a context manager."""

    def __init__(self, address: str, token: str | None, tls: ClientTLS | None = None):
        self.address, self.token, self.tls = address, token, tls
        self._channel = channel(address, tls)

    def failed(self, err: grpc.RpcError):
        """Raise the named error a failed call stands for."""
        raise_remote(err, self.address, self.tls)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def metadata(token: str | None):
    return (("authorization", f"Bearer {token}"),) if token else ()


def channel(address: str, tls: ClientTLS | None = None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(address, options=OPTIONS)
    return grpc.secure_channel(address, tls.credentials(), options=OPTIONS)


def read_token(explicit: str | None, default_file: Path) -> str | None:
    """--token, else $KVEDGE_TOKEN, else the file $KVEDGE_TOKEN_FILE names (a mounted secret:
    containers, systemd credentials), else the token file a local service wrote."""
    if explicit:
        return explicit
    if os.environ.get("KVEDGE_TOKEN"):
        return os.environ["KVEDGE_TOKEN"]
    if os.environ.get("KVEDGE_TOKEN_FILE"):
        path = Path(os.environ["KVEDGE_TOKEN_FILE"])
        try:
            return path.read_text().strip()
        except OSError as err:
            raise errors.InvalidRequest(f"cannot read $KVEDGE_TOKEN_FILE {path}: "
                                        f"{err.strerror}") from None
    return default_file.read_text().strip() if default_file.exists() else None


def serve_grpc(add_servicers, address: str, services: list[str], max_workers: int = 8,
               tls: ServerTLS | None = None, insecure: bool = False, registry=None):
    """Start a gRPC server: `add_servicers(server)` registers the services, standard health
    checking reports `services` SERVING. Over TLS when `tls` is given; plaintext on a
    non-loopback address only if `insecure` (else InsecureListen). Every call gets a request
    id and a log line (`metrics.RequestInterceptor`), and is counted in `registry` (a
    prometheus CollectorRegistry) when given. Returns (server, bound port); OSError if it
    can't bind. The gateway and the edge daemon both start this way."""
    from concurrent import futures

    from kvedge.common.net.metrics import RequestInterceptor, RequestMetrics

    check_listen(address, tls, insecure)
    metrics = RequestMetrics(registry, "rpc", ("service", "method")) \
        if registry is not None else None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=OPTIONS,
                         interceptors=[RequestInterceptor(metrics), DecodeErrors()])
    add_servicers(server)
    add_health(server, services)
    port = server.add_secure_port(address, tls.credentials()) if tls else \
        server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind {address}")
    server.start()
    return server, port


class DecodeErrors(grpc.ServerInterceptor):
    """Request bytes that do not decode as the method's message are the caller's error,
    answered INVALID_ARGUMENT with a named InvalidRequest (gRPC's own answer is INTERNAL:
    'Exception deserializing request!')."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer

        def lenient(data):
            try:
                return parse(data)
            except Exception as err:  # noqa: BLE001 - whatever the bytes break, it is theirs
                return _Undecodable(err)

        kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                    if getattr(handler, k) is not None)
        return handler._replace(request_deserializer=lenient, **{
            kind: _refusing(getattr(handler, kind), handler.request_streaming)})


class _Undecodable:
    def __init__(self, error: Exception):
        self.error = error


def _refuse_undecodable(request, context):
    if isinstance(request, _Undecodable):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "InvalidRequest: the request is not "
                      f"a message of this method ({type(request.error).__name__}); send it "
                      "with a client built from kvedge.proto")
    return request


def _refusing(behavior, request_streaming: bool):
    """`behavior`, with an undecodable request (or one in a request stream) refused."""
    if request_streaming:
        return lambda requests, context: behavior(
            (_refuse_undecodable(r, context) for r in requests), context)
    return lambda request, context: behavior(_refuse_undecodable(request, context), context)


def add_health(server: grpc.Server, services: list[str]):
    """Standard grpc.health.v1 checking; returns the servicer to flip statuses."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ["", *services]:
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return servicer


def wait_healthy(address: str, timeout: float = 60.0, tls: ClientTLS | None = None) -> None:
    """Block until the server at `address` answers SERVING (raises RemoteError on timeout,
    TLSError at once when TLS is set up wrong on either side)."""
    import time

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with channel(address, tls) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as err:
                tls_error = handshake_error(err.details() or "", address, tls)
                if tls_error is not None:
                    raise tls_error from None
            if time.monotonic() > deadline:
                raise RemoteError(f"no healthy service at {address} after {timeout:.0f} s")
            time.sleep(0.2)


class StopSignal:
    """SIGTERM or SIGINT, caught as a request to stop. A daemon makes one first thing, so a stop
    asked for during start-up is kept (and start-up then ends in a clean stop), and calls
    `listen()` again after anything that installs handlers of its own (`ray.init` installs
    one that aborts on SIGTERM)."""

    def __init__(self):
        self._requested = threading.Event()
        self.listen()

    def listen(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._requested.set())

    def wait(self) -> None:
        while not self._requested.wait(1.0):
            pass


def run_until_signal(server: grpc.Server, stop: StopSignal, grace: float = SHUTDOWN_GRACE,
                     on_stop: Iterable[Callable[[], None]] = ()) -> None:
    """Serve until `stop` is signalled, then stop cleanly: new calls are refused, calls in
    flight get `grace` seconds to finish and are then cancelled, and only once the server has
    stopped does each `on_stop` run (stop the sync thread, Ray, ...). A daemon then exits 0;
    exiting with gRPC's threads still at work aborted ('terminate called without an active
    exception')."""
    stop.listen()
    stop.wait()
    server.stop(grace).wait()
    for step in on_stop:
        step()
