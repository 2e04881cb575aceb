"""rdq: steps by reverse water-filling, codes range-coded per channel (codecs/rdq.py)."""
import pytest
import torch

from kvedge.common.pack.codecs import Role, codec_for_model, get_codec
from kvedge.common.pack.codecs.rdq import KAPPA, steps


def kv_like(n: int, dim: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g) + torch.linspace(-3, 3, dim)
    x[:, :4] *= 8
    return x


def test_every_value_is_within_half_a_step_of_its_channel_grid():
    x = kv_like(300).to(torch.float16)
    codec = get_codec("rdq:key_bits=5")
    parts, params = codec.encode(x, Role("key"))
    y = codec.decode(parts, params)
    assert y.dtype == torch.float16 and y.shape == x.shape
    step = parts["step"].float()
    err = (y.float() - x.float()).abs()
    assert bool((err <= step / 2 + 2e-3 * x.float().abs() + 1e-3).all())
    assert parts["codes"].numel() < x.numel() * 2 / 3  # fp16 is 2 bytes a value


def test_the_unweighted_step_is_what_min_max_gives_a_gaussian_channel():
    """Weight 1 everywhere: one step for every channel, κσ/(2^b − 1) for unit channels."""
    x = torch.randn(4096, 8, generator=torch.Generator().manual_seed(1))
    s = steps(x, torch.ones(8), 4)
    assert torch.allclose(s, torch.full((8,), KAPPA / 15), rtol=0.03)
    wide = x * torch.tensor([10.0] + [1.0] * 7)  # one loud channel: the same step for all
    assert torch.allclose(steps(wide, torch.ones(8), 4), steps(wide, torch.ones(8), 4)[0])


def test_a_channel_weighing_100x_gets_a_10x_finer_step():
    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(2))
    w = torch.ones(8)
    w[3] = 100.0
    s = steps(x, w, 5)
    assert float(s[0] / s[3]) == pytest.approx(10.0, rel=1e-4)


def test_more_bits_less_error_and_more_bytes():
    x = kv_like(256)
    out = []
    for bits in (3, 5, 7):
        codec = get_codec(f"rdq:value_bits={bits}")
        parts, params = codec.encode(x, Role("value"))
        out.append((float((codec.decode(parts, params) - x).norm()), parts["codes"].numel()))
    assert out[0][0] > out[1][0] > out[2][0] and out[0][1] < out[1][1] < out[2][1]


def test_the_same_tensor_encodes_to_the_same_bytes():
    x = kv_like(100)
    a, b = (get_codec("rdq").encode(x, Role("key"))[0] for _ in range(2))
    assert all(torch.equal(a[p], b[p]) for p in a)


def test_constant_and_empty_tensors():
    codec = get_codec("rdq")
    for x in (torch.full((5, 64), 2.5), torch.zeros(0, 64), torch.ones(1, 64)):
        parts, params = codec.encode(x, Role("key"))
        assert torch.equal(codec.decode(parts, params), x)


def test_resolutions_out_of_range_are_refused_where_the_spec_is_written():
    with pytest.raises(ValueError, match="2-12 bits"):
        get_codec("rdq:key_layers=515")  # a 1-bit layer
    with pytest.raises(Exception, match="key_bits"):
        get_codec("rdq:key_bits=13")


def test_bound_to_a_model_its_weights_set_the_steps_and_the_pack_reads_back_alone():
    """for_model measures the channel weights on the real (tiny) model: keys from its
    queries' energy (equal over each RoPE pair), values from o_proj; the pack records the
    steps, so reading it needs no model."""
    from kvedge.common.model import models
    from kvedge.common.model.runtime import Runtime
    from kvedge.common.pack.format import encode_pack, read_pack
    from kvedge.common.pack.prefill import segment_context

    rt = Runtime(models.load_model("tiny-llama"))
    bound = codec_for_model("rdq", rt)
    w = bound.weights
    n_layers, n_kv, dim = rt.config.num_hidden_layers, rt.n_kv, rt.head_dim
    assert w["key"].shape == w["value"].shape == (n_layers, n_kv, dim)
    assert torch.equal(w["key"], w["key"].roll(dim // 2, dims=2))  # RoPE pairs share a weight
    assert bool((w["value"] > 0).all()) and not torch.allclose(w["key"][0, 0], w["key"][0, 0, :1])
    assert codec_for_model("rdq:weighted=false", rt) == "rdq:weighted=false"
    ctx = segment_context(rt, list(range(3, 90)), fingerprint=rt.loaded.fingerprint,
                          tokenizer_id=rt.loaded.tokenizer_id, namespace="t",
                          side_tensors=False)
    back = read_pack(encode_pack(ctx, bound))
    for layer in range(n_layers):
        for kind in ("keys", "values"):
            for x, y in zip(getattr(ctx, kind)[layer], getattr(back, kind)[layer]):
                assert y.shape == x.shape and float((y - x).norm() / x.norm()) < 0.1
    unweighted = read_pack(encode_pack(ctx, "rdq"))
    assert not torch.equal(unweighted.keys[0][0], back.keys[0][0])  # the weights moved steps


def test_an_outlier_far_past_its_step_coarsens_its_channel_not_the_table():
    x = kv_like(64)
    x[5, 7] = 1e4  # ~10^4 steps away: its channel's step grows until codes fit MAX_CODE
    codec = get_codec("rdq:key_bits=12")
    parts, params = codec.encode(x, Role("key"))
    from kvedge.common.pack.codecs.rdq import MAX_CODE
    assert params["bound"] <= MAX_CODE
    y = codec.decode(parts, params)
    assert abs(float(y[5, 7]) - 1e4) <= float(parts["step"][7]) / 2 + 1e4 / 256
    big = get_codec("rdq").encode(x * 1e3, Role("value"))  # past fp16 range: still coded
    assert rel_err(get_codec("rdq").decode(*big), x * 1e3) < 0.1


def rel_err(a, b) -> float:
    return float((a - b).norm() / b.norm())


def test_calibrated_binds_the_models_widths_by_layer_and_its_weights(monkeypatch):
    """`rdq:calibrated=true` takes the widths by layer the model's registry entry records, as
    kivi's calibrated=true does, plus its key_shift; a model without an entry gets
    key_bits/value_bits. Both are bound with the model's channel weights."""
    from dataclasses import replace

    from kvedge.common.model import models
    from kvedge.common.model.runtime import Runtime

    spec = "rdq:calibrated=true,key_shift=0.5"
    rt = Runtime(models.load_model("tiny-llama"))
    given = get_codec(spec)
    plain = codec_for_model(spec, rt)
    assert plain.key_layers == () and plain.weights is not None
    assert plain.bits_for(Role("key", 1, 3)) == given.key_bits + 0.5
    entry = models.REGISTRY["tiny-llama"]
    monkeypatch.setitem(models.REGISTRY, "tiny-llama", replace(entry, kivi_options={
        "key_layers": "456", "value_layers": "342", "key_group": 16}))
    bound = codec_for_model(spec, rt)
    assert (bound.key_layers, bound.value_layers) == ((4, 5, 6), (3, 4, 2))
    assert [bound.bits_for(Role("key", layer, 3)) for layer in range(3)] == [4.5, 5.5, 6.5]
    assert [bound.bits_for(Role("value", layer, 3)) for layer in range(3)] == [3, 4, 2]
    assert torch.equal(bound.weights["key"], plain.weights["key"])


@pytest.mark.parametrize("n", [0, 1, 7, 64, 300])
@pytest.mark.parametrize("kind", ["key", "value"])
def test_the_zstd_coder_decodes_to_what_the_range_coder_does(n, kind):
    """coder=zstd codes the same integers: the tensors read back are identical, an escaped
    code (|code| > 127) included; decoding needs only the name (the manifest records "rdq")
    and the params."""
    x = kv_like(n)
    if n > 5:
        x[5, 7] = 300.0  # ~1,000 steps from its channel's centre at 12 bits: escaped
    spec = "rdq:key_bits=12" if kind == "key" else "rdq:value_bits=4"
    ranged = get_codec(spec).encode(x, Role(kind, 1, 4))
    zstd_parts, zstd_params = get_codec(spec + ",coder=zstd").encode(x, Role(kind, 1, 4))
    assert torch.equal(get_codec("rdq").decode(zstd_parts, zstd_params),
                       get_codec(spec).decode(*ranged))
    if n > 5 and kind == "key":
        assert zstd_parts["wide"].numel() >= 1 and zstd_parts["wide"].dtype == torch.int16
    if n == 300:
        assert zstd_parts["codes"].numel() < 1.3 * ranged[0]["codes"].numel()


def test_damaged_zstd_frames_are_named_errors():
    codec = get_codec("rdq:coder=zstd,key_bits=12")
    x = kv_like(64)
    x[5, 7] = 300.0
    parts, params = codec.encode(x, Role("key"))
    for bad_params, bad_parts, match in (
            ({**params, "frames": params["frames"][:-1]}, parts, "frames"),
            ({**params, "frames": [params["frames"][0] + 1] + params["frames"][1:]}, parts,
             "frames"),
            (params, {**parts, "wide": parts["wide"][:-1]}, "escaped"),
            (params, {**parts, "codes": torch.zeros_like(parts["codes"])}, "zstd frame"),
            (params, {**parts, "side": parts["side"][:-3]}, "side part")):
        with pytest.raises(ValueError, match=match):
            codec.decode(bad_parts, bad_params)
    from kvedge.common.pack.errors import InvalidCodecOption
    with pytest.raises(InvalidCodecOption, match="coder"):
        get_codec("rdq:coder=huffman")


def test_a_zstd_coded_pack_reads_back_and_a_flipped_byte_is_caught():
    from kvedge.common.model import models
    from kvedge.common.model.runtime import Runtime
    from kvedge.common.pack.errors import PackCorrupt
    from kvedge.common.pack.format import encode_pack, read_pack
    from kvedge.common.pack.prefill import segment_context

    rt = Runtime(models.load_model("tiny-llama"))
    ctx = segment_context(rt, list(range(3, 90)), fingerprint=rt.loaded.fingerprint,
                          tokenizer_id=rt.loaded.tokenizer_id, namespace="t",
                          side_tensors=False)
    data = encode_pack(ctx, codec_for_model("rdq:coder=zstd", rt))
    ranged = read_pack(encode_pack(ctx, codec_for_model("rdq", rt)))
    back = read_pack(data)
    assert all(torch.equal(a, b) for la, lb in zip(back.keys, ranged.keys)
               for a, b in zip(la, lb))
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0x40
    with pytest.raises(PackCorrupt):
        read_pack(bytes(damaged))
