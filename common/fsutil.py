"""Files written whole or received in pieces, never seen half-written. Torch-free.

Two helpers, because a crash or a dropped connection must never leave a reader with a torn
file under its final name (docs/design.md, decision 4):
- `write_atomic` (and `write_text_atomic`, `write_json_atomic`): write to a temporary file in
  the same folder, fsync it, rename it over the target, fsync the folder so the rename itself
  survives a power cut. Packs, the edge's KB manifests, tokens and token stores use it.
- `locked`: an exclusive lock on a sidecar `<name>.lock` for a read-modify-write of a small
  state file (a token store), which threads and processes (`kvctl token issue` beside a
  running gateway) may do at once; without it one of two writers' changes is lost.
- `PartFile`: a transfer that arrives in chunks as `<name>.part`, resumable from the bytes it
  holds; a chunk must continue exactly where the held bytes end, and the finished file enters
  under its final name only after it is verified (a file that fails is deleted). Uploads
  (the gateway's staging) and pack fetches (the edge's pack cache) use it. Verifying reads
  the file through `mapped`, so a pack of hundreds of MB is never copied into memory whole.
"""
from __future__ import annotations

import fcntl
import json
import mmap
import os
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable, Iterator

from kvedge.common.errors import InUse


def write_atomic(path: Path | str, data: bytes, mode: int | None = None) -> None:
    """Replace `path` with `data` all at once: readers see the old file or the new, whole.

    The file is created owner-only (0600, what `tempfile.mkstemp` gives) unless `mode` says
    otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
        replace_durably(Path(tmp), path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path | str, text: str, mode: int | None = None) -> None:
    write_atomic(path, text.encode("utf-8"), mode)


def write_json_atomic(path: Path | str, obj, mode: int | None = None, **dump_options) -> None:
    write_text_atomic(path, json.dumps(obj, **dump_options), mode)


def replace_durably(source: Path, target: Path) -> None:
    """fsync `source`, rename it to `target`, fsync the folder (the rename is durable too)."""
    with open(source, "rb") as f:
        os.fsync(f.fileno())
    os.replace(source, target)
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextmanager
def locked(path: Path | str, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on `path`'s sidecar `<name>.lock` (created owner-only) for the
    `with`. flock: each call opens its own descriptor, so threads of one process exclude each
    other as processes do; the lock goes with the descriptor if the holder dies. `wait=False`:
    `InUse` at once if another holder has it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise InUse(f"{path} is in use by another process (it holds {lock}): wait for it "
                        "to finish, or use another path") from None
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def mapped(path: Path | str) -> Iterator[memoryview]:
    """A file's bytes as a read-only view mapped from disk, for the length of the `with`.

    Nothing is read up front: the pages a reader touches come from the page cache, not the
    process's own memory, and the OS can drop them again, however large the file."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # mmap refuses an empty file
            yield memoryview(b"")
            return
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapping)
    try:
        yield view
    finally:
        with suppress(BufferError):  # slices still held (an error's frames): unmapped with them
            view.release()
            mapping.close()


class PartFile:
    """An unfinished transfer held at `path` (`<name>.part`), resumable from its size.

    `gap(offset, held)` builds the error a chunk that does not continue the held bytes raises
    (each caller names it: BadInput for uploads, PackCorrupt for pack fetches)."""

    def __init__(self, path: Path | str, gap: Callable[[int, int], Exception]):
        self.path = Path(path)
        self.gap = gap

    def held(self) -> int:
        """Bytes received so far: where the transfer resumes."""
        return self.path.stat().st_size if self.path.exists() else 0

    def append(self, offset: int, data: bytes) -> int:
        """Add a chunk that starts at `offset`, which must be the bytes held; returns the new
        size. A chunk anywhere else raises `gap(offset, held)` and changes nothing."""
        held = self.held()
        if offset != held:
            raise self.gap(offset, held)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            f.write(data)
        return held + len(data)

    def finish(self, final: Path | str, verify: Callable[[memoryview], None]) -> int:
        """Check the whole file with `verify` (which raises if it is bad), then move it to
        `final` durably; returns its size. `verify` gets the file `mapped` (read-only, valid
        only during the call), so checking it allocates nothing of its size. A file that
        fails is deleted and the error raised: it cannot be resumed into something good."""
        try:
            with mapped(self.path) as data:
                verify(data)
                size = len(data)
        except BaseException:
            self.path.unlink(missing_ok=True)
            raise
        replace_durably(self.path, Path(final))
        return size
