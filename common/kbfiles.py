"""What a knowledge-base upload may contain: the rules the client applies when it scans a
folder and the gateway applies again to every path and byte it receives. Torch-free."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kvedge.common.errors import BadInput

TEXT_SUFFIXES = (".txt", ".md")


def check_path(path: str) -> str:
    """A KB-relative path: no absolute paths, no '..', a text suffix."""
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\\" in path:
        raise BadInput(f"{path!r}: file paths must be relative to the knowledge base folder")
    if p.suffix.lower() not in TEXT_SUFFIXES:
        raise BadInput(f"{path}: only {', '.join(TEXT_SUFFIXES)} files can be ingested")
    return path


def decode_text(path: str, data: bytes) -> str:
    """UTF-8 text or a BadInput naming the file (binaries are rejected, not guessed at)."""
    if b"\x00" in data:
        raise BadInput(f"{path}: binary file (contains NUL bytes); upload text (.txt, .md) only")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadInput(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


@dataclass(frozen=True)
class LocalFile:
    path: str     # relative, with '/' separators
    full: Path
    sha256: str
    size: int


def scan_folder(folder: Path | str) -> tuple[list[LocalFile], list[str]]:
    """(the .txt/.md files under `folder`, hashed; the other files, which are not uploaded).
    Hidden files and folders are ignored; a symbolic link that leaves the folder is refused
    (an upload must never carry, say, /etc/passwd); the gateway still checks every file's
    content."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInput(f"{folder} is not a folder")
    files, skipped = [], []
    root = folder.resolve()
    for full in sorted(folder.rglob("*")):
        rel = full.relative_to(folder)
        if not full.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        if not full.resolve().is_relative_to(root):
            raise BadInput(f"{rel.as_posix()} is a link to {full.resolve()}, outside {folder}: "
                           "links may not leave the uploaded folder (copy the file in instead)")
        if full.suffix.lower() not in TEXT_SUFFIXES:
            skipped.append(rel.as_posix())
            continue
        data = full.read_bytes()
        files.append(LocalFile(rel.as_posix(), full, hashlib.sha256(data).hexdigest(), len(data)))
    if not files:
        raise BadInput(f"{folder} has no {' or '.join(TEXT_SUFFIXES)} files to upload"
                       + (f" (skipped: {', '.join(skipped[:5])})" if skipped else ""))
    return files, skipped
