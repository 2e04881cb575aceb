"""The pack manifest: what a pack holds, as canonical JSON. Torch-free (STYLE.md rule 2).

A manifest names the model the KV belongs to, the context's tokens and original positions,
its segments, and — because eviction makes a pack ragged (docs/design.md, decision 2) — for every
(layer, KV head) the sorted original positions that head keeps. Position lists are stored as
runs `[first, count]` of consecutive positions: a dense pack costs a few bytes per head
instead of a few bytes per token, and nothing is padded.

How the KV was prefilled (docs/design.md, decision 9) is `anchor`: the token ids the context sat
behind when it was prefilled (at positions -len(anchor)..-1; its own positions are unchanged),
empty when it was prefilled alone from position 0. It is written only when non-empty, so a pack
prefilled alone has the same bytes (and id) as before the field existed, and a pack without it
(any older pack) reads as prefilled alone. It needs no format version: a reader that ignores it
still reads valid pre-RoPE KV of the context's tokens.

Every payload tensor has an entry: its codec (a registry name such as "int4+zstd"), the
codec's parameters (what decoding needs), the names of its parts in the payload, and a blake3
checksum over those parts. From format 2 on an entry also gives each part's `layout` (dtype,
shape): the payload is the parts laid end to end in `expected_tensors` order, so it needs no
header of its own (format 1's payload was a safetensors file, whose JSON header cost ~46 KB
on a 240-tensor pack). `Manifest.from_json` validates everything that can be checked
without the payload and raises `PackCorrupt` for anything malformed, so code downstream of it
can trust shapes and index ranges.
"""
from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass, field
from itertools import islice
from typing import NamedTuple

from kvedge.common.pack.errors import PackCorrupt, PackVersionError

FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
# payload part dtypes (safetensors' names) → bytes per element
DTYPE_SIZES = {"U8": 1, "I8": 1, "I16": 2, "F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I64": 8}
_HEX = re.compile(r"[0-9a-f]+")
_MAX_INDEX = 1 << 40  # positions / token ids beyond this are corruption, not data
_INT = {int}


def part_nbytes(dtype: str, shape) -> int:
    """Bytes of a payload part of this dtype (a DTYPE_SIZES key) and shape."""
    n = DTYPE_SIZES[dtype]
    for s in shape:
        n *= s
    return n


class KVShape(NamedTuple):
    """A model's KV cache per token: layers × KV heads × head dim (a manifest's `shape`)."""

    n_layers: int
    n_kv_heads: int
    head_dim: int

    def fp16_bytes(self, n_tokens: int) -> int:
        """What n tokens' full KV takes in fp16 — K and V, 2 bytes an element: the yardstick
        every pack's size is measured against."""
        return n_tokens * self.n_layers * self.n_kv_heads * self.head_dim * 2 * 2


@dataclass(frozen=True)
class TensorEntry:
    """One payload tensor: how it was encoded and how to check it."""

    codec: str
    params: dict
    parts: tuple[str, ...]  # payload names are f"{tensor}/{part}"
    checksum: str           # blake3 hex over name, codec, params, parts (container.py)
    layout: tuple[tuple[str, tuple[int, ...]], ...] = ()  # format ≥ 2: (dtype, shape) per part

    def to_dict(self) -> dict:
        doc = {"codec": self.codec, "params": self.params, "parts": list(self.parts),
               "checksum": self.checksum}
        if self.layout:
            doc["layout"] = [[dtype, list(shape)] for dtype, shape in self.layout]
        return doc

    def part_sizes(self) -> list[int]:
        """Bytes of each part, from the layout."""
        return [part_nbytes(dtype, shape) for dtype, shape in self.layout]


@dataclass
class Manifest:
    """Everything about a pack except the tensor bytes."""

    model_fingerprint: str
    tokenizer_id: str
    namespace: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    token_ids: list[int]
    positions: list[int]              # original position of each token, strictly increasing
    segments: list[tuple[int, int]]   # [start, end) token-index ranges, contiguous, cover all
    kept: list[list[list[int]]]       # [layer][head] sorted positions kept (subset of positions)
    tensors: dict[str, TensorEntry] = field(default_factory=dict)
    side: dict = field(default_factory=dict)  # {"block_summaries": {...}, "query_cache": {...}}
    anchor: list[int] = field(default_factory=list)  # prefilled behind these ids; [] = alone
    version: int = FORMAT_VERSION

    def __post_init__(self):
        validate(self)

    # ------------------------------------------------------------------ derived
    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def kv_shape(self) -> KVShape:
        return KVShape(self.n_layers, self.n_kv_heads, self.head_dim)

    def n_kept(self, layer: int, head: int) -> int:
        return len(self.kept[layer][head])

    def expected_tensors(self) -> list[str]:
        """Names the payload must hold, in canonical order."""
        names = [kv_name(kind, layer, head) for layer in range(self.n_layers)
                 for kind in ("k", "v") for head in range(self.n_kv_heads)]
        for side, prefix in (("block_summaries", "summary"), ("query_cache", "qcache")):
            if side in self.side:
                names += [f"{prefix}.{layer}" for layer in range(self.n_layers)]
        return names

    def expected_shape(self, name: str) -> tuple[int, ...]:
        """Decoded shape of a payload tensor (checked after decoding)."""
        prefix, *idx = name.split(".")
        layer = int(idx[0])
        if prefix in ("k", "v"):
            return (self.n_kept(layer, int(idx[1])), self.head_dim)
        if prefix == "summary":
            block = self.side["block_summaries"]["block_size"]
            return (self.n_kv_heads, -(-self.n_tokens // block), self.head_dim)
        qc = self.side["query_cache"]
        return (qc["heads"], qc["tokens"], self.head_dim)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        doc = {
            "format_version": self.version,
            "model_fingerprint": self.model_fingerprint,
            "tokenizer_id": self.tokenizer_id,
            "namespace": self.namespace,
            "shape": {"layers": self.n_layers, "kv_heads": self.n_kv_heads,
                      "head_dim": self.head_dim},
            "token_ids": self.token_ids,
            "positions": to_runs(self.positions),
            "segments": [list(s) for s in self.segments],
            "kept": [[to_runs(h) for h in layer] for layer in self.kept],
            "tensors": {name: e.to_dict() for name, e in self.tensors.items()},
            "side": self.side,
        }
        if self.anchor:  # absent = alone: unanchored packs keep their bytes
            doc["anchor"] = self.anchor
        return doc

    def to_json(self) -> bytes:
        """Canonical bytes: sorted keys, no whitespace, ASCII — equal manifests, equal bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=True, allow_nan=False).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> "Manifest":
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as err:  # incl. bad UTF-8, huge ints
            raise PackCorrupt(f"manifest is not valid JSON ({err})") from None
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc) -> "Manifest":
        d = _Fields(doc, "manifest")
        version = d.integer("format_version")
        if version not in SUPPORTED_VERSIONS:
            raise PackVersionError(version, SUPPORTED_VERSIONS)
        shape = _Fields(d.object("shape"), "shape")
        n_tokens = len(d.array("token_ids"))
        tensors = {}
        for name, entry in d.object("tensors").items():
            e = _Fields(entry, f"tensors.{name}")
            parts = tuple(_str_list(e.array("parts"), name))
            layout = _layout(e.array("layout"), name) if version >= 2 else ()
            tensors[name] = TensorEntry(e.string("codec"), e.object("params"), parts,
                                        e.string("checksum"), layout)
        kept = [[from_runs(h, n_tokens, "kept") for h in _list(layer, "kept")]
                for layer in d.array("kept")]
        segments = [tuple(_int_list(s, "segments")) for s in d.array("segments")]
        return cls(d.string("model_fingerprint"), d.string("tokenizer_id"), d.string("namespace"),
                   shape.integer("layers"), shape.integer("kv_heads"), shape.integer("head_dim"),
                   _int_list(d.array("token_ids"), "token_ids"),
                   from_runs(d.array("positions"), n_tokens, "positions"),
                   segments, kept, tensors, d.object("side"),
                   _int_list(doc.get("anchor", []), "anchor"), version)


def _layout(doc: list, name: str) -> tuple:
    """A format-2 entry's [[dtype, shape], ...] → ((dtype, (dims...)), ...), checked."""
    layout = []
    for item in doc:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and item[0] in DTYPE_SIZES
                and isinstance(item[1], list)
                and _indices(item[1])):
            raise PackCorrupt("manifest layout entries must be [dtype, [dims ≥ 0]]", name)
        layout.append((item[0], tuple(item[1])))
    return tuple(layout)


def kv_name(kind: str, layer: int, head: int) -> str:
    """Payload name of one head's keys ("k") or values ("v")."""
    return f"{kind}.{layer}.{head}"


# ---------------------------------------------------------------------- runs
def to_runs(xs: list[int]) -> list[list[int]]:
    """[3, 4, 5, 9] → [[3, 3], [9, 1]]: runs of consecutive integers as [first, count]."""
    runs: list[list[int]] = []
    for x in xs:
        if runs and runs[-1][0] + runs[-1][1] == x:
            runs[-1][1] += 1
        else:
            runs.append([x, 1])
    return runs


def from_runs(runs, limit: int, what: str) -> list[int]:
    """Inverse of `to_runs`; refuses more than `limit` values so garbage cannot exhaust memory."""
    pairs = [_int_list(r, what) for r in _list(runs, what)]
    if any(len(p) != 2 or p[1] < 1 for p in pairs):
        raise PackCorrupt(f"manifest field {what!r} has a run that is not [first, count ≥ 1]")
    if sum(p[1] for p in pairs) > limit:
        raise PackCorrupt(f"manifest field {what!r} lists more positions than the context has")
    return [first + i for first, count in pairs for i in range(count)]


# ---------------------------------------------------------------------- validation
def validate(m: Manifest) -> None:
    """Raise PackCorrupt unless the manifest is self-consistent."""
    for name in ("model_fingerprint", "tokenizer_id"):
        if not isinstance(getattr(m, name), str) or not _HEX.fullmatch(getattr(m, name)):
            raise PackCorrupt(f"manifest {name} must be a lowercase hex string")
    if not isinstance(m.namespace, str) or not m.namespace:
        raise PackCorrupt("manifest namespace must be a non-empty string")
    for name in ("n_layers", "n_kv_heads", "head_dim"):
        if not _is_int(getattr(m, name)) or not 0 < getattr(m, name) <= 1 << 16:
            raise PackCorrupt(f"manifest {name} must be a positive integer")
    n = len(m.token_ids)
    if n == 0 or len(m.positions) != n:
        raise PackCorrupt(f"manifest has {n} tokens but {len(m.positions)} positions")
    _check_increasing(m.positions, "positions")
    if not _indices(m.token_ids):
        raise PackCorrupt("manifest token_ids must be non-negative integers")
    _check_segments(m.segments, n)
    if not isinstance(m.anchor, list) or not _indices(m.anchor):
        raise PackCorrupt("manifest anchor must be a list of non-negative token ids")
    _check_kept(m)
    _check_side(m.side)
    _check_tensors(m)


def _check_increasing(xs: list[int], what: str) -> None:
    if not _indices(xs):
        raise PackCorrupt(f"manifest {what} must be non-negative integers")
    if not all(map(operator.lt, xs, islice(xs, 1, None))):
        raise PackCorrupt(f"manifest {what} must be strictly increasing")


def _check_segments(segments, n: int) -> None:
    end = 0
    for seg in segments:
        if len(seg) != 2 or seg[0] != end or not seg[1] > seg[0]:
            raise PackCorrupt("manifest segments must be non-empty [start, end) token ranges "
                              "that follow each other")
        end = seg[1]
    if end != n:
        raise PackCorrupt(f"manifest segments cover {end} tokens, the context has {n}")


def _check_kept(m: Manifest) -> None:
    if len(m.kept) != m.n_layers or any(len(layer) != m.n_kv_heads for layer in m.kept):
        raise PackCorrupt(f"manifest kept positions are not [{m.n_layers} layers]"
                          f"[{m.n_kv_heads} heads]")
    held = set(m.positions)
    for layer in m.kept:
        for head in layer:
            _check_increasing(head, "kept positions")
            if not held.issuperset(head):
                raise PackCorrupt("manifest keeps positions that are not in the context")


def _check_side(side: dict) -> None:
    for key, spec in side.items():
        if key == "block_summaries":
            fields = ("block_size",)
        elif key == "query_cache":
            fields = ("tokens", "heads")
        else:
            raise PackCorrupt(f"manifest side tensor kind {key!r} is unknown")
        f = _Fields(spec, f"side.{key}")
        if any(f.integer(name) <= 0 for name in fields):
            raise PackCorrupt(f"manifest side.{key} sizes must be positive")


def _check_tensors(m: Manifest) -> None:
    expected = m.expected_tensors()
    if set(m.tensors) != set(expected):
        missing = sorted(set(expected) - set(m.tensors))[:3]
        extra = sorted(set(m.tensors) - set(expected))[:3]
        raise PackCorrupt(f"manifest tensor list is wrong (missing {missing}, unexpected {extra})")
    for name, entry in m.tensors.items():
        if not entry.parts or len(set(entry.parts)) != len(entry.parts) \
                or any("/" in p or not p for p in entry.parts):
            raise PackCorrupt("manifest part names must be unique, non-empty, without '/'", name)
        if len(entry.checksum) != 64 or not _HEX.fullmatch(entry.checksum):
            raise PackCorrupt("manifest checksum must be 64 hex digits", name)
        if len(entry.layout) != (len(entry.parts) if m.version >= 2 else 0):
            raise PackCorrupt(f"manifest layout must give each part's dtype and shape from "
                              f"format 2 on (format {m.version})", name)


# ---------------------------------------------------------------------- typed access
def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# Lists of ints are checked with C-level passes (set of types, min, max): an edge's sync
# parses every pack's manifest of a KB served on demand, ~1,000 ints each; item by item the
# checks cost ~20 % more of a manifest's parse (measured on the scale bench's packs).
def _ints(xs) -> bool:
    """Every item a plain int (JSON gives exactly int; bool, its subclass, is refused)."""
    return set(map(type, xs)) <= _INT


def _indices(xs) -> bool:
    """Every item an int in [0, _MAX_INDEX)."""
    return _ints(xs) and (not xs or (min(xs) >= 0 and max(xs) < _MAX_INDEX))


def _list(x, what: str) -> list:
    if not isinstance(x, list):
        raise PackCorrupt(f"manifest field {what!r} must be a list")
    return x


def _int_list(x, what: str) -> list[int]:
    if not isinstance(x, list) or not _ints(x):
        raise PackCorrupt(f"manifest field {what!r} must be a list of integers")
    return x


def _str_list(x, what: str) -> list[str]:
    if not all(isinstance(v, str) for v in x):
        raise PackCorrupt(f"manifest field {what!r} must be a list of strings")
    return x


class _Fields:
    """Typed access to a JSON object; any mismatch is PackCorrupt naming the field."""

    def __init__(self, doc, where: str):
        if not isinstance(doc, dict):
            raise PackCorrupt(f"manifest {where} must be a JSON object")
        self.doc, self.where = doc, where

    def _get(self, key: str, ok, kind: str):
        value = self.doc.get(key)
        if not ok(value):
            raise PackCorrupt(f"manifest field {self.where}.{key} must be {kind}")
        return value

    def integer(self, key: str) -> int:
        return self._get(key, _is_int, "an integer")

    def string(self, key: str) -> str:
        return self._get(key, lambda v: isinstance(v, str), "a string")

    def array(self, key: str) -> list:
        return self._get(key, lambda v: isinstance(v, list), "a list")

    def object(self, key: str) -> dict:
        return self._get(key, lambda v: isinstance(v, dict), "an object")
