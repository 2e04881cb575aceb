"""bench/blas_mode.py: each MKL mode in its own child process, side by side."""
from kvedge.bench.blas_mode import main


def test_each_mode_runs_in_a_child_of_its_own(capsys):
    main(["--model", "tiny-llama", "--context", "32", "--steps", "3", "--threads", "1",
          "--rounds", "1"])
    out = capsys.readouterr().out
    assert "| MKL_CBWR | AUTO | AUTO,STRICT | |" in out, out  # the variable each child saw
    assert "fp32 rows invariant (probe) |" in out
    for row in ("prefill_s", "step_1_row_ms", "step_4_rows_ms"):
        line = next(line for line in out.splitlines() if line.startswith(f"| {row} |"))
        assert float(line.split("|")[-2]) > 0, line  # strict / default
