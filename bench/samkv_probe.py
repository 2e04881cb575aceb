"""Does SamKV's block selection find the block that answers the question? (docs/reuse.md)

    python bench/samkv_probe.py --questions 8 --doc-tokens 1500

On `multidoc-facts` prompts (3 documents, one pack each), for every question whose answer
string occurs in one document, the rank (0 = best) of the 64-token block holding the answer:
- per SamKV scoring variant, over that document's blocks, mean over layers 2..L−1:
  `summary·Q_que` (the strategy: pre-RoPE block summaries · the question's pooled generic
  query), `summary·Q_last` (the question's last token instead of the pool),
  `tokens·Q_que (attention)` (softmax attention of every question query over the document's
  pre-RoPE keys, summed per block — what summaries approximate);
- per layer, the block's rank among all blocks of the prompt under the true attention of the
  question in the composed prompt (keys realigned, post-RoPE, causal; 64-token windows of the
  prompt): what any selection from question attention could reach at that layer.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

import click
import torch

BLOCK = 64


def answer_token(tok, token_ids: list[int], answer: str) -> int | None:
    """Index of the token that completes the first occurrence of `answer`, or None."""
    if answer not in tok.decode(token_ids):
        return None
    lo, hi = 0, len(token_ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if answer in tok.decode(token_ids[:mid + 1]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def rank(scores: torch.Tensor, block: int) -> int:
    return int((scores > scores[block]).sum())


@click.command()
@click.option("--questions", default=8, show_default=True)
@click.option("--doc-tokens", default=1500, show_default=True)
@click.option("--model", default="smollm2-135m-instruct", show_default=True)
def main(questions, doc_tokens, model):
    from kvedge.bench.datasets import load_items
    from kvedge.bench.suites import Bench
    from kvedge.common.model.runtime import LayerCapture
    from kvedge.edge.strategies import get_strategy
    from kvedge.edge.strategies import samkv as S
    from kvedge.edge.strategies.base import assemble_cache

    bench = Bench(model, doc_tokens=doc_tokens, breakdown=None)
    rt, tok = bench.engine.rt, bench.engine.tok
    strategy = get_strategy("samkv")
    items = load_items("multidoc-facts", "reuse", 3, questions, 0, tok, doc_tokens)
    variants: dict[str, list[float]] = {"summary·Q_que": [], "summary·Q_last": [],
                                        "tokens·Q_que (attention)": []}
    per_layer: list[list[int]] = []
    summary_layers: list[list[int]] = []  # summary·Q_que's rank per layer
    for item in items:
        segments = [bench.load(path) for doc in item.documents
                    for path, _ in bench.pack_files(doc, False)]
        for q in item.questions:
            composed = bench.engine.compose(segments, q.text, q.instruction)
            found = [(i, answer_token(tok, s.token_ids, q.answers[0]))
                     for i, s in enumerate(composed.segments)]
            found = [(i, t) for i, t in found if t is not None]
            if not found:
                continue
            doc, at = found[0]
            seg, block = composed.segments[doc], found[0][1] // BLOCK
            docs = [strategy.regions(s, o) for s, o in zip(composed.segments, composed.offsets)]
            # the strategy's generic-query pass, keeping every question query
            small = replace(composed, segments=S.sparse_segments(
                composed, docs, [d.fixed[None].expand(rt.n_layers, -1) for d in docs]))
            fresh = composed.fresh_positions()
            cache = assemble_cache(rt, small, reserve=fresh.numel(), seq_len=composed.seq_len(32))
            capture = LayerCapture(want_queries=True)
            rt.forward(torch.tensor(composed.all_ids())[fresh], fresh, cache, capture=capture,
                       logits="none")
            layers = range(2, rt.n_layers)
            pooled = torch.stack([x.float().mean(1) for x in capture.queries])
            last = torch.stack([x[:, -1].float() for x in capture.queries])
            summaries = S.summaries_of(seg)
            for name, query in (("summary·Q_que", pooled), ("summary·Q_last", last)):
                s = S.block_scores(query, summaries, rt.group)
                variants[name].append(statistics.mean(rank(s[layer], block) for layer in layers))
                if name == "summary·Q_que":
                    summary_layers.append([rank(s[layer], block) for layer in layers])
            ranks = []
            for layer in layers:
                s = torch.zeros(docs[doc].n_blocks)
                for h in range(seg.n_kv_heads):
                    keys = seg.keys[layer][h].float()
                    qh = capture.queries[layer].view(seg.n_kv_heads, rt.group, -1,
                                                     rt.head_dim)[h].float()
                    p = torch.softmax(torch.einsum("gqd,nd->gqn", qh, keys) * rt.scale, -1)
                    s.index_add_(0, seg.ranks(layer, h) // BLOCK, p.sum((0, 1)))
                ranks.append(rank(s, block))
            variants["tokens·Q_que (attention)"].append(statistics.mean(ranks))
            per_layer.append(true_attention_ranks(rt, composed, composed.offsets[doc] + at))
            click.echo(f"{q.text[:60]:60s} doc {doc} block {block}/{docs[doc].n_blocks}: "
                       + ", ".join(f"{k} {v[-1]:.1f}" for k, v in variants.items()))
    n_blocks = sum(-(-s.n_tokens // BLOCK) for s in segments)
    click.echo(f"\n{len(per_layer)} questions; mean rank of the answer block in its document "
               "(0 = first):")
    for name, values in variants.items():
        click.echo(f"  {name:28s} {statistics.mean(values):.1f}")
    click.echo("summary·Q_que per layer (2..L−1), rank in the document:")
    click.echo("  " + " ".join(f"{statistics.mean(r[i] for r in summary_layers):.0f}"
                               for i in range(len(summary_layers[0]))))
    click.echo(f"true attention in the composed prompt, rank among ~{n_blocks} blocks, "
               "per layer (0..L−1):")
    click.echo("  " + " ".join(f"{statistics.mean(r[i] for r in per_layer):.0f}"
                               for i in range(len(per_layer[0]))))


def true_attention_ranks(rt, composed, answer_pos: int) -> list[int]:
    """Per layer: the answer block's rank under the question's attention (post-RoPE, causal)
    over every context block of the composed prompt."""
    from kvedge.edge.strategies.base import assemble_cache

    cache = assemble_cache(rt, composed, reserve=len(composed.question_ids) + 8)
    fresh = composed.fresh_positions()
    ranks: list[int] = []
    start, end = composed.n_prefix, composed.question_start

    def observe(layer, q, q_pos, cache_layer):
        scores = torch.zeros(-(-(end - start) // BLOCK))
        for g in cache_layer.heads():
            logits = torch.einsum("hgnd,htd->hgnt", q[g.kv_heads].float(), g.keys.float())
            logits = logits * rt.scale
            hidden = g.positions[None, None, None, :] > q_pos[None, None, :, None]
            p = torch.softmax(logits.masked_fill(hidden, float("-inf")), -1).sum((0, 1, 2))
            ctx = (g.positions >= start) & (g.positions < end)
            scores.index_add_(0, (g.positions[ctx] - start) // BLOCK, p[ctx])
        ranks.append(rank(scores, (answer_pos - start) // BLOCK))

    rt.forward(torch.tensor(composed.all_ids())[fresh], fresh, cache, observe=observe,
               logits="none")
    return ranks


if __name__ == "__main__":
    main()
