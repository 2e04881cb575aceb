"""The two daemons as real processes on loopback, for the fault and fuzz tests: `kvctl cloud up`
(joined to the test's local Ray) and `kvedge serve`, started, killed and restarted on the same
port and data dir, so a client or an edge pointed at them sees one service that went away and
came back."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvedge.apps.demo import free_port
from kvedge.common.net.rpc import wait_healthy


class Daemon:
    """One command line, run as its own process group; its output goes to `log`."""

    def __init__(self, cli: str, args: list[str], log: Path, env: dict | None = None):
        module, func = cli.split(":")
        self.argv = [sys.executable, "-c", f"from {module} import {func}; {func}()", *args]
        self.log, self.env = log, {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Daemon":
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=out,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no clean-up, no flush, no goodbye (a crash, an OOM kill, a power cut)."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)

    def stop(self, timeout: float = 40) -> int:
        """SIGTERM; the exit code (SIGKILL after `timeout`, then the test fails)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running {timeout} s after SIGTERM:\n{self.output()}")

    def output(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def wait_for(self, predicate, timeout: float = 90, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.alive(), f"exited while waiting for {what}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{self.output()}"
            time.sleep(0.1)

    def peak_rss(self) -> int:
        """Bytes: the kernel's high-water mark of the process's resident set (VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/<pid>/status")


class GatewayProcess(Daemon):
    """`kvctl cloud up` on a fixed loopback port, joined to a running Ray cluster (the test's:
    starting one per gateway costs ~10 s, and a killed gateway's actors die with it)."""

    def __init__(self, data: Path, model: str, ray_address: str, *extra: str):
        self.data, self.address = Path(data), f"127.0.0.1:{free_port()}"
        super().__init__("kvedge.apps.kvctl:kvctl", [
            "cloud", "up", "--data", str(data), "--address", self.address, "--model", model,
            "--ray-address", ray_address, "--actors", "1", "--cpus-per-actor", "1", *extra],
            Path(f"{data}.log"))

    def start(self, timeout: float = 90) -> "GatewayProcess":
        super().start()
        self.wait_for((self.data / "admin.token").exists, timeout, "admin token")
        wait_healthy(self.address, timeout)
        return self

    @property
    def token(self) -> str:
        return (self.data / "admin.token").read_text().strip()

    def store_files(self, pattern: str = "*") -> list[Path]:
        return sorted((self.data / "store" / "packs").rglob(pattern))


class EdgeProcess(Daemon):
    """`kvedge serve` on a fixed loopback port, syncing every half second."""

    def __init__(self, state: Path, cloud_address: str, cloud_token: str, kbs: list[str],
                 model: str, *extra: str, pin: bool = False):
        """`pin`: serve the KBs whole (`--pin`: every pack fetched at sync), else on demand."""
        self.state, self.address = Path(state), f"127.0.0.1:{free_port()}"
        self.kbs = kbs
        args = ["serve", "--cloud", cloud_address, "--cloud-token", cloud_token,
                "--address", self.address, "--state", str(state), "--model", model,
                "--sync-interval", "0.5", "--max-new-tokens", "8", *extra]
        for kb in kbs:
            args += ["--pin" if pin else "--kb", kb]
        super().__init__("kvedge.edge.cli:main", args, Path(f"{state}.log"))

    def manifest(self, kb: str) -> Path:
        ns, _, name = kb.rpartition("/")
        return self.state / "kbs" / (ns or "default") / f"{name}.json"

    def start(self, timeout: float = 90, synced: bool = True) -> "EdgeProcess":
        super().start()
        wait_healthy(self.address, timeout)
        if synced:
            for kb in self.kbs:
                self.wait_for(self.manifest(kb).exists, timeout, f"a synced {kb}")
        return self

    @property
    def token(self) -> str:
        return (self.state / "edge.token").read_text().strip()


def write_kb(folder: Path, docs: dict[str, str]) -> Path:
    """A KB folder on disk: each path of `docs` (subfolders made) holding its text."""
    for name, text in docs.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def in_process_gateway(data: Path, model: str, segment_tokens: int, **serve_kw):
    """`kvedge.cloud.gateway.serve_local` of a gateway for `model` cutting `segment_tokens`:
    (server, gateway, address, admin token)."""
    from kvedge.cloud.gateway import GatewayConfig, serve_local

    return serve_local(GatewayConfig(data, model=model, segment_tokens=segment_tokens),
                       **serve_kw)


def ingest_ended(gateway, namespace: str, kb: str, timeout: float = 60.0) -> None:
    """Wait for an in-process gateway's ingest thread of namespace/kb to end. A KB turns ready
    when its listing is published; the packs that listing orphans are deleted just after, so
    a test that looks at the store after `wait_ready` waits for this first."""
    deadline = time.monotonic() + timeout
    while (namespace, kb) in gateway.ingesting():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the ingest of {namespace}/{kb} did not end in {timeout:g} s")
        time.sleep(0.05)
