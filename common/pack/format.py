"""Write and read packs: KVContext ⇄ one verified, content-addressed file.

`write_pack` encodes every (layer, KV head) tensor with the chosen codec (side tensors with
`side_codec`) and writes atomically; `open_pack` verifies the header and manifest and hands
out tensors as they are checksummed; `read_pack` verifies everything and returns the
KVContext. Any damage surfaces as PackCorrupt naming the tensor; a pack for another model as
ModelMismatch (checked before any tensor is decoded).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import zstandard

from kvedge.common.fsutil import write_atomic
from kvedge.common.pack.codecs import (DEFAULT_CODEC, FLOAT_DTYPES, Codec, FloatCodec, Piece,
                                       Role, decode_pieces, decode_tensors, get_codec)
from kvedge.common.pack.container import (Container, RawPart, assemble, lay_out,
                                          open_container, pack_id, parse_safetensors,
                                          tensor_checksum)
from kvedge.common.pack.context import KVContext
from kvedge.common.pack.errors import ModelMismatch, PackCorrupt
from kvedge.common.pack.manifest import FORMAT_VERSION, Manifest, TensorEntry, kv_name

_TORCH_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "F16": torch.float16,
                 "BF16": torch.bfloat16, "F32": torch.float32, "I32": torch.int32,
                 "I64": torch.int64}
# What a codec may raise on parts or params that passed their checksum but are still wrong
# (a hand-made or buggy manifest): reported as corruption of that tensor, never a crash.
_DECODE_ERRORS = (ValueError, RuntimeError, KeyError, TypeError, IndexError, AttributeError,
                  OverflowError, StopIteration, zstandard.ZstdError)


# ---------------------------------------------------------------------- writing
def encode_pack(ctx: KVContext, codec: str | Codec = DEFAULT_CODEC,
                side_codec: str | Codec = "fp16", *, format_version: int = FORMAT_VERSION,
                **options) -> bytes:
    """The pack's bytes (canonical: the same context and codec give the same bytes).
    `format_version` 1 writes the old layout (kept to test that stores' old packs still read)."""
    codec = get_codec(codec, **options) if isinstance(codec, str) else codec
    side_codec = get_codec(side_codec) if isinstance(side_codec, str) else side_codec
    if not isinstance(getattr(side_codec, "inner", side_codec), FloatCodec):
        raise ValueError(f"side tensors (H, n, D) need a float codec, not {side_codec.name!r}")
    encoded = {**_encode_heads(ctx, codec), **_encode_side(ctx, side_codec)}
    if format_version < 2:
        payload = safetensors.torch.save({f"{name}/{part}": t.contiguous()
                                          for name, (_, parts, _) in encoded.items()
                                          for part, t in parts.items()})
        raw = parse_safetensors(memoryview(payload))
    else:
        raw = {f"{name}/{part}": _raw(t) for name, (_, parts, _) in encoded.items()
               for part, t in parts.items()}
    entries = {}
    for name, (c, parts, params) in encoded.items():
        mine = [(p, raw[f"{name}/{p}"]) for p in parts]
        layout = tuple((r.dtype, r.shape) for _, r in mine) if format_version >= 2 else ()
        entries[name] = TensorEntry(c.name, params, tuple(parts),
                                    tensor_checksum(name, c.name, params, mine), layout)
    kept = [[p.tolist() for p in layer] for layer in ctx.kept_positions]
    manifest = Manifest(ctx.model_fingerprint, ctx.tokenizer_id, ctx.namespace, ctx.n_layers,
                        ctx.n_kv_heads, ctx.head_dim, ctx.token_ids, ctx.positions,
                        ctx.segments, kept, entries, _side_spec(ctx), list(ctx.anchor),
                        format_version)
    if format_version >= 2:  # the parts end to end, in the order readers lay them out
        payload = lay_out([raw[f"{name}/{p}"] for name in manifest.expected_tensors()
                           for p in entries[name].parts])
    return assemble(manifest.to_json(), payload, format_version)


_SAFETENSORS_DTYPES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}


def _raw(t: torch.Tensor) -> RawPart:
    """A tensor's bytes as one payload part (an empty one from numpy has stride 0, which
    `view` refuses for multi-byte dtypes)."""
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return RawPart(_SAFETENSORS_DTYPES[t.dtype], tuple(t.shape), memoryview(data))


def _encode_heads(ctx: KVContext, codec: Codec) -> dict:
    """name → (codec, parts, params) for every (layer, KV head)'s keys and values."""
    encoded = {}
    for layer in range(ctx.n_layers):
        for kind, heads in (("k", ctx.keys[layer]), ("v", ctx.values[layer])):
            for head, x in enumerate(heads):
                role = Role("key" if kind == "k" else "value", layer, ctx.n_layers,
                            ctx.ranks(layer, head), ctx.n_tokens, head)
                encoded[kv_name(kind, layer, head)] = (codec, *codec.encode(x, role))
    return encoded


# the side tensors a context may carry: KVContext field → payload name prefix
SIDE = (("block_summaries", "summary"), ("query_cache", "qcache"))


def _encode_side(ctx: KVContext, codec: Codec) -> dict:
    return {f"{prefix}.{layer}": (codec, *codec.encode(t))
            for key, prefix in SIDE if getattr(ctx, key) is not None
            for layer, t in enumerate(getattr(ctx, key))}


def _side_spec(ctx: KVContext) -> dict:
    """The manifest's description of the side tensors a context carries."""
    side = {}
    if ctx.block_summaries is not None:
        side["block_summaries"] = {"block_size": ctx.block_size}
    if ctx.query_cache is not None:
        side["query_cache"] = {"tokens": ctx.query_cache[0].shape[1],
                               "heads": ctx.query_cache[0].shape[0]}
    return side


def write_pack(ctx: KVContext, path: Path | str, codec: str | Codec = DEFAULT_CODEC,
               side_codec: str | Codec = "fp16", **options) -> str:
    """Encode and write atomically; returns the pack id (blake3 of the file)."""
    data = encode_pack(ctx, codec, side_codec, **options)
    write_atomic(Path(path), data)
    return pack_id(data)


# ---------------------------------------------------------------------- reading
@dataclass
class Pack:
    """An opened pack: header and manifest verified, tensors checksummed as they are read."""

    data: bytes
    container: Container
    # spec → codec: a pack's tensors share one or two specs (k/v heads, side tensors), so
    # each is built once per pack, not once per tensor
    _codecs: dict[str, Codec] = field(default_factory=dict, init=False, repr=False,
                                      compare=False)

    @property
    def manifest(self) -> Manifest:
        return self.container.manifest

    @cached_property
    def id(self) -> str:
        return pack_id(self.data)

    def check_model(self, model_fingerprint: str | None) -> None:
        check_model(self.manifest, model_fingerprint)

    def pieces(self, name: str, rows: torch.Tensor | None = None) -> list[Piece]:
        """A tensor's rows as dense or still-quantized pieces (for the fused kernel); only
        rows `rows` (sorted indices), if given."""
        if rows is not None:
            return self._decode(name, lambda codec, parts, params: codec.take(parts, params, rows))
        return self._decode(name, lambda codec, parts, params: codec.pieces(parts, params))

    def tensor(self, name: str) -> torch.Tensor:
        """One decoded tensor, in the dtype it was encoded from."""
        return self._decode(name, lambda codec, parts, params: codec.decode(parts, params))

    def tensors(self, names: list[str]) -> list[torch.Tensor]:
        """Several decoded tensors, each to the bit as `tensor` decodes it, their quantized
        pieces dequantized together (`decode_tensors`). Whatever fails is PackCorrupt naming
        the tensor it hit."""
        return decode_together(self.manifest, names,
                               [self._decode(name, stored_pieces) for name in names])

    def _decode(self, name: str, how):
        return decode_parts(self.manifest, name, self.container.tensor_parts(name),
                            cached_codec(self._codecs, self.manifest.tensors[name].codec), how)

    def context(self) -> KVContext:
        """Decode everything (each tensor verified), then the bytes no tensor owns."""
        m = self.manifest
        names = m.expected_tensors()
        decoded = dict(zip(names, self.tensors(names)))
        keys, values = ([[decoded[kv_name(kind, layer, head)] for head in range(m.n_kv_heads)]
                         for layer in range(m.n_layers)] for kind in ("k", "v"))
        side = {key: [decoded[f"{prefix}.{layer}"] for layer in range(m.n_layers)]
                for key, prefix in SIDE if key in m.side}
        self.container.verify_payload()
        return build_context(m, keys, values, side)


def check_model(manifest: Manifest, model_fingerprint: str | None) -> None:
    """ModelMismatch unless the pack belongs to `model_fingerprint` (None: any model)."""
    if model_fingerprint is not None and model_fingerprint != manifest.model_fingerprint:
        raise ModelMismatch(
            f"pack was made by model {manifest.model_fingerprint[:16]}…, this model is "
            f"{model_fingerprint[:16]}…: load the model it was made for or re-encode the "
            "context with this one")


def cached_codec(codecs: dict[str, Codec], spec: str) -> Codec:
    """The codec of `spec` from `codecs` (spec → codec), built on first use."""
    if spec not in codecs:
        codecs[spec] = get_codec(spec)
    return codecs[spec]


def decode_parts(manifest: Manifest, name: str, verified: list[tuple[str, RawPart]],
                 codec: Codec, how=None):
    """One tensor from its parts (already checked against its checksum): `how(codec,
    parts, params)`, by default the whole tensor decoded. Whatever fails on parts that
    passed their checksum is PackCorrupt naming the tensor."""
    entry = manifest.tensors[name]
    parts = {p: _to_torch(raw) for p, raw in verified}
    how = how or (lambda codec, parts, params: codec.decode(parts, params))
    with _decoding(name):
        _check_params(manifest, name, entry)
        return how(codec, parts, entry.params)


def stored_pieces(codec: Codec, parts: dict, params: dict) -> tuple[list[Piece], torch.dtype]:
    """A tensor's pieces and the dtype it was encoded from (what `decode` casts them to): a
    `how` for `decode_parts`, whose results `decode_together` decodes."""
    return codec.pieces(parts, params), FLOAT_DTYPES[params["dtype"]]


def decode_together(manifest: Manifest, names: list[str],
                    stored: list[tuple[list[Piece], torch.dtype]]) -> list[torch.Tensor]:
    """The tensors `names`, given as their pieces and stored dtypes (`stored_pieces`), each
    decoded to the bit as `Codec.decode` would and shaped as its params say, their quantized
    pieces of one layout dequantized together (`decode_tensors`). Pieces that passed their
    own checks yet fail together are decoded tensor by tensor, so the failure names its
    tensor (PackCorrupt)."""
    try:
        rows = decode_tensors(stored)
    except _DECODE_ERRORS:
        rows = []
        for name, (pieces, dtype) in zip(names, stored):
            with _decoding(name):
                rows.append(decode_pieces(pieces, dtype))
    out = []
    for name, x in zip(names, rows):
        with _decoding(name):
            out.append(x.reshape(manifest.tensors[name].params["shape"]))
    return out


def _check_params(manifest: Manifest, name: str, entry: TensorEntry) -> None:
    if list(entry.params.get("shape", ())) != list(manifest.expected_shape(name)):
        raise ValueError(f"params shape {entry.params.get('shape')} is not "
                         f"{list(manifest.expected_shape(name))}")


def build_context(m: Manifest, keys: list, values: list, side: dict) -> KVContext:
    """The KVContext of a pack whose tensors are decoded: keys/values [layer][head], `side`
    {"block_summaries" / "query_cache": [per layer]} for those the manifest lists."""
    kept = [[torch.tensor(h, dtype=torch.long) for h in layer] for layer in m.kept]
    return KVContext(m.model_fingerprint, m.tokenizer_id, m.token_ids, m.positions,
                     keys, values, kept, m.segments, m.namespace,
                     m.side.get("block_summaries", {}).get("block_size", 64),
                     side.get("block_summaries"), side.get("query_cache"), list(m.anchor))


@contextmanager
def _decoding(name: str):
    try:
        yield
    except _DECODE_ERRORS as err:
        raise PackCorrupt(f"cannot decode ({type(err).__name__}: {err})", name) from None


def _to_torch(raw: RawPart) -> torch.Tensor:
    dtype = _TORCH_DTYPES[raw.dtype]
    flat = torch.from_numpy(np.frombuffer(raw.data, np.uint8).copy())
    return (flat.view(dtype) if flat.numel() else torch.empty(0, dtype=dtype)).reshape(raw.shape)


def _read(source: Path | str | bytes) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    return Path(source).read_bytes()


def open_pack(source: Path | str | bytes, model_fingerprint: str | None = None) -> Pack:
    """Open a pack (a path or its bytes); ModelMismatch if it belongs to another model."""
    data = _read(source)
    pack = Pack(data, open_container(data))
    pack.check_model(model_fingerprint)
    return pack


def read_pack(source: Path | str | bytes, model_fingerprint: str | None = None) -> KVContext:
    """Read and verify a whole pack into a KVContext."""
    return open_pack(source, model_fingerprint).context()
