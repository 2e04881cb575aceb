"""Cold and warm time to first token of an on-demand edge behind an emulated link.

`python -m kvedge.bench.link_ttft` (issue 26, deliverable 4): a gateway in this process (Ray
in-process) ingests a KB; for each link (`bench.link.LinkEmulator`: bandwidth per direction,
20 ms round trip) a fresh edge state syncs the KB's manifest and retrieval index through the
link (`kvedge serve --kb`: no pack fetched), then, per question, through `EdgeEngine.ask`:

- *cold*: the edge's pack cache emptied first, so the question's packs cross the link inside
  the ask (fetched whole, verified, then loaded: fetch-then-answer, `EdgeEngine(stream=False)`
  with `kvedge serve --always-fetch`);
- *streamed*: cold again, each pack decoded layer by layer while its bytes arrive and the next
  pack's transfer started behind the last one's bytes (`EdgeEngine(overlap=False)`, the
  cold path under load, `common.pack.stream`, `Fetcher.fetch_in_order`);
- *overlapped*: cold again, every missing pack's transfer started at once and the answer's
  forward run on each layer as it arrives (`EdgeEngine`'s default cold path when idle,
  `edge.arriving`);
- *warm*: the same question again, its packs cached;
- *local prefill*: `recompute` over the cached packs' text — what an edge without packs
  would do (full prefill of the prompt);
- *fetch-or-compute*: cold again (pack cache and computed segments emptied), on an engine
  that chooses per missing segment between fetching its pack and prefilling its text
  (`edge.fetch_or_compute`, `kvedge serve`'s default). It shares the fetcher, so it knows
  the link from the cold asks' transfers, as an edge that has answered before does; its
  prefill is calibrated before the first question.

TTFTs are medians over the questions; the ratios are cold / local prefill, streamed / cold,
streamed / local prefill, overlapped / streamed and fetch-or-compute / the better of cold and
local prefill, per link; `computed` counts the segments fetch-or-compute prefilled, of the `missing` ones, over
all questions.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from statistics import median

LINKS = ((10, 20), (100, 20), (1000, 20))  # (Mbit/s per direction, RTT ms)


def gateway(model: str, folder: Path, data: Path, segment_tokens: int = 256):
    """A gateway on loopback with `folder` ingested as default/bench: (server, address, token)."""
    from kvedge.cloud.gateway import GatewayConfig, serve_local
    from kvedge.common.net.cloud_client import CloudClient

    server, _, address, token = serve_local(
        GatewayConfig(data, model=model, segment_tokens=segment_tokens))
    with CloudClient(address, token) as cloud:
        cloud.upload(folder, "default", "bench")
        cloud.wait_ready("default", "bench")
    return server, address, token


def over_link(loaded, address: str, token: str, link: tuple[float, float],
              questions: list[str], state: Path, max_new_tokens: int) -> dict:
    """One link's sync time and per-question cold/warm/local TTFTs (seconds)."""
    from kvedge.bench.link import LinkEmulator
    from kvedge.common.net.cloud_client import CloudClient
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.fetcher import Fetcher
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.sync import Syncer, Target

    target = Target("default", "bench")
    with LinkEmulator(address, *link) as emulated, CloudClient(emulated.address, token) as cloud:
        cache = PackCache(state / "packs", loaded.fingerprint)
        fetcher = Fetcher(cloud, cache)
        start = time.perf_counter()
        Syncer(cloud, cache, state, [], loaded.tokenizer.decode, on_demand=[target],
               fetcher=fetcher).sync_once()
        synced = time.perf_counter() - start
        engine = EdgeEngine(loaded, cache, state, fetcher=fetcher, stream=False)
        streaming = EdgeEngine(loaded, cache, state, fetcher=fetcher, overlap=False)
        overlapping = EdgeEngine(loaded, cache, state, fetcher=fetcher)
        choosing = EdgeEngine(loaded, cache, state, fetcher=fetcher, fetch_or_compute=True)
        choosing.scheduler.settle()  # its prefill calibrated
        rows = []
        for question in questions:
            cache.clear()
            cold = _ask(engine, target, question, max_new_tokens).ttft_s
            cache.clear()
            streamed = _ask(streaming, target, question, max_new_tokens).ttft_s
            cache.clear()
            overlapped = _ask(overlapping, target, question, max_new_tokens).ttft_s
            warm = _ask(engine, target, question, max_new_tokens).ttft_s
            local = _ask(engine, target, question, max_new_tokens, "recompute").ttft_s
            cache.clear()
            choosing.local.computed.clear()
            chose = _ask(choosing, target, question, max_new_tokens)
            rows.append({"cold": cold, "stream": streamed, "overlap": overlapped, "warm": warm,
                         "local": local, "foc": chose.ttft_s,
                         "computed": len(chose.computed_segments),
                         "missing": len(chose.computed_segments + chose.fetched_segments)})
        for e in (engine, streaming, overlapping, choosing):
            e.close()
        return {"sync_s": synced, "link_bytes": emulated.bytes, "rows": rows}


def _ask(engine, target, question: str, max_new_tokens: int, strategy: str = ""):
    from kvedge.edge import DEFAULT_STRATEGY

    *_, done = engine.ask(target, question, strategy=strategy or DEFAULT_STRATEGY,
                          max_new_tokens=max_new_tokens)
    return done


def run(model: str, folder: Path, questions: list[str], links=LINKS, max_new_tokens: int = 4,
        echo=print) -> list[dict]:
    from kvedge.common.model.models import load_model

    root = Path(tempfile.mkdtemp(prefix="kvlink-"))
    server, address, token = gateway(model, folder, root / "cloud")
    loaded = load_model(model)
    out = []
    try:
        for link in links:
            got = over_link(loaded, address, token, link, questions, root / f"edge-{link[0]}",
                            max_new_tokens)
            med = {k: median(r[k] for r in got["rows"])
                   for k in ("cold", "stream", "overlap", "warm", "local", "foc")}
            out.append({"mbit_s": link[0], "rtt_ms": link[1], "sync_s": got["sync_s"],
                        **{f"{k}_ttft_s": v for k, v in med.items()},
                        "cold_over_local": med["cold"] / med["local"],
                        "stream_over_cold": med["stream"] / med["cold"],
                        "stream_over_local": med["stream"] / med["local"],
                        "stream_over_best": med["stream"] / min(med["cold"], med["local"]),
                        "overlap_over_stream": med["overlap"] / med["stream"],
                        "overlap_over_best": med["overlap"] / min(med["cold"], med["local"]),
                        "foc_over_best": med["foc"] / min(med["cold"], med["local"]),
                        **{k: sum(r[k] for r in got["rows"]) for k in ("computed", "missing")},
                        "questions": len(questions)})
            echo(out[-1])
    finally:
        server.stop(0)
        shutil.rmtree(root, ignore_errors=True)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| link | manifest sync s | cold TTFT s | streamed TTFT s | warm TTFT s | "
             "local prefill TTFT s | cold / local | streamed / cold | streamed / local | "
             "streamed / best of cold, local | overlapped TTFT s | overlapped / streamed | "
             "overlapped / best of cold, local | fetch-or-compute TTFT s | computed / missing | "
             "FoC / best of cold, local |", "|---" * 16 + "|"]
    for r in rows:
        lines.append(f"| {r['mbit_s']:g} Mbit/s, {r['rtt_ms']:g} ms | {r['sync_s']:.2f} | "
                     f"{r['cold_ttft_s']:.2f} | {r['stream_ttft_s']:.2f} | "
                     f"{r['warm_ttft_s']:.2f} | {r['local_ttft_s']:.2f} | "
                     f"{r['cold_over_local']:.2f} | {r['stream_over_cold']:.2f} | "
                     f"{r['stream_over_local']:.2f} | {r['stream_over_best']:.2f} | "
                     f"{r['overlap_ttft_s']:.2f} | {r['overlap_over_stream']:.2f} | "
                     f"{r['overlap_over_best']:.2f} | "
                     f"{r['foc_ttft_s']:.2f} | {r['computed']} / {r['missing']} | "
                     f"{r['foc_over_best']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    from kvedge.apps.demo import DEMO_KB

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--kb", type=Path, default=DEMO_KB)
    ap.add_argument("--questions", type=int, default=5)
    ap.add_argument("--mbit", default=",".join(f"{m:g}" for m, _ in LINKS),
                    help="link bandwidths in Mbit/s, comma-separated (20 ms round trip each)")
    args = ap.parse_args(argv)
    asked = json.loads((args.kb / "questions.json").read_text())[:args.questions]
    links = tuple((float(m), 20) for m in args.mbit.split(","))
    rows = run(args.model, args.kb, [q["question"] for q in asked], links)
    print(table(rows))


if __name__ == "__main__":
    main()
