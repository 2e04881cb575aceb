"""Bad input, generated: every RPC's fields on a live gateway and a live edge (real processes on
loopback), request bytes that are not a message at all, pack bytes, upload folders.

Whatever comes in ends in a named error (its type leads the status detail, so the client
raises it again by name) or a valid answer — never INTERNAL, never a stack trace —, the
services are still up afterwards, and nothing was written: not the catalog, not the pack
store, not the staging area (beyond an unfinished transfer's `.part`, kept so that it can
resume), not the edge's state. The edge's peak resident memory under the fuzzing is measured
and bounded.
"""
import hashlib
import os
import tempfile
from collections import Counter
from pathlib import Path

import grpc
import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from daemons import EdgeProcess, GatewayProcess
from kvedge.cloud.eviction import METHODS
from kvedge.cloud.workers import start_ray
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.errors import KvedgeError
from kvedge.common.kbfiles import MAX_FILE_BYTES
from kvedge.common.model.models import load_model
from kvedge.common.pack.codecs import get_codec
from kvedge.common.pack.codecs.kvtc import default_store
from kvedge.common.pack.errors import ModelMismatch, PackCorrupt, PackError
from kvedge.common.pack.format import read_pack
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.rpc import MAX_HEADS
from kvedge.common.net.proto import kvedge_pb2_grpc as pb_grpc
from kvedge.common.registry import options_of
from kvedge.common.net.rpc import metadata, named_errors
from kvedge.edge.packcache import PackCache
from kvedge.edge.strategies import STRATEGIES

MODEL = "tiny-llama"
DOCS = {"alpha.md": "# Alpha\n\nThe alpha code is 1234567.\n\nAlpha is a small harbour town.\n",
        "notes/beta.txt": "Beta facts. The beta code is 7654321.\n"}
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
NAMED = set(named_errors()) - {"KvedgeError"}
EDGE_RSS_BOUND = 2 << 30  # a daemon holding the tiny model idles at a few hundred MB


# ---------------------------------------------------------------------- live daemons


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    start_ray(num_cpus=2)
    root = tmp_path_factory.mktemp("fuzz")
    gateway = GatewayProcess(root / "cloud", MODEL, ray.get_runtime_context().gcs_address,
                             "--segment-tokens", "24").start()
    kb = root / "kb"
    for name, text in DOCS.items():
        (kb / name).parent.mkdir(parents=True, exist_ok=True)
        (kb / name).write_text(text)
    with CloudClient(gateway.address, gateway.token) as client:
        client.upload(kb, "default", "kb")
        gateway.info = client.wait_ready("default", "kb", timeout=180)
    # kvtc transforms the gateway can serve (its KVEDGE_HOME is this process's), if any
    gateway.transforms = sorted(p.stem for p in default_store().root.glob("*.kvtc"))
    gateway.channel = grpc.insecure_channel(gateway.address)
    yield gateway
    gateway.channel.close()
    gateway.kill()


@pytest.fixture(scope="module")
def edge(cloud, tmp_path_factory):
    # pinned: every pack is local before the first ask, so a test's asks write nothing (an
    # on-demand edge would fetch packs, which the `untouched` check would see)
    edge = EdgeProcess(tmp_path_factory.mktemp("fuzz-edge") / "state", cloud.address,
                       cloud.token, ["default/kb"], MODEL, pin=True).start()
    edge.channel = grpc.insecure_channel(edge.address)
    edge.rss_at_start = edge.peak_rss()
    yield edge
    edge.channel.close()
    edge.kill()


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` by content, but the catalog's SQLite files (compared through
    the service instead: a read may checkpoint its log) and the logs."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()
            and not p.name.startswith("catalog.sqlite") and p.suffix != ".log"}


def catalog_view(cloud) -> list:
    with CloudClient(cloud.address, cloud.token) as client:
        kbs = [(kb.namespace, kb.kb, v, str(client.get_kb(kb.namespace, kb.kb, v)))
               for kb in client.list_kbs() for v in kb.variants]
        return kbs + [str(job) for job in client.list_jobs()]


def state(cloud, edge, staging: bool = True):
    """What the services hold: files (an unfinished upload's .part aside, kept for its
    resume; the staging area only if `staging`), the catalog, the edge's state."""
    files = {k: v for k, v in snapshot(cloud.data).items() if not k.endswith(".part")
             and (staging or not k.startswith("staging/"))}
    return files, catalog_view(cloud), snapshot(edge.state)


def serving(*daemons) -> bool:
    return all(health_pb2_grpc.HealthStub(d.channel).Check(
        health_pb2.HealthCheckRequest(), timeout=10).status ==
        health_pb2.HealthCheckResponse.SERVING for d in daemons)


@pytest.fixture()
def untouched(cloud, edge):
    """After the test both services are still SERVING, and nothing was written anywhere."""
    before = state(cloud, edge)
    yield
    assert serving(cloud, edge)
    assert state(cloud, edge) == before


def outcome(call, request, token, streaming: bool, timeout: float = 30) -> str:
    """'ok', or the name of the error the call ended with; fails on anything unnamed."""
    try:
        result = call(request, metadata=metadata(token), timeout=timeout)
        if streaming:
            for _ in result:
                pass
        return "ok"
    except grpc.RpcError as err:
        code, detail = err.code(), err.details() or ""
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (code, detail)
        name = detail.partition(": ")[0]
        assert name in NAMED, (code, detail)
        return name


# ---------------------------------------------------------------------- strategies


BAD_NAMES = ["", ".", "..", "../etc", "a/b", "a\\b", "x" * 65, "nul\x00", "é", " lead", "-x"]
good_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
# mostly names that pass the name check, so that the checks behind it are reached too
names = st.one_of(st.just("default"), st.just("kb"), good_names, good_names,
                  st.sampled_from(BAD_NAMES), st.text(max_size=80))
namespaces = st.one_of(st.just("default"), st.just("default"), names)
huge_text = st.one_of(st.text(max_size=300),
                      st.integers(1, 300_000).map(lambda n: "x" * n))
int64 = st.one_of(st.integers(-2**63, 2**63 - 1),
                  st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, -2**63]))
int32 = st.one_of(st.integers(-2**31, 2**31 - 1), st.sampled_from([0, -1, 1, 2**31 - 1]))
floats = st.floats(allow_nan=True, allow_infinity=True)
hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


def hashes(*real: str):
    """Digests and ids: real ones, well-formed wrong ones, and not-a-digest strings."""
    return st.one_of(st.sampled_from(real) if real else st.nothing(), hex64,
                     hex64.map(str.upper), st.text(max_size=80), st.just("../" + "0" * 61))


def tokens(daemon):
    return st.sampled_from([daemon.token] * 6 + [None, "kve_nonsense"])


file_entries = st.builds(pb.FileEntry, path=st.one_of(st.text(max_size=60), st.sampled_from(
    ["a.md", "/etc/passwd.md", "../up.md", "a\\b.md", "x.bin", "ok/b.txt", "x" * 5000])),
    sha256=hashes(), size=int64)


def upload_stream(data):
    header = pb.UploadHeader(namespace=data.draw(namespaces), kb=data.draw(names),
                             files=data.draw(st.lists(file_entries, max_size=4)),
                             options=pb.IngestOptions(segment_tokens=data.draw(int32),
                                                      whole=data.draw(st.booleans()),
                                                      codec=data.draw(st.text(max_size=20))))
    shas = [f.sha256 for f in header.files] or ["0" * 64]
    chunks = data.draw(st.lists(st.builds(
        pb.FileChunk, sha256=st.one_of(st.sampled_from(shas), hashes()), offset=int64,
        data=st.binary(max_size=3000)), max_size=4))
    messages = ([pb.UploadChunk(header=header)] if data.draw(st.booleans()) else [])
    messages += [pb.UploadChunk(chunk=c) for c in chunks]
    return iter(messages)


def job_request(data):
    request = pb.JobRequest(namespace=data.draw(namespaces),
                            kbs=data.draw(st.lists(names, max_size=3)),
                            method=data.draw(st.one_of(st.sampled_from(sorted(METHODS)),
                                                       st.text(max_size=20))),
                            budget=data.draw(floats),
                            codec=data.draw(st.one_of(st.sampled_from(["int8", "fp16", ""]),
                                                      st.text(max_size=20))))
    assume(not runs(request))  # a job that would run is a valid request, and it writes
    return request


def runs(request) -> bool:
    try:
        get_codec(request.codec or "fp16")
    except KvedgeError:
        return False
    return request.namespace == "default" and "kb" in request.kbs and \
        request.method in METHODS and 0 < request.budget <= 1


def cloud_request(method, data, cloud):
    """A request for `method` whose every field is drawn (real values among them)."""
    packs = [s.pack_id for s in cloud.info.segments]
    if method == "PlanUpload":
        return pb.UploadPlanRequest(namespace=data.draw(namespaces), kb=data.draw(names),
                                    files=data.draw(st.lists(file_entries, max_size=5)))
    if method == "Upload":
        return upload_stream(data)
    if method in ("GetKB", "RemoveKB"):
        request = pb.KBRef(namespace=data.draw(namespaces), kb=data.draw(names),
                           variant=data.draw(st.one_of(st.just(""), names)))
        assume(method == "GetKB" or (request.namespace, request.kb) != ("default", "kb"))
        return request
    if method in ("ListKBs", "ListJobs"):
        cls = pb.ListKBsRequest if method == "ListKBs" else pb.JobsRequest
        return cls(namespace=data.draw(st.one_of(st.just(""), namespaces)))
    if method == "FetchPack":
        return pb.FetchPackRequest(namespace=data.draw(namespaces),
                                   pack_id=data.draw(hashes(*packs)),
                                   offset=data.draw(int64))
    if method == "FetchHeads":  # up to one past the cap
        return pb.FetchHeadsRequest(namespace=data.draw(namespaces), pack_ids=data.draw(
            st.lists(hashes(*packs), max_size=MAX_HEADS + 1)))
    if method == "FetchTransform":
        return pb.FetchTransformRequest(namespace=data.draw(namespaces),
                                        digest=data.draw(hashes(*cloud.transforms, *packs)))
    if method == "SubmitJob":
        return job_request(data)
    assert method in ("GetJob", "WatchJob", "CancelJob"), f"no strategy for {method}"
    return pb.JobRef(namespace=data.draw(namespaces), job_id=data.draw(st.text(max_size=40)))


CLOUD = pb.DESCRIPTOR.services_by_name["Cloud"]
CLOUD_METHODS = sorted(CLOUD.methods_by_name)
STREAMING = {m.name for m in CLOUD.methods if m.server_streaming}  # read to their end


# ---------------------------------------------------------------------- RPC fields


@pytest.mark.parametrize("method", CLOUD_METHODS)
def test_every_gateway_rpc_answers_bad_fields_with_named_errors(cloud, untouched, method):
    stub, seen = pb_grpc.CloudStub(cloud.channel), []

    @SETTINGS
    @given(data=st.data())
    def run(data):
        request = cloud_request(method, data, cloud)
        seen.append(outcome(getattr(stub, method), request, data.draw(tokens(cloud)),
                            method in STREAMING))

    run()
    print(f"\n{method}: {len(seen)} cases, {dict(Counter(seen))}")
    assert len(seen) >= 50


OPTION_NAMES = sorted({f.name for cls in STRATEGIES.values() for f in options_of(cls)})


def ask_request(data):
    options = data.draw(st.dictionaries(
        st.one_of(st.sampled_from(OPTION_NAMES), st.text(max_size=12)),
        st.one_of(st.sampled_from(["0", "-1", "1e309", "nan", "0.5", "7", "true", ""]),
                  st.text(max_size=12)), max_size=3))
    return pb.AskRequest(
        namespace=data.draw(namespaces),
        kb=data.draw(st.one_of(st.just("kb"), st.just("kb"),
                               st.sampled_from(["kb@none-1-int8", "kb@../x"]), names)),
        question=data.draw(st.one_of(st.just("What is the alpha code?"), huge_text)),
        strategy=data.draw(st.one_of(st.sampled_from(["", *sorted(STRATEGIES)]),
                                     st.text(max_size=12))),
        top_k=data.draw(st.one_of(st.integers(0, 40), int32)),
        # valid lengths stay short: a random-weight model rarely stops by itself
        max_new_tokens=data.draw(st.one_of(st.integers(-3, 3), st.integers(1025, 2**31 - 1),
                                           st.integers(-2**31, 0))),
        options=options, **sampling_fields(data))


def sampling_fields(data) -> dict:
    """temperature, top_p, seed and stop: in range three requests in four (so that answers
    are still reached, sampled and stopped), else wild: NaN, infinities, out-of-range
    numbers, negative seeds, bad stop lists."""
    if data.draw(st.sampled_from([True, True, True, False])):
        return {"temperature": data.draw(st.one_of(st.just(0.0), st.floats(0, 2))),
                "top_p": data.draw(st.one_of(st.none(), st.floats(0, 1, exclude_min=True))),
                "seed": data.draw(st.one_of(st.none(), st.integers(0, 2**63 - 1))),
                "stop": data.draw(st.lists(st.text(min_size=1, max_size=8), max_size=4))}
    return {"temperature": data.draw(floats),
            "top_p": data.draw(st.one_of(st.none(), floats)),  # None: the field left unset
            "seed": data.draw(st.one_of(st.none(), int64)),
            "stop": data.draw(st.lists(st.one_of(st.text(max_size=8),
                                                 st.sampled_from(["", "x" * 257, "\x00"])),
                                       max_size=6))}


def test_ask_answers_bad_fields_with_named_errors_and_memory_stays_bounded(edge, untouched):
    stub, seen = pb_grpc.EdgeStub(edge.channel), []

    @settings(SETTINGS, max_examples=200)
    @given(data=st.data())
    def run(data):
        seen.append(outcome(stub.Ask, ask_request(data), data.draw(tokens(edge)), True))

    run()
    print(f"\nAsk: {len(seen)} cases, {dict(Counter(seen))}")
    assert "ok" in seen and len(set(seen)) >= 4, seen
    peak = edge.peak_rss()
    print(f"\nedge peak RSS: {edge.rss_at_start / 2**20:.0f} MiB at start, "
          f"{peak / 2**20:.0f} MiB after {len(seen)} fuzzed asks")
    assert peak < EDGE_RSS_BOUND


# ---------------------------------------------------------------------- request bytes


EDGE_METHODS = sorted(pb.DESCRIPTOR.services_by_name["Edge"].methods_by_name)


def raw_call(channel, service: str, method: str):
    desc = pb.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    path = f"/kvedge.v1.{service}/{method}"
    kind = ("stream" if desc.client_streaming else "unary") + "_" + \
        ("stream" if desc.server_streaming else "unary")
    call = getattr(channel, kind)(path, request_serializer=None, response_deserializer=None)
    return call, desc.client_streaming, desc.server_streaming


@pytest.mark.parametrize("service,method", [("Cloud", m) for m in CLOUD_METHODS] +
                         [("Edge", m) for m in EDGE_METHODS])
def test_bytes_that_are_no_message_are_invalid_argument(cloud, edge, untouched, service, method):
    daemon = cloud if service == "Cloud" else edge
    call, client_streaming, server_streaming = raw_call(daemon.channel, service, method)

    @settings(SETTINGS, max_examples=25)
    @given(payload=st.one_of(st.binary(min_size=1, max_size=200),
                             st.sampled_from([b"\x0a\x03\xff\xfe\xfd", b"\xff\xff\xff",
                                              b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x02\xc3\x28"])))
    def run(payload):
        request = iter([payload]) if client_streaming else payload
        outcome(call, request, daemon.token, server_streaming)

    run()


# ---------------------------------------------------------------------- pack bytes


@pytest.fixture(scope="module")
def real_pack(cloud):
    """The KB's biggest pack as the gateway serves it, and what it decodes to."""
    seg = max(cloud.info.segments, key=lambda s: s.pack_bytes)
    with CloudClient(cloud.address, cloud.token) as client:
        data = b"".join(c.data for c in client.fetch_pack("default", seg.pack_id))
    fingerprint = load_model(MODEL).fingerprint
    return seg.pack_id, data, fingerprint, read_pack(data, fingerprint)


def same_context(a, b) -> bool:
    import torch

    pairs = [(x, y) for la, lb in ((a.keys, b.keys), (a.values, b.values)) for ha, hb in
             zip(la, lb) for x, y in zip(ha, hb)]
    return (a.token_ids, a.positions, a.namespace) == (b.token_ids, b.positions, b.namespace) \
        and all(torch.equal(x, y) for x, y in pairs)


@st.composite
def damaged(draw, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "splice", "overwrite", "extend"]))
    at = draw(st.integers(0, len(data) - 1))
    if kind == "truncate":
        return data[:at]
    if kind == "flip":
        out = bytearray(data)
        for where in draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=4)):
            out[where] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    junk = draw(st.binary(min_size=1, max_size=64))
    if kind == "splice":
        return data[:at] + junk + data[at:]
    if kind == "overwrite":
        return data[:at] + junk + data[at + len(junk):]
    return data + junk


def test_damaged_real_packs_fail_only_with_pack_errors(real_pack, tmp_path):
    """Read directly, loaded from the edge's cache (disk rot under the right name: refused and
    dropped so the next sync fetches it again) and committed as a finished transfer."""
    pack, data, fingerprint, original = real_pack
    cache = PackCache(tmp_path / "packs", fingerprint)
    counts = {"refused": 0, "same": 0}

    @settings(SETTINGS, max_examples=150)
    @given(bad=damaged(data))
    def run(bad):
        try:
            ctx = read_pack(bad, fingerprint)
        except (PackError, ModelMismatch):
            counts["refused"] += 1
        else:
            assert same_context(ctx, original), "a damaged pack decoded to other content"
            counts["same"] += 1
        cache.path(pack).write_bytes(bad)
        cache._decoded.clear()
        try:
            assert same_context(cache.load(pack), original)
        except PackCorrupt:
            assert not cache.has(pack)  # dropped: the next sync fetches it again
        cache.path(pack, partial=True).write_bytes(bad)
        cache.path(pack).unlink(missing_ok=True)
        if bad != data:
            with pytest.raises(PackCorrupt):
                cache.commit(pack)
            assert not cache.has(pack) and cache.held(pack) == 0

    run()
    assert counts["refused"] > 100
    cache.path(pack).unlink(missing_ok=True)  # gone from the disk altogether
    with pytest.raises(PackCorrupt, match="gone"):
        cache.load(pack)


# ---------------------------------------------------------------------- upload folders


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A file no upload may carry."""
    path = tmp_path_factory.mktemp("outside") / "secret.md"
    path.write_text("a secret outside the folder\n")
    return path


def _bad_entry(folder: Path, kind: str, outside: Path) -> None:
    """One thing that must not be uploaded, put into `folder`."""
    if kind == "link-out":
        os.symlink(outside, folder / "passwd.md")
    elif kind == "binary":
        (folder / "bin.md").write_bytes(b"text then \x00\x01\x02 binary")
    elif kind == "non-utf8":
        (folder / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    elif kind == "non-utf8-name":
        (folder / os.fsdecode(b"bad\xff.md")).write_text("fine text\n")
    elif kind == "huge":
        with open(folder / "huge.md", "wb") as f:
            f.truncate(MAX_FILE_BYTES + 1)  # sparse: costs no disk
    elif kind == "backslash":
        (folder / "a\\b.md").write_text("a name the gateway refuses\n")
    elif kind == "only-blank":
        for child in list(folder.rglob("*.md")) + list(folder.rglob("*.txt")):
            child.write_text("  \n\n \t\n")
    elif kind == "no-text-files":
        for child in list(folder.rglob("*.md")) + list(folder.rglob("*.txt")):
            child.rename(child.with_suffix(".bin"))


BAD_KINDS = ["link-out", "binary", "non-utf8", "non-utf8-name", "huge",
             "backslash", "only-blank", "no-text-files"]


@st.composite
def bad_folders(draw):
    """(good files, plus some empty ones and links inside, then the bad things, in order)."""
    good = draw(st.dictionaries(st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8})?\.(md|txt)",
                                              fullmatch=True),
                                st.text(min_size=1, max_size=200).filter(str.strip),
                                min_size=1, max_size=3))
    empty = draw(st.booleans())
    bad = draw(st.lists(st.sampled_from(BAD_KINDS), min_size=1, max_size=3, unique=True))
    return good, empty, bad


def test_bad_upload_folders_are_refused_and_nothing_is_staged(cloud, untouched, outside):
    seen = []

    @settings(SETTINGS, max_examples=80)
    @given(spec=bad_folders(), namespace=st.sampled_from(["default", "fuzz"]))
    def run(spec, namespace):
        good, empty, bad = spec
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            for name, text in good.items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(text)
            if empty:
                (folder / "empty.md").write_bytes(b"")
            first = next(iter(good))
            os.symlink(folder / first, folder / "inside-link.md")  # fine: stays inside
            for kind in bad:
                _bad_entry(folder, kind, outside)
            with CloudClient(cloud.address, cloud.token) as client:
                with pytest.raises(KvedgeError) as err:
                    client.upload(folder, namespace, "fuzzkb")
        assert type(err.value).__name__ in NAMED, err.value
        seen.append(type(err.value).__name__)

    run()
    assert len(seen) >= 40


def test_upload_options_are_checked_before_anything_is_written(cloud, edge, tmp_path):
    """A valid folder with drawn ingest options: refused with a named error, or ingested to
    'ready' (then removed again: that write was asked for, and its file stays staged)."""
    before = state(cloud, edge, staging=False)
    folder = tmp_path / "kb"
    folder.mkdir()
    (folder / "a.md").write_text("The gamma code is 5550123.\n\nGamma has a tower.\n")

    @settings(SETTINGS, max_examples=20)
    @given(segment_tokens=st.one_of(st.integers(-2**31, 15), st.integers(2**16, 2**31 - 1),
                                    st.sampled_from([0, 16, 48])),
           whole=st.booleans(),
           codec=st.one_of(st.sampled_from(["", "int8", "int4+zstd"]), st.text(max_size=12)))
    @example(segment_tokens=-5, whole=False, codec="")
    @example(segment_tokens=1 << 20, whole=False, codec="int8")
    def run(segment_tokens, whole, codec):
        with CloudClient(cloud.address, cloud.token) as client:
            try:
                client.upload(folder, "default", "options", segment_tokens=segment_tokens,
                              whole=whole, codec=codec)
            except KvedgeError as err:
                assert type(err).__name__ in NAMED
                with pytest.raises(KvedgeError, match="no knowledge base"):
                    client.get_kb("default", "options")
                return
            info = client.wait_ready("default", "options", timeout=120)
            assert info.status == "ready"
            client.remove_kb("default", "options")

    run()
    assert serving(cloud, edge) and state(cloud, edge, staging=False) == before


def test_random_cloud_client_upload_paths_never_escape(tmp_path):
    """Paths as a client sends them, checked on the gateway side (`kbfiles.check_path`)."""
    from kvedge.common.errors import BadInput
    from kvedge.common.kbfiles import check_path

    @settings(SETTINGS, max_examples=200)
    @given(path=st.one_of(st.text(max_size=60), st.lists(st.sampled_from(
        ["..", ".", "", "a", "b.md", "/", "\\", "~", "c.txt"]), max_size=6).map("/".join)))
    def run(path):
        try:
            checked = check_path(path)
        except BadInput:
            return
        resolved = (tmp_path / checked).resolve()
        assert resolved.is_relative_to(tmp_path.resolve()) and checked == path

    run()

