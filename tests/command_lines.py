"""`kvctl` and `kvedge` command lines found in text (shell scripts, manifests, the README,
`--help` texts), resolved through the real click trees: a command line that names an unknown
command, flag or value fails the test that reads it. Shared by test_deploy.py and
test_examples.py."""
from __future__ import annotations

import os
import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click
import pytest


@dataclass
class Parsed:
    name: str      # e.g. "kvctl cloud up"
    params: dict
    command: click.Command

    def port(self, param: str = "address") -> int:
        return port_of(self.params[param])


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def programs() -> dict[str, click.Command]:
    from kvedge.apps.kvctl import kvctl
    from kvedge.edge.cli import main as kvedge

    return {"kvctl": kvctl, "kvedge": kvedge}


@contextmanager
def environment(env: dict[str, str]):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def resolve(argv: list[str]) -> tuple[list[str], click.Command, list[str]]:
    """(the command's words, e.g. ["kvctl", "cloud", "up"], the command, the rest of argv):
    fails on a subcommand the group does not have. A group's own options (`kvctl --help`)
    end the walk."""
    prog = Path(argv[0]).name
    cmd, words, rest = programs()[prog], [prog], argv[1:]
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        assert rest[0] in cmd.commands, f"`{' '.join(words)}` has no command {rest[0]!r}"
        cmd, words, rest = cmd.commands[rest[0]], [*words, rest[0]], rest[1:]
    return words, cmd, rest


def parse(argv: list[str], env: dict[str, str] | None = None) -> Parsed:
    """Resolve argv (from the program on) through the click tree and parse its options, as the
    command would at run time with `env` set; fails on an unknown command, flag or value."""
    words, cmd, rest = resolve(argv)
    if "--help" in rest:
        return Parsed(" ".join(words), {}, cmd)
    assert not isinstance(cmd, click.Group), f"`{' '.join(argv)}`: no command given"
    with environment(env or {}):
        try:
            ctx = cmd.make_context(" ".join(words), list(rest))
        except click.ClickException as err:
            pytest.fail(f"`{' '.join(argv)}`: {err.format_message()}")
    return Parsed(" ".join(words), ctx.params, cmd)


LAUNCHERS = {"exec", "sudo", "--", "gateway", "edge"}  # words a command line may follow
OPERATORS = {";", "&&", "||", "|", "&", ">", ">>", "<", "2>", "2>/dev/null"}


def shell_commands(script: str) -> list[list[str]]:
    """The kvedge command lines in a shell script, each up to its operator or redirection."""
    lex = shlex.shlex(script, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    tokens, found = list(lex), []
    for i, tok in enumerate(tokens):
        if Path(tok).name in ("kvctl", "kvedge") and (
                i == 0 or tokens[i - 1] in LAUNCHERS | OPERATORS):
            end = next((j for j in range(i, len(tokens)) if tokens[j] in OPERATORS), len(tokens))
            found.append(tokens[i:end])
    return found
