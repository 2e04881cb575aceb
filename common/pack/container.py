"""The one-file pack container: header, canonical manifest, payload. Torch-free.

Layout (all integers little-endian), so a pack streams as one file with resumable offsets:

    offset  size  field
    0       8     magic b"KVEPACK\\0"
    8       4     format version (u32)           — fixed forever: readers check it first
    12      4     flags (u32, must be 0)
    16      8     manifest length M (u64)        — as stored
    24      8     payload length P (u64)
    32      32    blake3(manifest bytes as stored)
    64      32    blake3(payload bytes)
    96      M     manifest
    96+M    P     payload

Format 2 (written since 2026-11-23) stores the manifest as one zstd frame of its canonical JSON
(manifest.Manifest.to_json) and the payload as the tensors' parts laid end to end, each part's
dtype and shape in its manifest entry (`TensorEntry.layout`). On a 165-token SmolLM2 pack
(240 tensors) the framing fell from 129 KB (83 KB of JSON manifest, 46 KB of safetensors
header) to 11.7 KB: 783 → 71 bytes per token, on packs of ~12 KB per token (int8+zstd).
Format 1 (read, no longer written): the manifest as plain JSON and the payload a safetensors
file whose tensor t's part p is named "t/p".

The pack id (its content address) is blake3 over the whole file. Every payload tensor also
has its own checksum in the manifest, so corruption is reported against the tensor it hit;
the payload hash in the header then catches what no tensor owns (format 1's safetensors
header).
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import blake3
import zstandard

from kvedge.common.pack.errors import PackCorrupt, PackVersionError
from kvedge.common.pack.manifest import SUPPORTED_VERSIONS, Manifest, part_nbytes

MAGIC = b"KVEPACK\0"
_HEADER = struct.Struct("<8sIIQQ32s32s")
HEADER_SIZE = _HEADER.size  # 96
PACK_ID = re.compile(r"^[0-9a-f]{64}$")  # a pack's name: the hex blake3 of its bytes
# A format-2 manifest inflates to at most this: a forged frame cannot exhaust memory. The
# largest real manifests are evicted long contexts' kept-position runs (~1.5 MB at 100K
# tokens with every head keeping every other token).
MAX_MANIFEST_BYTES = 1 << 28
_MANIFEST_LEVEL = 19  # ~10 ms for an 83 KB manifest; 7.7× smaller than the JSON


def digest(data) -> str:
    return blake3.blake3(data).hexdigest()


def pack_id(data: bytes | memoryview) -> str:
    """Content address of a pack: blake3 hex over its bytes (never Python's hash())."""
    return digest(data)


@dataclass(frozen=True)
class RawPart:
    """One payload part as stored: safetensors dtype name, shape, and its bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview


def tensor_checksum(name: str, codec: str, params: dict,
                    parts: list[tuple[str, RawPart]]) -> str:
    """blake3 binding a tensor's name, codec and params (canonical JSON) to its parts' bytes:
    a changed decoding recipe is as much corruption as a changed byte."""
    h = blake3.blake3()
    recipe = json.dumps([name, codec, params], sort_keys=True, separators=(",", ":"))
    h.update(recipe.encode() + b"\n")
    for part_name, part in parts:
        h.update(f"{part_name}|{part.dtype}|{list(part.shape)}\n".encode())
        h.update(part.data)
    return h.hexdigest()


# ---------------------------------------------------------------------- writing
def assemble(manifest_json: bytes, payload: bytes, version: int) -> bytes:
    """Header + the manifest as `version` stores it + payload."""
    stored = store_manifest(manifest_json, version)
    header = _HEADER.pack(MAGIC, version, 0, len(stored), len(payload),
                          blake3.blake3(stored).digest(), blake3.blake3(payload).digest())
    return header + stored + payload


def store_manifest(manifest_json: bytes, version: int) -> bytes:
    """The manifest's stored bytes: format 1 plain JSON, format 2 one zstd frame of it."""
    if version < 2:
        return manifest_json
    return zstandard.ZstdCompressor(level=_MANIFEST_LEVEL).compress(manifest_json)


def lay_out(parts: list[RawPart]) -> bytes:
    """A format-2 payload: the parts' bytes end to end, in the manifest's canonical order."""
    return b"".join(bytes(p.data) for p in parts)


# ---------------------------------------------------------------------- reading
@dataclass
class Container:
    """A parsed pack whose header and manifest are verified; payload parts are verified as
    they are read (`tensor_parts`), and `verify_payload` covers the bytes no tensor owns."""

    manifest: Manifest
    parts: dict[str, RawPart]  # "tensor/part" → bytes
    payload: memoryview
    payload_hash: bytes

    def tensor_parts(self, name: str) -> list[tuple[str, RawPart]]:
        """The parts of one tensor, verified against its checksum."""
        entry = self.manifest.tensors[name]
        try:
            parts = [(p, self.parts[f"{name}/{p}"]) for p in entry.parts]
        except KeyError as err:
            raise PackCorrupt(f"payload lacks part {err.args[0]!r}", name) from None
        if tensor_checksum(name, entry.codec, entry.params, parts) != entry.checksum:
            raise PackCorrupt("checksum mismatch", name)
        return parts

    def verify_payload(self) -> None:
        if blake3.blake3(self.payload).digest() != self.payload_hash:
            raise PackCorrupt("payload checksum mismatch outside every tensor "
                              "(safetensors header)")

    def first_damaged(self) -> str | None:
        """Name of the first tensor whose parts are missing or damaged, if any."""
        for name in self.manifest.expected_tensors():
            try:
                self.tensor_parts(name)
            except PackCorrupt:
                return name
        return None


def read_header(data: bytes | memoryview) -> tuple[int, int, int, bytes, bytes]:
    """(version, manifest length, payload length, manifest hash, payload hash)."""
    if len(data) < 12 or bytes(data[:8]) != MAGIC:
        raise PackCorrupt("not a kvedge pack (bad magic or shorter than its header)")
    version = struct.unpack_from("<I", data, 8)[0]
    if version not in SUPPORTED_VERSIONS:
        raise PackVersionError(version, SUPPORTED_VERSIONS)
    if len(data) < HEADER_SIZE:
        raise PackCorrupt(f"truncated header ({len(data)} of {HEADER_SIZE} bytes)")
    _, _, flags, m_len, p_len, m_hash, p_hash = _HEADER.unpack_from(data)
    if flags != 0:
        raise PackCorrupt(f"header flags are {flags:#x}, this version writes 0")
    return version, m_len, p_len, m_hash, p_hash


def manifest_json(data: bytes | memoryview) -> bytes:
    """The manifest's canonical JSON, its stored bytes verified against the header."""
    version, m_len, _, m_hash, _ = read_header(data)
    raw = bytes(data[HEADER_SIZE: HEADER_SIZE + m_len])
    if len(raw) != m_len:
        raise PackCorrupt(f"truncated manifest ({len(raw)} of {m_len} bytes)")
    if blake3.blake3(raw).digest() != m_hash:
        raise PackCorrupt("manifest checksum mismatch")
    if version < 2:
        return raw
    try:
        size = zstandard.frame_content_size(raw)  # -1: not recorded in the frame
        if size > MAX_MANIFEST_BYTES:
            raise zstandard.ZstdError(f"its frame records {size:,} bytes")
        return zstandard.ZstdDecompressor().decompress(raw, max_output_size=MAX_MANIFEST_BYTES)
    except zstandard.ZstdError as err:
        raise PackCorrupt(f"manifest does not inflate ({err}; at most "
                          f"{MAX_MANIFEST_BYTES:,} bytes)") from None


# A first ranged read of a pack takes this much beyond the header, so one round trip gets the
# manifest of packs whose manifest fits (a 240-tensor SmolLM2 pack's is ~12 KB); a longer one
# costs a second read, of exactly the rest.
MANIFEST_GUESS = 32 * 1024


def read_head(read: Callable[[int, int], bytes]) -> bytes:
    """A pack's header and manifest, whole, through `read(offset, length)` (a ranged read of
    a pack elsewhere: a fetch, a store): HEADER_SIZE + MANIFEST_GUESS bytes first, then the
    rest of a longer manifest."""
    head = read(0, HEADER_SIZE + MANIFEST_GUESS)
    end = HEADER_SIZE + read_header(head)[1]
    if len(head) < end:
        head += read(len(head), end - len(head))
    return head[:end]


def read_manifest(data: bytes | memoryview) -> Manifest:
    """Parse and verify the header and manifest only (cheap: no payload hashing)."""
    version = read_header(data)[0]
    manifest = Manifest.from_json(manifest_json(data))
    if manifest.version != version:
        raise PackCorrupt(f"header says version {version}, manifest {manifest.version}")
    return manifest


def open_container(data: bytes | memoryview) -> Container:
    """Verify header, manifest and payload framing; tensors are checked as they are read."""
    data = memoryview(data)
    manifest = read_manifest(data)
    _, m_len, p_len, _, p_hash = read_header(data)
    payload = data[HEADER_SIZE + m_len:]
    if manifest.version < 2:
        parts, laid_out = parse_safetensors(payload), p_len
    else:
        parts, laid_out = laid_out_parts(manifest, payload)
    container = Container(manifest, parts, payload, p_hash)
    if len(payload) != p_len:
        raise PackCorrupt(f"pack is {len(payload) - p_len:+d} bytes off its recorded length",
                          container.first_damaged())
    if laid_out != p_len:
        raise PackCorrupt(f"manifest lays out {laid_out:,} payload bytes, the header records "
                          f"{p_len:,}")
    return container


def laid_out_parts(manifest: Manifest, payload: memoryview) -> tuple[dict[str, RawPart], int]:
    """A format-2 payload's parts (those cut off are left out) and the bytes the manifest
    lays out."""
    parts, offset = {}, 0
    for name in manifest.expected_tensors():
        entry = manifest.tensors[name]
        for part, (dtype, shape), size in zip(entry.parts, entry.layout, entry.part_sizes()):
            if offset + size <= len(payload):
                parts[f"{name}/{part}"] = RawPart(dtype, shape, payload[offset: offset + size])
            offset += size
    return parts, offset


def parse_safetensors(buf: memoryview) -> dict[str, RawPart]:
    """Minimal torch-free safetensors reader; parts whose bytes are cut off are left out."""
    if len(buf) < 8:
        raise PackCorrupt("payload is shorter than its safetensors header")
    n = struct.unpack_from("<Q", buf)[0]
    if n > len(buf) - 8:
        raise PackCorrupt("payload safetensors header is cut off")
    try:
        header = json.loads(bytes(buf[8: 8 + n]).decode("utf-8"))
    except (ValueError, RecursionError):
        raise PackCorrupt("payload safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise PackCorrupt("payload safetensors header is not a JSON object")
    body = buf[8 + n:]
    parts = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        part = _raw_part(info, body)
        if part is not None:
            parts[name] = part
    return parts


def _raw_part(info, body: memoryview) -> RawPart | None:
    try:
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not all(_is_count(s) for s in shape):
            return None
        size = part_nbytes(dtype, shape)
    except (TypeError, KeyError, ValueError):
        return None  # unreadable entry: the tensor owning it fails its checksum by name
    if not (isinstance(begin, int) and isinstance(end, int)) or not 0 <= begin <= end \
            or end - begin != size or end > len(body):
        return None
    return RawPart(dtype, tuple(shape), body[begin:end])


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
