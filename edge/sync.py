"""Keep the local pack cache in step with the cloud for the KBs this edge serves.

For each served KB (namespace, name, variant) the syncer fetches the packs it lacks —
resuming broken transfers from what it holds — verifies them, then the kvtc transforms those
packs reference and this edge lacks (packs written with `kvtc:embed=false`; each checked
against its blake3 before it is installed), and only then rewrites the KB's local manifest
(`kbs/<ns>/<name>[@variant].json`: segments, pack ids, segment texts for retrieval, the
transforms). The engine answers from local manifests alone, so the edge keeps answering when
the cloud is down, and never sees a KB it cannot decode.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from kvedge.common.net.auth import check_name, check_variant
from kvedge.common.fsutil import mapped, write_json_atomic
from kvedge.common.pack.container import read_manifest

log = logging.getLogger("kvedge.sync")


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


def manifest_path(state_dir: Path, target: Target) -> Path:
    name = target.kb + (f"@{target.variant}" if target.variant else "")
    return Path(state_dir) / "kbs" / target.namespace / f"{name}.json"


class Syncer:
    """`transforms`: the kvtc TransformStore transforms are installed in (default: this
    machine's, `<KVEDGE_HOME>/transforms`, where the decoder reads them)."""

    def __init__(self, client, cache, state_dir: Path | str, targets: list[Target], detokenize,
                 transforms=None):
        self.client, self.cache, self._transforms = client, cache, transforms
        self.state_dir = Path(state_dir)
        self.targets = targets
        self.detokenize = detokenize
        self.last_error: str | None = None
        # since start (edge.metrics reports them); bytes: of packs and of kvtc transforms
        self.fetched_bytes = self.fetched_packs = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync_once(self) -> dict[str, int]:
        """Fetch what is missing for every target; returns packs fetched per target.

        One target failing (removed in the cloud, a corrupt pack) does not keep the others
        from syncing: every target is tried, the cache re-pinned, then the first failure is
        raised again (the others are logged)."""
        fetched, failures = {}, []
        for target in self.targets:
            try:
                fetched[target.key] = self._sync(target)
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
        """Packs any local KB manifest names: what the engine may load, so what stays pinned
        (a KB this edge no longer serves keeps answering from its last sync)."""
        return {seg["pack_id"] for path in (self.state_dir / "kbs").glob("*/*.json")
                for seg in json.loads(path.read_text())["segments"]}

    def _sync(self, target: Target) -> int:
        info = self.client.get_kb(target.namespace, target.kb, target.variant)
        if not info.segments:
            return 0  # still ingesting for the first time
        old = self.local(target)
        if old and old["fingerprint"] == info.model_fingerprint and \
                [s["pack_id"] for s in old["segments"]] == [s.pack_id for s in info.segments] \
                and all(self.cache.has(s.pack_id) for s in info.segments) \
                and self._transforms_present(old):
            return 0
        from kvedge.common.pack.codecs.kvtc import referenced_transforms

        count, segments, transforms = 0, [], set()
        for seg in info.segments:
            if not self.cache.has(seg.pack_id):
                self._fetch(target.namespace, seg.pack_id)
                count += 1
            with mapped(self.cache.path(seg.pack_id)) as data:  # header and manifest only
                manifest = read_manifest(data)
            transforms |= referenced_transforms(manifest)
            segments.append({"index": seg.index, "pack_id": seg.pack_id, "source": seg.source,
                             "n_tokens": seg.n_tokens, "pack_bytes": seg.pack_bytes,
                             "text": self.detokenize(manifest.token_ids)})
        self._fetch_transforms(target.namespace, transforms)  # before a manifest names them
        write_json_atomic(manifest_path(self.state_dir, target),
                    {"namespace": target.namespace, "kb": target.kb, "variant": target.variant,
                     "fingerprint": info.model_fingerprint, "mode": info.mode,
                     "transforms": sorted(transforms), "segments": segments})
        log.info("synced %s: %d segments (%d fetched)", target.key, len(segments), count)
        return count

    def _fetch(self, namespace: str, pack_id: str) -> None:
        offset = self.cache.held(pack_id)
        for chunk in self.client.fetch_pack(namespace, pack_id, offset):
            self.cache.append(pack_id, chunk.offset, chunk.data)
            self.fetched_bytes += len(chunk.data)
            if self._stop.is_set():  # stopping: keep what arrived, resume it next start
                raise SyncStopped(f"stopped while fetching {pack_id[:16]}…")
        self.cache.commit(pack_id)
        self.fetched_packs += 1

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
            self.fetched_bytes += len(data)
            self.transforms.add(digest, data)
            log.info("installed kvtc transform %s… (%d bytes)", digest[:16], len(data))

    def local(self, target: Target) -> dict | None:
        path = manifest_path(self.state_dir, target)
        return json.loads(path.read_text()) if path.exists() else None

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
        """Stop syncing; waits up to `timeout` s for a sync in progress to end (a pack being
        fetched stops at its next chunk, resumable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


class SyncStopped(Exception):
    """Raised inside a sync when the syncer is stopped mid-fetch (never leaves the syncer)."""
