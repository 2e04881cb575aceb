"""The exact transformer runtime: prefill, partial recompute and decode over explicit KV.

Plain tensor ops over the loaded model's own weights (Llama, Mistral, Qwen2, Qwen3), so its
full recompute equals the transformers forward (docs/design.md, decision 6) and every strategy's
quality difference is the strategy's.

Partial recompute (`Runtime.forward`) — the rules:
- `ids`/`positions` are the tokens run at layer 0, strictly increasing positions. A position
  inside the cache's extent (`KVCache.extent`: its context, held or evicted) is *recomputed*
  (its K/V overwritten at every layer it is active in, where a head holds it); any other is
  *fresh* (inserted at its position — after the context or between cached segments, SparseX
  Sec. 3–4 — and part of the extent once the forward succeeds).
- `active[l]` are the positions run at layer l. Hidden states flow only forward, so a token
  can only be active at layer l if it was active at layer l−1: active[l] ⊆ active[l−1], with
  active[0] = all of `positions`. A token that drops out keeps its cached K/V in deeper layers.
  Fresh tokens have no cached K/V at all, so they must stay active at every layer.
- `write[l]` ⊆ active[l] are the tokens whose K/V layer l stores (default all; SamKV Sec. 3.3);
  `fuse(old, new)` makes a recomputed token's stored K/V a blend with the cached one (Eq. 4).
- A run with no fresh token may end early: an empty active set at layer l > 0 stops it there
  (SamKV's recombination runs each token only up to the deepest layer it is recomputed at).
- Each active query at position p attends to the cache (fresh K/V for stored tokens, cached
  K/V for the rest) under the position-based mask (keys at positions ≤ p), and always to its
  own fresh K/V — stored or not, evicted by its head or not.
- One RoPE length per request (`KVCache.seq_len`) for every key and query, and a forward that
  raises leaves the cache exactly as it was (every write is undone).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from kvedge.common.errors import (ActiveSetError, CacheError, InvalidOption,
                                  UnsupportedArchitecture)
from kvedge.common.model.attention import OwnKV
from kvedge.common.model.kvcache import DenseKV, Extent, Fuse, KVCache, LayerKV, RaggedKV
from kvedge.common.model.models import AUTO_DECODE, PROMPT_WEIGHTS
from kvedge.common.model.quant import (AUTO_PROMPT_ROWS, AUTO_SPEEDUP, GIVE_UP, ROW_MULTIPLES,
                                       decode_weights, invariant_multiple, linear, one_thread,
                                       padded_rows, pass_s, products, timed_layers)
from kvedge.common.model.rope import Rope, head_dim_of

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class LayerWeights:
    ln1: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    bq: torch.Tensor | None
    bk: torch.Tensor | None
    bv: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    ln2: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    window: int | None

    @classmethod
    def of(cls, layer, window) -> "LayerWeights":
        attn, mlp = layer.self_attn, layer.mlp
        norm = lambda m: None if m is None else m.weight  # noqa: E731
        return cls(layer.input_layernorm.weight, attn.q_proj.weight, attn.k_proj.weight,
                   attn.v_proj.weight, attn.o_proj.weight, attn.q_proj.bias, attn.k_proj.bias,
                   attn.v_proj.bias, norm(getattr(attn, "q_norm", None)),
                   norm(getattr(attn, "k_norm", None)), layer.post_attention_layernorm.weight,
                   mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight, window)


def layer_windows(config) -> list[int | None]:
    """Sliding-window size per layer, as transformers applies it (None = full attention)."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if config.model_type == "mistral":
        return [window] * n
    types = getattr(config, "layer_types", None) or ["full_attention"] * n
    return [window if t == "sliding_attention" else None for t in types]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32, cast back, then scaled — transformers' order of operations."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@dataclass
class LayerCapture:
    """What a forward records per layer, on request: pre-RoPE q/k and the values."""

    keys: list[torch.Tensor] = field(default_factory=list)     # (Hkv, N, D) pre-RoPE
    values: list[torch.Tensor] = field(default_factory=list)   # (Hkv, N, D)
    queries: list[torch.Tensor] = field(default_factory=list)  # (Hq, N, D) pre-RoPE
    want_queries: bool = False


# observe(layer, q_rot (Hkv, G, N, D), q_pos (N,), cache_layer) → None; for scoring methods
Observer = Callable[[int, torch.Tensor, torch.Tensor, LayerKV], None]
# per layer: the positions to run, or a callable plan(layer, current positions) → positions | None
ActivePlan = list[torch.Tensor] | Callable[[int, torch.Tensor], torch.Tensor | None]


def _as_callable(plan):
    """A per-layer plan (None, a list, or a callable) as a callable (layer, current) → set."""
    if plan is None:
        return lambda layer, current: None
    if callable(plan):
        return plan
    return lambda layer, current: plan[layer]


@dataclass
class Tokens:
    """The tokens active at a layer: hidden x (N, hidden), positions (N,), their RoPE cos/sin
    (N, D) and whether each is fresh (N,) bool; narrowed together as the active set shrinks."""

    x: torch.Tensor
    pos: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    fresh: torch.Tensor

    def select(self, keep: torch.Tensor) -> "Tokens":
        return Tokens(self.x[keep], self.pos[keep], self.cos[keep], self.sin[keep],
                      self.fresh[keep])


@dataclass
class ForwardOutput:
    logits: torch.Tensor | None      # (n_out, vocab) for the last active tokens
    positions: torch.Tensor          # positions active at the last layer
    hidden: torch.Tensor             # (n_last_active, hidden) after the final norm


class Runtime:
    """Runs a loaded transformers causal LM with plain tensor ops over explicit KV caches."""

    def __init__(self, loaded):
        model = getattr(loaded, "model", loaded)
        self.loaded, self.model, self.config = loaded, model, model.config
        cfg = self.config
        if cfg.model_type not in SUPPORTED_TYPES:
            raise UnsupportedArchitecture(f"model type {cfg.model_type!r} is not supported; "
                                          f"supported: {SUPPORTED_TYPES}")
        if getattr(cfg, "mlp_bias", False):
            raise UnsupportedArchitecture("MLP biases are not supported")
        from transformers.activations import ACT2FN

        self.act = ACT2FN[cfg.hidden_act]
        self.n_layers, self.n_heads = cfg.num_hidden_layers, cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.group = self.n_heads // self.n_kv
        self.head_dim = head_dim_of(cfg)
        self.eps = cfg.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.rope = Rope(cfg)
        windows = layer_windows(cfg)
        self.layers = [LayerWeights.of(layer, w) for layer, w in zip(model.model.layers, windows)]
        self.embed = model.model.embed_tokens.weight
        self.final_norm = model.model.norm.weight
        self.lm_head = model.lm_head.weight
        self._decode: dict[str, tuple] = {}  # decode weights by format, built once each
        self._multiples: dict[str, int | None] = {}  # and their row multiples, probed once
        # called with no arguments after each layer of every `forward` (None: nothing): the
        # edge's scheduler steps the answers already decoding there while one starts
        # (`kvedge.edge.scheduler.Scheduler`'s max_stall); it must leave this forward's
        # tensors alone
        self.between_layers: Callable[[], None] | None = None
        # the model's own weights, their row probe left to the first step that reads it: a
        # runtime that never decodes (the cloud's prefill, an eviction method's scoring) does
        # not pay it (0.1-0.2 s on Qwen2.5-0.5B on a quiet 2-core box, 4 s beside a benchmark)
        self.use_decode_weights("fp32", probe=False)
        self.use_prompt_weights("fp32")

    def use_prompt_weights(self, fmt: str) -> None:
        """What every `forward` over this runtime reads — an answer's start (the reuse
        recompute and the question, up to the first token), session prefixes, segments the
        edge computes itself: the model's own weights ("fp32", the exact runtime that
        `kvctl model verify` checks against transformers), or bf16 copies ("bf16",
        `quant.Bf16Weight`: each matmul's inputs and output rounded to bf16, everything
        else as it was), which on a CPU with a bf16 GEMM run a start ~1.5× faster (SmolLM2,
        145 rows over a 440-token cache: 0.23 against 0.36 s; the matmuls 3× faster, the
        attention not at all), or "auto" (`auto_prompt_weights`: bf16 where a timed pass
        finds it fast; `prompt_choice` says why). The LM head stays the model's own (a start
        picks from one row). Set it on a runtime no request is using (the edge sets it at load); the
        cloud's prefill, verify and the benchmarks' quality figures keep fp32 unless a run
        asks otherwise. The copies are shared with bf16 decode weights."""
        if fmt == AUTO_DECODE:
            fmt, self.prompt_choice = self.auto_prompt_weights()
        elif fmt in PROMPT_WEIGHTS:
            self.prompt_choice = "as asked"
        else:
            raise InvalidOption(f"prompt weights {fmt!r}: choose one of {PROMPT_WEIGHTS} or "
                                f"{AUTO_DECODE!r}")
        self.prompt_layers = self._weights(fmt)[0]
        self.prompt_format = fmt

    def use_decode_weights(self, fmt: str, probe: bool = True) -> None:
        """What decode steps (`batch.decode_step`) read: the model's own weights ("fp32") or
        weight-only int8, fp16 or bf16 copies (`kvedge.common.model.quant`), or "auto"
        (`auto_decode_weights` picks fp32 or fp16; `decode_choice` says why).
        Forwards over a prompt read `prompt_layers` (`use_prompt_weights`). Set it between
        steps (the scheduler's thread reads it per step). `decode_row_multiple` is the row
        count a step over them pads to for batch invariance: 1 where the products were found
        row-invariant on this machine, 2 or 4 where only steps padded so were, None where no
        multiple probed held (`quant.invariant_multiple`, checked once per format, fp32's own
        weights included; `kvedge.common.model.batch.row_multiple`); `probe` checks it now,
        so that the first answer does not wait for it (False: at the first read)."""
        if fmt == AUTO_DECODE:
            fmt, self.decode_choice = self.auto_decode_weights()
        else:
            self.decode_choice = "as asked"
        self.decode_layers, self.decode_head = self._weights(fmt)
        self.decode_format = fmt
        if probe:
            self._row_multiple(fmt)

    @property
    def decode_row_multiple(self) -> int | None:
        return self._row_multiple(self.decode_format)

    def _weights(self, fmt: str) -> tuple[list, object]:
        """(layers, head) of `fmt`'s weights (the model's own for fp32), copies built once."""
        if fmt not in self._decode:
            self._decode[fmt] = decode_weights(self.layers, self.lm_head, fmt)
        return self._decode[fmt]

    def _row_multiple(self, fmt: str) -> int | None:
        """The rows a step over `fmt`'s weights pads to (`quant.invariant_multiple`), probed
        once: prompt weights alone never need it."""
        if fmt not in self._multiples:
            self._multiples[fmt] = invariant_multiple(products(*self._weights(fmt)))
        return self._multiples[fmt]

    def _drop_copies(self, fmt: str) -> None:
        """Forget `fmt`'s copies (and their probe), which auto did not take."""
        self._decode.pop(fmt, None)
        self._multiples.pop(fmt, None)

    def auto_decode_weights(self) -> tuple[str, str]:
        """(format, why) for `--decode-weights auto`: fp16 copies where, on this machine,
        steps over them can be batch-invariant (`quant.invariant_multiple`: unpadded, or
        padded to 2 or 4 rows) and a lone answer's step over the first layers' weights
        (`quant.timed_layers`), at the rows each format pads it to, takes at most
        1 / AUTO_SPEEDUP of fp32's; else the model's own weights ("fp32"), the fp16 copies
        dropped. Only for an fp32 model on the CPU: elsewhere the model's own weights.

        Decision (2026-11-27): fp16 rather than int8, because on 300 real HotpotQA questions
        per model fp16 changed 0 (Qwen2.5-0.5B) and 3 (SmolLM2) answers, F1 +0.000 on both,
        at 0.20× / 0.37× fp32's time per token, where int8 changed 4 and 48 of 150
        (docs/serving.md); and measured at load rather than assumed, because fp16 matmul was
        4.6× faster than fp32 on this project's AVX-512 machine and nothing says it is on a
        CPU without such a path. The threshold leaves out a CPU where fp16 barely wins.

        Decision (2026-11-28): not bf16, though bf16 steps give a loaded edge 1.34× the
        answers/s (16 SmolLM2 clients) — fp16's cost grows with a step's rows, bf16's
        hardly (`quant.Bf16Weight`). A lone answer is what an edge serves most, and there
        fp16 wins: its one-row step took 29 ms against a padded bf16 step's 52 (SmolLM2,
        1,300-token cache), TPOT 58 against 77 ms with bf16's drafts on 30 HotpotQA
        questions; and bf16 moved 15–17 of 100 SmolLM2 answers where fp16 moved 1 in 100.
        A busy edge passes `--decode-weights bf16` (docs/serving.md, "bf16 weights").
        Beyond what `--decode-weights fp16` costs at load (the copies, the invariance probe),
        the timing adds 8 one-row passes over ~256 MB of weights: 0.07 s fp32 and 0.12 s fp16
        on SmolLM2 (19 layers timed; 2 cores, beside a benchmark).

        Decision (2026-12-01): each format is timed at the rows a lone answer's step pads it
        to (`decode_row_multiple`), and on one thread, as `auto_prompt_weights` is. On an
        AVX-512/AMX Xeon fp16 holds only padded to 2 rows, and there a quiet box's 2-thread
        passes put it level with fp32's one row (Qwen2.5-0.5B 15–21 against 17–20 ms,
        SmolLM2 21–22 against 17–21: fp32), while the same probe beside a benchmark took
        fp16 for SmolLM2 (45.6 against 75.7 ms): a busy box would have changed an edge's
        answers at a restart. On one thread the quiet box gave the same verdict (Qwen 27–35
        against 32–33 ms, SmolLM2 31–32 against 34–36), and so did 8 of 8 beside a 16K-token
        benchmark, each pass less exposed to a descheduled second thread. Served steps
        agreed: Qwen 141 ms a lone fp16 step padded to 2 rows against fp32's 163 (0.87×),
        SmolLM2 67 against 55 (1.21×) (`python -m kvedge.bench.decode_speed`,
        docs/serving.md)."""
        if (kept := self._own_weights_only()) is not None:
            return "fp32", kept
        layers, head = self._weights("fp16")
        if (multiple := self._row_multiple("fp16")) is None:
            self._drop_copies("fp16")
            return "fp32", (f"fp16 products are not row-invariant on this CPU at any padding "
                            f"probed ({', '.join(map(str, ROW_MULTIPLES))} rows)")
        own = padded_rows(self._row_multiple("fp32"))  # what an fp32 step pads to
        n = timed_layers(self.layers)
        with one_thread():
            fp32_s = pass_s(products(self.layers[:n], self.lm_head)[:-1], own)
            fp16_s = pass_s(products(layers[:n], head)[:-1], multiple)
        took = (f"fp16 pass of {_rows(multiple)} {fp16_s * 1e3:.1f} ms against fp32's of "
                f"{_rows(own)} {fp32_s * 1e3:.1f}")
        if fp16_s * AUTO_SPEEDUP > fp32_s:
            self._drop_copies("fp16")
            return "fp32", f"{took} (< {AUTO_SPEEDUP}x faster)"
        return "fp16", f"fp16 steps row-invariant padded to {_rows(multiple)}; {took}"

    def _own_weights_only(self) -> str | None:
        """Why `auto` keeps the model's own weights whatever a probe would say — a model not
        in fp32, or not on the CPU (its copies exist for CPU matmuls) — or None."""
        if self.device.type != "cpu" or self.dtype != torch.float32:
            return f"the model's own {self.dtype} weights on {self.device.type}"
        return None

    def auto_prompt_weights(self) -> tuple[str, str]:
        """(format, why) for `--prompt-weights auto`: bf16 copies where a pass of
        `quant.AUTO_PROMPT_ROWS` rows over the first layers' weights takes at most
        1 / AUTO_SPEEDUP of fp32's; else the model's own. Only for an fp32 model on the CPU.
        Quality: docs/serving.md ("bf16 weights").

        Decision (2026-11-29): both passes are timed on one thread, because with torch's
        threads on a CPU that other processes keep busy the choice followed the load, not
        the CPU. On 2 cores beside a benchmark, the tiny Llama's fp32 pass took 324–328 ms
        against 0.8 idle (each small matmul waits for a descheduled thread) and bf16's 160,
        so all 6 probes took bf16; on one thread fp32 took 0.9–1.3 ms and bf16 11–21, and all
        6 took fp32. An edge restarted under load then answered otherwise than before (the
        fault tests caught it). A 128-row pass is compute-bound, so one thread keeps the two
        formats' ratio. The bf16 passes stop once one takes GIVE_UP times longer than bf16
        would need to win: on a CPU without a bf16 GEMM they are ~8× fp32's (SmolLM2: 2.6 s
        a pass), and the four of them made most of the probe's 22 s there."""
        if (kept := self._own_weights_only()) is not None:
            return "fp32", kept
        n = timed_layers(self.layers)

        def cost(fmt: str, beyond: float | None = None) -> float:
            return pass_s(products(self._weights(fmt)[0][:n], self.lm_head)[:-1],
                          AUTO_PROMPT_ROWS, beyond=beyond)

        costs = {}
        with one_thread():
            costs["fp32"] = cost("fp32")
            costs["bf16"] = cost("bf16", beyond=GIVE_UP * costs["fp32"] / AUTO_SPEEDUP)
        best = "bf16" if costs["bf16"] * AUTO_SPEEDUP <= costs["fp32"] else "fp32"
        if best == "fp32" and self.decode_format != "bf16":
            self._drop_copies("bf16")
        return best, (f"a {AUTO_PROMPT_ROWS}-row pass, ms: fp32 {costs['fp32'] * 1e3:.1f}, "
                      f"bf16 {costs['bf16'] * 1e3:.1f} (bf16 needs {AUTO_SPEEDUP}x)")

    @property
    def dtype(self):
        return self.embed.dtype

    @property
    def device(self):
        return self.embed.device

    def empty_cache(self, reserve: int = 0, seq_len: int | None = None) -> KVCache:
        """An empty cache with room for `reserve` tokens; `seq_len`: the request's RoPE
        length (None: its first forward fixes it)."""
        return KVCache([DenseKV.empty(self.n_kv, self.head_dim, self.dtype, self.device, reserve)
                        for _ in range(self.n_layers)], Extent(), seq_len)

    # ------------------------------------------------------------------ one layer

    def qkv(self, w: LayerWeights, h: torch.Tensor):
        """h (N, hidden) normed → pre-RoPE q (Hq, N, D), k (Hkv, N, D), v (Hkv, N, D)."""
        n = h.shape[0]
        q = linear(h, w.wq, w.bq).view(n, self.n_heads, self.head_dim)
        k = linear(h, w.wk, w.bk).view(n, self.n_kv, self.head_dim)
        v = linear(h, w.wv, w.bv).view(n, self.n_kv, self.head_dim)
        if w.q_norm is not None:  # Qwen3: RMSNorm over each head vector, before RoPE
            q, k = rms_norm(q, w.q_norm, self.eps), rms_norm(k, w.k_norm, self.eps)
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)

    def layer(self, i: int, run: "Tokens", cache: LayerKV, store: torch.Tensor | None,
              capture: LayerCapture | None, observe: Observer | None, undo: list,
              fuse: Fuse | None = None) -> torch.Tensor:
        """run.x (N, hidden) of the active tokens → (N, hidden); stores the K/V of the tokens
        in `store` (None: all) and records how to undo it."""
        from kvedge.kernels.rope import apply_rotary

        w = self.prompt_layers[i]
        q, k, v = self.qkv(w, rms_norm(run.x, w.ln1, self.eps))
        if capture is not None:
            capture.keys.append(k)
            capture.values.append(v)
            if capture.want_queries:
                capture.queries.append(q)
        q, k = apply_rotary(q, run.cos, run.sin), apply_rotary(k, run.cos, run.sin)
        private = self.write_kv(cache, run, k, v, store, undo, fuse)
        return self.post_attention(w, run.x, self.attend(i, run.pos, q, k, v, private, cache,
                                                         observe))

    def attend(self, i: int, pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, private: torch.Tensor | None, cache: LayerKV,
               observe: Observer | None = None) -> torch.Tensor:
        """Rotated q (Hq, N, D) of tokens at `pos` (N,) against layer i's cache, which already
        holds what it stores of their rotated k, v (Hkv, N, D) → (N, Hq·D)."""
        q = q.view(self.n_kv, self.group, -1, self.head_dim)  # (Hkv, G, N, D)
        if observe is not None:
            observe(i, q, pos, cache)
        attn = cache.attend(q, pos, self.scale, self.layers[i].window, OwnKV(k, v, private))
        attn = attn.reshape(self.n_heads, -1, self.head_dim)  # (Hq, N, D)
        return attn.transpose(0, 1).reshape(pos.numel(), -1)

    def post_attention(self, w: LayerWeights, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x (N, hidden) + o_proj(attn (N, Hq·D)), then the MLP's residual → (N, hidden)."""
        x = x + linear(attn, w.wo)
        h = rms_norm(x, w.ln2, self.eps)
        return x + linear(self.act(linear(h, w.w_gate)) * linear(h, w.w_up), w.w_down)

    @staticmethod
    def write_kv(cache: LayerKV, run: "Tokens", k, v, store, undo: list,
                 fuse: Fuse | None = None) -> torch.Tensor | None:
        """Write the stored tokens' K/V (Hkv, N, D); (Hkv, N) where a head lacks a token's
        fresh K/V (None: it holds all) — those queries get it privately."""
        if store is None:
            restore, held = cache.write(run.pos, k, v, run.fresh, fuse)
            undo.append(restore)
            return None if held is None else ~held
        restore, held = cache.write(run.pos[store], k[:, store], v[:, store], run.fresh[store],
                                    fuse)
        undo.append(restore)
        private = ~store.expand(k.shape[0], -1).clone()  # (Hkv, N)
        if held is not None:
            private[:, store] = ~held
        return private

    # ------------------------------------------------------------------ forward

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                active: "ActivePlan | None" = None, *, logits: str = "last",
                capture: LayerCapture | None = None, observe: Observer | None = None,
                seq_len: int | None = None, write: "ActivePlan | None" = None,
                fuse: Fuse | None = None) -> ForwardOutput:
        """Run `ids` at `positions` through every layer against `cache` (see module rules).

        active: None (every token at every layer), a list with one position set per layer,
        or a callable `plan(layer, current_positions) -> positions | None` asked before each
        layer — strategies that pick their recompute set from a shallow layer's attention
        (A3, CacheBlend, SparseX) decide there, after observing the layers before.
        write: which active tokens store their K/V (SamKV Sec. 3.3), in the same forms:
        None (all), one position set per layer (each ⊆ that layer's active set, maybe empty)
        or a callable asked after `active` narrows the layer.
        fuse: how a recomputed token's new K/V combines with the cached one (default: replace).
        logits: "last" (the last token active at the final layer), "all" or "none"; a run that
        ended early (an empty active set) has none.
        seq_len: the RoPE length (dynamic/longrope); defaults to the cache's one length, or
        fixes it (the largest position + 1) on the cache's first forward.
        """
        if not isinstance(cache, KVCache):
            raise CacheError("forward needs a KVCache (Runtime.empty_cache, dense_cache, "
                             "ragged_cache, or KVCache(layers, extent)): a plain list of layers "
                             "does not say which positions its context covers")
        ids, positions = ids.to(self.device), positions.to(self.device, torch.long)
        if positions.numel() == 0 or bool((positions[1:] <= positions[:-1]).any()):
            raise CacheError("positions must be non-empty and strictly increasing")
        fresh = ~cache.extent.covers(positions)
        plan, stores = self._plan(active, positions, fresh), _as_callable(write)
        seq_len = seq_len or cache.seq_len or int(positions[-1]) + 1
        cos, sin = self.rope.cos_sin(positions, seq_len)
        run = Tokens(F.embedding(ids, self.embed), positions, cos, sin, fresh)
        undo: list = []
        try:
            for i in range(self.n_layers):
                keep = self._narrow(i, run.pos, plan(i, run.pos), run.fresh)
                if keep is not None:  # this layer runs a subset of the layer below's tokens
                    run = run.select(keep)
                if run.pos.numel() == 0:  # every token is done (none was fresh)
                    break
                store = self._stored(i, run.pos, stores(i, run.pos))
                run.x = self.layer(i, run, cache[i], store, capture, observe, undo, fuse)
                if self.between_layers is not None:
                    self.between_layers()
        except BaseException:
            for restore in reversed(undo):  # a failed run leaves the cache exactly as it was
                restore()
            raise
        cache.extent.add(positions)
        cache.seq_len = cache.seq_len or seq_len
        hidden = rms_norm(run.x, self.final_norm, self.eps)
        if run.pos.numel() == 0:
            return ForwardOutput(None, run.pos, hidden)
        return ForwardOutput(self._logits(hidden, logits), run.pos, hidden)

    def _logits(self, hidden: torch.Tensor, which: str) -> torch.Tensor | None:
        if which == "none":
            return None
        return F.linear(hidden[-1:] if which == "last" else hidden, self.lm_head)

    def _plan(self, active, positions, fresh):
        """A callable plan; a list plan is checked whole before anything runs."""
        if active is None or callable(active):
            return _as_callable(active)
        if len(active) != self.n_layers:
            raise ActiveSetError(f"need one active set per layer ({self.n_layers}), got {len(active)}")
        current = positions
        for layer, want in enumerate(active):
            keep = self._narrow(layer, current, want, fresh)
            if keep is not None:
                current, fresh = current[keep], fresh[keep]
        return lambda layer, current: active[layer]

    @staticmethod
    def _indices(current: torch.Tensor, want) -> tuple[torch.Tensor, bool]:
        """(indices of `want` in `current`, whether `want` is a sorted subset of `current`)."""
        want = torch.as_tensor(want, dtype=torch.long, device=current.device)
        if want.numel() == 0 or current.numel() == 0:
            return want, want.numel() == 0
        idx = torch.searchsorted(current, want).clamp(max=current.numel() - 1)
        ok = not bool((current[idx] != want).any()) and not bool((want[1:] <= want[:-1]).any())
        return idx, ok

    def _narrow(self, layer: int, current: torch.Tensor, want, fresh: torch.Tensor):
        """Indices of `want` within `current` (None: keep all), enforcing the module's rules."""
        if want is None:
            return None
        idx, ok = self._indices(current, want)
        if idx.numel() == 0 and ok and layer > 0 and not bool(fresh.any()):
            return idx  # the run ends here
        if idx.numel() == 0 or not ok:
            raise ActiveSetError(
                f"layer {layer}: active positions must be a non-empty, sorted subset of "
                f"{'the input' if layer == 0 else f'layer {layer - 1}'}'s (a token's hidden "
                "state comes from the layer below)")
        if idx.numel() == current.numel():
            return None
        if layer == 0:
            raise ActiveSetError("layer 0 must run every input token")
        dropped = torch.ones_like(fresh)
        dropped[idx] = False
        if bool((dropped & fresh).any()):
            raise ActiveSetError("new tokens (fresh: outside the cache's context) must be active "
                                 "at every layer: they have no cached K/V to fall back on")
        return idx

    def _stored(self, layer: int, current: torch.Tensor, want) -> torch.Tensor | None:
        """(N,) bool: which active tokens store their K/V at this layer (None: all)."""
        if want is None:
            return None
        idx, ok = self._indices(current, want)
        if not ok:
            raise ActiveSetError(f"layer {layer}: write positions must be a sorted subset of the "
                                 "layer's active positions (only a computed token has K/V)")
        store = torch.zeros_like(current, dtype=torch.bool)
        store[idx] = True
        return store

    # ------------------------------------------------------------------ prefill & realign

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor, positions: torch.Tensor | None = None, *,
                want_queries: bool = False, observe: Observer | None = None,
                logits: str = "last", seq_len: int | None = None) -> "PrefillResult":
        """Prefill one segment from an empty cache (positions default to 0..T-1).

        Returns the pre-RoPE keys and the values per layer (what packs store), the pre-RoPE
        queries on request, the filled (rotated) cache and the logits. `seq_len`: the RoPE
        length (default the largest position + 1, as transformers computes it).
        """
        ids = torch.as_tensor(ids, dtype=torch.long)
        if positions is None:
            positions = torch.arange(ids.numel())
        capture = LayerCapture(want_queries=want_queries)
        cache = self.empty_cache(reserve=ids.numel(), seq_len=seq_len)
        out = self.forward(ids, positions, cache, capture=capture, observe=observe, logits=logits)
        return PrefillResult(capture.keys, capture.values,
                             capture.queries if want_queries else None, cache, out.logits,
                             positions.to(self.device, torch.long))

    def realign(self, keys: torch.Tensor, positions: torch.Tensor, seq_len: int | None = None):
        """Pre-RoPE keys (..., T, D) → rotated to target positions (T,) (A3 Eq. 2)."""
        return self.rope.rotate(keys, positions.to(keys.device), seq_len)

    def dense_cache(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                    positions: torch.Tensor, reserve: int = 0, seq_len: int | None = None, *,
                    extent: "Extent | torch.Tensor | None" = None) -> KVCache:
        """A cache from pre-RoPE keys (Hkv, T, D) and values, realigned to `positions`.

        extent: the positions its context covers (default `positions`; anything outside is
        fresh text a forward inserts). seq_len: the request's one RoPE length, default the
        extent's end + `reserve` (the tokens the request will add).
        """
        positions = positions.to(self.device, torch.long)
        extent = _extent(extent, positions)
        seq_len = seq_len or extent.end + reserve
        return KVCache([DenseKV(self.realign(k, positions, seq_len), v, positions, reserve)
                        for k, v in zip(keys, values)], extent, seq_len)

    def ragged_cache(self, keys: list[list[torch.Tensor]], values: list[list[torch.Tensor]],
                     positions: list[list[torch.Tensor]], reserve: int = 0,
                     seq_len: int | None = None, *,
                     extent: "Extent | torch.Tensor | None" = None) -> KVCache:
        """A ragged cache: per layer, per KV head, pre-RoPE keys (n_h, D) at their positions.

        extent: the context's positions — pass it when some position no head kept is still
        context (default: every position some head holds). seq_len: as in `dense_cache`.
        """
        extent = _extent(extent, torch.cat([p.cpu() for ps in positions for p in ps]))
        seq_len = seq_len or extent.end + reserve
        return KVCache([RaggedKV([self.realign(k, p, seq_len) for k, p in zip(ks, ps)], vs, ps,
                                 reserve) for ks, vs, ps in zip(keys, values, positions)],
                       extent, seq_len)


def _extent(extent, held: torch.Tensor) -> Extent:
    if isinstance(extent, Extent):
        return extent
    return Extent.of(held if extent is None else torch.as_tensor(extent))


@dataclass
class PrefillResult:
    keys: list[torch.Tensor]               # per layer (Hkv, T, D), pre-RoPE
    values: list[torch.Tensor]             # per layer (Hkv, T, D)
    queries: list[torch.Tensor] | None     # per layer (Hq, T, D), pre-RoPE
    cache: KVCache                         # rotated at the prefill positions
    logits: torch.Tensor | None
    positions: torch.Tensor


def _rows(n: int) -> str:
    """'1 row', '2 rows': a pass's row count, as `auto_decode_weights` says it."""
    return f"{n} row" + "s" * (n > 1)
