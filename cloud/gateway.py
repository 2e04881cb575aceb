"""The cloud gateway: uploads (resumable, content-hashed), catalog, ingest on Ray, pack fetch.

Upload protocol: the client sends the KB's file list with sha256s to PlanUpload and learns
which files the gateway lacks and from which offset to resume each; it then streams only those
chunks. Files are staged under the data dir (`cloud.staging`) and verified against their
sha256 before they count. Ingest runs in a background thread: segments → Ray prefill actors →
packs in the store → one catalog transaction. Bad input is rejected before anything reaches
the catalog or store. The batch-job calls are `cloud.jobs_service.JobsService`, mixed in.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from kvedge.cloud.catalog import BASE, Catalog, Prefilled
from kvedge.cloud.ingest import paragraphs, prefill_key
from kvedge.cloud.jobs import JobRunner
from kvedge.cloud.jobs_service import JobsService
from kvedge.cloud.staging import Staging
from kvedge.cloud.store import PackStore
from kvedge.common.net.auth import TokenStore, check_name, write_secret
from kvedge.common.errors import BadInput, NotFound
from kvedge.common.kbfiles import check_count, check_path, check_size, decode_text
from kvedge.common.model.models import DEFAULT_MODEL
from kvedge.common.pack.codecs import DEFAULT_CODEC
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.proto import kvedge_pb2_grpc as pb_grpc
from kvedge.common.net.metrics import request_log
from kvedge.common.net.rpc import CHUNK, MAX_HEADS, PACK_CHUNK, principal, rpc_errors, serve_grpc
from kvedge.common.net.tls import ServerTLS
from kvedge.common.pack.container import read_head

log = logging.getLogger("kvedge.gateway")
MIN_SEGMENT_TOKENS, MAX_SEGMENT_TOKENS = 16, 1 << 17  # a segment is cut to the model's context


@dataclass
class GatewayConfig:
    data_dir: Path
    store_url: str | None = None       # default: <data_dir>/store
    model: str = DEFAULT_MODEL
    segment_tokens: int = 512
    codec: str = DEFAULT_CODEC
    actors: int = 1
    cpus_per_actor: int = 1
    # prefill each segment behind the chat prefix, keeping only its KV (docs/design.md,
    # decision 9); off: anchored packs showed no gain over packs prefilled alone (docs/reuse.md)
    anchored: bool = False
    # SamKV's side tensors (the pooled local query, Eq. 1, and block summaries) in every pack:
    # off, because every upload paid for them — 43 KB a pack on Qwen2.5-0.5B (24 layers × 14
    # query heads × 64 × fp16) plus 6 KB per 64 tokens, 7 % of an int8+zstd upload of
    # HotpotQA paragraphs and ~15 % of a 4× codec's — for a strategy that is not the default.
    # Without them SamKV derives the summaries from the keys (as over evicted packs) and
    # scores without Eq. 1's local term, as its `bias=false` does: on SmolLM2, before the
    # paper fixes, that answered 4 of 100 questions against 2 with it (docs/reuse.md). On for
    # a gateway serving SamKV.
    side_tensors: bool = False

    def __post_init__(self):
        self.data_dir = Path(self.data_dir)
        if not MIN_SEGMENT_TOKENS <= self.segment_tokens <= MAX_SEGMENT_TOKENS:
            raise ValueError(f"segment_tokens must be in [{MIN_SEGMENT_TOKENS}, "
                             f"{MAX_SEGMENT_TOKENS}]")
        self.store_url = self.store_url or str(self.data_dir / "store")


class Gateway(JobsService, pb_grpc.CloudServicer):
    """Upload, catalog and fetch calls (batch jobs: JobsService)."""
    def __init__(self, config: GatewayConfig, pool):
        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self.catalog = Catalog(config.data_dir / "catalog.sqlite")
        self.catalog.fail_interrupted_ingests("interrupted: the gateway stopped during the "
                                              "ingest; upload again (files already sent are "
                                              "not sent again, segments already prefilled "
                                              "are not prefilled again)")
        self.store = PackStore(config.store_url)
        self.staging = Staging(config.data_dir / "staging")
        self.tokens = TokenStore(config.data_dir / "tokens.json")
        self.pool = pool
        self.jobs = JobRunner(self.catalog, self.store, pool, role="gateway")
        self._ingests: dict[tuple[str, str], threading.Thread] = {}
        self._lock = threading.Lock()
        self.bytes_served = 0  # by FetchPack, since start (cloud.metrics reports it)
        self.segments_prefilled = 0  # segments ingests prefilled, since start
        self.segments_reused = 0     # segments whose pack was held already (a resumed
        #                              ingest, an unchanged file): not prefilled again
        self._clean_up_after_a_stop()

    def _clean_up_after_a_stop(self) -> None:
        """Before serving: end the jobs whose process is gone (a killed gateway's, or a killed
        job process's), then delete from the store what no catalog entry references — packs
        and temporary files of ingests and jobs stopped before they published. Not while a
        job process runs a job (its packs are unpublished until it ends; a later start
        collects them), nor after ending a job an older kvedge recorded (its process could not
        be checked, so its packs may still be wanted)."""
        ended = self.jobs.end_abandoned()
        for job in ended:
            log.warning("job %s %s: %s", job.id, job.status, job.failures[-1]["error"])
        if any(not job.owner for job in ended):
            log.warning("unreferenced packs not collected: a job of an older kvedge was ended")
            return
        removed = self.catalog.sweep_packs(self.store.sweep)
        if removed is None:
            log.info("unreferenced packs not collected: a job process is running a job")
        for path in removed or []:
            log.info("removed %s from the store: no catalog entry references it", path)

    # ------------------------------------------------------------------ uploads

    def _authorized(self, context, namespace: str, name: str | None = None):
        """The caller's token covers `namespace`; checked before anything in the request is
        looked at, so a caller without a valid token learns nothing (not even a bad name)."""
        who = principal(self.tokens, context)
        check_name("namespace", namespace)
        if name is not None:
            check_name("knowledge base", name)
        who.require(namespace)
        if log := request_log(context):  # an Upload's names come in its stream
            log.note(namespace=namespace, kb=name)

    @rpc_errors
    def PlanUpload(self, request, context):
        self._authorized(context, request.namespace, request.kb)
        check_count(len(request.files))
        needs = []
        for f in request.files:
            offset = self.staging.offset(request.namespace, f.sha256)
            if offset is not None:
                needs.append(pb.FileNeed(sha256=f.sha256, offset=offset))
        return pb.UploadPlan(needs=needs)

    @rpc_errors
    def Upload(self, request_iterator, context):
        principal(self.tokens, context)  # no token, no reading of the stream
        first = next(request_iterator, None)
        if first is None or not first.HasField("header"):
            raise BadInput("an upload stream starts with its header")
        header = first.header
        ns, name = header.namespace, header.kb
        self._authorized(context, ns, name)
        check_count(len(header.files))
        files = {check_path(f.path): (f.sha256, check_size(f.path, f.size))
                 for f in header.files}
        if not files:
            raise BadInput("the knowledge base has no files (empty folder?)")
        sizes = {sha: size for sha, size in files.values()}
        received = 0
        for msg in request_iterator:
            chunk = msg.chunk
            if chunk.sha256 not in sizes:
                raise BadInput(f"chunk for a file not in the header: {chunk.sha256[:12]}…")
            received += self.staging.write(ns, chunk.sha256, chunk.offset, chunk.data,
                                           sizes[chunk.sha256])
        for sha, size in sizes.items():  # an empty file arrives without a chunk
            if size == 0 and self.staging.offset(ns, sha) is not None:
                received += self.staging.write(ns, sha, 0, b"", 0)
        missing = [p for p, (sha, _) in files.items() if self.staging.offset(ns, sha) is not None]
        if missing:
            raise BadInput(f"upload incomplete, {len(missing)} file(s) missing (e.g. "
                           f"{missing[0]}): run the upload again to resume")
        self._start_ingest(ns, name, files, self._texts(ns, files), header.options)
        return pb.UploadReply(namespace=ns, kb=name, files_received=received,
                              files_skipped=len(files) - received, status="ingesting")

    def _texts(self, ns: str, files: dict[str, tuple[str, int]]) -> dict[str, str]:
        """The staged files as text. A file that is not UTF-8 text can never be ingested: it
        leaves staging as it is refused."""
        texts = {}
        for path, (sha, _) in files.items():
            try:
                texts[path] = decode_text(path, self.staging.read(ns, sha))
            except BadInput:
                self.staging.discard(ns, sha)
                raise
        if not any(paragraphs(text) for text in texts.values()):
            raise BadInput("the knowledge base has no text (every file is empty)")
        return texts

    def _start_ingest(self, ns, name, files, texts, options):
        with self._lock:
            running = self._ingests.get((ns, name))
            if running is not None and running.is_alive():
                raise BadInput(f"{name!r} is still being ingested; wait for it to finish")
            whole = options.whole
            seg_tokens = options.segment_tokens or self.config.segment_tokens
            if not MIN_SEGMENT_TOKENS <= seg_tokens <= MAX_SEGMENT_TOKENS:
                raise BadInput(f"segment_tokens must be in [{MIN_SEGMENT_TOKENS}, "
                               f"{MAX_SEGMENT_TOKENS}], got {seg_tokens}")
            codec = options.codec or self.config.codec
            from kvedge.common.pack.codecs import get_codec

            get_codec(codec)  # an unknown codec is the client's error, now, not the worker's
            self.catalog.begin_ingest(ns, name, files, mode="whole" if whole else "rag",
                                      segment_tokens=seg_tokens, codec=codec)
            thread = threading.Thread(target=self._ingest, name=f"ingest-{ns}-{name}",
                                      args=(ns, name, texts, seg_tokens, whole, codec), daemon=True)
            self._ingests[(ns, name)] = thread
            thread.start()

    def _ingest(self, ns, name, texts, seg_tokens, whole, codec):
        from kvedge.cloud.workers import install_transforms

        stored: list[str] = []
        try:
            identity = self.pool.identity()
            segments = self.pool.segment(texts, seg_tokens, whole)
            keys = {s.index: prefill_key(identity, ns, codec, self.config.anchored, s.token_ids,
                                         self.config.side_tensors) for s in segments}
            held = self.catalog.held(ns, name, keys, self.store.exists)
            rows = [held[s.index].record(s.index, s.source) for s in segments if s.index in held]
            todo = [s for s in segments if s.index not in held]
            self.segments_reused += len(rows)
            if rows:
                log.info("ingest of %s/%s: %d of %d segments already prefilled", ns, name,
                         len(rows), len(segments))
            self.catalog.set_progress(ns, name, BASE, "ingesting", done=len(rows),
                                      total=len(segments))
            encoded = self.pool.encode_all(todo, ns, codec, anchored=self.config.anchored,
                                           side_tensors=self.config.side_tensors)
            for done, enc in enumerate(encoded, len(rows) + 1):
                install_transforms(enc)
                self.store.put(enc.pack_id, enc.data)
                stored.append(enc.pack_id)
                pack = Prefilled(enc.pack_id, len(enc.data), enc.n_tokens)
                self.catalog.remember(ns, name, keys[enc.index], pack)
                self.segments_prefilled += 1
                rows.append(pack.record(enc.index, segments[enc.index].source))
                self.catalog.set_progress(ns, name, BASE, "ingesting", done=done,
                                          total=len(segments))
            rows.sort(key=lambda s: s.idx)
            for orphan in self.catalog.publish(ns, name, BASE, rows,
                                               model_fingerprint=identity["fingerprint"],
                                               kv_shape=identity["kv_shape"]):
                self.store.delete(orphan)
            log.info("ingested %s/%s: %d segments", ns, name, len(rows))
        except Exception as err:  # noqa: BLE001 - recorded for the user, packs cleaned up
            log.exception("ingest of %s/%s failed", ns, name)
            for pack in stored:  # those `remember`ed stay, for the upload that retries it
                if not self.catalog.referenced(pack):
                    self.store.delete(pack)
            err = getattr(err, "cause", None) or err  # a worker's own error, not Ray's wrapper
            try:
                self.catalog.set_progress(ns, name, BASE, "failed",
                                          error=f"{type(err).__name__}: {err}")
            except NotFound:
                pass

    def ingesting(self) -> list[tuple[str, str]]:
        """The KBs being ingested now, as (namespace, name)."""
        with self._lock:
            return [key for key, thread in self._ingests.items() if thread.is_alive()]

    # ------------------------------------------------------------------ catalog

    def _info(self, ns: str, name: str, variant: str = BASE, etag: str = "") -> pb.KBInfo:
        # the etag read before the record: a change between the two shows at the next poll
        etag = etag or self.catalog.version(ns, name, variant)
        rec = self.catalog.get(ns, name, variant)
        status = rec.variants[variant]
        return pb.KBInfo(
            namespace=ns, kb=name, status=status["status"], error=status["error"],
            model_fingerprint=rec.model_fingerprint, n_files=len(rec.files),
            n_tokens=rec.n_tokens, mode=rec.mode, updated=status["updated"], variant=variant,
            variants=sorted(rec.variants), segments_done=status["done"],
            segments_total=status["total"], etag=etag,
            segments=[pb.SegmentInfo(index=s.idx, pack_id=s.pack_id, pack_bytes=s.pack_bytes,
                                     n_tokens=s.n_tokens, source=s.source,
                                     fp16_bytes=rec.kv_shape.fp16_bytes(s.n_tokens))
                      for s in rec.segments])

    @rpc_errors
    def GetKB(self, request, context):
        """The KB's listing; only its etag while it still equals the caller's if_none_match
        (an edge polls every few seconds, and a 20,000-segment listing is megabytes)."""
        self._authorized(context, request.namespace, request.kb)
        etag = self.catalog.version(request.namespace, request.kb, request.variant)
        if etag == request.if_none_match:
            return pb.KBInfo(namespace=request.namespace, kb=request.kb,
                             variant=request.variant, etag=etag, not_modified=True)
        return self._info(request.namespace, request.kb, request.variant, etag)

    @rpc_errors
    def ListKBs(self, request, context):
        who = principal(self.tokens, context)  # first, like _authorized
        if request.namespace:
            check_name("namespace", request.namespace)
            who.require(request.namespace)
        allowed = [request.namespace] if request.namespace else None
        return pb.ListKBsReply(kbs=[self._info(ns, name) for ns, name in
                                    self.catalog.names(allowed) if who.may_read(ns)])

    @rpc_errors
    def RemoveKB(self, request, context):
        self._authorized(context, request.namespace, request.kb)
        with self._lock:
            running = self._ingests.get((request.namespace, request.kb))
            if running is not None and running.is_alive():
                raise BadInput(f"{request.kb!r} is being ingested; remove it when that finishes")
            for pack in self.catalog.remove(request.namespace, request.kb):
                self.store.delete(pack)
        return pb.RemoveReply(removed=True)

    @rpc_errors
    def FetchPack(self, request, context):
        self._authorized(context, request.namespace)
        if request.namespace not in self.catalog.pack_namespaces(request.pack_id):
            raise NotFound(f"no pack {request.pack_id[:16]}… in namespace {request.namespace!r}")
        total = self.store.size(request.pack_id)
        offset = request.offset
        if not 0 <= offset <= total:
            raise BadInput(f"offset {offset} is outside the pack's {total} bytes")
        if request.length < 0:
            raise BadInput(f"length {request.length} is negative (0 reads to the end)")
        # [offset, offset + length): an edge reads a pack's header and manifest alone
        end = min(total, offset + request.length) if request.length else total
        while offset < end:
            data = self.store.read(request.pack_id, offset, min(PACK_CHUNK, end - offset))
            yield pb.PackChunk(offset=offset, data=data, total=total)
            with self._lock:
                self.bytes_served += len(data)
            offset += len(data)

    @rpc_errors
    def FetchHeads(self, request, context):
        """Each pack's header and manifest, in the order asked: what an edge's sync reads of
        every pack of a KB it serves on demand, in one call per MAX_HEADS packs instead of a
        ranged FetchPack each (~1.8 ms of wall time a call: a 20,000-segment sync took 36 s).
        Every pack must be in the namespace; the first that is not ends the call."""
        self._authorized(context, request.namespace)
        if len(request.pack_ids) > MAX_HEADS:
            raise BadInput(f"{len(request.pack_ids)} packs asked at once; at most {MAX_HEADS}")
        for pack_id in request.pack_ids:
            if request.namespace not in self.catalog.pack_namespaces(pack_id):
                raise NotFound(f"no pack {pack_id[:16]}… in namespace {request.namespace!r}")
            total = self.store.size(pack_id)
            head = read_head(lambda offset, length, pid=pack_id: self.store.read(
                pid, offset, min(length, total - offset)))
            with self._lock:
                self.bytes_served += len(head)
            yield pb.PackHead(pack_id=pack_id, data=head, total=total)

    @rpc_errors
    def FetchTransform(self, request, context):
        """A kvtc transform file by its blake3, in chunks, from this machine's transforms
        folder (where the workers calibrate it); the edge checks the bytes against the digest.

        A transform is model-level data: fitted on the model alone over a fixed text
        (`calibrate.CALIBRATION_TEXT`, never a knowledge base's), it holds nothing of any
        namespace, and one file serves every namespace's packs. So it is not checked against
        the namespace's packs, but the call still names a namespace its token must cover, the
        one rule of every Cloud call (tests/test_tls.py holds each RPC to it): the edge asks
        in the namespace of the KB whose packs named it."""
        self._authorized(context, request.namespace)
        from kvedge.common.pack.codecs.kvtc import default_store

        store = default_store()
        if not store.has(request.digest):
            raise NotFound(f"no kvtc transform {request.digest[:16]}… in the gateway's "
                           f"{store.root}: its packs were encoded where the gateway cannot "
                           "read it (a Ray worker on another machine?); copy the file there, "
                           "or re-encode the KB with kvtc's embed=true")
        data = store.path(request.digest).read_bytes()
        for offset in range(0, len(data), CHUNK):
            yield pb.PackChunk(offset=offset, data=data[offset: offset + CHUNK], total=len(data))


def serve(config: GatewayConfig, address: str = "127.0.0.1:50051", pool=None,
          max_workers: int = 8, tls: ServerTLS | None = None, insecure: bool = False,
          registry=None):
    """Start the gateway (over TLS when `tls` is given; plaintext off loopback only if
    `insecure`); returns (grpc server, gateway, bound port). Writes an admin token to
    <data_dir>/admin.token on first start. With `registry` (a prometheus CollectorRegistry)
    its calls and `cloud.metrics` are recorded there."""
    from kvedge.cloud.metrics import GatewayMetrics
    from kvedge.cloud.workers import PrefillPool

    gateway = Gateway(config, pool or PrefillPool(config.model, config.actors,
                                                  config.cpus_per_actor))
    admin = config.data_dir / "admin.token"
    if not admin.exists():
        write_secret(admin, gateway.tokens.issue("admin", ["*"]))
    if registry is not None:
        registry.register(GatewayMetrics(gateway))
    server, port = serve_grpc(lambda srv: pb_grpc.add_CloudServicer_to_server(gateway, srv),
                              address, ["kvedge.v1.Cloud"], max_workers, tls, insecure,
                              registry)
    return server, gateway, port


def serve_local(config: GatewayConfig, **serve_kw):
    """A gateway in this process on a free loopback port, Ray started for 2 CPUs (or joined):
    (server, gateway, address, admin token) — the benchmark's and the tests' cloud. `serve_kw`
    go to `serve` (pool=, tls=, registry=)."""
    from kvedge.cloud.workers import start_ray

    start_ray(num_cpus=2)
    server, gateway, port = serve(config, "127.0.0.1:0", **serve_kw)
    return (server, gateway, f"127.0.0.1:{port}",
            (config.data_dir / "admin.token").read_text().strip())
