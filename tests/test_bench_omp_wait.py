"""bench/omp_wait.py: each policy reaches a fresh process, neighbours start and stop."""
import os

from kvedge.bench.omp_wait import measure, neighbour, policy_env, run, table


def test_a_policy_replaces_the_wait_settings_and_default_drops_them(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert "OMP_WAIT_POLICY" not in policy_env("default")
    env = policy_env("OMP_WAIT_POLICY=PASSIVE+GOMP_SPINCOUNT=1000")
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env["GOMP_SPINCOUNT"] == "1000"
    assert env["PATH"] == os.environ["PATH"]


def test_the_measured_process_runs_under_its_policy_beside_a_neighbour():
    rows = run("tiny-llama", context=16, steps=2, rounds=1, weights="fp32",
               policies=["OMP_WAIT_POLICY=PASSIVE"], neighbours=["spin"])
    (row,) = rows
    assert row["settings"] == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert row["neighbour"] == "spin" and row["prefill_s"] > 0 and row["decode_s"] > 0
    assert "| spin | OMP_WAIT_POLICY=PASSIVE |" in table(rows)


def test_a_neighbour_is_a_running_process_until_killed():
    assert neighbour("none") == []
    (torch_loop,) = neighbour("torch")
    try:
        assert torch_loop.poll() is None
    finally:
        torch_loop.kill()
        torch_loop.wait()


def test_measure_times_a_prefill_and_decode_steps_in_this_process():
    row = measure("tiny-llama", context=16, steps=2, rounds=2, weights="int8")
    assert row["decode_weights"] == "int8" and row["prefill_s"] > 0 and row["decode_s"] > 0
