"""The edge's OpenAI-compatible API, with the official `openai` client, against a real
`kvedge serve --http` daemon (its own process, gRPC beside HTTP) syncing from a real gateway
on a local Ray. A tiny random model keeps it fast: answers are noise, their shape is checked.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from daemons import in_process_gateway
from kvedge.common.net.auth import TokenStore
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.net.edge_client import EdgeClient
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.edge import DEFAULT_STRATEGY

MODEL = "tiny-llama"
DOCS = {"alpha.md": "# Alpha\n\nThe alpha code is 1234567.\n\nAlpha is a small harbour town.\n",
        "beta.txt": "Beta facts. The beta code is 7654321.\n\nBeta has a bridge of copper.\n"}
QUESTION = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the alpha code?"}]


VARIANT = "none-1-int4"  # the batch job's variant: no eviction, int4 codec


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    server, _, address, token = in_process_gateway(tmp_path_factory.mktemp("cloud"), MODEL, 48)
    yield {"address": address, "token": token}
    server.stop(0)


def upload_with_variant(cloud, folder):
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    with CloudClient(cloud["address"], cloud["token"]) as c:
        c.upload(folder, "default", "reg")
        c.wait_ready("default", "reg", timeout=120)
        job = c.submit_job("default", ["reg"], "none", 1.0, "int4")
        assert job.variant == VARIANT
        assert list(c.watch_job("default", job.job_id))[-1].status == "done"


class Daemon:
    """`kvedge serve` in a child process; its stderr is read as it comes."""

    def __init__(self, args, home):
        env = {**os.environ, "KVEDGE_HOME": str(home)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from kvedge.edge.cli import main; main()", "serve", *args],
            stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True).start()

    def wait_for(self, pattern: str, timeout: float = 90) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := re.search(pattern, line):
                    return match
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in:\n" + "".join(self.lines))


@pytest.fixture(scope="module")
def edge(cloud, tmp_path_factory):
    """The daemon starts first (loading its model) while the KB is prefilled in the cloud;
    it syncs the KB and its variant when they are ready."""
    state = tmp_path_factory.mktemp("edge")
    daemon = Daemon(["--cloud", cloud["address"], "--cloud-token", cloud["token"], "--kb", "reg",
                     "--kb", f"default/reg@{VARIANT}", "--state", str(state),
                     "--model", MODEL, "--address", "127.0.0.1:0", "--http", "127.0.0.1:0",
                     "--max-new-tokens", "6", "--sync-interval", "1"], state)
    try:  # the daemon is stopped however its setup ends
        upload_with_variant(cloud, tmp_path_factory.mktemp("kb"))
        url = daemon.wait_for(r"OpenAI-compatible API on (\S+)")[1]
        grpc_port = daemon.wait_for(r"edge listening on 127\.0\.0\.1:(\d+)")[1]
        daemon.wait_for(rf"synced default/reg@{VARIANT}:")
        daemon.wait_for(r"synced default/reg:")
        token = (state / "edge.token").read_text().strip()
        other = TokenStore(state / "tokens.json").issue("tenant-b", ["tenant-b"])
        yield {"url": url, "token": token, "other": other, "daemon": daemon, "state": state,
               "grpc": f"127.0.0.1:{grpc_port}", "variant": VARIANT}
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.kill()


def client(edge, token=None):
    return openai.OpenAI(base_url=edge["url"], api_key=token or edge["token"], max_retries=0)


def chat(edge, model="default/reg", token=None, **kw):
    kw.setdefault("max_tokens", 6)
    return client(edge, token).chat.completions.create(model=model, messages=QUESTION, **kw)


def test_models_are_the_served_kbs_a_token_may_read(edge):
    ids = [m.id for m in client(edge).models.list()]
    assert ids == ["default/reg", f"default/reg@{edge['variant']}"]
    card = client(edge).models.retrieve("reg")  # the default namespace may be left out
    assert card.id == "default/reg" and card.owned_by == "default" and card.kvedge["synced"]
    assert list(client(edge, edge["other"]).models.list()) == []


def test_a_completion_reports_usage_and_reuse_costs(edge):
    out = chat(edge)
    choice = out.choices[0]
    assert out.object == "chat.completion" and out.model == "default/reg"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("length", "stop")
    assert out.usage.completion_tokens <= 6 and out.usage.prompt_tokens > 20
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    costs = out.kvedge
    assert costs["strategy"] == DEFAULT_STRATEGY and costs["ttft_s"] > 0 and costs["bytes_loaded"] > 0
    assert costs["kv_bytes"] > 0 and costs["fp16_bytes"] > 0 and costs["segments"]
    # the same answer without `default/`; greedy by default, so it repeats
    assert chat(edge, "reg").choices[0].message.content == choice.message.content


def test_strategy_options_and_top_k_ride_in_the_extension_field(edge):
    def costs(**ext):
        return chat(edge, extra_body={"kvedge": ext}).kvedge

    full = costs(strategy="recompute", top_k=1)
    assert full["strategy"] == "recompute" and len(full["segments"]) == 1
    assert costs(strategy="a3", options={"ratio": 0}, top_k=1)["recomputed_tokens"] == 0
    assert full["recomputed_tokens"] > 0
    variant = chat(edge, f"reg@{edge['variant']}")
    assert variant.model == f"default/reg@{edge['variant']}"
    # the int4 variant against the base's default codec (5-bit keys, 4-bit values)
    assert variant.kvedge["bytes_loaded"] < chat(edge).kvedge["bytes_loaded"]


def test_streaming_sends_the_same_answer_in_chunks(edge):
    plain = chat(edge, max_tokens=8)
    chunks = list(chat(edge, max_tokens=8, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == plain.choices[0].message.content
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == plain.choices[0].finish_reason
    assert finish[0].kvedge["ttft_s"] > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        plain.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


def test_sampling_is_seeded_and_stop_strings_end_the_answer(edge):
    def sampled(seed):
        return chat(edge, temperature=1.5, top_p=0.95, seed=seed, max_tokens=8).choices[0]

    assert sampled(3).message.content == sampled(3).message.content
    raw = "".join(c.choices[0].delta.content or ""
                  for c in chat(edge, max_tokens=10, stream=True) if c.choices)
    stop = raw[len(raw) // 2:len(raw) // 2 + 2]
    cut = chat(edge, max_tokens=10, stop=[stop, "never-said"]).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == raw[:raw.find(stop)].strip()
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in chat(edge, max_tokens=10, stop=stop, stream=True) if c.choices)
    assert streamed == raw[:raw.find(stop)]  # no piece of the stop string was sent


def test_tokens_are_checked_like_grpc(edge):
    with pytest.raises(openai.AuthenticationError) as err:
        chat(edge, token="kve_forged")
    assert err.value.status_code == 401 and err.value.code == "unauthenticated"
    with pytest.raises(openai.PermissionDeniedError) as err:
        chat(edge, token=edge["other"])  # a token for tenant-b asks default/reg
    assert err.value.status_code == 403 and err.value.type == "permission_error"
    with pytest.raises(openai.PermissionDeniedError):  # before looking the model up
        chat(edge, "tenant-a/nothing", token=edge["other"])


def test_unknown_models_are_404_with_openai_error_shape(edge):
    with pytest.raises(openai.NotFoundError) as err:
        chat(edge, "default/ghost")
    assert err.value.code == "model_not_found" and err.value.param == "model"
    assert "GET /v1/models" in err.value.message
    with pytest.raises(openai.NotFoundError):
        client(edge).models.retrieve("default/reg@other-variant")


@pytest.mark.parametrize("kw,param", [
    (dict(temperature=5), "temperature"),
    (dict(temperature=3.0), "temperature"),  # OpenAI's range is [0, 2]
    (dict(top_p=0), "top_p"),
    (dict(seed=2**64), "seed"),  # beyond int64: what a torch generator takes
    (dict(seed=-1), "seed"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=2), "n"),
    (dict(extra_body={"logit_bias": {"1": 5}}), "logit_bias"),
    (dict(extra_body={"kvedge": {"strategy": "telepathy"}}), "kvedge.strategy"),
    (dict(extra_body={"kvedge": {"options": {"ratio": 7}}}), "kvedge.options"),
    (dict(extra_body={"kvedge": {"top_k": 0}}), "kvedge.top_k"),
    (dict(stop=["a", "b", "c", "d", "e"]), None),
    (dict(model="a/b/c"), "model"),
])
def test_bad_parameters_are_400_naming_the_field(edge, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        chat(edge, **{"model": "default/reg", **kw})
    assert err.value.status_code == 400 and err.value.param == param
    assert err.value.type == "invalid_request_error"


@pytest.mark.parametrize("field", ['"temperature": NaN', '"temperature": Infinity',
                                   '"top_p": NaN'])
def test_sampling_fields_that_are_no_number_are_400(edge, field):
    """JSON as Python writes it (OpenAI's client refuses to send NaN): checked by Sampler,
    as over gRPC, not left to become a 500 deep in sampling."""
    body = '{"model": "reg", "messages": [{"role": "user", "content": "hi"}], %s}' % field
    reply = httpx.post(f"{edge['url']}/chat/completions", content=body, timeout=30,
                       headers={"authorization": f"Bearer {edge['token']}",
                                "content-type": "application/json"})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == field.split('"')[1] and error["code"] == "invalid_request"
    assert "must be" in error["message"]


def test_a_question_needs_a_user_message(edge):
    with pytest.raises(openai.BadRequestError, match="no user message"):
        client(edge).chat.completions.create(
            model="reg", messages=[{"role": "system", "content": "hi"}])


TURN_1 = [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "What is the alpha code?"}]


def test_a_conversation_is_the_prompt_and_its_next_turn_reuses_its_kv(edge):
    """Earlier turns and the system message are read (more prompt tokens than the bare
    question); turn 2 reuses the KV of turn 1's prefix, and a repeat of turn 2 all of its
    own; the answer is the same whether the prefix KV was computed or found (greedy)."""
    def ask(messages):
        return client(edge).chat.completions.create(model="reg", messages=messages,
                                                    max_tokens=4)

    bare = ask(TURN_1[1:])
    first = ask(TURN_1)
    assert first.usage.prompt_tokens > bare.usage.prompt_tokens
    assert bare.kvedge["session_reused"] == 0 and first.usage.dropped_turns == 0
    turn_2 = [*TURN_1, {"role": "assistant", "content": first.choices[0].message.content},
              {"role": "user", "content": "And the beta code?"}]
    second, again = ask(turn_2), ask(turn_2)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens
    # turn 1's prefix at least (turn 2's whole when the idle edge computed it after turn 1)
    assert 0 < second.kvedge["session_reused"] <= again.kvedge["session_reused"]
    assert again.choices[0].message.content == second.choices[0].message.content


def test_a_long_history_loses_its_oldest_turns_and_a_too_long_prompt_is_400(edge):
    turns = []
    for i in range(12):  # ~12 × 2 × 450 byte-tokens: over tiny-llama's 2,048
        turns += [{"role": "user", "content": f"Question {i}? " + "word " * 90},
                  {"role": "assistant", "content": "answer " * 60}]
    out = client(edge).chat.completions.create(
        model="reg", messages=[*turns, {"role": "user", "content": "And now?"}], max_tokens=4)
    assert out.usage.dropped_turns > 0 and out.usage.prompt_tokens <= 2048
    reply = httpx.post(f"{edge['url']}/chat/completions",
                       headers={"Authorization": f"Bearer {edge['token']}"},
                       json={"model": "reg", "max_tokens": 4, "messages": [
                           {"role": "system", "content": "rule " * 600},
                           {"role": "user", "content": "And now?"}]})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["code"] == "context_length_exceeded", error


def test_grpc_answers_beside_http_from_the_same_daemon(edge):
    with EdgeClient(edge["grpc"], edge["token"]) as c:
        done = list(c.ask("default", "reg", "What is the alpha code?", max_new_tokens=6))[-1]
    assert isinstance(done, pb.AskDone) and done.finish_reason in ("length", "stop")
    # the same question without QUESTION's system message, which is part of an HTTP prompt
    alone = client(edge).chat.completions.create(model="reg", messages=QUESTION[1:], max_tokens=6)
    assert done.answer == alone.choices[0].message.content


def test_https_with_the_daemons_certificate(tmp_path):
    """--tls auto's certificate serves HTTPS too; a client that trusts its CA connects."""
    from kvedge.common.model.models import load_model
    from kvedge.common.net.tls import server_tls
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.http_api import serve_http
    from kvedge.edge.sync import Target

    tls = server_tls(tmp_path, "127.0.0.1:0", "auto", None, None)
    token = TokenStore(tmp_path / "tokens.json").issue("t", ["*"])
    engine = EdgeEngine(load_model(MODEL), None, tmp_path)
    http = serve_http(engine, tmp_path, [Target("default", "reg")], "127.0.0.1:0", tls=tls)
    try:
        assert http.url.startswith("https://")
        trusted = openai.OpenAI(base_url=http.url, api_key=token, max_retries=0,
                                http_client=openai.DefaultHttpxClient(
                                    verify=str(tmp_path / "tls" / "ca.pem")))
        card = trusted.models.retrieve("reg")
        assert card.id == "default/reg" and not card.kvedge["synced"]
        with pytest.raises(openai.APIConnectionError):  # the system's CAs do not know it
            openai.OpenAI(base_url=http.url, api_key=token, max_retries=0).models.list()
    finally:
        http.stop()


def test_sigterm_stops_grpc_and_http_together(edge):
    """Last in the module: the daemon stops, cleanly, and its HTTP port with it."""
    port = int(edge["url"].rsplit(":", 1)[1].split("/")[0])
    edge["daemon"].proc.send_signal(signal.SIGTERM)
    assert edge["daemon"].proc.wait(timeout=30) == 0, "".join(edge["daemon"].lines)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
