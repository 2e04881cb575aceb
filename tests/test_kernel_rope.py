"""The Triton RoPE kernel against its torch reference, in Triton's CPU interpreter."""
import os

import pytest
import torch

from kvedge.kernels.rope import apply_rope_at, rope_reference, rope_triton, use_triton

pytest.importorskip("triton")
assert os.environ.get("TRITON_INTERPRET") == "1", "conftest sets TRITON_INTERPRET before triton"


@pytest.mark.parametrize("shape", [(3, 37, 64), (1, 5, 16), (2, 4, 9, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_matches_reference(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen).to(dtype)
    positions = torch.randint(0, 8192, (shape[-2],), generator=gen)
    inv_freq = 1.0 / (1e5 ** (torch.arange(0, shape[-1], 2).float() / shape[-1]))
    ref = rope_reference(x.float(), positions, inv_freq, 1.25)
    out = rope_triton(x, positions, inv_freq, 1.25)
    assert out.dtype == dtype and out.shape == x.shape
    # one unit in the last place of the output dtype (the interpreter's casts may truncate)
    rtol = {torch.float32: 1e-5, torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]
    assert torch.allclose(out.float(), ref, rtol=rtol, atol=1e-4)


def test_dispatcher_uses_reference_on_cpu():
    x = torch.randn(2, 3, 8)
    assert not use_triton(x)
    positions, inv_freq = torch.arange(3), torch.rand(4)
    assert torch.equal(apply_rope_at(x, positions, inv_freq), rope_reference(x, positions, inv_freq))
