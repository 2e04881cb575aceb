"""How kvctl commands reach a gateway: the --cloud/--token/-n options and the client."""
from __future__ import annotations

import click

from kvedge.common.cli import CLOUD_ADDRESS, home_path

CLOUD_OPTIONS = [
    click.option("--cloud", "address", default=CLOUD_ADDRESS, show_default=True,
                 help="gateway address"),
    click.option("--token", default=None, help="[default: $KVEDGE_TOKEN or the local admin token]"),
    click.option("--namespace", "-n", default="default", show_default=True),
]


def with_cloud(fn):
    """Decorator: the command takes address, token and namespace."""
    for option in reversed(CLOUD_OPTIONS):
        fn = option(fn)
    return fn


def cloud_client(address: str, token: str | None):
    from kvedge.common.cloud_client import CloudClient
    from kvedge.common.rpc import read_token

    return CloudClient(address, read_token(token, home_path("cloud", "admin.token")))
