"""What both command lines (`kvctl`, `kvedge`) share: error handling, paths, output, choices.

- Named kvedge errors print as one line `error: Type: message` with exit code 2.
- `--json` output is snake_case with numbers as numbers (`proto_dict`), not protobuf's JSON
  mapping (camelCase keys, int64 as strings).
- Progress bars (`progress_bar`, `advance`) redraw at tqdm's rate on a terminal and at most
  every PIPE_REDRAW_S seconds into a pipe or a log, where each redraw is a line of its own.
- Options whose values come from a registry use `RegistryChoice`: the registry is the only
  list, read when the option is checked or its help shown (not at import: `--help` of other
  commands never imports torch).
"""
from __future__ import annotations

import json
import sys
from typing import Callable, Iterable

import click

from kvedge.common.errors import KvedgeError

CLOUD_ADDRESS = "127.0.0.1:50051"
EDGE_ADDRESS = "127.0.0.1:50052"
# A wait polls its server every ~0.3 s; drawn on each poll, a bar writes ~200 "\r" redraws a
# minute, and in a CI log or a file each is a line. A log wants the state now and then.
PIPE_REDRAW_S = 30.0


def home_path(*parts):
    from kvedge.common.model.models import kvedge_home

    return kvedge_home().joinpath(*parts)


class KvedgeGroup(click.Group):
    """Turns kvedge's named errors into one clear line and exit code 2, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KvedgeError as err:
            click.echo(f"error: {type(err).__name__}: {err}", err=True)
            sys.exit(2)


class RegistryChoice(click.Choice):
    """A click.Choice over a registry's names, read lazily from `names()`."""

    def __init__(self, names: Callable[[], Iterable[str]]):
        self._names = names
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(sorted(self._names()))


def parse_options(pairs: Iterable[str]) -> dict[str, str]:
    """`--opt key=value` pairs → {key: value} (values stay strings; the receiver types them)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r}: use key=value", param_hint="--opt")
        out[key.strip()] = value.strip()
    return out


def proto_dict(msg) -> dict:
    """A protobuf message as plain JSON-ready data: field names as declared (snake_case),
    every field present, int64 as numbers, nested messages and repeated fields converted."""
    out = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif field.message_type is not None:
            out[field.name] = [proto_dict(v) for v in value] if field.is_repeated else \
                (proto_dict(value) if msg.HasField(field.name) else None)
        else:
            out[field.name] = list(value) if field.is_repeated else value
    return out


def echo_json(obj) -> None:
    click.echo(json.dumps(obj, indent=1))


def echo_messages(messages, as_json: bool, line: Callable[[object], None]) -> None:
    """A list command's output: one JSON array of `proto_dict`s, or `line(m)` for each."""
    if as_json:
        echo_json([proto_dict(m) for m in messages])
        return
    for m in messages:
        line(m)


def progress_bar(file=None, **kwargs):
    """A tqdm bar on `file` (stderr): tqdm's redraw rate on a terminal, at most one redraw
    every PIPE_REDRAW_S seconds elsewhere; kwargs go to tqdm (desc, unit, total...)."""
    from tqdm import tqdm

    file = file or sys.stderr
    tty = getattr(file, "isatty", lambda: False)()
    return tqdm(file=file, mininterval=0.1 if tty else PIPE_REDRAW_S, **kwargs)


def advance(bar, done: int, total: int | None = None) -> None:
    """Set `bar` to `done` (of `total`, where a poll reports it; None keeps the bar's), redrawn
    only as the bar's rate allows (a refresh on every poll would defeat `progress_bar`)."""
    if total is not None:
        bar.total = total
    bar.update(done - bar.n)
