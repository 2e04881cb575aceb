"""TLS material for deploy/compose.yaml: a CA and a server certificate per service.

    python deploy/make_secrets.py deploy/secrets [--service gateway --service edge] [--host NAME]

writes ca.pem/ca.key (kept if present, so clients keep trusting it) and <service>.pem/.key for
each service, naming the service (its compose DNS name), localhost, 127.0.0.1 and ::1 (the
container's own health check) and every --host (how clients outside reach it). Keys are 0600
and owned by whoever runs this: build the images with KVEDGE_UID=$(id -u) so the containers'
user can read them. Needs kvedge installed (it uses kvedge.common.net.tls).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from kvedge.common.fsutil import write_atomic
from kvedge.common.net.tls import LOOPBACK_HOSTS, issue, new_ca


def make(out: Path, services: list[str], hosts: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ca_pem, ca_key = out / "ca.pem", out / "ca.key"
    if not (ca_pem.exists() and ca_key.exists()):
        cert, key = new_ca("kvedge deploy CA")
        write_atomic(ca_key, key, mode=0o600)
        write_atomic(ca_pem, cert, mode=0o644)
    for service in services:
        names = list(dict.fromkeys([service, *LOOPBACK_HOSTS, *hosts]))
        cert, key = issue(ca_pem.read_bytes(), ca_key.read_bytes(), service, names)
        write_atomic(out / f"{service}.key", key, mode=0o600)
        write_atomic(out / f"{service}.pem", cert, mode=0o644)
        print(f"{out / service}.pem: {', '.join(names)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the files (e.g. deploy/secrets)")
    parser.add_argument("--service", action="append", help="[default: gateway, edge]")
    parser.add_argument("--host", action="append", default=[],
                        help="an extra DNS name or IP every certificate names (repeatable)")
    args = parser.parse_args()
    make(args.out, args.service or ["gateway", "edge"], args.host)


if __name__ == "__main__":
    main()
