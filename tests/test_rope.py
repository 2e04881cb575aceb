"""RoPE realignment against transformers' own rotary embedding, for every rope type."""
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from kvedge.common.errors import UnsupportedArchitecture
from kvedge.common.model.rope import Rope

BASE = dict(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=512)
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 128},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 128},
}


def hf_rotate(config, x, positions):
    """transformers' path: a fresh rotary module, cos/sin at position_ids, apply_rotary_pos_emb."""
    cos, sin = LlamaRotaryEmbedding(config)(x, positions[None])
    _, k = apply_rotary_pos_emb(x[None], x[None], cos, sin)
    return k[0]


@pytest.mark.parametrize("rope_type", list(ROPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_matches_transformers(rope_type, dtype):
    config = LlamaConfig(**BASE, rope_parameters=dict(ROPES[rope_type]))
    x = torch.randn(4, 300, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    positions = torch.randperm(2000, generator=torch.Generator().manual_seed(1))[:300].sort().values
    ours = Rope(config).rotate(x, positions, seq_len=int(positions.max()) + 1)
    theirs = hf_rotate(config, x, positions)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert ours.dtype == dtype
    assert (ours.float() - theirs.float()).abs().max() <= tol


def test_dynamic_rope_below_its_max_length_is_default():
    dyn = Rope(LlamaConfig(**BASE, rope_parameters=dict(ROPES["dynamic"])))
    plain = Rope(LlamaConfig(**BASE, rope_parameters=dict(ROPES["default"])))
    assert torch.equal(dyn.frequencies(100)[0], plain.frequencies(100)[0])
    assert not torch.equal(dyn.frequencies(4096)[0], plain.frequencies(4096)[0])


def test_realignment_composes():
    """Rotating by a then re-deriving at b from pre-RoPE keys equals rotating at b directly."""
    config = LlamaConfig(**BASE, rope_parameters=dict(ROPES["default"]))
    rope = Rope(config)
    x = torch.randn(2, 10, 16)
    a, b = torch.arange(10), torch.arange(10) + 977
    assert torch.allclose(rope.rotate(x, b), rope.rotate(rope.rotate(x, a), b - a), atol=1e-4)


def test_unknown_rope_type_is_a_named_error():
    config = LlamaConfig(**BASE, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    config.rope_parameters = {"rope_type": "mystery", "rope_theta": 1e4}
    with pytest.raises(UnsupportedArchitecture, match="mystery"):
        Rope(config)
