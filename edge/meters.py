"""What the edge measures to choose between fetching a pack and prefilling its text
(`edge.fetch_or_compute`): its link to the cloud and its own prefill. Torch-free.

Both are a line, seconds = fixed + per_unit × size, fitted to the last WINDOW measurements by
Theil–Sen (the median of the slopes between pairs of points, then the median intercept):

- the link: a transfer of B bytes takes RTT + B / throughput. A pack fetch that had the link
  to itself gives the point (B, seconds to its last chunk), and — when it came in more than one
  chunk — (the first chunk's bytes, seconds to the first chunk) too: the gateway streams
  1 MiB chunks and gRPC hands a chunk over whole, so the time to the first chunk is the round
  trip plus that chunk's own transfer. The intercept is the RTT (the time to the first byte:
  the request's trip, the gateway opening the pack), the slope 1 / throughput.
- the prefill: a segment of n tokens takes fixed + n / rate (the runtime's per-layer overhead,
  then the tokens), from the segment prefills the edge runs.

Why a windowed median fit and not an EWMA: the samples are few (one or two per fetch) and a
few are wild — the first fetch pays the channel's connection set-up, a prefill may share the
CPU with a sync — and a median ignores those outright where an EWMA carries a share of each
into many later estimates; the window still follows a link that changes, within WINDOW
samples. Fitting a line rather than averaging bytes/s keeps the round trip apart from the
bandwidth: a small pack over a long link costs mostly its round trip.

Only transfers that ran alone count: concurrent transfers share the bandwidth (the sync reads
8 manifests at once), and what is predicted is an ask's fetches, which run one after another.
Where every pack is of about one size (small packs, one chunk each) the round trip cannot be
told from the bandwidth: the line then goes through the origin (`Line.split` False), which
still predicts packs of that size.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from statistics import median

WINDOW = 16        # points a fit reads: the most recent ones
MIN_SPREAD = 1.25  # two points give a slope only when one's size is this many times the other's


@dataclass(frozen=True)
class Line:
    """seconds = fixed + per_unit × size; `split` False when the points were all of about one
    size, so that the fixed part could not be told from the rest (it is then 0, and the line
    only predicts sizes like those)."""

    fixed: float
    per_unit: float
    split: bool = True

    def at(self, size: float) -> float:
        return self.fixed + self.per_unit * size


def theil_sen(points: list[tuple[float, float]]) -> Line | None:
    """The median-slope line through (size, seconds) points; None without a point. Pairs of
    nearly equal sizes give no slope (their noise would be all of it); with no pair apart, or
    a slope that is not positive, the line goes through the origin at the median
    seconds-per-unit, which still predicts sizes like those measured."""
    points = [(x, y) for x, y in points if x > 0 and y >= 0]
    if not points:
        return None
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points)
              for x2, y2 in points[i + 1:] if max(x1, x2) >= MIN_SPREAD * min(x1, x2)]
    slope = median(slopes) if slopes else 0.0
    if slope <= 0:
        return Line(0.0, median(y / x for x, y in points), split=False)
    return Line(max(0.0, median(y - slope * x for x, y in points)), slope)


class LineWindow:
    """The last `size` (size, seconds) points and the line fitted through them (thread-safe:
    answers' fetches and the scheduler's prefills add points from their own threads)."""

    def __init__(self, size: int = WINDOW):
        self._points: deque[tuple[float, float]] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(self, size: float, seconds: float) -> None:
        with self._lock:
            self._points.append((float(size), float(seconds)))

    def line(self) -> Line | None:
        with self._lock:
            points = list(self._points)
        return theil_sen(points)

    def seconds(self, size: float) -> float | None:
        """The line's prediction at `size`; None before any point."""
        line = self.line()
        return None if line is None else line.at(size)

    @property
    def rate(self) -> float | None:
        """Units per second beyond the fixed cost (None: unknown)."""
        line = self.line()
        return None if line is None or not line.per_unit else 1.0 / line.per_unit

    def clear(self) -> None:
        with self._lock:
            self._points.clear()


class PrefillMeter(LineWindow):
    """Seconds the edge's runtime takes to prefill a segment of n tokens (`seconds(n)`;
    `rate`: tokens/s)."""


class Timing:
    """One transfer as it arrives: call `arrived(n)` per chunk."""

    def __init__(self, measured: bool = True):
        self.measured = measured  # False: it only marks the transfers it overlaps as shared
        self.start = time.perf_counter()
        self.first_s = self.last_s = 0.0
        self.first_bytes = self.bytes = self.chunks = 0
        self.shared = False  # another transfer ran while this one did

    def arrived(self, n: int) -> None:
        now = time.perf_counter() - self.start
        if not self.chunks:
            self.first_s, self.first_bytes = now, n
        self.last_s, self.bytes, self.chunks = now, self.bytes + n, self.chunks + 1


class LinkMeter:
    """The edge's link to the cloud, from the transfers `Fetcher` times with `begin`/`end`."""

    def __init__(self, size: int = WINDOW):
        self._window = LineWindow(size)
        self._active: set[Timing] = set()
        self._lock = threading.Lock()

    def begin(self, measured: bool = True) -> Timing:
        timing = Timing(measured)
        with self._lock:
            if self._active:
                for other in self._active:
                    other.shared = True
                timing.shared = True
            self._active.add(timing)
        return timing

    def end(self, timing: Timing, complete: bool) -> None:
        """A transfer is over: a complete one that had the link alone is measured."""
        with self._lock:
            self._active.discard(timing)
        if not (complete and timing.measured and timing.chunks) or timing.shared:
            return
        if timing.chunks > 1:
            self._window.add(timing.first_bytes, timing.first_s)
        self._window.add(timing.bytes, timing.last_s)

    def seconds(self, nbytes: int) -> float | None:
        """A fetch of `nbytes` alone: RTT + nbytes / throughput; None before any transfer."""
        return self._window.seconds(nbytes)

    @property
    def rtt_s(self) -> float | None:
        """None until transfers of different sizes tell it from the bandwidth (small packs
        come in one chunk, much alike: `throughput` is then bytes / whole transfer)."""
        line = self._window.line()
        return None if line is None or not line.split else line.fixed

    @property
    def throughput(self) -> float | None:
        """Bytes/s (None: unknown)."""
        return self._window.rate

    def clear(self) -> None:
        """Forget what was measured (a benchmark's fresh edge)."""
        self._window.clear()
