"""Named errors of the pack format. Reading a pack fails with one of these and nothing else.

`ModelMismatch` (a pack for another model) is shared with the runtime and lives in
`kvedge.common.errors`; it is re-exported here so callers can catch every pack failure from
one place.
"""
from __future__ import annotations

from kvedge.common.errors import InvalidOption, InvalidRequest, KvedgeError, ModelMismatch

__all__ = ["PackError", "PackCorrupt", "PackVersionError", "UnknownCodec", "InvalidCodecOption",
           "ModelMismatch", "TransformMissing", "TransformMismatch", "PackUnavailable"]


class PackError(KvedgeError):
    """Base class of every pack failure (except ModelMismatch, which is the runtime's)."""

    status = "DATA_LOSS"


class PackCorrupt(PackError):
    """The pack's bytes are not what was written: truncated, bit-flipped, or inconsistent.

    `tensor` names the payload tensor that failed (None when the header or manifest did).
    """

    tensor: str | None = None

    def __init__(self, what: str, tensor: str | None = None):
        self.tensor = tensor
        where = f"tensor {tensor!r}: " if tensor else ""
        super().__init__(f"corrupt pack: {where}{what}. The file was damaged in transfer or on "
                         "disk; fetch the pack again (transfers resume from their offset)")


class PackVersionError(PackError):
    """The pack was written by a format version this reader does not know."""

    found: int | None = None

    def __init__(self, found: int, supported: tuple[int, ...]):
        self.found = found
        super().__init__(f"pack format version {found} is not supported (this kvedge reads "
                         f"{list(supported)}); upgrade kvedge or re-encode the pack")


class UnknownCodec(PackError, InvalidRequest):
    """A codec name is not registered (a typo when writing, or a newer pack when reading).

    Asked for by a client it is that client's error (INVALID_ARGUMENT), not lost data."""

    status = "INVALID_ARGUMENT"


class InvalidCodecOption(UnknownCodec, InvalidOption):
    """A codec option that does not exist or is out of range: like an unknown name, the spec
    describes no codec this kvedge can build (caught as either)."""


class TransformMissing(PackError):
    """A `kvtc` pack references a calibrated transform (by its blake3) that this machine does
    not hold. Like a pack for another model it is a setup problem, not lost data."""

    status = "FAILED_PRECONDITION"
    digest: str = ""

    def __init__(self, digest: str, where: str):
        self.digest = digest
        super().__init__(f"kvtc transform {digest[:16]}… is not in {where}: an edge's sync "
                         "fetches it from the gateway with the KB's packs (if a sync failed, "
                         "its log says why); if the gateway lacks it too, re-encode the KB with "
                         "kvtc's embed=true (the transform then travels inside each pack)")


class TransformMismatch(PackError):
    """A `kvtc` transform file whose bytes do not hash to its name (damaged or replaced), or
    that does not fit the tensor it should decode."""

    digest: str = ""

    def __init__(self, digest: str, what: str):
        self.digest = digest
        super().__init__(f"kvtc transform {digest[:16]}…: {what}. A damaged file on an edge: "
                         "delete it, its next sync fetches it again; the gateway's own copy "
                         "damaged: re-encode the KB with kvtc's embed=true")


class PackUnavailable(PackError):
    """Packs an answer needs are not on this edge and could not be fetched from the cloud
    (unreachable, or refusing). Packs that are cached still answer; the message names the
    segments and packs that were missing."""

    status = "UNAVAILABLE"
