"""The catalog alone: ingest → publish bookkeeping, variants, namespaces, jobs, persistence."""
import sqlite3

import pytest

from kvedge.cloud.catalog import BASE, Catalog, JobRecord, SegmentRecord, variant_name
from kvedge.common.errors import KvedgeError, NotFound
from kvedge.common.pack.manifest import KVShape

FILES = {"a.txt": ("aa" * 32, 10), "b.md": ("bb" * 32, 20)}
FP = "f0" * 32


def pid(n: int) -> str:
    return f"{n:064x}"


def seg(idx: int, pack: int, n_tokens: int = 100, source: str = "a.txt") -> SegmentRecord:
    return SegmentRecord(idx, pid(pack), pack_bytes=1000 + pack, n_tokens=n_tokens,
                         source=source)


def ingest(cat: Catalog, ns: str, name: str, files=FILES, **kw) -> None:
    cat.begin_ingest(ns, name, files, **{"mode": "rag", "segment_tokens": 512, "codec": "fp16",
                                         **kw})


@pytest.fixture
def cat(tmp_path):
    c = Catalog(tmp_path / "catalog.sqlite")
    yield c
    c.close()


def test_begin_ingest_records_files_and_marks_base_ingesting(cat):
    ingest(cat, "ns", "kb", mode="whole", segment_tokens=256, codec="int4")
    rec = cat.get("ns", "kb")
    assert (rec.namespace, rec.name, rec.mode, rec.segment_tokens, rec.codec) == \
        ("ns", "kb", "whole", 256, "int4")
    assert rec.files == FILES
    assert rec.variants[BASE]["status"] == "ingesting"
    assert rec.segments == [] and rec.n_tokens == 0 and rec.model_fingerprint == ""


def test_set_progress_updates_the_variant_row(cat):
    ingest(cat, "ns", "kb")
    cat.set_progress("ns", "kb", BASE, "ingesting", done=3, total=7)
    assert {k: cat.get("ns", "kb").variants[BASE][k] for k in ("status", "done", "total")} == \
        {"status": "ingesting", "done": 3, "total": 7}
    cat.set_progress("ns", "kb", BASE, "failed", error="prefill crashed")
    row = cat.get("ns", "kb").variants[BASE]
    assert (row["status"], row["error"]) == ("failed", "prefill crashed")


def test_publish_makes_base_ready_with_segments_in_order(cat):
    ingest(cat, "ns", "kb")
    orphans = cat.publish("ns", "kb", BASE, [seg(1, 11, 30), seg(0, 10, 50, "b.md")],
                          model_fingerprint=FP)
    assert orphans == []
    rec = cat.get("ns", "kb")
    assert [s.idx for s in rec.segments] == [0, 1]
    assert rec.segments[0] == seg(0, 10, 50, "b.md")
    assert (rec.model_fingerprint, rec.n_tokens) == (FP, 80)
    assert {k: rec.variants[BASE][k] for k in ("status", "done", "total")} == \
        {"status": "ready", "done": 2, "total": 2}


def test_the_base_records_the_kv_shape_that_fp16_sizes_follow_from(cat):
    ingest(cat, "ns", "kb")
    assert cat.get("ns", "kb").kv_shape == (0, 0, 0)  # unknown before a publish
    cat.publish("ns", "kb", BASE, [seg(0, 1, 50)], model_fingerprint=FP,
                kv_shape=KVShape(30, 3, 64))
    cat.publish("ns", "kb", "v", [seg(0, 2, 50)], model_fingerprint=FP)  # a variant: no shape
    rec = cat.get("ns", "kb", "v")
    assert rec.kv_shape == KVShape(30, 3, 64)
    assert rec.kv_shape.fp16_bytes(rec.segments[0].n_tokens) == 50 * 30 * 3 * 64 * 2 * 2


def test_reingest_keeps_old_segments_until_publish_and_returns_orphans(cat):
    ingest(cat, "ns", "kb")
    cat.publish("ns", "kb", BASE, [seg(0, 1), seg(1, 2)], model_fingerprint=FP)
    ingest(cat, "ns", "kb", files={"a.txt": ("cc" * 32, 11)})
    rec = cat.get("ns", "kb")  # readers still see the old complete KB
    assert [s.pack_id for s in rec.segments] == [pid(1), pid(2)]
    assert rec.variants[BASE]["status"] == "ingesting"
    assert rec.files == {"a.txt": ("cc" * 32, 11)}
    orphans = cat.publish("ns", "kb", BASE, [seg(0, 2), seg(1, 3)], model_fingerprint=FP)
    assert orphans == [pid(1)]  # pack 2 is still used, pack 3 is new
    assert [s.pack_id for s in cat.get("ns", "kb").segments] == [pid(2), pid(3)]


def test_publish_does_not_orphan_a_pack_another_kb_uses(cat):
    for name, own in (("one", 10), ("two", 20)):
        ingest(cat, "ns", name)
        cat.publish("ns", name, BASE, [seg(0, 1), seg(1, own)], model_fingerprint=FP)
    assert cat.publish("ns", "one", BASE, [seg(0, 5)], model_fingerprint=FP) == [pid(10)]


def test_remove_returns_only_packs_nothing_else_references(cat):
    ingest(cat, "ns", "one")
    cat.publish("ns", "one", BASE, [seg(0, 1), seg(1, 2)], model_fingerprint=FP)
    ingest(cat, "ns", "two")
    cat.publish("ns", "two", BASE, [seg(0, 2), seg(1, 3)], model_fingerprint=FP)
    assert cat.remove("ns", "one") == [pid(1)]
    with pytest.raises(NotFound):
        cat.get("ns", "one")
    assert cat.pack_namespaces(pid(1)) == set()
    assert cat.remove("ns", "two") == [pid(2), pid(3)]
    assert cat.names(None) == []


def test_variants_sit_beside_the_base_and_are_read_separately(cat):
    ingest(cat, "ns", "kb")
    cat.publish("ns", "kb", BASE, [seg(0, 1, 100), seg(1, 2, 100)], model_fingerprint=FP)
    v = variant_name("contrastkv", 0.2, "int4+zstd")
    assert v == "contrastkv-0.2-int4+zstd"
    cat.set_progress("ns", "kb", v, "running", done=1, total=2)
    assert cat.get("ns", "kb", v).segments == []
    assert cat.publish("ns", "kb", v, [seg(0, 7, 20), seg(1, 8, 20)],
                       model_fingerprint="other") == []
    rec = cat.get("ns", "kb", v)
    assert [s.pack_id for s in rec.segments] == [pid(7), pid(8)]
    assert set(rec.variants) == {BASE, v} and rec.variants[v]["status"] == "ready"
    # publishing a variant leaves the base's segments, fingerprint and token count alone
    base = cat.get("ns", "kb")
    assert [s.pack_id for s in base.segments] == [pid(1), pid(2)]
    assert (base.model_fingerprint, base.n_tokens) == (FP, 200)
    # re-ingesting the base does not touch the variant
    ingest(cat, "ns", "kb")
    assert cat.get("ns", "kb", v).variants[v]["status"] == "ready"


def test_missing_things_raise_not_found(cat):
    with pytest.raises(NotFound, match="'kb'.*'ns'"):
        cat.get("ns", "kb")
    for call in (lambda: cat.set_progress("ns", "kb", BASE, "ready"),
                 lambda: cat.publish("ns", "kb", BASE, [], model_fingerprint=FP),
                 lambda: cat.remove("ns", "kb"),
                 lambda: cat.job("ns", "job-1")):
        with pytest.raises(NotFound):
            call()
    ingest(cat, "ns", "kb")
    with pytest.raises(NotFound, match="no variant 'snapkv-0.5-fp16'"):
        cat.get("ns", "kb", "snapkv-0.5-fp16")
    assert issubclass(NotFound, KvedgeError)


def test_failed_publish_changes_nothing(cat):
    ingest(cat, "ns", "kb")
    cat.publish("ns", "kb", BASE, [seg(0, 1)], model_fingerprint=FP)
    with pytest.raises(sqlite3.IntegrityError):  # two segments with index 0
        cat.publish("ns", "kb", BASE, [seg(0, 2), seg(0, 3)], model_fingerprint="new")
    rec = cat.get("ns", "kb")
    assert [s.pack_id for s in rec.segments] == [pid(1)] and rec.model_fingerprint == FP


def test_namespaces_keep_same_named_kbs_apart(cat):
    ingest(cat, "tenant-a", "manuals", mode="rag")
    ingest(cat, "tenant-b", "manuals", mode="whole", files={"x.txt": ("dd" * 32, 1)})
    cat.publish("tenant-a", "manuals", BASE, [seg(0, 1)], model_fingerprint=FP)
    cat.publish("tenant-b", "manuals", BASE, [seg(0, 2), seg(1, 3)], model_fingerprint=FP)
    a, b = cat.get("tenant-a", "manuals"), cat.get("tenant-b", "manuals")
    assert (a.mode, list(a.files), [s.pack_id for s in a.segments]) == \
        ("rag", ["a.txt", "b.md"], [pid(1)])
    assert (b.mode, list(b.files), [s.pack_id for s in b.segments]) == \
        ("whole", ["x.txt"], [pid(2), pid(3)])
    assert cat.names(None) == [("tenant-a", "manuals"), ("tenant-b", "manuals")]
    assert cat.names(["tenant-b"]) == [("tenant-b", "manuals")]
    assert cat.names([]) == []
    assert cat.pack_namespaces(pid(1)) == {"tenant-a"}
    assert cat.pack_namespaces(pid(2)) == {"tenant-b"}
    cat.remove("tenant-a", "manuals")
    assert [s.pack_id for s in cat.get("tenant-b", "manuals").segments] == [pid(2), pid(3)]


def test_pack_namespaces_lists_every_namespace_using_a_pack(cat):
    for ns in ("a", "b"):
        ingest(cat, ns, "kb")
        cat.publish(ns, "kb", BASE, [seg(0, 9)], model_fingerprint=FP)
    assert cat.pack_namespaces(pid(9)) == {"a", "b"}
    assert cat.pack_namespaces(pid(404)) == set()


def job(id_: str, ns: str, created: float, **kw) -> JobRecord:
    return JobRecord(id_, ns, ["manuals", "faq"], "contrastkv", 0.2, "int4+zstd",
                     created=created, **kw)


def test_jobs_are_stored_updated_and_scoped_to_their_namespace(cat):
    cat.put_job(job("j2", "b", created=2.0))
    cat.put_job(job("j1", "a", created=1.0, total=4))
    got = cat.job("a", "j1")
    assert got == job("j1", "a", created=1.0, total=4)
    assert got.variant == "contrastkv-0.2-int4+zstd"
    got.status, got.done, got.failures = "failed", 3, [{"kb": "faq", "segment": 2,
                                                        "error": "boom"}]
    got.finished, got.compress_s = 9.5, 1.25
    cat.put_job(got)  # replaces the record
    assert cat.job("a", "j1") == got
    assert [j.id for j in cat.jobs(None)] == ["j1", "j2"]  # oldest first
    assert [j.id for j in cat.jobs(["b"])] == ["j2"]
    with pytest.raises(NotFound):
        cat.job("b", "j1")  # exists, but in another namespace


def test_everything_survives_reopening_the_file(tmp_path):
    path = tmp_path / "catalog.sqlite"
    first = Catalog(path)
    ingest(first, "ns", "kb")
    first.publish("ns", "kb", BASE, [seg(0, 1), seg(1, 2)], model_fingerprint=FP)
    first.set_progress("ns", "kb", "v", "running", done=1, total=2)
    first.put_job(job("j1", "ns", created=1.0))
    before = first.get("ns", "kb")
    first.close()

    again = Catalog(path)
    try:
        after = again.get("ns", "kb")
        assert after == before
        assert after.variants["v"]["status"] == "running"
        assert again.job("ns", "j1") == job("j1", "ns", created=1.0)
        assert again.names(None) == [("ns", "kb")]
    finally:
        again.close()


OLD_TABLES = """
CREATE TABLE kbs (
    id INTEGER PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL,
    mode TEXT NOT NULL DEFAULT 'rag', segment_tokens INTEGER NOT NULL DEFAULT 512,
    codec TEXT NOT NULL DEFAULT 'fp16', model_fingerprint TEXT NOT NULL DEFAULT '',
    n_tokens INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL, UNIQUE (namespace, name));
CREATE TABLE segments (
    kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE, variant TEXT NOT NULL,
    idx INTEGER NOT NULL, pack_id TEXT NOT NULL, pack_bytes INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL, source TEXT NOT NULL, fp16_bytes INTEGER NOT NULL,
    PRIMARY KEY (kb_id, variant, idx));
CREATE INDEX segments_by_pack ON segments(pack_id);
CREATE TABLE variants (
    kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE, variant TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', done INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL, PRIMARY KEY (kb_id, variant));
INSERT INTO kbs VALUES (1, 'ns', 'kb', 'rag', 512, 'fp16', 'f0', 100, 1.0);
INSERT INTO segments VALUES (1, '', 0, 'aa', 1000, 100, 'a.txt', 4000);
INSERT INTO variants VALUES (1, '', 'ready', '', 1, 1, 1.0);
"""


def test_a_catalog_that_stored_fp16_sizes_reads_and_takes_new_segments(tmp_path):
    """Before the KV shape was recorded, each segment stored its fp16 size (NOT NULL, no
    default): the column is dropped on opening and the old KB's shape reads unknown."""
    path = tmp_path / "catalog.sqlite"
    with sqlite3.connect(path) as old:
        old.executescript(OLD_TABLES)
    old.close()
    cat = Catalog(path)
    try:
        rec = cat.get("ns", "kb")
        assert rec.segments == [SegmentRecord(0, "aa", 1000, 100, "a.txt")]
        assert rec.kv_shape == (0, 0, 0)
        cat.publish("ns", "kb", BASE, [seg(0, 1)], model_fingerprint=FP,
                    kv_shape=KVShape(2, 1, 8))
        assert cat.get("ns", "kb").kv_shape == (2, 1, 8)
    finally:
        cat.close()


def test_packs_an_ingest_remembers_stay_referenced_until_publish_leaves_them_out(cat):
    from kvedge.cloud.catalog import Prefilled

    ingest(cat, "ns", "kb")
    for key, n in (("k0", 10), ("k1", 11), ("stale", 12)):
        cat.remember("ns", "kb", key, Prefilled(pid(n), 1000 + n, 100))
    assert cat.prefilled("ns", "k1") == Prefilled(pid(11), 1011, 100)
    assert cat.prefilled("other", "k1") is None  # never another namespace's pack
    assert cat.referenced(pid(12))  # the ingest stopped here: its packs are kept for a retry
    assert pid(12) in cat.sweep_packs(lambda keep: sorted(keep))
    orphans = cat.publish("ns", "kb", BASE, [seg(0, 10), seg(1, 11)], model_fingerprint=FP)
    # stored by an earlier attempt, used by no variant now: its record goes, its pack is left
    # to the start-up sweep (an ingest or job of the KB still running may be about to use it)
    assert orphans == [] and cat.prefilled("ns", "stale") is None
    assert not cat.referenced(pid(12)) and pid(12) not in cat.sweep_packs(sorted)
    assert cat.prefilled("ns", "k0") == Prefilled(pid(10), 1010, 100)  # for the next upload
    ingest(cat, "ns", "kb2")
    cat.remember("ns", "kb2", "k9", Prefilled(pid(19), 1019, 5))
    assert cat.remove("ns", "kb2") == [pid(19)]  # removing a KB frees what it remembered
    assert cat.remove("ns", "kb") == [pid(10), pid(11)]
