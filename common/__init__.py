"""What both tiers share: model registry, the exact transformer runtime, RoPE math, errors.

Importing it asks Intel MKL (torch's CPU BLAS) for its strict reproducible mode,
`MKL_CBWR=AUTO,STRICT`, unless the environment already names a mode: MKL reads the
variable at its first call, so it is set here, below every module that multiplies. In that
mode a row of a matrix product gets the same bits whatever the row count, so a decode step
is batch-invariant without padding rows (`kvedge.common.model.batch.ROW_MULTIPLE`), which
MKL's default mode does not give on every CPU: on an AVX-512/AMX Xeon (2026-12-01) no
padding multiple up to 32 made a 576×1536 product row-invariant at 2 threads, where the
strict mode made every shape of SmolLM2, Qwen2.5-0.5B and the tiny models invariant from
1 row. Whether it held is measured at load, not assumed (`quant.rows_invariant`).
"""
import os

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
