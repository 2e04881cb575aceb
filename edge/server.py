"""The edge daemon's gRPC service: Ask (a server stream of answer pieces, then timings)."""
from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from kvedge.common.auth import TokenStore, check_name, write_secret
from kvedge.common.proto import kvedge_pb2 as pb
from kvedge.common.proto import kvedge_pb2_grpc as pb_grpc
from kvedge.common.rpc import principal, rpc_errors, serve_grpc
from kvedge.common.tls import ServerTLS
from kvedge.edge.engine import AskResult, EdgeEngine
from kvedge.edge.sync import Target

log = logging.getLogger("kvedge.edge")


class EdgeService(pb_grpc.EdgeServicer):
    def __init__(self, engine: EdgeEngine, tokens: TokenStore, *, default_strategy: str = "a3",
                 top_k: int = 3, max_new_tokens: int = 48):
        self.engine, self.tokens = engine, tokens
        self.default_strategy, self.top_k, self.max_new = default_strategy, top_k, max_new_tokens

    @rpc_errors
    def Ask(self, request, context):
        who = principal(self.tokens, context)  # before anything in the request is looked at
        ns = check_name("namespace", request.namespace or "default")
        who.require(ns)
        target = Target.in_namespace(ns, request.kb)  # "NAME" or "NAME@VARIANT"
        for event in self.engine.ask(target, request.question,
                                     strategy=request.strategy or self.default_strategy,
                                     top_k=request.top_k or self.top_k,
                                     max_new_tokens=request.max_new_tokens or self.max_new,
                                     options=dict(request.options)):
            if not context.is_active():  # cancelled, or past the shutdown grace: stop decoding
                return
            if isinstance(event, AskResult):
                yield pb.AskEvent(done=pb.AskDone(**asdict(event)))
            else:
                yield pb.AskEvent(text=event)


def serve(engine: EdgeEngine, state_dir: Path, address: str = "127.0.0.1:50052",
          syncer=None, sync_interval: float = 5.0, tls: ServerTLS | None = None,
          insecure: bool = False, **service_options):
    """Start the daemon (and its sync loop: stop it with `syncer.stop()`); returns (server,
    port). Over TLS when `tls` is given; plaintext off loopback only if `insecure`. Writes an
    access token to <state_dir>/edge.token on first start."""
    tokens = TokenStore(Path(state_dir) / "tokens.json")
    token_file = Path(state_dir) / "edge.token"
    if not token_file.exists():
        write_secret(token_file, tokens.issue("edge-admin", ["*"]))
    service = EdgeService(engine, tokens, **service_options)
    server, port = serve_grpc(lambda srv: pb_grpc.add_EdgeServicer_to_server(service, srv),
                              address, ["kvedge.v1.Edge"], tls=tls, insecure=insecure)
    if syncer is not None:
        syncer.start(sync_interval)
    return server, port
