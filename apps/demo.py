"""`kvctl demo`: the whole path on one machine, with the embedded model.

Starts a gateway and an edge daemon as child processes (Ray in-process in the gateway),
uploads the bundled knowledge base, waits for ingest and sync, asks the bundled questions with
`recompute` (the ceiling) and the edge's default reuse strategy, and prints a table. The processes it started are stopped
when it ends, also on Ctrl-C.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kvedge.common.pack.codecs import DEFAULT_CODEC

DEMO_KB = Path(__file__).parent / "demo_kb"
CEILING, REUSE = "recompute", ""  # "": the strategy the edge answers with when none is named
STRATEGIES = (CEILING, REUSE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path

    def stop(self, grace: float = 15.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def check(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"the {self.name} exited (code {self.proc.returncode}):\n{tail}")


# the programs the demo runs as children: `kvctl` (the gateway) and `kvedge` (the edge daemon),
# by module so that the interpreter running the demo runs them too (no PATH lookup)
PROGRAMS = {"gateway": "kvedge.apps.kvctl", "edge": "kvedge.edge.cli"}


def start(name: str, args: list[str], log: Path, env=None) -> Child:
    out = open(log, "wb")  # noqa: SIM115 - owned by the child for its lifetime
    proc = subprocess.Popen([sys.executable, "-m", PROGRAMS[name], *args], stdout=out, stderr=out,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    return Child(name, proc, log)


def http_serving(address: str) -> bool:
    """Whether an edge's HTTP API at HOST:PORT answers `/health`."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=2):
            return True
    except OSError:
        return False


def wait_for(predicate, what: str, children: list[Child], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for child in children:
            child.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.3)


def run_demo(model_name: str, keep: bool = False, echo=print, codec: str = DEFAULT_CODEC,
             kb_dir: Path = DEMO_KB) -> bool:
    from kvedge.common.net.cloud_client import CloudClient
    from kvedge.common.net.rpc import wait_healthy
    from kvedge.common.net.edge_client import EdgeClient

    root = Path(tempfile.mkdtemp(prefix="kvedge-demo-"))
    cloud_addr, edge_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    kb_dir = Path(kb_dir)
    questions = json.loads((kb_dir / "questions.json").read_text())
    children: list[Child] = []
    try:
        echo(f"starting the gateway on {cloud_addr} (Ray in-process; data in {root})")
        children.append(start("gateway", ["cloud", "up", "--data", str(root / "cloud"),
                                          "--address", cloud_addr, "--model", model_name,
                                          "--segment-tokens", "256", "--codec", codec],
                              root / "gateway.log"))
        wait_for(lambda: (root / "cloud" / "admin.token").exists(), "the gateway", children, 180)
        wait_healthy(cloud_addr, 180)
        token = (root / "cloud" / "admin.token").read_text().strip()
        with CloudClient(cloud_addr, token) as cloud:
            t0 = time.perf_counter()
            reply = cloud.upload(kb_dir, "default", "demo")
            echo(f"uploaded {reply.files_received} files; prefilling segments on Ray ...")
            info = cloud.wait_ready("default", "demo")  # ends on failure or a stall
            packed = sum(s.pack_bytes for s in info.segments)
            fp16 = sum(s.fp16_bytes for s in info.segments)
            echo(f"ingested in {time.perf_counter() - t0:.0f} s: {info.n_tokens} tokens, "
                 f"{len(info.segments)} segments, packs {packed / 1e6:.1f} MB ({codec}) vs fp16 "
                 f"full KV {fp16 / 1e6:.1f} MB: {fp16 / packed:.2f}× fewer bytes")
        echo(f"starting the edge daemon on {edge_addr}")
        env = {**os.environ, "KVEDGE_TOKEN": token}
        # --pin: every pack fetched before the first question, so each strategy's TTFT is its
        # own and not the first ask's transfer (`--kb` fetches packs on demand)
        children.append(start("edge", ["serve", "--cloud", cloud_addr, "--pin", "default/demo",
                                       "--address", edge_addr, "--state", str(root / "edge"),
                                       "--model", model_name, "--sync-interval", "1"],
                              root / "edge.log", env))
        synced = root / "edge" / "kbs" / "default" / "demo.json"
        wait_for(synced.exists, "the edge to sync the packs", children, 300)
        wait_healthy(edge_addr, 120)
        edge_token = (root / "edge" / "edge.token").read_text().strip()
        with EdgeClient(edge_addr, edge_token) as edge:
            return _ask_all(edge, questions, echo)
    finally:
        for child in reversed(children):
            child.stop()
        if keep:
            echo(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _ask_all(edge, questions, echo) -> bool:
    rows = []
    for q in questions:
        row = {"question": q["question"]}
        for strategy in STRATEGIES:
            pieces = list(edge.ask("default", "demo", q["question"], strategy=strategy,
                                   max_new_tokens=32))
            done = pieces[-1]
            row[strategy] = (done.answer, any(a.lower() in done.answer.lower() for a in q["answers"]),
                             done.ttft_s, done.bytes_loaded, done.fp16_bytes)
            if strategy == REUSE:
                row["reuse_name"] = done.strategy
        rows.append(row)
        echo(_format_row(row))
    n = len(rows)
    acc = {s: sum(r[s][1] for r in rows) for s in STRATEGIES}
    ttft = {s: sum(r[s][2] for r in rows) / n for s in STRATEGIES}
    loaded = sum(r[REUSE][3] for r in rows)
    fp16 = sum(r[REUSE][4] for r in rows)
    name = rows[0]["reuse_name"] if rows else "reuse"
    echo("")
    echo(f"correct: recompute {acc[CEILING]}/{n}, {name} {acc[REUSE]}/{n}")
    echo(f"mean TTFT: recompute {ttft[CEILING]:.2f} s, {name} {ttft[REUSE]:.2f} s "
         f"({name} / recompute = {ttft[REUSE] / ttft[CEILING]:.2f})")
    echo(f"KV loaded per answer: {loaded / n / 1e6:.2f} MB of packs vs {fp16 / n / 1e6:.2f} MB "
         f"as fp16 full KV ({fp16 / max(loaded, 1):.2f}× fewer bytes)")
    return acc[CEILING] > 0 or acc[REUSE] > 0


def _format_row(row) -> str:
    def cell(strategy):
        answer, ok, ttft, _, _ = row[strategy]
        short = answer.replace("\n", " ")[:38]
        return f"{'✓' if ok else '✗'} {ttft:5.2f}s {short:38s}"

    return f"{row['question'][:52]:52s} | {cell(CEILING)} | {cell(REUSE)}"
