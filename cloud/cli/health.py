"""`kvctl health`: does a gateway or edge daemon answer SERVING on gRPC health checking
(grpc.health.v1)? For container HEALTHCHECKs and Kubernetes probes: exit 0 when it does within
the timeout, 1 when it does not (what both read as unhealthy)."""
from __future__ import annotations

import sys

import click

from kvedge.common.cli import CLOUD_ADDRESS
from kvedge.common.net.tls import ca_option


@click.command("health")
@click.option("--address", default=CLOUD_ADDRESS, show_default=True, show_envvar=True,
              envvar="KVEDGE_HEALTH_ADDRESS",
              help="the daemon's host:port (an edge's default is 127.0.0.1:50052)")
@click.option("--timeout", default=3.0, show_default=True, help="seconds to wait for SERVING")
@ca_option("--tls-ca", what="the daemon")
def health_cmd(address, timeout, tls_ca):
    """Check that the daemon at ADDRESS is serving (exit 0) or not (exit 1)."""
    from kvedge.common.errors import KvedgeError
    from kvedge.common.net.rpc import wait_healthy
    from kvedge.common.net.tls import client_tls

    try:
        wait_healthy(address, timeout, client_tls(tls_ca))
    except KvedgeError as err:
        click.echo(f"unhealthy: {type(err).__name__}: {err}", err=True)
        sys.exit(1)
    click.echo(f"{address}: SERVING")


COMMANDS = [health_cmd]
