"""Codecs against fp16 by paired non-inferiority on F1 (bench/noninferiority.py): the verdict
follows the interval's lower end and the question count, identical text is only reported,
and the default is the smallest codec that preserves answers everywhere it was measured."""
import pytest

from kvedge.bench import noninferiority as ni


def cell(codec, f1s, *, fp16_bytes=400.0, shipped=100.0, answers=None, method="full"):
    answers = answers or [f"a{i}" for i in range(len(f1s))]
    return {"suite": "evict", "task": "squad-evict", "length": 2048, "items": 3, "seed": 0,
            "method": method, "budget": 1.0, "options": "", "model": "m", "codec": codec,
            "fp16_bytes": fp16_bytes, "shipped_bytes": shipped,
            "per_question": [{"f1": f, "answer": a} for f, a in zip(f1s, answers)]}


def test_a_codec_within_one_point_on_enough_questions_preserves_answers():
    n = ni.MIN_QUESTIONS
    ref = [1.0, 0.0] * (n // 2)
    rows = [cell("fp16", ref, shipped=400.0),
            cell("int4+zstd", ref, shipped=100.0,  # same F1, every answer reworded
                 answers=[f"b{i}" for i in range(n)]),
            cell("int2", [0.0] * n, shipped=50.0)]  # loses half the F1
    found = {v.codec: v for v in ni.verdicts(rows)}
    assert set(found) == {"int4+zstd", "int2"}
    int4 = found["int4+zstd"]
    assert int4.verdict == "answer-preserving" and int4.same_text == 0.0
    assert int4.diff[0] == 0.0 and int4.fewer_bytes == 4.0 and int4.questions == n
    assert found["int2"].verdict == "not shown" and found["int2"].diff[2] < -0.4
    assert ni.default_codec(rows) == "int4+zstd"


def test_few_questions_decide_nothing_and_a_loss_anywhere_rules_a_codec_out():
    rows = [cell("fp16", [1.0, 0.0, 1.0]), cell("int8+zstd", [1.0, 0.0, 1.0], shipped=200.0)]
    v, = ni.verdicts(rows)
    assert v.verdict == "too few questions" and v.same_text == 1.0
    assert ni.default_codec(rows) is None
    n = ni.MIN_QUESTIONS
    good, bad = [1.0] * n, [1.0] * (n // 2) + [0.0] * (n // 2)
    rows = [cell("fp16", good), cell("int4", good),
            cell("fp16", good, method="kvzip"), cell("int4", bad, method="kvzip")]
    assert ni.default_codec(rows) is None  # preserved with full KV, not under kvzip


def test_the_table_names_the_verdict_and_the_default(tmp_path):
    import json

    n = ni.MIN_QUESTIONS
    rows = [cell("fp16", [1.0] * n), cell("int4+zstd", [1.0] * n)]
    for r in rows:
        r.update(key=r["codec"], questions=n, score=1.0)
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = ni.table([json.loads(line) for line in results.read_text().splitlines()])
    assert any("| int4+zstd | 4.00 |" in line and "answer-preserving" in line for line in md)
    assert "Smallest answer-preserving codec here: **int4+zstd**." in md


def test_questions_of_one_article_are_resampled_together():
    """A codec that costs one article 30 answers (0.1 F1 over 300 questions): question by
    question the interval is narrow, as if 30 independent losses; with each question's
    article named, a draw of article 0 three times (a 0.3 F1 loss) is in the interval."""
    n = ni.MIN_QUESTIONS
    ref, lossy = [1.0] * n, [1.0] * n
    lossy[:30] = [0.0] * 30  # article 0's first 30 questions
    rows = [cell("fp16", ref), cell("int2", lossy)]
    by_question, = ni.verdicts(rows)
    for r in rows:
        for q, question in enumerate(r["per_question"]):
            question["item"] = f"article-{q // 100}"
    by_article, = ni.verdicts(rows)
    assert by_question.diff[0] == by_article.diff[0] == pytest.approx(-0.1)
    assert by_question.diff[2] < -ni.MARGIN and by_question.diff[1] > -0.2
    assert by_article.diff[1] <= -0.29  # all three draws article 0: a 0.3 F1 loss
