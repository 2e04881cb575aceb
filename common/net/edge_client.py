"""Client of an edge daemon: ask a question, get the answer streamed, then its timings.

In common because kvctl (the cloud tier's CLI), the demo and the benchmark all ask edges."""
from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import grpc

from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.proto import kvedge_pb2_grpc as pb_grpc
from kvedge.common.net.rpc import RpcClient, metadata
from kvedge.common.net.tls import ClientTLS


class EdgeClient(RpcClient):
    def __init__(self, address: str, token: str | None, tls: ClientTLS | None = None):
        super().__init__(address, token, tls)
        self.stub = pb_grpc.EdgeStub(self._channel)

    def ask(self, namespace: str, kb: str, question: str, *, strategy: str = "", top_k: int = 0,
            max_new_tokens: int = 0, options: Mapping[str, object] | None = None,
            temperature: float = 0.0, top_p: float | None = None, seed: int | None = None,
            stop: Sequence[str] = (), timeout: float = 600) -> Iterator[str | pb.AskDone]:
        """Yield answer pieces (str) and finally the AskDone with timings. `options` are the
        strategy's, by name (values sent as strings; the edge checks and converts them).
        Greedy unless `temperature` > 0; None leaves top_p (1) and seed (unseeded) unset; the
        answer ends at the first `stop` string."""
        request = pb.AskRequest(namespace=namespace, kb=kb, question=question, strategy=strategy,
                                top_k=top_k, max_new_tokens=max_new_tokens,
                                options={k: str(v) for k, v in (options or {}).items()},
                                temperature=temperature, top_p=top_p, seed=seed, stop=stop)
        try:
            for event in self.stub.Ask(request, metadata=metadata(self.token), timeout=timeout):
                yield event.done if event.HasField("done") else event.text
        except grpc.RpcError as err:
            self.failed(err)
