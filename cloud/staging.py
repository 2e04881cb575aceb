"""Uploaded files staged by content hash, per namespace, until ingest reads them. Torch-free.

A file arrives in chunks as `<ns>/<sha256>.part` (`kvedge.common.fsutil.PartFile`): a broken
upload resumes from the bytes held (PlanUpload reports them), and the file counts as
received only once its bytes hash to the sha256 it was announced under — then it is renamed
to `<ns>/<sha256>`. Identical files are stored once per namespace and never uploaded twice.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from kvedge.common.errors import BadInput
from kvedge.common.fsutil import PartFile

SHA256 = set("0123456789abcdef")


class Staging:
    """Uploaded files by content hash, per namespace: <ns>/<sha>.part while incomplete."""

    def __init__(self, root: Path):
        self.root = root

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
        if part.append(offset, data) < size:
            return False
        part.finish(self.path(namespace, sha), lambda whole: _check_sha256(sha, whole))
        return True

    def read(self, namespace: str, sha: str) -> bytes:
        return self.path(namespace, sha).read_bytes()

    def discard(self, namespace: str, sha: str) -> None:
        self.path(namespace, sha).unlink(missing_ok=True)


def _check_sha256(sha: str, data: bytes) -> None:
    if hashlib.sha256(data).hexdigest() != sha:
        raise BadInput(f"file {sha[:12]}…: content does not match its sha256; upload it again")
