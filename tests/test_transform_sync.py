"""kvtc transforms reach the edge: a KB ingested with `kvtc:embed=false` by a real gateway on
loopback, an edge whose home holds no transform, its real Syncer — the transform arrives over
FetchTransform, verified, and an answer decodes; a tampered one is refused, nothing installed.

The gateway prefills in-process (`kvedge.cloud.workers.LocalPool`: the Ray layer is a thin shim), so
cloud and edge share this process and each gets its own KVEDGE_HOME. A tiny random model and
a short calibration text keep it fast. Which transforms a pack needs is read from its
manifest, under any stage (the last test).
"""
import pytest
import torch
from click.testing import CliRunner

from kvedge.apps.kvctl import kvctl
from kvedge.cloud.gateway import GatewayConfig, serve
from kvedge.cloud.workers import PrefillEngine
from kvedge.common.net.auth import PermissionDenied, Unauthenticated
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.net.edge_client import EdgeClient
from kvedge.common.errors import NotFound
from kvedge.common.pack.codecs import get_codec
from kvedge.common.pack.codecs.kvtc import (TransformStore, default_store, fit, fit_transform,
                                            referenced_transforms)
from kvedge.common.pack.container import read_manifest
from kvedge.common.pack.context import KVContext
from kvedge.common.pack.errors import TransformMismatch, TransformMissing
from kvedge.common.pack.format import encode_pack, read_pack
from kvedge.edge.engine import EdgeEngine
from kvedge.edge.packcache import PackCache
from kvedge.edge.server import serve as serve_edge
from kvedge.edge.sync import Syncer, Target
from kvedge.cloud.workers import LocalPool

MODEL = "tiny-llama"
TARGET = Target("default", "lean")
DOCS = {"alpha.md": "# Alpha\n\nThe alpha code is 1234567.\n\nAlpha has a harbour.\n",
        "beta.md": "# Beta\n\nThe beta code is 7654321.\n\nBeta has a bridge.\n"}


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    """A gateway whose KVEDGE_HOME holds the transform it calibrated for the lean KB."""
    home, data = tmp_path_factory.mktemp("cloud_home"), tmp_path_factory.mktemp("cloud")
    folder = tmp_path_factory.mktemp("kb")
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVEDGE_HOME", str(home))
        mp.setattr(fit, "CALIBRATION_TEXT", fit.CALIBRATION_TEXT[:600])  # test speed
        engine = PrefillEngine(MODEL)
        server, gateway, port = serve(GatewayConfig(data, model=MODEL, segment_tokens=48),
                                      "127.0.0.1:0", pool=LocalPool(engine))
        address, token = f"127.0.0.1:{port}", (data / "admin.token").read_text().strip()
        with CloudClient(address, token) as c:
            c.upload(folder, "default", "lean", codec="kvtc:bits=2,embed=false")
            c.wait_ready("default", "lean", timeout=120)
        store = TransformStore(home / "transforms")
        yield {"address": address, "token": token, "gateway": gateway, "loaded": engine.loaded,
               "store": store, "digest": store.for_model(engine.loaded.fingerprint)}
        server.stop(0)


def edge_syncer(cloud, client, state, target=TARGET):
    """An edge's syncer installing into its own (empty) transforms folder."""
    loaded = cloud["loaded"]
    cache = PackCache(state / "packs", loaded.fingerprint)
    return Syncer(client, cache, state, [target], loaded.tokenizer.decode,
                  transforms=TransformStore(state / "home" / "transforms"))


def test_sync_fetches_the_missing_transform_and_an_answer_decodes(cloud, tmp_path, monkeypatch):
    digest, state = cloud["digest"], tmp_path / "edge"
    with CloudClient(cloud["address"], cloud["token"]) as c:
        syncer = edge_syncer(cloud, c, state)
        assert digest and not syncer.transforms.has(digest)
        assert syncer.sync_once()["default/lean"] > 0
        assert syncer.transforms.path(digest).read_bytes() == \
            cloud["store"].path(digest).read_bytes()
        local = syncer.local(TARGET)
        assert local["transforms"] == [digest]  # every pack names it: embed=false
        assert syncer.sync_once() == {"default/lean": 0}  # up to date, transform included
    pack = syncer.cache.path(local["segments"][0]["pack_id"]).read_bytes()
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(TransformMissing):  # what the edge met before: the pack needs the file
        read_pack(pack)
    monkeypatch.setenv("KVEDGE_HOME", str(state / "home"))  # the decoder's folder: the edge's
    engine = EdgeEngine(cloud["loaded"], syncer.cache, state)
    try:
        done = list(engine.ask(TARGET, "What is the alpha code?", top_k=2, max_new_tokens=2))[-1]
    finally:
        engine.close()
    assert done.tokens > 0 and len(done.segments) == 2


@pytest.mark.parametrize("method, codec", [("contrastkv", "kvtc:bits=3"),
                                           ("kvzip", "kvtc:bits=3,embed=false")])
def test_a_kvtc_job_variant_is_synced_served_and_asked_over_grpc(cloud, tmp_path, monkeypatch,
                                                                 method, codec):
    """`kvctl job submit --method M --budget 0.2 --codec kvtc...` (issue 12): the job's
    variant, named with its codec spec as written, reaches an edge holding no transform
    (fetched where the packs name it: embed=false) and answers over gRPC."""
    result = CliRunner().invoke(kvctl, ["job", "submit", "--kb", "lean", "--method", method,
                                        "--budget", "0.2", "--codec", codec,
                                        "--cloud", cloud["address"], "--token", cloud["token"]])
    variant = f"{method}-0.2-{codec}"
    assert result.exit_code == 0 and f"variant {variant}" in result.output, result.output
    target, state = Target.parse(f"lean@{variant}"), tmp_path / "edge"
    with CloudClient(cloud["address"], cloud["token"]) as c:
        syncer = edge_syncer(cloud, c, state, target)
        assert syncer.sync_once()[target.key] > 0
    embedded = "embed=false" not in codec
    local = syncer.local(target)
    assert local["transforms"] == ([] if embedded else [cloud["digest"]])
    for seg in local["segments"]:
        manifest = read_manifest(syncer.cache.path(seg["pack_id"]).read_bytes())
        assert {e.codec for n, e in manifest.tensors.items() if n[:2] in ("k.", "v.")} == {"kvtc"}
    monkeypatch.setenv("KVEDGE_HOME", str(state / "home"))  # the decoder's folder: the edge's
    engine = EdgeEngine(cloud["loaded"], syncer.cache, state)
    server, port = serve_edge(engine, state, "127.0.0.1:0")
    try:
        with EdgeClient(f"127.0.0.1:{port}", (state / "edge.token").read_text().strip()) as e:
            done = list(e.ask("default", f"lean@{variant}", "What is the alpha code?",
                              top_k=2, max_new_tokens=2))[-1]
    finally:
        server.stop(0)
        engine.close()
    assert done.tokens == 2 and done.bytes_loaded > 0  # tiny model: no bytes claim (16-dim heads)


def test_a_tampered_transform_is_refused_and_nothing_is_installed(cloud, tmp_path):
    path = cloud["store"].path(cloud["digest"])
    good = path.read_bytes()
    bad = bytearray(good)
    bad[-5] ^= 0xFF
    path.write_bytes(bytes(bad))
    try:
        with CloudClient(cloud["address"], cloud["token"]) as c:
            syncer = edge_syncer(cloud, c, tmp_path / "edge")
            with pytest.raises(TransformMismatch, match="do not hash to its name"):
                syncer.sync_once()
    finally:
        path.write_bytes(good)
    folder = syncer.transforms.root
    assert not folder.exists() or not any(folder.iterdir())  # not even a temporary file
    assert syncer.local(TARGET) is None  # the engine never sees a KB it cannot decode


def test_a_transform_is_read_with_a_token_for_some_namespace_and_nothing_else_is(cloud):
    """Model-level data: one file for every namespace's packs; the call names a namespace
    its token covers, as every Cloud call does."""
    digest = cloud["digest"]
    tenant = cloud["gateway"].tokens.issue("tenant-b", ["tenant-b"])  # holds no lean KB
    with CloudClient(cloud["address"], tenant) as c:
        assert c.fetch_transform("tenant-b", digest) == cloud["store"].path(digest).read_bytes()
        with pytest.raises(PermissionDenied):
            c.fetch_transform("default", digest)
        for missing in ("0" * 64, "../../admin.token", ""):
            with pytest.raises(NotFound, match="no kvtc transform"):
                c.fetch_transform("tenant-b", missing)
    with CloudClient(cloud["address"], None) as anonymous:
        with pytest.raises(Unauthenticated):
            anonymous.fetch_transform("default", digest)


def test_a_pack_names_the_transforms_it_needs_under_any_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("KVEDGE_HOME", str(tmp_path))
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(2, 40, 16, generator=g) for _ in range(2)]  # (heads, tokens, dim)
    digest = default_store().save(fit_transform(keys, keys))
    ctx = KVContext.from_dense(keys, keys, list(range(40)), model_fingerprint="ab",
                               tokenizer_id="cd", summaries=False)
    for spec, want in (("kvtc:embed=false", {digest}), ("kvtc+zstd:embed=false", {digest}),
                       ("kvtc", set()), ("int8+zstd", set())):
        pack = encode_pack(ctx, get_codec(spec, transform=digest) if "kvtc" in spec
                           else get_codec(spec))
        assert referenced_transforms(read_manifest(pack)) == want, spec


class OtherMachinePool(LocalPool):
    """A worker on another machine: its engine runs under its own KVEDGE_HOME (where it
    calibrates the transform), the gateway under another. One ingest at a time in a test,
    so swapping the process's variable around each engine call stands in for two hosts."""

    def __init__(self, engine, home, gateway_home):
        super().__init__(engine)
        self.home, self.gateway_home = str(home), str(gateway_home)

    def _on_worker(self, results):
        import os

        it = iter(results)
        while True:
            os.environ["KVEDGE_HOME"] = self.home
            try:
                item = next(it)
            except StopIteration:
                return
            finally:
                os.environ["KVEDGE_HOME"] = self.gateway_home
            yield item

    def encode_all(self, segments, namespace, codec, anchored=False, side_tensors=True):
        return self._on_worker(super().encode_all(segments, namespace, codec, anchored,
                                                  side_tensors))

    def compress_all(self, packs, method, budget, codec, cancelled=None):
        return self._on_worker(super().compress_all(packs, method, budget, codec, cancelled))


def test_a_transform_calibrated_on_a_worker_elsewhere_is_shipped_to_the_gateway(
        tmp_path, monkeypatch):
    """The gateway serves FetchTransform from its own folder: a worker with another home
    sends each transform with the first pack that names it (once per worker), the gateway
    installs it (checked) before storing the pack, for ingests and for jobs."""
    worker_home, gateway_home = tmp_path / "worker", tmp_path / "gateway"
    monkeypatch.setenv("KVEDGE_HOME", str(gateway_home))
    monkeypatch.setattr(fit, "CALIBRATION_TEXT", fit.CALIBRATION_TEXT[:600])
    engine = PrefillEngine(MODEL)
    folder = tmp_path / "kb"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    data = tmp_path / "cloud"
    server, gateway, port = serve(GatewayConfig(data, model=MODEL, segment_tokens=48),
                                  "127.0.0.1:0", pool=OtherMachinePool(engine, worker_home,
                                                                       gateway_home))
    try:
        with CloudClient(f"127.0.0.1:{port}", (data / "admin.token").read_text().strip()) as c:
            c.upload(folder, "default", "far", codec="kvtc:bits=2,embed=false")
            info = c.wait_ready("default", "far", timeout=120)
            digest = TransformStore(worker_home / "transforms").for_model(
                engine.loaded.fingerprint)
            assert digest and len(info.segments) >= 2
            gw = TransformStore(gateway_home / "transforms")
            assert gw.path(digest).read_bytes() == \
                (worker_home / "transforms" / f"{digest}.kvtc").read_bytes()
            assert engine._shipped == {digest}  # sent with the first pack only
            assert c.fetch_transform("default", digest) == gw.path(digest).read_bytes()
            gw.path(digest).unlink()  # lost on the gateway: a job's worker (restarted) resends
            engine._shipped.clear()
            job = c.submit_job("default", ["far"], "none", 1.0, "kvtc:bits=2,embed=false")
            assert list(c.watch_job("default", job.job_id))[-1].status == "done"
            assert gw.has(digest)
    finally:
        server.stop(0)
