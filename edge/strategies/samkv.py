"""`samkv`: SamKV — Cao, Si, Zhang, Liu, "Sparse Attention Across Multiple-Context KV Cache"
(arXiv:2508.11661), Sec. 3: keep a few blocks of each retrieved document, recompute a few of
their tokens, answer over exactly the kept rows.

1. Generic query (Sec. 3.1, "Generate generic query vector"): the question (and any fresh
   text) is prefilled over the chat prefix plus each document's initial and local blocks only;
   the queries of the *user query* tokens, mean-pooled, are Q_que per layer and query head.
2. Personalized query (Sec. 3.1, Eq. 1): Q̂_i = Q_que + 1/(D−1) Σ_{j≠i} |cos(Q_que, Q_loc_j)|
   Q_loc_j, Q_loc_j being document j's local Q cache (the pack's pooled queries of its last 2
   blocks).
3. Dynamic top-P (Sec. 3.2, Eq. 2): per layer n, with s = ⟨Q̂_i, K̄_b⟩ over block means K̄_b
   ("each block is represented by the mean vector of its constituent token caches"),
   P_i^(n) = (s_max − s_anc)/(s_max − s_min) when s_min < s_anc < s_max, else 0; averaged over
   the stable layers N* (Eq. 3). Per layer, the top ⌈P_i M_i⌉ of document i's M_i middle
   blocks are candidates; "we normalize the inner products of all retrieved blocks across
   contexts before concatenating and comparing them" and keep "the total block count divided
   by the number of contexts" (Sec. 3.2, last paragraph). The initial block and the 2 local
   blocks (Sec. 4.1: block 64, 1 initial, 2 local) are kept at every layer.
4. Recombination (Sec. 3.3): the chosen tokens are recomputed at every layer where their
   block is kept. Rule 1: a token recomputed at layer n runs through every layer below n (and
   none above its deepest). Rule 2: at a layer where it is not recomputed, nothing of it is
   stored; its block, if not kept there, is padded in for the pass and removed after it.
   Write-back: overwrite, or fusion (Eq. 4) KV ← θ·new + (1−θ)·old, θ = cos(new, old).
5. The question is prefilled again over the final sparse cache (Sec. 3.3, last paragraph)
   and the answer decoded over exactly the kept rows: each layer's cache holds only them, so
   `kv_bytes` and `sequence_ratio` are what the answer really used.

Our copy of the paper has no Appendix A (N*, the anchor, the recompute rule). Where the text
is silent, the decision and why (each an option; measurements in docs/reuse.md):
- Keys (`rope=true`): the K cache as attention reads it — every key rotated to its position
  in the composed prompt — and post-RoPE queries at the question's positions. Sec. 3.2 calls
  s an attention score and Table 2 defines it as ⟨Q, K⟩ of the caches; both are post-RoPE in
  the model. The mean is taken over the rotated keys, so by bilinearity s_b is the mean
  attention logit between the pooled question tokens and block b's tokens. `rope=false`: the
  pack's pre-RoPE block means (no key read beyond the kept blocks; issue 13's first version).
  A pack stores its local query pooled pre-RoPE, so Q_loc_j is rotated once, at the centre of
  document j's local blocks (a mean of rotated queries cannot be rebuilt from it).
- Positions scored (`adjacent`, default off): with `rope`, a document's keys are rotated to
  their composed positions, so every block of an early document is thousands of positions
  from the question, and RoPE's long-range decay lowers its logits: on SmolLM2 the score
  preferred blocks near the question (docs/reuse.md). `adjacent` rotates each document as if
  it ended where the question starts — the distance its own cache had to a question asked
  of it alone. The paper does not say which positions its caches carry. Measured (SmolLM2,
  docs/reuse.md "SamKV per the paper"): it ranks the answer's block at the 43rd percentile
  on average (the default: ~70th, worse than chance), yet answers 0 of 100 multidoc-facts
  questions against the default's 4 and recompute's 57, so it stays off.
- Heads (`heads`): Eq. 2 and Fig. 5 select per layer, so a layer's KV heads share one
  selection; s is the scaled logit ⟨q, k⟩/√d averaged over query heads ("mean", every head a
  vote of the same unit) or its maximum ("max", a block one head looks at is kept).
- User query tokens (`query`): the question text only ("question"), from the composed
  prompt's `query` span — not the "Question:" label, the instruction or the chat header,
  which are template, not user query; "all" pools every fresh token (issue 13's choice).
- Shared normalization: one min–max over every candidate of every document at the layer,
  (s − min_C)/(max_C − min_C). Per-document min–max (issue 13's choice) scores each
  document's best block 1.0, so the cut could not tell which document matters; a shared one
  is monotone, so the cut ranks the candidates' raw scores across documents. The cut keeps
  ⌈|C|/D⌉ of the |C| candidates ("total block count / D" read as the candidates' count: all
  middle blocks / D keeps a third of every document at D = 3, far from the paper's 15 %
  sequence ratio). `cut=false` keeps every candidate.
- N* (`stable_from`, `stable_to`): the paper's layer set is in its missing appendix. Measured
  on 11 held-in HotpotQA questions (`bench/samkv_probe.py --diagnostic ranks --task
  hotpot-fixed --seed 1`, docs/reuse.md "SamKV per the paper"), SmolLM2-135M: at no layer
  does the block score rank the answer's block better than chance (percentile 0.63–0.78,
  0.5 = chance), while the question's true attention mostly does from layer 3 on (0.34–0.55)
  and not at layers 0–2 (0.57–0.74). No subset is measurably better, so N* stays layers 2..last
  (0–1 attend positionally) and `score_layer` (≥ 0: every layer selects by that layer's
  scores) stays −1, each layer by its own, the paper's reading.
- Anchor s_anc: the mean score of the initial and local blocks.
- Recompute set: the top `ratio` × (context tokens) tokens by attention from Q̂_i, a softmax
  per layer and KV head over the document's kept rows, summed over query heads and averaged
  over N* — which covers "high attention in the initial/local positions" and "in the original
  context" with one score; the budget is split over documents by their length.
- The recombined token's own query uses its fresh K/V at every layer it runs (the runtime's
  rule); other tokens see the cached entry where it is not stored.
- θ of Eq. 4 is per (head, token) vector and clipped to [0, 1] (a negative cosine would
  extrapolate away from both).
Diagnostics (issue 30): `force_docs` keeps every block of the listed documents (by index in
the prompt) at every layer — an oracle for "does recombination answer once the gold paragraph
is kept?"; `select_blocks(rt, composed, q_que)` selects for any generic query, so a probe can
swap two questions' Q_que and check that the selection follows the question.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from kvedge.common.errors import InvalidOption
from kvedge.common.model.kvcache import KVCache, aligned, kept_rows
from kvedge.common.registry import option
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, assemble_cache
from kvedge.edge.strategies.registry import STRATEGIES

# --------------------------------------------------------------------------- the equations


def personalized_queries(q_que: torch.Tensor, q_loc: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """Eq. 1. q_que (L, Hq, D); q_loc[j] (L, Hq, D) or None (a pack without a local query
    adds no bias). |cos| per layer and query head; 1/(D−1) normalizes over the others, and
    D = 1 has no others (Q̂ = Q_que)."""
    n = len(q_loc)
    out = []
    for i in range(n):
        bias = torch.zeros_like(q_que)
        for j, loc in enumerate(q_loc):
            if j != i and loc is not None:
                weight = F.cosine_similarity(q_que, loc, dim=-1).abs()[..., None]
                bias += weight * loc
        out.append(q_que + bias / (n - 1) if n > 1 else q_que.clone())
    return out


def top_p(s_anc: torch.Tensor, s_max: torch.Tensor, s_min: torch.Tensor) -> torch.Tensor:
    """Eq. 2, elementwise (per layer): (s_max − s_anc)/(s_max − s_min) if s_anc lies strictly
    between s_min and s_max, else 0."""
    inside = (s_anc > s_min) & (s_anc < s_max)
    span = torch.where(inside, s_max - s_min, torch.ones_like(s_max))
    return torch.where(inside, (s_max - s_anc) / span, torch.zeros_like(s_max))


def consolidated_p(p_layers: torch.Tensor, stable: list[int]) -> float:
    """Eq. 3: the mean of the layer-wise P over the stable layers N*."""
    return float(p_layers[stable].mean()) if stable else 0.0


def fuse(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Eq. 4: θ·new + (1−θ)·old with θ = cos(new, old) per (head, token) vector, in [0, 1]."""
    theta = F.cosine_similarity(new.float(), old.float(), dim=-1).clamp(0, 1)[..., None]
    return (theta * new.float() + (1 - theta) * old.float()).to(new.dtype)


def block_scores(q_hat: torch.Tensor, summaries: list[torch.Tensor], group: int,
                 scale: float = 1.0, heads: str = "mean") -> torch.Tensor:
    """s = ⟨Q̂, K̄_b⟩·scale per query head, then the mean (or max) over query heads: q_hat
    (L, Hq, D), summaries[l] (Hkv, nb, D) → (L, nb). Query head h reads KV head h // group
    (GQA)."""
    rows = []
    for layer, summ in enumerate(summaries):
        q = q_hat[layer].float().view(summ.shape[0], group, -1)
        s = torch.einsum("hgd,hbd->hgb", q, summ.float()).flatten(0, 1) * scale
        rows.append(s.amax(0) if heads == "max" else s.mean(0))
    return torch.stack(rows)


def shared_minmax(candidates: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """Sec. 3.2's normalization "across contexts": (score, doc, block) candidates of every
    document rescaled by one min–max, (s − min)/(max − min) — so a document whose blocks all
    score low stays low (a per-document min–max would give its best block 1.0)."""
    if not candidates:
        return []
    lo, hi = min(c[0] for c in candidates), max(c[0] for c in candidates)
    span = (hi - lo) or 1.0
    return [((score - lo) / span, doc, block) for score, doc, block in candidates]


# --------------------------------------------------------------------------- the strategy


@dataclass
class Regions:
    """One document's blocks: `fixed` (nb,) bool marks the initial and local blocks."""

    offset: int
    n_tokens: int
    block: int
    fixed: torch.Tensor

    @property
    def n_blocks(self) -> int:
        return self.fixed.numel()


@STRATEGIES.register
@dataclass
class SamKV(ReuseStrategy):
    ratio: float = option(0.15, 0.0, 1.0, "tokens recomputed: share of the context tokens")
    initial: int = option(1, 0, None, "initial blocks kept at every layer")
    local: int = option(2, 0, None, "local (last) blocks kept at every layer")
    stable_from: int = option(2, 0, None, "N* (Eq. 3): its first layer")
    stable_to: int = option(-1, -1, None, "N* (Eq. 3): its last layer (-1: the model's last)")
    p: float = option(-1.0, -1.0, 1.0, "fixed share of middle blocks (-1: Eq. 2–3's dynamic P)")
    cut: bool = option(True, help="cross-document cut: keep ⌈candidates / D⌉ blocks per layer")
    bias: bool = option(True, help="personalized bias (Eq. 1)")
    recombine: bool = option(True, help="recompute the chosen tokens (Sec. 3.3)")
    fusion: bool = option(True, help="write back by fusion (Eq. 4); false: overwrite")
    pad: bool = option(True, help="pad unkept blocks in during recombination (rule 2)")
    score_layer: int = option(-1, -1, None, "score blocks at this layer for every layer "
                              "(-1: each layer by its own scores, the paper's)")
    rope: bool = option(True, help="score post-RoPE keys and queries at their composed "
                        "positions (false: the pack's pre-RoPE block means)")
    adjacent: bool = option(False, help="score each document's keys as if it ended where "
                            "the question starts (within-document distances only; rope only)")
    heads: str = option("mean", help="a layer's block score over query heads: mean or max")
    query: str = option("question", help="tokens pooled into Q_que: question (the user's "
                        "query text) or all (label, instruction and chat header too)")
    force_docs: str = option("", help="diagnostic: documents (prompt indices, '+' or ',' "
                             "separated) whose every block is kept at every layer")

    name = "samkv"
    block_granular = True  # only the kept blocks of a pack are dequantized (issue 13)

    def __post_init__(self):
        super().__post_init__()
        for field, value, allowed in (("heads", self.heads, ("mean", "max")),
                                      ("query", self.query, ("question", "all"))):
            if value not in allowed:
                raise InvalidOption(f"'samkv' option {field!r} must be one of {allowed}, "
                                    f"got {value!r}")
        if not re.fullmatch(r"\s*(\d+\s*([+,\s]\s*\d+\s*)*)?", self.force_docs):
            raise InvalidOption(f"'samkv' option 'force_docs' must be document indices "
                                f"separated by '+' or ',', got {self.force_docs!r}")

    def forced(self) -> list[int]:
        return [int(i) for i in re.findall(r"\d+", self.force_docs)]

    def stable_layers(self, n_layers: int) -> list[int]:
        """N* (Eq. 3): layers stable_from..stable_to, clipped to the model."""
        last = n_layers - 1 if self.stable_to < 0 else min(self.stable_to, n_layers - 1)
        return list(range(min(self.stable_from, last), last + 1))

    # ------------------------------------------------------------------ plan
    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        docs = self.regions_of(composed)
        q_que = self.generic_query(rt, composed, docs, reserve)
        q_hat, kept = self.select_blocks(rt, composed, q_que, reserve)  # per doc (L, nb) bool
        chosen = self.recompute_set(rt, composed, docs, q_hat, kept, reserve) \
            if self.recombine else torch.empty(0, dtype=torch.long)
        cache = self.recombination(rt, composed, docs, kept, chosen, reserve)
        question = composed.question_positions()
        return Plan(cache, torch.tensor(composed.question_ids), question,
                    recomputed=int(chosen.numel()))

    def regions_of(self, composed: Composed) -> list["Regions"]:
        return [self.regions(seg, off) for seg, off in zip(composed.segments, composed.offsets)]

    def regions(self, seg, offset: int) -> Regions:
        block = seg.block_size
        nb = -(-seg.n_tokens // block)
        fixed = torch.zeros(nb, dtype=torch.bool)
        fixed[: self.initial] = True
        if self.local:
            fixed[max(nb - self.local, 0):] = True
        return Regions(offset, seg.n_tokens, block, fixed)

    # ------------------------------------------------------------------ Sec. 3.1
    def generic_query(self, rt, composed: Composed, docs: list[Regions],
                      reserve: int) -> torch.Tensor:
        """Q_que (L, Hq, D): the queries of the user query's tokens (`query`), prefilled over
        prefix + initial + local blocks, rotated to their positions (`rope`), mean-pooled."""
        from kvedge.common.model.runtime import LayerCapture

        fixed = [d.fixed[None].expand(rt.n_layers, -1) for d in docs]
        small = replace(composed, segments=sparse_segments(composed, docs, fixed))
        fresh, seq_len = composed.fresh_positions(), composed.seq_len(reserve)
        cache = assemble_cache(rt, small, reserve=fresh.numel(), seq_len=seq_len)
        capture = LayerCapture(want_queries=True)
        rt.forward(torch.tensor(composed.all_ids())[fresh], fresh, cache, capture=capture,
                   logits="none")
        pooled = composed.query_positions() if self.query == "question" \
            else composed.question_positions()
        pick = torch.isin(fresh, pooled)
        # scored against the packs' keys and query caches, which stay on the CPU: the
        # model's queries come off its device here (a no-op on a CPU runtime)
        return torch.stack([self.rotated(rt, q[:, pick].float(), fresh[pick], seq_len).mean(1)
                            for q in capture.queries]).cpu()

    def rotated(self, rt, x: torch.Tensor, positions: torch.Tensor, seq_len: int):
        """x (..., T, D) pre-RoPE as attention reads it at `positions` (`rope`), else as is."""
        return rt.realign(x, positions, seq_len) if self.rope else x

    def local_query(self, rt, seg, d: "Regions", seq_len: int) -> torch.Tensor | None:
        """Document j's local query (L, Hq, D): its pack's query cache of its last tokens,
        mean-pooled; rotated at their positions, or at the local blocks' centre where the
        pack stores them already pooled."""
        if not seg.query_cache:
            return None
        end = d.offset + d.n_tokens
        out = []
        for q in seg.query_cache:
            n = q.shape[1]
            at = torch.arange(end - n, end) if n > 1 else \
                torch.tensor([end - min(self.local * d.block, d.n_tokens) // 2])
            out.append(self.rotated(rt, q.float(), at, seq_len).mean(1))
        return torch.stack(out)

    def scored_at(self, composed: Composed, d: "Regions") -> "Regions":
        """Where document `d`'s keys (and local query) are rotated for scoring: its composed
        position, or with `adjacent` shifted to end where the question starts, so a block's
        distance to the question is its distance to its own document's end."""
        if not (self.adjacent and self.rope):
            return d
        return replace(d, offset=composed.question_start - d.n_tokens)

    def summaries(self, rt, seg, d: "Regions", seq_len: int) -> list[torch.Tensor]:
        """K̄_b per layer (Hkv, nb, D): the mean of each block's keys, rotated to their
        composed positions (`rope`; reads every key), else the pack's pre-RoPE means."""
        if not self.rope:
            return summaries_of(seg)
        from kvedge.common.pack.context import block_summaries

        out = []
        for layer in range(seg.n_layers):
            heads = []
            for h in range(seg.n_kv_heads):
                ranks = seg.ranks(layer, h)
                keys = seg.held_rows(layer, h, "k", torch.arange(ranks.numel())).float()
                keys = rt.realign(keys, ranks + d.offset, seq_len)
                heads.append(block_summaries(keys[None], ranks, d.n_tokens, d.block))
            out.append(torch.cat(heads))
        return out

    # ------------------------------------------------------------------ Sec. 3.2
    def select_blocks(self, rt, composed: Composed, q_que: torch.Tensor,
                      reserve: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(Q̂_i per document (Eq. 1), the blocks kept per document (L, nb) bool) for a
        generic query q_que (L, Hq, D) — any question's, for the swap diagnostic."""
        docs, seq_len = self.regions_of(composed), composed.seq_len(reserve)
        at = [self.scored_at(composed, d) for d in docs]
        q_loc = [self.local_query(rt, seg, d, seq_len) if self.bias else None
                 for seg, d in zip(composed.segments, at)]
        q_hat = personalized_queries(q_que, q_loc)
        scores = [block_scores(q, self.summaries(rt, seg, d, seq_len), rt.group, rt.scale,
                               self.heads)
                  for q, seg, d in zip(q_hat, composed.segments, at)]
        if self.score_layer >= 0:
            layer = min(self.score_layer, rt.n_layers - 1)
            scores = [s[layer: layer + 1].expand_as(s) for s in scores]
        kept = self.select(scores, docs, self.stable_layers(rt.n_layers))
        for i in self.forced():
            if i >= len(kept):
                raise InvalidOption(f"'samkv' option 'force_docs' names document {i}; the "
                                    f"prompt has {len(kept)} (0..{len(kept) - 1})")
            kept[i][:] = True
        return q_hat, kept

    def select(self, scores: list[torch.Tensor], docs: list[Regions],
               stable: list[int]) -> list[torch.Tensor]:
        """Per document (L, nb) bool: the blocks kept at each layer (Eq. 2–3, the cut)."""
        n_layers = scores[0].shape[0]
        shares = [self.share(s, d, stable) for s, d in zip(scores, docs)]
        kept = [d.fixed[None].repeat(n_layers, 1) for d in docs]
        for layer in range(n_layers):
            candidates = []  # (score, doc, block)
            for i, (s, d) in enumerate(zip(scores, docs)):
                middle = torch.nonzero(~d.fixed).flatten()
                take = math.ceil(shares[i] * middle.numel())
                if take == 0:
                    continue
                top = middle[torch.topk(s[layer, middle], take).indices]
                candidates += [(float(s[layer, b]), i, int(b)) for b in top]
            candidates = shared_minmax(candidates)
            if self.cut and len(docs) > 1:
                candidates = sorted(candidates, reverse=True)[: math.ceil(len(candidates)
                                                                         / len(docs))]
            for _, i, b in candidates:
                kept[i][layer, b] = True
        return kept

    def share(self, s: torch.Tensor, d: "Regions", stable: list[int]) -> float:
        """P_i: the fixed `p`, or Eq. 2 per layer averaged over N* (Eq. 3)."""
        middle = ~d.fixed
        if not bool(middle.any()):
            return 0.0
        if self.p >= 0:
            return self.p
        s_max, s_min = s[:, middle].max(1).values, s[:, middle].min(1).values
        s_anc = s[:, d.fixed].mean(1) if bool(d.fixed.any()) else s_min
        return consolidated_p(top_p(s_anc, s_max, s_min), stable)

    # ------------------------------------------------------------------ Sec. 3.3
    def recompute_set(self, rt, composed: Composed, docs: list[Regions],
                      q_hat: list[torch.Tensor], kept: list[torch.Tensor],
                      reserve: int) -> torch.Tensor:
        """Sorted composed positions of the tokens to recombine: per document its share of
        `ratio` × context tokens, the kept tokens Q̂_i attends to most over N*."""
        budget = round(self.ratio * composed.n_context)
        stable, seq_len = self.stable_layers(rt.n_layers), composed.seq_len(reserve)
        picks = []
        for seg, d, q, blocks in zip(composed.segments, docs, q_hat, kept):
            attn = torch.zeros(d.n_tokens)
            for layer in stable:
                for h in range(seg.n_kv_heads):
                    ranks = seg.ranks(layer, h)
                    rows = blocks[layer, ranks // d.block]
                    if not bool(rows.any()):
                        continue
                    qh = q[layer].view(seg.n_kv_heads, rt.group, -1)[h].float()  # (G, D)
                    keys = self.rotated(rt, seg.held_rows(layer, h, "k", rows).float(),
                                        ranks[rows] + d.offset, seq_len)
                    logits = keys @ qh.T * rt.scale
                    attn.index_add_(0, ranks[rows], torch.softmax(logits, 0).sum(1))
            share = min(round(budget * d.n_tokens / composed.n_context),
                        int((attn > 0).sum()))
            if share:
                picks.append(torch.topk(attn, share).indices + d.offset)
        return torch.sort(torch.cat(picks)).values if picks else torch.empty(0, dtype=torch.long)

    def recombination(self, rt, composed: Composed, docs: list[Regions],
                      kept: list[torch.Tensor], chosen: torch.Tensor, reserve: int) -> KVCache:
        """The sparse cache of the kept rows with the chosen tokens recombined (rules 1–2),
        and any fresh text between documents inserted; the question is not run here."""
        n_layers = rt.n_layers
        at = kept_at(chosen, docs, kept, n_layers)                   # (L, |R|) bool
        deepest = torch.where(at.any(0), n_layers - 1 - at.flip(0).int().argmax(0),
                              torch.full((chosen.numel(),), -1))
        chosen, at, deepest = chosen[deepest >= 0], at[:, deepest >= 0], deepest[deepest >= 0]
        rows = kept
        if self.pad:
            rows = [k | padding(chosen, deepest, at, d, n_layers) for k, d in zip(kept, docs)]
        tail = len(composed.question_ids) + reserve
        cache = assemble_cache(rt, replace(composed, segments=sparse_segments(composed, docs,
                                                                                 rows)),
                               reserve=tail + len(chosen), seq_len=composed.seq_len(reserve))
        question = composed.question_positions()
        fresh = composed.fresh_positions()
        texts = fresh[~torch.isin(fresh, question)]
        run = torch.sort(torch.cat([chosen, texts])).values
        if run.numel() == 0:
            return dense_where_aligned(cache, tail)
        is_text = torch.isin(run, texts)
        col = torch.searchsorted(chosen, run).clamp(max=max(chosen.numel() - 1, 0))
        depth = torch.full((run.numel(),), n_layers)         # fresh text: every layer
        store = torch.ones(n_layers, run.numel(), dtype=torch.bool)
        if chosen.numel():
            depth[~is_text] = deepest[col[~is_text]]
            store[:, ~is_text] = at[:, col[~is_text]]

        def active(layer, current):
            return run[depth >= layer]

        def write(layer, current):
            return run[(depth >= layer) & store[layer]]

        rt.forward(torch.tensor(composed.all_ids())[run], run, cache, active, write=write,
                   fuse=fuse if self.fusion else None, logits="none")
        if not self.pad:
            return dense_where_aligned(cache, tail)
        gone = [segment_positions(docs, [r & ~k for r, k in zip(
            [x[layer] for x in rows], [x[layer] for x in kept])]) for layer in range(n_layers)]
        return drop_rows(cache, gone, tail)


# --------------------------------------------------------------------------- helpers


def summaries_of(seg) -> list[torch.Tensor]:
    """Block summaries per layer (Hkv, nb, D): the pack's, or from the keys it holds."""
    if seg.block_summaries is not None:
        return seg.block_summaries
    from kvedge.common.pack.context import ragged_block_summaries

    return ragged_block_summaries(seg)


def sparse_segments(composed: Composed, docs: list[Regions], blocks: list[torch.Tensor]):
    """Each segment keeping, per (layer, head), only its rows in the blocks marked (L, nb)."""
    out = []
    for seg, d, keep in zip(composed.segments, docs, blocks):
        rows = [[held[keep[layer, seg.ranks(layer, h) // d.block]]
                 for h, held in enumerate(seg.kept_positions[layer])]
                for layer in range(seg.n_layers)]
        out.append(seg.select(rows))
    return out


def kept_at(chosen: torch.Tensor, docs: list[Regions], kept: list[torch.Tensor],
            n_layers: int) -> torch.Tensor:
    """(L, |R|) bool: whether each chosen token's block is kept at each layer."""
    out = torch.zeros(n_layers, chosen.numel(), dtype=torch.bool)
    for d, blocks in zip(docs, kept):
        mine = (chosen >= d.offset) & (chosen < d.offset + d.n_tokens)
        if bool(mine.any()):
            out[:, mine] = blocks[:, (chosen[mine] - d.offset) // d.block]
    return out


def padding(chosen: torch.Tensor, deepest: torch.Tensor, at: torch.Tensor, d: Regions,
            n_layers: int) -> torch.Tensor:
    """(L, nb) bool: the blocks of this document padded in at each layer — those of chosen
    tokens that run there (rule 1) without their block being kept (rule 2)."""
    pad = torch.zeros(n_layers, d.n_blocks, dtype=torch.bool)
    mine = (chosen >= d.offset) & (chosen < d.offset + d.n_tokens)
    for k in torch.nonzero(mine).flatten().tolist():
        block = (int(chosen[k]) - d.offset) // d.block
        for layer in range(int(deepest[k]) + 1):
            if not bool(at[layer, k]):
                pad[layer, block] = True
    return pad


def segment_positions(docs: list[Regions], blocks: list[torch.Tensor]) -> torch.Tensor:
    """Composed positions of the marked blocks (nb,) bool of each document."""
    out = [torch.arange(d.offset + b * d.block, d.offset + min((b + 1) * d.block, d.n_tokens))
           for d, mask in zip(docs, blocks) for b in torch.nonzero(mask).flatten().tolist()]
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long)


def dense_where_aligned(cache: KVCache, reserve: int) -> KVCache:
    """Every layer whose heads hold the same rows (SamKV's selection is per layer) made
    dense: decoding then makes one attention call per layer, not one per KV head."""
    return KVCache([aligned(layer, reserve) for layer in cache], cache.extent, cache.seq_len)


def drop_rows(cache: KVCache, gone: list[torch.Tensor], reserve: int) -> KVCache:
    """The cache without the positions gone[l] at layer l (the padding, after the pass)."""
    layers = [kept_rows(layer, [~torch.isin(g.positions, drop.to(g.positions.device))
                                for g in layer.heads()
                                for _ in range(g.keys.shape[0])], reserve)
              for layer, drop in zip(cache, gone)]
    return KVCache(layers, cache.extent, cache.seq_len)
