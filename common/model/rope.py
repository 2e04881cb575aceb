"""RoPE frequencies for every rope type the supported models use, and realignment.

The inverse frequencies and the attention scaling come from transformers' own
`ROPE_INIT_FUNCTIONS` (so a config means exactly what it means to transformers); the rotation
itself lives in `kvedge.kernels.rope` (Triton kernel + torch reference).

Sequence-length dependence: "dynamic" NTK scaling changes its frequencies once a sequence
grows past `max_position_embeddings`, and "longrope" switches to its long factors past the
original length. Transformers tracks that statefully while decoding; because our keys are
stored pre-RoPE we can do better: every key of a composed context is rotated with the
frequencies of the whole context (`seq_len` = the largest position + 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from kvedge.common.errors import UnsupportedArchitecture
from kvedge.kernels.rope import apply_rope_at, rope_cos_sin

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _default_parameters(config, device=None, seq_len=None):
    dim = head_dim_of(config)
    base = config.rope_parameters["rope_theta"]
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    return 1.0 / (base ** exponent), 1.0


@dataclass
class Rope:
    """The RoPE of one model config: `frequencies(seq_len)`, `cos_sin`, `rotate`."""

    config: object
    rope_type: str = field(init=False)
    _base: tuple = field(init=False, repr=False)

    def __post_init__(self):
        params = getattr(self.config, "rope_parameters", None) or {}
        self.rope_type = params.get("rope_type", "default")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedArchitecture(
                f"rope type {self.rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}")
        self._base = self._init(None)

    def _init(self, seq_len):
        if self.rope_type == "default":
            return _default_parameters(self.config, seq_len=seq_len)
        return ROPE_INIT_FUNCTIONS[self.rope_type](self.config, None, seq_len=seq_len)

    def frequencies(self, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
        """(inv_freq (D/2,) fp32, attention_scaling) for a context of `seq_len` tokens."""
        max_pos = self.config.max_position_embeddings
        if self.rope_type == "dynamic" and seq_len is not None and seq_len > max_pos:
            return self._init(seq_len)
        if self.rope_type == "longrope" and seq_len is not None:
            original = self.config.rope_parameters.get("original_max_position_embeddings", max_pos)
            if seq_len > original:
                return self._init(original + 1)
        return self._base

    def cos_sin(self, positions: torch.Tensor, seq_len: int | None = None):
        """fp32 cos, sin (T, D) for positions (T,)."""
        inv_freq, scaling = self.frequencies(seq_len)
        return rope_cos_sin(positions, inv_freq, scaling)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int | None = None):
        """Realign: pre-RoPE x (..., T, D) rotated to target positions (T,)."""
        inv_freq, scaling = self.frequencies(seq_len)
        return apply_rope_at(x, positions, inv_freq, scaling)
