"""The device check script runs on a CPU at toy sizes (a GPU session runs it whole)."""
import json

from kvedge.bench.gpu_check import main


def test_the_device_check_runs_its_cpu_sections(tmp_path):
    rc = main(["--quick", "--only", "ceilings,realign,runtime,key_cut,key_votes",
               "--out", str(tmp_path)])
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 0, {k: v for k, v in result.items() if k.endswith("_error")}
    assert result["ceilings"]["copy_GBps"] > 0
    realign = result["realign"]
    assert realign["cuda_fused_values_equal_cpu"] and realign["cuda_fused_keys_equal_cpu"]
    fp32, bf16 = result["runtime"]
    assert fp32["dtype"] == "float32" and fp32["greedy_tokens_agree_first"] == 24
    assert fp32["prefill_argmax_equal"] and bf16["kvedge_vs_fp32_rel"] < 0.05
    cut = result["key_cut"]
    assert [r["queries"] for r in cut] == ["legolink", "top-k 1/7"]
    assert all(r["max_abs_diff"] < 1e-5 and r["cut_ms"] > 0 for r in cut)
    chunks = result["key_votes"]
    assert [r["chunk"] for r in chunks] == [40, 8, 256]
    assert all(r["max_abs_diff"] < 1e-6 and r["ms"] > 0 for r in chunks)
