"""`kvctl bench pair`: two cells of two runs paired question by question."""
import json

import pytest
from click.testing import CliRunner

from kvedge.bench.bootstrap import paired_bootstrap
from kvedge.bench.cli import bench
from kvedge.bench.pair import CellNotFound, load_cell, pair, question_keys


def _row(method, codec, kb, scores, answers=None):
    """A hotpot-kb cell as results.jsonl keeps it: HotpotQA index → (f1, contain)."""
    answers = answers or {}
    return {"method": method, "codec": codec, "options": "", "budget": 1.0,
            "task": "hotpot-kb", "model": "m",
            "per_question": [{"item": f"hotpot-kb/{kb}/{i}/10", "f1": f1, "contain": c,
                              "answer": answers.get(i, f"a{i}")}
                             for i, (f1, c) in scores.items()]}


def _write(path, rows):
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def runs(tmp_path):
    """Two runs over two uploads (the KB's name differs), questions in another order, one
    question asked by one run only."""
    int8 = {3: (1.0, 1), 7: (0.5, 1), 11: (0.0, 0), 20: (1.0, 1), 42: (0.2, 0)}
    rdq = {42: (0.2, 0), 20: (0.0, 0), 11: (0.0, 0), 7: (0.5, 1), 3: (0.6, 1), 99: (1.0, 1)}
    a = _write(tmp_path / "a", [_row("recompute", "int8+zstd", "kb-1", int8),
                                _row("legolink", "int8+zstd", "kb-1", int8)])
    b = _write(tmp_path / "b", [_row("legolink", "rdq:calibrated=true,coder=zstd", "kb-2",
                                     rdq, answers={7: "a7", 3: "other"})])
    return a, b, int8, rdq


def test_questions_pair_by_identity_across_uploads_and_order(runs):
    a, b, int8, rdq = runs
    A = load_cell(f"{a}#method=legolink,codec=int8+zstd")
    B = load_cell(f"{b / 'results.jsonl'}#codec=rdq")  # a family names the codec
    comparisons, n, same = pair(A, B, ("f1", "contain"))
    common = sorted(set(int8) & set(rdq), key=lambda i: f"hotpot-kb/{i}/10")
    assert n == len(common) == 5
    assert same == 4  # only question 3's answer text differs
    f1 = comparisons[0]
    want = paired_bootstrap([int8[i][0] for i in common], [rdq[i][0] for i in common])
    assert (f1.metric, f1.diff, f1.ratio) == ("f1", want.diff, want.ratio)
    assert (f1.gained, f1.lost) == (2, 0)  # 3 and 20 higher over int8
    assert comparisons[1].metric == "contain" and (comparisons[1].gained,
                                                   comparisons[1].lost) == (1, 0)


def test_a_reference_naming_no_cell_or_several_is_a_named_error(runs, tmp_path):
    a, *_ = runs
    with pytest.raises(CellNotFound, match="2 cells match"):
        load_cell(f"{a}#codec=int8+zstd")
    with pytest.raises(CellNotFound, match="0 cells match"):
        load_cell(f"{a}#method=epic")
    with pytest.raises(CellNotFound, match="no results file"):
        load_cell(f"{tmp_path / 'nowhere'}#method=epic")
    with pytest.raises(CellNotFound, match="not FIELD=VALUE"):
        load_cell(f"{a}#legolink")


def test_a_filter_may_ask_only_that_a_field_contain_a_text(runs):
    """A codec spec has commas of its own: `codec~=` names a row by a part of it."""
    _, b, *_ = runs
    assert load_cell(f"{b}#codec~=calibrated=true,method=legolink")["method"] == "legolink"
    with pytest.raises(CellNotFound, match="0 cells match"):
        load_cell(f"{b}#codec~=key_layers=5545")


def test_kvctl_bench_pair_prints_the_table(runs):
    a, b, *_ = runs
    ok = CliRunner().invoke(bench, ["pair", f"{a}#method=legolink", f"{b}#method=legolink",
                                    "--metric", "f1"])
    assert ok.exit_code == 0, ok.output
    assert "paired: 5 questions" in ok.output and "| f1 | 0.5400 | 0.2600 |" in ok.output
    bad = CliRunner().invoke(bench, ["pair", f"{a}#method=epic", f"{b}#method=legolink"])
    assert bad.exit_code == 1 and "0 cells match" in bad.output and "Traceback" not in bad.output


def test_question_keys_rank_an_items_questions():
    rows = [{"item": "squad/0/4096"}, {"item": "squad/0/4096"}, {"item": "squad/1/4096"}]
    assert question_keys(rows) == [("squad/0/4096", 0), ("squad/0/4096", 1),
                                   ("squad/1/4096", 0)]


def test_an_unfinished_cell_pairs_over_its_items_so_far(tmp_path):
    """A `--by-item` run's partial.jsonl: each cell's items so far are a cell `pair` reads;
    a cell whose row is written is read from results.jsonl instead."""
    from kvedge.bench.ceilings import CeilingStore
    from kvedge.bench.runner import Cell

    out = tmp_path / "run"
    store = CeilingStore(out / "partial.jsonl")
    ours = Cell("evict", "ruler-niah", 8192, "contrastkv", 0.1, 100, codec="int8")
    theirs = Cell("evict", "ruler-niah", 8192, "kvzip", 0.1, 100, codec="int8")
    ours_f1, theirs_f1 = [1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]
    for i, (x, y) in enumerate(zip(ours_f1, theirs_f1)):
        item = f"ruler-niah/{i}/8192"
        store.put(f"o{i}", item, [{"f1": x, "answer": str(x)}], cell=ours.key, ceiling="c",
                  model="m")
        store.put(f"t{i}", item, [{"f1": y, "answer": str(y)}], cell=theirs.key, ceiling="c")
    A = load_cell(f"{out}#method=contrastkv")
    assert (A["unfinished"], A["items"], A["budget"], A["model"]) == (True, 4, 0.1, "m")
    comparisons, n, same = pair(A, load_cell(f"{out}#method=kvzip"), ("f1",))
    assert (n, same) == (4, 2)
    assert comparisons[0].diff == paired_bootstrap(ours_f1, theirs_f1).diff
    assert (comparisons[0].gained, comparisons[0].lost) == (2, 0)
    out_text = CliRunner().invoke(bench, ["pair", f"{out}#method=contrastkv",
                                          f"{out}#method=kvzip"]).output
    assert "unfinished: 4 items so far" in out_text and "| f1 |" in out_text

    finished = {"key": ours.key, "method": "contrastkv", "codec": "int8", "budget": 0.1,
                "options": "", "task": "ruler-niah", "model": "m",
                "per_question": [{"item": "ruler-niah/0/8192", "f1": 1.0}]}
    _write(out, [finished])
    assert "unfinished" not in load_cell(f"{out}#method=contrastkv")
