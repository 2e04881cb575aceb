"""Codec specs: "int4+zstd" → Zstd(Int4()). Importing this module registers every family.

A spec is a base codec followed by stages joined with '+'. Options go to the base codec, as
values or as strings (a command line's), converted and range-checked by its fields. A spec
may carry them after a colon, "cachegen+zstd:recent=64,sinks=8" or "kvtc:bits=1.5", so one
string travels from a command line through an upload or a job to the worker.
"""
from __future__ import annotations

import re

from kvedge.common.errors import InvalidOption
from kvedge.common.pack.codecs import cachegen, floats, kivi, kvtc, zstd  # noqa: F401 - registers
from kvedge.common.pack.codecs.base import CODECS, STAGES, Codec
from kvedge.common.pack.errors import InvalidCodecOption, UnknownCodec


def get_codec(spec: str, **options) -> Codec:
    """"int4+zstd" → Zstd(Int4(**options)). Options go to the base codec; those written in
    the spec ("kvtc:bits=1.5") first, `options` over them."""
    spec, written = parse_spec(spec)
    options = {**written, **options}
    base, *stages = spec.split("+")
    bases, known_stages = sorted(CODECS), sorted(STAGES)
    if base not in bases or any(s not in known_stages for s in stages):
        raise UnknownCodec(f"unknown codec {spec!r}: bases {bases}, stages {known_stages} "
                           "(join with '+', e.g. 'int4+zstd')")
    try:
        codec = CODECS.create(base, options)
    except InvalidOption as err:
        raise InvalidCodecOption(f"{err}") from None
    for stage in stages:
        codec = STAGES[stage](codec)
    return codec


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
    spec, _, opts = text.partition(":")
    options = {}
    for pair in filter(None, re.split(r",(?=\w+=)", opts)):  # commas inside tuples stay
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidCodecOption(f"codec option {pair!r} in {text!r} is not key=value")
        options[key.strip()] = value.strip()
    return spec, options
