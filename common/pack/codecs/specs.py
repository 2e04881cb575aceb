"""Codec specs: "int4+zstd" → Zstd(Int4()). Importing this module registers every family.

A spec is a base codec followed by stages joined with '+'. Options go to the base codec, as
values or as strings (a command line's), converted and range-checked by its fields. A spec
may carry them after a colon, "cachegen+zstd:recent=64,sinks=8" or "kvtc:bits=1.5", so one
string travels from a command line through an upload or a job to the worker, which binds it
to its model (`codec_for_model`: kvtc, calibrated kivi). A spec is parsed once per process
(`parse`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

from kvedge.common.errors import InvalidOption
from kvedge.common.pack.codecs import cachegen, floats, kivi, kvtc, rdq, zstd  # noqa: F401
from kvedge.common.pack.codecs.base import CODECS, STAGES, Codec
from kvedge.common.pack.errors import InvalidCodecOption, UnknownCodec


@dataclass(frozen=True)
class Spec:
    """A parsed spec: "kvtc+zstd:bits=2" → base "kvtc", stages ("zstd",), options
    (("bits", "2"),) as written (strings; the codec's fields convert them)."""

    base: str
    stages: tuple[str, ...]
    options: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        """The spec without its options, as a manifest records it: "kvtc+zstd"."""
        return "+".join((self.base, *self.stages))


def get_codec(spec: str, **options) -> Codec:
    """"int4+zstd" → Zstd(Int4(**options)). Options go to the base codec; those written in
    the spec ("kvtc:bits=1.5") first, `options` over them."""
    parsed = parse(spec)
    options = {**dict(parsed.options), **options}
    bases, known_stages = sorted(CODECS), sorted(STAGES)
    if parsed.base not in bases or any(s not in known_stages for s in parsed.stages):
        raise UnknownCodec(f"unknown codec {parsed.name!r}: bases {bases}, stages "
                           f"{known_stages} (join with '+', e.g. 'int4+zstd')")
    try:
        codec = CODECS.create(parsed.base, options)
    except InvalidOption as err:
        raise InvalidCodecOption(f"{err}") from None
    for stage in parsed.stages:
        codec = STAGES[stage](codec)
    return codec


def codec_for_model(codec: str | Codec, rt, store: kvtc.TransformStore | None = None):
    """What a worker encodes with: a codec that binds to its model (`for_model`: kvtc to the
    calibrated transform of `rt`'s model, fitted and saved on first use; kivi `calibrated` to
    the model's measured widths by layer), alone or under a stage ("kvtc+zstd"), bound; any
    other codec as it was given — its spec is not even built unless its base can bind."""
    built = codec
    if isinstance(codec, str):
        base = parse(codec).base
        if base not in CODECS or not hasattr(CODECS[base], "for_model"):
            return codec  # get_codec names the unknown base where the codec is used
        built = get_codec(codec)
    inner = getattr(built, "inner", built)
    if not hasattr(inner, "for_model"):
        return codec
    bound = inner.for_model(rt, store)
    if bound is inner:
        return codec
    return bound if inner is built else replace(built, inner=bound)


def codec_names() -> list[str]:
    """Every base alone and with each stage — what the CLI and the benchmark offer."""
    return sorted(CODECS) + [f"{b}+{s}" for b in sorted(CODECS) for s in sorted(STAGES)]


def split_specs(text: str) -> list[str]:
    """"int8+zstd,kvtc:bits=3,embed=false" → ["int8+zstd", "kvtc:bits=3,embed=false"]: a comma
    starts another spec unless an option (key=value) follows it or it sits in parentheses."""
    specs, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0 and not re.match(r"\s*\w+\s*=", text[i + 1:]):
            specs.append(text[start:i])
            start = i + 1
    return [spec.strip() for spec in [*specs, text[start:]] if spec.strip()]


def parse_spec(text: str) -> tuple[str, dict[str, str]]:
    """"cachegen+zstd:recent=0,layer_bits=((0.5,4),(1.0,2))" → (spec, {option: text})."""
    parsed = parse(text)
    return parsed.name, dict(parsed.options)


@lru_cache(maxsize=256)
def parse(text: str) -> Spec:
    """The spec `text`, parsed once per process: every pack a worker encodes or a reader
    opens names one of the same handful of specs."""
    spec, _, opts = text.partition(":")
    options = {}
    for pair in filter(None, re.split(r",(?=\w+=)", opts)):  # commas inside tuples stay
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidCodecOption(f"codec option {pair!r} in {text!r} is not key=value")
        options[key.strip()] = value.strip()
    base, *stages = spec.split("+")
    return Spec(base, tuple(stages), tuple(options.items()))
