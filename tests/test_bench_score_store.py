"""Eviction scores kept across bench runs (`kvedge.bench.score_store`): kept whole, read
back equal, a damaged entry computed again, and a later bench scoring nothing twice."""
import torch

from kvedge.bench.runner import run_grid
from kvedge.bench.cli import preset
from kvedge.bench.score_store import KeptSignals, ScoreStore
from kvedge.bench.suites import Bench


def scores(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(2, 40, generator=gen) for _ in range(3)]


def test_kept_scores_read_back_equal_and_a_damaged_entry_is_a_miss(tmp_path):
    store = ScoreStore(tmp_path / "scores")
    assert store.get("k") is None
    store.put("k", scores(), 1.25)
    (got, seconds), = [store.get("k")]
    assert seconds == 1.25 and all(torch.equal(a, b) for a, b in zip(got, scores()))
    assert [p.name for p in (tmp_path / "scores").iterdir()] == ["k.safetensors"]  # no aside
    store.put("empty", [], 0.5)  # a timing alone
    assert store.get("empty") == ([], 0.5)
    path = tmp_path / "scores" / "k.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # a score's byte: the file still loads, its digest does not match
    path.write_bytes(bytes(data))
    assert store.get("k") is None and not path.exists()  # removed: computed again
    store.put("k", scores(), 1.0)
    path.write_bytes(path.read_bytes()[:50])  # cut short: unreadable
    assert store.get("k") is None and not path.exists()


def test_kept_signals_are_probed_once_across_memos(tmp_path):
    store, probed = ScoreStore(tmp_path), []

    def probe():
        probed.append(1)
        return scores(1)

    key = ("reconstruction", (5, 6, 7), 2048, 8, 4)
    first = KeptSignals(store, "model-a")
    assert all(torch.equal(a, b) for a, b in zip(first.get(key, probe), scores(1)))
    assert first.get(key, probe) is not None and len(probed) == 1 and first.reused_s > 0
    later = KeptSignals(store, "model-a")  # another run: read from the store
    assert all(torch.equal(a, b) for a, b in zip(later.get(key, probe), scores(1)))
    assert len(probed) == 1 and later.reused_s > 0
    KeptSignals(store, "model-b").get(key, probe)  # another model: probed again
    KeptSignals(store, "model-a").get(("reconstruction", (5, 6), 2048, 8, 4), probe)
    assert len(probed) == 3


def test_a_later_bench_reads_the_scores_an_earlier_one_kept(tmp_path, monkeypatch):
    from kvedge.cloud.eviction import base

    p = preset("quick", "tiny-llama")
    p.reuse_tasks, p.items, p.max_new_tokens = [], 1, 2
    p.methods, p.budgets = ["full", "contrastkv", "kvzip"], [0.3]
    p.evict_tasks, p.evict_lengths = ["niah_single_prose"], [300]
    earlier = Bench(p.model, max_new_tokens=2, breakdown=None, scores_dir=tmp_path / "scores")
    plain, prefill = [], earlier.prefill.rt.prefill

    def counted(ids, **kw):
        if "want_queries" not in kw:  # a prefill other than a pack's
            plain.append(len(ids))
        return prefill(ids, **kw)

    earlier.prefill.rt.prefill = counted
    first = run_grid(p, tmp_path / "a.jsonl", earlier.run)
    assert plain == []  # compression's yardstick is the prefill that made the packs
    kept = sorted(f.name for f in (tmp_path / "scores").iterdir())
    assert len(kept) == 4  # contrastkv's and kvzip's scores, the reconstruction, the prefill
    calls = []
    score = base.EvictionMethod.scores
    monkeypatch.setattr(base.EvictionMethod, "scores",
                        lambda self, rt, ctx: calls.append(self.name) or score(self, rt, ctx))
    later = Bench(p.model, max_new_tokens=2, breakdown=None, scores_dir=tmp_path / "scores")
    again = run_grid(p, tmp_path / "b.jsonl", later.run)
    assert calls == []  # nothing scored again
    by = {r["method"]: r for r in first}
    for row in again:  # the same kept tokens: the same answers and bytes
        assert row["score"] == by[row["method"]]["score"]
        assert row["shipped_bytes"] == by[row["method"]]["shipped_bytes"]
        if row["method"] != "full":  # the prefill's timing kept with the scores
            assert row["prefill_s"] == by[row["method"]]["prefill_s"]
    # each method's scoring charged as first measured (kvzip's with the reused probe's)
    assert {k: s for k, (_, s) in later._measured.items()} == \
        {k: s for k, (_, s) in earlier._measured.items()}
