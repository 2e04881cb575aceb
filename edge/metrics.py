"""The edge daemon's metrics (docs/metrics.md).

Answers are observed by wrapping the engine's event stream (`EdgeMetrics.answers`), so gRPC
Ask and the OpenAI-compatible API count alike and the engine knows nothing of metrics; the
syncer's and the pack cache's counts are plain numbers they keep, read when scraped.
"""
from __future__ import annotations

from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from kvedge.common.net.metrics import RequestLog, RequestMetrics
from kvedge.edge.engine import AskResult

TTFT_BUCKETS = (.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5)


class EdgeMetrics:
    """The edge's answer metrics in `registry` (none given: a private one nobody scrapes), and
    the sync, pack-cache and session-cache counts of `syncer`, `cache` and `sessions` (an
    `edge.sessions.PrefixCache`) when given; `decode_weights` and `prompt_weights`, the
    formats the decode steps and the forwards over prompts read (`Runtime.decode_format`,
    `Runtime.prompt_format`: what `--decode-weights` / `--prompt-weights` auto chose), each
    as a 1 under its label; `invariance`, (`EdgeEngine.batch_invariant`,
    `EdgeEngine.step_rows`): whether answers are batch-invariant and the rows a lone
    answer's decode step runs."""

    def __init__(self, registry: CollectorRegistry | None = None, cache=None, syncer=None,
                 sessions=None, decode_weights: str | None = None,
                 prompt_weights: str | None = None,
                 invariance: tuple[bool, int] | None = None):
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.http = RequestMetrics(r, "http", ("method", "route"))
        self.ttft = Histogram("kvedge_edge_ttft_seconds", "time to the first answer token "
                              "(retrieval, pack loading and waiting for the model included)",
                              ["strategy"], buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("kvedge_edge_tpot_seconds", "an answer's mean time per output "
                              "token after the first", ["strategy"], buckets=TPOT_BUCKETS,
                              registry=r)
        self.finished = Counter("kvedge_edge_answers", "answers finished, by strategy and "
                                "finish reason", ["strategy", "finish_reason"], registry=r)
        self.tokens = Counter("kvedge_edge_answer_tokens", "answer tokens generated",
                              ["strategy"], registry=r)
        self.drafts = Counter("kvedge_edge_draft_tokens", "prompt-lookup draft tokens run in "
                              "decode steps, by outcome: accepted (kept: the model picked "
                              "them) or rejected", ["outcome"], registry=r)
        self.in_flight = Gauge("kvedge_edge_asks_in_flight", "answers started, not yet ended",
                               registry=r)
        self.waiting = Gauge("kvedge_edge_asks_waiting", "answers before their first token: "
                             "queued for the model, or retrieving and prefilling", registry=r)
        if decode_weights is not None:
            Gauge("kvedge_edge_decode_weights", "1 under the format the decode steps read "
                  "(fp32, int8, fp16 or bf16: what --decode-weights, or its auto probe, chose)",
                  ["format"], registry=r).labels(decode_weights).set(1)
        if prompt_weights is not None:
            Gauge("kvedge_edge_prompt_weights", "1 under the format every forward over a "
                  "prompt reads (an answer's start: fp32 or bf16, what --prompt-weights, or "
                  "its auto probe, chose)", ["format"], registry=r).labels(prompt_weights).set(1)
        if invariance is not None:
            Gauge("kvedge_edge_batch_invariant", "1 where an answer is the same whatever shares "
                  "its decode steps (--batch-invariant, and a row padding the load-time probe "
                  "found to hold for the decode weights), else 0",
                  registry=r).set(int(invariance[0]))
            Gauge("kvedge_edge_decode_step_rows", "the rows a lone answer's decode step runs "
                  "(1: no padding; 2 or 4 where the decode weights hold only padded so)",
                  registry=r).set(invariance[1])
        if cache is not None or syncer is not None or sessions is not None:
            r.register(_Counts(cache, syncer, sessions))

    def answers(self, events: Iterator, log: RequestLog | None = None) -> Iterator:
        """`events` (an engine.ask stream) passed through, observed: the in-flight and waiting
        gauges while it runs, the final AskResult into the histograms and counters and onto
        the request's log line."""
        self.in_flight.inc()
        self.waiting.inc()
        waiting = True
        try:
            for event in events:
                if waiting:
                    self.waiting.dec()
                    waiting = False
                if isinstance(event, AskResult):
                    self.observe(event, log)
                yield event
        finally:  # ended, failed, or closed by a client that went away
            if waiting:
                self.waiting.dec()
            self.in_flight.dec()

    def observe(self, done: AskResult, log: RequestLog | None = None) -> None:
        self.ttft.labels(done.strategy).observe(done.ttft_s)
        if done.tokens > 1:
            self.tpot.labels(done.strategy).observe(done.tpot_s)
        self.finished.labels(done.strategy, done.finish_reason).inc()
        self.tokens.labels(done.strategy).inc(done.tokens)
        self.drafts.labels("accepted").inc(done.accepted_tokens)
        self.drafts.labels("rejected").inc(done.draft_tokens - done.accepted_tokens)
        if log is not None:
            log.note(strategy=done.strategy, ttft_s=done.ttft_s, tokens=done.tokens)


class _Counts:
    """A collector reading the syncer's, the pack cache's and the session cache's counters
    when scraped."""

    def __init__(self, cache, syncer, sessions=None):
        self.cache, self.syncer, self.sessions = cache, syncer, sessions

    def collect(self):
        if self.sessions is not None:
            stats = self.sessions.stats
            prefixes = CounterMetricFamily("kvedge_edge_session_prefixes", "conversation "
                                           "prefixes served: whole from the session cache "
                                           "(hit), extended from a shorter one (extended), "
                                           "computed from nothing (miss)", labels=["outcome"])
            for outcome in ("hit", "extended", "miss"):
                prefixes.add_metric([outcome], getattr(stats, {"hit": "hits", "miss": "misses"}
                                                       .get(outcome, outcome)))
            yield prefixes
            yield CounterMetricFamily("kvedge_edge_session_reused_tokens", "conversation "
                                      "prefix tokens whose KV the session cache held",
                                      value=stats.reused_tokens)
            yield CounterMetricFamily("kvedge_edge_session_evictions", "conversation prefixes "
                                      "dropped from the session cache (over --session-bytes)",
                                      value=stats.evictions)
        if self.syncer is not None:
            yield CounterMetricFamily("kvedge_edge_sync_fetched_bytes", "bytes fetched from "
                                      "the cloud: packs (by sync, by answers and by prefetch), "
                                      "pack manifests for the retrieval index, kvtc transforms",
                                      value=self.syncer.fetched_bytes)
            yield CounterMetricFamily("kvedge_edge_sync_fetched_packs", "packs fetched from the "
                                      "cloud and verified (by sync, by answers and by "
                                      "prefetch)", value=self.syncer.fetched_packs)
        if self.cache is not None:
            stats = self.cache.stats
            yield CounterMetricFamily("kvedge_edge_pack_cache_hits", "pack loads answered from "
                                      "packs decoded in memory", value=stats.hits)
            yield CounterMetricFamily("kvedge_edge_pack_cache_misses", "pack loads that read "
                                      "and decoded a pack from disk", value=stats.misses)
            evicted = CounterMetricFamily("kvedge_edge_pack_cache_evictions", "packs dropped: "
                                          "decoded ones from memory (LRU), files from disk "
                                          "(over --cache-bytes)", labels=["tier"])
            evicted.add_metric(["memory"], stats.memory_evictions)
            evicted.add_metric(["disk"], stats.disk_evictions)
            yield evicted
