"""The benchmark runner: a small grid end to end on a tiny model — resumable, reported."""
from click.testing import CliRunner

from kvedge.bench.__main__ import bench, preset
from kvedge.bench.datasets import demo_kb_items
from kvedge.bench.report import load
from kvedge.bench.runner import run_grid
from kvedge.bench.suites import Bench, matches


def test_quick_grid_runs_resumes_and_reports(tmp_path):
    p = preset("quick", "tiny-llama")
    p.items, p.max_new_tokens, p.evict_lengths = 2, 4, [2]  # byte tokens: keep it short
    results = tmp_path / "results.jsonl"
    runner = Bench(p.model, max_new_tokens=p.max_new_tokens)
    rows = run_grid(p, results, runner.run)
    assert len(rows) == len(p.cells()) == len(load(results))
    by_method = {r["method"]: r for r in rows if r["suite"] == "reuse"}
    assert by_method["recompute"]["first_token_s_ratio"] == 1.0  # its own ceiling
    assert by_method["a3"]["recomputed"] > 0 and by_method["pie"]["recomputed"] == 0
    assert all(r["questions"] == 2 for r in rows if r["suite"] == "reuse")
    assert run_grid(p, results, runner.run) == []  # a rerun skips finished cells
    out = CliRunner().invoke(bench, ["report", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    report = (tmp_path / "report.md").read_text()
    assert "| demo-kb | 3 | a3 | 0.15 |" in report
    assert (tmp_path / "accuracy_vs_ttft.png").stat().st_size > 1000


def test_demo_kb_items_hold_their_answers():
    for item in demo_kb_items("reuse", 4, 5, seed=1):
        assert len(item.documents) == 4
        (question, answers), = item.questions
        assert any(a in doc for doc in item.documents for a in answers)
    contexts = demo_kb_items("evict", 6, 10, seed=2)
    assert len(contexts) == 10 and sum(len(c.questions) for c in contexts) == 30
    for kbqa in contexts:
        assert len(kbqa.documents) == 6 and len(kbqa.questions) == 3
        text = "".join(kbqa.documents)
        assert all(any(a in text for a in answers) for _, answers in kbqa.questions)


def test_matching_is_case_and_space_insensitive():
    assert matches("The year was 1873.", ["1873"]) == (1.0, 1.0)
    assert matches("Tomas  BRANDEL founded it", ["tomas brandel", "x"]) == (1.0, 0.5)
    assert matches("", ["a"]) == (0.0, 0.0)


def test_generated_tasks_feed_both_suites(tmp_path):
    from kvedge.bench.datasets import generated_items
    from kvedge.common.models import load_model

    tok = load_model("tiny-llama").tokenizer
    reuse = generated_items("multidoc_qa", "reuse", 600, 2, seed=0, tokenizer=tok)
    assert len(reuse) == 2 and all(len(item.documents) >= 2 for item in reuse)
    kbqa, = generated_items("niah_multiquery", "evict", 500, 1, seed=1, tokenizer=tok)
    assert len(kbqa.documents) == 1
    assert all(all(a in kbqa.documents[0] for a in answers) for _, answers in kbqa.questions)
    p = preset("quick", "tiny-llama")
    p.reuse_tasks, p.evict_tasks, p.items, p.max_new_tokens = ["multidoc_qa"], [], 1, 2
    p.reuse_lengths, p.strategies = [600], ["recompute", "a3"]
    rows = run_grid(p, tmp_path / "r.jsonl",
                    Bench(p.model, max_new_tokens=2).run)
    assert {r["method"] for r in rows} == {"recompute", "a3"}
