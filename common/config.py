"""Daemon configuration: defaults, then a TOML file, then `KVEDGE_*` variables, then flags.

A daemon command (`kvctl cloud up`, `kvedge serve`) made `configurable(SECTION)` reads every
option from, each over the one before:

1. its default;
2. its table in the config file — `[cloud.up]`, `[edge.serve]` — where keys are the long
   flags without dashes (`sync-interval = 2`, `kb = ["reg", "tenant-a/faq@v2"]`; `_` may
   stand for `-`). The file is `--config PATH`, else `$KVEDGE_CONFIG`, else
   `$KVEDGE_HOME/config.toml` when it exists;
3. `KVEDGE_<SECTION>_<KEY>`, e.g. `KVEDGE_EDGE_SERVE_HTTP=0.0.0.0:8000` (a repeatable flag
   takes its values space-separated);
4. its flag.

That is click's own order (command line > envvar > `default_map` > default): the file's table
becomes the context's `default_map` and each option gets its envvar, so
`ctx.get_parameter_source` says where each value came from (`kvctl config show`). A table or
key no daemon has, or a value of the wrong type, is a ConfigError naming the file.

The daemon commands are the `kvedge.daemons` entry points, named by section: how the known
sections are listed, and how `kvctl config show` reaches `kvedge serve` without the cloud
tier importing the edge's code.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import click
from click.core import ParameterSource

from kvedge.common.errors import KvedgeError

ENTRY_POINTS = "kvedge.daemons"
SOURCES = {ParameterSource.COMMANDLINE: "flag", ParameterSource.ENVIRONMENT: "environment",
           ParameterSource.DEFAULT_MAP: "config file", ParameterSource.DEFAULT: "default"}
SECRET = re.compile(r"(token|password|secret)$")  # keys whose values `config show` masks


class ConfigError(KvedgeError):
    """A config file that cannot be read, or a table, key or value no daemon accepts."""


def daemons() -> dict[str, click.Command]:
    """Every daemon command by section (loads their CLI modules, not their services)."""
    return {ep.name: ep.load() for ep in entry_points(group=ENTRY_POINTS)}


def env_name(section: str, key: str) -> str:
    return "KVEDGE_" + re.sub(r"[.-]", "_", f"{section}.{key}").upper()


def key_of(option: click.Option) -> str:
    """The option's key in the file: its (first) long flag without dashes."""
    return next(o for o in option.opts if o.startswith("--"))[2:]


def settable(command: click.Command) -> dict[str, click.Option]:
    return {key_of(p): p for p in command.params
            if isinstance(p, click.Option) and p.name != "config"}


def configurable(section: str):
    """Decorator over a click command: add `--config` and an envvar to every option."""
    def wrap(command: click.Command) -> click.Command:
        for key, option in settable(command).items():
            own = [option.envvar] if isinstance(option.envvar, str) else list(option.envvar or ())
            option.envvar, option.show_envvar = [env_name(section, key), *own], True
        command.params.append(click.Option(
            ["--config"], type=click.Path(dir_okay=False), envvar="KVEDGE_CONFIG",
            show_envvar=True, is_eager=True, expose_value=False,
            callback=partial(_load, section),
            help=f"TOML config file; its [{section}] table sets this command's options "
                 "[default: $KVEDGE_HOME/config.toml if present]"))
        command.config_section = section
        return command
    return wrap


def _load(section: str, ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--config's callback (eager, so it runs before the options it supplies defaults for)."""
    path = Path(value) if value else default_path()
    if value is None and not path.exists():
        ctx.meta["kvedge.config"] = None
        return
    tables = read_tables(path, known=set(entry_point_names()) | {section})
    options = settable(ctx.command)
    ctx.default_map = {options[key].name: value
                       for key, value in check_table(path, section, tables.get(section, {}),
                                                     options, ctx).items()}
    ctx.meta["kvedge.config"] = path


def default_path() -> Path:
    from kvedge.common.model.models import kvedge_home

    return kvedge_home() / "config.toml"


def entry_point_names() -> list[str]:
    return [ep.name for ep in entry_points(group=ENTRY_POINTS)]


def read_tables(path: Path, known: set[str]) -> dict[str, dict]:
    """The file's tables by dotted name ({"edge.serve": {...}}); unknown ones are errors."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read the config file {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    tables: dict[str, dict] = {}

    def walk(prefix: str, table: dict) -> None:
        for key, value in table.items():
            name = f"{prefix}.{key}" if prefix else key
            if name in known and isinstance(value, dict):
                tables[name] = value
            elif isinstance(value, dict) and any(k.startswith(f"{name}.") for k in known):
                walk(name, value)
            else:
                near = difflib.get_close_matches(name, known, n=1)
                raise ConfigError(f"{path}: unknown table or key {name!r}: the tables are "
                                  f"{_listing(known)}, one per daemon command"
                                  + (f" (did you mean [{near[0]}]?)" if near else ""))

    walk("", doc)
    return tables


def check_table(path: Path, section: str, table: dict, options: dict[str, click.Option],
                ctx: click.Context) -> dict[str, object]:
    """The table's keys as this command's options, each value checked by the option's type."""
    out = {}
    for raw, value in table.items():
        key = raw.replace("_", "-")
        if key not in options:
            near = difflib.get_close_matches(key, options, n=1)
            raise ConfigError(f"{path}: [{section}] has no key {raw!r}"
                              + (f" (did you mean {near[0]!r}?)" if near else "")
                              + f"; its keys are the flags of the command: {', '.join(options)}")
        option = options[key]
        if option.multiple and not isinstance(value, list):
            value = [value]
        try:
            out[key] = option.type_cast_value(ctx, value)
        except click.BadParameter as err:
            raise ConfigError(f"{path}: [{section}] {raw} = {value!r}: {err.message}") from None
    return out


def _listing(names) -> str:
    return ", ".join(f"[{n}]" for n in sorted(names))


# ------------------------------------------------------------------ what `config show` prints


@dataclass
class Setting:
    key: str
    value: object
    source: str        # default | config file | environment | flag | missing
    env: str           # the variable that set it, or would

    def shown(self) -> object:
        if SECRET.search(self.key) and self.value:
            return "<set>"
        return list(self.value) if isinstance(self.value, tuple) else self.value


def effective(command: click.Command, args=()) -> tuple[Path | None, list[Setting]]:
    """What `command` would run with, given `args` (its flags, `--config` among them), the
    environment and the config file: (the file read, each option's value and source). The
    same parse the daemon does; a missing required option is reported, not raised."""
    try:
        ctx = command.make_context(command.name, list(args))
    except click.MissingParameter:
        ctx = command.make_context(command.name, list(args), resilient_parsing=True)
    settings = []
    for key, option in settable(command).items():
        value, source = ctx.params.get(option.name), ctx.get_parameter_source(option.name)
        missing = option.required and value in (None, ())
        env = next((v for v in option.envvar if source == ParameterSource.ENVIRONMENT
                    and v in os.environ), option.envvar[0])
        settings.append(Setting(key, value, "missing" if missing else SOURCES.get(source, "?"),
                                env))
    return ctx.meta.get("kvedge.config"), settings

