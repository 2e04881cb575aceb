"""`kvctl job submit|status|list|cancel`: batch compression jobs on the gateway."""
from __future__ import annotations

import sys

import click

from kvedge.cloud.cli.connect import cloud_client, with_cloud
from kvedge.common.cli import (RegistryChoice, advance, echo_json, echo_messages, progress_bar,
                               proto_dict)
from kvedge.common.model.models import DEFAULT_MODEL
from kvedge.common.pack.codecs import DEFAULT_CODEC


def _methods():
    from kvedge.cloud.eviction import METHODS

    return METHODS


def _check_codec(ctx, param, spec):
    from kvedge.common.errors import InvalidRequest
    from kvedge.common.pack.codecs import get_codec

    try:
        get_codec(spec)
    except InvalidRequest as err:
        raise click.BadParameter(str(err)) from None
    return spec


def _print_job(job):
    fails = f", {len(job.failures)} failed" if job.failures else ""
    click.echo(f"{job.job_id}  {job.status:9s} {job.method}@{job.budget:g} {job.codec:12s} "
               f"{job.done}/{job.total} contexts{fails}  → variant {job.variant}  "
               f"kbs {list(job.kbs)}")
    for f in job.failures:
        click.echo(f"    {f.kb} segment {f.segment}: {f.error}")


@click.group("job")
def job_group():
    """Batch compression jobs: new pack variants per (method, budget, codec)."""


@job_group.command("submit")
@click.option("--kb", "kbs", multiple=True, required=True, help="repeatable")
@click.option("--method", required=True, type=RegistryChoice(_methods),
              help="eviction method (none: re-encode only)")
@click.option("--budget", type=float, default=1.0, show_default=True,
              help="fraction of KV pairs kept")
@click.option("--codec", default=DEFAULT_CODEC, show_default=True, callback=_check_codec,
              help="pack codec spec, e.g. int4+zstd")
@with_cloud
@click.option("--wait/--no-wait", default=True, show_default=True)
def job_submit(kbs, method, budget, codec, address, token, tls_ca, namespace, wait):
    """Compress every context of the KBs; the result is a new variant of each KB."""
    with cloud_client(address, token, tls_ca) as cloud:
        job = cloud.submit_job(namespace, list(kbs), method, budget, codec)
        click.echo(f"job {job.job_id} submitted: {job.total} contexts → variant {job.variant}")
        if not wait:
            return
        bar = progress_bar(total=job.total, unit="ctx", desc=job.job_id)
        for job in cloud.watch_job(namespace, job.job_id):
            advance(bar, job.done, job.total)
        bar.close()
        _print_job(job)
        if job.status != "done":
            sys.exit(1)


@job_group.command("status")
@click.argument("job_id")
@with_cloud
@click.option("--json", "as_json", is_flag=True)
def job_status(job_id, address, token, tls_ca, namespace, as_json):
    with cloud_client(address, token, tls_ca) as cloud:
        job = cloud.get_job(namespace, job_id)
    echo_json(proto_dict(job)) if as_json else _print_job(job)


@job_group.command("list")
@with_cloud
@click.option("--json", "as_json", is_flag=True)
def job_list(address, token, tls_ca, namespace, as_json):
    with cloud_client(address, token, tls_ca) as cloud:
        jobs = cloud.list_jobs(namespace)
    echo_messages(jobs, as_json, _print_job)


@job_group.command("cancel")
@click.argument("job_id")
@with_cloud
def job_cancel(job_id, address, token, tls_ca, namespace):
    with cloud_client(address, token, tls_ca) as cloud:
        _print_job(cloud.cancel_job(namespace, job_id))


@job_group.command("run")
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
              help="the gateway's data dir (its catalog) [default: $KVEDGE_HOME/cloud]")
@click.option("--store", "store_url", default=None,
              help="the gateway's pack store (folder or fsspec URL; s3://: the same AWS "
              "settings as the gateway's) [default: <data>/store]")
@click.option("--namespace", "-n", default="default", show_default=True)
@click.option("--kb", "kbs", multiple=True, required=True, help="repeatable")
@click.option("--method", required=True, type=RegistryChoice(_methods),
              help="eviction method (none: re-encode only)")
@click.option("--budget", type=float, default=1.0, show_default=True,
              help="fraction of KV pairs kept")
@click.option("--codec", default=DEFAULT_CODEC, show_default=True, help="e.g. int4+zstd")
@click.option("--model", "model_name", default=DEFAULT_MODEL, show_default=True,
              help="the gateway's model (packs are bound to it)")
@click.option("--ray-address", envvar="RAY_ADDRESS", default=None,
              help="Ray cluster to run on [default: $RAY_ADDRESS, which `ray job submit` sets; "
                   "else Ray starts in-process]")
@click.option("--actors", default=1, show_default=True, help="prefill actors (one model each)")
@click.option("--cpus-per-actor", default=1, show_default=True)
def job_run(data_dir, store_url, namespace, kbs, method, budget, codec, model_name, ray_address,
            actors, cpus_per_actor):
    """Run one batch compression job in this process, on the Ray cluster, against the gateway's
    catalog and store (what `ray job submit -- kvctl job run ...` runs); `kvctl job list` on
    that gateway shows its progress. Exit code 0 when every context is compressed and
    published, 1 when it failed or was cancelled (SIGTERM, `ray job stop` or `kvctl job
    cancel`), 2 on bad input."""
    from kvedge.cloud.jobs import run_job_here

    job = run_job_here(data_dir, store_url, namespace, list(kbs), method, budget, codec,
                       model_name, ray_address, actors, cpus_per_actor)
    sys.exit(0 if job.status == "done" else 1)


COMMANDS = [job_group]
