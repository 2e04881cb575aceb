"""Paired bootstrap confidence intervals for two methods scored on the same questions.

A method and its ceiling (recompute, full KV) answer the same questions, so their scores are
paired: each resample draws question indices with replacement and takes both methods' means
over the same draw (Efron & Tibshirani, "An Introduction to the Bootstrap", ch. 13, the
percentile interval). Two intervals come from one set of draws: the difference of the means
(method − ceiling; an interval that excludes 0 is a difference beyond chance) and the ratio
of the means (method / ceiling, "keeps 97 % of recompute's F1"). Seeded: the same scores give
the same intervals.

Questions asked of one context (squad-evict: every question of an article against one
compressed cache) are not independent: the eviction kept or lost the same tokens for all of
them. Given each question's context (`clusters`), a resample draws contexts with replacement
and takes all their questions (the cluster bootstrap, Davison & Hinkley, "Bootstrap Methods
and their Application", Sec. 3.8), each side's mean over the questions drawn. With one
question per context it is the question bootstrap above, draw for draw.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

RESAMPLES = 10_000
CONFIDENCE = 0.95


class UnpairedScores(ValueError):
    """Paired scores need the same number of questions on both sides, at least one."""


@dataclass(frozen=True)
class Interval:
    value: float        # the statistic on the questions as they are
    low: float | None   # the percentile interval's ends (None: no resample defined it)
    high: float | None

    def as_list(self) -> list[float | None]:
        return [self.value, self.low, self.high]


@dataclass(frozen=True)
class Paired:
    mean: float           # the method's mean score
    ceiling: float        # the ceiling's, on the same questions
    diff: Interval        # mean − ceiling
    ratio: Interval | None  # mean / ceiling (None where the ceiling scored 0)
    questions: int

    def to_dict(self) -> dict:
        out = asdict(self)
        out["diff"] = self.diff.as_list()
        out["ratio"] = self.ratio.as_list() if self.ratio else None
        return out


def _interval(value: float, samples: np.ndarray, confidence: float) -> Interval:
    samples = samples[np.isfinite(samples)]
    if not samples.size:
        return Interval(value, None, None)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(samples, [tail, 100 - tail])
    return Interval(value, float(low), float(high))


def _resampled_means(a: np.ndarray, b: np.ndarray, resamples: int, seed: int,
                     clusters: Sequence | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Both sides' means over the same seeded draws, in chunks (draws of thousands of
    questions would not fit in memory at once): draws of questions, or of `clusters` (a
    label per question) with all their questions."""
    rng = np.random.default_rng(seed)
    if clusters is None:
        sums_a, sums_b, counts = a, b, np.ones_like(a)
    else:
        labels = {label: n for n, label in enumerate(dict.fromkeys(clusters))}
        index = np.array([labels[c] for c in clusters])
        sums_a, sums_b = (np.bincount(index, weights=x, minlength=len(labels)) for x in (a, b))
        counts = np.bincount(index, minlength=len(labels)).astype(float)
    n = sums_a.size
    chunk = max(1, 4_000_000 // n)
    means_a, means_b = [], []
    for start in range(0, resamples, chunk):
        draws = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        drawn = counts[draws].sum(axis=1)
        means_a.append(sums_a[draws].sum(axis=1) / drawn)
        means_b.append(sums_b[draws].sum(axis=1) / drawn)
    return np.concatenate(means_a), np.concatenate(means_b)


def contexts_of(rows: Sequence[dict]) -> list | None:
    """Each per-question row's context (its `item`), as `paired_bootstrap`'s `clusters`; None
    where a row names none (rows from before the bench named them): the question bootstrap."""
    labels = [row.get("item") for row in rows]
    return None if None in labels else labels


def paired_bootstrap(method: Sequence[float], ceiling: Sequence[float], *,
                     resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                     seed: int = 0, clusters: Sequence | None = None) -> Paired:
    """The difference and the ratio of `method`'s and `ceiling`'s mean scores (index i is
    the same question on both sides), each with its `confidence` percentile interval over
    `resamples` seeded paired resamples — of questions, or of `clusters` (a hashable label
    per question, e.g. its context: the module's cluster bootstrap). A resample whose
    ceiling mean is 0 has no ratio and is left out of the ratio's interval."""
    a, b = np.asarray(method, dtype=float), np.asarray(ceiling, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or not a.size:
        raise UnpairedScores(f"paired scores need equal, non-empty lists; got {a.size} and "
                             f"{b.size} questions")
    if clusters is not None and len(clusters) != a.size:
        raise UnpairedScores(f"clusters need a label per question; got {len(clusters)} for "
                             f"{a.size} questions")
    means_a, means_b = _resampled_means(a, b, resamples, seed, clusters)
    mean_a, mean_b = float(a.mean()), float(b.mean())
    diff = _interval(mean_a - mean_b, means_a - means_b, confidence)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = means_a / means_b
    ratio = _interval(mean_a / mean_b, ratios, confidence) if mean_b else None
    return Paired(mean_a, mean_b, diff, ratio, int(a.size))
