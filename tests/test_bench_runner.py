"""The benchmark runner: a small grid end to end on a tiny model — resumable, reported."""
import json

from click.testing import CliRunner

from kvedge.bench.cli import bench, preset
from kvedge.bench.datasets import demo_kb_items
from kvedge.bench.report import load
from kvedge.bench.runner import run_grid
from kvedge.bench.suites import Bench, scores
from kvedge.bench.tasks import Question


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
        question, = item.questions
        assert question.metric == "any" and question.instruction
        assert any(a in doc for doc in item.documents for a in question.answers)
    contexts = demo_kb_items("evict", 6, 10, seed=2)
    assert len(contexts) == 10 and sum(len(c.questions) for c in contexts) == 30
    for kbqa in contexts:
        assert len(kbqa.documents) == 6 and len(kbqa.questions) == 3
        text = "".join(kbqa.documents)
        assert all(any(a in text for a in q.answers) for q in kbqa.questions)


def test_scores_follow_the_questions_metric():
    one = Question("When?", ["1873"], "demo-kb", metric="any")
    assert scores("The year was 1873.", one) == {"score": 1.0, "any": 1.0, "all": 1.0}
    aliases = Question("Who?", ["tomas brandel", "x"], "demo-kb", metric="any")
    assert scores("Tomas  BRANDEL founded it", aliases) == {"score": 1.0, "any": 1.0, "all": 0.5}
    every = Question("Which?", ["tomas brandel", "x"], "vt", metric="all")
    assert scores("Tomas  BRANDEL founded it", every)["score"] == 0.5
    assert scores("", one)["score"] == 0.0


def test_generated_tasks_feed_both_suites(tmp_path):
    from kvedge.bench.datasets import generated_items
    from kvedge.common.models import load_model

    tok = load_model("tiny-llama").tokenizer
    reuse = generated_items("multidoc_qa", "reuse", 600, 2, seed=0, tokenizer=tok)
    assert len(reuse) == 2 and all(len(item.documents) >= 2 for item in reuse)
    kbqa, = generated_items("niah_multiquery", "evict", 500, 1, seed=1, tokenizer=tok)
    assert len(kbqa.documents) == 1
    assert all(all(a in kbqa.documents[0] for a in q.answers) for q in kbqa.questions)
    p = preset("quick", "tiny-llama")
    p.reuse_tasks, p.evict_tasks, p.items, p.max_new_tokens = ["multidoc_qa"], [], 1, 2
    p.reuse_lengths, p.strategies = [600], ["recompute", "a3"]
    rows = run_grid(p, tmp_path / "r.jsonl",
                    Bench(p.model, max_new_tokens=2).run)
    assert {r["method"] for r in rows} == {"recompute", "a3"}


def test_cells_and_overrides():
    import click
    import pytest

    from kvedge.bench.cli import apply_overrides

    p = preset("tasks", "tiny-llama")
    cells = p.cells()
    assert {c.suite for c in cells} == {"reuse", "evict"}
    ceilings = [c for c in cells if c.method in ("full", "kvpress-full")]
    assert ceilings and all(c.budget == 1.0 for c in ceilings)  # one cell each, no budgets
    only = apply_overrides(p, suite="evict", tasks=["niah_single_noise"], lengths=[512],
                           methods=["full", "kvzip", "kvpress-kvzip"], budgets=[0.3], items=2)
    assert {(c.suite, c.task, c.length, c.method, c.budget, c.items) for c in only.cells()} == {
        ("evict", "niah_single_noise", 512, "full", 1.0, 2),
        ("evict", "niah_single_noise", 512, "kvzip", 0.3, 2),
        ("evict", "niah_single_noise", 512, "kvpress-kvzip", 0.3, 2)}
    # `full` joins grids whose lengths mean different things: documents vs tokens
    full = preset("full", "tiny-llama").cells()
    assert {c.length for c in full if c.task == "demo-kb"} <= {3, 6}
    assert {c.length for c in full if c.task != "demo-kb"} == {1024, 2048}
    assert len(full) == len(set(full))
    for bad in ({"tasks": ["niah_single"]}, {"methods": ["kvpress-h2o"]},
                {"strategies": ["no-such-strategy"]}):
        with pytest.raises(click.BadParameter, match="unknown"):
            apply_overrides(p, **bad)


def test_cli_refuses_unknown_names_before_loading_a_model(tmp_path):
    out = CliRunner().invoke(bench, ["run", "--tasks", "nope", "--out", str(tmp_path)])
    assert out.exit_code != 0 and "unknown task nope" in out.output
    assert not (tmp_path / "results.jsonl").exists()
    out = CliRunner().invoke(bench, ["run", "--codec", "int5", "--out", str(tmp_path)])
    assert out.exit_code != 0 and "unknown codec" in out.output


def test_a_cells_key_names_its_codec_and_older_results_still_count(tmp_path):
    from dataclasses import asdict

    from kvedge.bench.runner import LEGACY_CODEC, done_keys

    p = preset("quick", "tiny-llama")
    assert not {c.key for c in p.cells("fp16")} & {c.key for c in p.cells("int8")}
    cell = p.cells(LEGACY_CODEC)[0]
    old = {k: v for k, v in asdict(cell).items() if k != "codec"}  # written before the codec
    old["key"] = cell.key.rsplit("/", 1)[0]                          # joined the key
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(old) + "\n" + json.dumps({**asdict(cell), "key": cell.key})
                       + "\n")
    assert done_keys(results) == {cell.key}
    assert len(run_grid(p, results, lambda c: {}, codec="int8")) == len(p.cells("int8"))


def test_questions_are_asked_with_their_own_instruction_and_budget():
    runner = Bench("tiny-llama", max_new_tokens=4)
    q = Question("What is the magic number?", ["1234567"], "niah",
                 "Answer with the number only.")
    ids = runner.engine.question_ids(q.text, q.instruction)
    text = runner.engine.tok.decode(ids)
    assert text.startswith("Question: What is the magic number?\nAnswer with the number only.")
    assert text.count("Question:") == 1 and "documents above" not in text
    # every reference must come back: the budget grows with them (byte tokens here)
    many = Question("All?", ["1234567", "7654321", "1111111", "2222222"], "niah", metric="all")
    assert runner.new_tokens(q) == 2 * 7 + 8
    assert runner.new_tokens(many) == 2 * len("1234567, 7654321, 1111111, 2222222") + 8
    assert Bench.new_tokens(runner, Question("Short?", ["ab"], "x")) == 4 + 8


def test_reuse_suite_cuts_long_documents_into_ingest_segments():
    runner = Bench("tiny-llama", max_new_tokens=2, segment_tokens=128)
    text = "\n\n".join(f"Paragraph {i} says nothing much at all." for i in range(20))
    packs = runner.packs(text, whole=False)
    assert len(packs) > 1 and all(ctx.n_tokens <= 128 for ctx, _ in packs)
    (whole, _), = runner.packs(text, whole=True)
    assert whole.n_tokens >= sum(ctx.n_tokens for ctx, _ in packs) - len(packs)


def test_report_shows_unmeasured_values_as_dashes(tmp_path):
    from kvedge.bench.report import write_report

    base = {"suite": "evict", "task": "t", "length": 100, "items": 1, "seed": 0,
            "model": "m", "questions": 2}
    rows = [{**base, "key": "a", "method": "full", "budget": 1.0, "score": 0.5,
             "score_ratio": 1.0, "kv_bytes": 2e6, "kv_bytes_ratio": 1.0, "shipped_bytes": 1e6,
             "compress_s": None, "prefill_s": None},
            {**base, "key": "b", "method": "kvpress-kvzip", "budget": 0.2, "score": 0.5,
             "score_ratio": 1.0, "kv_bytes": None, "kv_bytes_ratio": None,
             "shipped_bytes": None, "compress_s": 3.0, "prefill_s": 1.0}]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(results, tmp_path).read_text()
    assert "| t | 100 | kvpress-kvzip | 0.2 | 0.50 | 1.00 | — | — | — | 3.00 | 3.0 | 2 |" in report
    assert "| kvpress-kvzip | 0.2 | 0.50 | — | 2 | 1 |" in report  # no ceiling recorded
    assert (tmp_path / "accuracy_vs_budget.png").stat().st_size > 1000


def test_kvpress_rows_are_divided_by_kvpress_full_on_the_same_items():
    from kvedge.bench.report import rebase_kvpress, summary

    base = {"suite": "evict", "task": "t", "length": 100, "items": 2, "seed": 0, "questions": 2}
    rows = [{**base, "method": "full", "budget": 1.0, "score": 1.0, "ceiling_score": 1.0,
             "score_ratio": 1.0},
            {**base, "method": "kvpress-full", "budget": 1.0, "score": 0.5,
             "ceiling_score": 1.0, "score_ratio": 0.5},
            {**base, "method": "kvpress-kvzip", "budget": 0.2, "score": 0.25,
             "ceiling_score": 1.0, "score_ratio": 0.25},
            {**base, "method": "kvzip", "budget": 0.2, "score": 0.5, "ceiling_score": 1.0,
             "score_ratio": 0.5},
            {**base, "items": 3, "method": "kvpress-snapkv", "budget": 0.2, "score": 0.5,
             "ceiling_score": 1.0, "score_ratio": 0.5}]  # no kvpress-full on these items
    ratios = {r["method"]: r["score_ratio"] for r in rebase_kvpress(rows)}
    assert ratios == {"full": 1.0, "kvpress-full": 1.0, "kvpress-kvzip": 0.5, "kvzip": 0.5,
                      "kvpress-snapkv": 0.5}
    pooled = summary(rebase_kvpress(rows))
    assert pooled[("kvpress-kvzip", 0.2)][:2] == (0.25, 0.5)
    assert pooled[("kvzip", 0.2)][:2] == (0.5, 0.5)


def test_reuse_preset_measures_every_setting_against_recompute(tmp_path):
    """`--preset reuse` end to end on a tiny model: one row per strategy setting, each with
    its ratios to the same-run recompute, the default's TTFT split by phase, the frontier."""
    from kvedge.bench.report import setting
    from kvedge.bench.runner import settings
    from kvedge.edge.strategies import STRATEGIES

    args = ["run", "--preset", "reuse", "--model", "tiny-llama", "--lengths", "2",
            "--items", "2", "--max-new-tokens", "2", "--ratios", "0.15",
            "--sweep", "sparsex:boundary=0,0.5", "--out", str(tmp_path)]
    out = CliRunner().invoke(bench, args)
    assert out.exit_code == 0, out.output
    rows = load(tmp_path / "results.jsonl")
    sweeps = {"sparsex": {"ratio": [0.15], "boundary": [0, 0.5]}}
    want = {(name, r, o) for name in STRATEGIES
            for r, o in settings(name, [0.15], sweeps.get(name, {}))}
    assert {(r["method"], r["budget"], r["options"]) for r in rows} == want
    assert len(rows) == len(want) and all(r["questions"] == 2 for r in rows)
    for r in rows:
        assert r["score_ratio"] is not None or r["ceiling_score"] == 0
        assert r["first_token_s_median_ratio"] > 0 and len(r["per_question"]) == 2
        assert {q["answer_at"] for q in r["per_question"]} <= {0, 1}
    ceiling, = [r for r in rows if r["method"] == "recompute"]
    assert ceiling["first_token_s_median_ratio"] == 1.0 and ceiling["gained"] == 0
    assert ceiling["at_budget"] == 2  # seeded random weights: no EOS within 2 tokens
    timed = [r for r in rows if r["breakdown"]]
    assert [(r["method"], r["budget"]) for r in timed] == [("a3", 0.15)]  # a3's defaults
    phases = timed[0]["breakdown"]
    assert phases["questions"] == 2 and phases["load_s"] > 0
    assert phases["full_layers_s"] > 0 and phases["sparse_layers_s"] > 0
    assert phases["phases_ttft_s"] >= phases["plan_s"] + phases["forward_s"]
    report = (tmp_path / "report.md").read_text()
    for r in rows:
        assert f"| {setting(r)} |" in report
    assert "| multidoc-facts | 2 | a3 @0.15 |" in report  # the breakdown's row
    assert (tmp_path / "reuse_frontier.png").stat().st_size > 1000
    again = CliRunner().invoke(bench, args)
    assert again.exit_code == 0 and "0 new cells" in again.output


def test_settings_cross_swept_options_and_name_their_cells():
    import click
    import pytest

    from kvedge.bench.cli import apply_overrides
    from kvedge.bench.runner import Cell, settings

    assert settings("pie", [0.1, 0.2], {}) == [(1.0, "")]
    assert settings("a3", [0.1, 0.2], {}) == [(0.1, ""), (0.2, "")]
    assert settings("sparsex", [0.3], {"ratio": [0.05], "boundary": [0, 0.1]}) == [
        (0.05, "boundary=0"), (0.05, "boundary=0.1")]
    assert settings("samkv", [0.15], {"bias": ["true", "false"]}) == [
        (0.15, "bias=true"), (0.15, "bias=false")]  # `--sweep samkv:bias=true,false`
    from kvedge.bench.cli import _sweep
    assert _sweep(None, None, ["samkv:bias=true,false", "samkv:p=0.5"]) == {
        "samkv": {"bias": ["true", "false"], "p": [0.5]}}
    cell = Cell("reuse", "multidoc-facts", 3, "sparsex", 0.05, 100, options="boundary=0.1")
    assert cell.key.endswith("/int8+zstd/boundary=0.1") and cell.option_values() == {
        "boundary": "0.1"}
    assert Cell("reuse", "t", 3, "a3", 0.15, 1).key == "reuse/t/3/a3/0.15/1/0/int8+zstd"
    p = apply_overrides(preset("reuse", "tiny-llama"), ratios=[0.2],
                        sweeps={"sparsex": {"boundary": [0.3]}})
    assert {(c.method, c.budget, c.options) for c in p.cells()
            if c.method in ("a3", "sparsex") and c.length == 3} == {
        ("a3", 0.2, ""), ("sparsex", 0.2, "boundary=0.3")}
    with pytest.raises(click.BadParameter, match="no option"):
        apply_overrides(p, sweeps={"pie": {"ratio": [0.1]}})
    out = CliRunner().invoke(bench, ["run", "--sweep", "sparsex=0.1", "--out", "x"])
    assert out.exit_code != 0 and "STRATEGY:OPTION=V1,V2" in out.output
