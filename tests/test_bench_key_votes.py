"""bench/key_votes.py times one layer's max votes at several chunks, checked alike first."""
from kvedge.bench.key_votes import main, measure


def test_every_chunk_is_timed_and_agrees_with_the_first(capsys):
    got = measure(96, 40, [8, 3, 256], rounds=2, kv_heads=2, group=3, head_dim=16)
    assert set(got) == {8, 3, 256} and all(s >= 0 for s in got.values())
    main(["--context", "64", "--probe", "20", "--chunks", "8,256", "--rounds", "1",
          "--group", "2", "--head-dim", "8"])
    out = capsys.readouterr().out
    assert "20 probe queries over 64 context keys" in out
    assert "| 8 |" in out and "| 256 |" in out and out.count("| 1.00 |") >= 1, out
