"""`kvctl demo` (gateway + edge on this machine) and `kvctl needle` (the runtime alone)."""
from __future__ import annotations

import sys

import click

from kvedge.common.model.models import DEFAULT_MODEL
from kvedge.common.pack.codecs import DEFAULT_CODEC


@click.command("demo")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True)
@click.option("--keep", is_flag=True, help="keep the demo's data folder")
@click.option("--codec", default=DEFAULT_CODEC, show_default=True, help="pack codec")
@click.option("--kb-dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="another KB folder with a questions.json [default: the bundled one]")
def demo_cmd(model_name, keep, codec, kb_dir):
    """Gateway + edge on this machine: upload the bundled KB, ask its questions, compare."""
    from kvedge.apps.demo import DEMO_KB, run_demo

    ok = run_demo(model_name, keep=keep, echo=click.echo, codec=codec, kb_dir=kb_dir or DEMO_KB)
    sys.exit(0 if ok else 1)


@click.command("needle")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True)
@click.option("--tokens", default=1500, show_default=True, help="haystack length")
@click.option("--seed", default=0, show_default=True)
def needle_cmd(model_name, tokens, seed):
    """The runtime alone: a needle question over realigned segment KV vs full recompute;
    exit 1 when full recompute misses the needle (as a random-weight model does)."""
    from kvedge.apps.needle import run_needle_demo

    ok = run_needle_demo(model_name, tokens, seed, echo=click.echo)
    sys.exit(0 if ok else 1)


COMMANDS = [demo_cmd, needle_cmd]
