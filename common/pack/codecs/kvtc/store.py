"""Where kvtc's transforms live on a machine: `<KVEDGE_HOME>/transforms/<digest>.kvtc`, each
checked against its name on load, and which digest was calibrated for each model.

The cloud worker that first encodes with kvtc for a model calibrates its transform here
(`model_transform`); an edge's sync installs the transforms its packs reference (`add`).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from kvedge.common.fsutil import write_atomic
from kvedge.common.pack.codecs.kvtc.fit import calibrate
from kvedge.common.pack.codecs.kvtc.transform import DIGEST, Transform, check_digest
from kvedge.common.pack.errors import TransformMismatch, TransformMissing

log = logging.getLogger("kvedge.kvtc")


class TransformStore:
    """Transforms on disk by digest (`<root>/<digest>.kvtc`, written atomically, checked on
    every load) and the digest calibrated for each model (`<root>/models/<fingerprint>`)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._loaded: dict[str, Transform] = {}

    def path(self, digest: str) -> Path:
        if not DIGEST.match(digest):
            raise TransformMismatch(digest, "is not a blake3 hex digest")
        return self.root / f"{digest}.kvtc"

    def has(self, digest: str) -> bool:
        """Whether the file is here (a string that is not a digest never is)."""
        return bool(DIGEST.match(digest)) and self.path(digest).exists()

    def add(self, digest: str, data: bytes) -> None:
        """Install a transform file received from elsewhere (the edge's sync): bytes that do
        not hash to `digest` raise TransformMismatch and nothing is written; good ones are
        written atomically (a reader sees no file or the whole one)."""
        path = self.path(digest)
        check_digest(digest, data, f"the {len(data)} bytes received")
        write_atomic(path, data, 0o644)

    def save(self, t: Transform, model: str | None = None) -> str:
        digest = t.digest
        if not self.path(digest).exists():
            write_atomic(self.path(digest), t.to_bytes(), 0o644)
        if model:
            write_atomic(self.root / "models" / model, digest.encode(), 0o644)
        self._loaded[digest] = t
        return digest

    def load(self, digest: str) -> Transform:
        if digest not in self._loaded:
            path = self.path(digest)
            if not path.exists():
                raise TransformMissing(digest, str(self.root))
            data = path.read_bytes()
            check_digest(digest, data, f"the bytes of {path}")
            self._loaded[digest] = Transform.from_bytes(data, digest)
        return self._loaded[digest]

    def for_model(self, fingerprint: str) -> str | None:
        index = self.root / "models" / fingerprint
        return index.read_text().strip() if index.exists() else None


# one store per folder, so a process loads (and checks) each transform once
_STORES: dict[Path, TransformStore] = {}


def default_store() -> TransformStore:
    """The transforms folder of this machine: <KVEDGE_HOME>/transforms."""
    from kvedge.common.model.models import kvedge_home

    root = kvedge_home() / "transforms"
    return _STORES.setdefault(root, TransformStore(root))


def model_transform(rt, store: TransformStore | None = None) -> Transform:
    """The model's transform from the store, calibrated (and saved) on first use."""
    store = store or default_store()
    digest = store.for_model(rt.loaded.fingerprint)
    if digest:
        try:
            return store.load(digest)
        except (TransformMissing, TransformMismatch) as err:
            log.warning("recalibrating kvtc: %s", err)
    start = time.perf_counter()
    t = calibrate(rt)
    store.save(t, rt.loaded.fingerprint)
    log.info("calibrated kvtc transform %s… for %s in %.1f s", t.digest[:16],
             rt.loaded.fingerprint[:16], time.perf_counter() - start)
    return t
