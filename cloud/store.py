"""Where packs live: a content-addressed blob store over an fsspec URL. Torch-free.

A local directory by default; any fsspec URL (s3://, gs://, memory://, ...) needs no code
change. An `s3://bucket/prefix` store takes its endpoint and credentials from the standard
AWS settings that botocore reads (AWS_ENDPOINT_URL for MinIO or another S3-compatible server,
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, or ~/.aws), in every process
that opens the store: the gateway and a job process run with `ray job submit`.

Writes go to a temporary name first and are moved into place, so a reader never sees a
partial pack under its final name; on a local disk they are fsynced too (`write_atomic`).
A read fetches only the range asked for (a ranged GET on an object store): FetchPack serves a
pack a chunk at a time and an edge reads a pack's header alone.
"""
from __future__ import annotations

import uuid
from contextlib import suppress

import fsspec
from fsspec.implementations.local import LocalFileSystem

from kvedge.common.errors import StoreError
from kvedge.common.fsutil import write_atomic
from kvedge.common.pack.container import PACK_ID

S3_SETTINGS = ("set AWS_ENDPOINT_URL (an S3-compatible server), AWS_ACCESS_KEY_ID, "
               "AWS_SECRET_ACCESS_KEY and AWS_DEFAULT_REGION, or a profile in ~/.aws")


class PackStore:
    def __init__(self, url: str):
        self.url = url.rstrip("/")
        try:
            # no listings cache: job processes write packs into the same store, and a listing
            # cached here (a sweep's) would hide their packs from exists() and size()
            self.fs, self.root = fsspec.core.url_to_fs(self.url, use_listings_cache=False)
            self.fs.makedirs(f"{self.root}/packs", exist_ok=True)
        except Exception as err:  # noqa: BLE001 - any backend's failure, named for the user
            hint = f" ({S3_SETTINGS})" if self.url.startswith("s3://") else ""
            raise StoreError(f"cannot open the pack store {self.url}: {err}{hint}") from err

    def _path(self, pack_id: str) -> str:
        if not PACK_ID.match(pack_id):
            raise StoreError(f"not a pack id: {pack_id!r}")
        return f"{self.root}/packs/{pack_id[:2]}/{pack_id}.kvp"

    def _missing(self, pack_id: str) -> StoreError:
        return StoreError(f"pack {pack_id[:16]}… is not in the store {self.url}")

    def put(self, pack_id: str, data: bytes) -> None:
        path = self._path(pack_id)
        if self.fs.exists(path):
            return  # content addressed: same id, same bytes
        try:
            if isinstance(self.fs, LocalFileSystem):  # and durable: fsynced before the catalog
                write_atomic(path, data)               # names it, so a power cut loses no pack
            else:
                self._put_remote(path, data)
        except Exception as err:  # noqa: BLE001 - a disk's or an object store's failure
            raise StoreError(f"could not write pack {pack_id[:16]}… to the store {self.url}: "
                             f"{err}") from err

    def _put_remote(self, path: str, data: bytes) -> None:
        """One write under a temporary name, then a move. A failed write deletes its temporary
        object; one a crash leaves is collected by `sweep`."""
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            self.fs.pipe_file(tmp, data)
            self.fs.mv(tmp, path)
        except BaseException:
            with suppress(Exception):
                self.fs.rm(tmp)
            raise

    def exists(self, pack_id: str) -> bool:
        return self.fs.exists(self._path(pack_id))

    def size(self, pack_id: str) -> int:
        try:
            return int(self.fs.size(self._path(pack_id)))
        except FileNotFoundError:
            raise self._missing(pack_id) from None

    def read(self, pack_id: str, offset: int = 0, length: int | None = None) -> bytes:
        """`length` bytes from `offset` (None: to the end), fewer where the pack ends first.
        Only that range is fetched: a resumed or chunked fetch never pulls the whole pack."""
        path = self._path(pack_id)
        if length == 0:  # an empty HTTP range would be ignored and the whole object sent
            if not self.fs.exists(path):
                raise self._missing(pack_id)
            return b""
        end = None if length is None else offset + length
        try:
            return self.fs.cat_file(path, start=offset, end=end)
        except FileNotFoundError:
            raise self._missing(pack_id) from None

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
