"""HotpotQA's official answer metrics and the paired bootstrap, on hand-worked examples."""
import pytest

from kvedge.bench.answer_metrics import containment, exact_match, f1, normalize_answer, qa_scores
from kvedge.bench.bootstrap import UnpairedScores, paired_bootstrap
from kvedge.bench.scoring import NoReferences


def test_the_official_normalizer():
    assert normalize_answer("The Beatles") == normalize_answer("beatles") == "beatles"
    assert normalize_answer("  An apple, a day!  ") == "apple day"
    assert normalize_answer("Theater") == "theater"  # articles only as whole words
    assert normalize_answer("U.S.A.") == "usa"
    assert normalize_answer("The The") == ""  # a band HotpotQA asks about: nothing is left


def test_exact_match_and_f1():
    assert exact_match("The Beatles.", "beatles") == 1.0
    assert exact_match("the beatles band", "beatles") == 0.0
    # "the beatles band" → [beatles, band] vs [beatles]: P = 1/2, R = 1, F1 = 2/3
    assert f1("the beatles band", "The Beatles") == pytest.approx(2 / 3)
    # [paul, mccartney] vs [john, paul, george]: 1 common, P = 1/2, R = 1/3, F1 = 0.4
    assert f1("Paul McCartney", "John, Paul & George") == pytest.approx(0.4)
    assert f1("blue", "red") == 0.0
    # yes/no are all or nothing, even inside a longer answer
    assert f1("yes", "yes") == 1.0 and f1("yes it is", "yes") == 0.0 and f1("no", "yes") == 0.0


def test_containment_needs_whole_tokens():
    assert containment("It was The Beatles, in 1962.", "Beatles") == 1.0
    assert containment("Answer: 1970s and 1980s", "1970s and 1980s") == 1.0
    assert containment("not at all", "no") == 0.0
    assert containment("yes", "no") == 0.0


def test_scores_take_the_best_reference_and_skip_empty_ones():
    refs = ["the first half of the 10th century", "10th century"]  # SQuAD's annotators
    assert f1("The 10th century", refs[0]) < 1
    assert qa_scores("The 10th century", refs) == {"em": 1.0, "f1": 1.0, "contain": 1.0}
    assert qa_scores("anything", ["!!!"]) == {"em": None, "f1": None, "contain": None}
    with pytest.raises(NoReferences):
        qa_scores("anything", [])


def test_paired_bootstrap():
    ceiling = [1, 1, 1, 1, 0, 1, 1, 0, 1, 1] * 5   # 0.8
    method = [1, 1, 0, 1, 0, 1, 1, 0, 1, 1] * 5    # 0.7: one question in ten lost
    p = paired_bootstrap(method, ceiling, resamples=2000, seed=1)
    assert (p.mean, p.ceiling, p.questions) == (pytest.approx(0.7), pytest.approx(0.8), 50)
    assert p.diff.value == pytest.approx(-0.1) and p.ratio.value == pytest.approx(0.875)
    # only the lost questions vary the difference: it is never positive, and 0 only when a
    # draw misses all five of them
    assert p.diff.low < -0.1 < p.diff.high <= 0
    assert p.ratio.low < 0.875 < p.ratio.high <= 1
    assert paired_bootstrap(method, ceiling, resamples=2000, seed=1) == p  # seeded
    same = paired_bootstrap(ceiling, ceiling, resamples=500)
    assert same.diff.as_list() == [0.0, 0.0, 0.0] and same.ratio.value == 1.0
    assert paired_bootstrap([1, 0], [0, 0]).ratio is None  # no ceiling to divide by
    with pytest.raises(UnpairedScores):
        paired_bootstrap([1, 0], [1])


def test_the_cluster_bootstrap_resamples_contexts_whole():
    """Questions of one context move together: one article's answers all lost (its eviction
    dropped what they needed) is one event among 3 articles, not 20 among 60 questions."""
    ceiling = [1.0] * 60
    method = [0.0] * 20 + [1.0] * 40  # article 0 lost whole
    articles = [q // 20 for q in range(60)]
    by_question = paired_bootstrap(method, ceiling, resamples=4000, seed=2)
    by_article = paired_bootstrap(method, ceiling, resamples=4000, seed=2, clusters=articles)
    assert by_question.diff.value == by_article.diff.value == pytest.approx(-1 / 3)
    assert by_question.diff.high < -0.2  # "beyond chance" question by question
    assert by_article.diff.high == 0.0 and by_article.diff.low == -1.0  # not with 3 articles
    # a context per question: the question bootstrap, draw for draw
    assert paired_bootstrap(method, ceiling, seed=2, clusters=list(range(60))) == \
        paired_bootstrap(method, ceiling, seed=2)
    # labels need not be numbers or sorted; one per question
    names = ["b" if q < 20 else "a" for q in range(60)]
    assert paired_bootstrap(method, ceiling, clusters=names).diff.value == pytest.approx(-1 / 3)
    with pytest.raises(UnpairedScores, match="label per question"):
        paired_bootstrap(method, ceiling, clusters=articles[:-1])
