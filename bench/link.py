"""A network link on loopback, for the benchmark and tests (not a production flag): a TCP proxy
between an edge and a gateway that gives each direction a bandwidth (a token bucket) and adds
half a round trip of delay to every byte.

    with LinkEmulator("127.0.0.1:50051", mbit_s=100, rtt_ms=20) as link:
        ... kvedge serve --cloud {link.address} ...

Each direction of each connection is paced on its own (a full-duplex link of that rate per
direction, as a cable is). Delay is added per chunk when it leaves the bucket, so a stream
keeps the link busy while earlier chunks are in flight (the bandwidth-delay product is in the
pipe, as on a real path). The bucket holds at most `burst` bytes (default: 10 ms of the rate,
at least 16 KiB), so a sender cannot bank idle time into a burst beyond that.
"""
from __future__ import annotations

import heapq
import socket
import threading
import time
from dataclasses import dataclass, field

CHUNK = 16 * 1024


@dataclass
class TokenBucket:
    """`rate` bytes per second, at most `burst` bytes banked; `take(n)` blocks until n may pass."""

    rate: float
    burst: int
    _tokens: float = field(init=False)
    _stamp: float = field(default_factory=time.monotonic, init=False)

    def __post_init__(self):
        self._tokens = float(self.burst)

    def take(self, n: int) -> None:
        while True:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            if self._tokens >= n:
                self._tokens -= n
                return
            time.sleep((n - self._tokens) / self.rate)


class _Pipe:
    """One direction of one connection: read from `src`, pace, delay, write to `dst`."""

    def __init__(self, src: socket.socket, dst: socket.socket, rate: float, burst: int,
                 delay: float):
        self.src, self.dst, self.delay = src, dst, delay
        self.bucket = TokenBucket(rate, burst)
        self._due: list[tuple[float, int, bytes]] = []  # (deliver at, order, bytes)
        self._ready = threading.Condition()
        self._closed = False
        self.bytes = 0

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        order = 0
        try:
            while data := self.src.recv(CHUNK):
                self.bucket.take(len(data))
                with self._ready:
                    heapq.heappush(self._due, (time.monotonic() + self.delay, order, data))
                    self._ready.notify()
                order += 1
        except OSError:
            pass
        with self._ready:
            self._closed = True
            self._ready.notify()

    def _write(self) -> None:
        try:
            while True:
                with self._ready:
                    while not self._due and not self._closed:
                        self._ready.wait()
                    if not self._due:
                        break
                    at, _, data = self._due[0]
                    wait = at - time.monotonic()
                    if wait > 0:
                        self._ready.wait(wait)
                        continue
                    heapq.heappop(self._due)
                self.dst.sendall(data)
                self.bytes += len(data)
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class LinkEmulator:
    """Listens on 127.0.0.1 (a free port: `address`) and forwards every connection to
    `target` through a link of `mbit_s` per direction and `rtt_ms` round trip."""

    def __init__(self, target: str, mbit_s: float, rtt_ms: float = 0.0,
                 burst: int | None = None):
        if mbit_s <= 0 or rtt_ms < 0:
            raise ValueError("need a bandwidth > 0 Mbit/s and a round trip ≥ 0 ms")
        host, _, port = target.rpartition(":")
        self.target = (host.strip("[]"), int(port))
        self.rate = mbit_s * 1e6 / 8  # bytes per second
        self.delay = rtt_ms / 2000  # each direction: half the round trip
        self.burst = burst or max(CHUNK, int(self.rate * 0.01))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self.pipes: list[_Pipe] = []
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                pipe = _Pipe(src, dst, self.rate, self.burst, self.delay)
                self.pipes.append(pipe)
                pipe.start()

    @property
    def bytes(self) -> int:
        """Bytes delivered so far, both directions, every connection."""
        return sum(p.bytes for p in self.pipes)

    def close(self) -> None:
        self._server.close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> "LinkEmulator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
