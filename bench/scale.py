"""A KB far larger than the edge's cache: sync time, ask latency on hit and miss, disk, memory.

`python -m kvedge.bench.scale --segments 20000 --questions 1000 --cache-fraction 0.05`
(issue 26, deliverable 5). What runs, all on loopback:

- **The cloud**: a gateway in this process (`cloud.gateway.serve`, the real service: upload,
  ingest, catalog, store, FetchPack) whose prefill pool runs `cloud.workers.PrefillEngine` in
  this process instead of in Ray actors (`kvedge.cloud.workers.LocalPool`; `PrefillPool`
  is a thin Ray shim over the same engine). Why not Ray: 20,000 segments through one actor
  on a 2-core machine shared with other work is Ray's per-task overhead and a second model
  copy for nothing, and the engine's torch on 2 threads under load ran ~13x slower than on
  1 (0.54 against 0.041 s a 128-token segment of `tiny-llama`). Every pack is a real pack:
  the model's prefill of its segment, encoded with the KB's codec, content-addressed, stored
  and published by the gateway's own ingest.
- **The corpus**: one paragraph a segment, "Record r01234x: " and 14 words drawn from a
  3,000-word vocabulary (each fits one `--segment-tokens` segment with the byte tokenizer of
  the tiny models). A question names one record and two of its words, so BM25 ranks the
  record first and two records sharing those words below it.
- **The sync**: `Syncer.sync_once` in a child process (the edge's own code, in its own
  process, against the gateway in this one): the KB's manifest and retrieval index, every
  pack's header and manifest read with a ranged fetch, no pack fetched.
- **The edge**: `kvedge serve --kb default/NAME --cache-bytes B --always-fetch --http ...` as
  a process, on the synced state; questions go through its OpenAI-compatible API, one at a
  time, and each answer's `kvedge.fetched_segments` says whether it was a hit (every pack
  cached) or a miss. `--always-fetch`: with the tiny model on loopback fetch-or-compute
  prefills every missing segment (docs/fetch_or_compute.md), which would leave the pack cache
  — what this measures — untouched. Prefetch stays at `kvedge serve`'s default.
- **The workload**: `--questions` asks, every other one a repeat from a hot set of up to
  `HOT_QUESTIONS` (their packs stay cached: hits), the others about a random record (misses,
  mostly). The edge's disk (its pack files, finished and partial) is summed after every ask,
  its RSS (/proc/PID/status VmRSS) read at start, middle and end.

The same run does a `--small`-segment KB (default 100) the same way, its cache the same
budget (it holds all of it): the reference for the cache-hit latency target (issue 26:
p99 within 1.5x of a 100-segment KB's). Latency is the client's, request to complete answer
(`--max-new-tokens` tokens); TTFT is the edge's own.

`python -m kvedge.bench.scale --hits-in-process DATA` times cache hits alone on the KBs a
`--data DATA` run kept: the engine in this process, asked about cached records only
(`hits_in_process`).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

WORDS, WORDS_PER_RECORD, FILE_RECORDS = 3000, 14, 200
HOT_QUESTIONS = 50
NAMESPACE = "default"


# ------------------------------------------------------------------ the corpus

def vocabulary(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 6))) for _ in range(WORDS)]


def record(i: int, words: list[str]) -> list[str]:
    """Record i's words (seeded by i, so a question is made without the corpus)."""
    rng = random.Random(i)
    return [rng.choice(words) for _ in range(WORDS_PER_RECORD)]


def write_corpus(folder: Path, n: int) -> None:
    """n records, one paragraph each, FILE_RECORDS to a file."""
    folder.mkdir(parents=True, exist_ok=True)
    words = vocabulary()
    for start in range(0, n, FILE_RECORDS):
        paras = [f"Record r{i:05d}x: {' '.join(record(i, words))}."
                 for i in range(start, min(n, start + FILE_RECORDS))]
        (folder / f"part{start // FILE_RECORDS:04d}.md").write_text("\n\n".join(paras) + "\n")


def question(i: int, words: list[str]) -> str:
    w = record(i, words)
    return f"What does record r{i:05d}x say about {w[3]} and {w[9]}?"


def workload(n_records: int, n_questions: int, hot: int = HOT_QUESTIONS,
             seed: int = 1) -> list[int]:
    """The record each ask is about: every other one from a hot set of `hot` records, the
    others random."""
    rng = random.Random(seed)
    hot = rng.sample(range(n_records), max(1, min(hot, n_records)))
    return [hot[(q // 2) % len(hot)] if q % 2 == 0 else rng.randrange(n_records)
            for q in range(n_questions)]


# ------------------------------------------------------------------ the cloud

@dataclass
class Cloud:
    server: object
    gateway: object
    address: str
    token: str

    def stop(self) -> None:
        self.server.stop(0)


def start_cloud(data: Path, model: str, segment_tokens: int) -> Cloud:
    from kvedge.cloud.gateway import GatewayConfig, serve
    from kvedge.cloud.workers import LocalPool, PrefillEngine

    config = GatewayConfig(data, model=model, segment_tokens=segment_tokens)
    pool = LocalPool(PrefillEngine(model, 1))  # one thread: see the module's docstring
    server, gateway, port = serve(config, "127.0.0.1:0", pool=pool)
    return Cloud(server, gateway, f"127.0.0.1:{port}",
                 (config.data_dir / "admin.token").read_text().strip())


def ensure_kb(cloud: Cloud, root: Path, name: str, n: int, echo=print) -> dict:
    """KB `name` of n records, ingested through the gateway unless it is there already (a
    kept --data folder); returns its segment count, pack bytes and ingest seconds."""
    from kvedge.cloud.catalog import BASE
    from kvedge.common.errors import NotFound
    from kvedge.common.net.cloud_client import CloudClient

    start = time.perf_counter()
    try:
        rec = cloud.gateway.catalog.get(NAMESPACE, name)
        ready = rec.variants[BASE]["status"] == "ready" and len(rec.segments) == n
    except NotFound:
        ready = False
    if not ready:
        folder = root / f"corpus-{name}"
        write_corpus(folder, n)
        with CloudClient(cloud.address, cloud.token) as client:
            client.upload(folder, NAMESPACE, name)
            client.wait_ready(NAMESPACE, name, progress=_progress(echo, name))
        rec = cloud.gateway.catalog.get(NAMESPACE, name)
    pack_bytes = sum(s.pack_bytes for s in rec.segments)
    return {"segments": len(rec.segments), "pack_bytes": pack_bytes,
            "ingest_s": time.perf_counter() - start if not ready else None}


def _progress(echo, name: str):
    last = [0.0]

    def show(info) -> None:
        if time.monotonic() - last[0] > 60:
            last[0] = time.monotonic()
            echo(f"ingesting {name}: {info.segments_done}/{info.segments_total}")
    return show


# ------------------------------------------------------------------ the edge

def sync_in_child(state: Path, cloud: Cloud, name: str, model: str,
                  reads: str = "heads") -> float:
    """Seconds `Syncer.sync_once` took in a child process (manifest + retrieval index).
    `reads`: "heads" (FetchHeads, the edge's way) or "ranged" (a ranged FetchPack per pack,
    as against a gateway older than FetchHeads)."""
    out = subprocess.run([sys.executable, "-m", "kvedge.bench.scale", "--sync-only",
                          str(state), cloud.address, cloud.token, name, model, reads],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["sync_s"]


def sync_only(state: str, address: str, token: str, name: str, model: str,
              reads: str = "heads") -> None:
    from kvedge.common.model.models import load_model
    from kvedge.common.net.cloud_client import CloudClient
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.sync import Syncer, Target

    class Older(CloudClient):  # a gateway without FetchHeads, as the edge sees one
        def fetch_heads(self, namespace, pack_ids):
            raise NotImplementedError("no FetchHeads")

    loaded = load_model(model)
    with (Older if reads == "ranged" else CloudClient)(address, token) as cloud:
        cache = PackCache(Path(state) / "packs", loaded.fingerprint)
        syncer = Syncer(cloud, cache, state, [], loaded.tokenizer.decode,
                        on_demand=[Target(NAMESPACE, name)])
        start = time.perf_counter()
        syncer.sync_once()
        print(json.dumps({"sync_s": time.perf_counter() - start}))


class Edge:
    """`kvedge serve` on loopback with its HTTP API, on a synced state folder."""

    def __init__(self, state: Path, cloud: Cloud, name: str, model: str, cache_bytes: int,
                 prefetch: int | None = None):
        from kvedge.apps.demo import free_port

        self.state, self.name = state, name
        self.http = f"127.0.0.1:{free_port()}"
        args = [sys.executable, "-m", "kvedge.edge.cli", "serve", "--cloud", cloud.address,
                "--cloud-token", cloud.token, "--kb", f"{NAMESPACE}/{name}", "--state",
                str(state), "--model", model, "--cache-bytes", str(cache_bytes),
                "--always-fetch", "--address", f"127.0.0.1:{free_port()}", "--http", self.http]
        args += [] if prefetch is None else ["--prefetch", str(prefetch)]
        self.log = open(f"{state}.log", "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        from kvedge.apps.demo import http_serving

        while not (self.state / "edge.token").exists() or not http_serving(self.http):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the edge did not start: see {self.state}.log")
            time.sleep(0.2)

    def ask(self, text: str, max_new_tokens: int, top_k: int) -> tuple[float, dict]:
        """(seconds to the complete answer, the answer's `kvedge` costs)."""
        body = json.dumps({"model": f"{NAMESPACE}/{self.name}", "max_tokens": max_new_tokens,
                           "messages": [{"role": "user", "content": text}],
                           "kvedge": {"top_k": top_k}}).encode()
        token = (self.state / "edge.token").read_text().strip()
        req = urllib.request.Request(f"http://{self.http}/v1/chat/completions", body,
                                     {"Content-Type": "application/json",
                                      "Authorization": f"Bearer {token}"})
        start = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as resp:
            reply = json.loads(resp.read())
        return time.perf_counter() - start, reply["kvedge"]

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def disk(self) -> int:
        """Bytes of the edge's pack files, finished and partial (one may go meanwhile: a
        prefetch's transfer committed, a pack evicted)."""
        total = 0
        for path in (self.state / "packs").iterdir():
            if path.suffix in (".kvp", ".part"):
                with contextlib.suppress(FileNotFoundError):
                    total += path.stat().st_size
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


# ------------------------------------------------------------------ one KB's run

def run_kb(cloud: Cloud, root: Path, name: str, n_questions: int, cache_bytes: int,
           model: str, max_new_tokens: int, top_k: int, echo=print,
           prefetch: int | None = None) -> dict:
    """Sync a fresh edge state, serve it, ask; the KB's figures."""
    state = root / f"edge-{name}"
    shutil.rmtree(state, ignore_errors=True)
    sync_s = sync_in_child(state, cloud, name, model)
    segments = cloud.gateway.catalog.get(NAMESPACE, name).segments
    n_records = len(segments)
    # the hot questions' packs stay cached: between two asks of one, the misses bring in
    # (top_k + prefetch) packs each; a tenth of the cache's packs leaves room for them
    cache_packs = cache_bytes * n_records // sum(s.pack_bytes for s in segments)
    hot = max(1, min(HOT_QUESTIONS, cache_packs // 10))
    edge = Edge(state, cloud, name, model, cache_bytes, prefetch)
    words = vocabulary()
    hits, misses, disk_max, rss = [], [], 0, {}
    try:
        edge.wait_ready()
        rss["start"] = edge.rss()
        for q, i in enumerate(workload(n_records, n_questions, hot)):
            seconds, costs = edge.ask(question(i, words), max_new_tokens, top_k)
            fetched = costs["fetched_segments"] + costs["computed_segments"]
            (misses if fetched else hits).append((seconds, costs["ttft_s"]))
            disk_max = max(disk_max, edge.disk())
            if q + 1 == n_questions // 2:
                rss["middle"] = edge.rss()
        rss["end"] = edge.rss()
    finally:
        edge.stop()
    return {"kb": name, "segments": n_records, "questions": n_questions, "sync_s": sync_s,
            "hot_questions": hot,
            "cache_bytes": cache_bytes, "disk_max_bytes": disk_max,
            "hit": _latency(hits), "miss": _latency(misses),
            "rss_bytes": rss}


def sync_times(cloud: Cloud, root: Path, name: str, model: str) -> dict:
    """A fresh edge's sync of the KB both ways, each into its own empty state folder:
    FetchHeads (what an edge does) and a ranged read per pack (against an older gateway)."""
    times = {}
    for reads in ("heads", "ranged"):
        state = root / f"sync-{name}-{reads}"
        shutil.rmtree(state, ignore_errors=True)
        times[f"sync_{reads}_s"] = sync_in_child(state, cloud, name, model, reads)
        shutil.rmtree(state, ignore_errors=True)
    return times


def _latency(rows: list[tuple[float, float]]) -> dict:
    return {"n": len(rows), "p50_s": _pct([r[0] for r in rows], 50),
            "p99_s": _pct([r[0] for r in rows], 99), "ttft_p50_s": _pct([r[1] for r in rows], 50),
            "ttft_p99_s": _pct([r[1] for r in rows], 99)}


def _pct(values: list[float], p: float) -> float | None:
    """The p-th percentile, nearest rank (None without values)."""
    if not values:
        return None
    ranked = sorted(values)
    return ranked[max(0, math.ceil(p / 100 * len(ranked)) - 1)]


def hits_in_process(data: Path, model: str = "tiny-llama", asks: int = 180,
                    max_new_tokens: int = 8) -> list[dict]:
    """Cache hits alone: for each KB an earlier run kept under `data` (its edge state), an
    `EdgeEngine` in this process — no fetcher, no prefetch, no server — asked about records
    whose packs are cached (top_k 1, so every ask is a hit), `asks` times after a warm-up.
    What the engine's hit path costs by KB size, without the daemon's background work."""
    from kvedge.common.model.models import load_model
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.sync import Target

    loaded, words, rows = load_model(model), vocabulary(), []
    states = [p for p in data.glob("edge-kb*") if p.is_dir()]
    for state in sorted(states, key=lambda p: int(p.name[len("edge-kb"):])):
        name = state.name[len("edge-"):]
        manifest = json.loads((state / "kbs" / NAMESPACE / f"{name}.json").read_text())
        cached = {p.stem for p in (state / "packs").glob("*.kvp")}
        records = [int(s["text"].split("Record r", 1)[1][:5]) for s in manifest["segments"]
                   if s["pack_id"] in cached][:60]
        engine = EdgeEngine(loaded, PackCache(state / "packs", loaded.fingerprint), state)
        target, seconds, ttfts = Target(NAMESPACE, name), [], []
        try:
            for n in range(asks + 5):
                start = time.perf_counter()
                *_, done = engine.ask(target, question(records[n % len(records)], words),
                                      top_k=1, max_new_tokens=max_new_tokens)
                if n >= 5:  # the first asks decode their packs into memory
                    seconds.append(time.perf_counter() - start)
                    ttfts.append(done.ttft_s)
        finally:
            engine.close()
        rows.append({"kb": name, "segments": len(manifest["segments"]),
                     "cached_packs": len(cached),
                     "hit": _latency(list(zip(seconds, ttfts)))})
    return rows


def run(segments: int, questions: int, cache_fraction: float, *, small: int = 100,
        model: str = "tiny-llama", segment_tokens: int = 128, max_new_tokens: int = 8,
        top_k: int = 3, data: Path | None = None, echo=print,
        prefetch: int | None = None) -> dict:
    """Both KBs' figures (the big one's cache `cache_fraction` of its pack bytes; the small
    one's the same budget; `small` 0: none) and the targets' ratios."""
    root = Path(data) if data else Path(tempfile.mkdtemp(prefix="kvscale-"))
    cloud = start_cloud(root / "cloud", model, segment_tokens)
    try:
        sizes = (small, segments) if small else (segments,)
        kbs = {size: ensure_kb(cloud, root, f"kb{size}", size, echo) for size in sizes}
        if not questions:  # --questions 0: build (or check) the KBs, time their syncs
            return {"rows": [{**kbs[size], **sync_times(cloud, root, f"kb{size}", model)}
                             for size in sizes]}
        budget = int(cache_fraction * kbs[segments]["pack_bytes"])
        rows = [{**kbs[size], **run_kb(cloud, root, f"kb{size}", questions, budget, model,
                                       max_new_tokens, top_k, echo, prefetch)}
                for size in sizes]
    finally:
        cloud.stop()
        if data is None:
            shutil.rmtree(root, ignore_errors=True)
    for row in rows:
        echo(json.dumps(row))
    big, ref = rows[-1], rows[0] if small else None
    return {"rows": rows, "cache_fraction": cache_fraction,
            "hit_p99_over_small": _ratio(big["hit"]["p99_s"], ref and ref["hit"]["p99_s"]),
            "disk_within_budget": big["disk_max_bytes"] <= big["cache_bytes"],
            "rss_growth_bytes": big["rss_bytes"]["end"] - big["rss_bytes"]["start"]}


def _ratio(a, b):
    return a / b if a is not None and b else None


def table(report: dict) -> str:
    mib = 1 << 20
    lines = ["| KB segments | sync s | hit asks | hit p50 / p99 s | miss asks | "
             "miss p50 / p99 s | cache budget MiB | disk max MiB | RSS start / middle / end MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        h, m, rss = r["hit"], r["miss"], r["rss_bytes"]
        lines.append(
            f"| {r['segments']} | {r['sync_s']:.1f} | {h['n']} | {_s(h['p50_s'])} / "
            f"{_s(h['p99_s'])} | {m['n']} | {_s(m['p50_s'])} / {_s(m['p99_s'])} | "
            f"{r['cache_bytes'] / mib:.1f} | {r['disk_max_bytes'] / mib:.1f} | "
            f"{rss['start'] / mib:.0f} / {rss['middle'] / mib:.0f} / {rss['end'] / mib:.0f} |")
    return "\n".join(lines)


def _s(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> None:
    import argparse

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--sync-only"]:
        return sync_only(*argv[1:])
    if argv[:1] == ["--hits-in-process"]:  # DATA: a --data folder a run kept
        return print(json.dumps(hits_in_process(Path(argv[1])), indent=1))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=20000)
    ap.add_argument("--questions", type=int, default=1000,
                    help="0: build the KBs and time their syncs only (FetchHeads and ranged)")
    ap.add_argument("--cache-fraction", type=float, default=0.05)
    ap.add_argument("--small", type=int, default=100,
                    help="segments of the reference KB (0: none)")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--segment-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--data", type=Path, default=None,
                    help="keep the cloud and edges here; a KB already ingested is reused")
    ap.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    ap.add_argument("--prefetch", type=int, default=None,
                    help="the edge's --prefetch (default: kvedge serve's)")
    args = ap.parse_args(argv)
    report = run(args.segments, args.questions, args.cache_fraction, small=args.small,
                 model=args.model, segment_tokens=args.segment_tokens,
                 max_new_tokens=args.max_new_tokens, data=args.data, prefetch=args.prefetch)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    if not args.questions:
        return print(json.dumps(report["rows"]))
    print(table(report))
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}))


if __name__ == "__main__":
    main()
