"""Uploaded files staged by content hash, per namespace, until ingest reads them. Torch-free.

A file arrives in chunks as `<ns>/<sha256>.part` (`kvedge.common.fsutil.PartFile`): a broken
upload resumes from the bytes held (PlanUpload reports them), and the file counts as
received only once its bytes hash to the sha256 it was announced under — then it is renamed
to `<ns>/<sha256>`. Identical files are stored once per namespace and never uploaded twice.

The sha256 is computed while the chunks arrive, so verifying a file never holds it whole in
memory: a file's bytes are read back from disk (a block at a time) only when this process did
not see them arrive — an upload resumed after the gateway restarted.
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from kvedge.common.errors import BadInput
from kvedge.common.fsutil import PartFile, replace_durably

SHA256 = set("0123456789abcdef")
HASH_BLOCK = 1 << 20  # bytes read at a time when held bytes are hashed from disk


class RunningHash:
    """The sha256 of a `.part` file's bytes so far, advanced chunk by chunk as they are
    appended. Its lock keeps one file's append and hash update together, so two streams
    sending the same file cannot interleave them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.hash = hashlib.sha256()
        self.held = 0

    def advance(self, path: Path, offset: int, data: bytes) -> None:
        """Account for `data`, just appended at `offset` to `path`."""
        if offset == self.held:
            self.hash.update(data)
        else:  # bytes held before this process saw them: hash the file from disk
            self.hash = file_sha256(path)
        self.held = offset + len(data)


def file_sha256(path: Path, block: int = HASH_BLOCK):
    """The sha256 of a file, read `block` bytes at a time (a hashlib object)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest


class Staging:
    """Uploaded files by content hash, per namespace: <ns>/<sha>.part while incomplete."""

    def __init__(self, root: Path):
        self.root = root
        self._hashes: dict[Path, RunningHash] = {}  # by .part path, while it is written
        self._lock = threading.Lock()

    def path(self, namespace: str, sha: str, partial: bool = False) -> Path:
        if len(sha) != 64 or not set(sha) <= SHA256:
            raise BadInput(f"not a sha256 hex digest: {sha!r}")
        return self.root / namespace / (f"{sha}.part" if partial else sha)

    def _part(self, namespace: str, sha: str) -> PartFile:
        return PartFile(self.path(namespace, sha, partial=True), lambda offset, held: BadInput(
            f"chunk of {sha[:12]}… at offset {offset}, but {held} bytes are held: resume from "
            "the offset PlanUpload returns"))

    def offset(self, namespace: str, sha: str) -> int | None:
        """None when complete, else the bytes held so far."""
        if self.path(namespace, sha).exists():
            return None
        return self._part(namespace, sha).held()

    def write(self, namespace: str, sha: str, offset: int, data: bytes, size: int) -> bool:
        """Append a chunk at `offset`; verify and finalize when complete. True if complete."""
        if offset + len(data) > size:
            raise BadInput(f"file {sha[:12]}… is larger than its declared {size} bytes")
        part = self._part(namespace, sha)
        with self._lock:
            running = self._hashes.setdefault(part.path, RunningHash())
        with running.lock:
            held = part.append(offset, data)
            running.advance(part.path, offset, data)
            if held < size:
                return False
            with self._lock:
                self._hashes.pop(part.path, None)
            self._finish(part.path, self.path(namespace, sha), running.hash.hexdigest(), sha)
        return True

    @staticmethod
    def _finish(part: Path, final: Path, digest: str, sha: str) -> None:
        """Move a complete file under its final name, or delete it if it is not what `sha`
        names: it cannot be resumed into something good."""
        if digest != sha:
            part.unlink(missing_ok=True)
            raise BadInput(f"file {sha[:12]}…: content does not match its sha256; upload it "
                           "again")
        replace_durably(part, final)

    def read(self, namespace: str, sha: str) -> bytes:
        """A staged file's bytes, for ingest (which needs its text; verifying never reads it)."""
        return self.path(namespace, sha).read_bytes()

    def discard(self, namespace: str, sha: str) -> None:
        self.path(namespace, sha).unlink(missing_ok=True)
