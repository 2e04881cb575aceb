"""What a knowledge-base upload may contain: the rules the client applies when it scans a
folder and the gateway applies again to every path and byte it receives. Torch-free."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kvedge.common.errors import BadInput, RequestTooLarge

TEXT_SUFFIXES = (".txt", ".md")
# what one upload may hold: the gateway reads a file whole to check it, and a text file of
# 16 MB is ~4M tokens, hundreds of times any model's context
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_FILES = 10_000
MAX_PATH_CHARS = 1024


def check_path(path: str) -> str:
    """A KB-relative path: no absolute paths, no '..', no control characters, a text suffix."""
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\\" in path:
        raise BadInput(f"{path!r}: file paths must be relative to the knowledge base folder")
    if len(path) > MAX_PATH_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise BadInput(f"{path[:80]!r}: a file path may have at most {MAX_PATH_CHARS} "
                       "characters and no control characters; rename the file")
    if p.suffix.lower() not in TEXT_SUFFIXES:
        raise BadInput(f"{path}: only {', '.join(TEXT_SUFFIXES)} files can be ingested")
    return path


def check_size(path: str, size: int) -> int:
    """A file's declared size: not negative, at most MAX_FILE_BYTES."""
    if size < 0:
        raise BadInput(f"{path}: a file cannot have {size} bytes")
    if size > MAX_FILE_BYTES:
        raise RequestTooLarge(f"{path} has {size} bytes; files of at most {MAX_FILE_BYTES} "
                              "bytes can be uploaded: split it into several files")
    return size


def check_count(n: int) -> int:
    if n > MAX_FILES:
        raise RequestTooLarge(f"{n} files; a knowledge base may have at most {MAX_FILES}: "
                              "merge small files or split the knowledge base")
    return n


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
    (an upload must never carry, say, /etc/passwd), and so are names that are not UTF-8 and
    files that are too big or not UTF-8 text, before anything is sent; the gateway checks
    every path, size and byte again."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInput(f"{folder} is not a folder")
    files, skipped, blank = [], [], True
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
        path = check_path(_utf8_name(rel))
        check_size(path, full.stat().st_size)  # before reading it
        check_count(len(files) + 1)
        data = full.read_bytes()
        text = decode_text(path, data)
        blank = blank and not text.strip()
        files.append(LocalFile(path, full, hashlib.sha256(data).hexdigest(), len(data)))
    if not files:
        raise BadInput(f"{folder} has no {' or '.join(TEXT_SUFFIXES)} files to upload"
                       + (f" (skipped: {', '.join(skipped[:5])})" if skipped else ""))
    if blank:
        raise BadInput(f"the knowledge base in {folder} has no text (every file is empty)")
    return files, skipped


def _utf8_name(rel: Path) -> str:
    name = rel.as_posix()
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"{name.encode('utf-8', 'surrogateescape')!r}: the file name is not "
                       "UTF-8; rename the file") from None
    return name
