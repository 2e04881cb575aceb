"""bench/quant_error.py: the rotation is orthogonal, and a layout's error and stored bits are
what quantizing the tensor gives."""
import pytest
import torch

from kvedge.bench.quant_error import layout_error, rotation


def test_the_rotation_is_orthogonal_and_refuses_odd_widths():
    r = rotation(64)
    assert torch.allclose(r @ r.T, torch.eye(64), atol=1e-6)
    with pytest.raises(ValueError, match="power-of-two"):
        rotation(48)


def test_rotation_spreads_an_outlier_channel_for_per_token_groups():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 256, 64, generator=gen)
    x[..., 5] *= 30  # one outlier channel: per-token groups spend their range on it
    plain, plain_bits = layout_error([x], 4, 64, per_channel=False, rotate=False)
    rotated, _ = layout_error([x], 4, 64, per_channel=False, rotate=True)
    assert rotated < plain / 2
    # 4-bit codes, fp16 scale and zero per 64 codes: at most 4.5 bits (zstd only shrinks it)
    assert 3.0 < plain_bits <= 4.5 + 0.1
    # 8-bit codes barely move the tensor
    assert layout_error([x], 8, 64, per_channel=True, rotate=False)[0] < 1e-4
