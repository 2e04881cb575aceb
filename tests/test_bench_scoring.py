"""Scoring: normalized case-insensitive substring match, RULER's all / part variants."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvedge.bench.scoring import (NoReferences, Score, normalize, score_question,
                                  string_match_all, string_match_part)
from kvedge.bench.tasks import Question


def test_normalize():
    assert normalize("  The\tAnswer\n\n IS  42 ") == "the answer is 42"
    assert normalize("") == "" and normalize(" \n\t ") == ""


@pytest.mark.parametrize("prediction, reference", [
    ("The number is 7654321.", "7654321"),
    ("AMBER-FALCON", "amber-falcon"),                      # case
    ("it is in new\n york", "New York"),                   # whitespace collapsed both sides
    ("Café Müller", "CAFÉ MÜLLER"),                        # non-ASCII case
    ("cafe\u0301", "café"),                                # combining accent vs precomposed
    ("ＦＵＬＬ width １２３", "full width 123"),           # NFKC folds fullwidth forms
    ("Straße", "STRASSE"),                                 # casefold, not just lower
])
def test_found(prediction, reference):
    assert string_match_all(prediction, [reference]) == 1.0
    assert string_match_part(prediction, [reference]) == 1.0


@pytest.mark.parametrize("prediction, reference", [
    ("7654320", "7654321"), ("765 4321", "7654321"), ("amber falcon", "amber-falcon"),
])
def test_not_found(prediction, reference):
    assert string_match_all(prediction, [reference]) == 0.0


def test_empty_prediction_scores_zero():
    assert string_match_all("", ["42"]) == 0.0
    assert string_match_part("   ", ["42", "forty-two"]) == 0.0


@pytest.mark.parametrize("references", [[], [""], ["42", "  "]])
def test_empty_references_are_refused(references):
    """An empty reference is a substring of everything; scoring against it is a bug upstream."""
    with pytest.raises(NoReferences):
        string_match_all("42", references)
    with pytest.raises(NoReferences):
        string_match_part("42", references)


def test_substring_semantics_have_no_boundaries():
    """Documented behaviour: a reference is found inside bigger numbers and words."""
    assert string_match_all("12345678", ["1234567"]) == 1.0
    assert string_match_all("91234567", ["1234567"]) == 1.0
    assert string_match_all("concatenate", ["cat"]) == 1.0
    assert string_match_all("1234567", ["12345678"]) == 0.0


def test_all_versus_part():
    refs = ["1111111", "2222222", "3333333", "4444444"]
    prediction = "2222222, 4444444 and 5555555"
    assert string_match_all(prediction, refs) == 0.5
    assert string_match_part(prediction, refs) == 1.0
    assert string_match_all("nothing", refs) == string_match_part("nothing", refs) == 0.0
    assert string_match_all(" , ".join(reversed(refs)), refs) == 1.0  # order is free


def test_score_question_uses_its_metric():
    many = Question("q", ["ABCDE", "FGHIJ"], "variable_tracking")
    alias = Question("q", ["Tamsin Orlavey", "Orlavey"], "designer", metric="any")
    assert score_question("abcde", many) == Score(all=0.5, any=1.0, score=0.5)
    assert score_question("It was Orlavey.", alias) == Score(all=0.5, any=1.0, score=1.0)


def test_questions_refuse_empty_answers_and_unknown_metrics():
    with pytest.raises(ValueError):
        Question("q", [], "niah_single")
    with pytest.raises(ValueError):
        Question("q", [" "], "niah_single")
    with pytest.raises(ValueError):
        Question("q", ["1"], "niah_single", metric="exact")


words = st.text(st.characters(categories=("Lu", "Ll", "Nd", "Zs")), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(before=st.text(max_size=20), reference=words, after=st.text(max_size=20))
def test_a_reference_written_out_is_always_found(before, reference, after):
    if not normalize(reference):
        return
    assert string_match_part(f"{before} {reference} {after}", [reference]) == 1.0


@settings(max_examples=100, deadline=None)
@given(before=st.text(max_size=20),
       reference=st.from_regex(r"[A-Za-z0-9 ]*[A-Za-z0-9]", fullmatch=True))
def test_ascii_case_never_matters(before, reference):
    """(Beyond ASCII, case folding is Unicode's: "ı" and "I" differ, "ß" and "SS" match.)"""
    assert string_match_part(f"{before} {reference.swapcase()}", [reference]) == 1.0


@settings(max_examples=150, deadline=None)
@given(prediction=st.text(max_size=30), references=st.lists(words, min_size=1, max_size=5))
def test_scores_are_fractions(prediction, references):
    references = [r for r in references if normalize(r)]
    if not references:
        return
    all_, part = string_match_all(prediction, references), string_match_part(prediction, references)
    assert 0.0 <= all_ <= part <= 1.0
    assert part == float(all_ > 0)


def test_mcnemar_exact_by_hand():
    from kvedge.bench.scoring import mcnemar_exact

    assert mcnemar_exact(0, 0) == 1.0                       # no discordant pair
    assert mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)     # 2 · P[X ≤ 0], X ~ Bin(5, ½)
    assert mcnemar_exact(12, 1) == mcnemar_exact(1, 12) == pytest.approx(2 * 14 / 2 ** 13)
