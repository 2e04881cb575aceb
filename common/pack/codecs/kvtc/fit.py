"""Fitting kvtc: one head's mean, PCA basis and rung tables from its rows, and a model's
whole transform from a prefill of the calibration text.

Staniszewski & Łańcucki, "KV Cache Transform Coding for Compact Storage in LLM Inference"
(arXiv:2511.01815): the PCA basis is calibrated once per model, on `CALIBRATION_TEXT` (never
an evaluation text), its first `SINKS` tokens left out — the codec keeps those in fp16.
"""
from __future__ import annotations

import torch

from kvedge.common.pack.calibrate import CALIBRATION_TEXT
from kvedge.common.pack.codecs.kvtc.quantizer import ladder
from kvedge.common.pack.codecs.kvtc.transform import Transform

SINKS = 4  # calibration leaves the context's first tokens out: they are kept in fp16


def fit_head(x: torch.Tensor, table_rows: int | None = None):
    """mean (D,) fp16, basis (D, D) fp16 (rows: components by falling variance), and the
    rung tables error, rate (D, 1 + len(RUNGS)) — MSE and code entropy (bits) per option —
    and sd (D,) of the coefficients, from rows x (N, D); the tables from at most
    `table_rows` evenly spaced rows."""
    x = x.float()
    n, d = x.shape
    mean = (x.mean(0) if n else x.new_zeros(d)).half()
    centred = x - mean.float()
    _, vectors = torch.linalg.eigh(centred.T @ centred)  # ascending variance
    basis = vectors.flip(-1).T.contiguous().half()
    y = centred @ basis.float().T
    sd = y.square().mean(0).sqrt() if n else x.new_zeros(d)
    if table_rows and n > table_rows:
        y = y[torch.linspace(0, n - 1, table_rows).long()]
    error, rate = ladder(y, sd)
    return mean, basis, error, rate, sd


def fit_transform(keys: list[torch.Tensor], values: list[torch.Tensor], **meta) -> Transform:
    """Fit every head of a model: keys[l], values[l] (H, N, D) pre-RoPE, sinks left out."""
    fits = [fit_head(x) for kv in (keys, values) for layer in kv for x in layer]
    mean, basis, error, rate, sd = (torch.stack(t) for t in zip(*fits))
    return Transform(mean, basis, sd, error, rate, len(keys), keys[0].shape[0], meta)


def calibrate(rt, text: str | None = None) -> Transform:
    """Prefill the calibration text through a Runtime and fit the model's transform."""
    ids = rt.loaded.tokenizer(text or CALIBRATION_TEXT)["input_ids"]
    ids = ids[: rt.config.max_position_embeddings]
    res = rt.prefill(torch.tensor(ids), logits="none")
    return fit_transform([k[:, SINKS:] for k in res.keys], [v[:, SINKS:] for v in res.values],
                         model=rt.loaded.fingerprint, tokens=len(ids) - SINKS)
