"""Named errors of the pack format. Reading a pack fails with one of these and nothing else.

`ModelMismatch` (a pack for another model) is shared with the runtime and lives in
`kvedge.common.errors`; it is re-exported here so callers can catch every pack failure from
one place.
"""
from __future__ import annotations

from kvedge.common.errors import KvedgeError, ModelMismatch

__all__ = ["PackError", "PackCorrupt", "PackVersionError", "UnknownCodec", "ModelMismatch"]


class PackError(KvedgeError):
    """Base class of every pack failure (except ModelMismatch, which is the runtime's)."""


class PackCorrupt(PackError):
    """The pack's bytes are not what was written: truncated, bit-flipped, or inconsistent.

    `tensor` names the payload tensor that failed (None when the header or manifest did).
    """

    def __init__(self, what: str, tensor: str | None = None):
        self.tensor = tensor
        where = f"tensor {tensor!r}: " if tensor else ""
        super().__init__(f"corrupt pack: {where}{what}. The file was damaged in transfer or on "
                         "disk; fetch the pack again (transfers resume from their offset)")


class PackVersionError(PackError):
    """The pack was written by a format version this reader does not know."""

    def __init__(self, found: int, supported: tuple[int, ...]):
        self.found = found
        super().__init__(f"pack format version {found} is not supported (this kvedge reads "
                         f"{list(supported)}); upgrade kvedge or re-encode the pack")


class UnknownCodec(PackError):
    """A codec name is not registered (a typo when writing, or a newer pack when reading)."""
