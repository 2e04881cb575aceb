"""How kvctl commands reach a gateway: the --cloud/--token/--tls-ca/-n options and the client."""
from __future__ import annotations

import click

from kvedge.common.cli import CLOUD_ADDRESS, home_path
from kvedge.common.net.tls import ca_option

CLOUD_OPTIONS = [
    click.option("--cloud", "address", default=CLOUD_ADDRESS, show_default=True,
                 help="gateway address"),
    click.option("--token", default=None, help="[default: $KVEDGE_TOKEN or the local admin token]"),
    ca_option("--tls-ca", what="the gateway"),
    click.option("--namespace", "-n", default="default", show_default=True),
]


def with_cloud(fn):
    """Decorator: the command takes address, token, tls_ca and namespace."""
    for option in reversed(CLOUD_OPTIONS):
        fn = option(fn)
    return fn


def cloud_client(address: str, token: str | None, tls_ca: str | None = None):
    from kvedge.common.net.cloud_client import CloudClient
    from kvedge.common.net.rpc import read_token
    from kvedge.common.net.tls import client_tls

    return CloudClient(address, read_token(token, home_path("cloud", "admin.token")),
                       client_tls(tls_ca))
