"""One answer's decode over preallocated buffers of fixed shape: every step runs the same
tensors through the same ops, so on CUDA the step is captured once as a graph and replayed
(issue 28; gpt-fast's static KV cache and CUDA graphs).

Why: on a GPU a decode step is launch- and Python-bound. On an H200 the runtime's bf16 step
took 15–20 ms with the GPU busy 2.3 ms of it, and transformers' own model over a `StaticCache`
went from 26.5 ms a step eager to 3.05 ms replayed as one CUDA graph (docs/gpu.md). The
runtime's caches grow per request and its step loops in Python over ragged head groups, which
a graph cannot capture; `StaticDecode` copies a started answer's cache once into fixed
buffers and steps there.

The layout, and the decisions behind it:
- **Buffers** k, v (L, Hkv, S, D) and `slot_pos` (L, Hkv, S): slot s of a head holds the
  rotated key and value of position `slot_pos[l, h, s]`. The cache's held rows fill each
  head's first slots (a ragged head holds fewer: its other slots stay empty); the answer's
  own tokens take slots `held`, `held` + 1, … (`held`: the most rows any head holds), the
  same slot for every head, so a step writes one index. S = held + the steps allowed
  (+ `WARMUP` slots a graph capture warms up in).
- **Masking by position, as the runtime does** (`kvedge.common.model.attention`): a query at
  p sees a slot when its position is ≤ p (and > p − window on a sliding-window layer). An
  empty slot's position is `EMPTY` (above any query), so one comparison hides it. A decode
  position inside the cached span (text between held segments) is masked the same way.
- **One row, one attention call per layer**: the Hq query heads are grouped by KV head as
  (1, Hkv, G, D) — G queries against each KV head's (S, D) keys — so SDPA runs once per
  layer, with no key expanded.
- **The step's inputs and outputs live in the object** (`token`, `pos`, `slot`, `logits`):
  a graph replays against those addresses; `pos` and `slot` advance inside the step.
- **Exactness**: the matmuls are the unpadded step's (one row); attention reads the same keys
  plus masked empty slots, which add exact zeros to the softmax but may change the order of
  its sums. So logits match `decode_step(..., row_multiple=1)` to float rounding, not bit
  for bit (tests/test_static_decode.py: ≤ 1e-5, the same greedy tokens) — the same standing
  as `--no-batch-invariant` decoding.
- **Scope**: one answer, greedy or sampled (the pick stays on the host: a served answer reads
  each token anyway to stream it), no drafts. The K/V of its tokens stay in these buffers
  until `hand_back()` writes them into the answer's own cache (each layer's heads at their
  positions, the extent grown), after which `decode_step` continues the answer as if every
  step had been its own, to float rounding. An answer that ends here is not handed back:
  nothing reads a finished answer's cache (a conversation's session cache stores the prompt's).
- **Served as graph decode for a lone answer** (`kvedge.edge.scheduler.Scheduler`,
  `graph_decode`, on by default on CUDA): while one answer alone decodes, the scheduler steps
  it here, replayed as a CUDA graph; when a second joins, it is handed back and the batched
  step takes both. On an H200 (random weights of Qwen2.5-0.5B's shape, bf16) `decode_step`
  (one row, unpadded) took 16.6 ms a token at 1.3K tokens of context and 16.3 at 8K, this
  step eager 14.5 / 14.8, and replayed as a graph 3.48 / 6.04 (4.8× / 2.7×). In fp32 the
  graph took 7.0 ms at 1.3K against 16.7, but 27.3 at 8K against 17.8: slower there (its
  masked fp32 attention over every slot), so an fp32 model serving long contexts on CUDA may
  do better without it.
- **Off on the CPU**: no graph there, and eager this step was level with the unpadded
  `decode_step` (SmolLM2, 1.3K: 66.5 against 66.0 ms, docs/serving.md), while the served CPU
  step drafts and is batch-invariant — a lone answer's tokens bit for bit those it gets in
  any batch. This step is neither (Exactness above). On CUDA that invariance is whatever
  the load-time probe finds for cuBLAS (`Runtime.decode_row_multiple`, the model's own
  weights included): steps pad to the least row multiple it found to hold, ROW_MULTIPLE
  where none did (`batch.row_multiple`); nobody has run that probe on a GPU yet.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvedge.common.errors import CacheError
from kvedge.common.model.attention import sdpa
from kvedge.common.model.decoding import Decoding
from kvedge.common.model.quant import linear
from kvedge.common.model.runtime import Runtime, rms_norm

EMPTY = torch.iinfo(torch.long).max  # an empty slot's position: no query reaches it
WARMUP = 3  # steps run before a graph is captured (their writes undone after)


class StaticDecode:
    """A started answer (`Decoding`) decoded in fixed buffers: `step()` runs `token` at
    `pos`, leaves the logits in `logits` and advances; `graph()` captures it on CUDA."""

    @torch.no_grad()
    def __init__(self, rt: Runtime, state: Decoding, steps: int | None = None):
        state.check_next_position()
        self.rt, self.state = rt, state
        steps = steps or max(1, state.max_new_tokens - state.picked)
        cache, dev = state.cache, rt.device
        heads = [g for layer in cache for g in layer.heads()]
        held = max((g.positions.numel() for g in heads), default=0)
        size = (rt.n_layers, rt.n_kv, held + steps + WARMUP)  # graph(): its warm-up's room
        self.k = torch.zeros(*size, rt.head_dim, dtype=rt.dtype, device=dev)
        self.v = torch.zeros_like(self.k)
        self.slot_pos = torch.full(size, EMPTY, dtype=torch.long, device=dev)
        for i, layer in enumerate(cache):
            for g in layer.heads():
                n = g.positions.numel()
                self.k[i, g.kv_heads, :n] = g.keys
                self.v[i, g.kv_heads, :n] = g.values
                self.slot_pos[i, g.kv_heads, :n] = g.positions.to(dev)
        self.inv_freq, self.scaling = rt.rope.frequencies(state.seq_len)
        self.inv_freq = self.inv_freq.to(dev)
        self.windows = [w.window for w in rt.layers]
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.p0, self.held = state.next_position(), held  # where the answer's tokens start
        self.pos = torch.full((1,), self.p0, dtype=torch.long, device=dev)
        self.slot = torch.full((1,), held, dtype=torch.long, device=dev)
        self.free = steps  # slots left for the answer's tokens (counted here: no sync)
        self.ran = 0  # tokens stepped (likewise): their K/V in slots held .. held + ran - 1
        self.spent = False  # handed back: the answer's cache holds what it ran
        self.logits = torch.zeros(rt.lm_head.shape[0], dtype=rt.dtype, device=dev)
        self._graph = None

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """`token` at `pos` through every layer, its K/V written at `slot`; the logits
        (vocab,) into `logits`; `pos` and `slot` advance. Fixed shapes, no host sync."""
        from kvedge.kernels.rope import apply_rotary, rope_cos_sin

        rt = self.rt
        cos, sin = rope_cos_sin(self.pos, self.inv_freq, self.scaling)   # (1, D)
        x = F.embedding(self.token, rt.embed)                           # (1, hidden)
        for i, w in enumerate(rt.decode_layers):
            q, k, v = rt.qkv(w, rms_norm(x, w.ln1, rt.eps))             # (H, 1, D)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            self.k[i].index_copy_(1, self.slot, k)
            self.v[i].index_copy_(1, self.slot, v)
            self.slot_pos[i].index_copy_(1, self.slot, self.pos.expand(rt.n_kv, 1))
            seen = self.slot_pos[i] <= self.pos                         # (Hkv, S)
            if self.windows[i] is not None:
                seen &= self.slot_pos[i] > self.pos - self.windows[i]
            attn = sdpa(q.view(1, rt.n_kv, rt.group, rt.head_dim), self.k[i][None],
                        self.v[i][None], attn_mask=seen[None, :, None],
                        scale=rt.scale)                                 # (1, Hkv, G, D)
            x = rt.post_attention(w, x, attn.reshape(1, -1))
        self.logits.copy_(linear(rms_norm(x, rt.final_norm, rt.eps), rt.decode_head)[0])
        self.pos.add_(1)
        self.slot.add_(1)
        return self.logits

    def graph(self) -> None:
        """Capture `step` as a CUDA graph; `advance` then replays it. The warm-up steps run
        on a side stream (as CUDA graphs ask) and their writes are undone, so the answer's
        buffers are as they were (the capture itself records the step without running it)."""
        if self.rt.device.type != "cuda":
            raise CacheError("CUDA graphs need the model on a CUDA device")
        saved = [t.clone() for t in (self.k, self.v, self.slot_pos, self.pos, self.slot)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        # "thread_local": the scheduler captures while other threads (an ask composing its
        # cache) may allocate and sync on the GPU. In the default "global" mode their calls
        # fail and invalidate the capture: on an H200, 24 lone answers beside a thread
        # allocating and syncing all failed (and so did that thread's call each time); with
        # this mode all 24 answered, the other thread unharmed. (A CUDA random draw in
        # another thread during a capture still raises; kvedge samples on the CPU.)
        with torch.cuda.graph(self._graph, capture_error_mode="thread_local"):
            self.step()
        for t, s in zip((self.k, self.v, self.slot_pos, self.pos, self.slot), saved):
            t.copy_(s)  # undo the warm-up steps

    def advance(self) -> int:
        """Run the answer's last picked token (one step, replayed if captured) and pick the
        next with the answer's own sampler; returns it."""
        state = self.state
        if self.spent:
            raise CacheError("static decode handed back: the answer's cache steps it now")
        if self.free == 0:
            raise CacheError(f"static decode full: {self.slot_pos.shape[-1] - WARMUP} slots")
        state.check_next_position()
        self.free -= 1
        self.token.fill_(state.token)
        if self._graph is not None:
            self._graph.replay()
        else:
            self.step()
        self.ran += 1
        return state.advance(self.logits)

    @torch.no_grad()
    def hand_back(self) -> None:
        """Write the K/V of every token this run stepped into the answer's own cache, each
        layer's heads at their positions (wherever they fall: after the held ones or in a gap
        between them), and add the positions to its extent — so `decode_step` continues the
        answer as if every step had been its own. The run is spent after it; one that ran
        nothing leaves the cache as it was. A failed write undoes the layers written before."""
        if self.spent:
            raise CacheError("static decode already handed back")
        self.spent = True
        if self.ran == 0:
            return
        cache, ran = self.state.cache, slice(self.held, self.held + self.ran)
        pos = torch.arange(self.p0, self.p0 + self.ran, device=self.rt.device)
        undo = []
        try:
            for i, layer in enumerate(cache):
                # buffer head h is the layer's KV head h: a dense layer's heads, or a ragged
                # layer's one-head groups (HeadGroup.kv_heads), as __init__ filled them
                undo.append(layer.append(pos, self.k[i, :, ran], self.v[i, :, ran]))
        except BaseException:
            for restore in reversed(undo):
                restore()
            raise
        cache.extent.add(pos)


def static_decode(rt: Runtime, state: Decoding, graph: bool = False):
    """Yield a started answer's tokens — the first, then one per step — decoded in fixed
    buffers (`StaticDecode`; `graph`: captured as a CUDA graph), until a stop token or the
    answer's token budget."""
    yield from state.fresh
    if state.finished:
        return
    run = StaticDecode(rt, state)
    if graph:
        run.graph()
    while not state.finished:
        yield run.advance()
