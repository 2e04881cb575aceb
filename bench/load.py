"""`kvctl bench load`: one edge daemon under 1, 4 and 16 concurrent gRPC clients (docs/serving.md).

The KB is prefilled by the cloud's own `PrefillEngine` in this process (no gateway, no Ray)
and written to the edge's state by the edge's real `Syncer`, through `LocalCloud` — the two
cloud calls a sync makes, answered from memory. Then `kvedge serve` starts as its own process
on loopback (its cloud address points nowhere: it answers from its synced cache, as it does
when the cloud is down), and each round runs N client threads, each with its own channel,
asking the same `per_client` questions one after another (each client from its own starting
point, so every round asks the same questions). Reported per round: answers/s over the
round's wall time, the client-side time to the first answer piece (p50, p99), answers lost
(any error), questions whose answer text differs from the one-client round's, and each as a
ratio to the one-client round.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from kvedge.common.model.models import AUTO_DECODE
from kvedge.common.pack.codecs import DEFAULT_CODEC
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.edge.answer import longest_gap

CHUNK = 1 << 20


class LocalCloud:
    """The cloud side of a sync, in memory: `get_kb` and `fetch_pack` over packs the cloud's
    PrefillEngine encoded here (what the gateway would have in its store); `evict` =
    (method, budget) stores what a batch job would make of them instead (ragged packs)."""

    def __init__(self, engine, files: dict[str, str], namespace: str, kb: str,
                 segment_tokens: int = 256, codec: str = DEFAULT_CODEC,
                 evict: tuple[str, float] | None = None):
        segments = engine.segment(files, segment_tokens, whole=False)
        encoded = [engine.encode(seg, namespace, codec) for seg in segments]
        if evict is not None:
            encoded = [engine.compress(e.index, e.data, *evict, codec) for e in encoded]
        self.packs = {e.pack_id: e.data for e in encoded}
        self.info = pb.KBInfo(
            namespace=namespace, kb=kb, status="ready", mode="rag",
            model_fingerprint=engine.loaded.fingerprint, n_files=len(files),
            n_tokens=sum(e.n_tokens for e in encoded),
            segments=[pb.SegmentInfo(index=e.index, pack_id=e.pack_id, pack_bytes=len(e.data),
                                     n_tokens=e.n_tokens, source=s.source,
                                     fp16_bytes=engine.kv_shape.fp16_bytes(e.n_tokens))
                      for s, e in zip(segments, encoded)])

    def get_kb(self, namespace: str, kb: str, variant: str = "") -> pb.KBInfo:
        return self.info

    def fetch_pack(self, namespace: str, pack_id: str, offset: int = 0) -> Iterator[pb.PackChunk]:
        data = self.packs[pack_id]
        for at in range(offset, len(data), CHUNK):
            yield pb.PackChunk(offset=at, data=data[at: at + CHUNK], total=len(data))


def kb_files(folder: Path) -> dict[str, str]:
    """The text files an upload of `folder` would send (.md, .txt), by relative path."""
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*"))
            if p.suffix in (".md", ".txt") and p.is_file()}


def questions_in(folder: Path) -> list[str]:
    """The questions of a KB folder: bench_questions.json, else questions.json."""
    import json

    path = folder / "bench_questions.json"
    path = path if path.exists() else folder / "questions.json"
    return [q["question"] for q in json.loads(path.read_text())]


def sync_local_kb(state: Path, model: str, folder: Path, kb: str = "load",
                  namespace: str = "default", segment_tokens: int = 256,
                  codec: str = DEFAULT_CODEC, evict: tuple[str, float] | None = None,
                  engine=None):
    """Prefill `folder` (with `engine`, a PrefillEngine of `model`, made if not given) and
    sync it into the edge state dir `state`; returns its Target."""
    from kvedge.cloud.workers import PrefillEngine
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.sync import Syncer, Target

    engine = engine or PrefillEngine(model)
    cloud = LocalCloud(engine, kb_files(folder), namespace, kb, segment_tokens, codec, evict)
    target = Target(namespace, kb)
    cache = PackCache(state / "packs", engine.loaded.fingerprint)
    Syncer(cloud, cache, state, [target], engine.loaded.tokenizer.decode).sync_once()
    return target


@dataclass
class Round:
    clients: int
    label: str = ""  # how the row reads in the table, if not the client count
    wall_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)  # answers of 2+ tokens
    gaps: list[float] = field(default_factory=list)  # each answer's longest wait between
    #                                                  two pieces, client-side (2+ pieces)
    tokens: list[int] = field(default_factory=list)
    texts: dict[str, set[str]] = field(default_factory=dict)  # answers given to each question
    lost: list[str] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)  # conversations: history tokens whose KV
    #                                                  came from the session cache, per turn

    def add(self, question: str, ttft: float, tokens: int, text: str,
            tpot: float | None = None, reused: int = 0, gap: float | None = None) -> None:
        self.ttfts.append(ttft)
        if tpot is not None:
            self.tpots.append(tpot)
        if gap is not None:
            self.gaps.append(gap)
        self.tokens.append(tokens)
        self.texts.setdefault(question, set()).add(text)
        self.reused.append(reused)

    @property
    def answers(self) -> int:
        return len(self.ttfts)

    def differing(self, base: "Round") -> int:
        """Questions answered otherwise than in `base` (or than elsewhere in this round)."""
        return sum(texts != base.texts.get(q, texts) or len(texts) > 1
                   for q, texts in self.texts.items())

    @property
    def rate(self) -> float:
        return self.answers / self.wall_s if self.wall_s else 0.0

    def ttft(self, q: float) -> float:
        return _quantile(self.ttfts, q)

    def tpot(self, q: float) -> float:
        """Seconds per output token after the first (client-side: first piece to the end)."""
        return _quantile(self.tpots, q)

    def gap(self, q: float) -> float:
        """The longest wait between two pieces of an answer, quantile `q` over answers: what
        a start beside an answer stalls it (`kvedge serve --max-stall`)."""
        return _quantile(self.gaps, q)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] \
        if len(values) > 1 else values[0]


def ask_timed(client, kb: str, question: str, **ask) -> tuple:
    """Ask and read the whole answer: (client-side time to its first piece, its tokens, its
    text, its seconds per token after the first: first piece to the end / (tokens - 1),
    None for one token; 0 history tokens reused; the longest wait between two of its
    pieces, None for one piece)."""
    start, times = time.perf_counter(), []
    for event in client.ask("default", kb, question, **ask):
        times.append(time.perf_counter() - start)
    end, first = time.perf_counter() - start, times[0]
    tpot = (end - first) / (event.tokens - 1) if event.tokens > 1 else None
    return (first, event.tokens, event.answer, tpot, 0,
            longest_gap(times[:-1]))  # the last event is the AskDone, not a piece


def chat_timed(client, kb: str, messages: list[dict], strategy: str = "", top_k: int = 0,
               max_new_tokens: int = 0) -> tuple:
    """One conversation turn through the edge's OpenAI API with the official client,
    streamed: `ask_timed`'s tuple and the history tokens the edge found in its session cache
    (`kvedge.session_reused`), and the longest wait between two of its pieces."""
    start, times, pieces, tokens, reused = time.perf_counter(), [], [], 0, 0
    stream = client.chat.completions.create(
        model=kb, messages=messages, stream=True, stream_options={"include_usage": True},
        max_tokens=max_new_tokens or None,
        extra_body={"kvedge": {k: v for k, v in (("strategy", strategy), ("top_k", top_k))
                               if v}})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter() - start)
            pieces.append(chunk.choices[0].delta.content)
        reused = (chunk.model_extra or {}).get("kvedge", {}).get("session_reused", reused)
        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
    end = time.perf_counter() - start
    first = times[0] if times else end
    tpot = (end - first) / (tokens - 1) if tokens > 1 else None
    return first, tokens, "".join(pieces), tpot, reused, longest_gap(times)


def run_round(address: str, token: str, kb: str, questions: list[str], clients: int,
              per_client: int, http: str | None = None, **ask) -> Round:
    """`clients` threads, each its own channel, each asking the first `per_client` questions
    in turn from its own starting point: every round asks the same questions, so answer
    lengths match between rounds. With `http` (the edge's OpenAI API address) each client
    holds one conversation instead: its questions are successive turns, each sent with the
    turns before it and their answers, as a chat client sends them (an answer is then
    compared with others by its whole conversation)."""
    from kvedge.common.net.edge_client import EdgeClient

    result, lock = Round(clients), threading.Lock()
    start_line = threading.Barrier(clients + 1)

    def connect():
        if http is None:
            return EdgeClient(address, token)
        from openai import OpenAI

        return OpenAI(base_url=f"http://{http}/v1", api_key=token, max_retries=0,
                      timeout=600)

    def client(c: int) -> None:
        with connect() as edge:
            start_line.wait()
            messages: list[dict] = []
            for i in range(per_client):
                question = questions[(c + i) % per_client % len(questions)]
                try:
                    if http is None:
                        answer = ask_timed(edge, kb, question, **ask)
                    else:
                        messages.append({"role": "user", "content": question})
                        answer = chat_timed(edge, kb, messages, **ask)
                        messages.append({"role": "assistant", "content": answer[2]})
                        question = " / ".join(m["content"] for m in messages[::2])
                except Exception as err:  # noqa: BLE001 - a lost answer is a result
                    with lock:
                        result.lost.append(f"{type(err).__name__}: {err}")
                    if http is not None:
                        break  # the conversation cannot go on without that answer
                    continue
                with lock:
                    result.add(question, *answer)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    start_line.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    result.wall_s = time.perf_counter() - began
    return result


def table(rounds: list[Round]) -> str:
    """Markdown: one row per round, ratios to the first (one-client) round."""
    base = rounds[0]
    lines = ["| clients | answers | lost | questions answered differently | tokens/answer | "
             "wall s | answers/s | × 1 client | TTFT p50 s | × 1 client | TTFT p99 s | "
             "× 1 client | TPOT p50 ms | TPOT p99 ms | longest gap p50 s | longest gap p99 s | "
             "session KV tokens/turn |",
             "|---" * 17 + "|"]
    for r in rounds:
        mean_tokens = sum(r.tokens) / len(r.tokens) if r.tokens else 0.0
        reused = sum(r.reused) / len(r.reused) if r.reused else 0.0
        lines.append(f"| {r.label or r.clients} | {r.answers} | {len(r.lost)} | "
                     f"{r.differing(base)} | {mean_tokens:.1f} | {r.wall_s:.1f} | "
                     f"{r.rate:.2f} | {r.rate / base.rate:.2f} | {r.ttft(.5):.2f} | "
                     f"{r.ttft(.5) / base.ttft(.5):.2f} | {r.ttft(.99):.2f} | "
                     f"{r.ttft(.99) / base.ttft(.99):.2f} | {r.tpot(.5) * 1e3:.0f} | "
                     f"{r.tpot(.99) * 1e3:.0f} | {r.gap(.5):.2f} | {r.gap(.99):.2f} | "
                     f"{reused:.0f} |")
    return "\n".join(lines)


def start_bound(one: Round) -> float:
    """The most any client count can gain over the one-client round `one` while answers start
    one after another (Amdahl over the start): were every decode step free, answers would
    still come at most one per start, 1 / mean TTFT. The edge's scheduler runs one start at a
    time and a start is compute-bound (it keeps the CPU's cores busy alone), so a measured
    ratio above this says starts overlapped, and a target above it needs cheaper starts,
    not better batching of steps (docs/serving.md, issue 27)."""
    mean_ttft = sum(one.ttfts) / len(one.ttfts) if one.ttfts else 0.0
    return 1 / (mean_ttft * one.rate) if mean_ttft and one.rate else 0.0


def unbatched_round(state: Path, model: str, questions: list[str], per_client: int,
                    strategy: str = "", top_k: int = 3, max_new_tokens: int = 48,
                    decode_weights: str = AUTO_DECODE,
                    prompt_weights: str = AUTO_DECODE) -> Round:
    """One client without the daemon, for reference: in this process, `EdgeEngine.retrieve`
    then `EdgeEngine.answer` (the served path: the scheduler, here without padding rows, so a
    lone request's decode step is one row as before batching) over the same synced KB and
    questions, with the daemon's `decode_weights`; TTFT from retrieval to the first piece."""
    from kvedge.common.model.models import load_model
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.strategies import DEFAULT_STRATEGY, get_strategy
    from kvedge.edge.sync import Target

    loaded = load_model(model)
    engine = EdgeEngine(loaded, PackCache(state / "packs", loaded.fingerprint), state,
                        batch_invariant=False, decode_weights=decode_weights,
                        prompt_weights=prompt_weights)
    chosen = get_strategy(strategy or DEFAULT_STRATEGY)  # what the edge's rounds used
    target = Target("default", "load")

    def one(question: str) -> tuple:
        start, times = time.perf_counter(), []
        _, composed = engine.retrieve(target, question, top_k, max_new_tokens)
        for event in engine.answer(composed, chosen, max_new_tokens):
            times.append(time.perf_counter() - start)
        return (times[0], event["tokens"], event["answer"], event["tpot_s"] or None, 0,
                longest_gap(times[:-1]))  # the last event is the costs, not a piece

    one(questions[0])  # first-use costs out of the round
    result, began = Round(1, "1, in process, unpadded"), time.perf_counter()
    for question in questions[:per_client]:
        result.add(question, *one(question))
    result.wall_s = time.perf_counter() - began
    return result


def per_call_s(call, calls: int) -> float:
    """Seconds per call of `call()` over `calls` calls, the first (a warm-up) not timed."""
    call()
    start = time.perf_counter()
    for _ in range(calls - 1):
        call()
    return (time.perf_counter() - start) / (calls - 1)


def dense_requests(rt, context: int, seed: int = 0):
    """`make(reserve, max_new_tokens)`: a fresh request decoding over a dense copy of one
    random `context`-token prompt's cache, the prompt prefilled once, here (time this call
    for a prefill's cost)."""
    import torch

    from kvedge.common.model.decoding import Decoding, Prompt

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, rt.config.vocab_size, (context + 1,), generator=gen)
    pre = rt.prefill(ids[:context], logits="none")

    def make(reserve: int, max_new_tokens: int) -> Decoding:
        cache = rt.dense_cache(pre.keys, pre.values, torch.arange(context), reserve=reserve)
        return Decoding.start(rt, Prompt(cache, ids[context:], torch.tensor([context])),
                              max_new_tokens)
    return make


def decode_costs(model: str, context: int = 560, batches=(1, 4, 16), steps: int = 5,
                 seed: int = 0) -> dict[str, float]:
    """Seconds per decode step in this process over random `context`-token dense caches: the
    scheduler's batched step at each batch size as served (each format's steps padded to
    the row multiple its load-time probe found, `Runtime.decode_row_multiple`),
    and `Runtime.forward` of one token (how a request decoded alone
    before batching) — where the throughput of a batch comes from."""
    import torch

    from kvedge.common.model.batch import decode_step, row_multiple
    from kvedge.common.model.decoding import Decoding
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime

    rt = Runtime(load_model(model))
    make = dense_requests(rt, context, seed)

    def request() -> Decoding:
        return make(steps + 2, steps + 2)

    def timed(step) -> float:
        return per_call_s(step, steps)

    costs = {}
    served = row_multiple(rt, invariant=True)
    for n in batches:
        states = [request() for _ in range(n)]
        costs[f"batch of {n}"] = timed(lambda: decode_step(rt, states, served))
    alone = [request()]
    costs["batch of 1 unpadded"] = timed(lambda: decode_step(rt, alone, row_multiple=1))
    for fmt in ("int8", "fp16", "bf16"):
        rt.use_decode_weights(fmt)
        served = row_multiple(rt, invariant=True)
        for n in batches:
            states = [request() for _ in range(n)]
            costs[f"batch of {n}, {fmt} weights"] = timed(
                lambda: decode_step(rt, states, served))
    if served > 1:  # else fp16's "batch of 1" was one row already
        alone = [request()]
        costs["batch of 1 unpadded, fp16 weights"] = timed(lambda: decode_step(rt, alone, 1))
    rt.use_decode_weights("fp32")
    alone = request()
    costs["forward of 1"] = timed(lambda: alone.advance(rt.forward(
        torch.tensor([alone.token]), torch.tensor([alone.next_position()]), alone.cache,
        seq_len=alone.seq_len).logits[-1]))
    return costs


def run_load(model: str, folder: Path, questions: list[str], clients=(1, 4, 16),
             per_client: int = 4, echo=print, work: Path | None = None, serve_args=(),
             unbatched: bool = True, conversations: bool = False,
             decode_weights: str = AUTO_DECODE, prompt_weights: str = AUTO_DECODE,
             **ask) -> list[Round]:
    """Sync `folder`, start `kvedge serve`, run a round per client count, stop the daemon,
    then (`unbatched`) the one-client reference round without the daemon. In `work`
    (kept, and its synced KB reused by the next run) or a temporary folder. The daemon and
    the reference round decode with `decode_weights` (`kvedge serve --decode-weights`) and
    start with `prompt_weights` (`--prompt-weights`).

    `conversations`: each client holds one conversation through the OpenAI API
    (`run_round`'s `http`), and every client count runs twice — the edge keeping each
    conversation's KV (`--session-bytes`' default) and not (`--session-bytes 0`), a daemon
    each; no unbatched round."""
    from kvedge.apps.demo import free_port, start
    from kvedge.edge.sync import Target, manifest_path

    root = Path(work) / Path(model).name if work else Path(tempfile.mkdtemp(prefix="kvload-"))
    state, target = root / "edge", Target("default", "load")
    try:
        if not manifest_path(state, target).exists():
            t0 = time.perf_counter()
            sync_local_kb(state, model, folder, target.kb)
            echo(f"synced {folder} ({model}) in {time.perf_counter() - t0:.0f} s")
        rounds = []
        for session in ((True, False) if conversations else (None,)):
            address, http = f"127.0.0.1:{free_port()}", None
            extra = [*serve_args, "--decode-weights", decode_weights,
                     "--prompt-weights", prompt_weights]
            if session is not None:
                http = f"127.0.0.1:{free_port()}"
                extra += ["--http", http] + ([] if session else ["--session-bytes", "0"])
            edge = start("edge", ["serve", "--cloud", f"127.0.0.1:{free_port()}", "--kb",
                                  target.key, "--address", address, "--state", str(state),
                                  "--model", model, "--sync-interval", "3600", *extra],
                         root / "edge.log", {**os.environ, "KVEDGE_HOME": str(root)})
            try:
                done = _rounds(edge, address, state, target, questions, clients, per_client,
                               echo, http=http, **ask)
            finally:
                edge.stop()
            for r in done if session is not None else ():
                r.label = f"{r.clients}, {'session KV' if session else 'no session KV'}"
            rounds += done
        if unbatched and not conversations:
            rounds.append(unbatched_round(state, model, questions, per_client,
                                          decode_weights=decode_weights,
                                          prompt_weights=prompt_weights, **ask))
            echo(f"unbatched: {rounds[-1].rate:.2f}/s, TTFT p50 {rounds[-1].ttft(.5):.2f} s")
        return rounds
    finally:
        if not work:
            shutil.rmtree(root, ignore_errors=True)


def _rounds(edge, address, state, target, questions, clients, per_client, echo,
            http: str | None = None, **ask) -> list[Round]:
    from kvedge.apps.demo import http_serving, wait_for
    from kvedge.common.net.edge_client import EdgeClient
    from kvedge.common.net.rpc import wait_healthy

    wait_for((state / "edge.token").exists, "the edge", [edge], 300)
    wait_healthy(address, 300)
    token = (state / "edge.token").read_text().strip()
    if http is not None:
        wait_for(lambda: http_serving(http), "the edge's HTTP API", [edge], 300)
    with EdgeClient(address, token) as warm:  # first-use costs out of the rounds
        for question in questions[:2]:
            ask_timed(warm, target.kb, question, **ask)
    rounds = []
    for n in clients:
        rounds.append(run_round(address, token, target.kb, questions, n, per_client, http,
                                **ask))
        r = rounds[-1]
        echo(f"{n:3d} clients{' (conversations)' if http else ''}: {r.answers} answers, "
             f"{len(r.lost)} lost, {r.rate:.2f}/s, "
             f"TTFT p50 {r.ttft(.5):.2f} s p99 {r.ttft(.99):.2f} s"
             + (f"; first error: {r.lost[0]}" if r.lost else ""))
    return rounds
