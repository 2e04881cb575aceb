"""bench/scale.py end to end at a small size (200 segments, 20 questions, no reference KB):
a real gateway ingests the KB, a real edge process (`kvedge serve --cache-bytes`) syncs it
and answers over its HTTP API with a cache of 5 % of it."""
import pytest

from kvedge.bench import scale


@pytest.mark.slow  # ~25 s of CPU: two processes load the model
def test_the_scale_bench_reports_every_figure_and_keeps_disk_within_the_budget(tmp_path):
    report = scale.run(200, 20, 0.05, small=0, data=tmp_path, echo=lambda *_: None)
    [row] = report["rows"]
    assert row["segments"] == 200 and row["sync_s"] > 0 and row["ingest_s"] > 0
    assert row["hit"]["n"] + row["miss"]["n"] == 20 and row["miss"]["n"] > 0
    assert row["hit"]["n"] > 0  # the hot question's packs stayed cached
    assert row["miss"]["p50_s"] <= row["miss"]["p99_s"]
    assert set(row["rss_bytes"]) == {"start", "middle", "end"}
    assert row["cache_bytes"] == int(0.05 * row["pack_bytes"])
    assert 0 < row["disk_max_bytes"] <= row["cache_bytes"]
    assert report["disk_within_budget"] is True and report["hit_p99_over_small"] is None
    assert "| 200 |" in scale.table(report)
    # --questions 0 on the same data: the KB is reused, its sync timed both ways
    [synced] = scale.run(200, 0, 0.05, small=0, data=tmp_path, echo=lambda *_: None)["rows"]
    assert synced["ingest_s"] is None and synced["sync_heads_s"] > 0 < synced["sync_ranged_s"]
    # --hits-in-process on the same data: the edge state's cached packs, asked in process
    [hits] = scale.hits_in_process(tmp_path, asks=10)
    assert hits["kb"] == "kb200" and hits["hit"]["n"] == 10 and hits["cached_packs"] > 0


def test_the_workload_repeats_a_hot_set_between_fresh_questions():
    asks = scale.workload(1000, 40, hot=5)
    assert len(set(asks[0::2])) == 5 and len(set(asks[1::2])) > 10
    words = scale.vocabulary()
    assert "r00042x" in scale.question(42, words)
    assert scale.record(42, words) == scale.record(42, words)
