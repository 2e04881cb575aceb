"""The fused dequantize+RoPE kernel against its torch reference (Triton's CPU interpreter)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported

import pytest  # noqa: E402
import torch  # noqa: E402

from kvedge.common.pack.codecs import Role, get_codec  # noqa: E402
from kvedge.kernels.quant import quantize  # noqa: E402
from kvedge.kernels.dequant_rope import (dequant_rope, dequant_rope_many,  # noqa: E402
                                         dequant_rope_reference, dequant_rope_triton)
from kvedge.kernels.rope import rope_reference  # noqa: E402

triton = pytest.importorskip("triton")


def inv_freq(dim: int, theta: float = 1e5) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


@pytest.mark.parametrize("bits", [8, 5, 4, 3, 2])
@pytest.mark.parametrize("per_channel, group", [(True, 32), (True, 7), (False, 16), (False, 24)])
@pytest.mark.parametrize("n, dim", [(1, 64), (45, 64), (19, 80)])
def test_kernel_matches_reference(bits, per_channel, group, n, dim):
    g = torch.Generator().manual_seed(n * bits)
    x = torch.randn(n, dim, generator=g) * 4
    q = quantize(x, bits, group, per_channel)
    pos = torch.randint(0, 8000, (n,), generator=g)
    freq = inv_freq(dim)
    for positions, scaling in ((pos, 1.0), (pos, 0.7), (None, 1.0)):
        want = dequant_rope_reference(q, positions, freq, scaling)
        got = dequant_rope_triton(q, positions, freq, scaling)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
def test_kernel_output_dtypes(out_dtype):
    q = quantize(torch.randn(33, 64), 4, 32, True)
    pos = torch.arange(33) + 100
    got = dequant_rope_triton(q, pos, inv_freq(64), 1.0, out_dtype)
    assert got.dtype == out_dtype
    torch.testing.assert_close(got.float(), dequant_rope_reference(q, pos, inv_freq(64)),
                               atol=2e-2, rtol=1e-2)


def test_empty_head():
    q = quantize(torch.empty(0, 64), 4, 32, True)
    assert dequant_rope_triton(q, torch.empty(0, dtype=torch.long), inv_freq(64)).shape == (0, 64)


def test_reference_is_codec_decode_then_rope():
    x = torch.randn(70, 64)
    codec = get_codec("int4+zstd")
    parts, params = codec.encode(x, Role("key"))
    (piece,) = codec.pieces(parts, params)
    pos = torch.arange(70) * 2
    want = rope_reference(codec.decode(parts, params), pos, inv_freq(64))
    torch.testing.assert_close(dequant_rope_reference(piece, pos, inv_freq(64)), want)


def test_rotation_is_really_applied():
    q = quantize(torch.randn(8, 64), 8, 8, True)
    moved = dequant_rope_triton(q, torch.arange(8) + 1000, inv_freq(64))
    still = dequant_rope_triton(q, None)
    assert (moved - still).abs().max() > 0.1
    torch.testing.assert_close(moved.norm(dim=-1), still.norm(dim=-1))  # a rotation


def test_dispatcher_uses_the_reference_on_cpu(monkeypatch):
    import kvedge.kernels.dequant_rope as mod

    monkeypatch.setattr(mod, "dequant_rope_triton", lambda *a, **k: pytest.fail("triton on CPU"))
    q = quantize(torch.randn(4, 64), 4, 32, False)
    torch.testing.assert_close(dequant_rope(q, torch.arange(4), inv_freq(64)),
                               dequant_rope_reference(q, torch.arange(4), inv_freq(64)))


@pytest.mark.parametrize("bits, per_channel, group", [(4, True, 32), (2, False, 16),
                                                      (8, True, 7)])
def test_many_tensors_in_one_launch_are_each_launched_alone(bits, per_channel, group):
    """Stacked tensors whose last groups are short (45, 1 and 32 rows against groups of 32):
    each row still reads its own tensor's scale row."""
    g = torch.Generator().manual_seed(bits)
    qs = [quantize(torch.randn(n, 64, generator=g) * 3, bits, group, per_channel)
          for n in (45, 1, 32)]
    pos = torch.randint(0, 9000, (78,), generator=g)
    for positions in (pos, None):
        got = dequant_rope_many(qs, positions, inv_freq(64), 1.0, torch.float16)
        alone, start = [], 0
        for q in qs:
            p = None if positions is None else positions[start: start + q.n]
            alone.append(dequant_rope_triton(q, p, inv_freq(64), 1.0, torch.float16))
            start += q.n
        assert torch.equal(got, torch.cat(alone))


def test_many_refuses_mixed_layouts():
    qs = [quantize(torch.randn(4, 64), 4, 32, True), quantize(torch.randn(4, 64), 4, 32, False)]
    with pytest.raises(ValueError, match="one layout"):
        dequant_rope_many(qs)
