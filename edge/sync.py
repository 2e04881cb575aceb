"""Keep the edge's local KB manifests (and the packs of KBs served whole) in step with the cloud.

For each served KB (namespace, name, variant) the syncer writes the KB's local manifest
(`kbs/<ns>/<name>[@variant].json`: segments, pack ids, segment texts for retrieval, the kvtc
transforms each pack needs, and each segment's token ids and whether its pack was prefilled
behind the chat prefix, for an edge that prefills a segment instead of fetching its pack:
`edge.fetch_or_compute`). A KB served on demand (`kvedge serve --kb`) syncs only that: the
segment texts come from each pack's header and manifest, read with a ranged fetch of the
pack's first bytes (`Fetcher.manifests`; a few KB where the pack is MBs), and a question's
packs are fetched when it needs them (`EdgeEngine.retrieve`). Ranged reads over returning
the texts in GetKB: the manifest is the pack's own record of its tokens, so the index needs
no second copy of them in the catalog and GetKB, polled every sync, stays small. A KB served
whole (`--pin`) also has every pack fetched — resuming broken transfers from what it holds —
verified and pinned first. The kvtc transforms the packs reference and this edge lacks (packs
written with `kvtc:embed=false`; each checked against its blake3 before it is installed) come
before the manifest is written, so the engine never sees a KB it cannot decode; it answers
from local manifests, so the edge keeps answering cached questions when the cloud is down.
"""
from __future__ import annotations

import base64
import json
import logging
import sys
import threading
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kvedge.common.fsutil import mapped, write_json_atomic
from kvedge.common.net.auth import check_name, check_variant
from kvedge.common.net.rpc import MAX_HEADS
from kvedge.common.pack.container import read_manifest
from kvedge.edge.fetcher import Fetcher, FetchStopped

log = logging.getLogger("kvedge.sync")
INDEX_FETCHES = 4  # FetchHeads calls (or, from an older gateway, ranged reads) at once
# what a segment's pack manifest gives: its text, transforms, token ids, whether it was
# prefilled behind the chat prefix and whether it carries SamKV's side tensors
INDEXED = ("text", "transforms", "token_ids", "anchored", "side_tensors")


@dataclass(frozen=True)
class Target:
    namespace: str
    kb: str
    variant: str = ""

    @classmethod
    def parse(cls, spec: str, default_namespace: str = "default") -> "Target":
        """'kb', 'kb@variant', 'ns/kb' or 'ns/kb@variant' (docs/design.md, decision 8)."""
        ns, _, rest = spec.rpartition("/")
        return cls.in_namespace(check_name("namespace", ns or default_namespace), rest)

    @classmethod
    def in_namespace(cls, namespace: str, spec: str) -> "Target":
        """'kb' or 'kb@variant' in a namespace the caller already checked (an Ask request
        names its namespace apart, so a '/' in its kb is refused, not a namespace switch)."""
        kb, _, variant = spec.partition("@")
        return cls(namespace, check_name("knowledge base", kb), check_variant(variant))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kb}" + (f"@{self.variant}" if self.variant else "")


def encode_ids(ids: list[int]) -> str:
    """Token ids as the local manifest keeps them: base64 of little-endian uint32. The engine
    holds every served KB's manifest in memory, and a JSON list would there be a Python int
    per token — ~36 bytes each, ~180 MB for a 20,000-segment KB of 256-token segments —
    where this string is ~5.3 bytes a token; a segment's ids are decoded only when it is
    prefilled."""
    data = array("I", ids)
    if sys.byteorder == "big":
        data.byteswap()
    return base64.b64encode(data.tobytes()).decode()


def decode_ids(text: str) -> list[int]:
    """`encode_ids`'s inverse."""
    data = array("I", base64.b64decode(text))
    if sys.byteorder == "big":
        data.byteswap()
    return data.tolist()


def manifest_path(state_dir: Path, target: Target) -> Path:
    name = target.kb + (f"@{target.variant}" if target.variant else "")
    return Path(state_dir) / "kbs" / target.namespace / f"{name}.json"


class Syncer:
    """Syncs `targets` whole — every pack fetched and pinned — and `on_demand` KBs' manifest
    and retrieval index only, their packs fetched when a question needs them
    (`kvedge serve --pin` and `--kb`; docs/design.md, decision 10). `fetcher`: the one
    transfer path, shared with the engine's on-demand fetches (default: one of its own).
    `transforms`: the kvtc TransformStore transforms are installed in (default: this
    machine's, `<KVEDGE_HOME>/transforms`, where the decoder reads them)."""

    def __init__(self, client, cache, state_dir: Path | str, targets: list[Target], detokenize,
                 transforms=None, *, on_demand: list[Target] = (), fetcher=None):
        self.client, self.cache, self._transforms = client, cache, transforms
        self.fetcher = fetcher if fetcher is not None else Fetcher(client, cache)
        self.state_dir = Path(state_dir)
        self.pinned = list(targets)
        self.targets = self.pinned + [t for t in on_demand if t not in self.pinned]
        self.detokenize = detokenize
        self.last_error: str | None = None
        self._locals: dict[Target, tuple[tuple[int, int], dict]] = {}  # see `local`
        self._etags: dict[Target, str] = {}  # the GetKB etag each local manifest is current with
        self.transform_bytes = 0  # since start (edge.metrics reports it with the fetcher's)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def fetched_bytes(self) -> int:
        """Bytes fetched from the cloud since start: packs, manifests, kvtc transforms."""
        return self.fetcher.fetched_bytes + self.transform_bytes

    @property
    def fetched_packs(self) -> int:
        """Packs fetched and verified since start, by sync and by answers alike."""
        return self.fetcher.fetched_packs

    def sync_once(self) -> dict[str, int]:
        """Bring every target up to date; returns packs fetched per target.

        One target failing (removed in the cloud, a corrupt pack) does not keep the others
        from syncing: every target is tried, the cache re-pinned, then the first failure is
        raised again (the others are logged)."""
        fetched, failures = {}, []
        for target in self.targets:
            try:
                fetched[target.key] = self._sync(target, whole=target in self.pinned)
            except Exception as err:  # noqa: BLE001 - re-raised below, after the others
                log.warning("sync of %s failed (serving it from the local cache): %s: %s",
                            target.key, type(err).__name__, err)
                failures.append(err)
        self.cache.pinned = self.referenced()
        self.cache.evict()
        if failures:
            raise failures[0]
        return fetched

    def referenced(self) -> set[str]:
        """Packs the local manifests of the KBs served whole name: what stays pinned (a KB
        served on demand, or no longer served, is in the LRU like any other)."""
        return {seg["pack_id"] for target in self.pinned
                for seg in (self.local(target) or {"segments": []})["segments"]}

    def _sync(self, target: Target, whole: bool) -> int:
        info = self._listing(target, whole)
        if info is None or not info.segments:
            return 0  # unchanged since the last sync, or still ingesting for the first time
        old = self.local(target)
        if self._current(old, info, whole):
            self._etags[target] = info.etag
            return 0
        count = self._fetch_all(target.namespace, info.segments) if whole else 0
        known = {s["pack_id"]: s for s in old["segments"] if _indexed(s)} \
            if old and old["fingerprint"] == info.model_fingerprint else {}
        index = self._index(target.namespace, info.segments, known)
        segments = [{"index": seg.index, "pack_id": seg.pack_id, "source": seg.source,
                     "n_tokens": seg.n_tokens, "pack_bytes": seg.pack_bytes,
                     **index[seg.pack_id]} for seg in info.segments]
        transforms = set().union(*(s["transforms"] for s in segments))
        self._fetch_transforms(target.namespace, transforms)  # before a manifest names them
        write_json_atomic(manifest_path(self.state_dir, target),
                    {"namespace": target.namespace, "kb": target.kb, "variant": target.variant,
                     "fingerprint": info.model_fingerprint, "mode": info.mode,
                     "transforms": sorted(transforms), "segments": segments})
        log.info("synced %s: %d segments (%d packs fetched%s)", target.key, len(segments), count,
                 "" if whole else "; the others on demand")
        self._etags[target] = info.etag
        return count

    def _listing(self, target: Target, whole: bool):
        """The cloud's KBInfo for `target`, or None where the KB has not changed since the
        local manifest was last found current (its etag) and that manifest is still complete
        here: the gateway then sends a few bytes instead of every segment."""
        etag = self._etags.get(target)
        if etag:
            info = self.client.get_kb(target.namespace, target.kb, target.variant,
                                      if_none_match=etag)
            if not info.not_modified:
                return info
            old = self.local(target)
            if old and self._complete(old, whole):
                return None
            self._etags.pop(target)  # e.g. a pinned pack went bad here: list it whole again
        return self.client.get_kb(target.namespace, target.kb, target.variant)

    def _current(self, old: dict | None, info, whole: bool) -> bool:
        """The local manifest names the cloud's packs and is complete here (`_complete`)."""
        return bool(old) and old["fingerprint"] == info.model_fingerprint \
            and [s["pack_id"] for s in old["segments"]] == [s.pack_id for s in info.segments] \
            and self._complete(old, whole)

    def _complete(self, old: dict, whole: bool) -> bool:
        """The manifest's transforms are installed and every segment indexed (and, for a KB
        served whole, every pack is cached)."""
        return (not whole or all(self.cache.has(s["pack_id"]) for s in old["segments"])) \
            and self._transforms_present(old) and all(map(_indexed, old["segments"]))

    def _fetch_all(self, namespace: str, segments) -> int:
        """Fetch every pack the cache lacks, pinned as they arrive (an eviction between two
        transfers must not drop the first); returns how many were fetched."""
        self.cache.pinned = self.cache.pinned | {s.pack_id for s in segments}
        count = 0
        for seg in segments:
            if self._stop.is_set():
                raise FetchStopped("stopped while syncing")
            count += self.fetcher.fetch(namespace, seg.pack_id)
        return count

    def _index(self, namespace: str, segments, known: dict) -> dict[str, dict]:
        """Per pack: its segment's text (for BM25), the kvtc transforms it needs, its token
        ids (`encode_ids`: never the text tokenized again, which can give other ids) and
        whether it was prefilled behind the chat prefix — from the last local manifest, else
        the cached pack, else the pack's first bytes fetched (`Fetcher.manifests`: MAX_HEADS
        packs a call, a few calls at a time)."""
        from kvedge.common.pack.codecs.kvtc import referenced_transforms

        index = {pid: {key: known[pid][key] for key in INDEXED}
                 for pid in dict.fromkeys(s.pack_id for s in segments) if pid in known}
        todo = [pid for pid in dict.fromkeys(s.pack_id for s in segments) if pid not in index]
        manifests = {pid: m for pid in todo if (m := self._cached_manifest(pid)) is not None}
        todo = [pid for pid in todo if pid not in manifests]
        batches = [todo[i:i + MAX_HEADS] for i in range(0, len(todo), MAX_HEADS)]
        with ThreadPoolExecutor(INDEX_FETCHES) as pool:  # a few calls in flight at once
            for got in pool.map(lambda b: self.fetcher.manifests(namespace, b), batches):
                manifests.update(got)
        for pid, manifest in manifests.items():
            index[pid] = {"text": self.detokenize(manifest.token_ids),
                          "transforms": sorted(referenced_transforms(manifest)),
                          "token_ids": encode_ids(manifest.token_ids),
                          "anchored": bool(manifest.anchor),
                          "side_tensors": bool(manifest.side)}
        return index

    def _cached_manifest(self, pack_id: str):
        """A cached pack's manifest, read from its file's first bytes (None: not cached)."""
        if self.cache.has(pack_id):
            try:
                with mapped(self.cache.path(pack_id)) as data:  # header and manifest only
                    return read_manifest(data)
            except FileNotFoundError:  # evicted meanwhile
                pass
        return None

    @property
    def transforms(self):
        """The kvtc TransformStore transforms are installed in."""
        if self._transforms is None:
            from kvedge.common.pack.codecs.kvtc import default_store

            self._transforms = default_store()
        return self._transforms

    def _transforms_present(self, local: dict) -> bool:
        """The transforms a local manifest's packs need are installed (a manifest written
        before transforms were recorded does not say: no)."""
        needed = local.get("transforms")
        return needed is not None and all(self.transforms.has(d) for d in needed)

    def _fetch_transforms(self, namespace: str, digests: set[str]) -> None:
        """Fetch each transform this edge lacks; bytes that do not hash to its digest raise
        TransformMismatch and nothing is installed."""
        for digest in sorted(d for d in digests if not self.transforms.has(d)):
            data = self.client.fetch_transform(namespace, digest)
            self.transform_bytes += len(data)
            self.transforms.add(digest, data)
            log.info("installed kvtc transform %s… (%d bytes)", digest[:16], len(data))

    def local(self, target: Target) -> dict | None:
        """The target's local manifest; parsed again only when its file changed (every
        poll reads it, and a 20,000-segment KB's is ~16 MB of JSON: its texts and token
        ids). The caller must not change what it returns."""
        path = manifest_path(self.state_dir, target)
        try:
            st = path.stat()
        except FileNotFoundError:
            self._locals.pop(target, None)
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        known = self._locals.get(target)
        if known is None or known[0] != stamp:
            known = self._locals[target] = (stamp, json.loads(path.read_text()))
        return known[1]

    def run(self, interval: float = 5.0) -> None:
        """Sync forever (until stop()); failures are logged and retried, serving goes on."""
        while not self._stop.is_set():
            try:
                self.sync_once()
                self.last_error = None
            except Exception as err:  # noqa: BLE001 - the cloud may be down; keep serving
                self.last_error = f"{type(err).__name__}: {err}"  # sync_once logged each one
            self._stop.wait(interval)

    def start(self, interval: float = 5.0) -> None:
        """Sync in a background thread every `interval` seconds, until stop()."""
        self._thread = threading.Thread(target=self.run, args=(interval,), name="sync",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop syncing and the fetcher; waits up to `timeout` s for a sync in progress to
        end (a pack being fetched stops at its next chunk, resumable)."""
        self._stop.set()
        self.fetcher.stop()
        if self._thread is not None:
            self._thread.join(timeout)


def _indexed(segment: dict) -> bool:
    """A local manifest's segment has everything `Syncer._index` reads from its pack (one
    written by an older edge lacks the token ids: its packs' manifests are read again)."""
    return all(key in segment for key in INDEXED)
