"""`kvedge.bench.niah_depth`: needles found by depth, read from the ruler-niah runs kept in
bench/reference (real rows: their totals are the ones docs/results.md gives)."""
import shutil
from pathlib import Path

import pytest

from kvedge.bench import niah_depth
from kvedge.bench.tasks.niah import niah

REFERENCE = Path(__file__).resolve().parents[1] / "bench" / "reference"


@pytest.mark.parametrize("seed", [0, 1, 7, 52])
def test_the_seeded_depth_is_where_the_generator_put_the_needle(seed):
    item = niah(4096, seed, haystack="prose")
    achieved = item.metadata["needles"][0]["depth"]
    assert abs(niah_depth.seeded_depth(f"ruler-niah/{seed}/4096") - achieved) < 0.01


def test_a_finished_run_is_counted_by_depth_with_its_totals():
    cells = niah_depth.cells(REFERENCE / "ruler-niah-qwen")
    found = {label.split(" rdq")[0]: scores for label, scores in cells.items()}
    assert len(found["contrastkv @0.1"]) == 100
    assert sum(found["contrastkv @0.1"].values()) == 90  # docs/results.md, 4K
    assert sum(found["kvzip @0.1"].values()) == 47
    for scores in cells.values():
        bands = niah_depth.by_depth(scores, 5)
        assert sum(n for _, n in bands) == len(scores)
        assert sum(f for f, _ in bands) == sum(scores.values())
    assert niah_depth.CEILING not in cells  # a finished run's ceiling is its `full` rows


def test_an_unfinished_run_brings_its_ceiling(tmp_path):
    out = tmp_path / "out"
    shutil.copytree(REFERENCE / "ruler-niah-qwen-16k", out)
    cells = niah_depth.cells(out)
    ceiling = cells[niah_depth.CEILING]
    contrast = next(s for label, s in cells.items() if label.startswith("contrastkv @0.1"))
    assert set(contrast) <= set(ceiling) and len(contrast) >= 53
    assert all(label.endswith("(unfinished)") for label in cells if label != niah_depth.CEILING)


def test_the_command_prints_one_table_per_folder(capsys, tmp_path):
    niah_depth.main([str(REFERENCE / "ruler-niah-qwen"), "--bins", "4"])
    text = capsys.readouterr().out
    assert "| cell | all | 0–25 % | 25–50 % | 50–75 % | 75–100 % |" in text
    assert "| kvzip @0.1 rdq" in text and "| 47/100 |" in text
    with pytest.raises(SystemExit):
        niah_depth.main([str(tmp_path / "missing")])


def test_an_item_of_another_task_is_refused():
    with pytest.raises(ValueError, match="not a ruler-niah item"):
        niah_depth.seeded_depth("squad/0/4096")
