"""`kvctl config show`: what each daemon would run with, and where each value came from."""
from __future__ import annotations

import json

import click

from kvedge.common.cli import echo_json


@click.group("config")
def config_group():
    """Daemon configuration: TOML file, KVEDGE_* environment, flags (README: Configuration)."""


@config_group.command("show", context_settings={"ignore_unknown_options": True})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="the file to read [default: $KVEDGE_CONFIG, else $KVEDGE_HOME/config.toml]")
@click.option("--json", "as_json", is_flag=True)
@click.argument("section", required=False)
@click.argument("flags", nargs=-1, type=click.UNPROCESSED)
def show_cmd(config_path, as_json, section, flags):
    """The effective configuration of each daemon command ([cloud.up] = `kvctl cloud up`,
    [edge.serve] = `kvedge serve`), or of SECTION with its FLAGS as the daemon would be given
    them; each value's source is default, config file, environment or flag."""
    from kvedge.common.config import daemons, default_path, effective

    commands = daemons()
    if section is not None and section not in commands:
        raise click.BadParameter(f"{section!r}: the daemon sections are "
                                 f"{', '.join(sorted(commands))}", param_hint="SECTION")
    if flags and section is None:
        raise click.UsageError("flags are given for one SECTION: kvctl config show edge.serve "
                               "--top-k 5")
    chosen = [section] if section else sorted(commands)
    args = (["--config", config_path] if config_path else []) + list(flags)
    shown = {name: effective(commands[name], args) for name in chosen}
    if as_json:
        echo_json({name: {"config_file": str(path) if path else None,
                          "settings": {s.key: {"value": s.shown(), "source": s.source,
                                               "env": s.env} for s in settings}}
                   for name, (path, settings) in shown.items()})
        return
    for name, (path, settings) in shown.items():
        read = f"from {path}" if path else f"no config file ({default_path()} absent)"
        click.echo(f"[{name}]  # {read}")
        for s in settings:
            click.echo(_line(s))
        click.echo()


def _line(s) -> str:
    """A TOML line that could be pasted into the file, its source as a comment."""
    value = s.shown()
    where = {"environment": f"environment ({s.env})",
             "missing": "required, not set"}.get(s.source, s.source)
    text = f"# {s.key} =" if value in (None, []) else f"{s.key} = {json.dumps(value)}"
    return f"{text:48s} # {where}"


COMMANDS = [config_group]
