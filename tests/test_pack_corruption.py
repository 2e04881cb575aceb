"""Random corruption thrown at the reader: it fails only with named pack errors, and whatever
it returns is exactly what was written (byte damage) or at least self-consistent (a garbage
manifest whose hash was forged to match)."""
import json

import blake3
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvedge.common.pack import KVContext, encode_pack, read_pack
from kvedge.common.pack.container import (HEADER_SIZE, manifest_json, open_container,
                                          read_header, store_manifest, tensor_checksum)
from kvedge.common.pack.errors import ModelMismatch, PackError

FP, TOK = "ab" * 32, "cd" * 32
L, H, T, D = 2, 2, 24, 8
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def _context() -> KVContext:
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(H, T, D, generator=g) for _ in range(L)]
    values = [torch.randn(H, T, D, generator=g) for _ in range(L)]
    queries = [torch.randn(4, T, D, generator=g) for _ in range(L)]
    ctx = KVContext.from_dense(keys, values, list(range(T)), model_fingerprint=FP,
                               tokenizer_id=TOK, queries=queries, query_tokens=4, block_size=8)
    keep = [[torch.arange(0, T, 1 + layer + h) for h in range(H)] for layer in range(L)]
    return ctx.select(keep)


CODECS = ["fp16", "int4+zstd", "cachegen+zstd"]
PACKS = {codec: encode_pack(_context(), codec) for codec in CODECS}
ORIGINAL = {codec: read_pack(data) for codec, data in PACKS.items()}


def equal(a: KVContext, b: KVContext) -> bool:
    tensors = [(x, y) for la, lb in ((a.keys, b.keys), (a.values, b.values),
                                     (a.kept_positions, b.kept_positions))
               for ha, hb in zip(la, lb) for x, y in zip(ha, hb)]
    tensors += list(zip(a.block_summaries, b.block_summaries))
    tensors += list(zip(a.query_cache, b.query_cache))
    return (a.token_ids, a.positions, a.segments, a.namespace) == \
        (b.token_ids, b.positions, b.segments, b.namespace) and \
        all(x.dtype == y.dtype and torch.equal(x, y) for x, y in tensors)


def read_damaged(codec: str, data: bytes) -> None:
    """The property: a named error, or exactly the original content."""
    try:
        got = read_pack(data, model_fingerprint=FP)
    except (PackError, ModelMismatch):
        return
    assert equal(got, ORIGINAL[codec]), "damaged pack read back with different content"


codecs = st.sampled_from(CODECS)


@SETTINGS
@given(codec=codecs, cut=st.floats(0, 1, exclude_max=True))
def test_truncation(codec, cut):
    data = PACKS[codec]
    read_damaged(codec, data[: int(cut * len(data))])


@SETTINGS
@given(codec=codecs, flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True),
                                              st.integers(0, 7)), min_size=1, max_size=4))
def test_bit_flips(codec, flips):
    data = bytearray(PACKS[codec])
    for where, bit in flips:
        data[int(where * len(data))] ^= 1 << bit
    read_damaged(codec, bytes(data))


@SETTINGS
@given(codec=codecs, where=st.floats(0, 1), junk=st.binary(min_size=1, max_size=8),
       delete=st.booleans())
def test_byte_insertions_and_deletions(codec, where, junk, delete):
    data = PACKS[codec]
    i = int(where * len(data))
    damaged = data[:i] + data[i + len(junk):] if delete else data[:i] + junk + data[i:]
    read_damaged(codec, damaged)


def forge(data: bytes, manifest: bytes) -> bytes:
    """Replace the manifest (JSON, stored as the pack's format stores it) and fix up the
    header so that only the manifest is wrong."""
    version, m_len, _, _, _ = read_header(data)
    stored = store_manifest(manifest, version)
    header = bytearray(data[:HEADER_SIZE])
    header[16:24] = len(stored).to_bytes(8, "little")
    header[32:64] = blake3.blake3(stored).digest()
    return bytes(header) + stored + data[HEADER_SIZE + m_len:]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 40, 2 ** 40) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                       children, max_size=4),
    max_leaves=12)


def paths(doc, prefix=()):
    """Every path into a JSON document (to pick one to replace)."""
    yield prefix
    if isinstance(doc, dict):
        items = doc.items()
    else:
        items = enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield from paths(value, prefix + (key,))


def replace_at(doc, path, value):
    if not path:
        return value
    doc[path[0]] = replace_at(doc[path[0]], path[1:], value)
    return doc


def read_forged(codec: str, manifest: bytes) -> None:
    """A forged manifest: named errors only; a success must still be self-consistent."""
    try:
        got = read_pack(forge(PACKS[codec], manifest))
    except (PackError, ModelMismatch):
        return
    for layer in range(got.n_layers):  # KVContext.__post_init__ checked shapes already
        for kept in got.kept_positions[layer]:
            assert set(kept.tolist()) <= set(got.positions)


@SETTINGS
@given(codec=codecs, doc=json_values)
def test_garbage_manifest(codec, doc):
    read_forged(codec, json.dumps(doc).encode())


@SETTINGS
@given(codec=codecs, data=st.data())
def test_mutated_manifest(codec, data):
    doc = json.loads(manifest_json(PACKS[codec]))
    all_paths = list(paths(doc))
    path = all_paths[data.draw(st.integers(0, len(all_paths) - 1))]
    read_forged(codec, json.dumps(replace_at(doc, path, data.draw(json_values))).encode())


@pytest.mark.parametrize("codec", CODECS)
def test_changed_decoding_params_are_caught_by_the_tensor_checksum(codec):
    doc = json.loads(manifest_json(PACKS[codec]))
    doc["tensors"]["k.1.1"]["params"]["dtype"] = "bfloat16"
    with pytest.raises(PackError, match="k.1.1"):
        read_pack(forge(PACKS[codec], json.dumps(doc).encode()))


@SETTINGS
@given(codec=codecs, data=st.data())
def test_forged_params_with_a_matching_checksum(codec, data):
    """A buggy writer: params that lie, with a checksum that agrees. Decoding must still fail
    by name (or succeed consistently), never crash."""
    doc = json.loads(manifest_json(PACKS[codec]))
    name = data.draw(st.sampled_from(sorted(doc["tensors"])))
    entry = doc["tensors"][name]
    all_paths = list(paths(entry["params"]))
    path = all_paths[data.draw(st.integers(0, len(all_paths) - 1))]
    entry["params"] = replace_at(entry["params"], path, data.draw(json_values))
    parts = open_container(PACKS[codec]).parts
    entry["checksum"] = tensor_checksum(name, entry["codec"], entry["params"],
                                        [(p, parts[f"{name}/{p}"]) for p in entry["parts"]])
    read_forged(codec, json.dumps(doc).encode())


@pytest.mark.parametrize("codec", CODECS)
def test_forged_layouts_are_named_errors(codec):
    """Format 2 lays parts out from the manifest: a layout that lies is caught, by name."""
    doc = json.loads(manifest_json(PACKS[codec]))
    entry = doc["tensors"]["k.1.0"]
    entry["layout"][0][1][0] += 1  # a part one row longer: every later part shifts
    with pytest.raises(PackError):
        read_pack(forge(PACKS[codec], json.dumps(doc).encode()))
    del entry["layout"]
    with pytest.raises(PackError, match="layout"):
        read_pack(forge(PACKS[codec], json.dumps(doc).encode()))


@pytest.mark.parametrize("recorded", [True, False])
def test_a_manifest_that_inflates_without_end_is_refused(monkeypatch, recorded):
    import zstandard

    from kvedge.common.pack import container

    monkeypatch.setattr(container, "MAX_MANIFEST_BYTES", 1 << 20)
    data = PACKS[CODECS[0]]
    blank = b" " * ((1 << 20) + 1)
    if recorded:
        bomb = zstandard.ZstdCompressor(level=1).compress(blank)
    else:  # a streamed frame does not record its size
        bomb = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(blank)
    _, m_len, _, _, _ = read_header(data)
    header = bytearray(data[:HEADER_SIZE])
    header[16:24] = len(bomb).to_bytes(8, "little")
    header[32:64] = blake3.blake3(bomb).digest()
    with pytest.raises(PackError, match="inflate"):
        read_pack(bytes(header) + bomb + data[HEADER_SIZE + m_len:])
