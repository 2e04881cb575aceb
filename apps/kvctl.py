"""`kvctl`: the control tool — run the gateway, upload knowledge bases, compress them with
batch jobs, ask an edge, inspect packs and models, run the demo and the benchmark.

`kvctl` drives both tiers, so it lives above them in `kvedge.apps`: the cloud tier's command
groups (`kvedge.cloud.cli`), `kvctl ask` and the demos (here), `kvctl pack` (common). The
benchmark, the layer above this one, plugs in through the `kvedge.kvctl` entry point, so no
layer imports one above it (docs/design.md, decision 7).
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
    from kvedge.apps import ask, demo_cli
    from kvedge.cloud.cli import config, gateway, health, jobs, kb, models
    from kvedge.common.pack.cli import pack

    for module in (models, gateway, health, config, kb, jobs, ask, demo_cli):
        for command in module.COMMANDS:
            kvctl.add_command(command)
    kvctl.add_command(pack)
    for plugin in entry_points(group="kvedge.kvctl"):
        kvctl.add_command(plugin.load(), plugin.name)


_register()


if __name__ == "__main__":  # `python -m kvedge.apps.kvctl`, as the demo starts its gateway
    kvctl()
