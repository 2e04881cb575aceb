"""`kvctl`: the control tool — run the gateway, upload knowledge bases, compress them with
batch jobs, ask an edge, inspect packs and models, run the demo and the benchmark.

One module per command group; each adds its commands to `kvctl` here. Groups from layers
above the cloud tier (the benchmark) plug in through the `kvedge.kvctl` entry point, so the
cloud tier never imports them (DESIGN.md decision 7).
"""
from __future__ import annotations

from importlib.metadata import entry_points

import click

from kvedge.common.cli import KvedgeGroup


@click.group(cls=KvedgeGroup)
def kvctl():
    """kvedge control: gateway, knowledge bases, batch jobs, asking an edge, packs, models,
    the demo and the benchmark."""


def _register() -> None:
    from kvedge.cloud.cli import ask, config, demo, gateway, health, jobs, kb, models
    from kvedge.common.pack.cli import pack

    for module in (models, gateway, health, config, kb, jobs, ask, demo):
        for command in module.COMMANDS:
            kvctl.add_command(command)
    kvctl.add_command(pack)
    for plugin in entry_points(group="kvedge.kvctl"):
        kvctl.add_command(plugin.load(), plugin.name)


_register()
