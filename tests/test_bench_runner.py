"""The benchmark runner: a small grid end to end on a tiny model — resumable, reported."""
import json

from click.testing import CliRunner

from kvedge.bench.cell_summary import scores
from kvedge.bench.cli import bench, preset
from kvedge.bench.datasets import FACTS, demo_kb_items
from kvedge.bench.report import load
from kvedge.bench.runner import run_grid
from kvedge.bench.suites import Bench
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
    from kvedge.common.model.models import load_model

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
    assert len(run_grid(p, results, lambda c: {}, codecs=["int8"])) == len(p.cells("int8"))


def test_codecs_cross_every_cell_and_the_cli_takes_lists_of_them(tmp_path):
    import click
    import pytest

    from kvedge.bench.cli import _check_codecs
    from kvedge.common.pack.codecs import DEFAULT_CODEC

    assert _check_codecs(None, None, ("int8+zstd,kvtc:bits=3,embed=false", "int4+zstd",
                                      "int8+zstd")) == ["int8+zstd", "kvtc:bits=3,embed=false",
                                                        "int4+zstd"]
    assert _check_codecs(None, None, ()) == [DEFAULT_CODEC]
    with pytest.raises(click.BadParameter, match="bitz"):
        _check_codecs(None, None, ("int8,kvtc:bitz=3",))
    out = CliRunner().invoke(bench, ["run", "--codec", "int8+zstd,int5", "--out", str(tmp_path)])
    assert out.exit_code != 0 and "unknown codec 'int5'" in out.output
    p = preset("tasks", "tiny-llama")
    one, two = p.cells("int8+zstd"), p.cells("int8+zstd", "kvtc:bits=2")
    kvpress = [c for c in two if c.method.startswith("kvpress-")]
    assert kvpress and {c.codec for c in kvpress} == {"int8+zstd"}  # never reads our packs
    assert len(two) == 2 * len(one) - len(kvpress)
    assert {c.codec for c in two if c.method == "full"} == {"int8+zstd", "kvtc:bits=2"}


def test_eviction_cells_evict_then_encode_against_one_uncompressed_full_kv(tmp_path):
    """As a batch job: scored once on the uncompressed context, kept, then encoded per codec;
    every cell beside the same full KV in fp16 (accuracy) and the same fp16 bytes."""
    p = preset("quick", "tiny-llama")
    p.reuse_tasks, p.items, p.max_new_tokens = [], 1, 2
    p.methods = ["full", "contrastkv", "kvzip"]
    p.evict_tasks, p.evict_lengths = ["niah_single_prose"], [300]  # tokens: short, fast
    runner = Bench(p.model, max_new_tokens=2, breakdown=None)
    rows = run_grid(p, tmp_path / "r.jsonl", runner.run, codecs=["int8", "int4+zstd"])
    by = {(r["method"], r["codec"]): r for r in rows}
    assert len(by) == 6  # scored once per method, and the context's prefill timed once:
    assert len(runner._measured) == 3
    # each question names its context: the intervals resample contexts whole
    assert all({q["item"] for q in r["per_question"]} == {"niah_single_prose/300/0"}
               for r in rows)
    # kvzip reused contrastkv's reconstruction, and its seconds are charged to kvzip
    assert 0 < runner._signals.reused_s <= by[("kvzip", "int8")]["compress_s"]
    assert len({r["fp16_bytes"] for r in rows}) == len({r["full_kv_score"] for r in rows}) == 1
    # each question carries fp16 full KV's F1, so the report needs no fp16 cell (none here)
    from kvedge.bench.report import fp16_full_f1s

    full_f1s = {tuple(fp16_full_f1s(rows, r)) for r in rows}
    assert len(full_f1s) == 1 and None not in next(iter(full_f1s))
    for codec in ("int8", "int4+zstd"):
        assert by[("contrastkv", codec)]["shipped_bytes"] < by[("full", codec)]["shipped_bytes"]
    assert by[("full", "int4+zstd")]["shipped_bytes"] < by[("full", "int8")]["shipped_bytes"]


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
    # rows from before the codec was recorded: fp16; no full-KV score, no bytes: dashes
    assert ("| t | 100 | kvpress-kvzip | 0.2 | fp16 | 0.50 | — | 1.00 | — | — | — | — | 3.00 | "
            "3.0 | 2 |") in report
    assert "| kvpress-kvzip | 0.2 | fp16 | 0.50 | — | — | 2 | 1 |" in report  # no ceiling
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
    assert pooled[("kvpress-kvzip", 0.2, "fp16")][:2] == (0.25, 0.5)
    assert pooled[("kvzip", 0.2, "fp16")][:2] == (0.5, 0.5)


def test_reuse_preset_measures_every_setting_against_recompute(tmp_path):
    """`--preset reuse` end to end on a tiny model: one row per strategy setting, each with
    its ratios to the same-run recompute, the default's TTFT split by phase, the frontier."""
    from kvedge.bench.report import setting
    from kvedge.bench.runner import settings
    from kvedge.edge import DEFAULT_STRATEGY
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
    assert DEFAULT_STRATEGY in ("epic", "legolink")  # the phases below are a static plan's
    assert [(r["method"], r["budget"]) for r in timed] == [(DEFAULT_STRATEGY, 1.0)]
    phases = timed[0]["breakdown"]
    assert phases["questions"] == 2 and phases["load_s"] > 0 and phases["plan_s"] > 0
    # every layer runs the chosen tokens (no layer over all of them), no selection hook
    assert phases["full_layers_s"] == 0 and phases["sparse_layers_s"] > 0
    assert phases["select_s"] is None
    assert phases["phases_ttft_s"] >= phases["plan_s"] + phases["forward_s"]
    report = (tmp_path / "report.md").read_text()
    for r in rows:
        assert f"| {setting(r)} |" in report
    assert f"| multidoc-facts | 2 | {DEFAULT_STRATEGY} |" in report  # the breakdown's row
    assert (tmp_path / "reuse_frontier.png").stat().st_size > 1000
    again = CliRunner().invoke(bench, args)
    assert again.exit_code == 0 and "0 new cells" in again.output


def test_breakdown_defaults_to_the_edges_strategy_and_times_a3_when_asked():
    """The benchmark splits the edge's default strategy's TTFT unless told otherwise; asked
    for a3 it times a3's blocks 0..ℓ over every token, the later ones over the chosen, and
    its selection."""
    import dataclasses

    from kvedge.bench.datasets import FACTS
    from kvedge.bench.runner import Cell
    from kvedge.edge import DEFAULT_STRATEGY

    assert {f.name: f.default for f in dataclasses.fields(Bench)}["breakdown"] == \
        DEFAULT_STRATEGY
    assert {p.name: p.default for p in bench.commands["run"].params}["breakdown"] == \
        DEFAULT_STRATEGY
    out = CliRunner().invoke(bench, ["load", "--help"])
    assert f"the edge's, {DEFAULT_STRATEGY}" in out.output
    assert "--decode-weights [fp32|int8|fp16|bf16|auto]" in out.output
    row = Bench("tiny-llama", max_new_tokens=2, breakdown="a3").run(
        Cell("reuse", FACTS, 2, "a3", 0.15, 2))
    phases = row["breakdown"]
    assert phases["questions"] == 2 and phases["plan_s"] > 0
    assert phases["full_layers_s"] > 0 and phases["sparse_layers_s"] > 0
    assert phases["select_s"] > 0


def test_ttft_phases_split_selective_static_and_full_plans():
    """`bench.ttft`'s layer split: A3's blocks 0..ℓ run every token after the prefix, the
    rest the chosen ones, and its observer selects; a static plan (legolink) runs the chosen
    tokens at every layer and has no observer; recompute runs every token everywhere."""
    from conftest import tiny_runtime
    from test_strategies import composed_prompt
    from kvedge.bench.ttft import ttft_phases
    from kvedge.edge.strategies import get_strategy

    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, sizes=(60, 50, 80))
    a3 = ttft_phases(rt, composed, get_strategy("a3"), 4)
    assert a3["full_layers_s"] > 0 and a3["sparse_layers_s"] > 0 and a3["select_s"] > 0
    lego = ttft_phases(rt, composed, get_strategy("legolink"), 4)
    assert lego["full_layers_s"] == 0 and lego["sparse_layers_s"] > 0
    assert "select_s" not in lego
    full = ttft_phases(rt, composed, get_strategy("recompute"), 4)
    assert full["full_layers_s"] > 0 and full["sparse_layers_s"] == 0
    for phases in (a3, lego, full):
        parts = phases["plan_s"] + phases["forward_s"]
        assert abs(phases["phases_ttft_s"] - parts) < 1e-6


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
    from kvedge.common.pack.codecs import DEFAULT_CODEC as D  # a cell's codec unless named
    cell = Cell("reuse", "multidoc-facts", 3, "sparsex", 0.05, 100, options="boundary=0.1")
    assert cell.key.endswith(f"/{D}/boundary=0.1") and cell.option_values() == {
        "boundary": "0.1"}
    assert Cell("reuse", "t", 3, "a3", 0.15, 1).key == f"reuse/t/3/a3/0.15/1/0/{D}"
    assert Cell("reuse", "t", 3, "a3", 0.15, 1, kb_items=300).key == \
        f"reuse/t/3/a3/0.15/1/0/{D}/kb300"
    assert Cell("reuse", "t", 3, "a3", 0.15, 1, codec="int8+zstd").key == \
        "reuse/t/3/a3/0.15/1/0/int8+zstd"  # an output folder made before the switch
    p = apply_overrides(preset("reuse", "tiny-llama"), ratios=[0.2],
                        sweeps={"sparsex": {"boundary": [0.3]}})
    assert {(c.method, c.budget, c.options) for c in p.cells()
            if c.method in ("a3", "sparsex") and c.length == 3} == {
        ("a3", 0.2, ""), ("sparsex", 0.2, "boundary=0.3")}
    with pytest.raises(click.BadParameter, match="no option"):
        apply_overrides(p, sweeps={"pie": {"ratio": [0.1]}})
    out = CliRunner().invoke(bench, ["run", "--sweep", "sparsex=0.1", "--out", "x"])
    assert out.exit_code != 0 and "STRATEGY:OPTION=V1,V2" in out.output


def test_questions_per_prompt_reach_the_cells_and_the_items():
    """`--questions-per-prompt` makes other cells (their key says so) of fact prompts only;
    the default keeps today's keys; too many for the documents is refused before a model
    loads."""
    import click
    import pytest

    from kvedge.bench.cli import apply_overrides
    from kvedge.bench.datasets import FACTS, QUESTIONS_PER_PROMPT, load_items

    base = apply_overrides(preset("reuse", "tiny-llama"), tasks=[FACTS, "multidoc_qa"],
                           lengths=[3], strategies=["recompute", "pie"], items=8)
    four = apply_overrides(base, per_prompt=4)
    default = apply_overrides(base, per_prompt=QUESTIONS_PER_PROMPT)
    assert {c.key for c in default.cells()} == {c.key for c in base.cells()}
    assert all(c.per_prompt is None for c in base.cells())
    facts = [c for c in four.cells() if c.task == FACTS]
    assert facts and all(c.per_prompt == 4 and c.key.endswith("/4-per-prompt") for c in facts)
    assert all(c.per_prompt is None for c in four.cells() if c.task != FACTS)
    assert not {c.key for c in facts} & {c.key for c in base.cells()}
    items = load_items(FACTS, "reuse", 3, 8, 0, per_prompt=facts[0].per_prompt)
    assert [len(i.questions) for i in items] == [4, 4]
    assert [len(i.questions) for i in load_items(FACTS, "reuse", 3, 8, 0)] == [2] * 4
    with pytest.raises(click.BadParameter, match="hold 6 distinct questions"):
        apply_overrides(base, lengths=[2], per_prompt=7)
    out = CliRunner().invoke(bench, ["run", "--preset", "reuse", "--lengths", "2",
                                     "--questions-per-prompt", "7", "--out", "x"])
    assert out.exit_code != 0 and "hold 6 distinct questions" in out.output


def test_squad_evict_cells_record_questions_per_article():
    """On squad-evict `--questions-per-prompt` caps each article's questions (None: all,
    the key as before) and the cells' keys record it."""
    from kvedge.bench.cli import apply_overrides
    from kvedge.bench.real import SQUAD_EVICT

    base = apply_overrides(preset("eviction", "tiny-llama"), suite="evict",
                           tasks=[SQUAD_EVICT], lengths=[4096], methods=["full"], items=28)
    twelve = apply_overrides(base, per_prompt=12)
    assert all(c.per_prompt is None and "per-prompt" not in c.key for c in base.cells())
    assert all(c.per_prompt == 12 and c.key.endswith("/12-per-prompt")
               for c in twelve.cells())


def test_fact_prompts_are_an_eviction_context_with_many_questions():
    """The eviction suite takes fact prompts as one context asked `per_prompt` questions
    (the KBQA setting of the codec × eviction grid): cells record it, every question is
    answered over the evicted KV, beside full KV's answers."""
    from kvedge.bench.cli import apply_overrides

    p = apply_overrides(preset("eviction", "tiny-llama"), suite="evict", tasks=[FACTS],
                        lengths=[2], methods=["contrastkv"], budgets=[0.5], items=6,
                        per_prompt=3)
    cell, = p.cells()
    assert cell.per_prompt == 3 and cell.key.endswith("/3-per-prompt")
    row = Bench("tiny-llama", max_new_tokens=4, breakdown=None).run(cell)
    assert row["questions"] == 6 and row["full_kv_score"] is not None
    assert 0 < row["shipped_bytes"] < row["fp16_bytes"]


def test_concurrent_asks_give_the_same_answers():
    """`concurrent` eviction asks are decoded together by the scheduler: the answers are the
    one-at-a-time ones (batch-invariant steps), rows record it, and the ceiling store keys
    them apart from one-at-a-time rows (their TTFTs include each other's prefills)."""
    from kvedge.bench.cli import apply_overrides

    p = apply_overrides(preset("eviction", "tiny-llama"), suite="evict", tasks=[FACTS],
                        lengths=[2], methods=["contrastkv"], budgets=[0.5], items=6,
                        per_prompt=3)
    cell, = p.cells()
    one = Bench("tiny-llama", max_new_tokens=6, breakdown=None)
    many = Bench("tiny-llama", max_new_tokens=6, breakdown=None, concurrent=4)
    item, = one._items(cell)[:1]
    alone = one._evict(item, "contrastkv", 0.5, cell.codec)
    together = many._evict(item, "contrastkv", 0.5, cell.codec)
    assert [r["answer"] for r in together] == [r["answer"] for r in alone]
    assert all(r["concurrent"] == 4 for r in together)
    assert all("concurrent" not in r for r in alone)
    assert many._prompt_settings(cell)["concurrent"] == 4
    assert "concurrent" not in one._prompt_settings(cell)


def test_concurrent_reuse_cells_answer_as_one_at_a_time_and_resume(tmp_path):
    """`concurrent` reuse asks keep successive items' questions in flight together: the same
    answers as one at a time, rows record it, the ceiling is the one-at-a-time one (its key
    leaves concurrency out), the cell's time ratios against it are left out, and an
    unfinished cell's rows are kept apart from a one-at-a-time run's."""
    from kvedge.bench.cli import apply_overrides

    p = apply_overrides(preset("reuse", "tiny-llama"), tasks=["multidoc_qa"], lengths=[2],
                        strategies=["epic"], items=5)
    cell, = [c for c in p.cells() if c.method == "epic"]
    one = Bench("tiny-llama", max_new_tokens=4, breakdown=None)
    many = Bench("tiny-llama", max_new_tokens=4, breakdown=None, concurrent=3,
                 partial=tmp_path / "partial.jsonl")
    alone, together = one.run(cell), many.run(cell)
    assert together["questions"] == alone["questions"] >= 5
    assert together["answers"] == alone["answers"]
    assert together["ceiling_score"] == alone["ceiling_score"]
    assert together["times_comparable"] is False and "times_comparable" not in alone
    assert together["first_token_s_ratio"] is None and alone["first_token_s_ratio"] > 0
    item = many._items(cell)[0]
    assert many._partial_key(cell, item) != one._partial_key(cell, item)
    assert "concurrent" not in many._prompt_settings(cell)  # the ceiling's key
    free = Bench("tiny-llama", max_new_tokens=4, breakdown=None, concurrent=3, max_stall=0.0)
    stalled = free.run(cell)  # stall-free starts: the same answers
    assert free.engine.scheduler.inner_steps > 0
    assert stalled["answers"] == alone["answers"] and stalled["max_stall"] == 0.0
    assert "max_stall" not in together
    assert all(q["answer_s"] >= q["first_token_s"] and q["gap_s"] >= 0
               for q in stalled["per_question"])


def test_shared_context_gives_the_full_prefills_logits():
    """A later question over the first prefill's context KV: its last token's logits are the
    full prefill's (`EdgeEngine.answer` with recompute plans exactly this forward)."""
    from kvedge.bench.datasets import fact_items
    from kvedge.bench.suites import SharedContext
    from kvedge.edge.strategies import get_strategy

    runner = Bench("tiny-llama", max_new_tokens=4, breakdown=None)
    rt, worst, compared = runner.engine.rt, 0.0, 0
    for item in fact_items(2, 6, seed=0, tokenizer=runner.engine.tok, per_prompt=3):
        segments = [runner.load(path) for doc in item.documents
                    for path, _ in runner.pack_files(doc, False)]
        shared = SharedContext()
        for i, q in enumerate(item.questions):
            composed = runner.engine.compose(segments, q.text, q.instruction)
            budget = runner.new_tokens(q)
            if i == 0:  # the full prefill the others reuse, through the engine
                list(runner.engine.answer(composed, shared, budget))
                continue
            logits = []
            for plan in (get_strategy("recompute").plan(rt, composed, budget),
                         shared.plan(rt, composed, budget)):
                out = rt.forward(plan.run_ids, plan.run_positions, plan.cache,
                                 seq_len=composed.seq_len(budget))
                logits.append(out.logits[-1])
            assert plan.run_ids.tolist() == composed.question_ids  # only the question ran
            worst, compared = max(worst, float((logits[0] - logits[1]).abs().max())), compared + 1
    assert compared == 4 and worst < 1e-4, worst
    print(f"max |logit difference| shared vs full prefill: {worst:.3g}")


def test_the_shared_ceiling_answers_as_the_full_one():
    """The recompute ceiling with one prefill per prompt gives each question the answer and
    score a full prefill per question gives; its TTFT is the prompt's first, real prefill."""
    from kvedge.bench.datasets import FACTS
    from kvedge.bench.runner import Cell

    cell = Cell("reuse", FACTS, 2, "recompute", 1.0, 6, per_prompt=3)
    shared = Bench("tiny-llama", max_new_tokens=6, breakdown=None).run(cell)
    full = Bench("tiny-llama", max_new_tokens=6, breakdown=None, shared_ceiling=False).run(cell)
    assert shared["questions"] == full["questions"] == 6
    assert shared["answers"] == full["answers"] and any(shared["answers"])
    for a, b in zip(shared["per_question"], full["per_question"]):
        same = ("score", "recomputed", "prompt_tokens", "answer_at", "documents", "tokens")
        assert {k: a[k] for k in same} == {k: b[k] for k in same}
    for key in ("score", "kv_bytes", "recomputed", "sequence_ratio"):
        assert shared[key] == full[key], key
    ttfts = [q["first_token_s"] for q in shared["per_question"]]
    assert ttfts[:3] == [ttfts[0]] * 3 and ttfts[3:] == [ttfts[3]] * 3  # two prompts


def test_a_run_with_four_questions_per_prompt_makes_its_cells_and_report(tmp_path):
    from kvedge.bench.report import setting

    args = ["run", "--preset", "reuse", "--model", "tiny-llama", "--lengths", "2",
            "--items", "4", "--questions-per-prompt", "4", "--strategies", "recompute,pie,a3",
            "--ratios", "0.15", "--max-new-tokens", "2", "--out", str(tmp_path)]
    out = CliRunner().invoke(bench, args)
    assert out.exit_code == 0, out.output
    rows = load(tmp_path / "results.jsonl")
    assert {(r["method"], r["per_prompt"]) for r in rows} == {
        ("recompute", 4), ("pie", 4), ("a3", 4)}
    assert all(r["key"].endswith("/4-per-prompt") and r["questions"] == 4 for r in rows)
    ceiling, = [r for r in rows if r["method"] == "recompute"]
    assert len({q["first_token_s"] for q in ceiling["per_question"]}) == 1  # one prompt
    assert all(r["first_token_s_median_ratio"] > 0 for r in rows)
    report = (tmp_path / "report.md").read_text()
    assert "### multidoc-facts ×4 @ 2 (prompt" in report
    for r in rows:
        assert f"| {setting(r)} |" in report
    again = CliRunner().invoke(bench, args)
    assert again.exit_code == 0 and "0 new cells" in again.output


def test_retrieved_order_puts_each_questions_best_document_last():
    """`order="retrieved"`: each question's prompt composes the documents as the edge's
    retrieval ranks them for it (BM25, best last); the answer's document moves with it."""
    from kvedge.bench.datasets import FACTS, load_items
    from kvedge.bench.runner import Cell

    bench_ = Bench("tiny-llama", max_new_tokens=4, breakdown=None, order="retrieved")
    items = load_items(FACTS, "reuse", 3, 6, 0, bench_.prefill.loaded.tokenizer, None, 3)
    last = 0
    for item in items:
        for order, at in zip(bench_.document_orders(item), item.answer_at):
            assert sorted(order) == [0, 1, 2]
            last += order[-1] == at  # the generated questions name their structure
    assert last >= 5
    given = Bench("tiny-llama", max_new_tokens=4, breakdown=None)
    assert given.document_orders(items[0])[0] == [0, 1, 2]
    row = bench_.run(Cell("reuse", FACTS, 3, "recompute", 1.0, 6, per_prompt=3))
    assert row["questions"] == 6
    assert sum(q["answer_at"] == q["documents"] - 1 for q in row["per_question"]) == last


def test_a_second_run_into_the_same_out_is_refused_by_name_and_writes_nothing(tmp_path):
    """Two `bench run`s into one OUT would each rewrite partial.jsonl: the second is refused
    at once (`InUse`, exit 2), before it loads a model or touches the folder's files."""
    from kvedge.apps.kvctl import kvctl
    from kvedge.common.fsutil import locked

    args = ["bench", "run", "--preset", "reuse", "--model", "tiny-llama", "--lengths", "2",
            "--items", "1", "--max-new-tokens", "2", "--strategies", "recompute",
            "--out", str(tmp_path)]
    with locked(tmp_path / "results.jsonl"):  # a run in progress holds this
        out = CliRunner().invoke(kvctl, args)
    assert out.exit_code == 2, out.output
    assert "InUse" in out.output and str(tmp_path) in out.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl.lock"]


def test_a_cells_key_reads_back_into_the_cell():
    import pytest

    from kvedge.bench.runner import Cell

    cells = [Cell("evict", "ruler-niah", 8192, "contrastkv", 0.1, 100,
                  codec="rdq:calibrated=true,key_shift=0.5,coder=zstd"),
             Cell("evict", "squad-evict", 4096, "full", 1.0, 28, per_prompt=12),
             Cell("reuse", "hotpot-kb", 10, "a3", 0.15, 300, 1, "int8+zstd",
                  "segment_head=4,boundary=0.1", kb_items=400)]
    for cell in cells:
        assert Cell.from_key(cell.key) == cell
    with pytest.raises(ValueError, match="not a cell key"):
        Cell.from_key("evict/ruler-niah/8192")


def test_cells_of_one_source_share_their_items_made_once(monkeypatch):
    """A run's cells differ by method, budget, codec and options over the same items: they
    are made once a source (ruler-niah's 100 16K-token items took ~30 s each time), and a
    cell of another length, count or seed gets its own."""
    import dataclasses

    import kvedge.bench.suites as suites
    from kvedge.bench.runner import Cell

    made = []
    real = suites.cell_items
    monkeypatch.setattr(suites, "cell_items",
                        lambda cell, *a: made.append(cell.key) or real(cell, *a))
    bench = Bench("tiny-llama", max_new_tokens=2, breakdown=None)
    cell = Cell("evict", "niah_single_prose", 256, "kvzip", 0.2, 2)
    first = bench._items(cell)
    for other in (dataclasses.replace(cell, method="snapkv", budget=0.1),
                  dataclasses.replace(cell, codec="fp16", options="x=1")):
        assert bench._items(other) is first
    assert len(made) == 1
    for other in (dataclasses.replace(cell, length=300), dataclasses.replace(cell, items=3),
                  dataclasses.replace(cell, seed=1)):
        assert bench._items(other) is not first
    assert len(made) == 4 and [i.key for i in first] == [i.key for i in real(cell)]
