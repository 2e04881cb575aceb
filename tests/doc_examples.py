"""The command examples of a markdown file and of the `kvctl` and `kvedge` help texts
(test_examples.py runs them).

- Markdown: each line of a ```bash block and each `$ ` line of another fenced block, read as a
  shell script (`command_lines.shell_commands`: `a | b` there lists alternatives, each its own
  example), and each inline code span that holds a command (`kvctl x`, `ray job submit --
  kvctl x`; not a bare program name);
- the help of every command of both click trees and of every option: each code span that holds
  a command, and what an option's help gives after `e.g.` up to `;` (parentheses left out,
  ` or ` between two): `--opt k=8` is a piece of that command's line, `int4+zstd` a value of
  that option.
Synopsis notation is expanded: `[--json]` gives the line without and with it,
`inspect|verify` (in a span) each; `<state>` is a placeholder word, not a redirection.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

import click

from command_lines import programs, resolve, shell_commands

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SPAN = re.compile(r"`([^`]+)`")
ELIDED = re.compile(r"(^|\s)\.\.\.(\s|$)")  # a bare `...`, not a quoted "..." question
KINDS = ("line", "span", "piece")  # strictest first: a line must parse whole


@dataclass(frozen=True)
class Example:
    argv: tuple[str, ...]
    kind: str = field(compare=False)  # "line" (a script's), "span" (prose), "piece" (an e.g.)
    elided: bool = False
    where: tuple[str, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        try:
            return " ".join(resolve(list(self.argv))[0])
        except AssertionError:  # an unknown command: test_example says which
            return " ".join(self.argv[:2])

    def __str__(self) -> str:
        return f"{shlex.join(self.argv)}  [{', '.join(self.where)}]"


def synopsis_variants(text: str, alternatives: bool) -> list[str]:
    """`a [--json]` → a, a --json; `pack inspect|verify P` → each (when `alternatives`)."""
    texts = [text]
    if re.search(r"\s\[", text):
        dropped = text
        while re.search(r"\s\[[^\[\]]*\]", dropped):
            dropped = re.sub(r"\s\[[^\[\]]*\]", "", dropped)
        texts = [dropped, re.sub(r"[\[\]]", "", text)]
    if alternatives:
        texts = [t for text in texts for t in _alternatives(text)]
    return texts


def _alternatives(text: str) -> list[str]:
    words = text.split(" ")
    for i, word in enumerate(words):
        if "|" in word and not word.startswith(("'", '"')):
            return [" ".join([*words[:i], alt, *words[i + 1:]]) for alt in word.split("|")]
    return [text]


def script_lines(body: str, prompted: bool) -> list[tuple[int, str]]:
    """(line offset, logical line) of a fenced block, continuations joined; only `$ ` lines
    when `prompted`."""
    found, start, held = [], 0, ""
    for i, line in enumerate(body.splitlines()):
        start = start if held else i
        if line.endswith("\\"):
            held += line[:-1] + " "
            continue
        line, held = held + line, ""
        if prompted and not line.startswith("$ "):
            continue
        found.append((start, line[2:] if prompted else line))
    return found


def readme_examples(readme: Path) -> list[Example]:
    text, found = readme.read_text(), []
    for block in FENCE.finditer(text):
        if block.group(1) not in ("bash", "sh", ""):
            continue
        first = text.count("\n", 0, block.start(2)) + 1
        for offset, line in script_lines(block.group(2), prompted=block.group(1) == ""):
            for variant in synopsis_variants(line, alternatives=False):
                found += [Example(tuple(argv), "line", where=(f"{readme.name}:{first + offset}",))
                          for argv in shell_commands(quoted(variant))]
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for span in SPAN.finditer(prose):
        where = f"{readme.name}:{prose.count(chr(10), 0, span.start()) + 1}"
        found += span_examples(span.group(1), where)
    return found


def span_examples(span: str, where: str) -> list[Example]:
    """The command a code span holds (`kvctl x`, `ray job submit -- kvctl x`); not a bare
    program name."""
    return [Example(tuple(argv), "span", bool(ELIDED.search(variant)), (where,))
            for variant in synopsis_variants(" ".join(span.split()), alternatives=True)
            for argv in shell_commands(quoted(variant)) if len(argv) > 1]


def quoted(text: str) -> str:
    """`<state>` is a placeholder, not a shell redirection."""
    return re.sub(r"(<[\w-]+>)", r"'\1'", text)


def walk(cmd: click.Command, words: list[str]):
    yield words, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from walk(sub, [*words, name])


def help_examples() -> list[Example]:
    found = []
    for prog, root in programs().items():
        for words, cmd in walk(root, [prog]):
            where = f"{' '.join(words)} --help"
            for span in SPAN.findall(" ".join((cmd.help or "").split())):
                found += span_examples(span, where)
            for opt in cmd.params:
                found += option_examples(words, opt, where)
    return found


def option_examples(words: list[str], opt: click.Parameter, where: str) -> list[Example]:
    """An option's help: its code spans, and what follows `e.g.` up to `;` (parentheses left
    out, ` or ` between two): a piece of the command's line, or a value of the option."""
    text = " ".join((getattr(opt, "help", None) or "").split())
    found = [e for span in SPAN.findall(text) for e in span_examples(span, where)]
    given = re.search(r"\be\.g\. ([^;]*)", text)
    flag = max(opt.opts, key=len)
    if given:
        for piece in re.sub(r"\s*\([^)]*\)", "", given.group(1)).split(" or "):
            argv = shlex.split(piece) if piece.startswith("-") else [flag, piece.strip()]
            found.append(Example((*words, *argv), "piece", where=(f"{where} ({flag})",)))
    return found


def collect(readme: Path) -> list[Example]:
    """Every example of `readme` and of the help texts once: its places merged, read as its
    strictest kind."""
    merged: dict[Example, Example] = {}
    for example in readme_examples(readme) + help_examples():
        seen = merged.get(example, example)
        kind = min(seen.kind, example.kind, key=KINDS.index)
        where = (*seen.where, *example.where) if seen is not example else example.where
        merged[example] = replace(example, kind=kind, where=where)
    return list(merged.values())
