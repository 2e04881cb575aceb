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
