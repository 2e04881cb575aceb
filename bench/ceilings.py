"""Ceiling rows kept across runs: a recompute (or full-KV) answer is deterministic, so a later
run over the same questions reads it instead of paying for it again. Torch-free.

The same store keeps an unfinished cell's rows item by item (`partial.jsonl`): a cell cut
off (a session's end, a crash) resumes at its first unmeasured item, and its entries are
discarded once the cell's row is written, so a cell measured again starts afresh.

A run's output folder holds `ceilings.jsonl`, one line per item: {"key", "item", "rows"}. The
key is a digest of everything the ceiling's answers depend on — the model's fingerprint, the
item's documents and questions (text, references, instruction), the decode budget and how the
prompt is built (codec, segment size, anchoring, order) — so a changed prompt or model is a
miss, never a stale hit. A change to the runtime's arithmetic is not in the key: delete the
file after one. The rows keep their timings (TTFT) as measured when they were made:
a later run's TTFT ratio is then against a ceiling timed in another process on the same
machine (`summarize` marks such cells `ceiling_cached`).
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict
from pathlib import Path


def ceiling_key(item, **prompt) -> str:
    """sha256 over the item's content and the prompt's settings (`prompt`: model fingerprint,
    codec, decode budget, ...; any JSON value)."""
    content = {"documents": item.documents, "questions": [asdict(q) for q in item.questions],
               **prompt}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


class CeilingStore:
    """Item rows by key in a JSON-lines file; appended one line per item, so a run that stops
    keeps what it measured (a torn last line is ignored)."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._rows = self._read()
        self._lock = threading.Lock()  # hotpot-kb measures items from several threads

    def _read(self) -> dict[str, list[dict]]:
        return {key: entry["rows"] for key, entry in read_entries(self.path).items()}

    def get(self, key: str) -> list[dict] | None:
        return self._rows.get(key)

    def put(self, key: str, item_key: str, rows: list[dict], **about) -> None:
        """Keep `rows` under `key`; `about` (JSON values) goes into the line beside them
        (a partial entry's cell and its ceiling's key: `kvedge.bench.unfinished`)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path, "ab") as f:
            torn = f.tell() and _last_byte(self.path) != b"\n"  # a crash cut the last line
            line = json.dumps({"key": key, "item": item_key, **about, "rows": rows}) + "\n"
            f.write((b"\n" if torn else b"") + line.encode())
        self._rows[key] = rows

    def discard(self, keys) -> None:
        """Forget `keys`: the file is rewritten without them (to a temporary file, then
        renamed, so a crash leaves the old file or the new one, never half of one)."""
        keys = set(keys) & set(self._rows)
        if not keys:
            return
        kept = [line for line in self.path.read_text().splitlines() if line.strip()
                and _entry_key(line) not in keys]
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        tmp.replace(self.path)
        for key in keys:
            del self._rows[key]


def read_entries(path: Path) -> dict[str, dict]:
    """A store's entries by key, each the whole line ({"key", "item", "rows", ...}), the last
    of a key winning; a torn line (a crash's) is skipped; no file: none."""
    if not Path(path).exists():
        return {}
    out = {}
    for line in Path(path).read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash
            continue
        out[entry["key"]] = entry
    return out


def _entry_key(line: str) -> str | None:
    try:
        return json.loads(line)["key"]
    except (json.JSONDecodeError, KeyError):
        return None


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1)
