"""Upload → Ray prefill → packs → gRPC sync → ask, over real loopback gRPC and a local Ray.

A tiny random model keeps it fast; test_smollm2_answers checks a real answer.
"""
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch
from click.testing import CliRunner

from daemons import in_process_gateway, ingest_ended, write_kb
from kvedge.common.errors import NotFound
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.errors import BadInput
from kvedge.common.net.auth import InvalidName, PermissionDenied, TokenStore, Unauthenticated
from kvedge.common.errors import ModelMismatch
from kvedge.common.model.models import DEFAULT_MODEL, load_model
from kvedge.common.pack.errors import PackCorrupt
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.rpc import metadata
from kvedge.common.net.edge_client import EdgeClient
from kvedge.edge.engine import EdgeEngine
from kvedge.edge.packcache import PackCache
from kvedge.edge.server import serve as serve_edge
from kvedge.apps.kvctl import kvctl
from kvedge.common.errors import InvalidOption, InvalidRequest, RequestTooLarge
from kvedge.common.registry import option
from kvedge.edge.strategies import STRATEGIES, Plan, ReuseStrategy, UnknownStrategy, assemble_cache
from kvedge.edge.sync import Syncer, Target

MODEL = "tiny-llama"
SMALL_KB = Path(__file__).parent / "data" / "kb_small"


DOCS = {
    "alpha.md": "# Alpha\n\nThe alpha code is 1234567.\n\nAlpha is a small harbour town.\n",
    "beta.txt": "Beta facts. The beta code is 7654321.\n\nBeta has a bridge of copper.\n",
    "notes/gamma.md": "Gamma keeps the archive. " * 20,
}


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    data = tmp_path_factory.mktemp("cloud")
    server, gateway, address, token = in_process_gateway(data, MODEL, 48)
    yield {"address": address, "token": token, "gateway": gateway, "data": data,
           "server": server}
    server.stop(0)


@pytest.fixture()
def client(cloud):
    with CloudClient(cloud["address"], cloud["token"]) as c:
        yield c


def upload_ready(client, folder, name, namespace="default", **kw):
    client.upload(folder, namespace, name, **kw)
    return client.wait_ready(namespace, name, timeout=120)


def test_upload_prefills_segments_into_verified_packs(client, cloud, tmp_path):
    info = upload_ready(client, write_kb(tmp_path / "kb", DOCS), "facts")
    assert info.status == "ready" and info.n_files == 3 and info.mode == "rag"
    assert len(info.segments) >= 3 and {s.source for s in info.segments} == set(DOCS)
    assert all(s.n_tokens <= 48 for s in info.segments)
    assert info.model_fingerprint == load_model(MODEL).fingerprint
    data = b"".join(c.data for c in client.fetch_pack("default", info.segments[0].pack_id))
    assert len(data) == info.segments[0].pack_bytes
    assert hashlib.sha256(b"x").hexdigest()  # sanity: hashlib available for uploads
    tail = list(client.fetch_pack("default", info.segments[0].pack_id, offset=len(data) - 10))
    assert b"".join(c.data for c in tail) == data[-10:]  # resumable from an offset


def test_non_text_files_are_left_out_and_named(client, tmp_path):
    folder = write_kb(tmp_path / "kb", {"a.md": "Alpha text.\n", "q.json": "[]"})
    result = client.upload(folder, "default", "mixed")
    assert result.files_received == 1 and result.ignored == ["q.json"]
    assert client.wait_ready("default", "mixed").n_files == 1


def test_reupload_skips_unchanged_files_and_replaces_changed_packs(client, cloud, tmp_path):
    docs = {name: text.replace("code", "cipher") for name, text in DOCS.items()}  # unshared packs
    folder = write_kb(tmp_path / "kb", docs)
    first = upload_ready(client, folder, "versioned")
    again = client.upload(folder, "default", "versioned")
    assert again.files_received == 0 and again.files_skipped == 3
    client.wait_ready("default", "versioned")
    (folder / "beta.txt").write_text("Beta moved. The beta code is now 1111111.\n")
    reply = client.upload(folder, "default", "versioned")
    assert reply.files_received == 1
    second = client.wait_ready("default", "versioned")
    ingest_ended(cloud["gateway"], "default", "versioned")  # orphans go just after ready
    old, new = {s.pack_id for s in first.segments}, {s.pack_id for s in second.segments}
    assert old != new
    store = cloud["gateway"].store
    assert all(store.exists(p) for p in new)
    catalog = cloud["gateway"].catalog
    orphans = [p for p in old - new if not catalog.pack_namespaces(p)]
    assert orphans and not any(store.exists(p) for p in orphans)  # unreferenced packs deleted


def test_broken_upload_resumes_from_its_offset(client, cloud, tmp_path):
    big = "Paragraph about the resumable upload. " * 60  # ~2.3 KB in 1 KB chunks
    folder = write_kb(tmp_path / "kb", {"big.txt": big + "\n"})
    data = (folder / "big.txt").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    entry = pb.FileEntry(path="big.txt", sha256=sha, size=len(data))

    def broken():
        yield pb.UploadChunk(header=pb.UploadHeader(namespace="default", kb="resumed",
                                                    files=[entry]))
        yield pb.UploadChunk(chunk=pb.FileChunk(sha256=sha, offset=0, data=data[:1000]))

    with pytest.raises(grpc.RpcError) as err:
        client.stub.Upload(broken(), metadata=metadata(cloud["token"]), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "resume" in err.value.details()
    plan = client.stub.PlanUpload(pb.UploadPlanRequest(namespace="default", kb="resumed",
                                                       files=[entry]),
                                  metadata=metadata(cloud["token"]))
    assert [n.offset for n in plan.needs] == [1000]
    sent = []
    client.upload(folder, "default", "resumed", chunk_size=1024,
                  progress=lambda done, total: sent.append((done, total)))
    assert sent[-1] == (len(data) - 1000,) * 2  # only the missing bytes crossed the wire
    assert len(sent) == 2
    assert client.wait_ready("default", "resumed", timeout=300).n_files == 1


@pytest.mark.parametrize("docs,error,match", [
    ({"image.txt": b"\x89PNG\x00\x00binary"}, BadInput, "binary"),
    ({"doc.pdf": b"%PDF-1.4"}, BadInput, "no .txt or .md files"),
    ({"latin1.txt": "caf\xe9".encode("latin-1")}, BadInput, "not UTF-8"),
    ({"empty.md": b"   \n\n  "}, BadInput, "no text"),
])
def test_bad_input_is_rejected_and_nothing_is_written(client, cloud, tmp_path, docs, error, match):
    folder = tmp_path / "bad"
    folder.mkdir()
    for name, data in docs.items():
        (folder / name).write_bytes(data)
    with pytest.raises(error, match=match):
        client.upload(folder, "default", "badkb")
    assert ("default", "badkb") not in cloud["gateway"].catalog.names(None)


def test_names_and_empty_folders_are_checked(client, cloud, tmp_path):
    folder = write_kb(tmp_path / "kb", {"a.md": "Alpha.\n"})
    for bad in ("../escape", "a/b", "", "x" * 65, ".."):
        with pytest.raises(InvalidName):
            client.upload(folder, "default", bad)
    with pytest.raises(InvalidName):
        client.upload(folder, "bad/ns", "fine")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="no .txt or .md files"):
        client.upload(tmp_path / "empty", "default", "empty")
    # the gateway refuses other file types itself, whatever a client sends
    entry = pb.FileEntry(path="x.pdf", sha256="0" * 64, size=1)
    with pytest.raises(grpc.RpcError) as err:
        client.stub.Upload(iter([pb.UploadChunk(header=pb.UploadHeader(
            namespace="default", kb="pdfs", files=[entry]))]), metadata=metadata(cloud["token"]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "only .txt, .md" in err.value.details()
    store_files = list((cloud["data"] / "store").rglob("*.tmp"))
    assert store_files == []


def test_missing_kb_and_unknown_namespace_are_not_found(client):
    with pytest.raises(NotFound, match="no knowledge base 'ghost'"):
        client.get_kb("default", "ghost")
    with pytest.raises(NotFound):
        client.get_kb("nobody-here", "ghost")
    with pytest.raises(NotFound):
        client.remove_kb("default", "ghost")
    assert client.list_kbs("nobody-here") == []


def test_tokens_authenticate_and_isolate_namespaces(client, cloud, tmp_path):
    info = upload_ready(client, write_kb(tmp_path / "kb", DOCS), "secret", namespace="tenant-a")
    tenant_b = TokenStore(cloud["data"] / "tokens.json").issue("b", ["tenant-b"])
    with CloudClient(cloud["address"], None) as anonymous:
        with pytest.raises(Unauthenticated):
            anonymous.list_kbs()
    with CloudClient(cloud["address"], "kve_forged") as forged:
        with pytest.raises(Unauthenticated):
            forged.get_kb("tenant-a", "secret")
    with CloudClient(cloud["address"], tenant_b) as b:
        with pytest.raises(PermissionDenied):
            b.get_kb("tenant-a", "secret")
        with pytest.raises(PermissionDenied):
            list(b.fetch_pack("tenant-a", info.segments[0].pack_id))
        with pytest.raises(NotFound):  # asking through its own namespace finds nothing
            list(b.fetch_pack("tenant-b", info.segments[0].pack_id))
        assert [k.namespace for k in b.list_kbs()] == []
    assert {k.namespace for k in client.list_kbs()} >= {"tenant-a", "default"}


def test_identical_text_in_two_namespaces_shares_no_pack(client, tmp_path):
    folder = write_kb(tmp_path / "kb", {"same.md": "The shared sentence is here.\n"})
    a = upload_ready(client, folder, "twin", namespace="ns-one")
    b = upload_ready(client, folder, "twin", namespace="ns-two")
    assert {s.pack_id for s in a.segments}.isdisjoint({s.pack_id for s in b.segments})


# ---------------------------------------------------------------------- edge


@pytest.fixture(scope="module")
def edge(cloud, tmp_path_factory):
    state = tmp_path_factory.mktemp("edge")
    loaded = load_model(MODEL)
    with CloudClient(cloud["address"], cloud["token"]) as c:
        upload_ready(c, write_kb(state.parent / "edge_kb", DOCS), "served")
        cache = PackCache(state / "packs", loaded.fingerprint)
        syncer = Syncer(c, cache, state, [Target("default", "served")], loaded.tokenizer.decode)
        fetched = syncer.sync_once()
        engine = EdgeEngine(loaded, cache, state)
        server, port = serve_edge(engine, state, "127.0.0.1:0")
        token = (state / "edge.token").read_text().strip()
        yield {"address": f"127.0.0.1:{port}", "token": token, "state": state, "cache": cache,
               "syncer": syncer, "fetched": fetched, "engine": engine}
        server.stop(0)


def test_sync_fetches_verifies_and_pins(edge, cloud):
    assert edge["fetched"] == {"default/served": len(edge["syncer"].local(
        Target("default", "served"))["segments"])}
    local = edge["syncer"].local(Target("default", "served"))
    assert all(edge["cache"].has(s["pack_id"]) for s in local["segments"])
    assert "alpha code" in " ".join(s["text"] for s in local["segments"])
    assert edge["cache"].pinned == {s["pack_id"] for s in local["segments"]}
    assert edge["syncer"].sync_once() == {"default/served": 0}  # nothing new to fetch


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_ask_streams_an_answer_with_timings(edge, strategy):
    with EdgeClient(edge["address"], edge["token"]) as c:
        events = list(c.ask("default", "served", "What is the alpha code?", strategy=strategy,
                            top_k=2, max_new_tokens=6))
    done = events[-1]
    assert isinstance(done, pb.AskDone) and done.strategy == strategy
    assert "".join(e for e in events[:-1]) == done.answer or done.answer.startswith(
        "".join(e for e in events[:-1]).strip()[:1])
    assert done.tokens == 6 and done.ttft_s > 0 and len(done.segments) == 2
    # recompute reads the synced token ids, no pack
    assert (done.bytes_loaded > 0) == (strategy != "recompute") and done.fp16_bytes > 0
    local = edge["syncer"].local(Target("default", "served"))["segments"]
    n_context = sum(local[i]["n_tokens"] for i in done.segments)
    sizes = [local[i]["n_tokens"] for i in done.segments]
    overflow = min(16, n_context)  # sparsex: the block before the question
    expected = {"recompute": n_context, "a3": round(0.15 * n_context),
                "cacheblend": round(0.15 * n_context), "epic": sum(min(n, 16) for n in sizes),
                "legolink": sum(min(n, 40) for n in sizes),
                "sparsex": min(round(0.15 * n_context), n_context - overflow) + overflow,
                "samkv": sum(round(round(0.15 * n_context) * n / n_context) for n in sizes),
                }.get(strategy, 0)
    assert done.recomputed_tokens == expected
    assert done.kv_bytes > 0 and 0 < done.sequence_ratio <= 1


@dataclass
class FirstTokens(ReuseStrategy):
    """A toy strategy with one knob, as a new strategy would be written: recompute the first
    `k` context tokens at full depth, reuse the rest."""

    k: int = option(3, 0, None, "context tokens recomputed from the start")

    name = "toy-first"

    def plan(self, rt, composed, reserve):
        cache = assemble_cache(rt, composed, reserve=len(composed.question_ids) + reserve)
        first = torch.arange(composed.n_prefix, composed.n_prefix + min(self.k, composed.n_context))
        positions = torch.cat([first, composed.question_positions()])
        return Plan(cache, torch.tensor(composed.all_ids())[positions], positions,
                    recomputed=first.numel())


@pytest.fixture()
def toy_strategy():
    STRATEGIES.register(FirstTokens)
    yield FirstTokens
    STRATEGIES.unregister(FirstTokens.name)


def test_a_new_strategy_and_its_knob_need_no_plumbing(edge, toy_strategy):
    """One class + one registration: asked by name over gRPC, its option checked and used."""
    with EdgeClient(edge["address"], edge["token"]) as c:
        ask = lambda **opts: list(c.ask("default", "served", "What is the alpha code?",  # noqa
                                        strategy="toy-first", top_k=2, max_new_tokens=2,
                                        options=opts))[-1]
        assert ask().recomputed_tokens == 3
        assert ask(k=7).recomputed_tokens == 7
        assert ask(k="0").recomputed_tokens == 0
        with pytest.raises(InvalidOption, match="'k' must be in"):
            ask(k=-1)
        with pytest.raises(InvalidOption, match="must be int"):
            ask(k="seven")
        with pytest.raises(InvalidOption, match="no option 'ratio'"):
            ask(ratio=0.5)


def test_strategy_options_reach_a3_and_bad_ones_are_invalid_argument(edge):
    with EdgeClient(edge["address"], edge["token"]) as c:
        def recomputed(**opts):
            done = list(c.ask("default", "served", "What is the alpha code?", strategy="a3",
                              top_k=2, max_new_tokens=2, options=opts))[-1]
            n = sum(edge["syncer"].local(Target("default", "served"))["segments"][i]["n_tokens"]
                    for i in done.segments)
            return done.recomputed_tokens, n

        got, n = recomputed(ratio=0.5)
        assert got == round(0.5 * n)
        assert recomputed(ratio=0)[0] == 0  # 0 means 0, not "the default"
        request = pb.AskRequest(namespace="default", kb="served", question="q?", strategy="a3",
                                options={"ratio": "7"})
        with pytest.raises(grpc.RpcError) as err:
            list(c.stub.Ask(request, metadata=metadata(edge["token"]), timeout=60))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("InvalidOption: 'a3' option 'ratio' must be in")


def test_kvctl_ask_json_is_snake_case_with_numbers(edge):
    out = CliRunner().invoke(kvctl, ["ask", "What is the alpha code?", "--kb", "served",
                                     "--edge", edge["address"], "--token", edge["token"],
                                     "--strategy", "a3", "--opt", "ratio=0.5", "--top-k", "2",
                                     "--max-new-tokens", "2", "--json"])
    assert out.exit_code == 0, out.output
    done = json.loads(out.output)
    assert done["strategy"] == "a3" and done["recomputed_tokens"] > 0
    assert isinstance(done["bytes_loaded"], int) and isinstance(done["segments"], list)
    assert "bytesLoaded" not in done


def test_ask_errors_are_named(edge):
    with EdgeClient(edge["address"], edge["token"]) as c:
        with pytest.raises(UnknownStrategy):
            list(c.ask("default", "served", "q?", strategy="telepathy"))
        with pytest.raises(NotFound, match="no synced copy"):
            list(c.ask("default", "not-served", "q?"))
        with pytest.raises(BadInput, match="empty"):
            list(c.ask("default", "served", "   "))
        with pytest.raises(RequestTooLarge, match="characters"):  # refused before tokenizing
            list(c.ask("default", "served", "What is the alpha code? " * 2500))
        with pytest.raises(RequestTooLarge, match="context"):
            list(c.ask("default", "served", "alpha? " * 125, max_new_tokens=1024))
        for bad in (dict(max_new_tokens=5000), dict(max_new_tokens=-1), dict(top_k=-3)):
            with pytest.raises(InvalidRequest, match="must be in"):
                list(c.ask("default", "served", "q?", **bad))
    with EdgeClient(edge["address"], None) as anonymous:
        with pytest.raises(Unauthenticated):
            list(anonymous.ask("default", "served", "q?"))


def test_fetch_resumes_and_corrupt_packs_are_never_used(edge, cloud, tmp_path):
    loaded = load_model(MODEL)
    with CloudClient(cloud["address"], cloud["token"]) as c:
        info = c.get_kb("default", "served")
        pack = info.segments[0].pack_id
        data = b"".join(ch.data for ch in c.fetch_pack("default", pack))
        cache = PackCache(tmp_path / "packs", loaded.fingerprint)
        cache.path(pack, partial=True).write_bytes(data[:100])  # a transfer that broke
        syncer = Syncer(c, cache, tmp_path, [Target("default", "served")], loaded.tokenizer.decode)
        assert syncer.fetcher.fetch("default", pack)
        assert cache.path(pack).read_bytes() == data
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x40
        cache.path(pack, partial=True).write_bytes(bytes(flipped))
        cache.path(pack).unlink()
        with pytest.raises(PackCorrupt):
            cache.commit(pack)
        assert not cache.has(pack) and not cache.path(pack, partial=True).exists()
        other = PackCache(tmp_path / "other", load_model("tiny-qwen3").fingerprint)
        other.path(pack, partial=True).write_bytes(data)
        with pytest.raises(ModelMismatch):
            other.commit(pack)
        assert not other.has(pack)


@pytest.mark.parametrize("strategy", ["pie", "samkv"])
def test_a_pack_corrupted_on_the_edges_disk_is_refetched(cloud, tmp_path, strategy):
    """Damaged after it was verified (disk rot, a stray write), then the edge restarted, its
    engine without a fetcher (a library caller; the daemon's fetches it again inside the ask:
    tests/test_on_demand.py): the ask fails with PackCorrupt once, the file is dropped, the
    next sync fetches it again.
    pie decodes the pack whole before answering; samkv opens it and decodes only its kept
    blocks while answering (every tensor is still checksummed on the way)."""
    loaded = load_model(MODEL)
    with CloudClient(cloud["address"], cloud["token"]) as c:
        upload_ready(c, write_kb(tmp_path / "kb", {"rot.md": "The rot code is 31337.\n"}), "rot")
        target = Target("default", "rot")
        cache = PackCache(tmp_path / "packs", loaded.fingerprint)
        syncer = Syncer(c, cache, tmp_path, [target], loaded.tokenizer.decode)
        syncer.sync_once()
        (pack,) = [s["pack_id"] for s in syncer.local(target)["segments"]]
        data = bytearray(cache.path(pack).read_bytes())
        data[-100] ^= 0x20  # a payload byte
        cache.path(pack).write_bytes(bytes(data))
        engine = EdgeEngine(loaded, PackCache(tmp_path / "packs", loaded.fingerprint), tmp_path)
        with pytest.raises(PackCorrupt):
            list(engine.ask(target, "rot code?", max_new_tokens=2, strategy=strategy))
        assert not cache.has(pack)
        assert syncer.sync_once() == {"default/rot": 1}
        assert list(engine.ask(target, "rot code?", max_new_tokens=2,
                               strategy=strategy))[-1].tokens == 2


def test_recompute_reads_the_synced_token_ids_and_no_pack(cloud, tmp_path, monkeypatch):
    """recompute prefills the prompt's tokens: the edge gives it the token ids the syncer
    kept and reads no pack. Where it must read packs (a local manifest without ids) it opens
    them, their verified manifests giving the ids, and decodes none of their tensors (what
    the ceiling's TTFT would otherwise count). Every way, the answer is the one over packs
    decoded whole."""
    from kvedge.common.pack.format import Pack
    from kvedge.edge.strategies.recompute import Recompute

    loaded = load_model(MODEL)
    with CloudClient(cloud["address"], cloud["token"]) as c:
        upload_ready(c, write_kb(tmp_path / "kb", {"a.md": "The gamma code is 4411.\n",
                                                   "b.md": "The delta code is 9020.\n"}), "ids")
        target = Target("default", "ids")
        cache = PackCache(tmp_path / "packs", loaded.fingerprint)
        Syncer(c, cache, tmp_path, [target], loaded.tokenizer.decode).sync_once()

    def ask(strategy):
        engine = EdgeEngine(loaded, PackCache(tmp_path / "packs", loaded.fingerprint), tmp_path)
        done = list(engine.ask(target, "gamma code?", top_k=2, max_new_tokens=4,
                               strategy=strategy))[-1]
        return done.answer, done.recomputed_tokens

    opened, decoded = [], []
    segment, context = PackCache.segment, Pack.context
    monkeypatch.setattr(PackCache, "segment",
                        lambda self, pid: opened.append(pid) or segment(self, pid))
    monkeypatch.setattr(Pack, "context", lambda self: decoded.append(self) or context(self))
    answer, recomputed = ask("recompute")
    assert opened == decoded == [] and recomputed > 0
    monkeypatch.setattr(Recompute, "reads_kv", True)  # as without synced ids: packs opened
    assert ask("recompute") == (answer, recomputed) and len(opened) == 2 and decoded == []
    monkeypatch.setattr(Recompute, "block_granular", False)  # the packs decoded whole
    assert ask("recompute") == (answer, recomputed) and len(decoded) == 2


def test_edge_keeps_answering_when_the_cloud_is_down(edge, cloud, tmp_path):
    loaded = load_model(MODEL)
    with CloudClient("127.0.0.1:1", cloud["token"]) as dead:  # nothing listens there
        syncer = Syncer(dead, edge["cache"], edge["state"], [Target("default", "served")],
                        loaded.tokenizer.decode)
        with pytest.raises(Exception):
            syncer.sync_once()
    with EdgeClient(edge["address"], edge["token"]) as c:
        assert isinstance(list(c.ask("default", "served", "beta code?", max_new_tokens=3))[-1],
                          pb.AskDone)


@pytest.mark.smollm
def test_smollm2_answers_from_synced_packs(tmp_path_factory):
    """The embedded model answers a real question through the whole path."""
    data = tmp_path_factory.mktemp("cloud-smol")
    server, _, address, token = in_process_gateway(data, DEFAULT_MODEL, 256)
    loaded = load_model(DEFAULT_MODEL)
    try:
        with CloudClient(address, token) as c:
            upload_ready(c, SMALL_KB, "small")
            state = data / "edge"
            cache = PackCache(state / "packs", loaded.fingerprint)
            Syncer(c, cache, state, [Target("default", "small")], loaded.tokenizer.decode).sync_once()
        engine = EdgeEngine(loaded, cache, state)
        question = "In what year was the Marrowind Lighthouse completed?"
        for strategy in ("recompute", "a3"):
            done = list(engine.ask(Target("default", "small"), question, strategy=strategy,
                                   top_k=1, max_new_tokens=20))[-1]
            assert "1873" in done.answer, (strategy, done.answer)
    finally:
        server.stop(0)


# ---------------------------------------------------------------------- batch jobs


def test_codec_job_writes_a_smaller_variant_the_edge_can_serve(client, cloud, tmp_path):
    base = upload_ready(client, write_kb(tmp_path / "kb", DOCS), "jobbed")
    job = client.submit_job("default", ["jobbed"], "none", 1.0, "int2+zstd")
    states = [j.status for j in client.watch_job("default", job.job_id)]
    assert states[-1] == "done" and job.variant == "none-1-int2+zstd"
    variant = client.get_kb("default", "jobbed", job.variant)
    assert variant.status == "ready" and len(variant.segments) == len(base.segments)
    # tiny model: manifests and side tensors weigh as much as its 16-dim KV, so even int2+zstd
    # is well above half of the default codec's base (5-bit keys, 4-bit values; int4+zstd
    # would be 0.93 of it)
    assert sum(s.pack_bytes for s in variant.segments) < 0.9 * sum(s.pack_bytes
                                                                   for s in base.segments)
    assert set(client.get_kb("default", "jobbed").variants) == {"", job.variant}
    assert [j.job_id for j in client.list_jobs("default")][-1] == job.job_id
    loaded = load_model(MODEL)
    cache = PackCache(tmp_path / "packs", loaded.fingerprint)
    targets = [Target.parse(f"default/jobbed@{job.variant}"), Target.parse("default/jobbed")]
    Syncer(client, cache, tmp_path, targets, loaded.tokenizer.decode).sync_once()
    engine = EdgeEngine(loaded, cache, tmp_path)
    server, port = serve_edge(engine, tmp_path, "127.0.0.1:0")  # one edge, both variants
    try:
        with EdgeClient(f"127.0.0.1:{port}", (tmp_path / "edge.token").read_text().strip()) as edge:
            ask = lambda kb: list(edge.ask("default", kb, "alpha code?", max_new_tokens=2))[-1]  # noqa
            compressed, plain = ask(f"jobbed@{job.variant}"), ask("jobbed")
            assert compressed.tokens == plain.tokens == 2
            assert compressed.bytes_loaded < plain.bytes_loaded  # the int2 packs were read
            with pytest.raises(NotFound, match="no synced copy"):
                ask("jobbed@kvzip-0.2-int8+zstd")
            with pytest.raises(InvalidName):
                ask("jobbed@../../tokens")
    finally:
        server.stop(0)


def test_an_edge_fetches_an_alternate_variants_pack_when_the_link_is_slow(client, tmp_path):
    """`kvedge serve --kb KB --alternate KB@VARIANT`: over a slow link (the meter's prediction
    set) a missing segment comes from the smaller variant's pack, over a fast one from the
    KB's own; the answer's stats say which; the alternate's manifest is synced on demand."""
    from kvedge.edge.fetcher import Fetcher

    base = upload_ready(client, write_kb(tmp_path / "kb", DOCS), "alternated")
    job = client.submit_job("default", ["alternated"], "none", 1.0, "int2+zstd")  # smaller
    assert list(client.watch_job("default", job.job_id))[-1].status == "done"
    own, alt = Target.parse("default/alternated"), Target.parse(f"alternated@{job.variant}")
    loaded = load_model(MODEL)
    cache = PackCache(tmp_path / "packs", loaded.fingerprint)
    fetcher = Fetcher(client, cache)
    Syncer(client, cache, tmp_path, [], loaded.tokenizer.decode, on_demand=[own, alt],
           fetcher=fetcher).sync_once()
    assert cache.root.exists() and not list(cache.root.glob("*.kvp"))  # nothing fetched yet
    engine = EdgeEngine(loaded, cache, tmp_path, fetcher=fetcher, alternates={own.key: [alt]})
    variant_packs = {s.index: s.pack_id for s in client.get_kb("default", "alternated",
                                                                job.variant).segments}
    try:
        fetcher.link.seconds = lambda n: 0.02 + n * 8 / 1e4  # 10 kbit/s: every byte counts
        *_, slow = engine.ask(own, "alpha code?", top_k=2, max_new_tokens=2)
        assert slow.variants == [job.variant] * 2 and slow.tokens == 2
        assert {p.stem for p in cache.root.glob("*.kvp")} == {variant_packs[i]
                                                              for i in slow.segments}
        fetcher.link.seconds = lambda n: 0.02 + n * 8 / 1e9  # 1 Gbit/s
        *_, fast = engine.ask(own, "Which tower does beta have?", top_k=3, max_new_tokens=2)
        fetched = [i for i in fast.segments if i not in slow.segments]
        assert fetched and all(fast.variants[fast.segments.index(i)] == "" for i in fetched)
        assert all(fast.variants[fast.segments.index(i)] == job.variant  # cached: taken
                   for i in fast.segments if i in slow.segments)
        assert base.segments[fetched[0]].pack_id in {p.stem for p in cache.root.glob("*.kvp")}
    finally:
        engine.close()
    unsynced = EdgeEngine(loaded, cache, tmp_path, fetcher=fetcher,
                          alternates={own.key: [Target.parse("alternated@never-made")]})
    try:  # an alternate not synced (yet) leaves the KB's own packs
        *_, done = unsynced.ask(own, "alpha code?", top_k=1, max_new_tokens=2)
        assert done.variants == [""]
    finally:
        unsynced.close()


def test_job_reports_failed_contexts_and_publishes_nothing(client, cloud, tmp_path):
    base = upload_ready(client, write_kb(tmp_path / "kb", {"only.md": "Lonely text " * 30}),
                        "fragile")
    store = cloud["gateway"].store
    victim = base.segments[0].pack_id
    good = store.read(victim)
    path = store._path(victim)
    broken = bytearray(good)
    broken[len(good) // 2] ^= 1
    Path(path).write_bytes(bytes(broken))  # bit rot in the store
    try:
        job = client.submit_job("default", ["fragile"], "none", 1.0, "int8")
        final = list(client.watch_job("default", job.job_id))[-1]
    finally:
        Path(path).write_bytes(good)
    assert final.status == "failed"
    assert final.failures[0].kb == "fragile" and "PackCorrupt" in final.failures[0].error
    info = client.get_kb("default", "fragile", job.variant)
    assert info.status == "failed" and list(info.segments) == []


def test_bad_job_requests_are_refused(client):
    with pytest.raises(BadInput, match="unknown method"):
        client.submit_job("default", ["served"], "clairvoyance", 0.2)
    with pytest.raises(BadInput, match="budget"):
        client.submit_job("default", ["served"], "none", 0.0)
    with pytest.raises(NotFound):
        client.submit_job("default", ["ghost"], "none", 1.0)
    with pytest.raises(NotFound):
        client.get_job("default", "nope")


def test_contrastkv_job_writes_a_ragged_variant(client, tmp_path):
    upload_ready(client, write_kb(tmp_path / "kb", {"e.md": "Evict me softly. " * 40}), "evicted")
    job = client.submit_job("default", ["evicted"], "contrastkv", 0.3, "int8")
    assert list(client.watch_job("default", job.job_id))[-1].status == "done"
    variant = client.get_kb("default", "evicted", job.variant)
    base = client.get_kb("default", "evicted")
    assert variant.status == "ready" and job.variant == "contrastkv-0.3-int8"
    # 30 % of the KV kept, int8 without zstd, against the default codec's base: ~0.65 of its bytes
    assert sum(s.pack_bytes for s in variant.segments) < 0.7 * sum(s.pack_bytes
                                                                   for s in base.segments)


def test_links_leaving_the_uploaded_folder_are_refused(tmp_path):
    from kvedge.common.kbfiles import scan_folder

    outside = tmp_path / "secret.md"
    outside.write_text("the secret is 42\n")
    folder = write_kb(tmp_path / "kb", {"a.md": "Alpha.\n"})
    (folder / "inner.md").symlink_to(folder / "a.md")  # inside the folder: fine
    assert [f.path for f in scan_folder(folder)[0]] == ["a.md", "inner.md"]
    (folder / "passwd.md").symlink_to(outside)
    with pytest.raises(BadInput, match="passwd.md is a link to .*outside"):
        scan_folder(folder)
    (folder / "passwd.md").unlink()
    (folder / "sub").symlink_to(tmp_path, target_is_directory=True)  # not followed at all
    assert [f.path for f in scan_folder(folder)[0]] == ["a.md", "inner.md"]
