"""Fetch or compute, per segment (issue 26, 3): for each segment of an ask whose pack the edge
lacks, fetch the pack or prefill the segment's text on the edge (`edge.local_prefill`) —
whichever gets the answer its first token sooner, by the edge's own measurements of its link
and its prefill (`edge.meters`). Torch-free. Anchor: SparKV (computing some chunks on the
device while others stream from the cloud) and LMCache's choice of what to move by bandwidth.

The schedule predicted is the one the engine runs. An ask fetches the packs it chose to fetch
one after another on its own thread (`EdgeEngine._segments`; each transfer pays its round
trip), then the answer's start prefills the segments it chose to compute one after another on
the scheduler thread, before the strategy's plan; nothing overlaps. So

    TTFT ≈ Σ_fetched (RTT + pack_bytes / throughput) + Σ_computed prefill(n_tokens) + plan,

a sum in which each term depends on one segment: taking each segment's cheaper side minimizes
it. (Were the fetches to run while the scheduler computes — SparKV's overlap — the choice
would instead balance the two sums, a partition.)

Fetch when unsure: with no transfer measured yet (the link unknown), no prefill timed yet, or
a segment without token ids (a local manifest written before they were kept), the segment is
fetched — what the edge did before; the transfer is what measures the link, and the pack then
answers every later question from the cache. A segment computed by an earlier answer and
still in memory (`LocalPrefill.computed`) costs nothing and is taken.

Left out of the prediction: a fetched pack's verification and decoding (≪ its transfer on a
link slow enough for the choice to matter), a computed segment's wait behind other answers on
the scheduler thread (its prefill also pauses their decoding), and transfers other asks run
on the same link meanwhile. Which variant's pack a segment would be fetched from (where the
edge may use a compressed variant of the KB) is chosen before, `edge.variants`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from kvedge.edge.meters import LinkMeter, PrefillMeter


@dataclass(frozen=True)
class Choice:
    """One missing segment's side, and the seconds each side was predicted to take (None:
    not known)."""

    meta: dict
    compute: bool
    fetch_s: float | None
    compute_s: float | None


@dataclass
class Sourced:
    """Where the KV of an answer's missing segments came from (manifest entries)."""

    fetched: list[dict] = field(default_factory=list)   # the pack fetched inside the ask
    computed: list[dict] = field(default_factory=list)  # prefilled on the edge instead


class FetchOrCompute:
    """Chooses by `link` and `prefill`; `held(pack_id)`: the segment was computed earlier and
    is still in memory."""

    def __init__(self, link: LinkMeter, prefill: PrefillMeter,
                 held: Callable[[str], bool] = lambda pack_id: False):
        self.link, self.prefill, self.held = link, prefill, held

    def choose(self, missing: list[dict]) -> list[Choice]:
        """A Choice per missing segment (local manifest entries), in their order."""
        return [self._one(meta) for meta in missing]

    def _one(self, meta: dict) -> Choice:
        fetch_s = self.link.seconds(meta["pack_bytes"])
        if "token_ids" not in meta:
            return Choice(meta, False, fetch_s, None)
        if self.held(meta["pack_id"]):
            return Choice(meta, True, fetch_s, 0.0)
        compute_s = self.prefill.seconds(meta["n_tokens"])
        sooner = fetch_s is not None and compute_s is not None and compute_s < fetch_s
        return Choice(meta, sooner, fetch_s, compute_s)

    def describe(self, choices: list[Choice]) -> str:
        """For the log: each segment's side and both predictions, then the link's estimate."""
        def secs(s: float | None) -> str:
            return "?" if s is None else f"{s:.3f} s"

        parts = [f"segment {c.meta['index']} {'computed' if c.compute else 'fetched'} "
                 f"(compute {secs(c.compute_s)}, fetch {secs(c.fetch_s)})" for c in choices]
        rtt, rate = self.link.rtt_s, self.link.throughput
        link = "link unknown" if rate is None else f"link {rate * 8 / 1e6:.1f} Mbit/s, RTT " + \
            ("not yet told apart" if rtt is None else f"{rtt * 1e3:.0f} ms")
        return "; ".join(parts) + f" [{link}]"
