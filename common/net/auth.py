"""Bearer tokens scoped to namespaces: the access-control boundary between tenants.

KV caches reveal the documents they came from, so every remote call authenticates and a token
reads only its namespaces (docs/design.md, decision 5). The token store is a JSON file holding only
sha256 digests of tokens, never the tokens themselves. Torch-free.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from kvedge.common.errors import InvalidRequest, KvedgeError
from kvedge.common.fsutil import locked, write_json_atomic, write_text_atomic

ALL = "*"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class InvalidName(InvalidRequest):
    """A namespace or knowledge-base name that could escape a folder or confuse a catalog."""


class Unauthenticated(KvedgeError):
    """No token, or a token this service does not know."""

    status = "UNAUTHENTICATED"


class PermissionDenied(KvedgeError):
    """A valid token used on a namespace it does not cover."""

    status = "PERMISSION_DENIED"


def check_name(kind: str, name: str) -> str:
    """Names become folder and catalog keys: letters, digits, '_', '-', '.'; no separators."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", ".."):
        raise InvalidName(f"invalid {kind} name {name!r}: use 1-64 letters, digits, '_', '-' or "
                          "'.', starting with a letter or digit (no '/' or '\\')")
    return name


VARIANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=:,-]{0,127}")


def check_variant(variant: str) -> str:
    """A KB variant ("" = the base; a batch job names its variant "method-budget-codec" with the
    codec spec as written, e.g. "contrastkv-0.2-int4+zstd", "kvzip-0.2-kvtc:bits=3,embed=false"):
    becomes part of a file name on the edge, so no separators."""
    if variant and (not isinstance(variant, str) or not VARIANT_RE.fullmatch(variant)
                    or ".." in variant):
        raise InvalidName(f"invalid variant name {variant!r}: use up to 128 letters, digits, "
                          "'_', '-', '.', '+', '=', ':' or ',', starting with a letter or digit")
    return variant


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    name: str
    namespaces: tuple[str, ...]

    def may_read(self, namespace: str) -> bool:
        return ALL in self.namespaces or namespace in self.namespaces

    def require(self, namespace: str) -> None:
        if not self.may_read(namespace):
            raise PermissionDenied(f"token {self.name!r} is not valid for namespace {namespace!r}")


class TokenStore:
    """tokens.json: {sha256(token): {"name": ..., "namespaces": [...]}}."""

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def _load(self) -> dict:
        if not self.path.exists():
            return {}
        return json.loads(self.path.read_text())

    def issue(self, name: str, namespaces: list[str]) -> str:
        """Create a token for `namespaces` ("*" = all); returns the token (shown once)."""
        for ns in namespaces:
            if ns != ALL:
                check_name("namespace", ns)
        token = "kve_" + secrets.token_urlsafe(32)
        with locked(self.path):  # concurrent issuers: each adds to what the last one wrote
            entries = self._load()
            entries[_digest(token)] = {"name": name, "namespaces": sorted(set(namespaces))}
            write_json_atomic(self.path, entries, mode=0o600, indent=1)
        return token

    def check(self, token: str | None) -> Principal:
        if not token:
            raise Unauthenticated("no token: pass --token, set KVEDGE_TOKEN, or use the token "
                                  "file the service wrote at start-up")
        digest = _digest(token)
        for known, entry in self._load().items():
            if hmac.compare_digest(known, digest):
                return Principal(entry["name"], tuple(entry["namespaces"]))
        raise Unauthenticated("unknown token")


def bearer(metadata) -> str | None:
    """The token from gRPC invocation metadata ("authorization: Bearer <token>")."""
    for key, value in metadata or ():
        if key == "authorization" and value.startswith("Bearer "):
            return value[len("Bearer "):]
    return None


def write_secret(path: Path, token: str) -> None:
    """A token file readable by its owner only, replaced whole (never half a token)."""
    write_text_atomic(path, token + "\n", mode=0o600)
