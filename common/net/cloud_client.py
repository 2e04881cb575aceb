"""Client of the cloud gateway: resumable uploads, catalog calls, resumable pack fetch,
kvtc transform fetch.

In common because both kvctl (uploads, jobs) and the edge's syncer (catalog, pack and
transform fetch) use it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import grpc

from kvedge.common.errors import BadInput, DeadlineExceeded, Stalled
from kvedge.common.kbfiles import scan_folder
from kvedge.common.pack.codecs import DEFAULT_CODEC
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.proto import kvedge_pb2_grpc as pb_grpc
from kvedge.common.net.rpc import CHUNK, RpcClient, metadata
from kvedge.common.net.tls import ClientTLS

DEADLINE = 60.0
STALL_S = 600.0  # wait_ready: no progress for this long ends the wait (Stalled)


@dataclass(frozen=True)
class UploadResult:
    files_received: int      # files sent in this upload
    files_skipped: int       # files the gateway already had, unchanged
    ignored: list[str]       # files that are not .txt/.md, not uploaded
    status: str


class CloudClient(RpcClient):
    def __init__(self, address: str, token: str | None, tls: ClientTLS | None = None):
        super().__init__(address, token, tls)
        self.stub = pb_grpc.CloudStub(self._channel)

    def _call(self, method, request, timeout=DEADLINE):
        try:
            return method(request, metadata=metadata(self.token), timeout=timeout)
        except grpc.RpcError as err:
            self.failed(err)

    def upload(self, folder: Path | str, namespace: str, kb: str, *, segment_tokens: int = 0,
               whole: bool = False, codec: str = "", chunk_size: int = CHUNK,
               progress: Callable[[int, int], None] | None = None) -> "UploadResult":
        """Upload a folder's .txt/.md files; unchanged files are skipped, a broken upload
        resumes where it was. progress(bytes_sent, bytes_to_send) is called after every chunk.
        """
        files, skipped = scan_folder(folder)
        entries = [pb.FileEntry(path=f.path, sha256=f.sha256, size=f.size) for f in files]
        plan = self._call(self.stub.PlanUpload,
                          pb.UploadPlanRequest(namespace=namespace, kb=kb, files=entries))
        needs = {n.sha256: n.offset for n in plan.needs}
        todo = {f.sha256: f for f in files if f.sha256 in needs}.values()
        total = sum(f.size - needs[f.sha256] for f in todo)

        def stream() -> Iterator[pb.UploadChunk]:
            yield pb.UploadChunk(header=pb.UploadHeader(
                namespace=namespace, kb=kb, files=entries,
                options=pb.IngestOptions(segment_tokens=segment_tokens, whole=whole, codec=codec)))
            sent = 0
            for f in todo:
                data = f.full.read_bytes()
                for offset in range(needs[f.sha256], f.size, chunk_size):
                    piece = data[offset:offset + chunk_size]
                    yield pb.UploadChunk(chunk=pb.FileChunk(sha256=f.sha256, offset=offset,
                                                            data=piece))
                    sent += len(piece)
                    if progress:
                        progress(sent, total)

        reply = self._call(self.stub.Upload, stream(), timeout=600)
        return UploadResult(reply.files_received, reply.files_skipped, skipped, reply.status)

    def get_kb(self, namespace: str, kb: str, variant: str = "",
               if_none_match: str = "") -> pb.KBInfo:
        """The KB's listing; with `if_none_match` (an etag from an earlier reply) only
        `not_modified` and the etag while the KB has not changed."""
        return self._call(self.stub.GetKB, pb.KBRef(namespace=namespace, kb=kb, variant=variant,
                                                    if_none_match=if_none_match))

    def list_kbs(self, namespace: str = "") -> list[pb.KBInfo]:
        return list(self._call(self.stub.ListKBs, pb.ListKBsRequest(namespace=namespace)).kbs)

    def remove_kb(self, namespace: str, kb: str) -> bool:
        return self._call(self.stub.RemoveKB, pb.KBRef(namespace=namespace, kb=kb)).removed

    def fetch_pack(self, namespace: str, pack_id: str, offset: int = 0,
                   length: int = 0) -> Iterator[pb.PackChunk]:
        """Stream a pack from `offset` (resume a broken transfer by passing what you hold),
        `length` bytes of it (fewer where the pack ends first; 0: to its end)."""
        try:
            yield from self.stub.FetchPack(
                pb.FetchPackRequest(namespace=namespace, pack_id=pack_id, offset=offset,
                                    length=length),
                metadata=metadata(self.token), timeout=600)
        except grpc.RpcError as err:
            self.failed(err)

    def fetch_heads(self, namespace: str, pack_ids: list[str]) -> Iterator[pb.PackHead]:
        """Each pack's header and manifest, in order (at most rpc.MAX_HEADS a call).
        NotImplementedError where the gateway predates the call."""
        try:
            yield from self.stub.FetchHeads(
                pb.FetchHeadsRequest(namespace=namespace, pack_ids=pack_ids),
                metadata=metadata(self.token), timeout=600)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise NotImplementedError("the gateway has no FetchHeads") from None
            self.failed(err)

    def fetch_transform(self, namespace: str, digest: str) -> bytes:
        """A kvtc transform file's bytes, as sent (asked in the namespace of a KB whose packs
        name it): the caller checks them against `digest` (`TransformStore.add`)."""
        try:
            return b"".join(chunk.data for chunk in self.stub.FetchTransform(
                pb.FetchTransformRequest(namespace=namespace, digest=digest),
                metadata=metadata(self.token), timeout=600))
        except grpc.RpcError as err:
            self.failed(err)

    def wait_ready(self, namespace: str, kb: str, timeout: float | None = None,
                   progress: Callable[[pb.KBInfo], None] | None = None,
                   stall: float = STALL_S) -> pb.KBInfo:
        """Poll until the KB's base variant is ready. Ends on failure (BadInput with the
        ingest's error), after `stall` seconds without progress (Stalled: no change in its
        status, segments done or update time) or past `timeout` seconds in all
        (DeadlineExceeded; default none: a large KB takes as long as its segments take)."""
        import time

        start = last = time.monotonic()
        seen = None
        while True:
            info = self.get_kb(namespace, kb)
            if progress:
                progress(info)
            if info.status == "ready":
                return info
            if info.status == "failed":
                raise BadInput(f"ingest of {kb!r} failed: {info.error}")
            now, mark = time.monotonic(), (info.status, info.segments_done, info.updated)
            if mark != seen:
                seen, last = mark, now
            where = (f"status {info.status}, {info.segments_done}/{info.segments_total} "
                     "segments")
            if now - last > stall:
                raise Stalled(f"{kb!r} made no progress for {stall:.0f} s ({where}); the "
                              f"gateway's log says why; `kvctl kb status {kb}` shows where it "
                              "stands")
            if timeout is not None and now - start > timeout:
                raise DeadlineExceeded(f"{kb!r} not ready after {timeout:.0f} s ({where}); "
                                       "the ingest goes on in the gateway")
            time.sleep(0.3)

    # ------------------------------------------------------------------ batch jobs

    def submit_job(self, namespace: str, kbs: list[str], method: str, budget: float,
                   codec: str = DEFAULT_CODEC) -> pb.JobInfo:
        return self._call(self.stub.SubmitJob, pb.JobRequest(namespace=namespace, kbs=kbs,
                                                             method=method, budget=budget,
                                                             codec=codec))

    def get_job(self, namespace: str, job_id: str) -> pb.JobInfo:
        return self._call(self.stub.GetJob, pb.JobRef(namespace=namespace, job_id=job_id))

    def list_jobs(self, namespace: str = "") -> list[pb.JobInfo]:
        return list(self._call(self.stub.ListJobs, pb.JobsRequest(namespace=namespace)).jobs)

    def cancel_job(self, namespace: str, job_id: str) -> pb.JobInfo:
        return self._call(self.stub.CancelJob, pb.JobRef(namespace=namespace, job_id=job_id))

    def watch_job(self, namespace: str, job_id: str) -> Iterator[pb.JobInfo]:
        """The job's state each time it changes, until it ends."""
        try:
            yield from self.stub.WatchJob(pb.JobRef(namespace=namespace, job_id=job_id),
                                          metadata=metadata(self.token), timeout=24 * 3600)
        except grpc.RpcError as err:
            self.failed(err)
