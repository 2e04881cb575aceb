"""The bench's pack store: a document's packs are prefilled once and read back, checked, by
later runs; a bad entry is removed and made again, and a run that stops leaves no half entry."""
import json

import pytest

from kvedge.bench.pack_store import MANIFEST, PackStore, pack_key
from kvedge.bench.suites import Bench
from kvedge.common.pack.errors import PackCorrupt

TEXT = "\n\n".join(f"Paragraph {i} tells of river {i} and its bridges." for i in range(12))


def test_the_key_names_what_the_packs_depend_on():
    key = pack_key(model="m1", text="t", codec="fp16")
    assert key == pack_key(codec="fp16", text="t", model="m1")
    assert len({key, pack_key(model="m2", text="t", codec="fp16"),
                pack_key(model="m1", text="u", codec="fp16"),
                pack_key(model="m1", text="t", codec="int8")}) == 4


def test_an_entry_outlives_its_store_and_a_bad_one_is_removed(tmp_path):
    store = PackStore(tmp_path)
    assert store.get("k", check=lambda p: None) is None
    kept = store.put("k", [("a.kvp", b"first"), ("b.kvp", b"second!")])
    assert [(p.name, n) for p, n in kept] == [("a.kvp", 5), ("b.kvp", 7)]
    checked = []
    assert PackStore(tmp_path).get("k", checked.append) == kept and checked == [p for p, _ in kept]
    assert [p.name for p in tmp_path.iterdir()] == ["k"]  # nothing left aside

    (tmp_path / "k" / "b.kvp").write_bytes(b"cut")  # a size changed: removed, a miss
    assert store.get("k", check=lambda p: None) is None and not (tmp_path / "k").exists()

    store.put("k", [("a.kvp", b"first")])

    def corrupt(path):
        raise PackCorrupt("checksum mismatch", path.name)

    assert store.get("k", corrupt) is None and not (tmp_path / "k").exists()


def test_a_put_that_fails_leaves_nothing_and_a_kept_entry_stands(tmp_path, monkeypatch):
    store = PackStore(tmp_path)
    store.put("k", [("a.kvp", b"theirs")])
    assert store.put("k", [("a.kvp", b"ours")])[0][0].read_bytes() == b"theirs"
    assert json.loads((tmp_path / "k" / MANIFEST).read_text()) == [["a.kvp", 6]]

    from pathlib import Path

    def full_disk(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(OSError):
        store.put("j", [("a.kvp", b"x")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k"]


def test_a_second_bench_reads_the_packs_the_first_made(tmp_path):
    first = Bench("tiny-llama", max_new_tokens=2, segment_tokens=32, packs_dir=tmp_path)
    made = first.pack_files(TEXT, whole=False, codec="int8")
    assert len(made) > 1 and all(p.parent.parent == tmp_path for p, _ in made)

    second = Bench("tiny-llama", max_new_tokens=2, segment_tokens=32, packs_dir=tmp_path)

    def no_prefill(*args, **kwargs):
        raise AssertionError("the stored packs were prefilled again")

    second.prefill.context = no_prefill
    assert second.pack_files(TEXT, whole=False, codec="int8") == made
    for (a, _), (b, _) in zip(first.packs(TEXT, False, "int8"), second.packs(TEXT, False, "int8")):
        assert a.n_tokens == b.n_tokens and a.token_ids == b.token_ids
    with pytest.raises(AssertionError, match="prefilled again"):  # another codec is a miss
        second.pack_files(TEXT, whole=False, codec="fp16")


def test_a_whole_context_is_prefilled_once_for_its_codec_and_the_reference(tmp_path):
    """Eviction reads a context in fp16 (its methods' base, full KV's ceiling) and in the
    cell's codec: one prefill makes both packs, each equal to one made alone."""
    from kvedge.bench.runner import REFERENCE_CODEC

    bench = Bench("tiny-llama", max_new_tokens=2, packs_dir=tmp_path / "packs")
    calls, context = [], bench.prefill.context
    bench.prefill.context = lambda *a: calls.append(1) or context(*a)
    (fp16, _), = bench.pack_files(TEXT, whole=True, codec=REFERENCE_CODEC)
    (int8, _), = bench.pack_files(TEXT, whole=True, codec="int8")
    assert len(calls) == 1  # one prefill, both packs
    seg, = bench.prefill.segment({"doc.md": TEXT}, bench.segment_tokens, True)
    bench.pack_files(TEXT + " More.", whole=True, codec="int8")  # another text: prefilled
    assert len(calls) == 2
    for path, codec in ((fp16, REFERENCE_CODEC), (int8, "int8")):
        assert path.read_bytes() == bench.prefill.encode(seg, "bench", codec).data
