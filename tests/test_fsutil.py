"""Atomic whole-file writes and resumable `.part` transfers (kvedge.common.fsutil)."""
import hashlib
import json
import os
import stat
import tracemalloc

import pytest

from kvedge.common.fsutil import PartFile, mapped, write_atomic, write_json_atomic


class Gap(Exception):
    pass


def part_file(tmp_path) -> PartFile:
    return PartFile(tmp_path / "x.part", lambda offset, held: Gap(f"{offset} vs {held}"))


def test_write_atomic_replaces_the_whole_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "deep" / "f.json"
    write_json_atomic(target, {"a": 1}, indent=1)
    write_json_atomic(target, {"b": 2})
    assert json.loads(target.read_text()) == {"b": 2}
    assert [p.name for p in target.parent.iterdir()] == ["f.json"]


def test_a_failed_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "f"
    write_atomic(target, b"old")

    def crash(fd):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f"]


def test_mode_is_applied_before_any_byte_is_written(tmp_path):
    target = tmp_path / "secret"
    target.write_text("x")
    target.chmod(0o644)
    write_atomic(target, b"token\n", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_part_file_resumes_refuses_gaps_and_finishes_verified(tmp_path):
    part = part_file(tmp_path)
    assert part.held() == 0
    assert part.append(0, b"hello ") == 6
    with pytest.raises(Gap, match="3 vs 6"):
        part.append(3, b"x")
    assert part_file(tmp_path).append(6, b"world") == 11  # a new holder resumes
    seen = []
    assert part.finish(tmp_path / "x", lambda view: seen.append(bytes(view))) == 11
    assert seen == [b"hello world"] and (tmp_path / "x").read_bytes() == b"hello world"
    assert not part.path.exists()


def test_a_part_that_fails_verification_is_deleted(tmp_path):
    part = part_file(tmp_path)
    part.append(0, b"garbage")

    def refuse(data):
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        part.finish(tmp_path / "x", refuse)
    assert list(tmp_path.iterdir()) == []


def test_finishing_a_big_part_verifies_it_without_reading_it_into_memory(tmp_path):
    """The view `verify` gets is the file mapped from disk: hashing all 16 MB of it allocates
    nothing near that (tracemalloc sees every Python allocation; `read_bytes` would be 16 MB)."""
    part, block = part_file(tmp_path), os.urandom(1 << 20)
    for n in range(16):
        part.append(n << 20, block)
    want = hashlib.sha256(block * 16).hexdigest()
    seen = []
    tracemalloc.start()
    try:
        assert part.finish(tmp_path / "x", lambda view: seen.append(
            hashlib.sha256(view).hexdigest())) == 16 << 20
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == [want] and peak < 1 << 20, peak
    assert (tmp_path / "x").stat().st_size == 16 << 20 and not part.path.exists()


def test_mapped_gives_the_bytes_and_lets_them_go(tmp_path):
    (tmp_path / "empty").write_bytes(b"")
    with mapped(tmp_path / "empty") as view:
        assert view.readonly and bytes(view) == b""  # mmap itself refuses empty files
    (tmp_path / "f").write_bytes(b"abcdef")
    with mapped(tmp_path / "f") as view:
        assert view.readonly and bytes(view[2:4]) == b"cd"
    with pytest.raises(ValueError):  # released: no reader keeps a mapping alive by mistake
        bytes(view)
    with pytest.raises(FileNotFoundError):
        with mapped(tmp_path / "missing"):
            pass
