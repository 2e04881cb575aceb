"""Codecs: each one round-trips within its error budget, on every shape a ragged head can have."""
import pytest
import torch

from kvedge.common.pack.codecs import (DEFAULT_CODEC, CacheGen, IntCodec, Role, Zstd,
                                       codec_names, get_codec, parse_spec, split_specs)
from kvedge.common.pack.codecs.specs import Spec, parse
from kvedge.common.pack.errors import InvalidCodecOption, UnknownCodec
from kvedge.kernels.quant import QuantizedTensor, pack_codes, quantize, unpack_codes

# relative L2 error bound per base codec on Gaussian data (per-token worst case)
# kvtc unbound: each head fitted on its own rows
BOUNDS = {"fp32": 1e-7, "fp16": 1e-3, "bf16": 1e-2, "int8": 0.02, "int4": 0.2, "int3": 0.4,
          "int2": 0.9, "cachegen": 0.9, "kvtc": 0.3, "kivi": 0.9, "rdq": 0.1}


def kv_like(n: int, dim: int = 64, seed: int = 0) -> torch.Tensor:
    """Gaussian rows with a few outlier channels, like pre-RoPE keys."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    x[:, :4] *= 8
    return x


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("spec", codec_names())
@pytest.mark.parametrize("kind", ["key", "value"])
@pytest.mark.parametrize("n", [0, 1, 7, 64, 150])
def test_roundtrip_within_bounds(spec, kind, n):
    x = kv_like(n)
    codec = get_codec(spec)
    parts, params = codec.encode(x, Role(kind, layer=1, n_layers=4))
    y = get_codec(spec).decode(parts, params)  # decoding needs only the spec and params
    assert y.shape == x.shape and y.dtype == x.dtype
    if n:
        assert rel(y, x) < BOUNDS[spec.split("+")[0]]


def test_more_bits_less_error():
    x = kv_like(256)
    errors = [rel(get_codec(f"int{b}").decode(*get_codec(f"int{b}").encode(x, Role("key"))), x)
              for b in (2, 3, 4, 8)]
    assert errors[0] > errors[1] > errors[2] > errors[3]


def test_kivi_value_widths_between_4_and_8_bits():
    """5- and 6-bit codes (one a byte, for "+zstd") sit between int4 and int8 in error and,
    entropy-coded, in size."""
    x = kv_like(512)
    errors, sizes = [], []
    for b in (4, 5, 6, 8):
        codec = get_codec(f"kivi+zstd:key_bits=4,value_bits={b}")
        parts, params = codec.encode(x, Role("value"))
        errors.append(rel(codec.decode(parts, params), x))
        sizes.append(sum(p.numel() * p.element_size() for p in parts.values()))
    assert errors[0] > errors[1] > errors[2] > errors[3]
    assert sizes[0] < sizes[1] < sizes[2] < sizes[3]


def test_zstd_is_lossless_over_its_inner_codec_and_smaller():
    x = kv_like(512)
    for base in ("fp16", "int4", "int2"):
        plain = get_codec(base)
        parts, params = plain.encode(x, Role("key"))
        z_parts, z_params = get_codec(base + "+zstd").encode(x, Role("key"))
        assert torch.equal(get_codec(base + "+zstd").decode(z_parts, z_params),
                           plain.decode(parts, params))
        size = sum(t.numel() * t.element_size() for t in parts.values())
        assert sum(t.numel() for t in z_parts.values()) < size


def test_keys_per_channel_values_per_token():
    x = kv_like(100)
    key_parts, key_params = IntCodec(4, key_group=32).encode(x, Role("key"))
    val_parts, val_params = IntCodec(4, value_group=16).encode(x, Role("value"))
    assert key_params["per_channel"] and key_parts["scale"].shape == (4, 64)
    assert not val_params["per_channel"] and val_parts["scale"].shape == (100, 4)
    assert key_parts["packed"].shape == (100, 32) and key_parts["packed"].dtype == torch.uint8


@pytest.mark.parametrize("bits, width", [(2, 16), (3, 64), (4, 32), (8, 64)])
def test_planar_packing(bits, width):
    codes = torch.randint(0, 1 << bits, (5, 64), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (5, width)
    assert torch.equal(unpack_codes(packed, bits, 64), codes)
    if bits == 4:  # the two RoPE halves of a channel pair share a byte
        assert torch.equal(packed & 15, codes[:, :32]) and torch.equal(packed >> 4, codes[:, 32:])


def test_quantize_exact_on_grid_and_constant_groups():
    x = torch.arange(16, dtype=torch.float32).repeat(64, 1).T.contiguous()  # (16, 64) on a grid
    assert torch.equal(quantize(x, 4, 16, True).dequantize(), x)
    const = torch.full((10, 64), 3.5)
    assert torch.equal(quantize(const, 2, 4, False).dequantize(), const)


def test_quantize_rejects_what_it_cannot_store():
    with pytest.raises(ValueError, match="divisible"):
        quantize(torch.randn(4, 6), 2, 4, True)
    with pytest.raises(ValueError, match="bf16"):
        quantize(torch.tensor([[1e6, -1e6]]), 8, 4, True)
    with pytest.raises(ValueError, match="bits"):
        quantize(torch.randn(4, 8), 7, 4, True)


def test_quantized_piece_is_what_decode_dequantizes():
    x = kv_like(70)
    parts, params = get_codec("int4+zstd").encode(x, Role("key"))
    (piece,) = get_codec("int4+zstd").pieces(parts, params)
    assert isinstance(piece, QuantizedTensor) and piece.n == 70
    assert torch.equal(piece.dequantize(), get_codec("int4+zstd").decode(parts, params))


def test_cachegen_keeps_sinks_and_recent_tokens_in_fp16():
    x = kv_like(200)
    codec = CacheGen(sinks=4, recent=16, layer_bits=((0.5, 4), (1.0, 2)))
    ranks = torch.arange(200) + 10  # this head's rows are context tokens 10..209 of 300
    parts, params = codec.encode(x, Role("key", layer=0, n_layers=4, ranks=ranks, n_tokens=300))
    assert params["head"] == 0 and params["tail"] == 0  # no sink, none in the last 16 of 300
    parts, params = codec.encode(x, Role("value", layer=3, n_layers=4, n_tokens=200))
    assert (params["head"], params["tail"], params["bits"]) == (4, 16, 2)
    y = codec.decode(parts, params)
    assert torch.equal(y[:4], x[:4].half().float()) and torch.equal(y[-16:], x[-16:].half().float())
    assert rel(y[4:-16], x[4:-16]) > 0.05  # the middle really is 2-bit


def test_cachegen_bit_schedules():
    assert [CacheGen().bits_for(layer, 8) for layer in range(8)] == [4, 4, 2, 2, 2, 2, 2, 2]
    calibrated = CacheGen(layer_bits=(4, 2, 8))
    assert [calibrated.bits_for(layer, 3) for layer in range(3)] == [4, 2, 8]
    with pytest.raises(ValueError, match="layers"):
        calibrated.bits_for(0, 4)


def test_registry():
    assert isinstance(get_codec("int2+zstd"), Zstd) and get_codec("int2+zstd").name == "int2+zstd"
    assert get_codec("int4", key_group=16).key_group == 16
    for bad in ("int5", "int4+gzip", ""):
        with pytest.raises(UnknownCodec):
            get_codec(bad)
    with pytest.raises(UnknownCodec, match="options"):
        get_codec("fp16", group=3)


def test_options_from_a_command_line_are_converted_and_checked():
    spec, options = parse_spec("cachegen+zstd:recent=0,layer_bits=((0.5,4),(1.0,2))")
    codec = get_codec(spec, **options)
    assert codec.name == "cachegen+zstd"
    assert codec.inner.recent == 0 and codec.inner.layer_bits == ((0.5, 4), (1.0, 2))
    assert get_codec("int4", key_group="16").key_group == 16
    for bad in ({"key_group": "0"}, {"key_group": "x"}):
        with pytest.raises(InvalidCodecOption, match="key_group"):
            get_codec("int4", **bad)
    with pytest.raises(InvalidCodecOption, match="layer_bits"):
        get_codec("cachegen", layer_bits="((")
    for bad in ("(4,7,4)", "((0.5,4),)", "((0.5,4),(1.0,9))"):  # refused before any encode
        with pytest.raises((InvalidCodecOption, ValueError)):
            get_codec("cachegen+zstd", layer_bits=bad)


def test_a_spec_is_parsed_once_and_each_caller_gets_its_own_options():
    assert parse("kvtc+zstd:bits=2") is parse("kvtc+zstd:bits=2")
    assert parse("kvtc+zstd:bits=2") == Spec("kvtc", ("zstd",), (("bits", "2"),))
    assert parse("kvtc+zstd:bits=2").name == "kvtc+zstd"
    parse_spec("int4:key_group=16")[1]["key_group"] = "8"
    assert parse_spec("int4:key_group=16") == ("int4", {"key_group": "16"})


def test_a_pack_builds_each_codec_once_not_once_per_tensor(monkeypatch):
    from kvedge.common.pack import format as pack_format
    from kvedge.common.pack.context import KVContext

    keys = [kv_like(8, 16, seed=layer).reshape(2, 4, 16) for layer in range(3)]
    ctx = KVContext.from_dense(keys, keys, list(range(4)), model_fingerprint="ab",
                               tokenizer_id="cd")
    pack = pack_format.open_pack(pack_format.encode_pack(ctx, "int4+zstd"))
    built = []
    monkeypatch.setattr(pack_format, "get_codec", lambda spec: built.append(spec) or
                        get_codec(spec))
    pack.context()
    assert sorted(built) == ["fp16", "int4+zstd"]  # 12 KV tensors, 3 block summaries


def test_a_list_of_specs_splits_where_a_codec_starts_not_between_its_options():
    assert split_specs("int8+zstd,kvtc:bits=2") == ["int8+zstd", "kvtc:bits=2"]
    assert split_specs("kvtc:bits=3, embed=false,int4+zstd") == ["kvtc:bits=3, embed=false",
                                                                 "int4+zstd"]
    layered = "cachegen+zstd:recent=0,layer_bits=((0.5,4),(1.0,2))"
    assert split_specs(f"{layered},fp16") == [layered, "fp16"]
    assert split_specs("int4") == ["int4"] and split_specs(" , ") == []


def test_the_default_codec_is_read_without_torch():
    import subprocess
    import sys

    code = ("import sys; from kvedge.common.pack.codecs import DEFAULT_CODEC; "
            "print(DEFAULT_CODEC, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [DEFAULT_CODEC, "False"]  # no torch
    get_codec(out[0])  # a registered codec, its options valid


def test_allocate_layer_bits_spends_the_budget_on_sensitive_layers():
    from kvedge.common.pack.calibrate import allocate_layer_bits

    sizes = {2: [100] * 4, 3: [150] * 4, 4: [200] * 4}
    assert allocate_layer_bits([0.0, 1.0, 0.1, 0.0], sizes, 400) == (2, 2, 2, 2)
    assert allocate_layer_bits([0.0, 1.0, 0.1, 0.0], sizes, 500) == (2, 4, 2, 2)
    assert allocate_layer_bits([0.0, 1.0, 0.5, 0.0], sizes, 550) == (2, 4, 3, 2)
    assert allocate_layer_bits([0.0, 1.0, 0.5, 0.0], sizes, 600) == (2, 4, 4, 2)
    assert allocate_layer_bits([1.0] * 4, sizes, 800) == (4, 4, 4, 4)
    with pytest.raises(ValueError, match="even 2 bits"):
        allocate_layer_bits([1.0] * 4, sizes, 399)


def test_kivi_gives_keys_and_values_their_own_widths():
    from kvedge.common.pack.errors import InvalidCodecOption

    x = kv_like(128)
    codec = get_codec("kivi:key_bits=8,value_bits=2")
    k_parts, k_params = codec.encode(x, Role("key"))
    v_parts, v_params = codec.encode(x, Role("value"))
    assert (k_params["bits"], v_params["bits"]) == (8, 2)
    assert k_params["per_channel"] and not v_params["per_channel"]
    for kind, (parts, params) in (("key", (k_parts, k_params)), ("value", (v_parts, v_params))):
        same = get_codec(f"int{params['bits']}").encode(x, Role(kind))
        assert all(torch.equal(parts[p], same[0][p]) for p in parts)  # KIVI's own layout
        assert torch.equal(get_codec("kivi").decode(parts, params),  # params name the width
                           get_codec(f"int{params['bits']}").decode(*same))
    assert rel(codec.decode(k_parts, k_params), x) < rel(codec.decode(v_parts, v_params), x)
    with pytest.raises((InvalidCodecOption, ValueError)):
        get_codec("kivi:key_bits=7")


def test_kivi_widths_by_layer():
    from kvedge.common.net.auth import VARIANT_RE
    from kvedge.common.pack.errors import InvalidCodecOption

    x = kv_like(128)
    codec = get_codec("kivi+zstd:key_bits=5,value_bits=4,key_layers=(6,4,4,5),"
                      "value_layers=((0.5,5),(1.0,3))")
    keys = [codec.encode(x, Role("key", layer=i, n_layers=4))[1]["inner"]["bits"]
            for i in range(4)]
    values = [codec.encode(x, Role("value", layer=i, n_layers=4))[1]["inner"]["bits"]
              for i in range(4)]
    assert (keys, values) == ([6, 4, 4, 5], [5, 5, 3, 3])
    parts, params = codec.encode(x, Role("key", layer=1, n_layers=4))  # decodes as int4+zstd
    same = get_codec("int4+zstd").encode(x, Role("key"))
    assert torch.equal(codec.decode(parts, params), get_codec("int4+zstd").decode(*same))
    digits = get_codec("kivi+zstd:key_layers=6445,value_layers=((0.5,5),(1.0,3))")
    assert digits.inner.key_layers == (6, 4, 4, 5)  # one digit a layer: a variant's name
    assert VARIANT_RE.fullmatch("none-1-kivi+zstd:key_bits=5,value_bits=4,key_layers="
                                + "45" * 12 + ",value_layers=" + "34" * 12)
    plain = get_codec("kivi:key_bits=5,value_bits=4")  # no schedule: the scalar widths
    assert plain.bits_for(Role("key", layer=3, n_layers=4)) == 5
    with pytest.raises(ValueError, match="layers"):  # a per-layer list for another model
        codec.encode(x, Role("key", layer=0, n_layers=24))
    for bad in ("key_layers=(4,7)", "value_layers=((0.5,4),)", "key_layers=(("):
        with pytest.raises((InvalidCodecOption, ValueError)):
            get_codec(f"kivi:{bad}")


def test_allocate_kv_widths_lowers_the_cheapest_damage_per_byte_first():
    from kvedge.common.pack.calibrate import allocate_kv_widths

    keys = {5: [100, 100, 100], 4: [80, 80, 80]}
    values = {4: [80, 80, 80], 3: [70, 70, 70], 2: [40, 40, 40]}
    steps_k, steps_v = [1.0, 0.001, 1.0], [1.0, 1.0, 0.001]
    assert allocate_kv_widths(steps_k, steps_v, keys, values, 600) == ((5, 5, 5), (4, 4, 4), 540)
    # 20 bytes to save: key layer 1 (20 B for 0.001, 5e-5 a byte) before value layer 2 (10 B
    # for 0.001 at 3 bits, 1e-4 a byte; 40 B for 5 x 0.001 at 2 bits, 1.25e-4)
    assert allocate_kv_widths(steps_k, steps_v, keys, values, 520) == ((5, 4, 5), (4, 4, 4), 520)
    # then value layer 2 to 3 bits (1e-4 a byte), then on to 2 (0.004 for 30 B): two bits
    # below the top adds 5x the measured step (quantization noise, 4x a bit)
    k, v, total = allocate_kv_widths(steps_k, steps_v, keys, values, 490)
    assert (k, v, total) == ((5, 4, 5), (4, 4, 2), 480)
    with pytest.raises(ValueError, match="narrowest"):
        allocate_kv_widths(steps_k, steps_v, keys, values, 300)


def test_allocate_kv_widths_prices_a_step_of_several_bits_as_measured():
    """A top of 8 bits with 5 (keys) and 4 (values) measured: each measured step is that
    width's damage, not 21x / 85x of it, so a value layer at 4 bits (1.0 for 120 B) goes
    before a key layer at 5 (1.0 for 100 B); 4-bit keys cost (4^4 - 1) / (4^3 - 1) of 5's."""
    from kvedge.common.pack.calibrate import allocate_kv_widths

    keys = {8: [200, 200], 5: [100, 100], 4: [80, 80]}
    values = {8: [200, 200], 4: [80, 80], 3: [70, 70]}
    steps = [1.0, 1.0]
    assert allocate_kv_widths(steps, steps, keys, values, 680) == ((8, 8), (4, 8), 680)
    assert allocate_kv_widths(steps, steps, keys, values, 480) == ((5, 8), (4, 4), 460)
    # then keys to 4 (3.05 more for 20 B) before values to 3 (3.01 for 10 B)
    assert allocate_kv_widths(steps, steps, keys, values, 330) == ((4, 4), (4, 4), 320)
    # a width between the top and the measured one: keys measured at 5, 6 priced at
    # (4^2 - 1) / (4^3 - 1) of it (0.24 for 50 B) — below 4-bit values (1.0 for 120 B)
    keys, values = {8: [200], 6: [150], 5: [100]}, {8: [200], 4: [80]}
    assert allocate_kv_widths([1.0], [1.0], keys, values, 350,
                              measured=(5, 4)) == ((6,), (8,), 350)
    # read as measured at 6 (the second-widest), 6 would cost 1.0 and values go first
    assert allocate_kv_widths([1.0], [1.0], keys, values, 350) == ((8,), (4,), 280)


def test_calibrated_kivi_binds_the_models_widths_at_encode_time(monkeypatch):
    """`kivi:calibrated=true` encodes with the widths recorded for the encoding model (its
    registry entry) and with key_bits/value_bits for a model without them; the pack names
    each tensor's width, so reading it needs nothing from the registry."""
    from dataclasses import replace

    from kvedge.common.model import models
    from kvedge.common.model.runtime import Runtime
    from kvedge.common.net.auth import VARIANT_RE
    from kvedge.common.pack.codecs import codec_for_model
    from kvedge.common.pack.format import encode_pack, open_pack
    from kvedge.common.pack.prefill import segment_context

    spec = "kivi+zstd:key_bits=5,value_bits=4,calibrated=true"  # K5 V4 without widths by layer
    assert VARIANT_RE.fullmatch(f"contrastkv-0.3-{spec}")  # a batch job's variant name
    assert VARIANT_RE.fullmatch(f"contrastkv-0.3-{DEFAULT_CODEC}")
    assert DEFAULT_CODEC == "rdq:calibrated=true,key_shift=0.5,coder=zstd"  # binds the same widths
    rt = Runtime(models.load_model("tiny-llama"))
    assert codec_for_model(spec, rt) == spec  # nothing recorded for tiny-llama: K5 V4
    entry = models.REGISTRY["tiny-llama"]
    monkeypatch.setitem(models.REGISTRY, "tiny-llama", replace(entry, kivi_options={
        "key_layers": "456", "value_layers": "342", "key_group": 16}))
    bound = codec_for_model(spec, rt)
    assert (bound.inner.key_layers, bound.inner.value_layers) == ((4, 5, 6), (3, 4, 2))
    assert bound.inner.key_group == 16 and bound.inner.value_group == 64
    assert codec_for_model(get_codec(spec), rt) == bound
    given = "kivi+zstd:key_bits=5,value_bits=4,calibrated=true,key_layers=888"
    assert codec_for_model(given, rt) == given  # widths written in the spec win
    ctx = segment_context(rt, list(range(3, 40)), fingerprint=rt.loaded.fingerprint,
                          tokenizer_id=rt.loaded.tokenizer_id, namespace="t")
    pack = open_pack(encode_pack(ctx, bound))
    widths = {name: t.params["inner"]["bits"] for name, t in pack.manifest.tensors.items()
              if t.codec == "kivi+zstd"}
    assert [widths[f"k.{layer}.0"] for layer in range(3)] == [4, 5, 6]
    assert [widths[f"v.{layer}.1"] for layer in range(3)] == [3, 4, 2]
    assert pack.tensor("v.2.1").shape == ctx.values[2][1].shape
    monkeypatch.setitem(models.REGISTRY, "tiny-llama", replace(entry, kivi_options={
        "key_layers": "45"}))
    assert codec_for_model(spec, rt) == spec  # recorded for another depth: not applied
