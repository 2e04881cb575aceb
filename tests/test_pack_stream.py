"""Packs read while their bytes arrive (common/pack/stream.py): layers come out in order as
soon as their bytes are in, each verified; the result equals read_pack's bit for bit;
damage is found before the layer it hits comes out."""
import pytest
import torch

from kvedge.common.pack import ModelMismatch, PackCorrupt, encode_pack, pack_id, read_pack
from kvedge.common.pack.container import HEADER_SIZE, read_header, read_manifest
from kvedge.common.pack.stream import Layer, PackStream, stream_pack
from test_pack_format import FP, H, L, make_context, ragged


def chunks(data: bytes, size: int):
    return [data[i:i + size] for i in range(0, len(data), size)]


def assert_equal(a, b):
    """Bit for bit: every tensor, position and side tensor (where the packs have them)."""
    assert (a.token_ids, a.positions, a.segments, a.namespace, a.anchor, a.block_size) == \
        (b.token_ids, b.positions, b.segments, b.namespace, b.anchor, b.block_size)
    side = [key for key in ("block_summaries", "query_cache") if getattr(a, key) is not None]
    assert side == [key for key in ("block_summaries", "query_cache")
                    if getattr(b, key) is not None]
    for layer in range(a.n_layers):
        for x, y in zip(a.keys[layer] + a.values[layer] + a.kept_positions[layer]
                        + [getattr(a, key)[layer] for key in side],
                        b.keys[layer] + b.values[layer] + b.kept_positions[layer]
                        + [getattr(b, key)[layer] for key in side], strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y)


def layer_end(data: bytes, layer: int) -> int:
    """Offset just past layer `layer`'s last value head in a format-2 pack."""
    from kvedge.common.pack.stream import _spans

    front = HEADER_SIZE + read_header(data)[1]
    manifest = read_manifest(data[:front])
    end, last = front, f"v.{layer}.{manifest.n_kv_heads - 1}"
    for span in _spans(manifest):
        end += span.nbytes
        if span.name == last:
            return end
    raise AssertionError(f"no layer {layer}")


@pytest.mark.parametrize("codec,size", [("fp16", 1), *((codec, size) for size in (997, 1 << 20)
                                                       for codec in ("fp16", "int4+zstd", "kvtc"))])
def test_a_streamed_pack_equals_read_pack_bit_for_bit(codec, size):
    data = encode_pack(ragged(make_context()), codec)
    *layers, ctx = stream_pack(chunks(data, size), FP, pack_id(data))
    assert [layer.index for layer in layers] == list(range(L))
    assert_equal(read_pack(data), ctx)
    for layer in layers:
        assert all(x is y for x, y in zip(layer.keys, ctx.keys[layer.index]))


def test_a_layer_comes_out_when_its_last_byte_arrives_and_not_before():
    data = encode_pack(make_context(), "int4+zstd")
    stream, end = PackStream(FP), layer_end(data, 0)
    assert stream.feed(data[:end - 1]) == []
    (first,) = stream.feed(data[end - 1:end])
    assert isinstance(first, Layer) and first.index == 0
    assert [x.index for x in stream.feed(data[end:])] == [1, 2]
    assert_equal(read_pack(data), stream.finish())


def test_a_damaged_byte_in_layer_k_is_found_before_layer_k_comes_out():
    data = bytearray(encode_pack(make_context(), "int4+zstd"))
    where = layer_end(bytes(data), 1) - 3  # inside layer 1's last value head
    data[where] ^= 0x10
    stream, seen = PackStream(FP), []
    with pytest.raises(PackCorrupt, match="checksum mismatch") as err:
        for chunk in chunks(bytes(data), 64):
            seen += stream.feed(chunk)
    assert [x.index for x in seen] == [0] and err.value.tensor == f"v.1.{H - 1}"
    assert stream.received <= where + 64  # found with the chunk that completed that tensor


def test_the_whole_pack_is_checked_at_the_end():
    data = encode_pack(make_context(), "fp16")
    other = encode_pack(ragged(make_context()), "fp16")
    with pytest.raises(PackCorrupt, match="pack id"):
        list(stream_pack(chunks(other, 4096), FP, pack_id(data)))
    with pytest.raises(PackCorrupt, match="short of the pack"):
        list(stream_pack(chunks(data[:-10], 4096), FP))
    with pytest.raises(PackCorrupt, match="past the pack's end"):
        list(stream_pack(chunks(data + b"\0", 4096), FP))
    with pytest.raises(PackCorrupt, match="before the pack's header"):
        list(stream_pack([data[:50]], FP))
    header = bytearray(data)
    header[64] ^= 1  # the payload hash: no tensor owns it
    with pytest.raises(PackCorrupt, match="payload checksum"):
        list(stream_pack([bytes(header)], FP))


def test_a_pack_of_another_model_is_refused_before_any_tensor_is_decoded():
    data = encode_pack(make_context(), "fp16")
    stream = PackStream("ef" * 32)
    with pytest.raises(ModelMismatch):
        stream.feed(data[:HEADER_SIZE + read_header(data)[1]])


def test_a_format_1_pack_streams_whole_at_the_end():
    ctx = make_context()
    old = encode_pack(ctx, "int4+zstd", format_version=1)
    stream = PackStream(FP, pack_id(old))
    assert all(stream.feed(c) == [] for c in chunks(old, 4096))
    assert_equal(read_pack(old), stream.finish())
    *layers, last = stream_pack(chunks(old, 4096), FP)
    assert [x.index for x in layers] == list(range(L))
