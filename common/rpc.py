"""gRPC plumbing shared by the gateway, the edge daemon and their clients.

Named kvedge errors become clear status codes on the server side and come back as the same
named errors on the client side, so a user sees "NotFound: no knowledge base 'x' ..." and not
a gRPC stack trace.
"""
from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path

import grpc

from kvedge.common import errors
from kvedge.common.auth import Principal, TokenStore, bearer

MAX_MESSAGE = 64 * 1024 * 1024
CHUNK = 1024 * 1024
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


def raise_remote(err: grpc.RpcError):
    """Client side: turn a failed call back into the named error it started as."""
    detail = err.details() or ""
    name, _, message = detail.partition(": ")
    known = named_errors()
    if name in known and known[name] is not errors.KvedgeError:
        raise _rebuilt(known[name], message) from None
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        raise RemoteError(f"service unavailable ({detail}); is it running?") from None
    raise RemoteError(f"{err.code().name}: {detail}") from None


def _rebuilt(cls: type[errors.KvedgeError], message: str) -> errors.KvedgeError:
    """The error with the message the server formatted (some errors format in __init__)."""
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


class RpcClient:
    """A channel to one service and the token its calls carry; a context manager."""

    def __init__(self, address: str, token: str | None):
        self.address, self.token = address, token
        self._channel = channel(address)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def metadata(token: str | None):
    return (("authorization", f"Bearer {token}"),) if token else ()


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=OPTIONS)


def read_token(explicit: str | None, default_file: Path) -> str | None:
    """--token, else $KVEDGE_TOKEN, else the token file a local service wrote."""
    if explicit:
        return explicit
    if os.environ.get("KVEDGE_TOKEN"):
        return os.environ["KVEDGE_TOKEN"]
    return default_file.read_text().strip() if default_file.exists() else None


def serve_grpc(add_servicers, address: str, services: list[str], max_workers: int = 8):
    """Start a gRPC server: `add_servicers(server)` registers the services, standard health
    checking reports `services` SERVING. Returns (server, bound port); OSError if it can't bind.
    The gateway and the edge daemon both start this way."""
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=OPTIONS)
    add_servicers(server)
    add_health(server, services)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind {address}")
    server.start()
    return server, port


def add_health(server: grpc.Server, services: list[str]):
    """Standard grpc.health.v1 checking; returns the servicer to flip statuses."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ["", *services]:
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return servicer


def wait_healthy(address: str, timeout: float = 60.0) -> None:
    """Block until the server at `address` answers SERVING (raises RemoteError on timeout)."""
    import time

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RemoteError(f"no healthy service at {address} after {timeout:.0f} s")
            time.sleep(0.2)
