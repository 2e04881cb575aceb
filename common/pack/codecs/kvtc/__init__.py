"""`kvtc`: KV cache transform coding — per-head PCA, bit allocation, quantization, zstd.

Staniszewski & Łańcucki, "KV Cache Transform Coding for Compact Storage in LLM Inference"
(arXiv:2511.01815): decorrelate KV features with an orthonormal PCA basis calibrated once per
model, spend a bit budget over the principal components by measured error (components of
tiny variance get nothing: dropped), quantize, entropy-code. Here (docs/codecs.md has the
numbers, measured on SmolLM2-135M):

- **Transform** y = (x − μ)·Bᵀ per (K or V, layer, KV head), over pre-RoPE keys
  (docs/design.md, decision 1) and values. The paper's PCA spans all heads and layers jointly;
  packs are ragged per head after eviction (decision 2) and a codec sees one head, so heads
  are coded apart. Measured at ~8×: one 192-dim basis per layer would cut the K/V error from
  0.13/0.38 to 0.10/0.31; one 64-dim basis shared by a layer's heads raises keys' to 0.20.
- **Calibration** (`fit.calibrate`, once per model, on `calibrate.CALIBRATION_TEXT`, never an
  evaluation text, its first 4 tokens left out): μ and B per head, and for every component
  the MSE and the code entropy of each rung of a quantizer ladder, step = sd·2^(−j/2).
- **Allocation** (`quantizer.allocate`, over `calibrate.allocate_components`): one rung (or
  none: dropped) per component so the code entropy fits `bits` per element. `allocate=model`
  spends one budget over the whole model, minimizing the sum of every head's relative error —
  values get more bits than keys on SmolLM2; `head` gives each head the same budget.
  Entropy-rated rungs beat the paper's fixed code widths by ~20% at equal error here.
- **Quantization** round(y/step), |code| ≤ 127; **entropy coding**: codes zig-zagged to small
  symbols (0, −1, 1, …), component by component, one zstd frame per head (the paper: DEFLATE
  on the GPU). The first `sinks` tokens of the context stay fp16 (the paper: 4 sinks).
- **Decoding**: dequantize, one (n, k)·(k, D) matmul, add μ — dense pieces.

**Where the transform lives.** A calibrated `Transform` is a safetensors file named by the
blake3 of its bytes, `<KVEDGE_HOME>/transforms/<digest>.kvtc`; the cloud worker that first
encodes with kvtc for a model fits it there (`codec_for_model`, `Kvtc.for_model`), and every
tensor it encodes records the digest. Two ways to ship it:
- `embed=true` (the default): each head carries its own μ and the rows of B its kept
  components use (fp16), so the pack decodes anywhere through the existing pack sync. As
  those bytes travel anyway, μ and B are fitted on the head's own rows — measured, that
  beats the calibrated basis at equal bytes (keys 0.11 → 0.08 relative error at 2 bits on
  a 3K-token context) — while the calibrated transform still decides how many bits each head
  gets. Cost: ~head_dim·(kept + 1)·2 bytes per head per pack (bench/codec_bench.py reports
  it per token; it shrinks as 1/context length).
- `embed=false`: the paper's scheme, nothing per pack: the decoder reads μ and B from the
  transform file in its own transforms folder — absent is `TransformMissing`, bytes that do
  not hash to the name `TransformMismatch`. The edge's sync ships it: after a KB's packs it
  fetches each transform they name (`referenced_transforms`) that the edge lacks from the
  gateway (`FetchTransform`, served from the gateway's own transforms folder — a Ray worker
  on another machine sends each transform with the first pack that names it, and the gateway
  installs it before storing the pack: `cloud.workers.install_transforms`), checks its
  blake3 and installs it (`TransformStore.add`) before the KB's manifest, so the engine
  never sees a KB it cannot decode.
Without a transform (`transform=''`: `get_codec("kvtc")` outside a worker) every head gets
`bits` and is fitted on its own rows, embedded.

Modules: `quantizer` (the ladder of rungs, their error and rate, allocation), `transform` (the
calibrated `Transform` and its content-addressed file), `fit` (fitting a head, a model),
`store` (the transforms folder, a model's transform), `codec` (the `Kvtc` codec, binding it
to a model, the transforms a pack references). The names below are this package's interface.
"""
from kvedge.common.pack.codecs.kvtc.codec import Kvtc, referenced_transforms
from kvedge.common.pack.codecs.kvtc.fit import SINKS, calibrate, fit_head, fit_transform
from kvedge.common.pack.codecs.kvtc.quantizer import (MAX_CODE, RUNGS, allocate, ladder,
                                                      quantize, rung_steps, steps_of)
from kvedge.common.pack.codecs.kvtc.store import TransformStore, default_store, model_transform
from kvedge.common.pack.codecs.kvtc.transform import KINDS, Transform

__all__ = ["KINDS", "MAX_CODE", "RUNGS", "SINKS", "Kvtc", "Transform", "TransformStore",
           "allocate", "calibrate", "default_store", "fit_head", "fit_transform", "ladder",
           "model_transform", "quantize", "referenced_transforms", "rung_steps", "steps_of"]
