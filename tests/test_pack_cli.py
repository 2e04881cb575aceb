"""`kvctl pack inspect|verify` through click's CliRunner."""
import torch
from click.testing import CliRunner

from kvedge.common.pack import KVContext, write_pack
from kvedge.common.pack.cli import pack

FP, TOK = "ab" * 32, "cd" * 32


def write(path, codec="int4+zstd"):
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(2, 40, 16, generator=g) for _ in range(3)]
    values = [torch.randn(2, 40, 16, generator=g) for _ in range(3)]
    ctx = KVContext.from_dense(keys, values, list(range(40)), model_fingerprint=FP,
                               tokenizer_id=TOK, block_size=8)
    ctx = ctx.select([[torch.arange(0, 40, 2), torch.arange(40)]] * 3)
    return write_pack(ctx, path, codec)


def test_inspect(tmp_path):
    pid = write(tmp_path / "p.kvpack")
    result = CliRunner().invoke(pack, ["inspect", str(tmp_path / "p.kvpack")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert pid in out and FP in out and "40 (positions 0..39, 1 segment)" in out
    assert "3 layers × 2 heads × 16 dims; kept per head 20..40 (75.0% of tokens)" in out
    assert "int4+zstd ×12" in out and "block_summaries" in out
    assert "keys" in out and "packed" in out and "scale" in out


def test_verify_ok_and_model_check(tmp_path):
    path = str(tmp_path / "p.kvpack")
    pid = write(tmp_path / "p.kvpack", "cachegen+zstd")
    ok = CliRunner().invoke(pack, ["verify", path, "--model-fingerprint", FP])
    assert ok.exit_code == 0 and f"ok {pid}" in ok.output
    other = CliRunner().invoke(pack, ["verify", path, "--model-fingerprint", "ef" * 32])
    assert other.exit_code == 1 and "ModelMismatch" in other.output


def test_verify_names_the_corrupt_tensor(tmp_path):
    path = tmp_path / "p.kvpack"
    write(path, "fp16")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    result = CliRunner().invoke(pack, ["verify", str(path)])
    assert result.exit_code == 1
    assert "PackCorrupt" in result.output and "tensor '" in result.output
    inspect = CliRunner().invoke(pack, ["inspect", str(path)])
    assert inspect.exit_code == 0  # inspect reads header and manifest only


def test_errors_on_non_packs(tmp_path):
    path = tmp_path / "junk"
    path.write_bytes(b"hello world, not a pack at all")
    for command in ("inspect", "verify"):
        result = CliRunner().invoke(pack, [command, str(path)])
        assert result.exit_code == 1 and "PackCorrupt" in result.output and "magic" in result.output
