"""cloud/store.py: the pack store, on a local directory and on a real S3-compatible server
(moto's, on loopback: tests/s3server.py), through the same tests."""
import tracemalloc

import fsspec
import pytest

from kvedge.cloud.store import PackStore
from kvedge.common import fsutil
from kvedge.common.errors import StoreError

A, B = "ab" * 32, "cd" * 32
MB = 1 << 20


@pytest.fixture(params=["local", "s3"])
def url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("s3_url")


@pytest.fixture()
def store(url):
    return PackStore(url)


def files(store) -> set[str]:
    """Every file under the store's packs/, relative to it."""
    return {path[len(store.root):].lstrip("/") for path in store.fs.find(f"{store.root}/packs")}


def test_a_pack_is_put_read_sized_and_deleted(store):
    assert not store.exists(A)
    store.put(A, b"pack bytes")
    store.put(A, b"pack bytes")  # content addressed: a second put is a no-op
    assert store.exists(A) and store.size(A) == 10 and store.read(A) == b"pack bytes"
    assert files(store) == {f"packs/ab/{A}.kvp"}
    store.delete(A)
    store.delete(A)  # already gone: nothing to do
    assert not store.exists(A) and files(store) == set()


def test_a_ranged_read_returns_that_range(store):
    data = bytes(range(256)) * 64
    store.put(A, data)
    assert store.read(A, 100, 50) == data[100:150]
    assert store.read(A, 100) == data[100:]
    assert store.read(A, len(data) - 10, 1000) == data[-10:]  # fewer where the pack ends
    assert store.read(A, 100, 0) == b""


def test_a_ranged_read_never_holds_the_whole_pack(store):
    """A resumed or chunked FetchPack reads a chunk of a large pack: only that chunk is
    fetched (a block cache's read-ahead would pull megabytes per call)."""
    data = bytes(range(256)) * (64 * MB // 256)
    store.put(A, data)
    assert store.read(A, 0, 16) == data[:16]  # connections and clients made before measuring
    tracemalloc.start()
    try:
        chunk = store.read(A, 32 * MB, 64 * 1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert chunk == data[32 * MB:32 * MB + 64 * 1024]
    assert peak < 4 * MB, f"reading 64 KiB of a 64 MiB pack peaked at {peak / MB:.1f} MiB"


def test_an_s3_read_is_one_get_of_exactly_its_range(s3_url):
    store = PackStore(s3_url)
    store.put(A, bytes(1000))
    sent = []
    store.fs.s3.meta.events.register(
        "before-send.s3.GetObject", lambda request, **_: sent.append(request.headers["Range"]))
    assert store.read(A, 100, 50) == bytes(50)
    assert sent == [b"bytes=100-149"]


def test_a_missing_pack_is_a_store_error(store):
    for call in (lambda: store.read(A), lambda: store.read(A, 5, 10), lambda: store.read(A, 0, 0),
                 lambda: store.size(A)):
        with pytest.raises(StoreError, match="is not in the store"):
            call()
    with pytest.raises(StoreError, match="not a pack id"):
        store.read("../../etc/passwd")


def fail(*args, **kwargs):
    raise OSError("the disk is full")


def test_a_failed_put_leaves_nothing_under_the_final_name_and_no_temporary_file(
        store, monkeypatch):
    # the step that makes the pack appear fails: a local file's rename, an object's move
    monkeypatch.setattr(fsutil, "replace_durably", fail)
    monkeypatch.setattr(store.fs, "mv", fail)
    with pytest.raises(StoreError, match="could not write pack .* the disk is full"):
        store.put(A, b"pack bytes")
    assert not store.exists(A) and files(store) == set()


def test_a_write_that_breaks_midway_leaves_no_temporary_object(s3_url, monkeypatch):
    store = PackStore(s3_url)
    write = store.fs.pipe_file

    def torn(path, data, **kwargs):
        write(path, data[:3], **kwargs)
        raise OSError("connection reset")

    monkeypatch.setattr(store.fs, "pipe_file", torn)
    with pytest.raises(StoreError, match="connection reset"):
        store.put(A, b"pack bytes")
    assert files(store) == set()


def test_a_pack_another_process_wrote_is_seen_after_a_sweep_listed_the_store(store, url):
    """Job processes write packs into the gateway's store; a listing the gateway made (its
    sweep at start) must not hide them."""
    store.put(A, b"a")
    assert store.sweep(keep={A}) == []
    other, root = fsspec.core.url_to_fs(url, skip_instance_cache=True)  # its own client
    other.pipe_file(f"{root}/packs/ab/{'ab' * 31}ef.kvp", b"b")
    assert store.exists("ab" * 31 + "ef") and store.size("ab" * 31 + "ef") == 1


def test_sweep_deletes_unreferenced_packs_and_temporary_files(store):
    store.put(A, b"kept")
    store.put(B, b"orphan")
    store.fs.pipe_file(f"{store.root}/packs/cd/{B}.kvp.0123abcd.tmp", b"torn")
    assert sorted(store.sweep(keep={A})) == [f"packs/cd/{B}.kvp", f"packs/cd/{B}.kvp.0123abcd.tmp"]
    assert files(store) == {f"packs/ab/{A}.kvp"}


def test_a_store_that_cannot_be_opened_names_the_s3_settings(s3_server, monkeypatch):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StoreError, match="cannot open the pack store s3://x/.*AWS_ENDPOINT_URL"):
        PackStore("s3://x/packs")  # a bucket name S3 refuses (under 3 characters)
