"""Plug-ins chosen by name: one registry per kind, options as dataclass fields. Torch-free.

A plug-in (reuse strategy, eviction method, codec) is a dataclass with a `name` class
variable; its fields are its hyperparameters, declared with `option()` so each carries its
range and a line of help. A caller names the plug-in and passes a `name → value` map (values
may be strings, as they come from a command line or an RPC); `Registry.create` checks every
name and converts and range-checks every value, and a bad one is an `InvalidOption` that
names it. Adding a plug-in is one file and one `@REGISTRY.register` line; the CLIs, services,
benchmark and test matrices read the registry, never a list of their own.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Generic, Iterator, Mapping, TypeVar

from kvedge.common.errors import InvalidOption, InvalidRequest

T = TypeVar("T")
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def option(default, low: float | None = None, high: float | None = None, help: str = ""):
    """A plug-in hyperparameter: a dataclass field with its closed range and help line."""
    return dataclasses.field(default=default,
                             metadata={"low": low, "high": high, "help": help, "option": True})


def options_of(cls) -> list[dataclasses.Field]:
    """The fields a caller may set: every init field of the dataclass."""
    return [f for f in dataclasses.fields(cls) if f.init]


def convert(cls, field: dataclasses.Field, value: Any):
    """A value (maybe a string) as the field's type, range-checked; InvalidOption if not."""
    kind = type(field.default)
    where = f"{getattr(cls, 'name', cls.__name__)!r} option {field.name!r}"
    try:
        if kind is bool:
            text = str(value).strip().lower()
            if text not in _TRUE | _FALSE:
                raise ValueError(value)
            value = text in _TRUE
        elif kind in (int, float, str):
            value = kind(value)
            if kind is int and isinstance(value, float):
                raise ValueError(value)
    except (TypeError, ValueError):
        raise InvalidOption(f"{where} must be {kind.__name__}, got {value!r}") from None
    check_range(cls, field, value)
    return value


def check_range(cls, field: dataclasses.Field, value) -> None:
    low, high = field.metadata.get("low"), field.metadata.get("high")
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
        raise InvalidOption(f"{getattr(cls, 'name', cls.__name__)!r} option {field.name!r} "
                            f"must be in {span}, got {value!r}")


def validate(obj) -> None:
    """Range-check every option of a constructed plug-in (call from `__post_init__`)."""
    for field in options_of(type(obj)):
        if field.metadata.get("option"):
            check_range(type(obj), field, getattr(obj, field.name))


def describe(cls) -> list[str]:
    """One line per option: `name=default  [low, high]  help`."""
    lines = []
    for f in options_of(cls):
        low, high = f.metadata.get("low"), f.metadata.get("high")
        span = "" if low is None and high is None else \
            f"  [{'' if low is None else low}, {'' if high is None else high}]"
        lines.append(f"{f.name}={f.default!r}{span}  {f.metadata.get('help', '')}".rstrip())
    return lines


class Registry(Mapping[str, type], Generic[T]):
    """Plug-in classes of one kind by name. `unknown` is the error an unknown name raises."""

    def __init__(self, kind: str, unknown: type[InvalidRequest] = InvalidRequest):
        self.kind, self.unknown = kind, unknown
        self._classes: dict[str, type[T]] = {}

    def register(self, cls: type[T]) -> type[T]:
        """Class decorator: adds `cls` under `cls.name` (once)."""
        if not cls.name or cls.name in self._classes:
            raise ValueError(f"{self.kind} {cls.__name__}: name {cls.name!r} is empty or taken")
        self._classes[cls.name] = cls
        return cls

    def unregister(self, name: str) -> None:
        self._classes.pop(name, None)

    def __getitem__(self, name: str) -> type[T]:
        if name not in self._classes:
            raise self.unknown(f"unknown {self.kind} {name!r}; choose one of {sorted(self)}")
        return self._classes[name]

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)

    def create(self, name: str, options: Mapping[str, Any] | None = None) -> T:
        """An instance of `name` with `options` (strings or values) checked and converted."""
        cls = self[name]
        fields = {f.name: f for f in options_of(cls)}
        kwargs = {}
        for key, value in (options or {}).items():
            if key not in fields:
                raise InvalidOption(f"{self.kind} {name!r} has no option {key!r}; its options: "
                                    f"{sorted(fields) or 'none'}")
            kwargs[key] = convert(cls, fields[key], value)
        return cls(**kwargs)
