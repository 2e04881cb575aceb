"""An ingest reuses the packs its namespace already holds for a segment: a re-upload after an
edit prefills only the segments that changed, and an ingest cut off resumes where it stopped —
on a real gateway (tiny model, its real Ray pool) over real files."""
import pytest

from daemons import in_process_gateway, ingest_ended, write_kb
from kvedge.common.net.cloud_client import CloudClient

MODEL = "tiny-llama"
DOCS = {f"d{i}.md": " ".join(f"Document {i}, line {j}, tells of river {100 * i + j}."
                             for j in range(12)) for i in range(4)}


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    server, gateway, address, token = in_process_gateway(tmp_path_factory.mktemp("cloud"),
                                                         MODEL, 48)
    with CloudClient(address, token) as client:
        yield client, gateway
    server.stop(0)


def counts(gateway) -> tuple[int, int]:
    return gateway.segments_prefilled, gateway.segments_reused


def ingest(client, folder, namespace: str, kb: str):
    client.upload(folder, namespace, kb)
    return client.wait_ready(namespace, kb, timeout=120)


def test_a_reupload_prefills_only_the_segments_that_changed(cloud, tmp_path):
    client, gateway = cloud
    prefilled, reused = counts(gateway)
    first = ingest(client, write_kb(tmp_path / "v1", DOCS), "default", "edited")
    n = len(first.segments)
    assert n > len(DOCS) and counts(gateway) == (prefilled + n, reused)

    edited = {**DOCS, "d2.md": " ".join(f"Line {j} of document two: mountain {j}."
                                        for j in range(12))}
    second = ingest(client, write_kb(tmp_path / "v2", edited), "default", "edited")
    ingest_ended(gateway, "default", "edited")  # the old d2's packs are deleted after ready
    old = {s.source: s.pack_id for s in first.segments if s.source != "d2.md"}
    kept = [s for s in second.segments if s.source != "d2.md"]
    fresh = [s for s in second.segments if s.source == "d2.md"]
    assert counts(gateway) == (prefilled + n + len(fresh), reused + len(kept))
    assert {s.source: s.pack_id for s in kept} == old  # the same packs, not prefilled again
    gone = {s.pack_id for s in first.segments if s.source == "d2.md"} - {
        s.pack_id for s in second.segments}  # (a file's last few tokens may be another's)
    assert gone and not any(gateway.store.exists(p) for p in gone)  # the old d2's packs

    ingest(client, write_kb(tmp_path / "v3", DOCS), "other", "edited")  # another tenant
    assert counts(gateway)[1] == reused + len(kept)  # never reuses a namespace's packs


def test_an_ingest_cut_off_resumes_where_it_stopped(cloud, tmp_path, monkeypatch):
    client, gateway = cloud
    real = gateway.pool.encode_all

    def cut_off(segments, *args, **kw):  # the worker dies after two segments
        for i, enc in enumerate(real(segments, *args, **kw)):
            if i == 2:
                raise RuntimeError("prefill actor lost")
            yield enc

    monkeypatch.setattr(gateway.pool, "encode_all", cut_off)
    folder = write_kb(tmp_path / "kb", {k: v.replace("river", "canal") for k, v in DOCS.items()})
    client.upload(folder, "default", "cut")
    with pytest.raises(Exception, match="prefill actor lost"):
        client.wait_ready("default", "cut", timeout=120)
    monkeypatch.setattr(gateway.pool, "encode_all", real)

    prefilled, reused = counts(gateway)
    info = ingest(client, folder, "default", "cut")  # the user uploads again
    now_prefilled, now_reused = counts(gateway)
    # the two packs stored before the cut are not prefilled again (nor a segment elsewhere
    # in the KB with the same tokens, e.g. a file's last few)
    assert now_reused - reused >= 2 and now_prefilled > prefilled
    assert now_prefilled - prefilled + now_reused - reused == len(info.segments)
    assert all(gateway.store.exists(s.pack_id) for s in info.segments)


def test_a_job_run_again_after_an_edit_compresses_only_the_changed_contexts(
        cloud, tmp_path, monkeypatch):
    client, gateway = cloud
    real, asked = gateway.pool.compress_all, []

    def counted(packs, *args, **kw):
        asked.append(len(packs))
        yield from real(packs, *args, **kw)

    monkeypatch.setattr(gateway.pool, "compress_all", counted)

    def job(kb: str):
        started = client.submit_job("default", [kb], "none", 1.0, "int8")
        *_, done = client.watch_job("default", started.job_id)
        assert done.status == "done"
        return client.get_kb("default", kb, done.variant)

    docs = {k: v.replace("river", "lake") for k, v in DOCS.items()}
    first = ingest(client, write_kb(tmp_path / "v1", docs), "default", "jobbed")
    variant = job("jobbed")
    assert asked == [len(first.segments)]
    assert [s.pack_id for s in job("jobbed").segments] == [s.pack_id for s in variant.segments]
    assert asked[1] == 0  # the same spec on the same KB: every context's pack is held

    docs["d1.md"] = " ".join(f"Line {j} of document one: valley {j}." for j in range(12))
    second = ingest(client, write_kb(tmp_path / "v2", docs), "default", "jobbed")
    before = {s.pack_id for s in first.segments}
    changed = [s for s in second.segments if s.pack_id not in before]  # new base packs
    again = job("jobbed")
    assert asked[2] == len(changed) > 0
    assert len(again.segments) == len(second.segments)


def test_a_pack_shared_with_a_removed_kb_is_still_found(cloud, tmp_path):
    client, gateway = cloud
    docs = {k: v.replace("river", "road") for k, v in DOCS.items()}
    ingest(client, write_kb(tmp_path / "a", docs), "default", "first")
    prefilled, reused = counts(gateway)
    second = ingest(client, write_kb(tmp_path / "b", docs), "default", "second")
    assert counts(gateway) == (prefilled, reused + len(second.segments))  # all from "first"
    client.remove_kb("default", "first")
    assert all(gateway.store.exists(s.pack_id) for s in second.segments)
    again = ingest(client, write_kb(tmp_path / "c", docs), "default", "second")
    assert counts(gateway) == (prefilled, reused + 2 * len(second.segments))
    assert [s.pack_id for s in again.segments] == [s.pack_id for s in second.segments]
