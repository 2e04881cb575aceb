"""The ceiling stores kept in bench/reference/ (a run copies one into its OUT and reads those
answers instead of recomputing them) are well formed and read nothing held out."""
import json
from pathlib import Path

import pytest

from kvedge.bench.ceilings import CeilingStore
from kvedge.bench.hotpot_kb import parse_item_key
from kvedge.bench.real.heldout import tuning_range

REFERENCE = Path(__file__).resolve().parents[1] / "bench" / "reference"
STORES = sorted(REFERENCE.glob("*/ceilings.jsonl"))
GENERATED = ("ruler-niah",)  # seeded generators over the essays: no questions, none held out


def _in_tuning_split(dataset: str, index: int) -> bool:
    """The loaders' own rule (`heldout.tuning_range`) over the file's real size."""
    from kvedge.bench.real.hotpotqa import hotpot_size
    from kvedge.bench.real.squad import squad_size

    if dataset in GENERATED:
        return True
    sizes = {"hotpotqa": hotpot_size, "squad": squad_size}
    assert dataset in sizes, f"teach this test {dataset}'s split"
    return index in tuning_range(dataset, sizes[dataset]())


def _question(item: str) -> tuple[str, str]:
    """(dataset, index) of an item key: "hotpotqa/3155/10/0", "squad/0/4096", and hotpot-kb's
    "hotpot-kb/<KB name>/<HotpotQA index>/<top-k>" (`bench.hotpot_kb`)."""
    kb = parse_item_key(item)
    return ("hotpotqa", str(kb[1])) if kb is not None else tuple(item.split("/")[:2])


def test_there_are_reference_stores():
    assert STORES, f"no */ceilings.jsonl under {REFERENCE}"


@pytest.mark.parametrize("path", STORES, ids=lambda p: p.parent.name)
def test_a_reference_store_is_readable_and_from_the_tuning_split(path):
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keys = [entry["key"] for entry in lines]
    assert len(set(keys)) == len(keys), "a key stored twice"
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys)
    for entry in lines:
        dataset, index = _question(entry["item"])
        assert _in_tuning_split(dataset, int(index)), f"{entry['item']} is held out"
        assert entry["rows"] and all("answer" in row and "f1" in row for row in entry["rows"])
    store = CeilingStore(path)
    assert all(store.get(k) is not None for k in keys)  # what a run reads back
