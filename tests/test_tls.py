"""TLS with real handshakes on loopback, the token check on every RPC, clean shutdown on SIGTERM.

A TLS gateway (a real local Ray, the tiny random model) and a TLS edge that syncs from it over
TLS; the handshake failures (no TLS on one side, an untrusted CA, a wrong host, no client
certificate) against small health-only servers; the daemons' commands as real processes.
"""
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from daemons import in_process_gateway
from kvedge.apps.kvctl import kvctl
from kvedge.apps.demo import free_port
from kvedge.common.net import tls
from kvedge.common.net.auth import PermissionDenied, TokenStore, Unauthenticated
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.net.edge_client import EdgeClient
from kvedge.common.errors import InsecureListen, TLSError
from kvedge.common.model.models import load_model
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.rpc import metadata, raise_remote, serve_grpc, wait_healthy
from kvedge.edge.cli import main as kvedge_cli
from kvedge.edge.engine import EdgeEngine
from kvedge.edge.packcache import PackCache
from kvedge.edge.server import serve as serve_edge
from kvedge.edge.sync import Syncer, Target

MODEL = "tiny-llama"
DOCS = {"alpha.md": "# Alpha\n\nThe alpha code is 1234567.\n",
        "beta.txt": "Beta facts. The beta code is 7654321.\n"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    """A gateway over TLS (`--tls auto` material in its data dir) with one ready KB."""
    data = tmp_path_factory.mktemp("cloud")
    server_tls = tls.server_tls(data, "127.0.0.1:0", "auto", None, None)
    server, _, address, token = in_process_gateway(data, MODEL, 48, tls=server_tls)
    info = {"address": address, "token": token, "data": data, "ca": data / "tls" / "ca.pem"}
    kb = tmp_path_factory.mktemp("kb")
    for name, text in DOCS.items():
        (kb / name).write_text(text)
    with CloudClient(info["address"], info["token"], tls.ClientTLS(info["ca"])) as client:
        client.upload(kb, "default", "served")
        client.wait_ready("default", "served", timeout=120)
    yield info
    server.stop(0)


@pytest.fixture(scope="module")
def edge(cloud, tmp_path_factory):
    """An edge over TLS whose packs came from the gateway over TLS."""
    state = tmp_path_factory.mktemp("edge")
    loaded = load_model(MODEL)
    cache = PackCache(state / "packs", loaded.fingerprint)
    with CloudClient(cloud["address"], cloud["token"], tls.ClientTLS(cloud["ca"])) as client:
        fetched = Syncer(client, cache, state, [Target("default", "served")],
                         loaded.tokenizer.decode).sync_once()
    server_tls = tls.server_tls(state, "127.0.0.1:0", "auto", None, None)
    server, port = serve_edge(EdgeEngine(loaded, cache, state), state, "127.0.0.1:0",
                              tls=server_tls)
    yield {"address": f"127.0.0.1:{port}", "token": (state / "edge.token").read_text().strip(),
           "state": state, "ca": state / "tls" / "ca.pem", "fetched": fetched}
    server.stop(0)


def health_server(server_tls=None, address="127.0.0.1:0", insecure=False):
    """A server with only health checking: enough for a handshake."""
    server, port = serve_grpc(lambda srv: None, address, [], 2, server_tls, insecure)
    return server, f"127.0.0.1:{port}"


# ---------------------------------------------------------------------- material

def test_auto_material_is_made_once_then_reused(tmp_path):
    first = tls.server_tls(tmp_path, "127.0.0.1:50051", "auto", None, None)
    folder = tmp_path / "tls"
    assert first.cert == folder / "server.pem" and first.key == folder / "server.key"
    assert mode(folder / "ca.key") == 0o600 and mode(folder / "server.key") == 0o600
    assert not list(folder.glob(".*"))  # no temporary files left behind
    saved = {p.name: p.read_bytes() for p in folder.iterdir()}
    tls.server_tls(tmp_path, "127.0.0.1:50051", "auto", None, None)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == saved
    # a host the certificate does not name: a new server certificate from the same CA
    tls.server_tls(tmp_path, "10.1.2.3:50051", "auto", None, None, hosts=["kv.example"])
    assert (folder / "ca.pem").read_bytes() == saved["ca.pem"]
    assert (folder / "server.pem").read_bytes() != saved["server.pem"]
    assert tls._covers((folder / "server.pem").read_bytes(), saved["ca.pem"],
                       ["localhost", "127.0.0.1", "::1", "10.1.2.3", "kv.example"])


def test_tls_options_that_do_not_fit_together_are_named_errors(tmp_path):
    with pytest.raises(TLSError, match="--tls-key"):
        tls.server_tls(tmp_path, "127.0.0.1:1", None, "cert.pem", None)
    with pytest.raises(TLSError, match="drop --tls-cert"):
        tls.server_tls(tmp_path, "127.0.0.1:1", "auto", "cert.pem", "key.pem")
    with pytest.raises(TLSError, match="cannot read the TLS key .*absent.key"):
        tls.server_tls(tmp_path, "127.0.0.1:1", None, "absent.pem", str(tmp_path / "absent.key"))


# ---------------------------------------------------------------------- the services over TLS

def test_gateway_and_edge_answer_over_tls(cloud, edge):
    assert edge["fetched"] == {"default/served": 2}  # the sync went over TLS
    with CloudClient(cloud["address"], cloud["token"], tls.ClientTLS(cloud["ca"])) as client:
        assert [kb.kb for kb in client.list_kbs("default")] == ["served"]
    with EdgeClient(edge["address"], edge["token"], tls.ClientTLS(edge["ca"])) as client:
        done = list(client.ask("default", "served", "beta code?", max_new_tokens=3))[-1]
    assert isinstance(done, pb.AskDone) and done.tokens == 3


def test_kvctl_takes_the_ca_from_an_option_or_the_environment(cloud, edge):
    runner = CliRunner()
    args = ["kb", "list", "--cloud", cloud["address"], "--token", cloud["token"]]
    out = runner.invoke(kvctl, [*args, "--tls-ca", str(cloud["ca"])])
    assert out.exit_code == 0 and "served" in out.output, out.output
    out = runner.invoke(kvctl, args, env={"KVEDGE_TLS_CA": str(cloud["ca"])})
    assert out.exit_code == 0 and "served" in out.output, out.output
    out = runner.invoke(kvctl, ["ask", "alpha code?", "--kb", "served", "--edge", edge["address"],
                                "--token", edge["token"], "--tls-ca", str(edge["ca"]),
                                "--max-new-tokens", "2", "--json"])
    assert out.exit_code == 0 and '"tokens": 2' in out.output, out.output


# ---------------------------------------------------------------------- failed handshakes

def test_a_client_without_the_ca_gets_a_clear_error(cloud, tmp_path):
    with CloudClient(cloud["address"], cloud["token"]) as plaintext:
        with pytest.raises(TLSError, match="uses TLS and this client does not: pass --tls-ca"):
            plaintext.list_kbs()
    other_ca = tls.server_tls(tmp_path, "127.0.0.1:1", "auto", None, None).cert.parent / "ca.pem"
    for trusted in (other_ca, None):  # another CA; the system's store
        with CloudClient(cloud["address"], cloud["token"], tls.ClientTLS(trusted)) as client:
            with pytest.raises(TLSError, match="is not signed by the CA this client trusts"):
                client.list_kbs()
    out = CliRunner().invoke(kvctl, ["kb", "list", "--cloud", cloud["address"], "--token",
                                     cloud["token"]], env={"KVEDGE_TLS_CA": None})
    assert out.exit_code == 2 and out.output.startswith("error: TLSError: ") \
        and "Traceback" not in out.output, out.output


def test_tls_to_a_plaintext_server_is_a_clear_error(cloud):
    server, address = health_server()
    try:
        with pytest.raises(TLSError, match="does not speak TLS"):
            wait_healthy(address, 10, tls.ClientTLS(cloud["ca"]))
    finally:
        server.stop(0)


def test_a_certificate_for_another_host_fails(tmp_path):
    ca, ca_key = tls.new_ca()
    cert, key = tls.issue(ca, ca_key, "elsewhere", ["elsewhere.example"])
    for name, data in {"ca.pem": ca, "cert.pem": cert, "key.pem": key}.items():
        (tmp_path / name).write_bytes(data)
    server, address = health_server(tls.ServerTLS(tmp_path / "cert.pem", tmp_path / "key.pem"))
    try:
        with pytest.raises(TLSError, match="does not name '127.0.0.1'"):
            wait_healthy(address, 10, tls.ClientTLS(tmp_path / "ca.pem"))
    finally:
        server.stop(0)


def test_mutual_tls_needs_a_client_certificate_the_ca_signed(tmp_path):
    server_tls = tls.server_tls(tmp_path, "127.0.0.1:0", "auto", None, None)
    ca = server_tls.cert.parent / "ca.pem"
    out = CliRunner().invoke(kvctl, ["cloud", "client-cert", "edge-1", "--data", str(tmp_path),
                                     "--out", str(tmp_path / "certs")])
    assert out.exit_code == 0, out.output
    cert, key = tmp_path / "certs" / "edge-1.pem", tmp_path / "certs" / "edge-1.key"
    assert mode(key) == 0o600
    server, address = health_server(tls.ServerTLS(server_tls.cert, server_tls.key, ca))
    try:
        with pytest.raises(TLSError, match="client certificate"):
            wait_healthy(address, 10, tls.ClientTLS(ca))
        wait_healthy(address, 10, tls.ClientTLS(ca, cert, key))
        stranger = tls.server_tls(tmp_path / "other", "127.0.0.1:0", "auto", None, None)
        with pytest.raises(TLSError):  # a certificate another CA signed
            wait_healthy(address, 10, tls.ClientTLS(ca, stranger.cert, stranger.key))
    finally:
        server.stop(0)


# ---------------------------------------------------------------------- where a daemon listens

@pytest.mark.parametrize("address,loopback", [
    ("127.0.0.1:50051", True), ("localhost:0", True), ("[::1]:50051", True),
    ("unix:/tmp/kvedge.sock", True), ("0.0.0.0:50051", False), ("[::]:50051", False),
    (":50051", False), ("10.0.0.7:50051", False)])
def test_plaintext_is_refused_off_loopback(address, loopback):
    if loopback:
        tls.check_listen(address, None)
    else:
        with pytest.raises(InsecureListen, match="--tls-cert/--tls-key .*--insecure"):
            tls.check_listen(address, None)
    tls.check_listen(address, None, insecure=True)
    tls.check_listen(address, tls.ServerTLS(Path("c"), Path("k")))


def test_the_daemons_refuse_before_starting_and_insecure_allows_it(tmp_path):
    out = CliRunner().invoke(kvedge_cli, ["serve", "--kb", "x", "--address", "0.0.0.0:0",
                                          "--state", str(tmp_path)])
    assert out.exit_code == 2 and "error: InsecureListen: refusing to listen on 0.0.0.0:0" \
        in out.output, out.output
    with pytest.raises(InsecureListen):
        health_server(address="0.0.0.0:0")
    server, _ = health_server(address="0.0.0.0:0", insecure=True)
    server.stop(0)


# ---------------------------------------------------------------------- tokens on every RPC

def _methods():
    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            yield pytest.param(service.name, method, id=f"{service.name}.{method.name}")


def _call(address, ca, service, method, token):
    """Call `method` the generic way (no stub), with requests naming namespace "default"."""
    request_cls = getattr(pb, method.input_type.name)
    fields = {"namespace": "default", "kb": "served", "job_id": "j", "pack_id": "p",
              "question": "alpha code?", "kbs": ["served"], "method": "snapkv"}
    request = request_cls(**{k: v for k, v in fields.items()
                             if k in request_cls.DESCRIPTOR.fields_by_name})
    if method.client_streaming:  # Upload: a header, then a chunk
        header = pb.UploadHeader(namespace="default", kb="served",
                                 files=[pb.FileEntry(path="a.md", sha256="0" * 64, size=1)])
        request = iter([pb.UploadChunk(header=header),
                        pb.UploadChunk(chunk=pb.FileChunk(sha256="0" * 64, data=b"x"))])
    kind = ("stream" if method.client_streaming else "unary") + "_" + \
        ("stream" if method.server_streaming else "unary")
    with grpc.secure_channel(address, tls.ClientTLS(ca).credentials()) as channel:
        call = getattr(channel, kind)(f"/{service}/{method.name}",
                                      request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=lambda b: b)
        reply = call(request, metadata=metadata(token), timeout=30)
        return list(reply) if method.server_streaming else reply


@pytest.mark.parametrize("service,method", _methods())
def test_every_rpc_checks_the_token(cloud, edge, service, method):
    """No token: UNAUTHENTICATED; another namespace's token: PERMISSION_DENIED; never data."""
    side = cloud if service == "Cloud" else edge
    store = side["data"] if service == "Cloud" else side["state"]
    outsider = TokenStore(store / "tokens.json").issue("outsider", ["other-ns"])
    for token, error, code in ((None, Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
                               ("kve_unknown", Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
                               (outsider, PermissionDenied, grpc.StatusCode.PERMISSION_DENIED)):
        with pytest.raises(grpc.RpcError) as failed:
            _call(side["address"], side["ca"], f"kvedge.v1.{service}", method, token)
        assert failed.value.code() == code, failed.value.details()
        with pytest.raises(error):
            raise_remote(failed.value)


def test_a_list_without_a_namespace_shows_an_outsider_nothing(cloud):
    outsider = TokenStore(cloud["data"] / "tokens.json").issue("outsider", ["other-ns"])
    with CloudClient(cloud["address"], outsider, tls.ClientTLS(cloud["ca"])) as client:
        assert client.list_kbs() == [] and client.list_jobs() == []


# ---------------------------------------------------------------------- clean shutdown

def _start(cli: str, args: list[str], log: Path, env=None) -> subprocess.Popen:
    module, func = cli.split(":")
    code = f"from {module} import {func}; {func}()"
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-c", code, *args], stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                                start_new_session=True)


def _stop(proc: subprocess.Popen, log: Path, timeout: float = 40) -> str:
    """SIGTERM, then the exit code must be 0 within `timeout` and nothing aborted."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"still running {timeout} s after SIGTERM:\n{log.read_text()[-3000:]}")
    output = log.read_text()
    assert code == 0 and "terminate called" not in output, output[-3000:]
    return output


def _wait_for(predicate, proc, log, timeout=90):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def test_edge_daemon_stops_cleanly_on_sigterm_with_an_answer_in_flight(cloud, tmp_path):
    """`kvedge serve` over TLS, syncing from the TLS gateway: SIGTERM while an answer streams
    lets the answer finish (grace period), stops the sync thread, exits 0."""
    address, state, log = f"127.0.0.1:{free_port()}", tmp_path / "edge", tmp_path / "edge.log"
    proc = _start("kvedge.edge.cli:main", [
        "serve", "--cloud", cloud["address"], "--cloud-tls-ca", str(cloud["ca"]),
        "--kb", "default/served", "--address", address, "--state", str(state),
        "--model", MODEL, "--sync-interval", "0.5", "--tls", "auto"],
        log, {"KVEDGE_TOKEN": cloud["token"]})
    try:
        _wait_for((state / "kbs" / "default" / "served.json").exists, proc, log)
        ca = tls.ClientTLS(state / "tls" / "ca.pem")
        wait_healthy(address, 30, ca)
        pieces, started = [], threading.Event()

        def ask():
            with EdgeClient(address, (state / "edge.token").read_text().strip(), ca) as client:
                for event in client.ask("default", "served", "alpha code?", max_new_tokens=400):
                    pieces.append(event)
                    started.set()

        asker = threading.Thread(target=ask)
        asker.start()
        assert started.wait(60)
        output = _stop(proc, log)
        asker.join(30)
        assert isinstance(pieces[-1], pb.AskDone)  # the answer in flight finished
        assert "edge stopped" in output
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_gateway_stops_cleanly_on_sigterm(cloud, tmp_path):
    """`kvctl cloud up --tls auto`, joined to this test's Ray (starting one more costs ~10 s;
    a gateway with Ray in-process stops the same way): SIGTERM stops the server and Ray's
    driver, exit 0."""
    import ray

    address, data, log = f"127.0.0.1:{free_port()}", tmp_path / "cloud", tmp_path / "cloud.log"
    proc = _start("kvedge.apps.kvctl:kvctl", [
        "cloud", "up", "--data", str(data), "--address", address, "--model", MODEL,
        "--tls", "auto", "--ray-address", ray.get_runtime_context().gcs_address], log)
    try:
        _wait_for((data / "admin.token").exists, proc, log)
        wait_healthy(address, 60, tls.ClientTLS(data / "tls" / "ca.pem"))
        assert "gateway stopped" in _stop(proc, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
