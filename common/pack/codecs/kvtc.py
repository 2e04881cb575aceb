"""`kvtc`: KV cache transform coding — per-head PCA, bit allocation, quantization, zstd.

Staniszewski & Łańcucki, "KV Cache Transform Coding for Compact Storage in LLM Inference"
(arXiv:2511.01815): decorrelate KV features with an orthonormal PCA basis calibrated once per
model, spend a bit budget over the principal components by measured error (components of
tiny variance get nothing: dropped), quantize, entropy-code. Here (docs/codecs.md has the
numbers, measured on SmolLM2-135M):

- **Transform** y = (x − μ)·Bᵀ per (K or V, layer, KV head), over pre-RoPE keys (DESIGN.md
  decision 1) and values. The paper's PCA spans all heads and layers jointly; packs are
  ragged per head after eviction (decision 2) and a codec sees one head, so heads are coded
  apart. Measured at ~8×: one 192-dim basis per layer would cut the K/V error from
  0.13/0.38 to 0.10/0.31; one 64-dim basis shared by a layer's heads raises keys' to 0.20.
- **Calibration** (`calibrate`, once per model, on `calibrate.CALIBRATION_TEXT`, never an
  evaluation text, its first 4 tokens left out): μ and B per head, and for every component
  the MSE and the code entropy of each rung of a quantizer ladder, step = sd·2^(−j/2).
- **Allocation**: `calibrate.allocate_components` picks one rung (or none: dropped) per
  component so the code entropy fits `bits` per element. `allocate=model` spends one budget
  over the whole model, minimizing the sum of every head's relative error — values get more
  bits than keys on SmolLM2; `head` gives each head the same budget. Entropy-rated rungs beat
  the paper's fixed code widths by ~20% at equal error here.
- **Quantization** round(y/step), |code| ≤ 127; **entropy coding**: codes zig-zagged to small
  symbols (0, −1, 1, …), component by component, one zstd frame per head (the paper: DEFLATE
  on the GPU). The first `sinks` tokens of the context stay fp16 (the paper: 4 sinks).
- **Decoding**: dequantize, one (n, k)·(k, D) matmul, add μ — dense pieces.

**Where the transform lives.** A calibrated `Transform` is a safetensors file named by the
blake3 of its bytes, `<KVEDGE_HOME>/transforms/<digest>.kvtc`; the cloud worker that first
encodes with kvtc for a model fits it there (`codec_for_model`), and every tensor it encodes
records the digest. Two ways to ship it:
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
"""
from __future__ import annotations

import json
import logging
import re
import struct
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import blake3
import numpy as np
import safetensors.torch
import torch
import zstandard

from kvedge.common.errors import InvalidOption
from kvedge.common.fsutil import write_atomic
from kvedge.common.pack.calibrate import CALIBRATION_TEXT, allocate_components
from kvedge.common.pack.codecs.base import CODECS, Codec, Role, expect, header
from kvedge.common.pack.codecs.zstd import bytes_tensor
from kvedge.common.pack.errors import TransformMismatch, TransformMissing
from kvedge.common.registry import option, validate

log = logging.getLogger("kvedge.kvtc")

RUNGS = torch.arange(-2, 12, dtype=torch.float32)  # step = sd·2^(−j/2); option 0 drops
MAX_CODE = 127  # codes are stored as one zig-zagged byte
KINDS = ("key", "value")
SINKS = 4  # calibration leaves the context's first tokens out: they are kept in fp16
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


# ---------------------------------------------------------------------- fitting
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


def rung_steps(sd: torch.Tensor) -> torch.Tensor:
    """(..., D, R) quantizer steps of every rung, as fp16 stores them (0 where sd is 0)."""
    return (sd[..., None] * 2.0 ** (-RUNGS / 2)).clamp(max=6e4).half().float()


def ladder(y: torch.Tensor, sd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """error, rate (D, 1 + R) of coefficients y (N, D) at the rungs of sd (D,); option 0
    drops the component."""
    n, d = y.shape
    if n == 0:
        return torch.zeros(d, len(RUNGS) + 1), torch.zeros(d, len(RUNGS) + 1)
    steps = rung_steps(sd).T[:, None]                         # (R, 1, D)
    q = quantize(y[None], steps)                            # (R, N, D)
    error = (q * steps - y).square().mean(1)
    counts = torch.zeros(len(RUNGS), d, 2 * MAX_CODE + 1).scatter_add_(
        2, (q.long() + MAX_CODE).transpose(1, 2), torch.ones(len(RUNGS), d, n))
    p = counts / n
    rate = -(p * torch.log2(p.clamp(min=1e-30))).sum(-1)
    drop = y.square().mean(0)[None]
    return torch.cat([drop, error]).T.contiguous(), torch.cat([torch.zeros_like(drop), rate]).T


def quantize(y: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """round(y / step), clamped to the codes a byte holds; a 0 step gives code 0."""
    safe = torch.where(steps > 0, steps, torch.ones_like(steps))
    return torch.where(steps > 0, (y / safe).round().clamp(-MAX_CODE, MAX_CODE), 0.0)


def allocate(error, rate, bits: float) -> torch.Tensor:
    """Option per component (..., D), 0 = dropped, for the rung tables of one or more heads
    under `bits` of code entropy per element, minimizing the sum of each head's relative
    error."""
    variance = error[..., 0].sum(-1, keepdim=True).clamp(min=1e-30)[..., None]
    relative = error / variance
    # components whose variance is rounding noise (rank-deficient heads) are not worth a bit
    relative = torch.where(relative[..., :1] < 1e-9, relative[..., :1], relative)
    budget = bits * error.shape[-2] * (error[..., 0, 0].numel())
    return torch.from_numpy(allocate_components(relative.numpy(), rate.numpy(), budget))


def steps_of(choice: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    """Quantizer steps (..., D) of the chosen options, 0 where a component is dropped."""
    steps = rung_steps(sd)                                     # (..., D, R)
    padded = torch.cat([torch.zeros_like(steps[..., :1]), steps], -1)
    return padded.gather(-1, choice[..., None])[..., 0]


# ---------------------------------------------------------------------- the transform
@dataclass
class Transform:
    """A model's calibrated transform: per slot (kind, layer, KV head) — slot index
    (kind·L + layer)·H + head — mean (S, D), basis (S, D, D), sd (S, D), error/rate
    (S, D, O). Content-addressed by `digest` (blake3 of `to_bytes()`)."""

    mean: torch.Tensor
    basis: torch.Tensor
    sd: torch.Tensor
    error: torch.Tensor
    rate: torch.Tensor
    n_layers: int
    n_heads: int
    meta: dict = field(default_factory=dict)
    _choices: dict = field(default_factory=dict, repr=False, compare=False)
    _bytes: bytes | None = field(default=None, repr=False, compare=False)

    def slot(self, kind: str, layer: int, head: int) -> int:
        return (KINDS.index(kind) * self.n_layers + layer) * self.n_heads + head

    def choice(self, bits: float, spread: str) -> torch.Tensor:
        """(S, D) option per component for a budget (computed once per budget): one budget
        over the whole model (`model`) or the same for every head (`head`)."""
        if (bits, spread) not in self._choices:
            self._choices[bits, spread] = allocate(self.error, self.rate, bits) \
                if spread == "model" else torch.stack([allocate(e, r, bits) for e, r
                                                       in zip(self.error, self.rate)])
        return self._choices[bits, spread]

    def steps(self, bits: float, spread: str) -> torch.Tensor:
        """(S, D) quantizer steps, 0 = dropped."""
        return steps_of(self.choice(bits, spread), self.sd)

    def head_bits(self, bits: float, spread: str) -> torch.Tensor:
        """(S,) code entropy per element each head gets under the budget."""
        chosen = self.rate.gather(-1, self.choice(bits, spread)[..., None])[..., 0]
        return chosen.mean(-1)

    def to_bytes(self) -> bytes:
        if self._bytes is None:
            meta = {**{k: str(v) for k, v in self.meta.items()}, "format": "kvtc-transform/1",
                    "n_layers": str(self.n_layers), "n_heads": str(self.n_heads)}
            self._bytes = safetensors.torch.save(
                {"mean": self.mean, "basis": self.basis, "sd": self.sd, "error": self.error,
                 "rate": self.rate}, metadata=dict(sorted(meta.items())))
        return self._bytes

    @property
    def digest(self) -> str:
        return blake3.blake3(self.to_bytes()).hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes, digest: str = "") -> "Transform":
        try:
            n = struct.unpack_from("<Q", data)[0]
            meta = json.loads(data[8: 8 + n])["__metadata__"]
            t = safetensors.torch.load(data)
            out = cls(t["mean"], t["basis"], t["sd"], t["error"], t["rate"],
                      int(meta.pop("n_layers")), int(meta.pop("n_heads")), meta, _bytes=data)
            _check_shapes(out)
            return out
        except (ValueError, KeyError, TypeError, struct.error, RuntimeError) as err:
            raise TransformMismatch(digest, f"not a kvtc transform ({err})") from None


def _check_shapes(t: Transform) -> None:
    s, d = t.mean.shape
    if s != 2 * t.n_layers * t.n_heads or t.basis.shape != (s, d, d) or t.sd.shape != (s, d) \
            or t.error.shape != (s, d, len(RUNGS) + 1) or t.rate.shape != t.error.shape:
        raise ValueError("tensor shapes do not fit its layers and heads")


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


# ---------------------------------------------------------------------- the store
class TransformStore:
    """Transforms on disk by digest (`<root>/<digest>.kvtc`, written atomically, checked on
    every load) and the digest calibrated for each model (`<root>/models/<fingerprint>`)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._loaded: dict[str, Transform] = {}

    def path(self, digest: str) -> Path:
        if not _DIGEST.match(digest):
            raise TransformMismatch(digest, "is not a blake3 hex digest")
        return self.root / f"{digest}.kvtc"

    def has(self, digest: str) -> bool:
        """Whether the file is here (a string that is not a digest never is)."""
        return bool(_DIGEST.match(digest)) and self.path(digest).exists()

    def add(self, digest: str, data: bytes) -> None:
        """Install a transform file received from elsewhere (the edge's sync): bytes that do
        not hash to `digest` raise TransformMismatch and nothing is written; good ones are
        written atomically (a reader sees no file or the whole one)."""
        path = self.path(digest)
        _check_digest(digest, data, f"the {len(data)} bytes received")
        write_atomic(path, data, 0o644)

    def save(self, t: Transform, model: str | None = None) -> str:
        digest = t.digest
        if not self.path(digest).exists():
            write_atomic(self.path(digest), t.to_bytes(), 0o644)
        if model:
            write_atomic(self.root / "models" / model, digest.encode(), 0o644)
        self._loaded[digest] = t
        return digest

    def load(self, digest: str) -> Transform:
        if digest not in self._loaded:
            path = self.path(digest)
            if not path.exists():
                raise TransformMissing(digest, str(self.root))
            data = path.read_bytes()
            _check_digest(digest, data, f"the bytes of {path}")
            self._loaded[digest] = Transform.from_bytes(data, digest)
        return self._loaded[digest]

    def for_model(self, fingerprint: str) -> str | None:
        index = self.root / "models" / fingerprint
        return index.read_text().strip() if index.exists() else None


def _check_digest(digest: str, data: bytes, what: str) -> None:
    """TransformMismatch unless `data` (described by `what`) hashes to `digest`."""
    if blake3.blake3(data).hexdigest() != digest:
        raise TransformMismatch(digest, f"{what} do not hash to its name")


_STORES: dict[Path, TransformStore] = {}


def referenced_transforms(manifest) -> set[str]:
    """The transforms a pack (its `Manifest`) needs from the transforms folder: the digests
    its embed=false kvtc tensors name, also under stages ("kvtc+zstd": params["inner"])."""
    found = set()
    for entry in manifest.tensors.values():
        base, *stages = entry.codec.split("+")
        if base != Kvtc.name:
            continue
        params = entry.params
        for _ in stages:
            params = params["inner"]
        if not params["embedded"]:
            found.add(params["transform"])
    return found


def default_store() -> TransformStore:
    """The transforms folder of this machine: <KVEDGE_HOME>/transforms."""
    from kvedge.common.model.models import kvedge_home

    root = kvedge_home() / "transforms"
    return _STORES.setdefault(root, TransformStore(root))


def model_transform(rt, store: TransformStore | None = None) -> Transform:
    """The model's transform from the store, calibrated (and saved) on first use."""
    store = store or default_store()
    digest = store.for_model(rt.loaded.fingerprint)
    if digest:
        try:
            return store.load(digest)
        except (TransformMissing, TransformMismatch) as err:
            log.warning("recalibrating kvtc: %s", err)
    start = time.perf_counter()
    t = calibrate(rt)
    store.save(t, rt.loaded.fingerprint)
    log.info("calibrated kvtc transform %s… for %s in %.1f s", t.digest[:16],
             rt.loaded.fingerprint[:16], time.perf_counter() - start)
    return t


def codec_for_model(codec: str | Codec, rt, store: TransformStore | None = None):
    """What a worker encodes with: a kvtc spec bound to the model's calibrated transform;
    any other codec as it was given."""
    from kvedge.common.pack.codecs.specs import get_codec

    built = get_codec(codec) if isinstance(codec, str) else codec
    inner = getattr(built, "inner", built)
    if not isinstance(inner, Kvtc) or inner.transform:
        return codec
    bound = replace(inner, transform=model_transform(rt, store).digest)
    if inner is built:
        return bound
    built.inner = bound
    return built


# ---------------------------------------------------------------------- the codec
@CODECS.register
@dataclass
class Kvtc(Codec):
    bits: float = option(2.0, 0.01, 8.0, "code entropy per KV element, averaged (fp16: 16)")
    sinks: int = option(4, 0, None, "first tokens of the context kept in fp16")
    embed: bool = option(True, help="each head carries its own mean and basis rows (decodes "
                                    "anywhere); false: packs reference the transform file")
    allocate: str = option("model", help="model: one budget over all heads, fewest relative "
                                         "error in sum; head: the same budget for each head")
    transform: str = option("", help="blake3 of a calibrated transform (a cloud worker sets "
                                     "it); '' fits each head on its own rows")
    level: int = option(3, 1, 22, "zstd level")

    name = "kvtc"

    def __post_init__(self):
        validate(self)
        if self.allocate not in ("model", "head"):
            raise InvalidOption(f"'kvtc' option 'allocate' must be model or head, "
                                f"got {self.allocate!r}")
        if self.transform and not _DIGEST.match(self.transform):
            raise InvalidOption(f"'kvtc' option 'transform' must be a blake3 hex digest, "
                                f"got {self.transform!r}")

    def encode(self, x, role=Role()):
        ranks = role.ranks if role.ranks is not None else torch.arange(x.shape[0])
        head = int((ranks < self.sinks).sum())
        rows = x[head:]
        embedded = self.embed or not self.transform
        params = {**header(x), "sinks": head, "transform": self.transform, "embedded": embedded}
        bits = self.bits
        if self.transform:
            t = default_store().load(self.transform)
            s = params["slot"] = self._slot(t, x, role)
            bits = float(t.head_bits(self.bits, self.allocate)[s])
        if embedded:  # the basis travels anyway: fit it to these rows, spend the head's bits
            mean, basis, error, rate, sd = fit_head(rows, table_rows=512)
            steps = steps_of(allocate(error, rate, bits), sd)
        else:
            mean, basis, steps = t.mean[s], t.basis[s], t.steps(self.bits, self.allocate)[s]
        keep = steps > 0
        if embedded and int(keep.sum()) + 1 >= rows.shape[0]:
            head, rows, keep = x.shape[0], rows[:0], torch.zeros_like(keep)  # fp16 is smaller
            params["sinks"] = head
        parts = {"sink": x[:head].to(torch.float16), "step": (steps * keep).half(),
                 "codes": self._codes(rows, mean, basis[keep], steps[keep])}
        if embedded:
            parts.update(mean=mean, basis=basis[keep])
        return parts, params

    def _slot(self, t: Transform, x, role: Role) -> int:
        if role.kind not in KINDS or (t.n_layers, t.basis.shape[-1]) != (role.n_layers,
                                                                         x.shape[1]) \
                or not 0 <= role.head < t.n_heads:
            raise TransformMismatch(self.transform, f"it fits {t.n_layers} layers × {t.n_heads}"
                                    f" heads × {t.basis.shape[-1]} dims, not {role.kind} head "
                                    f"{role.head} of {role.n_layers} layers × {x.shape[1]}")
        return t.slot(role.kind, role.layer, role.head)

    def _codes(self, rows, mean, basis, steps) -> torch.Tensor:
        y = (rows.float() - mean.float()) @ basis.float().T             # (n, k)
        q = quantize(y, steps.float()).to(torch.int16)
        symbols = torch.where(q >= 0, 2 * q, -2 * q - 1).to(torch.uint8).T.contiguous()
        cctx = zstandard.ZstdCompressor(level=self.level)
        return bytes_tensor(cctx.compress(symbols.numpy().tobytes()))

    def pieces(self, parts, params):
        return self.take(parts, params, None)

    def take(self, parts, params, rows):
        """The sinks and the inverse transform of only the coded rows asked for (all if
        `rows` is None): the codes are entropy-decoded whole, the matrix product is not."""
        (n, dim), head = params["shape"], int(params["sinks"])
        if not 0 <= head <= n:
            raise ValueError(f"bad sink count {head} of {n} rows")
        steps = expect(parts["step"], (dim,), torch.float16, "step").float()
        if not torch.isfinite(steps).all() or (steps < 0).any():
            raise ValueError("quantizer steps must be finite and non-negative")
        keep = steps > 0
        k, m = int(keep.sum()), n - head
        if params["embedded"]:
            mean = expect(parts["mean"], (dim,), torch.float16, "mean")
            basis = expect(parts["basis"], (k, dim), torch.float16, "basis")
        else:
            t = default_store().load(params["transform"])
            s = int(params["slot"])
            if not 0 <= s < t.mean.shape[0] or t.mean.shape[1] != dim:
                raise TransformMismatch(params["transform"], f"it has no slot {s} of {dim} dims")
            mean, basis = t.mean[s], t.basis[s][keep]
        q = _symbols(parts["codes"], k, m)                              # (m, k)
        sink = expect(parts["sink"], (head, dim), torch.float16, "sink")
        if rows is not None:
            sink, q = sink[rows[rows < head]], q[rows[rows >= head] - head]
        return [sink, (q * steps[keep]) @ basis.float() + mean.float()]


def _symbols(codes: torch.Tensor, k: int, m: int) -> torch.Tensor:
    """The zstd frame of zig-zagged codes, component by component → codes (m, k) float."""
    if k * m == 0:
        return torch.zeros(m, k)
    raw = zstandard.ZstdDecompressor().decompress(codes.numpy().tobytes(), max_output_size=k * m)
    if len(raw) != k * m:
        raise ValueError(f"codes hold {len(raw)} symbols, expected {k}×{m}")
    return torch.from_numpy(_UNZIGZAG[np.frombuffer(raw, np.uint8)]).reshape(k, m).T


_UNZIGZAG = np.array([s // 2 if s % 2 == 0 else -(s + 1) // 2 for s in range(256)], np.float32)
