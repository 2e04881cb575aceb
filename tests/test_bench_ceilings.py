"""The ceiling store: keyed by content and prompt settings, kept across runs, torn lines ignored."""
from kvedge.bench.ceilings import CeilingStore, ceiling_key
from kvedge.bench.datasets import QAItem
from kvedge.bench.tasks import Question


def item(answer="blue"):
    return QAItem("hotpotqa/1/10/0", ["a\n", "b\n"], [Question("What?", [answer], "hotpotqa")])


def test_the_key_names_content_and_settings():
    key = ceiling_key(item(), model="m1", codec="fp16")
    assert key == ceiling_key(item(), codec="fp16", model="m1")
    assert key != ceiling_key(item(), model="m2", codec="fp16")
    assert key != ceiling_key(item("red"), model="m1", codec="fp16")  # same item key


def test_rows_outlive_the_store_and_a_torn_line_is_skipped(tmp_path):
    path = tmp_path / "ceilings.jsonl"
    store = CeilingStore(path)
    assert store.get("k1") is None
    store.put("k1", "item/1", [{"f1": 1.0}])
    with open(path, "a") as f:
        f.write('{"key": "k2", "rows": [')  # a crash mid-line
    assert CeilingStore(path).get("k1") == [{"f1": 1.0}]
    later = CeilingStore(path)
    later.put("k3", "item/3", [{"f1": 0.5}])
    again = CeilingStore(path)
    assert again.get("k3") == [{"f1": 0.5}] and again.get("k2") is None


def test_unfinished_cells_pair_their_items_with_the_named_ceiling(tmp_path):
    """`kvedge.bench.unfinished`: per cell, the items it kept against the ceiling entry each
    names; entries naming no cell (older runs), a ceiling not kept, or another count of rows
    than the ceiling's, and torn lines, are left out."""
    from kvedge.bench.unfinished import table, unfinished

    ceilings, partial = CeilingStore(tmp_path / "ceilings.jsonl"), \
        CeilingStore(tmp_path / "partial.jsonl")
    for i in range(3):
        ceilings.put(f"c{i}", f"item/{i}", [{"score": 1.0, "f1": 1.0}])
        partial.put(f"p{i}", f"item/{i}", [{"score": float(i != 1), "f1": 0.5}],
                    cell="evict/x/method", ceiling=f"c{i}")
    partial.put("old", "item/0", [{"score": 0.0}])  # before entries named their cell
    partial.put("lost", "item/9", [{"score": 0.0}], cell="evict/x/method", ceiling="gone")
    partial.put("two", "item/2", [{"score": 0.0}] * 2, cell="evict/y", ceiling="c2")
    with open(tmp_path / "partial.jsonl", "a") as f:
        f.write('{"key": "torn", "cell": "evict/x/method", "rows": [')
    cell, = unfinished(tmp_path)
    assert (cell["cell"], cell["items"], cell["questions"]) == ("evict/x/method", 3, 3)
    assert cell["score"]["mean"] == 2 / 3 and cell["score"]["ceiling"] == 1.0
    assert cell["f1"]["diff"][0] == -0.5 and "contain" not in cell
    assert "| evict/x/method | 3 | 3 | 0.667 | 1.000 | -0.333 [" in "\n".join(table(tmp_path))
    assert table(tmp_path / "nothing") == []
