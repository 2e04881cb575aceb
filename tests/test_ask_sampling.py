"""Sampling and stop strings over gRPC Ask (AskRequest temperature, top_p, seed, stop) and
`kvctl ask`'s flags for them, against a real edge daemon on loopback. A tiny random model
keeps it fast: answers are noise, compared exactly.

The KB is prefilled by the cloud's PrefillEngine and written by the edge's real Syncer
(bench.load.sync_local_kb), as in test_batching.
"""
import json

import grpc
import pytest
from click.testing import CliRunner

from kvedge.bench.load import sync_local_kb
from kvedge.apps.kvctl import kvctl
from kvedge.common.net.edge_client import EdgeClient
from kvedge.common.errors import InvalidRequest
from kvedge.common.model.models import load_model
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.rpc import metadata
from kvedge.edge.engine import EdgeEngine
from kvedge.edge.packcache import PackCache
from kvedge.edge.server import serve
from kvedge.edge.sync import Target

MODEL = "tiny-llama"
QUESTION = "What is the alpha code?"
DOCS = {"alpha.md": "# Alpha\n\nThe alpha code is 1234567.\n\nAlpha has a harbour.\n",
        "beta.md": "# Beta\n\nThe beta code is 7654321.\n\nBeta has a bridge.\n"}


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    folder, state = tmp_path_factory.mktemp("kb"), tmp_path_factory.mktemp("edge")
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    sync_local_kb(state, MODEL, folder, "facts", segment_tokens=48)
    loaded = load_model(MODEL)
    engine = EdgeEngine(loaded, PackCache(state / "packs", loaded.fingerprint), state)
    server, port = serve(engine, state, "127.0.0.1:0")
    address, token = f"127.0.0.1:{port}", (state / "edge.token").read_text().strip()
    with EdgeClient(address, token) as client:
        yield {"client": client, "engine": engine, "address": address, "token": token}
    server.stop(0)
    engine.close()


def ask(edge, **fields) -> tuple[str, pb.AskDone]:
    """The streamed text and the final AskDone of one answer (12 tokens at most, top_k 2)."""
    events = list(edge["client"].ask("default", "facts", QUESTION, top_k=2, max_new_tokens=12,
                                     **fields))
    return "".join(events[:-1]), events[-1]


def test_unset_sampling_fields_answer_greedily_as_before(edge):
    text, done = ask(edge)
    local = list(edge["engine"].ask(Target("default", "facts"), QUESTION, top_k=2,
                                    max_new_tokens=12))  # the engine's greedy default
    assert done.answer == local[-1].answer and done.tokens == local[-1].tokens
    assert ask(edge, temperature=0.0, seed=5)[1].answer == done.answer  # a seed alone: greedy


def test_the_same_seed_gives_the_same_answer(edge):
    greedy = ask(edge)[1].answer
    hot = [ask(edge, temperature=1.5, seed=seed)[1].answer for seed in (1, 1, 2, 3)]
    assert hot[0] == hot[1]
    assert len(set(hot[1:]) | {greedy}) > 1  # sampling changes the noise a tiny model says
    assert ask(edge, temperature=1.5, top_p=1e-6, seed=9)[1].answer == greedy  # nucleus of 1


def test_a_stop_string_ends_the_answer_and_is_left_out(edge):
    text, done = ask(edge)
    assert done.finish_reason == "length" and done.tokens == 12
    stop = next(text[i:i + 2] for i in range(2, len(text) - 1) if text[i:i + 2].strip())
    cut, done_cut = ask(edge, stop=["never in the answer", stop])
    assert done_cut.finish_reason == "stop" and stop not in cut
    assert cut == text[:text.index(stop)] and done_cut.answer == cut.strip()
    assert done_cut.tokens < done.tokens


@pytest.mark.parametrize("fields,match", [
    (dict(temperature=-0.5), "temperature must be a finite number in"),
    (dict(temperature=float("nan")), "temperature must be a finite number in"),
    (dict(temperature=float("inf")), "temperature must be a finite number in"),
    (dict(temperature=3.0), r"temperature must be a finite number in \[0, 2\]"),  # OpenAI's cap
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),  # unset is 1; an explicit 0 is refused
    (dict(top_p=1.5), "top_p must be in"),
    (dict(top_p=float("nan")), "top_p must be in"),
    (dict(seed=-1), r"seed must be in 0..2\*\*63-1"),  # int64 carries no seed above the range
    (dict(seed=-2**63), "seed must be in"),
    (dict(stop=["a", "b", "c", "d", "e"]), "at most 4 stop strings"),
    (dict(stop=[""]), "stop strings of 1-256"),
    (dict(stop=["x" * 257]), "stop strings of 1-256"),
])
def test_bad_values_are_invalid_argument(edge, fields, match):
    with pytest.raises(InvalidRequest, match=match):
        ask(edge, **fields)
    request = pb.AskRequest(kb="facts", question=QUESTION, **fields)
    with pytest.raises(grpc.RpcError) as err:
        list(edge["client"].stub.Ask(request, metadata=metadata(edge["token"]), timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("InvalidRequest: ")


def test_the_limits_themselves_are_accepted(edge):
    """The ends of each range answer; a seed above them cannot even be sent (int64)."""
    assert ask(edge, temperature=2.0, top_p=1.0, seed=2**63 - 1)[1].tokens > 0
    assert ask(edge, temperature=0.0, seed=0)[1].answer == ask(edge)[1].answer
    with pytest.raises(ValueError):
        pb.AskRequest(seed=2**64)


def test_kvctl_ask_sends_the_sampling_flags(edge):
    def kvctl_ask(*flags):
        out = CliRunner().invoke(kvctl, ["ask", QUESTION, "--kb", "facts", "--edge",
                                         edge["address"], "--token", edge["token"], "--top-k",
                                         "2", "--max-new-tokens", "12", "--json", *flags])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)

    text, _ = ask(edge)
    stop = text.strip()[2:4]
    got = kvctl_ask("--temperature", "1.5", "--top-p", "0.9", "--seed", "4", "--stop", stop,
                    "--stop", "zz-not-there")
    want = ask(edge, temperature=1.5, top_p=0.9, seed=4, stop=[stop, "zz-not-there"])[1]
    assert got["answer"] == want.answer and got["finish_reason"] == want.finish_reason
    out = CliRunner().invoke(kvctl, ["ask", QUESTION, "--kb", "facts", "--edge", edge["address"],
                                     "--token", edge["token"], "--top-p", "0"])
    assert out.exit_code != 0 and "InvalidRequest" in out.output
