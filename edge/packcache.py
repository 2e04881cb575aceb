"""The edge's local pack cache: verified packs on disk, decoded contexts in a small LRU.

A pack enters the cache only after its content hash, every checksum and its model
fingerprint check out, read from the file mapped from disk (never copied into memory whole:
packs can be hundreds of MB); a broken transfer stays as `<id>.part` and resumes from its
size (`kvedge.common.fsutil.PartFile`, the same resumable transfer uploads use).
The cache is one LRU under its byte budget: packs of KBs served whole (`kvedge serve --pin`)
are pinned, every other pack is evicted least-recently-used when the cache is over budget,
except packs an answer in flight holds (`hold`). A pack's last use is its file's access
time, set explicitly on every use (`_touch`): a read answered from the memory LRU touches no
file, and mounts with relatime or noatime would not record reads from disk either.

Eviction costs O(log n) a pack evicted, not a listing of the cache per fetch: the cache keeps
its byte total as packs come and go, and lists the folder only when over budget with no
candidates left from its last listing (oldest access first). A candidate used since that
listing has a newer access time and is skipped; packs committed since are newer than every
candidate. So the order is the files' access times', as if the folder were listed each time
(a 20,000-segment KB behind a 5 % cache is ~1,000 files to stat per fetch otherwise).
"""
from __future__ import annotations

import os
import threading
import time
from collections import Counter, OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvedge.common.fsutil import PartFile
from kvedge.common.pack.container import PACK_ID, open_container
from kvedge.common.pack.container import pack_id as content_id
from kvedge.common.pack.errors import PackCorrupt, PackError
from kvedge.common.pack.format import Pack


@dataclass
class CacheStats:
    """What the cache did, as plain counts (edge.metrics reports them)."""

    hits: int = 0              # loads answered from a pack decoded in memory
    misses: int = 0            # loads that read and decoded a pack from disk
    memory_evictions: int = 0  # decoded packs dropped from the in-memory LRU
    disk_evictions: int = 0    # pack files deleted to stay within the byte budget


class PackCache:
    def __init__(self, root: Path | str, model_fingerprint: str, capacity_bytes: int = 0,
                 memory_entries: int = 64):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fingerprint = model_fingerprint
        self.capacity = capacity_bytes  # 0 = unbounded
        self.memory_entries = memory_entries
        self.pinned: set[str] = set()
        self._decoded: OrderedDict[str, object] = OrderedDict()
        self._held: Counter[str] = Counter()  # packs answers in flight read: never evicted
        self._deferred = False  # an eviction left the cache over budget for a held pack
        self._lock = threading.Lock()
        self._evicting = threading.Lock()  # one eviction at a time
        self._total: int | None = None  # bytes of the cached packs; None: not listed yet
        self._sizes: dict[str, int] = {}  # each cached pack's bytes as committed or listed
        self._reserved: dict[str, int] = {}  # transfers under way: their packs' whole size
        self._candidates: deque[tuple[Path, float]] = deque()  # (file, atime) oldest first
        self.listings = 0  # folder listings by evict (what its cost grows with)
        self.stats = CacheStats()

    def path(self, pack_id: str, partial: bool = False) -> Path:
        if not PACK_ID.match(pack_id):
            raise PackCorrupt(f"not a pack id: {pack_id!r}")
        return self.root / (f"{pack_id}.part" if partial else f"{pack_id}.kvp")

    def has(self, pack_id: str) -> bool:
        return self.path(pack_id).exists()

    def _part(self, pack_id: str) -> PartFile:
        return PartFile(self.path(pack_id, partial=True), lambda offset, held: PackCorrupt(
            f"chunk at offset {offset} does not continue the {held} bytes held"))

    def held(self, pack_id: str) -> int:
        """Bytes of an unfinished transfer (resume offset)."""
        return self._part(pack_id).held()

    def append(self, pack_id: str, offset: int, data: bytes) -> None:
        self._part(pack_id).append(offset, data)

    def partial(self, pack_id: str) -> bytes:
        """The bytes an unfinished transfer holds (a streamed read resumes by reading them
        first)."""
        path = self.path(pack_id, partial=True)
        return path.read_bytes() if path.exists() else b""

    def discard(self, pack_id: str) -> None:
        """Drop an unfinished transfer found damaged: it cannot be resumed into a good pack."""
        self.path(pack_id, partial=True).unlink(missing_ok=True)

    def commit(self, pack_id: str) -> int:
        """Verify the finished transfer and move it into the cache; returns its size.
        A pack that fails verification is deleted and PackCorrupt/ModelMismatch raised."""
        try:
            size = self._part(pack_id).finish(self.path(pack_id),
                                              lambda data: self._verify(pack_id, data))
            self._count(pack_id, size)
        finally:
            self.release(pack_id)
        return size

    def reserve(self, pack_id: str, size: int) -> list[str]:
        """Make room for a transfer of a `size`-byte pack before its bytes land, so the
        folder never holds more than the capacity (cached packs + transfers under way;
        held and pinned packs excepted, as in `evict`); returns the packs evicted for it."""
        with self._lock:
            self._reserved[pack_id] = size
        return self.evict()

    def release(self, pack_id: str) -> None:
        """The transfer of `pack_id` ended (committed, failed or stopped)."""
        with self._lock:
            self._reserved.pop(pack_id, None)

    def _count(self, pack_id: str, size: int | None) -> None:
        """A pack entered (`size`) or left (None) the cache: keep the byte total."""
        with self._lock:
            if self._total is None:
                return
            self._total += (size or 0) - self._sizes.pop(pack_id, 0)
            if size is not None:
                self._sizes[pack_id] = size

    def _delete(self, pack_id: str) -> None:
        """Delete a cached pack's file (damaged, gone or cleared), its bytes uncounted."""
        self.path(pack_id).unlink(missing_ok=True)
        self._count(pack_id, None)

    def _verify(self, pack_id: str, data: memoryview) -> None:
        """`open_pack`'s checks and then every checksum, over the mapped file in place
        (`open_pack` itself would copy it into bytes)."""
        if content_id(data) != pack_id:
            raise PackCorrupt("content hash does not match the pack id")
        pack = Pack(data, open_container(data))
        pack.check_model(self.fingerprint)
        pack.container.verify_payload()
        damaged = pack.container.first_damaged()
        if damaged is not None:
            raise PackCorrupt("checksum mismatch", damaged)

    def load(self, pack_id: str):
        """The decoded KVContext of a cached pack (checksums verified on every decode).

        A pack damaged on disk since it was verified (or gone) raises PackCorrupt, whatever
        the damage, and is deleted first, so the next sync fetches it again instead of every
        answer failing on it forever."""
        from kvedge.common.pack.format import read_pack

        ctx = self._in_memory(pack_id)
        if ctx is not None:
            return ctx
        ctx = self._read(pack_id, read_pack)
        self._touch(pack_id)
        self.keep(pack_id, ctx)
        return ctx

    def keep(self, pack_id: str, ctx) -> None:
        """Hold a cached pack's decoded context in memory (`load` returns it): one decoded
        while its bytes arrived (`Fetcher.fetch(decode=True)`) or read from disk."""
        with self._lock:
            self._decoded[pack_id] = ctx
            while len(self._decoded) > self.memory_entries:
                self._decoded.popitem(last=False)
                self.stats.memory_evictions += 1

    def segment(self, pack_id: str):
        """For strategies that decode only the rows they keep (SamKV): the decoded context
        if it is in memory already, else the pack opened (`PackSegment`: its bytes and
        manifest, nothing decoded, the memory LRU left alone). Damage found while its rows
        are decoded later is PackCorrupt then; `recheck` deletes such a pack."""
        from kvedge.common.pack.segment import PackSegment

        ctx = self._in_memory(pack_id)
        if ctx is not None:
            return ctx
        opened = self._read(pack_id, PackSegment.open)
        self._touch(pack_id)
        return opened

    def _in_memory(self, pack_id: str):
        """The decoded context if the memory LRU holds it (a hit, refreshed), else None (a
        miss, counted)."""
        with self._lock:
            if pack_id in self._decoded:
                self._decoded.move_to_end(pack_id)
                self.stats.hits += 1
                ctx = self._decoded[pack_id]
            else:
                self.stats.misses += 1
                return None
        self._touch(pack_id)
        return ctx

    def _touch(self, pack_id: str) -> None:
        """Record a use: the file's access time is now (what `evict` orders by)."""
        path = self.path(pack_id)
        try:
            os.utime(path, (time.time(), path.stat().st_mtime))
        except FileNotFoundError:  # evicted or deleted meanwhile: nothing to order
            pass

    def recheck(self, pack_id: str) -> bool:
        """Verify a cached pack's file again (after an answer over it failed as corrupt);
        a damaged one is deleted so the next sync fetches it. True if it is sound."""
        from kvedge.common.fsutil import mapped

        try:
            with mapped(self.path(pack_id)) as data:
                self._verify(pack_id, data)
            return True
        except FileNotFoundError:
            return False
        except PackError:
            self._delete(pack_id)
            with self._lock:
                self._decoded.pop(pack_id, None)
            return False

    def _read(self, pack_id: str, how):
        """`how(path, fingerprint)` over a cached pack, damage → PackCorrupt and deleted."""
        try:
            return how(self.path(pack_id), self.fingerprint)
        except FileNotFoundError:
            raise PackCorrupt("the cached file is gone") from None
        except PackError as err:  # it read when committed: any failure now is damage
            self._delete(pack_id)
            if isinstance(err, PackCorrupt):
                raise
            raise PackCorrupt(f"the cached copy no longer reads ({type(err).__name__})") from err

    def size(self, pack_id: str) -> int:
        return self.path(pack_id).stat().st_size

    @contextmanager
    def hold(self, pack_ids):
        """Keep these packs from eviction while the block runs (an answer reading them; a
        held pack may be missing yet, fetched inside the block). Leaving it evicts what an
        eviction had to leave for the holds."""
        ids = list(pack_ids)
        with self._lock:
            self._held.update(ids)
        try:
            yield
        finally:
            with self._lock:
                self._held.subtract(ids)
                self._held = +self._held  # drop the zeros
                deferred, self._deferred = self._deferred, False
            if deferred:
                self.evict()

    def clear(self) -> None:
        """Forget every pack: files and decoded contexts (an edge starting cold, for the
        benchmark); pinned packs too."""
        with self._lock:
            self._decoded.clear()
        for path in self.root.glob("*.kvp"):
            self._delete(path.stem)

    def evict(self) -> list[str]:
        """Drop packs, oldest access first, until they and the transfers under way
        (`reserve`) fit the capacity; pinned and held packs stay (so a budget below one
        answer's packs is exceeded while that answer runs)."""
        if not self.capacity:
            return []
        with self._evicting:
            if self._total is None:
                self._list()
            dropped, listed = [], False
            while self._total + sum(self._reserved.values()) > self.capacity:
                if not self._candidates:
                    if listed:
                        break  # only pinned and held packs are left
                    self._list()
                    listed = True
                    continue
                if (pack_id := self._drop(*self._candidates.popleft())) is not None:
                    dropped.append(pack_id)
            return dropped

    def _list(self) -> None:
        """List the folder: the exact byte total, and every pack as a candidate, oldest
        access first."""
        files = sorted(_stats(self.root.glob("*.kvp")), key=lambda f: f[1].st_atime)
        with self._lock:
            self._sizes = {path.stem: st.st_size for path, st in files}
            self._total = sum(self._sizes.values())
        self._candidates = deque((path, st.st_atime) for path, st in files)
        self.listings += 1

    def _drop(self, path: Path, atime: float) -> str | None:
        """Delete a candidate unless it is kept, gone, or used since it was listed (then it
        is newer than every candidate left); returns its pack id if deleted."""
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        if st.st_atime != atime or self._keep(path.stem):
            return None
        path.unlink(missing_ok=True)
        self._count(path.stem, None)
        with self._lock:
            self._decoded.pop(path.stem, None)
            self.stats.disk_evictions += 1
        return path.stem

    def _keep(self, pack_id: str) -> bool:
        """Pinned or held; a held one marks the eviction as owed when the hold ends."""
        with self._lock:
            if pack_id in self._held:
                self._deferred = True
                return True
        return pack_id in self.pinned


def _stats(paths):
    """(path, stat) of each file still there (another thread may delete one meanwhile)."""
    for path in paths:
        try:
            yield path, path.stat()
        except FileNotFoundError:
            pass
