"""`samkv`: SamKV ("Sparse Attention Across Multiple-Context KV Cache", arXiv:2508.11661,
Sec. 3): keep a few blocks of each retrieved document, recompute a few of
their tokens, answer over exactly the kept rows.

1. Generic query (Sec. 3.1): the question (and any fresh text) is prefilled over the chat
   prefix plus each document's initial and local blocks only; its pre-RoPE queries, mean-pooled
   over the question tokens, are Q_que per layer and query head.
2. Personalized query (Eq. 1): Q̂_i = Q_que + 1/(D−1) Σ_{j≠i} |cos(Q_que, Q_loc_j)| Q_loc_j,
   Q_loc_j being document j's local query (the pack's pooled queries of its last 2 blocks).
3. Dynamic top-P (Eq. 2): per layer n, with s = ⟨Q̂_i, K̄_b⟩ over block summaries,
   P_i^(n) = (s_max − s_anc)/(s_max − s_min) when s_min < s_anc < s_max, else 0; averaged
   over the stable layers N* (Eq. 3). Per layer, the top ⌈P_i M_i⌉ of document i's M_i middle
   blocks by that layer's scores are candidates; scores are normalized per document and the
   cross-document cut keeps the best of all candidates (Sec. 3.2). The initial block and the
   2 local blocks are kept at every layer.
4. Recombination (Sec. 3.3): the chosen tokens are recomputed at every layer where their
   block is kept. Rule 1: a token recomputed at layer n runs through every layer below n (and
   none above its deepest). Rule 2: at a layer where it is not recomputed, nothing of it is
   stored; its block, if not kept there, is padded in for the pass and removed after it.
   Write-back: overwrite, or fusion (Eq. 4) KV ← θ·new + (1−θ)·old, θ = cos(new, old).
5. The question is prefilled again over the final sparse cache (the generic query saw only
   initial and local blocks) and the answer decoded over exactly the kept rows: each layer's
   cache holds only them, so `kv_bytes` and `sequence_ratio` are what the answer really used.

The paper's appendix (N*, the anchor score, the recompute rule, the normalization, "total
blocks / D") is missing from our copy. Decisions, each an option measured in docs/reuse.md:
- Scores are taken in pre-RoPE space (query and key summaries unrotated): packs store block
  summaries pre-RoPE, and a document's composed position is unknown at ingest.
- Block = the pack's block (64 tokens, the paper's); per layer, one selection shared by every
  KV head (scores summed over query heads), so a layer's kept rows are one set.
- N* (`stable_from`): every layer from the 3rd on — layers 0–1 attend almost uniformly and
  positionally (docs/codecs.md, "What the measurements say": layer 0 attends almost
  uniformly over 2K tokens), which is what "unstable" rules out.
- Anchor s_anc: the mean score of the initial and local blocks (the inner product with the
  mean of their summaries).
- Normalization across documents: min–max per document and layer, (s − s_min)/(s_max − s_min),
  the same quantities Eq. 2 uses; the cut keeps ⌈|C|/D⌉ of the |C| candidates of a layer
  ("the total block count divided by the number of contexts", read as the candidates' count:
  all middle blocks / D would keep a third of every document at D = 3, far from the paper's
  15 % sequence ratio). `cut=false` keeps every candidate.
- Recompute set: the top `ratio` × (context tokens) tokens by attention from Q̂_i, a softmax
  per layer and KV head over the document's kept rows, summed over query heads and averaged
  over N* — which covers "high attention in the initial/local positions" and "in the original
  context" with one score; the budget is split over documents by their length.
- The recombined token's own query uses its fresh K/V at every layer it runs (the runtime's
  rule); other tokens see the cached entry where it is not stored.
- θ of Eq. 4 is per (head, token) vector and clipped to [0, 1] (a negative cosine would
  extrapolate away from both).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

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


def block_scores(q_hat: torch.Tensor, summaries: list[torch.Tensor], group: int) -> torch.Tensor:
    """⟨Q̂, K̄_b⟩ summed over query heads: q_hat (L, Hq, D), summaries[l] (Hkv, nb, D) →
    (L, nb). Query head h reads KV head h // group (GQA)."""
    rows = []
    for layer, summ in enumerate(summaries):
        q = q_hat[layer].float().view(summ.shape[0], group, -1)
        rows.append(torch.einsum("hgd,hbd->b", q, summ.float()))
    return torch.stack(rows)


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
    stable_from: int = option(2, 0, None, "N*: the layers from this one on (Eq. 3)")
    p: float = option(-1.0, -1.0, 1.0, "fixed share of middle blocks (-1: Eq. 2–3's dynamic P)")
    cut: bool = option(True, help="cross-document cut: keep ⌈candidates / D⌉ blocks per layer")
    bias: bool = option(True, help="personalized bias (Eq. 1)")
    recombine: bool = option(True, help="recompute the chosen tokens (Sec. 3.3)")
    fusion: bool = option(True, help="write back by fusion (Eq. 4); false: overwrite")
    pad: bool = option(True, help="pad unkept blocks in during recombination (rule 2)")
    score_layer: int = option(-1, -1, None, "score blocks at this layer for every layer "
                              "(-1: each layer by its own scores, the paper's)")

    name = "samkv"
    block_granular = True  # only the kept blocks of a pack are dequantized (issue 13)

    # ------------------------------------------------------------------ plan
    def plan(self, rt, composed: Composed, reserve: int) -> Plan:
        docs = [self.regions(seg, off) for seg, off in zip(composed.segments, composed.offsets)]
        stable = list(range(min(self.stable_from, rt.n_layers - 1), rt.n_layers))
        q_que = self.generic_query(rt, composed, docs, reserve)
        q_loc = [local_query(seg) if self.bias else None for seg in composed.segments]
        q_hat = personalized_queries(q_que, q_loc)
        scores = [block_scores(q, summaries_of(seg), rt.group)
                  for q, seg in zip(q_hat, composed.segments)]
        if self.score_layer >= 0:
            layer = min(self.score_layer, rt.n_layers - 1)
            scores = [s[layer: layer + 1].expand_as(s) for s in scores]
        kept = self.select(scores, docs, stable)                      # per doc (L, nb) bool
        chosen = self.recompute_set(rt, composed, docs, q_hat, kept, stable) \
            if self.recombine else torch.empty(0, dtype=torch.long)
        cache = self.recombination(rt, composed, docs, kept, chosen, reserve)
        question = composed.question_positions()
        return Plan(cache, torch.tensor(composed.question_ids), question,
                    recomputed=int(chosen.numel()))

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
        """Q_que (L, Hq, D): the question's pre-RoPE queries over prefix + initial + local
        blocks, mean-pooled over the question tokens."""
        from kvedge.common.model.runtime import LayerCapture

        fixed = [d.fixed[None].expand(rt.n_layers, -1) for d in docs]
        small = replace(composed, segments=sparse_segments(composed, docs, fixed))
        fresh = composed.fresh_positions()
        cache = assemble_cache(rt, small, reserve=fresh.numel(),
                               seq_len=composed.seq_len(reserve))
        capture = LayerCapture(want_queries=True)
        rt.forward(torch.tensor(composed.all_ids())[fresh], fresh, cache, capture=capture,
                   logits="none")
        is_q = torch.isin(fresh, composed.question_positions())
        return torch.stack([q[:, is_q].float().mean(1) for q in capture.queries])

    # ------------------------------------------------------------------ Sec. 3.2
    def select(self, scores: list[torch.Tensor], docs: list[Regions],
               stable: list[int]) -> list[torch.Tensor]:
        """Per document (L, nb) bool: the blocks kept at each layer (Eq. 2–3, the cut)."""
        n_layers = scores[0].shape[0]
        shares, stats = [], []
        for s, d in zip(scores, docs):
            middle = ~d.fixed
            if not bool(middle.any()):
                shares.append(0.0)
                stats.append(None)
                continue
            s_mid = s[:, middle]
            s_max, s_min = s_mid.max(1).values, s_mid.min(1).values
            s_anc = s[:, d.fixed].mean(1) if bool(d.fixed.any()) else s_min
            shares.append(self.p if self.p >= 0 else
                          consolidated_p(top_p(s_anc, s_max, s_min), stable))
            stats.append((s_min, s_max))
        kept = [d.fixed[None].repeat(n_layers, 1) for d in docs]
        for layer in range(n_layers):
            candidates = []  # (normalized score, doc, block)
            for i, (s, d) in enumerate(zip(scores, docs)):
                middle = torch.nonzero(~d.fixed).flatten()
                take = math.ceil(shares[i] * middle.numel())
                if take == 0:
                    continue
                top = middle[torch.topk(s[layer, middle], take).indices]
                s_min, s_max = (t[layer] for t in stats[i])
                span = float(s_max - s_min) or 1.0
                candidates += [(float(s[layer, b] - s_min) / span, i, int(b)) for b in top]
            if self.cut and len(docs) > 1:
                candidates = sorted(candidates, reverse=True)[: math.ceil(len(candidates)
                                                                         / len(docs))]
            for _, i, b in candidates:
                kept[i][layer, b] = True
        return kept

    # ------------------------------------------------------------------ Sec. 3.3
    def recompute_set(self, rt, composed: Composed, docs: list[Regions],
                      q_hat: list[torch.Tensor], kept: list[torch.Tensor],
                      stable: list[int]) -> torch.Tensor:
        """Sorted composed positions of the tokens to recombine: per document its share of
        `ratio` × context tokens, the kept tokens Q̂_i attends to most over N*."""
        budget = round(self.ratio * composed.n_context)
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
                    logits = seg.held_rows(layer, h, "k", rows).float() @ qh.T * rt.scale
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


def local_query(seg) -> torch.Tensor | None:
    """Document j's local query (L, Hq, D): its pack's query cache, mean-pooled."""
    if not seg.query_cache:
        return None
    return torch.stack([q.float().mean(1) for q in seg.query_cache])


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
    layers = [kept_rows(layer, [~torch.isin(g.positions, drop) for g in layer.heads()
                                for _ in range(g.keys.shape[0])], reserve)
              for layer, drop in zip(cache, gone)]
    return KVCache(layers, cache.extent, cache.seq_len)
