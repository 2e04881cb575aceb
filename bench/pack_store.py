"""Document packs kept across bench runs: a document's packs (its segments prefilled and
encoded in a codec) depend only on the model, the text and how it was cut and encoded, so a
later run over the same documents reads them instead of prefilling again — on 2 cores that
is most of a reuse cell's time (300 hotpot-fixed items: 3,000 paragraphs, ~50 min for
Qwen2.5-0.5B, against ~8 min for a strategy that recomputes nothing over them).

A run's output folder holds `packs/<key>/`: the pack files and `manifest.json` listing them
in order with their sizes. The key is a digest of the model's fingerprint, the text, whether
it is one pack or segments (and the segment size), the codec and the anchoring, so another
model, text or codec is a miss, never a stale hit. An entry is written in a temporary folder
and renamed into place whole, so a run that stops never leaves half an entry; an entry that
fails its check when read (a file missing, a size changed, a pack failing its checksums or
bound to another model) is removed and made again. As with `kvedge.bench.ceilings`, a change
to the runtime's arithmetic is not in the key: delete the folder after one. Packs made by
another process on the same machine are the same prefill up to the thread count's float
rounding; the cells of one run all read the same packs, so their comparisons stay paired.
Torch-free.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable

log = logging.getLogger("kvedge.bench.packs")
MANIFEST = "manifest.json"


def pack_key(**what) -> str:
    """sha256 over what a document's packs depend on (model fingerprint, text, codec, ...;
    any JSON values)."""
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:40]


class PackStore:
    """Entries of [(file name, pack bytes)] by key under `root`."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def get(self, key: str, check: Callable[[Path], object]) -> list[tuple[Path, int]] | None:
        """The entry's [(pack file, bytes)] in order, each passed to `check` (which raises
        on a bad pack); None on a miss, or where the entry fails (it is removed then)."""
        entry = self.root / key
        try:
            listed = json.loads((entry / MANIFEST).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            return self._drop(entry, f"its manifest is unreadable ({err})")
        out = []
        for name, size in listed:
            path = entry / name
            if not path.is_file() or path.stat().st_size != size:
                return self._drop(entry, f"{name} is missing or not {size} bytes")
            try:
                check(path)
            except Exception as err:  # noqa: BLE001 - any failed check: make it again
                return self._drop(entry, f"{name} failed its check "
                                         f"({type(err).__name__}: {err})")
            out.append((path, size))
        return out

    def put(self, key: str, packs: list[tuple[str, bytes]]) -> list[tuple[Path, int]]:
        """Keep [(file name, pack bytes)] as the entry `key` (written aside, then renamed into
        place whole; where another process kept it first, theirs is used)."""
        self.root.mkdir(parents=True, exist_ok=True)
        aside = self.root / f".{key}.{uuid.uuid4().hex}.tmp"
        aside.mkdir()
        try:
            for name, data in packs:
                (aside / name).write_bytes(data)
            (aside / MANIFEST).write_text(json.dumps([[n, len(d)] for n, d in packs]))
            try:
                os.rename(aside, self.root / key)
            except OSError:  # kept meanwhile by another run: theirs stands
                pass
        finally:
            shutil.rmtree(aside, ignore_errors=True)
        return [(self.root / key / name, len(data)) for name, data in packs]

    def _drop(self, entry: Path, why: str) -> None:
        log.warning("pack store entry %s is bad (%s): removed, it is made again", entry.name,
                    why)
        shutil.rmtree(entry, ignore_errors=True)
        return None
