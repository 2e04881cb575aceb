"""TLS for both daemons and every client: credentials, `--tls auto` material, the listen check.

KV caches reveal the documents they came from, and bearer tokens travel in call metadata, so
anything that leaves the machine goes over TLS (issue 16):
- a daemon serves with `ServerTLS` (`--tls-cert/--tls-key`, or `--tls auto`: a CA and a server
  certificate made once in its data dir, then reused; `--tls-client-ca` asks clients for a
  certificate too — mutual TLS);
- a client connects with `ClientTLS` (`--tls-ca FILE` or `$KVEDGE_TLS_CA`; `system` trusts the
  system's CA store; `$KVEDGE_TLS_CERT/$KVEDGE_TLS_KEY` add a client certificate);
- a daemon refuses a non-loopback address in plaintext unless told `--insecure`
  (`check_listen`).
`kvedge.common.net.rpc` takes these configs, so every server and channel is set up in one place.
Certificates use ECDSA P-256 (`cryptography`); private keys are written 0600, atomically.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import click

from kvedge.common.errors import InsecureListen, TLSError
from kvedge.common.fsutil import write_atomic

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
CA_DAYS, CERT_DAYS, RENEW_DAYS = 3650, 397, 30
SYSTEM = "system"   # --tls-ca system: trust the system's CA store


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise TLSError(f"cannot read the {what} {path}: {err.strerror}") from None


@dataclass(frozen=True)
class ServerTLS:
    """A daemon's certificate (PEM chain) and key; `client_ca` set = clients must present a
    certificate it signed (mutual TLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def credentials(self):
        import grpc

        pair = (_read(self.key, "TLS key"), _read(self.cert, "TLS certificate"))
        ca = _read(self.client_ca, "client CA") if self.client_ca else None
        return grpc.ssl_server_credentials([pair], root_certificates=ca,
                                           require_client_auth=ca is not None)


@dataclass(frozen=True)
class ClientTLS:
    """What a client trusts (`ca`; None = the system's CA store) and, for mutual TLS, the
    certificate and key it presents."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def credentials(self):
        import grpc

        if (self.cert is None) != (self.key is None):
            raise TLSError("a client certificate needs both its certificate and its key")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "TLS CA") if self.ca else None,
            private_key=_read(self.key, "TLS key") if self.key else None,
            certificate_chain=_read(self.cert, "TLS certificate") if self.cert else None)


def client_tls(ca: str | None, cert: str | None = None, key: str | None = None,
               env: str = "KVEDGE_TLS") -> ClientTLS | None:
    """A client's TLS from its options, else `$<env>_CA/_CERT/_KEY`; None = plaintext.
    A CA of "system" trusts the system's CA store (a server with a public certificate)."""
    ca = ca or os.environ.get(f"{env}_CA")
    cert = cert or os.environ.get(f"{env}_CERT")
    key = key or os.environ.get(f"{env}_KEY")
    if not ca:
        if cert or key:
            raise TLSError("a client certificate needs TLS: also give the CA (--tls-ca)")
        return None
    return ClientTLS(None if ca == SYSTEM else Path(ca), cert and Path(cert), key and Path(key))


# ---------------------------------------------------------------------- failed handshakes

def handshake_error(details: str, address: str, tls: ClientTLS | None) -> TLSError | None:
    """The TLSError a failed connection's gRPC details point to, or None (not a TLS problem).
    gRPC reports every one of these as UNAVAILABLE with an OpenSSL string; the user gets
    which side is wrong and the flag that fixes it."""
    if "failed to connect" not in details:
        return None
    if tls is None:
        if "Socket closed" in details and speaks_tls(address):
            return TLSError(f"the service at {address} uses TLS and this client does not: pass "
                            "--tls-ca FILE or set $KVEDGE_TLS_CA: the CA that signed its "
                            "certificate (with --tls auto, tls/ca.pem in the gateway's data dir "
                            "or the edge's state dir)")
        return None
    if "WRONG_VERSION_NUMBER" in details:
        return TLSError(f"the service at {address} does not speak TLS: start it with "
                        "--tls-cert/--tls-key or --tls auto, or connect without --tls-ca")
    if "Hostname Verification" in details:
        return TLSError(f"the certificate of the service at {address} does not name "
                        f"{host_of(address)!r}: connect by a name it covers, or give the "
                        "service a certificate for this name (--tls-host with --tls auto)")
    if "CERTIFICATE_VERIFY_FAILED" in details or "certificate signature failure" in details:
        trusted = tls.ca or "the system's CA store"
        return TLSError(f"the certificate of the service at {address} is not signed by the CA "
                        f"this client trusts ({trusted}): pass --tls-ca with the CA that "
                        "signed it")
    if "Socket closed" in details or "andshake failed" in details:
        return TLSError(f"the service at {address} closed the connection during the TLS "
                        "handshake: it may require a client certificate (mutual TLS: "
                        "$KVEDGE_TLS_CERT/$KVEDGE_TLS_KEY, kvedge serve --cloud-tls-cert/"
                        "--cloud-tls-key) signed by the CA it trusts")
    return None


def speaks_tls(address: str, timeout: float = 2.0) -> bool:
    """Whether the server at `address` answers a TLS handshake (nothing is verified: this
    only tells a plaintext client why the server hung up on it)."""
    import ssl

    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)),
                                      timeout) as raw:
            with context.wrap_socket(raw):
                return True
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------- the listen check

def host_of(address: str) -> str:
    """'host:port', '[v6]:port' or ':port' → the host ('' = every interface)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def is_loopback(host: str) -> bool:
    """Only this machine can reach `host` (a name counts if every address it has is loopback)."""
    if host in WILDCARD_HOSTS:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback
                               for i in infos)


def check_listen(address: str, tls: ServerTLS | None, insecure: bool = False) -> None:
    """Refuse plaintext on an address other machines can reach, unless `insecure`."""
    if tls is not None or insecure or address.startswith("unix:") or is_loopback(host_of(address)):
        return
    raise InsecureListen(
        f"refusing to listen on {address} without TLS: tokens and KV caches would cross the "
        "network readable. Pass --tls-cert/--tls-key (or --tls auto), or --insecure if "
        "something else encrypts the traffic")


# ---------------------------------------------------------------------- certificates

def _san(hosts):
    from cryptography import x509

    names = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject, issuer, public_key, days):
    from cryptography import x509

    now = dt.datetime.now(dt.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days)))


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kvedge"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def new_ca(common_name: str = "kvedge local CA") -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, key PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (_builder(name, name, key.public_key(), CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem(key)


def issue(ca_cert: bytes, ca_key: bytes, common_name: str, hosts=(), client: bool = False,
          days: int = CERT_DAYS) -> tuple[bytes, bytes]:
    """A certificate the CA signs: for a server (`hosts` in its SANs) or, with `client`, for
    mutual TLS. Returns (certificate PEM, key PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, None)
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (_builder(_name(common_name), ca.subject, key.public_key(), days)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if hosts:
        builder = builder.add_extension(_san(hosts), critical=False)
    cert = builder.sign(signer, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _pem(key)


def _covers(cert_pem: bytes, ca_pem: bytes, hosts) -> bool:
    """The certificate is the CA's, names every host, and is not about to expire."""
    from cryptography import x509

    try:
        cert, ca = x509.load_pem_x509_certificate(cert_pem), x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except Exception:  # noqa: BLE001 - unreadable, another CA's, or no SANs: issue a new one
        return False
    named = {str(n) for n in san.get_values_for_type(x509.IPAddress)} | \
        set(san.get_values_for_type(x509.DNSName))
    fresh = cert.not_valid_after_utc - dt.datetime.now(dt.timezone.utc) > \
        dt.timedelta(days=RENEW_DAYS)
    return fresh and {str(_canonical(h)) for h in hosts} <= named


def _canonical(host: str):
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return host


def issue_client(ca_folder: Path | str, name: str, out: Path | str) -> tuple[Path, Path]:
    """A client certificate for mutual TLS, signed by the `--tls auto` CA in `ca_folder`:
    `<out>/<name>.pem` and `<out>/<name>.key` (0600)."""
    ca_folder, out = Path(ca_folder), Path(out)
    ca_cert = _read(ca_folder / "ca.pem", "TLS CA")
    pem, secret = issue(ca_cert, _read(ca_folder / "ca.key", "CA key"), name, client=True)
    cert, key = out / f"{name}.pem", out / f"{name}.key"
    write_atomic(key, secret, mode=0o600)
    write_atomic(cert, pem, mode=0o644)
    return cert, key


def server_hosts(listen_host: str, extra=()) -> list[str]:
    """The names a server certificate covers: loopback, the listen host (this machine's
    names when it listens on every interface), and `extra`."""
    hosts = list(LOOPBACK_HOSTS)
    if listen_host in WILDCARD_HOSTS:
        hosts += [socket.gethostname(), socket.getfqdn()]
    else:
        hosts.append(listen_host)
    return list(dict.fromkeys([*hosts, *extra]))


def auto_server_tls(folder: Path | str, hosts) -> ServerTLS:
    """`--tls auto`: a CA (`ca.pem`, `ca.key`) and a server certificate (`server.pem`,
    `server.key`) under `folder`. The CA is made once and kept, so clients keep trusting
    `ca.pem`; the server certificate is reissued only when it misses a host or nears expiry."""
    folder = Path(folder)
    ca_cert, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key = folder / "server.pem", folder / "server.key"
    if not (ca_cert.exists() and ca_key.exists()):
        pem, secret = new_ca()
        write_atomic(ca_key, secret, mode=0o600)
        write_atomic(ca_cert, pem, mode=0o644)
    if not (cert.exists() and key.exists() and _covers(cert.read_bytes(), ca_cert.read_bytes(),
                                                       hosts)):
        pem, secret = issue(ca_cert.read_bytes(), ca_key.read_bytes(), hosts[0], hosts)
        write_atomic(key, secret, mode=0o600)
        write_atomic(cert, pem, mode=0o644)
    return ServerTLS(cert, key)


def server_tls(data_dir: Path | str, address: str, mode: str | None, cert: str | None,
               key: str | None, client_ca: str | None = None, hosts=()) -> ServerTLS | None:
    """A daemon's TLS from its options: `--tls auto` (material in <data_dir>/tls), or
    `--tls-cert/--tls-key`, or none (plaintext: None)."""
    if mode == "auto" and (cert or key):
        raise TLSError("--tls auto makes its own certificate: drop --tls-cert/--tls-key")
    if (cert is None) != (key is None):
        raise TLSError("--tls-cert and --tls-key go together")
    if mode == "auto":
        tls = auto_server_tls(Path(data_dir) / "tls", server_hosts(host_of(address), hosts))
    elif cert:
        tls = ServerTLS(Path(cert), Path(key))
    elif client_ca:
        raise TLSError("--tls-client-ca needs TLS: add --tls-cert/--tls-key or --tls auto")
    else:
        return None
    tls = ServerTLS(tls.cert, tls.key, Path(client_ca) if client_ca else None)
    tls.credentials()  # unreadable files fail now, not after Ray and the model have started
    return tls


def describe(tls: ServerTLS | None) -> str:
    """How a daemon's start-up line says what its clients need."""
    if tls is None:
        return "plaintext"
    auto_ca = tls.cert.parent / "ca.pem"
    mutual = ", client certificates required" if tls.client_ca else ""
    return (f"TLS: clients pass --tls-ca {auto_ca}" if tls.cert.name == "server.pem"
            and auto_ca.exists() else "TLS") + mutual


# ---------------------------------------------------------------------- command-line options

def server_options(fn):
    """Decorator: a daemon's --tls/--tls-cert/--tls-key/--tls-host/--tls-client-ca/--insecure
    (passed as tls_mode, tls_cert, tls_key, tls_hosts, tls_client_ca, insecure)."""
    options = [
        click.option("--tls", "tls_mode", type=click.Choice(["auto"]), default=None,
                     help="auto: make a CA and a server certificate in the data dir once, then "
                          "reuse them (clients pass --tls-ca <data>/tls/ca.pem)"),
        click.option("--tls-cert", type=click.Path(dir_okay=False), default=None,
                     help="server certificate (PEM chain)"),
        click.option("--tls-key", type=click.Path(dir_okay=False), default=None,
                     help="server private key (PEM)"),
        click.option("--tls-host", "tls_hosts", multiple=True,
                     help="an extra DNS name or IP for the --tls auto certificate (repeatable)"),
        click.option("--tls-client-ca", type=click.Path(dir_okay=False), default=None,
                     help="mutual TLS: require client certificates this CA signed"),
        click.option("--insecure", is_flag=True,
                     help="allow plaintext on a non-loopback address"),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def ca_option(*names: str, env: str = "KVEDGE_TLS_CA", what: str = "the server"):
    """A client's --tls-ca option (`names` e.g. "--cloud-tls-ca", "cloud_tls_ca")."""
    return click.option(*names, default=None, envvar=env, show_envvar=True,
                        help=f"CA that signed {what}'s certificate: connect over TLS "
                             "('system' = the system's CA store)")
