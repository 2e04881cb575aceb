"""Where packs live: a content-addressed blob store over an fsspec URL. Torch-free.

A local directory by default; any fsspec URL (s3://, gs://, memory://, ...) needs no code
change. Writes go to a temporary name first and are moved into place, so a reader never sees
a partial pack under its final name; on a local disk they are fsynced too (`write_atomic`).
"""
from __future__ import annotations

import uuid

import fsspec
from fsspec.implementations.local import LocalFileSystem

from kvedge.common.errors import StoreError
from kvedge.common.fsutil import write_atomic
from kvedge.common.pack.container import PACK_ID


class PackStore:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.fs.makedirs(f"{self.root}/packs", exist_ok=True)

    def _path(self, pack_id: str) -> str:
        if not PACK_ID.match(pack_id):
            raise StoreError(f"not a pack id: {pack_id!r}")
        return f"{self.root}/packs/{pack_id[:2]}/{pack_id}.kvp"

    def put(self, pack_id: str, data: bytes) -> None:
        path = self._path(pack_id)
        if self.fs.exists(path):
            return  # content addressed: same id, same bytes
        if isinstance(self.fs, LocalFileSystem):  # and durable: fsynced before the catalog
            write_atomic(path, data)               # names it, so a power cut loses no pack
            return
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open(tmp, "wb") as f:
            f.write(data)
        self.fs.mv(tmp, path)

    def exists(self, pack_id: str) -> bool:
        return self.fs.exists(self._path(pack_id))

    def size(self, pack_id: str) -> int:
        return int(self.fs.size(self._path(pack_id)))

    def read(self, pack_id: str, offset: int = 0, length: int | None = None) -> bytes:
        path = self._path(pack_id)
        if not self.fs.exists(path):
            raise StoreError(f"pack {pack_id[:16]}… is not in the store {self.url}")
        with self.fs.open(path, "rb") as f:
            f.seek(offset)
            return f.read() if length is None else f.read(length)

    def delete(self, pack_id: str) -> None:
        path = self._path(pack_id)
        if self.fs.exists(path):
            self.fs.rm(path)

    def sweep(self, keep: set[str]) -> list[str]:
        """Delete every file under packs/ but the packs named in `keep`: packs nothing
        references and the temporary files of writes that never finished. Returns the paths
        removed, relative to the store. The caller makes sure no one is writing packs."""
        removed = []
        for path in sorted(self.fs.find(f"{self.root}/packs")):
            name = path.rsplit("/", 1)[-1]
            if name.endswith(".kvp") and name[:-len(".kvp")] in keep:
                continue
            self.fs.rm(path)
            removed.append(path[len(self.root):].lstrip("/"))
        return removed
