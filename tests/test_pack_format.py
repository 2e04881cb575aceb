"""Packs end to end: KVContext → one file → KVContext, ragged heads, side tensors, identity."""
import os

import pytest
import safetensors.torch
import torch

from kvedge.common.errors import KvedgeError
from kvedge.common.pack import (KVContext, ModelMismatch, PackCorrupt, block_summaries,
                                encode_pack, open_pack, read_pack, realign_pack, write_pack)
from kvedge.common.pack.container import HEADER_SIZE, manifest_json, read_header
from kvedge.common.pack import format as format_module
from kvedge.common.pack.manifest import Manifest, kv_name
from kvedge.common.pack.context import ragged_block_summaries
from kvedge.common.pack.errors import PackError, PackVersionError
from kvedge.kernels.rope import rope_reference

FP, TOK = "ab" * 32, "cd" * 32
L, H, HQ, T, D = 3, 2, 4, 70, 16


def dense_kv(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(H, T, D, generator=g) for _ in range(L)]
    values = [torch.randn(H, T, D, generator=g) for _ in range(L)]
    queries = [torch.randn(HQ, T, D, generator=g) for _ in range(L)]
    return keys, values, queries


def make_context(**kw) -> KVContext:
    keys, values, queries = dense_kv()
    return KVContext.from_dense(keys, values, list(range(1000, 1000 + T)), model_fingerprint=FP,
                                tokenizer_id=TOK, positions=list(range(30, 30 + T)),
                                queries=queries, query_tokens=8, block_size=16,
                                segments=[(0, 20), (20, T)], namespace="tenant-a", **kw)


def ragged(ctx: KVContext) -> KVContext:
    """Each head keeps a different subset; one head keeps nothing."""
    g = torch.Generator().manual_seed(1)
    keep = [[torch.tensor(sorted(torch.randperm(T, generator=g)[: 10 + 17 * (l + h)].tolist()))
             + 30 for h in range(H)] for l in range(L)]
    keep[1][0] = torch.tensor([], dtype=torch.long)
    return ctx.select(keep)


def assert_same(a: KVContext, b: KVContext, atol: float):
    assert (a.token_ids, a.positions, a.segments, a.namespace) == \
        (b.token_ids, b.positions, b.segments, b.namespace)
    assert (a.model_fingerprint, a.tokenizer_id, a.block_size) == \
        (b.model_fingerprint, b.tokenizer_id, b.block_size)
    for layer in range(a.n_layers):
        for h in range(a.n_kv_heads):
            assert torch.equal(a.kept_positions[layer][h], b.kept_positions[layer][h])
            torch.testing.assert_close(b.keys[layer][h], a.keys[layer][h], atol=atol, rtol=0)
            torch.testing.assert_close(b.values[layer][h], a.values[layer][h], atol=atol, rtol=0)
        torch.testing.assert_close(b.block_summaries[layer], a.block_summaries[layer],
                                   atol=1e-2, rtol=0)
        torch.testing.assert_close(b.query_cache[layer], a.query_cache[layer], atol=1e-2, rtol=0)


@pytest.mark.parametrize("codec, atol", [("fp32", 0), ("fp16", 2e-3), ("fp16+zstd", 2e-3),
                                         ("int8+zstd", 0.05), ("int4", 0.6),
                                         ("cachegen+zstd", 2.5)])
@pytest.mark.parametrize("shape", ["dense", "ragged"])
def test_roundtrip(tmp_path, codec, atol, shape):
    ctx = make_context() if shape == "dense" else ragged(make_context())
    pid = write_pack(ctx, tmp_path / "p.kvpack", codec)
    back = read_pack(tmp_path / "p.kvpack", model_fingerprint=FP)
    assert_same(ctx, back, atol)
    assert open_pack(tmp_path / "p.kvpack").id == pid


@pytest.mark.parametrize("codec", ["fp16", "int8+zstd", "int4", "int3+zstd", "kivi+zstd",
                                   "cachegen+zstd", "kvtc"])
@pytest.mark.parametrize("shape", ["dense", "ragged"])
def test_a_pack_decoded_whole_is_each_tensor_decoded_alone(codec, shape):
    """`Pack.context` dequantizes a pack's pieces of one layout together; every tensor is
    still, to the bit, what decoding it alone gives."""
    ctx = make_context() if shape == "dense" else ragged(make_context())
    pack = open_pack(encode_pack(ctx, codec))
    whole = pack.context()
    for layer in range(L):
        for h in range(H):
            for kind, heads in (("k", whole.keys), ("v", whole.values)):
                alone = pack.tensor(kv_name(kind, layer, h))
                assert alone.dtype == heads[layer][h].dtype and torch.equal(alone, heads[layer][h])
        assert torch.equal(whole.query_cache[layer], pack.tensor(f"qcache.{layer}"))


def test_a_batch_that_fails_decodes_tensor_by_tensor(monkeypatch):
    """Pieces that pass their own checks but fail dequantized together: the tensors are
    decoded one by one instead, so the one at fault is named (`Pack.tensor`)."""
    pack = open_pack(encode_pack(make_context(), "int8"))

    def fails(stored):
        raise RuntimeError("shapes disagree")
    monkeypatch.setattr(format_module, "decode_tensors", fails)
    assert torch.equal(pack.context().keys[1][0], pack.tensor("k.1.0"))


def test_content_address_is_canonical():
    ctx = make_context()
    a, b = encode_pack(ctx, "int4+zstd"), encode_pack(make_context(), "int4+zstd")
    assert a == b and open_pack(a).id == open_pack(b).id
    ctx.token_ids[5] += 1
    assert open_pack(encode_pack(ctx, "int4+zstd")).id != open_pack(a).id


def test_payload_is_the_parts_end_to_end_with_a_compressed_manifest():
    ctx = make_context()
    data = encode_pack(ctx, "int4+zstd")
    version, m_len, p_len, _, _ = read_header(data)
    manifest = Manifest.from_json(manifest_json(data))
    assert version == manifest.version == 2 and m_len < len(manifest.to_json()) / 3
    entry = manifest.tensors["summary.2"]
    assert entry.layout == (("F16", (H, 5, D)),)
    offset = sum(size for name in manifest.expected_tensors()[:manifest.expected_tensors()
                                                              .index("summary.2")]
                 for size in manifest.tensors[name].part_sizes())
    start = HEADER_SIZE + m_len + offset
    got = torch.frombuffer(bytearray(data[start: start + H * 5 * D * 2]), dtype=torch.float16)
    assert torch.equal(got.view(H, 5, D), ctx.block_summaries[2].half())
    assert HEADER_SIZE + m_len + p_len == len(data)


@pytest.mark.parametrize("codec", ["fp16", "int4+zstd", "kvtc"])
def test_format_1_packs_still_read(codec):
    """Stores hold packs written before format 2: they read to the same context."""
    ctx = make_context()
    old = encode_pack(ctx, codec, format_version=1)
    assert read_header(old)[0] == 1
    tensors = safetensors.torch.load(old[HEADER_SIZE + read_header(old)[1]:])
    assert "k.0.0/" + next(iter(open_pack(old).manifest.tensors["k.0.0"].parts)) in tensors
    a, b = read_pack(old), read_pack(encode_pack(ctx, codec))
    for layer in range(ctx.n_layers):
        for x, y in zip(a.keys[layer] + a.values[layer], b.keys[layer] + b.values[layer]):
            assert torch.equal(x, y)
    assert torch.equal(a.block_summaries[1], b.block_summaries[1])


def test_from_dense_summaries_and_query_cache():
    keys, _, queries = dense_kv()
    ctx = make_context()
    assert ctx.block_summaries[1].shape == (H, 5, D)  # ceil(70 / 16) blocks
    torch.testing.assert_close(ctx.block_summaries[1][:, 4], keys[1][:, 64:].mean(1))
    torch.testing.assert_close(ctx.block_summaries[1][:, 0], keys[1][:, :16].mean(1))
    assert torch.equal(ctx.query_cache[2], queries[2][:, -8:])
    torch.testing.assert_close(ragged_block_summaries(ctx)[0], ctx.block_summaries[0])


def test_block_summaries_of_ragged_head_skip_evicted_tokens():
    keys = torch.arange(8, dtype=torch.float32).repeat(3, 1).T[None]  # (1, 8, 3): row i = i
    out = block_summaries(keys[:, [0, 1, 5]], torch.tensor([0, 1, 5]), 8, block_size=4)
    assert out[0, :, 0].tolist() == [0.5, 5.0]
    empty = block_summaries(keys[:, :2], torch.tensor([0, 1]), 8, block_size=4)
    assert empty[0, 1].tolist() == [0.0, 0.0, 0.0]


def test_an_evicted_context_ships_without_block_summaries():
    """Eviction drops the summaries (they summarize evicted keys and cost the same at any
    budget); the pack is smaller and the edge derives them from the kept keys."""
    ctx = make_context()
    every = ctx.evicted(ctx.kept_positions)
    assert every.block_summaries is ctx.block_summaries
    small = ctx.evicted([[p[::4] for p in layer] for layer in ctx.kept_positions])
    assert small.block_summaries is None
    shipped = encode_pack(small, "int4+zstd")
    assert read_pack(shipped).block_summaries is None
    assert len(shipped) < len(encode_pack(ctx.select(small.kept_positions), "int4+zstd"))
    derived = ragged_block_summaries(small)  # what SamKV reads instead
    assert derived[0].shape == ctx.block_summaries[0].shape


def test_select_refuses_positions_not_held():
    ctx = ragged(make_context())
    with pytest.raises(ValueError, match="already held"):
        ctx.select([[torch.tensor([30, 31, 32])] * H] * L)


def test_the_anchor_travels_with_the_pack_and_through_eviction():
    anchored = make_context(anchor=[7, 8, 9])
    data = encode_pack(anchored, "fp32")
    assert read_pack(data).anchor == [7, 8, 9]
    assert ragged(read_pack(data)).anchor == [7, 8, 9]  # a compression job keeps it
    alone = encode_pack(make_context(), "fp32")  # what every pack before the field was
    assert b'"anchor"' not in alone and read_pack(alone).anchor == []
    assert open_pack(alone).id != open_pack(data).id


def test_model_mismatch_before_any_tensor_is_decoded(tmp_path):
    write_pack(make_context(), tmp_path / "p.kvpack")
    with pytest.raises(ModelMismatch, match="re-encode"):
        read_pack(tmp_path / "p.kvpack", model_fingerprint="ef" * 32)
    assert issubclass(PackError, KvedgeError) and issubclass(ModelMismatch, KvedgeError)


def test_unknown_version(tmp_path):
    data = bytearray(encode_pack(make_context()))
    data[8:12] = (3).to_bytes(4, "little")
    with pytest.raises(PackVersionError, match="version 3"):
        read_pack(bytes(data))


def test_truncation_names_the_first_missing_tensor():
    data = encode_pack(make_context(), "fp16")
    with pytest.raises(PackCorrupt) as err:
        read_pack(data[:-100])
    assert err.value.tensor is not None and err.value.tensor in str(err.value)


def test_bit_flip_in_a_tensor_names_it():
    data = bytearray(encode_pack(make_context(), "fp16"))
    data[-5] ^= 0x10
    with pytest.raises(PackCorrupt, match="checksum mismatch") as err:
        read_pack(bytes(data))
    assert err.value.tensor is not None


def test_write_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "kb" / "p.kvpack"
    write_pack(make_context(), target)
    before = target.read_bytes()

    def crash(fd):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk gone"):
        write_pack(ragged(make_context()), target)
    assert target.read_bytes() == before  # the old pack is untouched
    assert [p.name for p in target.parent.iterdir()] == ["p.kvpack"]  # no temp file left


@pytest.mark.parametrize("codec", ["fp16", "int4+zstd", "int8", "cachegen+zstd"])
def test_realign_matches_decode_then_rope(codec):
    ctx = ragged(make_context())
    pack = open_pack(encode_pack(ctx, codec))
    decoded = pack.context()
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    targets = torch.arange(T) * 3 + 500  # the composed prompt moves every token
    out = realign_pack(pack, inv_freq, 1.0, targets)
    for layer in range(L):
        for h in range(H):
            pos = targets[ctx.ranks(layer, h)]
            assert torch.equal(out.positions[layer][h], pos)
            want = rope_reference(decoded.keys[layer][h].float(), pos, inv_freq)
            torch.testing.assert_close(out.keys[layer][h], want, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(out.values[layer][h], decoded.values[layer][h].float(),
                                       atol=1e-5, rtol=0)


def test_an_empty_multi_byte_part_from_numpy_is_an_empty_payload_part():
    """numpy's empty arrays reach torch with stride 0, which `view(uint8)` refuses for a
    multi-byte dtype; a codec may return one (an int16 part with nothing to hold)."""
    import numpy as np

    for dtype in (np.int16, np.float32):
        part = format_module._raw(torch.from_numpy(np.zeros(0, dtype)))
        assert bytes(part.data) == b"" and part.shape == (0,)
