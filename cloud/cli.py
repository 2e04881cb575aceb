"""`kvctl`: the operator's and user's control tool (models, packs, demo; uploads and jobs later)."""
from __future__ import annotations

import sys

import click

from kvedge.common.errors import KvedgeError


class KvedgeGroup(click.Group):
    """Turns kvedge's named errors into one clear line and exit code 2, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KvedgeError as err:
            click.echo(f"error: {type(err).__name__}: {err}", err=True)
            sys.exit(2)


@click.group(cls=KvedgeGroup)
def kvctl():
    """kvedge control: models, packs, the demo."""


@kvctl.command("models")
def models_cmd():
    """List the models kvedge can load (and whether their files are installed)."""
    from kvedge.common.models import REGISTRY

    for entry in REGISTRY.values():
        ok, where = entry.available()
        click.echo(f"{entry.name:24s} {'ok ' if ok else 'missing'}  {entry.description}")
        if not ok:
            click.echo(f"{'':24s}   {where}")
    click.echo("(any local Hugging Face folder path works as a model too)")


@kvctl.group("model")
def model_group():
    """Check a model before trusting it."""


@model_group.command("verify")
@click.option("--model", "model_name", required=True, help="registered name or local folder")
@click.option("--tokens", default=96, show_default=True, help="random prompt length")
@click.option("--tolerance", default=1e-4, show_default=True, help="max |Δlogits| allowed")
def verify_cmd(model_name, tokens, tolerance):
    """Runtime vs the transformers forward: max |Δlogits| per mode; non-zero exit above tolerance."""
    from kvedge.common.models import load_model
    from kvedge.common.runtime import Runtime
    from kvedge.common.verify import verify_runtime

    loaded = load_model(model_name)
    click.echo(f"model {loaded.name}  fingerprint {loaded.fingerprint[:16]}  "
               f"({loaded.config.model_type}, {loaded.config.num_hidden_layers} layers)")
    checks = verify_runtime(Runtime(loaded), n_tokens=tokens, tolerance=tolerance)
    for check in checks:
        click.echo(f"  {'ok  ' if check.ok else 'FAIL'} {check.name:48s} "
                   f"max|Δlogits| = {check.max_abs_diff:.2e}")
    if not all(c.ok for c in checks):
        click.echo(f"runtime is NOT exact on this model (tolerance {tolerance:g})", err=True)
        sys.exit(1)
    click.echo(f"runtime is exact on this model (tolerance {tolerance:g})")


@kvctl.command("demo")
@click.option("--model", "model_name", default="smollm2-135m-instruct", show_default=True)
@click.option("--tokens", default=1500, show_default=True, help="haystack length")
@click.option("--seed", default=0, show_default=True)
def demo_cmd(model_name, tokens, seed):
    """Answer a needle-in-a-haystack question with the runtime, streaming the answer."""
    from kvedge.cloud.demo import run_needle_demo

    ok = run_needle_demo(model_name, tokens, seed, echo=click.echo)
    sys.exit(0 if ok else 1)


def main():  # pragma: no cover - console-script convenience
    kvctl()
