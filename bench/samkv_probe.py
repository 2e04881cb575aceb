"""SamKV's stages, one diagnostic each (docs/reuse.md, "SamKV per the paper", issue 30).

    python bench/samkv_probe.py --diagnostic ranks --task hotpot-fixed --seed 1 --questions 12
    python bench/samkv_probe.py --diagnostic oracle --task hotpot-fixed --questions 30
    python bench/samkv_probe.py --diagnostic swap --task multidoc-facts --lengths 3

- `ranks` (selection, per layer — how N* and `score_layer` were chosen): the percentile
  (0 = scored highest, 0.5 = chance) of the block holding the answer string among every
  block of the prompt, under the strategy's block scores at each layer; and, as a ceiling,
  its rank under the question's true attention in the composed prompt.
- `oracle` (recombination): F1 and sequence ratio of recompute, samkv, and samkv with the
  gold documents forced whole into the kept set (`force_docs`): if the oracle answers, the
  padding/recombination path works and the loss is the selection's.
- `swap` (query): pairs of questions; the share of the first question's gold-document
  blocks kept (over layers, middle blocks only) when its prompt is selected with its own
  generic query and with the other question's: a selection that follows the question keeps
  more of its gold document with its own query.
`--options` passes samkv options (`rope=false,query=all` is issue 13's scoring).
"""
from __future__ import annotations

import statistics

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


def percentile(scores: torch.Tensor, block: int) -> float:
    return float((scores > scores[block]).sum()) / max(scores.numel() - 1, 1)


def parse_options(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(",") if pair)


def items_of(task, length, questions, seed, tok, doc_tokens):
    from kvedge.bench.datasets import load_items
    from kvedge.bench.real import HOTPOT_FIXED

    if task == HOTPOT_FIXED:
        from kvedge.bench.real.hotpotqa import hotpot_fixed_items

        return hotpot_fixed_items(length, questions, seed)
    return load_items(task, "reuse", length, questions, seed, tok, doc_tokens)


def gold_docs(tok, composed, item, q) -> list[int]:
    """The question's gold documents: HotpotQA's supporting paragraphs (by title), else the
    documents holding the answer string."""
    titled = [i for i, doc in enumerate(item.documents)
              if doc.split("\n", 1)[0] in q.needed_docs]
    if titled:
        return titled
    return [i for i, s in enumerate(composed.segments)
            if answer_token(tok, s.token_ids, q.answers[0]) is not None]


def prompts(bench, items):
    """(item, question, composed) for every question; one pack per document."""
    for item in items:
        segments = [ctx for doc in item.documents for ctx, _ in bench.packs(doc, False)]
        for q in item.questions:
            yield item, q, bench.engine.compose(segments, q.text, q.instruction)


@click.command()
@click.option("--diagnostic", "diagnostics", type=click.Choice(["ranks", "oracle", "swap"]),
              multiple=True, default=["ranks"], show_default=True, help="repeatable")
@click.option("--task", default="multidoc-facts", show_default=True)
@click.option("--lengths", "length", default=3, show_default=True,
              help="documents per prompt (hotpot-fixed: paragraphs)")
@click.option("--questions", default=8, show_default=True)
@click.option("--seed", default=0, show_default=True, help="item seed (tuning: use 1)")
@click.option("--doc-tokens", default=1500, show_default=True, help="multidoc-facts only")
@click.option("--options", default="", help="samkv options, k=v comma list")
@click.option("--model", default="smollm2-135m-instruct", show_default=True)
def main(diagnostics, task, length, questions, seed, doc_tokens, options, model):
    from kvedge.bench.suites import Bench

    bench = Bench(model, doc_tokens=doc_tokens if task == "multidoc-facts" else None,
                  breakdown=None)
    items = items_of(task, length, questions, seed, bench.engine.tok, doc_tokens)
    asked = list(prompts(bench, items))
    for name in diagnostics:
        {"ranks": ranks, "oracle": oracle, "swap": swap}[name](bench, asked,
                                                              parse_options(options))


def ranks(bench, asked, options):
    from kvedge.edge.strategies import get_strategy
    from kvedge.edge.strategies.samkv import block_scores

    rt, tok = bench.engine.rt, bench.engine.tok
    strategy = get_strategy("samkv", options)
    mine: list[list[float]] = []
    true: list[list[float]] = []
    for item, q, composed in asked:
        found = [(i, answer_token(tok, s.token_ids, q.answers[0]))
                 for i, s in enumerate(composed.segments)]
        found = [(i, t) for i, t in found if t is not None]
        if not found:
            continue
        doc, at = found[0]
        docs = strategy.regions_of(composed)
        block = sum(d.n_blocks for d in docs[:doc]) + at // BLOCK
        q_que = strategy.generic_query(rt, composed, docs, 32)
        q_hat, _ = strategy.select_blocks(rt, composed, q_que, 32)
        seq_len = composed.seq_len(32)
        scores = torch.cat([block_scores(qh, strategy.summaries(
                                             rt, s, strategy.scored_at(composed, d), seq_len),
                                         rt.group, rt.scale, strategy.heads)
                            for qh, s, d in zip(q_hat, composed.segments, docs)], dim=1)
        mine.append([percentile(scores[layer], block) for layer in range(rt.n_layers)])
        true.append(true_attention(rt, composed, composed.offsets[doc] + at))
        click.echo(f"{q.text[:60]:60s} doc {doc} block {block}/{scores.shape[1]}: "
                   f"mean percentile {statistics.mean(mine[-1]):.2f}")
    click.echo(f"\n{len(mine)} questions with the answer string in a document; percentile of "
               "its block among the prompt's blocks (0 = first, 0.5 = chance), per layer:")
    for name, rows in (("samkv scores", mine), ("true attention", true)):
        click.echo(f"  {name:15s} " + " ".join(f"{statistics.mean(r[i] for r in rows):.2f}"
                                                for i in range(len(rows[0]))))


def true_attention(rt, composed, answer_pos: int) -> list[float]:
    """Per layer: the answer block's percentile under the question's attention (post-RoPE,
    causal) over every 64-token window of the composed prompt's context."""
    from kvedge.edge.strategies.base import assemble_cache

    cache = assemble_cache(rt, composed, reserve=len(composed.question_ids) + 8)
    fresh = composed.fresh_positions()
    out: list[float] = []
    start, end = composed.n_prefix, composed.question_start

    def observe(layer, q, q_pos, cache_layer):
        scores = torch.zeros(-(-(end - start) // BLOCK))
        for g in cache_layer.heads():
            logits = torch.einsum("hgnd,htd->hgnt", q[g.kv_heads].float(), g.keys.float())
            hidden = g.positions[None, None, None, :] > q_pos[None, None, :, None]
            p = torch.softmax((logits * rt.scale).masked_fill(hidden, float("-inf")), -1)
            ctx = (g.positions >= start) & (g.positions < end)
            scores.index_add_(0, (g.positions[ctx] - start) // BLOCK, p.sum((0, 1, 2))[ctx])
        out.append(percentile(scores, (answer_pos - start) // BLOCK))

    rt.forward(torch.tensor(composed.all_ids())[fresh], fresh, cache, observe=observe,
               logits="none")
    return out


def oracle(bench, asked, options):
    from kvedge.bench.cell_summary import scored
    from kvedge.edge.strategies import get_strategy

    rows: dict[str, list[dict]] = {"recompute": [], "samkv": [], "samkv + gold forced": []}
    for item, q, composed in asked:
        gold = gold_docs(bench.engine.tok, composed, item, q)
        budget = bench.new_tokens(q)
        for name, strategy in (
                ("recompute", get_strategy("recompute")),
                ("samkv", get_strategy("samkv", options)),
                ("samkv + gold forced", get_strategy(
                    "samkv", {**options, "force_docs": "+".join(map(str, gold))}))):
            *_, stats = bench.engine.answer(composed, strategy, budget)
            rows[name].append(scored(stats, q, budget))
        click.echo(f"{q.text[:50]:50s} gold {gold}: " + ", ".join(
            f"{k} {v[-1]['f1']:.2f}" for k, v in rows.items()))
    click.echo(f"\n{len(asked)} questions:")
    for name, r in rows.items():
        click.echo(f"  {name:20s} F1 {statistics.mean(x['f1'] for x in r):.3f}  sequence ratio "
                   f"{statistics.mean(x['sequence_ratio'] for x in r):.2f}")


def swap(bench, asked, options):
    from kvedge.edge.strategies import get_strategy

    rt, tok = bench.engine.rt, bench.engine.tok
    strategy = get_strategy("samkv", options)
    own_share, swapped_share, overlap = [], [], []
    for (item, q, a), (_, _, b) in zip(asked[::2], asked[1::2]):
        docs = strategy.regions_of(a)
        gold = gold_docs(tok, a, item, q)
        q_a = strategy.generic_query(rt, a, docs, 32)
        q_b = strategy.generic_query(rt, b, strategy.regions_of(b), 32)
        _, own = strategy.select_blocks(rt, a, q_a, 32)
        _, other = strategy.select_blocks(rt, a, q_b, 32)
        middle = [(~d.fixed)[None].expand_as(k) for d, k in zip(docs, own)]
        gold_middle = sum(int(middle[i].sum()) for i in gold)
        if not gold_middle:
            continue
        own_share.append(sum(int((own[i] & middle[i]).sum()) for i in gold) / gold_middle)
        swapped_share.append(sum(int((other[i] & middle[i]).sum()) for i in gold) / gold_middle)
        both = sum(int((x & y & m).sum()) for x, y, m in zip(own, other, middle))
        either = sum(int(((x | y) & m).sum()) for x, y, m in zip(own, other, middle))
        overlap.append(both / max(either, 1))
        click.echo(f"{q.text[:50]:50s} gold {gold}: kept {own_share[-1]:.2f} own, "
                   f"{swapped_share[-1]:.2f} swapped; overlap {overlap[-1]:.2f}")
    if own_share:
        click.echo(f"\n{len(own_share)} pairs with gold middle blocks: gold kept "
                   f"{statistics.mean(own_share):.3f} with its own query, "
                   f"{statistics.mean(swapped_share):.3f} with the other's; Jaccard of the kept "
                   f"middle blocks {statistics.mean(overlap):.2f}")


if __name__ == "__main__":
    main()
