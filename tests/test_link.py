"""bench/link.py: the loopback link emulator delivers at the bandwidth and round trip it says,
in both directions, and carries a real gRPC service."""
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvedge.bench.link import LinkEmulator


def serve_tcp(handler) -> str:
    """A loopback TCP server running `handler(conn)` per connection; its address."""
    server = socket.create_server(("127.0.0.1", 0))

    def accept():
        while True:
            conn, _ = server.accept()
            threading.Thread(target=handler, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    return f"127.0.0.1:{server.getsockname()[1]}"


def sink(conn):
    """Reads everything, then answers with the byte count."""
    total = 0
    while data := conn.recv(65536):
        total += len(data)
    conn.sendall(str(total).encode())
    conn.close()


def echo(conn):
    while data := conn.recv(65536):
        conn.sendall(data)


@pytest.mark.parametrize("mbit_s", [16, 64])
def test_a_stream_takes_its_size_over_the_bandwidth(mbit_s):
    size = 2 * 2**20 * mbit_s // 32  # 1 MiB at 16 Mbit/s, 4 MiB at 64: ~0.5 s each
    with LinkEmulator(serve_tcp(sink), mbit_s=mbit_s) as link:
        host, port = link.address.split(":")
        start = time.monotonic()
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"x" * size)
            s.shutdown(socket.SHUT_WR)
            assert int(s.recv(64)) == size
        took = time.monotonic() - start
    expected = size * 8 / (mbit_s * 1e6)
    assert 0.8 * expected < took < 1.6 * expected, (took, expected)


def test_each_round_trip_takes_the_rtt():
    with LinkEmulator(serve_tcp(echo), mbit_s=100, rtt_ms=80) as link:
        host, port = link.address.split(":")
        with socket.create_connection((host, int(port))) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            trips = []
            for i in range(4):
                start = time.monotonic()
                s.sendall(b"%d" % i)
                assert s.recv(16) == b"%d" % i
                trips.append(time.monotonic() - start)
    assert all(0.075 < t < 0.2 for t in trips), trips


def test_grpc_runs_over_the_link():
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with LinkEmulator(f"127.0.0.1:{port}", mbit_s=10, rtt_ms=20) as link:
            with grpc.insecure_channel(link.address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                start = time.monotonic()
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
                assert time.monotonic() - start >= 0.02  # at least one round trip
            assert link.bytes > 0
    finally:
        server.stop(0)


def test_a_link_needs_a_bandwidth():
    with pytest.raises(ValueError, match="bandwidth"):
        LinkEmulator("127.0.0.1:1", mbit_s=0)


def test_an_on_demand_edge_behind_the_link_answers_cold_then_warm(tmp_path):
    """bench/link_ttft.py on the tiny model: the manifest synced through the link, a cold
    question's packs fetched through it inside the ask (whole, decoded as they arrive, and
    computed on as they arrive),
    the same question warm, then cold again choosing per segment between fetching and prefilling (fetch-or-compute)."""
    from kvedge.bench.link_ttft import run, table

    kb = tmp_path / "kb"
    kb.mkdir()
    for i in range(4):
        (kb / f"doc{i}.md").write_text(f"# Doc {i}\n\n" + f"The code of doc {i} is {i}{i}. " * 30)
    (row,) = run("tiny-llama", kb, ["What is the code of doc 2?"], links=((50, 10),),
                 echo=lambda *_: None)
    assert row["cold_ttft_s"] > row["warm_ttft_s"] > 0 and row["sync_s"] > 0
    assert row["stream_ttft_s"] > row["warm_ttft_s"]  # the streamed cold path fetches too
    assert row["stream_over_cold"] == row["stream_ttft_s"] / row["cold_ttft_s"]
    assert row["overlap_ttft_s"] > row["warm_ttft_s"]  # computed on the packs as they arrive
    assert row["overlap_over_stream"] == row["overlap_ttft_s"] / row["stream_ttft_s"]
    assert row["foc_ttft_s"] > 0 and 0 <= row["computed"] <= row["missing"] == 3  # top_k
    assert row["foc_over_best"] == row["foc_ttft_s"] / min(row["cold_ttft_s"],
                                                           row["local_ttft_s"])
    assert "50 Mbit/s, 10 ms" in table([row]) and f"| {row['computed']} / 3 |" in table([row])


def test_the_stream_fetch_benchmark_times_both_ways_of_a_cold_read():
    """bench/stream_fetch.py on small packs: both ways take at least the time on the wire."""
    from kvedge.bench.stream_fetch import run, table

    (row,) = run([50.0], n_packs=2, repeat=1, shape=(2, 1, 2, 16), tokens=32)
    assert row["fetch_then_load_s"] >= row["wire_s"] - 0.04 > 0  # round trips: ≥ 20 ms each
    assert row["streamed_s"] >= row["wire_s"] - 0.04
    assert "50 Mbit/s, 20 ms" in table([row])
