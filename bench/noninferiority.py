"""Codecs judged the way the quantization literature judges them: paired non-inferiority on
answer quality, not identical answer text (issue 30, deliverable 1).

A cell whose packs use codec X is paired with its sibling in fp16 — the same suite, task,
length, questions, method, budget and options, only the codec differs — question by
question. The statistic is the mean F1 difference X − fp16 with its 95 % paired bootstrap
interval (`kvedge.bench.bootstrap`; contexts resampled whole where the rows name each
question's, so 300 questions about 3 articles weigh as 3 contexts, not 300). X is **answer-preserving** when that interval's lower end
lies above −MARGIN (one F1 point) on at least MIN_QUESTIONS questions; with fewer it is
"too few questions" whatever the interval says. The share of answers whose text is identical
to fp16's is reported beside it, as a column and not a gate: two fp16 runs on different
hardware differ in text too, and a lossy codec that changes a word without changing whether
the answer is right loses nothing a user sees.

`default_codec` picks the smallest (most bytes saved against fp16) answer-preserving codec of
a set of rows: how `kvedge.common.pack.codecs.DEFAULT_CODEC` is to be chosen.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kvedge.bench.bootstrap import contexts_of, paired_bootstrap
from kvedge.bench.qa_report import _label
from kvedge.bench.runner import REFERENCE_CODEC, codec_of, fewer_bytes

MARGIN = 0.01          # one F1 point: the loss the issue tolerates in a codec
MIN_QUESTIONS = 300    # fewer paired questions decide nothing (issue 30's bar)
METRIC = "f1"
SIBLING = ("suite", "task", "length", "items", "seed", "method", "budget", "options", "model")


@dataclass(frozen=True)
class CodecVerdict:
    codec: str
    setting: str               # the cell's method, options and budget, as the QA tables say
    task: str
    length: int
    questions: int
    mean: float                # X's mean F1
    reference: float           # fp16's, on the same questions
    diff: list                 # [X − fp16, low, high]
    fewer_bytes: float | None  # fp16 bytes / X's shipped bytes
    same_text: float | None    # share of answers identical to fp16's (None: not recorded)

    @property
    def verdict(self) -> str:
        if self.questions < MIN_QUESTIONS:
            return "too few questions"
        low = self.diff[1]
        return "answer-preserving" if low is not None and low > -MARGIN else "not shown"


def _same_text(row: dict, ref: dict) -> float | None:
    a = [q.get("answer") for q in row["per_question"]]
    b = [q.get("answer") for q in ref["per_question"]]
    if None in a or None in b:
        return None  # rows written before per-question answers were kept
    return sum(x == y for x, y in zip(a, b)) / len(a)


def verdicts(rows: list[dict]) -> list[CodecVerdict]:
    """One verdict per cell that has an fp16 sibling and per-question F1 on both sides."""
    groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        if r.get("per_question"):  # rows without per-question scores cannot be paired
            groups[tuple(r.get(k) for k in SIBLING)][codec_of(r)] = r
    out = []
    for cells in groups.values():
        ref = cells.get(REFERENCE_CODEC)
        if ref is None:
            continue
        b = [q.get(METRIC) for q in ref["per_question"]]
        for codec, r in sorted(cells.items()):
            a = [q.get(METRIC) for q in r["per_question"]]
            if codec == REFERENCE_CODEC or len(a) != len(b) or None in a + b or not a:
                continue
            paired = paired_bootstrap(a, b, clusters=contexts_of(r["per_question"]))
            out.append(CodecVerdict(codec, _label(r), r["task"], r["length"], len(a),
                                    paired.mean, paired.ceiling, paired.diff.as_list(),
                                    fewer_bytes(r), _same_text(r, ref)))
    return out


def default_codec(rows: list[dict]) -> str | None:
    """The answer-preserving codec that saves the most bytes against fp16, judged on every
    row given (a codec must preserve answers in every cell it was measured in)."""
    by_codec: dict[str, list[CodecVerdict]] = defaultdict(list)
    for v in verdicts(rows):
        by_codec[v.codec].append(v)
    kept = {c: min(v.fewer_bytes or 0 for v in vs) for c, vs in by_codec.items()
            if all(v.verdict == "answer-preserving" for v in vs)}
    return max(kept, key=kept.get) if kept else None


def _fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def table(rows: list[dict]) -> list[str]:
    """Markdown lines: every codec against fp16, setting by setting (empty: no pair)."""
    found = verdicts(rows)
    if not found:
        return []
    out = ["## Codecs against fp16: paired non-inferiority on F1", "",
           f"Answer-preserving: the 95 % interval of F1(codec) − F1(fp16) lies above "
           f"−{MARGIN:g} on ≥ {MIN_QUESTIONS} paired questions; identical text is reported, "
           "not required.", "",
           "| task | length | setting | codec | × fewer bytes | F1 | F1 fp16 | "
           "F1 − fp16 [95 % CI] | same text | q | verdict |", "|" + "---|" * 11]
    for v in sorted(found, key=lambda v: (v.task, v.length, v.setting, -(v.fewer_bytes or 0))):
        diff, low, high = v.diff
        out.append(f"| {v.task} | {v.length} | {v.setting} | {v.codec} | "
                   f"{_fmt(v.fewer_bytes, '.2f')} | {v.mean:.3f} | {v.reference:.3f} | "
                   f"{diff:+.3f} [{_fmt(low, '+.3f')}, {_fmt(high, '+.3f')}] | "
                   f"{_fmt(v.same_text, '.2f')} | {v.questions} | {v.verdict} |")
    best = default_codec(rows)
    out += ["", f"Smallest answer-preserving codec here: **{best or 'none'}**.", ""]
    return out
