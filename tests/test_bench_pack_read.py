"""bench/pack_read.py reads a directory of packs both ways, checks them equal, prints both."""
import torch

from kvedge.bench.pack_read import main, tensor_by_tensor, tensors, whole_pack
from kvedge.common.pack import KVContext, write_pack


def test_both_reads_of_a_pack_directory_are_timed_and_agree(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    for i, codec in enumerate(["int8+zstd", "int4", "fp16"]):
        ctx = KVContext.from_dense([torch.randn(2, 40, 16, generator=g) for _ in range(3)],
                                   [torch.randn(2, 40, 16, generator=g) for _ in range(3)],
                                   list(range(40)), model_fingerprint="ab" * 32,
                                   tokenizer_id="cd" * 32, namespace="t")
        write_pack(ctx, tmp_path / f"{i}.kvp", codec)
    (tmp_path / "notes.txt").write_text("not a pack")
    path = tmp_path / "0.kvp"
    assert all(torch.equal(a, b) for a, b in zip(tensors(tensor_by_tensor(path)),
                                                  tensors(whole_pack(path)), strict=True))
    main([str(tmp_path), "--packs", "3", "--rounds", "2", "--threads", "1"])
    out = capsys.readouterr().out
    assert "3 packs under" in out
    for row in ("| tensor by tensor |", "| whole pack |", "| entropy decoding into pieces |",
                "| dequantization |"):
        assert row in out, out
