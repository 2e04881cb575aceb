"""Metrics and request logs (common.metrics, edge.metrics, cloud.metrics) on real daemons: a
gateway on a local Ray and an edge on a tiny random model, both on loopback, each with its own
registry served by a MetricsServer; calls that succeed and fail, then /metrics scraped over
HTTP and the counters read by their labels. Counters are compared before and after each
test's calls, so the tests do not depend on each other's order.
"""
import json
import logging
import re
import ssl
import time
import urllib.error
import urllib.request

import grpc
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from daemons import in_process_gateway, write_kb
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.errors import InsecureListen, InvalidRequest
from kvedge.common.net.metrics import MetricsServer, daemon_registry
from kvedge.common.model.models import load_model
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.proto import kvedge_pb2_grpc as pb_grpc
from kvedge.common.net.rpc import metadata
from kvedge.common.net.tls import auto_server_tls
from kvedge.edge import DEFAULT_STRATEGY
from kvedge.edge.cli import main as kvedge_cli
from kvedge.edge.engine import EdgeEngine
from kvedge.edge.http_api import serve_http
from kvedge.edge.metrics import EdgeMetrics
from kvedge.edge.packcache import PackCache
from kvedge.edge.server import serve as serve_edge
from kvedge.edge.sync import Syncer, Target

MODEL = "tiny-llama"
DOCS = {"alpha.md": "# Alpha\n\nThe alpha code is 1234567.\n\nAlpha is a small harbour town.\n",
        "beta.txt": "Beta facts. The beta code is 7654321.\n\nBeta has a bridge of copper.\n"}
EDGE, CLOUD = "kvedge.v1.Edge", "kvedge.v1.Cloud"


def scrape(url: str, context: ssl.SSLContext | None = None) -> dict:
    """/metrics as {(sample name, frozenset of labels): value}."""
    text = urllib.request.urlopen(url, timeout=10, context=context).read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: dict, after: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    registry = daemon_registry()
    server, gateway, address, token = in_process_gateway(tmp_path_factory.mktemp("cloud"),
                                                         MODEL, 48, registry=registry)
    metrics = MetricsServer("127.0.0.1:0", registry)
    with CloudClient(address, token) as client:
        client.upload(write_kb(tmp_path_factory.mktemp("kb") / "kb", DOCS), "default", "served")
        info = client.wait_ready("default", "served", timeout=120)
        yield {"client": client, "token": token, "metrics": metrics.url, "gateway": gateway,
               "info": info, "tmp": tmp_path_factory}
    metrics.stop()
    server.stop(0)


@pytest.fixture(scope="module")
def edge(cloud):
    state = cloud["tmp"].mktemp("edge")
    loaded = load_model(MODEL)
    cache = PackCache(state / "packs", loaded.fingerprint)
    syncer = Syncer(cloud["client"], cache, state, [Target("default", "served")],
                    loaded.tokenizer.decode)
    syncer.sync_once()
    engine = EdgeEngine(loaded, cache, state)
    metrics = EdgeMetrics(daemon_registry(), cache, syncer, engine.sessions,
                          engine.rt.decode_format, engine.rt.prompt_format,
                          (engine.batch_invariant, engine.step_rows))
    server, port = serve_edge(engine, state, "127.0.0.1:0", metrics=metrics)
    http = serve_http(engine, state, [Target("default", "served")], "127.0.0.1:0",
                      max_new_tokens=4, metrics=metrics)
    scrape_server = MetricsServer("127.0.0.1:0", metrics.registry)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield {"stub": pb_grpc.EdgeStub(channel), "token": (state / "edge.token").read_text().strip(),
           "metrics": scrape_server.url, "http": f"http://127.0.0.1:{http.port}",
           "syncer": syncer, "engine": engine}
    channel.close()
    scrape_server.stop()
    http.stop()
    server.stop(0)


def ask(edge, kb="served", token=None, request_id=None, **fields):
    """Ask over the raw stub: (events, trailing metadata as a dict)."""
    meta = [*metadata(edge["token"] if token is None else token)]
    if request_id:
        meta.append(("x-request-id", request_id))
    fields.setdefault("max_new_tokens", 4)
    call = edge["stub"].Ask(pb.AskRequest(namespace="default", kb=kb, question="What is the "
                                          "alpha code?", top_k=2, **fields),
                            metadata=meta, timeout=60)
    try:
        events = list(call)
    except grpc.RpcError as err:
        return err, dict(err.trailing_metadata() or ())
    return events, dict(call.trailing_metadata())


# ---------------------------------------------------------------------- the edge


def test_calls_are_counted_by_final_status_and_return_their_request_id(edge):
    before = scrape(edge["metrics"])
    events, trailer = ask(edge, request_id="client-chosen-42")
    assert events[-1].HasField("done") and trailer["x-request-id"] == "client-chosen-42"
    err, trailer = ask(edge, kb="ghost", request_id="bad id forged=1")  # refused mid-stream
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert re.fullmatch(r"[0-9a-f]{32}", trailer["x-request-id"])  # a new id, not the forged one
    err, _ = ask(edge, token="")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    after = scrape(edge["metrics"])
    for code in ("OK", "NOT_FOUND", "UNAUTHENTICATED"):
        assert delta(before, after, "kvedge_rpc_requests_total", service=EDGE, method="Ask",
                     code=code) == 1, code
    assert delta(before, after, "kvedge_rpc_request_duration_seconds_count", service=EDGE,
                 method="Ask") == 3
    assert value(after, "process_resident_memory_bytes") > 0  # the daemon's own registry
    assert value(after, "kvedge_edge_decode_weights", format="fp32") == 1  # EdgeEngine's own
    assert value(after, "kvedge_edge_prompt_weights", format="fp32") == 1
    engine = edge["engine"]
    assert value(after, "kvedge_edge_batch_invariant") == int(engine.batch_invariant)
    assert value(after, "kvedge_edge_decode_step_rows") == engine.step_rows


def test_a_stream_the_client_cancels_is_counted_cancelled(edge):
    labels = dict(name="kvedge_rpc_requests_total", service=EDGE, method="Ask", code="CANCELLED")
    before = value(scrape(edge["metrics"]), **labels)
    call = edge["stub"].Ask(pb.AskRequest(namespace="default", kb="served", question="alpha?",
                                          max_new_tokens=200), metadata=metadata(edge["token"]))
    next(call)  # answering has begun: its status is OK so far
    call.cancel()
    deadline = time.monotonic() + 30
    while value(samples := scrape(edge["metrics"]), **labels) == before:
        assert time.monotonic() < deadline, "the cancelled Ask was never counted"
        time.sleep(0.1)
    assert value(samples, **labels) == before + 1
    while value(samples, "kvedge_edge_asks_in_flight"):  # the answer stops at its next token
        assert time.monotonic() < deadline
        samples = scrape(edge["metrics"])


def test_answers_fill_ttft_tpot_tokens_and_cache_counts(edge):
    before = scrape(edge["metrics"])
    done = [ask(edge, strategy="a3")[0][-1].done for _ in range(2)]
    after = scrape(edge["metrics"])
    assert delta(before, after, "kvedge_edge_ttft_seconds_count", strategy="a3") == 2
    assert delta(before, after, "kvedge_edge_ttft_seconds_sum", strategy="a3") == \
        pytest.approx(sum(d.ttft_s for d in done))
    assert delta(before, after, "kvedge_edge_tpot_seconds_count", strategy="a3") == 2
    assert delta(before, after, "kvedge_edge_answer_tokens_total", strategy="a3") == \
        sum(d.tokens for d in done) == 8
    drafts = [delta(before, after, "kvedge_edge_draft_tokens_total", outcome=outcome)
              for outcome in ("accepted", "rejected")]
    assert sum(drafts) > 0  # greedy answers draft from their prompt (batch.SPEC_ROWS)
    assert sum(delta(before, after, "kvedge_edge_answers_total", strategy="a3",
                     finish_reason=reason) for reason in ("stop", "length")) == 2
    hits = delta(before, after, "kvedge_edge_pack_cache_hits_total")
    misses = delta(before, after, "kvedge_edge_pack_cache_misses_total")
    assert hits + misses == 4 and hits >= 2  # two packs each; the second ask finds them decoded
    assert value(after, "kvedge_edge_asks_in_flight") == 0
    assert value(after, "kvedge_edge_asks_waiting") == 0


def test_sync_bytes_fetched_equal_the_packs_and_the_gateways_bytes_served(edge, cloud):
    samples, info = scrape(edge["metrics"]), cloud["info"]
    assert value(samples, "kvedge_edge_sync_fetched_bytes_total") == \
        sum(s.pack_bytes for s in info.segments) == edge["syncer"].fetched_bytes
    assert value(samples, "kvedge_edge_sync_fetched_packs_total") == len(info.segments)
    assert value(samples, "kvedge_edge_pack_cache_evictions_total", tier="disk") == 0
    before = scrape(cloud["metrics"])
    pack = info.segments[0]
    assert sum(len(c.data) for c in cloud["client"].fetch_pack("default", pack.pack_id)) == \
        pack.pack_bytes
    with pytest.raises(Exception, match="outside the pack"):  # a streaming method failing
        list(cloud["client"].fetch_pack("default", pack.pack_id, offset=pack.pack_bytes + 1))
    after = scrape(cloud["metrics"])
    assert delta(before, after, "kvedge_gateway_pack_bytes_served_total") == pack.pack_bytes
    for code in ("OK", "INVALID_ARGUMENT"):
        assert delta(before, after, "kvedge_rpc_requests_total", service=CLOUD,
                     method="FetchPack", code=code) == 1, code


def test_request_log_lines_carry_the_id_and_the_answer(edge, caplog):
    caplog.set_level(logging.INFO, logger="kvedge.requests")
    events, _ = ask(edge, request_id="log-me-7", strategy="recompute")
    (line,) = [r.getMessage() for r in caplog.records if "id=log-me-7 " in r.getMessage()]
    fields = dict(pair.split("=", 1) for pair in line.split(" "))
    assert fields["method"] == f"{EDGE}/Ask" and fields["status"] == "OK"
    assert fields["namespace"] == "default" and fields["kb"] == "served"
    assert fields["strategy"] == "recompute" and fields["tokens"] == "4"
    assert float(fields["ttft_s"]) > 0 and float(fields["duration_s"]) >= float(fields["ttft_s"])


def test_http_api_serves_metrics_and_request_ids(edge, caplog):
    caplog.set_level(logging.INFO, logger="kvedge.requests")
    before = scrape(edge["http"] + "/metrics")
    body = b'{"model": "default/served", "messages": [{"role": "user", "content": "alpha?"}]}'

    def chat(model_body: bytes, token: str):
        req = urllib.request.Request(edge["http"] + "/v1/chat/completions", data=model_body,
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json",
                                              "x-request-id": "http-1"})
        try:
            with urllib.request.urlopen(req, timeout=60) as reply:
                return reply.status, reply.headers["x-request-id"]
        except urllib.error.HTTPError as err:
            return err.code, err.headers["x-request-id"]

    assert chat(body, edge["token"]) == (200, "http-1")
    assert chat(body.replace(b"served", b"ghost"), edge["token"]) == (404, "http-1")
    after = scrape(edge["http"] + "/metrics")
    route = "/v1/chat/completions"
    for code in ("200", "404"):
        assert delta(before, after, "kvedge_http_requests_total", method="POST", route=route,
                     code=code) == 1, code
    assert delta(before, after, "kvedge_edge_answer_tokens_total",
                 strategy=DEFAULT_STRATEGY) == 4  # the HTTP API's default
    lines = [r.getMessage() for r in caplog.records if "id=http-1 " in r.getMessage()]
    assert any("kb=served" in line and "status=200" in line and "tokens=4" in line
               for line in lines), lines


def test_session_cache_counts_a_conversations_turns(edge):
    """Turn 1 of a conversation computes its prefix (a miss), turn 2 extends it (the KV of
    turn 1's prefix reused), a repeat of turn 2 finds it whole (a hit)."""
    def turn(messages):
        body = json.dumps({"model": "default/served", "max_tokens": 2, "messages": messages})
        req = urllib.request.Request(edge["http"] + "/v1/chat/completions", data=body.encode(),
                                     headers={"Authorization": f"Bearer {edge['token']}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as reply:
            return json.loads(reply.read())

    first = [{"role": "system", "content": "Session metrics."},
             {"role": "user", "content": "alpha?"}]
    before = scrape(edge["metrics"])
    answer = turn(first)["choices"][0]["message"]["content"]
    second = [*first, {"role": "assistant", "content": answer},
              {"role": "user", "content": "and beta?"}]
    reused = [turn(second)["kvedge"]["session_reused"] for _ in range(2)]
    after = scrape(edge["metrics"])
    counts = {outcome: delta(before, after, "kvedge_edge_session_prefixes_total",
                             outcome=outcome) for outcome in ("miss", "extended", "hit")}
    # turn 1's own prefix is new; turn 2's is extended from it (by turn 2, or by the idle edge
    # after turn 1's answer, as each answer's next prefix is), and the repeat finds it
    assert counts["miss"] == 1 and counts["extended"] >= 1 and counts["hit"] >= 1, counts
    assert delta(before, after, "kvedge_edge_session_reused_tokens_total") >= sum(reused) > 0


# ---------------------------------------------------------------------- the gateway


def test_gateway_reports_ingest_and_job_progress(cloud, tmp_path):
    client, url = cloud["client"], cloud["metrics"]
    before = scrape(url)
    client.upload(write_kb(tmp_path / "kb", {"g.md": "Gamma keeps the archive. " * 30}),
                  "default", "progress")
    seen = []
    while (info := client.get_kb("default", "progress")).status == "ingesting":
        samples = scrape(url)
        seen.append((value(samples, "kvedge_gateway_ingests_running"),
                     value(samples, "kvedge_gateway_ingest_segments_done"),
                     value(samples, "kvedge_gateway_ingest_segments_planned")))
    assert info.status == "ready" and seen and seen[0][0] == 1  # running while it ingested
    done = [d for running, d, _ in seen if running]  # a scrape may land just after the end
    assert done == sorted(done) and {p for *_, p in seen} <= {0, len(info.segments)}
    assert all(d <= p for _, d, p in seen if p)
    job = client.submit_job("default", ["progress"], "none", 1.0, "int8")
    assert list(client.watch_job("default", job.job_id))[-1].status == "done"
    after = scrape(url)
    assert value(after, "kvedge_gateway_ingests_running") == 0
    assert delta(before, after, "kvedge_gateway_jobs", state="done") == 1
    assert delta(before, after, "kvedge_gateway_job_contexts_compressed_total") == \
        len(info.segments)
    assert value(after, "kvedge_gateway_job_contexts_planned") == 0  # no job left unfinished
    assert delta(before, after, "kvedge_rpc_requests_total", service=CLOUD, method="Upload",
                 code="OK") == 1


# ---------------------------------------------------------------------- where /metrics listens


def test_metrics_server_follows_the_listen_rule_and_serves_tls(tmp_path):
    registry = daemon_registry()
    with pytest.raises(InsecureListen):
        MetricsServer("0.0.0.0:0", registry)
    with pytest.raises(InvalidRequest, match="HOST:PORT"):
        MetricsServer("9090", registry)
    tls = auto_server_tls(tmp_path, ["localhost", "127.0.0.1"])
    server = MetricsServer("127.0.0.1:0", registry, tls)
    try:
        assert server.url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        assert value(scrape(server.url, trusted), "process_resident_memory_bytes") > 0
        with pytest.raises(urllib.error.URLError):  # a client that does not trust the CA
            scrape(server.url)
    finally:
        server.stop()


def test_the_daemon_refuses_plaintext_metrics_off_loopback_before_starting(tmp_path):
    out = CliRunner().invoke(kvedge_cli, ["serve", "--kb", "x", "--state", str(tmp_path),
                                          "--metrics", "0.0.0.0:9090"])
    assert out.exit_code == 2 and "InsecureListen: refusing to listen on 0.0.0.0:9090" \
        in out.output, out.output
