"""The documentation stays inside the repository.

A user of the package has the repository, not the folder beside it where the design notes and
papers were first kept: no source, script, config or doc file may point there (papers are
cited by title and section, the design is `docs/design.md`), and every relative link in the
README and `docs/*.md` must reach a file that exists.
"""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = (".py", ".md", ".sh", ".toml", ".yaml", ".yml")
SKIPPED = {".venv", ".git", "tests"}
OUTSIDE = ("../shared", "shared/papers", "DESIGN.md")
FENCE = re.compile(r"^(`{3,}|~{3,}).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.S)
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def tracked_files() -> list[Path]:
    """The repository's files of the checked kinds: git's tracked list in a checkout, else
    every file under the root (an unpacked source tree)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True, timeout=60).stdout.decode()
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        paths = [p for p in ROOT.rglob("*") if p.is_file()]
    return sorted(p for p in paths if p.suffix in SUFFIXES and p.is_file()
                  and not SKIPPED & set(p.relative_to(ROOT).parts)
                  and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts))


def outside_pointers(files: list[Path], root: Path = ROOT) -> list[str]:
    """'path:line: text' for every line naming a place outside the repository."""
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if any(marker in line for marker in OUTSIDE):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def relative_links(markdown: str) -> list[str]:
    """Link targets of a markdown text that are paths (no URL scheme, not a bare #anchor),
    without their #anchor; code blocks and code spans are not links."""
    prose = CODE_SPAN.sub("", FENCE.sub("", markdown))
    targets = INLINE_LINK.findall(prose) + REFERENCE.findall(prose)
    return [t.split("#", 1)[0] for t in targets
            if not SCHEME.match(t) and not t.startswith("#") and t.split("#", 1)[0]]


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """The relative links of `doc` that reach no file inside the repository at `root`."""
    bad = []
    for target in relative_links(doc.read_text()):
        resolved = (doc.parent / target).resolve()
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            bad.append(f"{doc.relative_to(root)} → {target}")
    return bad


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_no_file_points_outside_the_repository():
    assert outside_pointers(tracked_files()) == []


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_files(doc):
    assert broken_links(doc) == []


def test_the_checks_catch_what_they_should(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("x")
    note = tmp_path / "note.py"
    note.write_text('"""See ../shared/papers/a3.txt and DESIGN.md decision 1."""\n')
    doc = tmp_path / "docs" / "a.md"
    doc.write_text("[ok](here.md#top) [gone](missing.md) ![pic](../docs/here.md)\n"
                   "[web](https://example.com) [anchor](#x) `[code](nowhere.md)`\n"
                   "```\n[block](nowhere.md)\n```\n[ref]: ../../outside.md\n")
    assert outside_pointers([note], tmp_path) == [
        'note.py:1: """See ../shared/papers/a3.txt and DESIGN.md decision 1."""']
    assert broken_links(doc, tmp_path) == ["docs/a.md → missing.md",
                                           "docs/a.md → ../../outside.md"]
