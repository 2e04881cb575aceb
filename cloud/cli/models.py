"""`kvctl models`, `kvctl model verify`: which models load, and whether the runtime is exact."""
from __future__ import annotations

import sys

import click

from kvedge.common.model.models import DEFAULT_MODEL


@click.command("models")
def models_cmd():
    """List the models kvedge can load (and whether their files are installed)."""
    from kvedge.common.model.models import REGISTRY

    for entry in REGISTRY.values():
        ok, where = entry.available()
        click.echo(f"{entry.name:24s} {'ok ' if ok else 'missing'}  {entry.description}")
        if not ok:
            click.echo(f"{'':24s}   {where}")
    click.echo("(any local Hugging Face folder path works as a model too)")


@click.group("model")
def model_group():
    """Check a model before trusting it."""


@model_group.command("verify")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="registered name or local folder")
@click.option("--tokens", default=96, show_default=True, help="random prompt length")
@click.option("--tolerance", default=1e-4, show_default=True, help="max |Δlogits| allowed")
def verify_cmd(model_name, tokens, tolerance):
    """Runtime vs the transformers forward: max |Δlogits| per mode; non-zero exit above tolerance."""
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime
    from kvedge.common.model.verify import verify_runtime

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


COMMANDS = [models_cmd, model_group]
