"""`hotpot-kb`: HotpotQA questions asked of one knowledge base through the product's own path.

The paragraphs of a run's first `items` questions (`hotpot_kb_corpus`, the tuning split in
the seeded order `hotpot-fixed` uses) are uploaded as one KB — one file per paragraph, its
title on the first line — to a gateway in this process (`cloud.gateway.serve_local`), which
cuts and prefills them as any upload; an edge state syncs the KB whole (every pack fetched,
as `kvedge serve --pin` does), and each question is asked with `EdgeEngine.ask`: the edge's
BM25 ranks the KB's segments against it, its top `length` are composed best last, the
strategy answers greedily after HotpotQA's instruction. A row's TTFT is the ask's own (from
the call, retrieval and pack loads included), as a user of `kvedge serve` sees it.

The gateway's data and the edge's state live under `services/<model fingerprint>/` and are
kept: a later run over the same questions, segment size, codec and anchoring finds the KB
ready under the same name and skips the upload (a Qwen prefill of ~400 paragraphs takes
~12 min on 2 cores).

With a base codec (`kvctl bench run --kb-base-codec fp16`), the KB is uploaded once in that
codec and each cell's codec is a variant of it, made as `kvctl job submit --method none
--codec C` makes one: the gateway's job re-encodes every base pack, no prefill, and the edge
syncs and asks `KB@none-1-C`. Decision: a codec comparison then costs one ingest instead of one
per codec (~90 min each for Qwen over 300 questions' paragraphs), and every codec codes the
same fp16 KV — which differs from coding the fp32 prefill directly by fp16's rounding (relative
error ~2e-4, two orders below int8's), so a variant stands for a direct upload in that codec.

`kvedge.bench.suites.Bench` runs the cells; its ceiling store keeps recompute's answers by the
retrieved segments' text and the question.
"""
from __future__ import annotations

import copy
import hashlib
import json
import tempfile
import time
from pathlib import Path

from kvedge.bench.datasets import QAItem
from kvedge.bench.real import HOTPOT_KB
from kvedge.bench.real.hotpotqa import as_question, document, hotpot_kb_corpus

NAMESPACE = "bench"


def item_key(kb: str, index: int, top_k: int) -> str:
    """A question's item key: "hotpot-kb/<KB name>/<HotpotQA index>/<top-k>". The KB's name
    digests its codec and settings, so one question asked of two uploads has two keys."""
    return f"{HOTPOT_KB}/{kb}/{index}/{top_k}"


def parse_item_key(key: str) -> tuple[str, int, int] | None:
    """(KB name, HotpotQA index, top-k) of a hotpot-kb item key; None for another suite's."""
    parts = key.split("/")
    if parts[0] != HOTPOT_KB or len(parts) != 4:
        return None
    return parts[1], int(parts[2]), int(parts[3])


class Services:
    """A gateway in this process and an edge state that syncs from it, both under `root`
    (kept across runs): `publish` a KB, then ask it through `engine` as `kvedge serve`
    would."""

    def __init__(self, root: Path, model: str, loaded, segment_tokens: int, anchored: bool,
                 actors: int = 1, side_tensors: bool = False):
        from kvedge.cloud.gateway import GatewayConfig, serve_local
        from kvedge.common.net.cloud_client import CloudClient
        from kvedge.edge.engine import EdgeEngine
        from kvedge.edge.fetcher import Fetcher
        from kvedge.edge.packcache import PackCache

        self.root, self.loaded = Path(root), loaded
        self.server, _, address, token = serve_local(GatewayConfig(
            self.root / "cloud", model=model, segment_tokens=segment_tokens, anchored=anchored,
            actors=actors, side_tensors=side_tensors))
        self.cloud = CloudClient(address, token)
        self.cache = PackCache(self.root / "edge" / "packs", loaded.fingerprint)
        self.fetcher = Fetcher(self.cloud, self.cache)
        self.engine = EdgeEngine(loaded, self.cache, self.root / "edge", fetcher=self.fetcher)

    def publish(self, name: str, files: dict[str, str], codec: str, echo=print):
        """The KB `name` of `files` (path → text) ready in the cloud — uploaded and ingested
        unless the gateway already holds it ready — and synced whole to the edge: its
        Target."""
        from kvedge.edge.sync import Target

        if not self._ready(name):
            with tempfile.TemporaryDirectory(prefix="kvedge-hotpot-kb-") as folder:
                for path, text in files.items():
                    (Path(folder) / path).write_text(text)
                self.cloud.upload(folder, NAMESPACE, name, codec=codec)
                echo(f"{NAMESPACE}/{name}: ingesting {len(files)} paragraphs")
                self.cloud.wait_ready(NAMESPACE, name, progress=_ingest_progress(echo))
        return self._synced(Target(NAMESPACE, name))

    def derive(self, name: str, codec: str, echo=print):
        """The variant of the ready KB `name` in `codec` — made by a batch job that keeps
        every pair (method `none`) unless the gateway holds it already — synced whole to the
        edge: its Target."""
        from kvedge.cloud.catalog import variant_name
        from kvedge.edge.sync import Target

        variant = variant_name("none", 1.0, codec)
        if not self._ready(name, variant):
            job = self.cloud.submit_job(NAMESPACE, [name], "none", 1.0, codec)
            echo(f"{NAMESPACE}/{name}@{job.variant}: job {job.job_id}, {job.total} packs")
            for job in self.cloud.watch_job(NAMESPACE, job.job_id):
                pass
            if job.status != "done":
                raise RuntimeError(f"job {job.job_id} making {name}@{variant} ended "
                                   f"{job.status}: {[f.error for f in job.failures][:3]}")
        return self._synced(Target(NAMESPACE, name, variant))

    def _synced(self, target):
        from kvedge.edge.sync import Syncer

        Syncer(self.cloud, self.cache, self.root / "edge", [target], self.loaded.tokenizer.decode,
               fetcher=self.fetcher).sync_once()
        return target

    def _ready(self, name: str, variant: str = "") -> bool:
        from kvedge.common.errors import NotFound

        try:
            return self.cloud.get_kb(NAMESPACE, name, variant).status == "ready"
        except NotFound:
            return False

    def close(self) -> None:
        self.engine.close()
        self.cloud.close()
        self.server.stop(0)


def _ingest_progress(echo, every_s: float = 30.0):
    """A wait_ready progress callback printing segments done at most every `every_s`."""
    last = [0.0]

    def progress(info) -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            echo(f"  {info.status}: {info.segments_done}/{info.segments_total} segments")
    return progress


class HotpotKB:
    """One run's KB (the paragraphs of its first `n_items` questions) on `services`, asked
    as its `target` (the KB, or one of its variants: `variant`)."""

    def __init__(self, services: Services, n_items: int, seed: int, codec: str, settings: dict,
                 echo=print):
        questions, paragraphs = hotpot_kb_corpus(n_items, seed)
        self.services, self.questions = services, questions
        self.files = {f"p{i:05d}.md": document(title, text)
                      for i, (title, text) in enumerate(paragraphs)}
        self.titles = {path: title for path, (title, _) in zip(self.files, paragraphs)}
        self.name = kb_name(n_items, seed, self.files, {"codec": codec, **settings})
        self.target = services.publish(self.name, self.files, codec, echo)

    def variant(self, codec: str, echo=print) -> "HotpotKB":
        """This KB asked through its variant in `codec` (`Services.derive`)."""
        out = copy.copy(self)
        out.target = self.services.derive(self.name, codec, echo)
        return out

    def items(self, top_k: int, new_tokens, n: int | None = None) -> list[QAItem]:
        """One item per question (the first `n`; None: all): its documents the texts of the
        segments the edge retrieves for it, in prompt order (what a recompute answer depends
        on: the ceiling store's key), `new_tokens(question)` its decode budget (the prompt
        must fit the window with it)."""
        out = []
        for q in self.questions[:n]:
            question = as_question(q)
            metas, _ = self.services.engine.pick(self.target, q.question, top_k,
                                                 new_tokens(question))
            out.append(QAItem(item_key(self.name, q.index, top_k),
                              [m["text"] for m in metas], [question]))
        return out

    def ask(self, item: QAItem, strategy: str, options: dict, max_new_tokens: int) -> dict:
        """The item's question asked through `EdgeEngine.ask` with `strategy` and `options`:
        the answer and what it cost, in the names `kvedge.bench.cell_summary.summarize` reads."""
        question, = item.questions
        engine = self.services.engine
        start = time.perf_counter()
        *_, done = engine.ask(self.target, question.text, strategy=strategy, options=options,
                              top_k=len(item.documents), max_new_tokens=max_new_tokens,
                              instruction=question.instruction)
        sources = done.sources
        return {"answer": done.answer, "first_token_s": done.ttft_s, "tpot_s": done.tpot_s,
                "answer_s": time.perf_counter() - start, "tokens": done.tokens,
                "recomputed": done.recomputed_tokens, "prompt_tokens": done.prompt_tokens,
                "kv_bytes": done.kv_bytes, "sequence_ratio": done.sequence_ratio,
                "shipped_bytes": done.bytes_loaded, "fp16_bytes": done.fp16_bytes,
                "documents": len(done.segments), "ask_phases": done.phases,
                "gold_retrieved": len({self.titles.get(s) for s in sources}
                                      & set(question.needed_docs))}


class KBs:
    """The KBs of a bench run's hotpot-kb cells, one per questions, seed and codec, on
    services under `root/<model fingerprint>` started by the first (none for a run without
    hotpot-kb cells)."""

    def __init__(self, root: Path, model: str, loaded, segment_tokens: int, anchored: bool,
                 base_codec: str = "", actors: int = 1, side_tensors: bool = False):
        self.root, self.model, self.loaded = Path(root), model, loaded
        self.settings = {"segment_tokens": segment_tokens, "anchored": anchored}
        self.side_tensors = side_tensors
        if not side_tensors:  # in the KB's name only when off: KBs made before had them
            self.settings["side_tensors"] = False
        self.actors = actors  # the gateway's prefill actors (one thread each)
        self.base_codec = base_codec  # '': each codec uploaded; else variants of this upload
        self._services: Services | None = None
        self._kbs: dict[tuple[int, int, str], HotpotKB] = {}

    def get(self, n_items: int, seed: int, codec: str) -> HotpotKB:
        if (n_items, seed, codec) not in self._kbs:
            if self.base_codec and codec != self.base_codec:
                kb = self.get(n_items, seed, self.base_codec).variant(codec)
            else:
                kb = HotpotKB(self._started(), n_items, seed, codec, self.settings)
            self._kbs[n_items, seed, codec] = kb
        return self._kbs[n_items, seed, codec]

    def _started(self) -> Services:
        if self._services is None:
            self._services = Services(self.root / self.loaded.fingerprint[:16], self.model,
                                      self.loaded, self.settings["segment_tokens"],
                                      self.settings["anchored"], self.actors, self.side_tensors)
        return self._services

    def close(self) -> None:
        if self._services is not None:
            self._services.close()
            self._services, self._kbs = None, {}


def kb_name(n_items: int, seed: int, files: dict[str, str], settings: dict) -> str:
    """The KB's name: its size and seed, and a digest of its files and of the settings its
    packs depend on (a changed paragraph, segment size or codec is another KB)."""
    digest = hashlib.sha256(json.dumps([files, settings], sort_keys=True).encode()).hexdigest()
    return f"hotpot-{n_items}-s{seed}-{digest[:12]}"
