"""An S3-compatible server on loopback for the pack store's tests: moto's, in its own process
(its memory, threads and request log are not the test's), holding one bucket. `env` is what a
user sets to point a `s3://` store at such a server: the standard AWS settings botocore reads,
with dummy keys, and no ~/.aws of the machine's in the way."""
from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kvedge.apps.demo import free_port

BUCKET = "kvedge-test"


class S3Server:
    def __init__(self, workdir: Path):
        self.workdir, self.port = Path(workdir), free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        missing = str(self.workdir / "no-aws-config")  # not the user's profiles or keys
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_CONFIG_FILE": missing, "AWS_SHARED_CREDENTIALS_FILE": missing,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def start(self, timeout: float = 30) -> "S3Server":
        with open(self.workdir / "moto.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        self._wait_up(timeout)
        self._request("PUT", f"/{BUCKET}")  # create the bucket
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def _wait_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._request("GET", "/moto-api/")
                return
            except OSError:
                assert self.proc.poll() is None, f"moto exited: {self.log()}"
                assert time.monotonic() < deadline, f"moto not up in {timeout} s: {self.log()}"
                time.sleep(0.1)

    def _request(self, method: str, path: str) -> None:
        # moto takes any signature, so the bucket needs no signed request
        with urllib.request.urlopen(urllib.request.Request(self.endpoint + path, method=method),
                                    timeout=5):
            pass

    def log(self) -> str:
        return (self.workdir / "moto.log").read_text(errors="replace")[-4000:]

    def __enter__(self) -> "S3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
