"""Eviction scores kept across bench runs: a method's scores of a context are query-agnostic
and budget-free, and depend only on the model, the context and the method's options, so a
later run (a cut-off eviction cell resumed, another budget, another codec) reads them instead
of scoring again — on 2 cores that is most of an eviction cell's time (ruler-niah at 4K on
Qwen2.5-0.5B: ~1 min of ContrastKV or KVzip scoring per item against a ~30 s prefill).

`ScoreStore` keeps, per key, a list of tensors and the seconds they took to compute:
`OUT/scores/<key>.safetensors`, its metadata holding the seconds and a sha256 over the
tensors' bytes. A file is written aside and renamed into place whole; one that fails to load
or its digest is removed and computed again. `KeptSignals` is a `SignalMemo` (signals two
methods share, KVzip's reconstruction being ContrastKV's positive signal) backed by a
store, so a method scored in a later process still reuses the signal an earlier one probed.
The seconds kept are those measured when the value was computed: reused, they are charged
again as the work a compression job would do. As with `kvedge.bench.pack_store`, a change to
the runtime's arithmetic or a method's code is not in the key: delete the folder after one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from pathlib import Path

import torch

from kvedge.bench.pack_store import pack_key
from kvedge.cloud.eviction.scoring import SignalMemo

log = logging.getLogger("kvedge.bench.scores")


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(repr((t.dtype, tuple(t.shape))).encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class ScoreStore:
    """[tensor] and the seconds they took, by key (`pack_key` of what they depend on)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def get(self, key: str) -> tuple[list[torch.Tensor], float] | None:
        """The kept (tensors, seconds), or None on a miss or a bad file (removed then)."""
        from safetensors import safe_open

        path = self.root / f"{key}.safetensors"
        if not path.is_file():
            return None
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata()
                tensors = [f.get_tensor(str(i)) for i in range(int(meta["count"]))]
            if _digest(tensors) != meta["sha256"]:
                raise ValueError("its tensors do not match their digest")
            return tensors, float(meta["seconds"])
        except Exception as err:  # noqa: BLE001 - any unreadable entry: compute it again
            log.warning("score store entry %s is bad (%s: %s): removed, it is computed again",
                        path.name, type(err).__name__, err)
            path.unlink(missing_ok=True)
            return None

    def put(self, key: str, tensors: list[torch.Tensor], seconds: float) -> None:
        from safetensors.torch import save_file

        self.root.mkdir(parents=True, exist_ok=True)
        tensors = [t.detach().cpu().contiguous() for t in tensors]
        aside = self.root / f".{key}.{uuid.uuid4().hex}.tmp"
        try:
            save_file({str(i): t for i, t in enumerate(tensors)}, str(aside),
                      metadata={"count": str(len(tensors)), "seconds": repr(seconds),
                                "sha256": _digest(tensors)})
            os.replace(aside, self.root / f"{key}.safetensors")
        finally:
            aside.unlink(missing_ok=True)


class KeptSignals(SignalMemo):
    """A SignalMemo whose signals (lists of tensors) are also kept in `store`, keyed by the
    model's fingerprint and the signal's own key (which holds the context's tokens)."""

    def __init__(self, store: ScoreStore, model: str):
        super().__init__()
        self.store, self.model = store, model

    def get(self, key: tuple, probe):
        if key in self._kept:
            return super().get(key, probe)
        stored = pack_key(model=self.model, signal=json.dumps(key, default=repr))
        kept = self.store.get(stored)
        if kept is not None:
            value, seconds = kept
            self._kept[key] = (value, seconds)
            self.reused_s += seconds
            return value
        value = super().get(key, probe)
        self.store.put(stored, list(value), self._kept[key][1])
        return value
