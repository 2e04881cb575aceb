"""Weight-only int8 for the decode step: each 2-D weight read as one byte, not four.

A decode step on a CPU is bound by reading the weights (docs/serving.md: ~14 GB/s over fp32
weights, 65 % of a SmolLM2 step in `F.linear`). `Int8Weight` keeps a weight as int8 with one
scale per output row — symmetric round-to-nearest, w ≈ q · s with s = max|w_row| / 127 (the
per-channel scheme of LLM.int8()'s vector-wise quantization, Dettmers et al., 2022, Sec. 3,
without its outlier decomposition) — and multiplies with torch's CPU kernel for it
(`aten._weight_int8pack_mm`, the one gpt-fast's int8 mode calls), which reads the bytes and
dequantizes in registers.

Decisions, and why:
- **Decode only.** Prefill and recompute keep the fp32 weights: they are compute-bound (many
  rows), the cloud's packs are made with fp32 weights, and the runtime's full recompute stays
  bit-equal to transformers. Only the steps after the first token read int8, so a prompt's
  K/V and first token are the exact runtime's; the answer's later tokens are judged by how
  often they agree with fp32 decode (`bench/decode_speed.py --agreement`), not bit for bit.
- **Activations in bf16.** The kernel takes bf16, fp16 or fp32 activations, but on this
  torch only bf16 runs its fast path (fp32 and fp16 were 6–15× slower than fp32 `F.linear`
  in a side-by-side check); its output is bf16 too. The result is cast back to the
  runtime's dtype before the residual add, so the residual stream, norms, RoPE and
  attention stay fp32 and only each matmul's inputs and outputs are rounded to bf16.
- **Per-row scales, no groups.** The kernel has one scale per output row; an int8 row with
  127 levels keeps ~0.4 % of its largest weight as its step, below bf16's own rounding of
  the activations. Group-wise int4 (`_weight_int4pack_mm_for_cpu`) halves the bytes again
  but measured no faster per row on two cores here, and loses more.
- **Row-invariant.** The kernel gives each row the same bits whatever the row count (checked
  1–24 rows in tests, and at load by `rows_invariant`, 1–64 rows per weight shape), so steps
  with int8 weights are batch-invariant without padding rows. The torch fallback below is
  fp32 BLAS, which is not: a model whose widths need it fails the load-time check and its
  steps are padded as fp32's.
- **Fallback.** The kernel seems to read K (the input width) a vector at a time with no
  tail: it crashed the process at K = 4 and 20 on an AVX2 machine, and at every K ≡ 8
  (mod 16) — 8, 24, 40, …, 136 — on an AVX-512 one (2026-11-26), where K = 16, 32, 48, …
  and 1–255 output rows ran. So only weights with K a multiple of `KERNEL_K` (32: the
  widest vector's 16 fp32 lanes, twice, for CPUs not yet seen; every real model's widths
  are multiples of 64) use it; any other keeps the dequantized torch reference, the same
  numbers up to the summation order. int8 for a model on another device than the CPU is
  refused: the reference would dequantize every weight on every step there (fp16,
  `Fp16Weight`, runs anywhere).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch
import torch.nn.functional as F

from kvedge.common.errors import InvalidOption
from kvedge.common.model.models import DECODE_WEIGHTS as FORMATS


# The input widths the CPU kernel is trusted with: multiples of this (see Fallback above).
KERNEL_K = 32


class Int8Weight:
    """A 2-D weight (out, in) as int8 `q` with one bf16 scale per output row; called as
    `F.linear(x, w, bias)` is, for x (..., in) of any float dtype → (..., out) in x's dtype."""

    def __init__(self, weight: torch.Tensor):
        w = weight.detach().to(torch.float32)
        scale = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        self.scale = scale.to(torch.bfloat16)  # the kernel's dtype; q is rounded against it
        self.q = torch.round(w / self.scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
        self.shape = weight.shape
        self.fast = self.q.device.type == "cpu" and self.shape[1] % KERNEL_K == 0

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 2 * self.scale.numel()

    @property
    def device(self) -> torch.device:
        return self.q.device

    def dequantized(self) -> torch.Tensor:
        """The weight this stands for, fp32 (out, in): q · s."""
        return self.q.float() * self.scale.float()[:, None]

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        flat = x.reshape(-1, self.shape[1]).to(torch.bfloat16)
        if self.fast:
            y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        else:
            y = reference(flat, self)
        y = y.to(x.dtype).view(*x.shape[:-1], self.shape[0])
        return y if bias is None else y + bias


class Fp16Weight:
    """A 2-D weight kept in fp16, called as `F.linear(x, w, bias)` is: x cast to fp16, the
    product cast back to x's dtype before the bias (as `Int8Weight`'s is).

    Decision (2026-11-26): on an AVX-512 CPU with avx512_bf16 (this project's machine that
    day) a one-row fp16 pass over Qwen2.5-0.5B's weights took 27.7 ms against fp32's 140 and
    int8's 21.5, and a served step 31 ms against int8's 25 and fp32's 118 (unpadded), with
    the first step's logits 0.010 from fp32's where int8's are 0.25 away (a probe over a
    random 1,300-token context: 12 of 12 greedy tokens equal, int8 4 of 12). Where the CPU
    has no fast fp16 path (AVX2) it may be slower than fp32: measure before choosing it
    (`python -m kvedge.bench.decode_speed` prints the fp16 weight pass). Its steps are padded
    to the least row multiple the load-time probe finds batch-invariant on the CPU at hand
    (`invariant_multiple`, `batch.row_multiple`): on that one 1, no padding (1–64 rows, every
    weight shape of Qwen2.5-0.5B and SmolLM2, the same bits from 1 row); on an AVX-512/AMX Xeon
    (2026-12-01) 2, its one-row product (a matrix-vector path) rounding otherwise than
    every count from 2 on."""

    dtype = torch.float16  # what the weight is kept in, and the activations are cast to

    def __init__(self, weight: torch.Tensor):
        self.w = weight.detach().to(self.dtype)
        self.shape = weight.shape

    @property
    def nbytes(self) -> int:
        return 2 * self.w.numel()

    @property
    def device(self) -> torch.device:
        return self.w.device

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = F.linear(x.to(self.dtype), self.w).to(x.dtype)
        return y if bias is None else y + bias


class Bf16Weight(Fp16Weight):
    """A 2-D weight kept in bf16, called as `F.linear(x, w, bias)` is: x cast to bf16 (the
    CPU's bf16 GEMM takes both operands in bf16 and sums in fp32), the product cast back to
    x's dtype before the bias — so, as with `Int8Weight`, the residual stream, norms, RoPE and
    attention stay in the runtime's dtype and only each matmul's inputs and output are rounded.

    Decision (2026-11-28): bf16 for products of many rows. On this project's AMD EPYC
    (avx512_bf16; oneDNN's bf16 GEMM) one pass over SmolLM2's layer weights took, at 1 / 16 /
    145 / 580 rows, 22 / 33 / 109 / 344 ms in bf16 against fp32's 42 / 86 / 326 / 966 and
    fp16's 12 / 133 / 873 / 3281 (`python -m kvedge.bench.decode_speed` prints the row table):
    fp16 is the fastest single row and the slowest batch, bf16 the fastest from 4 rows on.
    So bf16 is what a batched decode step (`--decode-weights bf16`) and an answer's start —
    the reuse recompute, tens to hundreds of rows (`Runtime.use_prompt_weights`) — read where
    they are chosen. Not row-invariant: rows of a product of input width 1536 or 4864 differ
    alone and in a batch, while every count padded to 4 rows gave the 4-row blocks' bits
    (1–80 rows, SmolLM2's and Qwen2.5-0.5B's widths), so bf16 steps are padded to the least
    multiple the load-time probe finds to hold (`invariant_multiple`, `batch.row_multiple`).
    On an AVX-512/AMX Xeon (2026-12-01) none did, up to 32 rows (1–64 probed, every Qwen
    shape): there bf16 steps pad to ROW_MULTIPLE without being batch-invariant, and
    `kvedge serve` warns."""

    dtype = torch.bfloat16


_WEIGHTS = {"int8": Int8Weight, "fp16": Fp16Weight, "bf16": Bf16Weight}

# The row counts `rows_invariant` checks a product at (every count up to the scheduler's
# default batch of 16, then the counts where a kernel's row blocking would change its path),
# and the output width it cuts weights to.
PROBE_ROWS = (*range(1, 18), 24, 31, 32, 33, 48, 63, 64)
PROBE_OUT = 2048
# The row counts a decode step may pad to, tried smallest first (`invariant_multiple`); the
# last is also what a step pads to where none holds (`batch.ROW_MULTIPLE`).
ROW_MULTIPLES = (1, 2, 4)


def rows_invariant(weights: list, rows: tuple[int, ...] = PROBE_ROWS,
                   out: int = PROBE_OUT, multiple: int = 1) -> bool:
    """Whether each weight's product gives a row the same bits at each row count of `rows`
    that is a multiple of `multiple`, wherever the row sits, as at the head of a product of
    `multiple` rows (1: alone) — on this machine. So a step padded to that multiple gives a
    request the same bits alone or in any batch.

    Kernels pick their path by shape, not by values, so the check runs once per distinct
    shape of `weights` (fp32 tensors, multiplied as a step does by `F.linear`, or Int8Weight
    / Fp16Weight / Bf16Weight objects), on seeded random weights of the same class and
    shape, the output width cut to `out` (an LM head's 150K rows at 64 rows took 0.6 s a
    product; the reduction over the input width, where a row's rounding is decided, is kept
    whole). Each row's reference is its product with the `multiple` - 1 rows after it (the
    last wrap round to the first), so a row checked at position i of a wider product was
    computed at position 0 of its own: a kernel whose rounding moved with a row's place
    in its panel fails. Decision: a probe at load rather than a list of CPUs — fp16's CPU
    matmul was row-invariant on an AVX-512 machine (2026-11-27, 1–64 rows at full shapes)
    and, on an AVX-512/AMX Xeon (2026-12-01), not at one row (its matrix-vector path) but
    at every count from 2 on; fp32 BLAS was not on any machine this project had in MKL's
    default mode, and is in its strict reproducible mode (`kvedge.common`, which asks for
    it); nothing documents either for a given CPU. At `multiple` 1 it takes 0.2 s at load
    on Qwen2.5-0.5B, 0.1 s on SmolLM2 (quiet, 2 cores)."""
    shapes = {(type(w), tuple(w.shape)) for w in weights}
    device = {w.device for w in weights}
    gen = torch.Generator().manual_seed(0)
    n_rows = max(rows)
    for cls, (n, k) in sorted(shapes, key=lambda c: (c[0].__name__, c[1])):
        weight = torch.randn(min(n, out), k, generator=gen).to(*device)
        w = functools.partial(F.linear, weight=weight) if issubclass(cls, torch.Tensor) \
            else cls(weight)
        x = torch.randn(n_rows, k, generator=gen).to(*device)
        heads = torch.cat([w(x[(i + torch.arange(multiple)) % n_rows])[:1]
                           for i in range(n_rows)])
        if not all(torch.equal(w(x[:m]), heads[:m]) for m in rows if m % multiple == 0):
            return False
    return True


def invariant_multiple(weights: list, multiples: tuple[int, ...] = ROW_MULTIPLES,
                       rows: tuple[int, ...] = PROBE_ROWS, out: int = PROBE_OUT) -> int | None:
    """The smallest of `multiples` that steps over `weights` can pad their rows to and stay
    batch-invariant on this machine (`rows_invariant` at that multiple), or None where none
    does. 1: no padding; 2 for fp16 on a CPU whose one-row product takes another path than
    every wider one (an AVX-512/AMX Xeon, 2026-12-01)."""
    return next((m for m in multiples if rows_invariant(weights, rows, out, m)), None)


def padded_rows(multiple: int | None) -> int:
    """The rows a batch-invariant step pads to, given `invariant_multiple`'s answer: that
    multiple, or the most padding probed (ROW_MULTIPLES[-1]) where none held."""
    return multiple or ROW_MULTIPLES[-1]


# `auto` weights are chosen by timed passes over a sample of the model's weights: the first
# layers holding TIMED_BYTES of fp32 weights (beyond any cache, as a whole model's pass is),
# each pass timed REPS times after a warm-up. Decode weights: a one-row pass (a lone answer's
# step); prompt weights: a pass at AUTO_PROMPT_ROWS rows (an answer's start on a KB: the
# reuse recompute of a few segments and the question, ~120–190 rows on the demo KB). A copy
# is taken only when it costs at most 1 / AUTO_SPEEDUP of fp32's.
AUTO_SPEEDUP = 1.5
GIVE_UP = 4  # a copy's pass this many times slower than it needs to be ends its timing
AUTO_PROMPT_ROWS = 128
TIMED_BYTES = 256 << 20
REPS = 3


def timed_layers(layers: list) -> int:
    """How many leading layers (runtime.LayerWeights, fp32) hold TIMED_BYTES of 2-D weights
    (all of them if the model holds fewer)."""
    total = 0
    for n, w in enumerate(layers, 1):
        total += sum(4 * getattr(w, m).numel() for m in _MATRICES)
        if total >= TIMED_BYTES:
            return n
    return len(layers)


def pass_s(weights: list, rows: int = 1, reps: int = REPS,
           beyond: float | None = None) -> float:
    """Seconds of `rows` rows through every weight of `weights` (plain tensors or the
    copies' products), the fastest of `reps` passes after a warm-up one. `beyond`: once a
    pass (the warm-up too) takes longer than that many seconds, that pass's time is
    returned without the others — the caller's choice is already made."""
    import time

    gen = torch.Generator().manual_seed(0)
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], generator=gen).to(w.device)
              for w in weights}

    def once() -> float:
        start = time.perf_counter()
        for w in weights:
            linear(inputs[w.shape[1]], w)
        return time.perf_counter() - start

    best = float("inf")
    for n in range(reps + 1):
        took = once()
        if beyond is not None and took > beyond:
            return took
        if n:  # the first is the warm-up
            best = min(best, took)
    return best


@contextlib.contextmanager
def one_thread():
    """torch's intra-op threads set to one while the block runs (a timed probe: see
    `Runtime.auto_prompt_weights`), then put back. Process-wide: only for a runtime no
    request is using."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """The torch reference of the kernel: bf16 x (N, in) times the dequantized weight, summed
    in fp32, rounded to bf16 → (N, out)."""
    return F.linear(x.float(), w.dequantized()).to(torch.bfloat16)


def linear(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` over a plain weight tensor, or the weight's own product (an Int8Weight,
    Fp16Weight or Bf16Weight)."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    return weight(x, bias)


_MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")


def products(layers: list, lm_head) -> list:
    """The 2-D weights of `decode_weights`' layers and head, as a step calls them."""
    return [getattr(w, m) for w in layers for m in _MATRICES] + [lm_head]


def decode_weights(layers: list, lm_head: torch.Tensor, fmt: str) -> tuple[list, object]:
    """The layers (runtime.LayerWeights) and LM head a decode step reads in `fmt`: the same
    objects for fp32; for int8, fp16 or bf16 copies whose 2-D weights are Int8Weight /
    Fp16Weight / Bf16Weight (norms, biases and the embedding stay as they are)."""
    if fmt not in FORMATS:
        raise InvalidOption(f"decode weights {fmt!r}: choose one of {FORMATS}")
    if fmt == "fp32":
        return layers, lm_head
    if fmt == "int8" and lm_head.device.type != "cpu":
        raise InvalidOption(f"int8 decode weights run on torch's CPU kernel; the model is on "
                         f"{lm_head.device.type} (its own weights decode faster there: fp32)")
    copy = _WEIGHTS[fmt]
    return ([dataclasses.replace(w, **{m: copy(getattr(w, m)) for m in _MATRICES})
             for w in layers], copy(lm_head))
