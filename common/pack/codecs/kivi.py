"""`int8`, `int4`, `int3`, `int2`: KIVI-style asymmetric group quantization (Liu et al., "KIVI:
A Tuning-Free Asymmetric 2bit Quantization for KV Cache", ICML 2024, §3–4).

Keys are quantized per channel (groups of `key_group` tokens: their outlier channels stay
apart), values and side tensors per token (groups of `value_group` channels). `int3` stores
one code per byte: it is meant for "+zstd", which removes the slack.

`kivi` gives keys and values their own widths (`kivi:key_bits=4,value_bits=2`): keys carry
the outlier channels and feed the softmax, where an error is amplified across every query,
so the issue's frontier (bytes vs F1) tries spending bits on keys and saving them on values.
Side tensors (anything not a key or a value) take the key width. KIVI itself runs both at 2
bits; the split is a choice to measure, not the paper's. Widths are 2, 3, 4, 5, 6 or 8 (3, 5
and 6 stored one code a byte, for "+zstd"). Measured on Qwen2.5-0.5B (docs/results.md,
squad-evict): the teacher-forced KL of fp16's answers (`kvedge.bench.answer_kl`) adds up over
keys and values, and a key bit costs more than a value bit — keys 0.00023 at 6 bits, 0.00078
at 5, 0.0033 at 4, ~0.02 at 3; values 0.00013 at 5, 0.0004 at 4, ~0.002 at 3 — so at
equal bytes 8-bit keys with 4-bit values move the answers 8× less than the reverse. 4-bit
keys with 8-bit values keep fp16's F1 on 738 SQuAD questions (−0.001 [−0.008, +0.005]) but
are not shown to on hotpot-kb's 300 (−0.004 [−0.020, +0.009]), and no setting of ≥ 4× fewer
bytes moves the answers less than that one. 5-bit keys with 4-bit values keep it on both
(−0.003 [−0.008, +0.002] and +0.008 [−0.001, +0.020], ~3.4× below fp16): the default codec.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field, make_dataclass, replace

import torch

from kvedge.common.errors import InvalidOption
from kvedge.common.pack.codecs.base import CODECS, Codec, Parts, Role, expect, header
from kvedge.kernels.quant import BITS as WIDTHS
from kvedge.kernels.quant import QuantizedTensor, codes_per_byte, quantize
from kvedge.common.registry import option, validate


@dataclass
class IntCodec(Codec):
    """Any bit width (CacheGen picks one per layer); the registered names fix `bits`."""

    bits: int = 4
    key_group: int = option(64, 1, None, "tokens per key group (keys: per channel)")
    value_group: int = option(64, 1, None, "channels per value group (values: per token)")

    def __post_init__(self):
        validate(self)

    @property
    def name(self) -> str:
        return f"int{self.bits}"

    def encode(self, x, role=Role()):
        per_channel = role.kind == "key"
        group = self.key_group if per_channel else self.value_group
        q = quantize(x, self.bits, group, per_channel)
        params = {**header(x), "bits": self.bits, "group": group, "per_channel": per_channel}
        return {"packed": q.packed, "scale": q.scale, "zero": q.zero}, params

    def pieces(self, parts, params):
        return [quantized_piece(parts, params, params["shape"][0])]


def quantized_piece(parts: Parts, params: dict, n: int, prefix: str = "") -> QuantizedTensor:
    """Rebuild a QuantizedTensor of n rows from parts, checking every shape against params."""
    bits, group, per_channel = int(params["bits"]), int(params["group"]), params["per_channel"]
    dim = int(params["shape"][1])
    if bits not in WIDTHS or group < 1 or not isinstance(per_channel, bool):
        raise ValueError(f"bad quantization params {params}")
    groups = (math.ceil(n / group), dim) if per_channel else (n, math.ceil(dim / group))
    packed = expect(parts[prefix + "packed"], (n, dim // codes_per_byte(bits)), torch.uint8,
                    "packed")
    scale = expect(parts[prefix + "scale"], groups, torch.float16, "scale")
    zero = expect(parts[prefix + "zero"], groups, torch.float16, "zero")
    return QuantizedTensor(packed, scale, zero, bits, group, per_channel, dim)


def _fixed_width(bits: int) -> type[IntCodec]:
    """The registered codec `int<bits>`: IntCodec with its width fixed by the name, so only
    the group sizes are options."""
    return CODECS.register(make_dataclass(
        f"Int{bits}", [("bits", int, field(default=bits, init=False))], bases=(IntCodec,),
        namespace={"name": f"int{bits}", "__module__": __name__}))


Int8, Int4, Int3, Int2 = map(_fixed_width, (8, 4, 3, 2))


@CODECS.register
@dataclass
class Kivi(Codec):
    """Keys at `key_bits`, values at `value_bits`; each tensor's params name its width, so
    decoding needs no option. `key_layers` / `value_layers`, when given, set the width layer
    by layer instead, in CacheGen's `layer_bits` grammar (`layer_width`): one width per layer
    (calibrated for one model) or a depth schedule ((depth, bits), ...) that fits any."""

    key_bits: int = option(4, 2, 8, "bits per key code (2-6 or 8)")
    value_bits: int = option(2, 2, 8, "bits per value code (2-6 or 8)")
    key_group: int = option(64, 1, None, "tokens per key group (keys: per channel)")
    value_group: int = option(64, 1, None, "channels per value group (values: per token)")
    key_layers: tuple = option((), help="key widths by layer, over key_bits: 5445... (one "
                               "digit a layer), (5,4,...) or ((depth, bits), ...)")
    value_layers: tuple = option((), help="value widths by layer, over value_bits")
    calibrated: bool = option(False, help="widths by layer from the allocation measured for "
                              "the encoding model (its registry entry), bound at encode time; "
                              "key_bits/value_bits for a model without one")

    name = "kivi"

    def __post_init__(self):
        validate(self)
        check_widths(self.name, (self.key_bits, self.value_bits, *layer_options(self)))

    def bits_for(self, role: Role) -> int:
        """The width of a tensor of this role: its kind's, its layer's when set by layer."""
        value = role.kind == "value"
        layers = self.value_layers if value else self.key_layers
        if layers:
            return layer_width(layers, role.layer, role.n_layers,
                               "value_layers" if value else "key_layers")
        return self.value_bits if value else self.key_bits

    def encode(self, x, role=Role()):
        return IntCodec(self.bits_for(role), self.key_group, self.value_group).encode(x, role)

    def for_model(self, rt, store=None) -> "Kivi":
        """`calibrated`: a copy with the options measured for `rt`'s model (its registry
        entry's `kivi_options`: widths by layer from `kvedge.bench.layer_sensitivity`, the key
        group; each judged by F1 cells); itself when not calibrated, when widths by layer are
        given (they win), or when the model has none recorded or they name another depth (a
        folder loaded by path is not recognised: the entry is found by the registry name)."""
        if not self.calibrated or self.key_layers or self.value_layers:
            return self
        from kvedge.common.model.models import REGISTRY

        entry = REGISTRY.get(getattr(rt.loaded, "name", None))  # a bare module has no name
        if entry is None or not entry.kivi_options:
            return self
        bound = replace(self, **entry.kivi_options)
        n_layers = rt.config.num_hidden_layers
        for layers in (bound.key_layers, bound.value_layers):
            if layers and all(isinstance(b, int) for b in layers) and len(layers) != n_layers:
                return self
        return bound

    def pieces(self, parts, params):
        return [quantized_piece(parts, params, params["shape"][0])]


def layer_width(schedule: tuple, layer: int, n_layers: int, name: str = "layer_bits") -> int:
    """Layer `layer`'s width under `schedule`: one width per layer (its length must be the
    model's layer count), or a depth schedule ((depth, bits), ...) — the first entry whose
    depth reaches (layer + 1) / n_layers, so ((0.25, 4), (1.0, 2)) gives the first quarter of
    the layers 4 bits and the rest 2 (CacheGen's rule)."""
    if all(isinstance(b, int) for b in schedule):
        if len(schedule) != n_layers:
            raise ValueError(f"{name} lists {len(schedule)} layers, the model has {n_layers}")
        return schedule[layer]
    depth = (layer + 1) / n_layers
    return next(b for limit, b in schedule if depth <= limit + 1e-9)


def schedule_widths(schedule: tuple) -> list[int]:
    """The widths a schedule names; ValueError if it is neither form or stops short of the
    last layer."""
    if all(isinstance(b, int) for b in schedule):
        return list(schedule)
    if not all(isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], int)
               for e in schedule) or schedule[-1][0] < 1.0:
        raise ValueError(f"a width schedule is (bits, ...) or ((depth, bits), ...) ending at "
                         f"depth 1.0, not {schedule}")
    return [b for _, b in schedule]


def layer_options(codec) -> list[int]:
    """Parse `codec`'s key_layers/value_layers where given as text (in place); the widths
    they name, keys' then values'."""
    for which in ("key_layers", "value_layers"):
        if isinstance(getattr(codec, which), str):
            setattr(codec, which, literal_option(codec.name, which, getattr(codec, which)))
    return [*schedule_widths(codec.key_layers), *schedule_widths(codec.value_layers)]


def check_widths(codec: str, widths) -> None:
    """ValueError naming the first width no quantizer stores: refused where the spec is
    written, not in a worker mid-upload."""
    for width in widths:
        if width not in WIDTHS:
            raise ValueError(f"{codec} widths are {WIDTHS}, not {width}")


def literal_option(codec: str, name: str, text: str) -> tuple:
    """A tuple option given as text (a command line), parsed without evaluating code. A
    string of digits is one width per layer ("5445" = (5, 4, 4, 5)): the spelling that fits
    a KB variant's name (`common.net.auth.VARIANT_RE`: no parentheses, ≤ 128 characters)."""
    if text.isdigit():
        return tuple(int(c) for c in text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise InvalidOption(f"{codec!r} option {name!r} must be a Python literal such as "
                            f"((0.25,4),(1.0,2)) or (4,4,2,...), got {text!r}") from None
    if not isinstance(value, tuple):
        raise InvalidOption(f"{codec!r} option {name!r} must be a tuple, got {text!r}")
    return value
