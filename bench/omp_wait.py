"""What OpenMP's wait policy costs the runtime, alone on the CPU and beside other work.

`python -m kvedge.bench.omp_wait [--model M] [--context 512] [--steps 16] [--decode-weights
fp16] [--policies default,OMP_WAIT_POLICY=PASSIVE,GOMP_SPINCOUNT=10000] [--neighbours
none,torch,spin]`: for every policy (`default`: libgomp's own, or `NAME=VALUE` settings
joined by `+`) and neighbour, a fresh process (libgomp reads its settings once, when it
starts) loads the model, then times a `context`-token prefill (`Runtime.prefill`) and
decode steps of one request as served (`decode_step` at the row multiple of
`--decode-weights`: one format for every row, since a load-time probe beside a neighbour
may pick another), the median of `--rounds` of each. Neighbours, started before the
measured process and stopped after it:

- `none`: the box as it is (quiet only where nothing else runs);
- `torch`: another torch process with as many threads as there are cores, matmuls in a
  loop, with libgomp's default policy (a second model server, a batch job);
- `spin`: one pure-Python busy loop per core (any other program using the CPU).

Why it matters: libgomp, which torch's CPU wheels use, lets a thread that reaches the end
of a parallel region spin for a while (GOMP_SPINCOUNT) before it sleeps. Alone that saves a
wake-up per region; with more runnable threads than cores a spinning thread takes the core
its peer needs to finish, and every region waits a time slice. A tiny KB's ingest on this
2-core box took 1.5 s on a warm Ray actor with nothing beside it and 41 s beside one
2-thread benchmark. The figures and the decision (the services keep libgomp's default):
docs/serving.md, "On a shared CPU".
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

NEIGHBOURS = ("none", "torch", "spin")
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def measure(model: str, context: int, steps: int, rounds: int, weights: str) -> dict:
    """In this process: the prefill's and a decode step's seconds, medians of `rounds`."""
    import torch

    from kvedge.bench.load import dense_requests, per_call_s
    from kvedge.common.model.batch import decode_step
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime

    rt = Runtime(load_model(model))
    rt.use_decode_weights(weights)
    prefill, decode = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        make = dense_requests(rt, context)  # the prompt prefilled here
        prefill.append(time.perf_counter() - start)
        states = [make(steps + 2, steps + 2)]
        decode.append(per_call_s(lambda: decode_step(rt, states, rt.decode_row_multiple),
                                 steps))
    return {"prefill_s": statistics.median(prefill), "decode_s": statistics.median(decode),
            "threads": torch.get_num_threads(), "decode_weights": rt.decode_format,
            "row_multiple": rt.decode_row_multiple,
            "settings": {k: os.environ[k] for k in WAIT_SETTINGS if k in os.environ}}


def neighbour(kind: str) -> list[subprocess.Popen]:
    """The processes of a neighbour (none: no process)."""
    cores = os.cpu_count() or 1
    if kind == "none":
        return []
    if kind == "torch":
        code = ("import torch; x = torch.randn(512, 1024); w = torch.randn(1024, 1024)\n"
                "while True: x = torch.tanh(x @ w)")
        return [subprocess.Popen([sys.executable, "-c", code], env=policy_env("default"))]
    if kind == "spin":
        return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(cores)]
    raise ValueError(f"unknown neighbour {kind!r}; one of {', '.join(NEIGHBOURS)}")


def policy_env(policy: str) -> dict[str, str]:
    """This process's environment with libgomp's wait settings as `policy` says."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_SETTINGS}
    if policy != "default":
        env.update(setting.split("=", 1) for setting in policy.split("+"))
    return env


def run(model: str, context: int, steps: int, rounds: int, weights: str,
        policies: list[str], neighbours: list[str]) -> list[dict]:
    rows = []
    for kind in neighbours:
        for policy in policies:
            others = neighbour(kind)
            try:
                time.sleep(1.0 if others else 0.0)  # the neighbour at work first
                out = subprocess.run(
                    [sys.executable, "-m", "kvedge.bench.omp_wait", "--child", "--model",
                     model, "--context", str(context), "--steps", str(steps), "--rounds",
                     str(rounds), "--decode-weights", weights], env=policy_env(policy), check=True, capture_output=True, text=True)
            finally:
                for p in others:
                    p.kill()
                    p.wait()
            rows.append({"neighbour": kind, "policy": policy,
                         **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| neighbour | wait policy | prefill s | decode ms/token |",
             "|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['neighbour']} | {r['policy']} | {r['prefill_s']:.2f} | "
                     f"{r['decode_s'] * 1e3:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-weights", default="fp16")
    ap.add_argument("--policies", default="default,OMP_WAIT_POLICY=PASSIVE")
    ap.add_argument("--neighbours", default=",".join(NEIGHBOURS))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.model, args.context, args.steps, args.rounds,
                                 args.decode_weights)))
        return
    rows = run(args.model, args.context, args.steps, args.rounds, args.decode_weights,
               args.policies.split(","), args.neighbours.split(","))
    print(table(rows))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
