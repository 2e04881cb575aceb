"""bench/upload_cost: an upload's bytes per token per codec, and one pack's bytes by part."""
from kvedge.bench.upload_cost import main, pack_parts


def test_upload_cost_table_and_parts_add_up(tmp_path, capsys):
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "a.md").write_text("The alpha code is 4411. " * 30)
    (kb / "b.txt").write_text("Beta lives by the river. " * 10)
    (kb / "skip.bin").write_bytes(b"\x00")
    main(["fp16", "int4+zstd", "--kb", str(kb), "--model", "tiny-llama",
          "--segment-tokens", "64"])
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split("|")[1].strip(): line.split("|") for line in lines
            if line.startswith("| `")}
    assert set(rows) == {"`fp16`", "`int4+zstd`"}
    assert float(rows["`int4+zstd`"][5]) > float(rows["`fp16`"][5])  # × below fp16 KV
    assert rows["`fp16`"][2] == rows["`int4+zstd`"][2]  # same packs
    from kvedge.cloud.workers import PrefillEngine

    engine = PrefillEngine("tiny-llama")
    (segment, *_) = engine.segment({"a.md": (kb / "a.md").read_text()}, 64, False)
    data = engine.encode(segment, "default", "int4+zstd").data
    parts = pack_parts(data)
    assert sum(parts.values()) == len(data) and parts["container"] > 0
    assert {"k.packed", "v.packed", "k.scale", "summary.data"} <= set(parts)
