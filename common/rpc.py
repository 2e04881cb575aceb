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
from kvedge.common.auth import (InvalidName, PermissionDenied, Principal, TokenStore,
                                Unauthenticated, bearer)

MAX_MESSAGE = 64 * 1024 * 1024
CHUNK = 1024 * 1024
OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE),
           ("grpc.max_receive_message_length", MAX_MESSAGE)]


class RemoteError(errors.KvedgeError):
    """A call failed on the other side for a reason with no named kvedge error."""


def _status_of(err: Exception) -> grpc.StatusCode:
    from kvedge.cloud.catalog import NotFound
    from kvedge.common.pack.errors import PackError

    table = [(Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
             (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
             (NotFound, grpc.StatusCode.NOT_FOUND),
             (errors.InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
             (errors.ModelMismatch, grpc.StatusCode.FAILED_PRECONDITION),
             (PackError, grpc.StatusCode.DATA_LOSS)]
    for types, code in table:
        if isinstance(err, types):
            return code
    return grpc.StatusCode.FAILED_PRECONDITION if isinstance(err, errors.KvedgeError) \
        else grpc.StatusCode.INTERNAL


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
    from kvedge.cloud.catalog import NotFound
    from kvedge.cloud.ingest import BadInput
    from kvedge.common.pack.errors import PackCorrupt

    detail = err.details() or ""
    name, _, message = detail.partition(": ")
    from kvedge.edge.strategies import UnknownStrategy

    known = {c.__name__: c for c in (Unauthenticated, PermissionDenied, NotFound, InvalidName,
                                     BadInput, errors.UnknownModel, errors.ModelMismatch,
                                     PackCorrupt, UnknownStrategy)}
    if name in known:
        raise known[name](message) from None
    if err.code() == grpc.StatusCode.UNAVAILABLE:
        raise RemoteError(f"service unavailable ({detail}); is it running?") from None
    raise RemoteError(f"{err.code().name}: {detail}") from None


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
