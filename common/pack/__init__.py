"""The KV pack: one context's KV cache as one verified, content-addressed file.

Modules: `manifest` (what a pack holds; torch-free), `container` (the one-file layout,
checksums; torch-free), `context` (KVContext, the in-memory form), `codecs` (one module per
codec family, one registry; group quantization and bit packing are `kvedge.kernels.quant`,
the layout the fused kernel reads), `format` (write/read; files are written atomically by
`kvedge.common.fsutil`), `realign` (pack → rotated cache tensors through the fused kernel),
`cli` (`kvctl pack`).

Names are re-exported lazily so that importing a torch-free module of this package does not
import torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "PackError": "errors", "PackCorrupt": "errors", "PackVersionError": "errors",
    "UnknownCodec": "errors", "InvalidCodecOption": "errors", "ModelMismatch": "errors",
    "Manifest": "manifest", "FORMAT_VERSION": "manifest",
    "pack_id": "container", "read_manifest": "container",
    "KVContext": "context", "block_summaries": "context",
    "get_codec": "codecs", "codec_names": "codecs", "DEFAULT_CODEC": "codecs",
    "write_pack": "format", "encode_pack": "format", "open_pack": "format",
    "read_pack": "format", "Pack": "format",
    "realign_pack": "realign", "RealignedKV": "realign",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
