"""The gateway's metrics (docs/metrics.md), read from its state when scraped: pack bytes
served, ingests running and their segments, batch jobs by state and their contexts (jobs run
by `kvctl job run` on the same catalog count too)."""
from __future__ import annotations

from collections import Counter

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from kvedge.cloud.catalog import BASE
from kvedge.common.errors import NotFound

JOB_STATES = ("queued", "running", "cancelling", "done", "failed", "cancelled")
ACTIVE = ("queued", "running", "cancelling")


class GatewayMetrics:
    """A prometheus collector over one Gateway."""

    def __init__(self, gateway):
        self.gateway = gateway

    def collect(self):
        yield CounterMetricFamily("kvedge_gateway_pack_bytes_served", "pack bytes sent by "
                                  "FetchPack", value=self.gateway.bytes_served)
        yield CounterMetricFamily("kvedge_gateway_segments_prefilled", "segments ingests "
                                  "prefilled", value=self.gateway.segments_prefilled)
        yield CounterMetricFamily("kvedge_gateway_segments_reused", "segments ingests found "
                                  "prefilled already (an ingest resumed, a file unchanged)",
                                  value=self.gateway.segments_reused)
        yield from self.ingests()
        yield from self.jobs()

    def ingests(self):
        progress = []
        for ns, name in self.gateway.ingesting():
            try:
                status = self.gateway.catalog.get(ns, name, BASE).variants[BASE]
            except (NotFound, KeyError):  # removed meanwhile
                continue
            progress.append((status["done"], status["total"]))
        yield GaugeMetricFamily("kvedge_gateway_ingests_running", "knowledge bases being "
                                "ingested", value=len(progress))
        yield GaugeMetricFamily("kvedge_gateway_ingest_segments_done", "segments prefilled and "
                                "stored, over the running ingests",
                                value=sum(done for done, _ in progress))
        yield GaugeMetricFamily("kvedge_gateway_ingest_segments_planned", "segments to ingest, "
                                "over the running ingests", value=sum(t for _, t in progress))

    def jobs(self):
        jobs = self.gateway.catalog.jobs(None)
        counts = Counter(job.status for job in jobs)
        by_state = GaugeMetricFamily("kvedge_gateway_jobs", "batch jobs by state",
                                     labels=["state"])
        for state in sorted(set(JOB_STATES) | set(counts)):
            by_state.add_metric([state], counts[state])
        yield by_state
        yield CounterMetricFamily("kvedge_gateway_job_contexts_compressed", "contexts "
                                  "compressed by every job", value=sum(j.done for j in jobs))
        active = [job for job in jobs if job.status in ACTIVE]
        yield GaugeMetricFamily("kvedge_gateway_job_contexts_done", "contexts compressed, over "
                                "the unfinished jobs", value=sum(j.done for j in active))
        yield GaugeMetricFamily("kvedge_gateway_job_contexts_planned", "contexts to compress, "
                                "over the unfinished jobs", value=sum(j.total for j in active))
