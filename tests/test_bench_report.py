"""The eviction report's codec columns and the bytes-vs-accuracy frontier, on synthetic rows."""
import json

from kvedge.bench.codec_frontier import FRONTIER_BEGIN, FRONTIER_END, write_codec_frontier
from kvedge.bench.report import (evict_table, f1_of_full, full_kv_acc, largest_runs, summary,
                                  summary_table, write_report)


def row(task, method, budget, codec, score, shipped, *, full, ceiling, fp16, q=4):
    """An eviction cell: accuracy `score`, full KV's in `codec` (`ceiling`) and uncompressed
    (`full`) on the same questions; `shipped` and `fp16` bytes (the context's fp16 KV)."""
    return {"key": f"{task}/{method}/{budget}/{codec}", "suite": "evict", "task": task,
            "length": 100, "items": 2, "seed": 0, "model": "m", "method": method,
            "budget": budget, "codec": codec, "questions": q, "score": score,
            "ceiling_score": ceiling, "score_ratio": score / ceiling, "full_kv_score": full,
            "shipped_bytes": shipped, "fp16_bytes": fp16, "kv_bytes": None,
            "kv_bytes_ratio": None, "compress_s": 2.0, "prefill_s": 1.0}


ROWS = [row("a", "full", 1.0, "fp16", 0.8, 2.04e6, full=0.8, ceiling=0.8, fp16=2e6),
        row("a", "full", 1.0, "kvtc:bits=2", 0.75, 2.5e5, full=0.8, ceiling=0.75, fp16=2e6),
        row("a", "contrastkv", 0.1, "kvtc:bits=2", 0.6, 5e4, full=0.8, ceiling=0.75, fp16=2e6),
        row("b", "contrastkv", 0.1, "kvtc:bits=2", 0.9, 1e5, full=1.0, ceiling=1.0, fp16=3e6,
            q=2),
        row("a", "contrastkv", 0.2, "int8+zstd", 0.8, 2e5, full=0.8, ceiling=0.8, fp16=2e6)]


def test_the_eviction_table_names_the_codec_and_both_ceilings_and_bytes_vs_fp16():
    table = "\n".join(evict_table(ROWS))
    head = ("| task | length | method | budget | codec | acc | of full KV | of full, same codec | "
            "× vs fp16 |")
    assert table.startswith(head)
    # 0.6 of full KV's 0.8 uncompressed, of 0.75 in kvtc:bits=2; 2 MB of fp16 KV over 50 KB
    assert ("| a | 100 | contrastkv | 0.1 | kvtc:bits=2 | 0.60 | 0.75 | 0.80 | 40.0 | — | — | "
            "0.05 | 2.00 | 2.0 | 4 |") in table
    assert "| a | 100 | full | 1 | fp16 | 0.80 | 1.00 | 1.00 | 1.0 |" in table  # pack overhead


def test_pooling_keeps_codecs_apart_and_weighs_bytes_and_accuracy_by_questions():
    pooled = summary(ROWS, full_kv_acc)
    assert {k for k in pooled if k[0] == "full"} == {("full", 1.0, "fp16"),
                                                     ("full", 1.0, "kvtc:bits=2")}
    p = pooled[("contrastkv", 0.1, "kvtc:bits=2")]
    assert (round(p.acc, 4), p.questions, p.groups) == (0.7, 6, 2)  # (0.6·4 + 0.9·2) / 6
    assert round(p.of_ceiling, 4) == round(4.2 / 5.2, 4)            # over (0.8·4 + 1.0·2)
    assert p.fewer_bytes == (2e6 * 4 + 3e6 * 2) / (5e4 * 4 + 1e5 * 2)  # 35×
    old = {k: v for k, v in ROWS[2].items() if k != "full_kv_score"}  # from before it was kept
    assert full_kv_acc(old) is None  # its ceiling is kvtc's full KV, not the uncompressed one
    legacy = {k: v for k, v in old.items() if k != "codec"}  # fp16 packs: its ceiling is it
    assert full_kv_acc(legacy) == old["ceiling_score"]
    assert "| contrastkv | 0.1 | kvtc:bits=2 | 0.70 | 0.81 | 35.0 | 6 | 2 |" in \
        summary_table(ROWS, "method", "full KV", full_kv_acc, with_bytes=True)


def test_the_report_draws_the_frontier_and_the_doc_gets_it_between_markers(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    report = write_report(results, tmp_path).read_text()
    assert "![bytes_frontier](bytes_frontier.png)" in report
    assert (tmp_path / "bytes_frontier.png").stat().st_size > 1000
    doc = tmp_path / "docs" / "codecs.md"
    doc.parent.mkdir()
    doc.write_text(f"# Pack codecs\n\nProse before.\n\n{FRONTIER_BEGIN}\nold\n{FRONTIER_END}\n"
                   "\nProse after.\n")
    for _ in range(2):  # a rerun replaces the block
        image = write_codec_frontier(results, doc)
    text = doc.read_text()
    assert image == doc.parent / "codecs_frontier.png" and image.stat().st_size > 1000
    assert text.count(FRONTIER_BEGIN) == 1 and "old" not in text
    assert text.startswith("# Pack codecs\n\nProse before.") and text.endswith("Prose after.\n")
    assert "| contrastkv | 0.1 | kvtc:bits=2 | 0.70 | 0.81 | 35.0 | 6 | 2 |" in text
    assert "![bytes vs accuracy](codecs_frontier.png)" in text


def test_rows_without_bytes_draw_no_frontier(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({**ROWS[2], "fp16_bytes": None}) + "\n")
    assert "bytes_frontier" not in write_report(results, tmp_path).read_text()
    assert "| kvtc:bits=2 | 0.60 | 0.75 | 0.80 | — |" in "\n".join(evict_table(
        [{**ROWS[2], "fp16_bytes": None}]))


def test_the_f1_frontier_divides_by_the_fp16_full_cell_on_the_same_questions(tmp_path):
    """Real-QA cells (with F1) get F1 over the fp16 full-KV cell of the same task, length,
    items, seed and model, pooled by questions; a cell with no such fp16 cell is left out."""
    from kvedge.bench.report import f1_of_full

    f1 = {"full/fp16": 0.4, "full/int4+zstd": 0.38, "snapkv/int4+zstd": 0.3, "b": 0.2}
    rows = [{**ROWS[0], "task": "squad-evict", "f1": f1["full/fp16"]},
            {**ROWS[1], "task": "squad-evict", "codec": "int4+zstd", "f1": f1["full/int4+zstd"]},
            {**ROWS[2], "task": "squad-evict", "method": "snapkv", "codec": "int4+zstd",
             "f1": f1["snapkv/int4+zstd"]},
            {**ROWS[3], "task": "squad-evict", "seed": 1, "f1": f1["b"]}]  # no fp16 sibling
    points = f1_of_full(rows)
    assert set(points) == {("full", 1.0, "fp16"), ("full", 1.0, "int4+zstd"),
                           ("snapkv", 0.1, "int4+zstd")}
    p = points[("snapkv", 0.1, "int4+zstd")]
    assert (p.fewer_bytes, round(p.of_ceiling, 4)) == (40.0, 0.75)
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = write_report(results, tmp_path).read_text()
    assert "| snapkv | 0.1 | int4+zstd | 40.0 | 0.750 |" in report
    assert (tmp_path / "f1_bytes_frontier.png").stat().st_size > 1000


def test_pooled_tables_count_a_cell_once_at_its_largest_run(tmp_path):
    """A cell run at 2 items and again at 6 (the first 2 questions shared) pools the 6-item
    run alone; the per-cell table keeps both; hotpot-kb's runs over other KBs stay apart."""
    small = row("a", "contrastkv", 0.1, "kvtc:bits=2", 0.2, 5e4, full=0.8, ceiling=0.75,
                fp16=2e6)
    large = {**row("a", "contrastkv", 0.1, "kvtc:bits=2", 0.6, 5e4, full=0.8, ceiling=0.75,
                   fp16=2e6, q=12), "items": 6}
    assert largest_runs([large, small]) == [large]
    assert largest_runs([small, large]) == [large]
    kb = [{**small, "task": "hotpot-kb"}, {**large, "task": "hotpot-kb"}]
    assert largest_runs(kb) == kb
    asked_of_the_large_kb = {**small, "task": "hotpot-kb", "kb_items": 6}  # --kb-items 6
    assert largest_runs([asked_of_the_large_kb, kb[1]]) == [kb[1]]
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (small, large)))
    report = write_report(results, tmp_path).read_text()
    assert "| contrastkv | 0.1 | kvtc:bits=2 | 0.60 | 0.75 | 40.0 | 12 | 1 |" in report
    assert "| a | 100 | contrastkv | 0.1 | kvtc:bits=2 | 0.20 |" in report  # per cell: both


def test_the_f1_frontier_finds_a_smaller_runs_own_fp16_reference():
    """A codec run on 2 items keeps its point when fp16 full KV was also run on 6."""
    def f1_row(codec, items, f1):
        r = row("a", "full", 1.0, codec, f1, 1e6, full=0.5, ceiling=0.5, fp16=2e6)
        return {**r, "items": items, "f1": f1}

    rows = [f1_row("fp16", 2, 0.5), f1_row("kvtc:bits=2", 2, 0.4), f1_row("fp16", 6, 0.6)]
    points = f1_of_full(rows)
    assert round(points[("full", 1.0, "kvtc:bits=2")].of_ceiling, 3) == 0.8  # 0.4 / 0.5
    assert points[("full", 1.0, "fp16")].of_ceiling == 1.0


def test_a_smaller_run_is_paired_with_a_larger_fp16_runs_first_questions(tmp_path):
    """An evicted cell run on 2 items, fp16 full KV only on 3: the reference is fp16's first
    questions (the seeded order's prefix), question by question, with a paired interval."""
    def qa(f1s):
        return [{"f1": f, "answer": str(f)} for f in f1s]

    full = {**row("a", "full", 1.0, "fp16", 0.5, 2e6, full=0.5, ceiling=0.5, fp16=2e6, q=6),
            "items": 3, "f1": 0.5, "per_question": qa([0.5, 1.0, 0.0, 0.5, 1.0, 0.0])}
    evicted = {**row("a", "contrastkv", 0.3, "rdq", 0.4, 1e5, full=0.5, ceiling=0.5, fp16=2e6),
               "f1": 0.5, "per_question": qa([0.5, 1.0, 0.0, 0.5])}  # the first 4 of fp16's
    points = f1_of_full([full, evicted])
    assert points[("contrastkv", 0.3, "rdq")].of_ceiling == 1.0  # 0.5 over fp16's first 4: 0.5
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in (full, evicted)))
    report = write_report(results, tmp_path).read_text()
    assert "| contrastkv | 0.3 | rdq | 20.0 | 1.000 | [1.00, 1.00] | +0.000 [+0.000, +0.000] |" \
        in report


def test_a_cell_that_recorded_full_kvs_f1_needs_no_fp16_cell(tmp_path):
    """An eviction cell whose questions carry fp16 full KV's F1 (`full_kv_f1`, recorded beside
    it from the run's kept fp16 ceilings, `cell_summary.against_full`) gets its F1-over-fp16 point
    and paired interval with no fp16 full-KV cell in the results."""
    from kvedge.bench.cell_summary import against_full

    fp16 = [{"score": 1.0, "f1": f} for f in (1.0, 0.5, 0.0, 0.5)]
    mine = [{"f1": f, "answer": str(f), "item": f"squad/{i // 2}/4096"}
            for i, f in enumerate((0.5, 0.5, 0.0, 0.5))]
    evicted = {**row("a", "contrastkv", 0.2, "rdq", 0.4, 1e5, full=0.5, ceiling=0.5, fp16=2e6),
               "f1": 0.375, "per_question": mine}
    evicted.update(against_full(evicted, fp16))
    assert evicted["full_kv_f1"] == 0.5
    assert [q["full_kv_f1"] for q in evicted["per_question"]] == [1.0, 0.5, 0.0, 0.5]
    assert [q["f1"] for q in evicted["per_question"]] == [0.5, 0.5, 0.0, 0.5]  # its own kept
    points = f1_of_full([evicted])
    assert points[("contrastkv", 0.2, "rdq")].of_ceiling == 0.75  # 0.375 / 0.5
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(evicted) + "\n")
    report = write_report(results, tmp_path).read_text()
    assert "| contrastkv | 0.2 | rdq | 20.0 | 0.750 |" in report
    # rows without it (or cut short) fall back to the fp16 cell, none here: no point
    assert f1_of_full([{**evicted, "per_question": mine}]) == {}
