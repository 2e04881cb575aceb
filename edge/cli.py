"""`kvedge`: the edge node — `serve` (sync KBs, answer over gRPC), `strategies` (the reuse
strategies and their options), `generate` (one local chat answer with the runtime)."""
from __future__ import annotations

import time

import click

from kvedge.common.cli import CLOUD_ADDRESS, EDGE_ADDRESS, KvedgeGroup, RegistryChoice
from kvedge.common.config import configurable
from kvedge.common.model.models import (AUTO_DECODE, DECODE_WEIGHTS, DEFAULT_MODEL,
                                        PROMPT_WEIGHTS)
from kvedge.common.net.tls import ca_option, server_options
from kvedge.edge import DEFAULT_SESSION_BYTES, DEFAULT_STRATEGY


def _strategies():
    from kvedge.edge.strategies import STRATEGIES

    return STRATEGIES


@click.group(cls=KvedgeGroup)
def main():
    """kvedge edge node: serve knowledge bases synced from the cloud, list reuse strategies."""


@main.command("generate")
@click.argument("prompt")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True)
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--temperature", default=0.0, show_default=True, help="0 = greedy")
@click.option("--seed", default=None, type=int)
def generate_cmd(prompt, model_name, max_new_tokens, temperature, seed):
    """Answer one chat prompt locally with the runtime, streaming tokens."""
    import torch

    from kvedge.common.model.decoding import Sampler
    from kvedge.common.model.generate import generate
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime
    from kvedge.common.model.textstream import TextStream

    loaded = load_model(model_name)
    tok, rt = loaded.tokenizer, Runtime(loaded)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True, return_dict=False)
    cache = rt.empty_cache(reserve=len(ids) + max_new_tokens)
    start, stream = time.perf_counter(), TextStream(tok)
    for token in generate(rt, cache, torch.tensor(ids), torch.arange(len(ids)), max_new_tokens,
                          sampler=Sampler(temperature, seed=seed), stop_ids=(tok.eos_token_id,)):
        if token == tok.eos_token_id:
            break
        click.echo(stream.push(token), nl=False)
    click.echo(f"\n[{len(stream.ids)} tokens, {time.perf_counter() - start:.2f} s]", err=True)


@configurable("edge.serve")
@main.command("serve")
@click.option("--cloud", "cloud_address", default=CLOUD_ADDRESS, show_default=True)
@click.option("--cloud-token", default=None,
              help="token for the gateway [default: $KVEDGE_TOKEN or the local admin token]")
@click.option("--kb", "kbs", multiple=True, metavar="KB",
              help="KB to serve: NAME, NS/NAME or NS/NAME@VARIANT (repeatable); its manifest "
              "and retrieval index are synced, a pack is fetched when a question needs it")
@click.option("--alternate", "alternates", multiple=True, metavar="KB@VARIANT",
              help="a variant of a served KB whose packs may stand in for the KB's own "
              "(repeatable): a missing segment is fetched from it when that arrives at least "
              "0.25 s sooner by the measured link (its answers are the variant's: opt in only "
              "to variants you accept); its manifest is synced like --kb's")
@click.option("--pin", "pins", multiple=True, metavar="KB",
              help="KB to serve whole (repeatable): every pack fetched at sync and never "
              "evicted, so it answers with the cloud down")
@click.option("--address", default=EDGE_ADDRESS, show_default=True)
@click.option("--state", "state_dir", type=click.Path(), default=None,
              help="pack cache and KB manifests [default: $KVEDGE_HOME/edge]")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True)
@click.option("--strategy", default=DEFAULT_STRATEGY, show_default=True,
              type=RegistryChoice(_strategies),
              help="default reuse strategy")
@click.option("--top-k", default=3, show_default=True)
@click.option("--max-new-tokens", default=48, show_default=True)
@click.option("--max-batch", type=click.IntRange(1), default=16, show_default=True,
              help="answers decoded together (continuous batching)")
@click.option("--max-queue", type=click.IntRange(0), default=64, show_default=True,
              help="asks waiting beyond the batch; more are refused RESOURCE_EXHAUSTED")
@click.option("--batch-invariant/--no-batch-invariant", default=True, show_default=True,
              help="an answer never depends on what shares its decode steps; no padding where the "
              "load-time probe finds the weights' products row-invariant (MKL's strict mode, "
              "int8); else an answer decoded alone runs steps of the least padding the probe "
              "finds invariant, 2 or 4 rows (up to ~1.6x per token on CPU, less where its "
              "--spec-rows drafts fill those rows: docs/serving.md)")
@click.option("--spec-rows", type=click.IntRange(0, 64), default=None,
              help="rows a decode step may fill with draft tokens copied from the prompt "
              "(prompt-lookup speculation; greedy answers unchanged) [default: 8, 4 with "
              "--decode-weights int8, and with fp16 only the rows a step pads anyway; "
              "0 = off]")
@click.option("--decode-weights", type=click.Choice((*DECODE_WEIGHTS, AUTO_DECODE)),
              default=AUTO_DECODE, show_default=True,
              help="weights the decode steps after an answer's first token read: fp32 (the "
              "exact runtime's), int8 (one byte per weight, one scale per row: faster "
              "decode on CPU), fp16 (near fp32's logits; fast only on CPUs with a fast "
              "fp16 path, e.g. AVX-512; slow for many rows), bf16 (fast for batched steps on "
              "CPUs with a bf16 GEMM such as avx512_bf16: a busy edge's choice) or auto (fp16 "
              "where a probe at load finds its steps row-invariant, unpadded or padded to 2 "
              "or 4 rows, and 1.5x faster at those rows than fp32, else fp32); int8, fp16 "
              "and bf16 answers are judged by agreement, not bit-exact (docs/serving.md)")
@click.option("--prompt-weights", type=click.Choice((*PROMPT_WEIGHTS, AUTO_DECODE)),
              default=AUTO_DECODE, show_default=True,
              help="weights every forward over a prompt reads (an answer's start: the reuse "
              "recompute and the question; session prefixes): fp32 (the exact runtime's), "
              "bf16 (each matmul's inputs rounded to bf16: ~1.5x faster starts on CPUs with "
              "a bf16 GEMM such as avx512_bf16; not bit-exact, docs/serving.md) or auto (bf16 "
              "where a pass timed at load is 1.5x faster than fp32's)")
@click.option("--device", default="cpu", show_default=True,
              help="where the model runs: cpu, or cuda (cuda:N): there its weights are bf16 "
              "and a lone answer's decode steps replay as one CUDA graph (docs/gpu.md)")
@click.option("--sync-interval", default=5.0, show_default=True, help="seconds between syncs")
@click.option("--cache-bytes", type=click.IntRange(0), default=0,
              help="pack cache budget in bytes, least recently used packs evicted beyond it "
              "(0 = unbounded); --pin KBs' packs stay")
@click.option("--prefetch", type=click.IntRange(0, 8), default=2, show_default=True,
              help="segments ranked just below --top-k fetched per question while the link "
              "is idle (0 = off; off too when the cache holds fewer than 32 such packs)")
@click.option("--fetch-or-compute/--always-fetch", default=True, show_default=True,
              help="prefill a question's missing segment on this edge where that is sooner "
              "than fetching its pack, by the link and prefill speeds the edge measures "
              "(docs/fetch_or_compute.md); --always-fetch fetches every missing pack")
@click.option("--kv-budget", type=click.IntRange(0), default=0,
              help="bytes the KV caches of the answers decoding together may take: an ask "
              "waits to start while it does not fit beside them, and one that could not fit "
              "alone is refused RESOURCE_EXHAUSTED (0 = half the memory free when the edge "
              "starts: the GPU's with a CUDA model)")
@click.option("--max-stall", type=click.FloatRange(0), default=None, metavar="SECONDS",
              help="stall-free starts: while an answer starts, the answers already decoding "
              "take a step between its layers once they have waited this long (answers "
              "unchanged; a start takes longer by those steps) [default: off]")
@click.option("--session-bytes", type=click.IntRange(0), default=DEFAULT_SESSION_BYTES,
              show_default=True, help="KV of conversations' earlier turns kept (LRU), so a "
              "next turn computes only its new tokens (0 = none kept)")
@click.option("--http", "http_address", default=None, metavar="HOST:PORT",
              help="also serve the OpenAI-compatible API (/v1/models, /v1/chat/completions) "
              "here; same tokens and TLS as gRPC [default: off]")
@click.option("--metrics", "metrics_address", default=None, metavar="HOST:PORT",
              help="serve Prometheus metrics at HOST:PORT/metrics, same TLS as gRPC, no token "
              "(--http serves them at /metrics too) [default: off]")
@server_options
@ca_option("--cloud-tls-ca", what="the gateway")
@click.option("--cloud-tls-cert", type=click.Path(dir_okay=False), default=None,
              help="mutual TLS: this edge's client certificate for the gateway")
@click.option("--cloud-tls-key", type=click.Path(dir_okay=False), default=None,
              help="mutual TLS: the key of --cloud-tls-cert")
def serve_cmd(cloud_address, cloud_token, kbs, alternates, pins, address, state_dir,
              model_name, strategy, top_k, max_new_tokens, max_batch, max_queue, batch_invariant, spec_rows,
              decode_weights, prompt_weights, device, sync_interval, cache_bytes, prefetch,
              fetch_or_compute, kv_budget, max_stall,
              session_bytes,
              http_address, metrics_address,
              tls_mode, tls_cert, tls_key,
              tls_hosts, tls_client_ca, insecure, cloud_tls_ca, cloud_tls_cert, cloud_tls_key):
    """Serve KBs from the cloud and answer questions about them (blocks; Ctrl-C or SIGTERM
    stops it gracefully and exits 0). A --kb KB answers as soon as its manifest is synced,
    fetching each question's missing packs into one LRU cache of --cache-bytes; a --pin KB is
    fetched whole first and kept."""
    import logging
    from pathlib import Path

    from kvedge.common.cli import home_path
    from kvedge.common.net.cloud_client import CloudClient
    from kvedge.common.net.metrics import MetricsServer, daemon_registry
    from kvedge.common.model.models import check_device, load_model, placed
    from kvedge.common.net.rpc import StopSignal, read_token, run_until_signal
    from kvedge.common.net.tls import check_listen, client_tls, describe, server_tls
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.fetcher import Fetcher
    from kvedge.edge.metrics import EdgeMetrics
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.prefetch import Prefetcher
    from kvedge.edge.server import serve
    from kvedge.edge.sync import Syncer, Target

    if not kbs and not pins:
        raise click.UsageError("name a KB to serve: --kb KB (packs on demand) or --pin KB "
                               "(whole), each repeatable")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    state = Path(state_dir) if state_dir else home_path("edge")
    tls = server_tls(state, address, tls_mode, tls_cert, tls_key, tls_client_ca, tls_hosts)
    check_listen(address, tls, insecure)  # before the model loads: a refusal costs nothing
    check_device(device)
    if http_address:
        check_listen(http_address, tls, insecure)
    if metrics_address:
        MetricsServer.check(metrics_address, tls, insecure)
    stop = StopSignal()  # from here a SIGTERM, even during start-up, ends in a clean stop
    pinned = list(dict.fromkeys(Target.parse(spec) for spec in pins))
    targets = pinned + [t for t in dict.fromkeys(map(Target.parse, kbs)) if t not in pinned]
    standins = alternates_of(targets, alternates)
    synced = targets + [t for alts in standins.values() for t in alts if t not in targets]
    loaded = placed(load_model(model_name), device)
    cache = PackCache(state / "packs", loaded.fingerprint, cache_bytes)
    cloud = CloudClient(cloud_address, read_token(cloud_token, home_path("cloud", "admin.token")),
                        client_tls(cloud_tls_ca, cloud_tls_cert, cloud_tls_key))
    fetcher = Fetcher(cloud, cache)  # one transfer path: sync, answers and prefetch
    prefetcher = Prefetcher(fetcher, cache, depth=prefetch)
    syncer = Syncer(cloud, cache, state, pinned, loaded.tokenizer.decode, on_demand=synced,
                    fetcher=fetcher)
    engine = EdgeEngine(loaded, cache, state, fetcher=fetcher,
                        prefetcher=prefetcher if prefetch else None, max_batch=max_batch,
                        max_queue=max_queue, batch_invariant=batch_invariant,
                        session_bytes=session_bytes, spec_rows=spec_rows,
                        fetch_or_compute=fetch_or_compute, decode_weights=decode_weights,
                        prompt_weights=prompt_weights, kv_budget=kv_budget or None,
                        alternates=standins, max_stall=max_stall)
    metrics = EdgeMetrics(daemon_registry(), cache, syncer, engine.sessions,
                          engine.rt.decode_format, engine.rt.prompt_format,
                          (engine.batch_invariant, engine.step_rows))
    server, port = serve(engine, state, address, syncer, sync_interval, tls=tls, insecure=insecure,
                         metrics=metrics, default_strategy=strategy, top_k=top_k,
                         max_new_tokens=max_new_tokens)
    if prefetch:
        prefetcher.start()
    click.echo(f"decode weights: {engine.rt.decode_format} ({engine.rt.decode_choice}); "
               f"prompt weights: {engine.rt.prompt_format} ({engine.rt.prompt_choice})", err=True)
    if batch_invariant and not engine.batch_invariant:
        click.echo(f"warning: {engine.rt.decode_format} decode steps are not batch-invariant on "
                   f"this CPU at any padding probed; an answer may differ in its last bits with "
                   f"what shares its steps (docs/serving.md)", err=True)
    click.echo(f"edge listening on {address.rsplit(':', 1)[0]}:{port} ({describe(tls)}), serving "
               f"{[t.key for t in targets]} from {cloud_address} (whole: "
               f"{[t.key for t in pinned]}); token in {state / 'edge.token'}", err=True)
    # engine: the scheduler thread ends; syncer: its fetcher too, transfers resumable
    stops = [engine.close, prefetcher.stop, syncer.stop, cloud.close]
    if http_address:
        from kvedge.edge.http_api import serve_http

        http = serve_http(engine, state, targets, http_address, tls=tls, strategy=strategy,
                          top_k=top_k, max_new_tokens=max_new_tokens, metrics=metrics)
        click.echo(f"OpenAI-compatible API on {http.url}", err=True)
        stops.insert(0, http.stop)
    if metrics_address:
        scrape = MetricsServer(metrics_address, metrics.registry, tls, insecure)
        click.echo(f"metrics on {scrape.url}", err=True)
        stops.insert(0, scrape.stop)
    run_until_signal(server, stop, on_stop=stops)
    click.echo("edge stopped", err=True)


def alternates_of(targets: list, specs: tuple[str, ...]) -> dict:
    """--alternate specs → {served KB's key: [its variants allowed to stand in]}; each must
    name a variant of a KB this edge serves."""
    from kvedge.edge.sync import Target

    served, out = {t.key: t for t in targets}, {}
    for spec in specs:
        alt = Target.parse(spec)
        base = Target(alt.namespace, alt.kb)
        if not alt.variant or base.key not in served:
            raise click.BadParameter(f"{spec!r}: name a variant (KB@VARIANT) of a KB served "
                                     f"with --kb or --pin ({sorted(served)})",
                                     param_hint="--alternate")
        out.setdefault(base.key, []).append(alt)
    return out


@main.command("strategies")
def strategies_cmd():
    """The reuse strategies this edge can answer with, and their options (kvctl ask --opt)."""
    import sys

    from kvedge.common.registry import describe
    from kvedge.edge.strategies import STRATEGIES

    for name, cls in STRATEGIES.items():
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        click.echo(f"{name:12s} {doc}")
        for line in describe(cls):
            click.echo(f"{'':14s}{line}")


if __name__ == "__main__":  # `python -m kvedge.edge.cli`, as the demo starts its edge
    main()
