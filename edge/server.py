"""The edge daemon's gRPC service: Ask (a server stream of answer pieces, then timings)."""
from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

from kvedge.common.net.auth import TokenStore, check_name, write_secret
from kvedge.common.errors import Cancelled, DeadlineExceeded
from kvedge.common.model.decoding import Sampler
from kvedge.common.net.metrics import request_log
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.proto import kvedge_pb2_grpc as pb_grpc
from kvedge.common.net.rpc import principal, rpc_errors, serve_grpc
from kvedge.common.net.tls import ServerTLS
from kvedge.edge import DEFAULT_STRATEGY
from kvedge.edge.engine import AskResult, EdgeEngine
from kvedge.edge.metrics import EdgeMetrics
from kvedge.edge.sync import Target

log = logging.getLogger("kvedge.edge")


class EdgeService(pb_grpc.EdgeServicer):
    def __init__(self, engine: EdgeEngine, tokens: TokenStore, *,
                 default_strategy: str = DEFAULT_STRATEGY,
                 top_k: int = 3, max_new_tokens: int = 48, metrics: EdgeMetrics | None = None):
        self.engine, self.tokens = engine, tokens
        self.metrics = metrics if metrics is not None else EdgeMetrics()
        self.default_strategy, self.top_k, self.max_new = default_strategy, top_k, max_new_tokens

    @rpc_errors
    def Ask(self, request, context):
        who = principal(self.tokens, context)  # before anything in the request is looked at
        ns = check_name("namespace", request.namespace or "default")
        who.require(ns)
        target = Target.in_namespace(ns, request.kb)  # "NAME" or "NAME@VARIANT"
        sampler = sampler_of(request)
        remaining = context.time_remaining()  # the client's deadline, None if it set none
        events = self.engine.ask(target, request.question,
                                 strategy=request.strategy or self.default_strategy,
                                 top_k=request.top_k or self.top_k,
                                 max_new_tokens=request.max_new_tokens or self.max_new,
                                 options=dict(request.options), sampler=sampler,
                                 stop=tuple(request.stop),  # checked by the engine
                                 deadline=None if remaining is None
                                 else time.monotonic() + remaining,
                                 alive=context.is_active)  # the scheduler drops it once gone
        try:
            for event in self.metrics.answers(events, request_log(context)):
                if not context.is_active():  # cancelled, or past the shutdown grace
                    return
                if isinstance(event, AskResult):
                    yield pb.AskEvent(done=_done(event))
                else:
                    yield pb.AskEvent(text=event)
        except (Cancelled, DeadlineExceeded):
            if context.is_active():
                raise  # our deadline, or the service stopping: the client hears which
            # else the client left, or gRPC already told it DEADLINE_EXCEEDED


def sampler_of(request: pb.AskRequest) -> Sampler:
    """The request's sampling fields (unset: greedy, top_p 1, unseeded); Sampler checks their
    ranges (out of range is InvalidRequest)."""
    return Sampler(request.temperature,
                   top_p=request.top_p if request.HasField("top_p") else 1.0,
                   seed=request.seed if request.HasField("seed") else None)


def serve(engine: EdgeEngine, state_dir: Path, address: str = "127.0.0.1:50052",
          syncer=None, sync_interval: float = 5.0, tls: ServerTLS | None = None,
          insecure: bool = False, metrics: EdgeMetrics | None = None, **service_options):
    """Start the daemon (and its sync loop: stop it with `syncer.stop()`); returns (server,
    port). Over TLS when `tls` is given; plaintext off loopback only if `insecure`. Writes an
    access token to <state_dir>/edge.token on first start. Calls and answers are recorded in
    `metrics` (its registry is what --metrics serves) when given."""
    tokens = TokenStore(Path(state_dir) / "tokens.json")
    token_file = Path(state_dir) / "edge.token"
    if not token_file.exists():
        write_secret(token_file, tokens.issue("edge-admin", ["*"]))
    service = EdgeService(engine, tokens, metrics=metrics, **service_options)
    # a handler thread per request the scheduler may hold, so that beyond it the client hears
    # RESOURCE_EXHAUSTED (Overloaded) instead of waiting unseen in gRPC's own queue
    server, port = serve_grpc(lambda srv: pb_grpc.add_EdgeServicer_to_server(service, srv),
                              address, ["kvedge.v1.Edge"], tls=tls, insecure=insecure,
                              registry=metrics.registry if metrics is not None else None,
                              max_workers=engine.scheduler.capacity + 8)
    if syncer is not None:
        syncer.start(sync_interval)
    return server, port


def _done(result: AskResult) -> pb.AskDone:
    """The final event on the wire: an Ask carries one question, not a conversation, so the
    conversation's counts (session reuse, dropped turns: always 0 here) are not sent."""
    fields = pb.AskDone.DESCRIPTOR.fields_by_name
    return pb.AskDone(**{k: v for k, v in asdict(result).items() if k in fields})
