"""The gateway's batch-job RPCs: submit, watch, list and cancel compression jobs.

A mixin rather than a second servicer: the Cloud service is one gRPC service, and jobs share
the gateway's catalog, token store and job runner. The work itself is `cloud.jobs.JobRunner`.
"""
from __future__ import annotations

import time

from kvedge.common.net.auth import check_name
from kvedge.common.pack.codecs import DEFAULT_CODEC
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.common.net.rpc import principal, rpc_errors


def job_info(job) -> pb.JobInfo:
    """A catalog JobRecord as the wire's JobInfo."""
    return pb.JobInfo(job_id=job.id, namespace=job.namespace, kbs=job.kbs, method=job.method,
                      budget=job.budget, codec=job.codec, status=job.status, done=job.done,
                      total=job.total, variant=job.variant, created=job.created,
                      finished=job.finished, compress_s=job.compress_s,
                      failures=[pb.JobFailure(**f) for f in job.failures])


class JobsService:
    """The gateway's batch-job calls, mixed into Gateway (which provides `jobs`, `catalog`,
    `tokens` and `_authorized`)."""

    @rpc_errors
    def SubmitJob(self, request, context):
        self._authorized(context, request.namespace)
        for kb in request.kbs:
            check_name("knowledge base", kb)
        job = self.jobs.submit(request.namespace, list(request.kbs), request.method,
                               request.budget, request.codec or DEFAULT_CODEC)
        return job_info(job)

    @rpc_errors
    def GetJob(self, request, context):
        self._authorized(context, request.namespace)
        return job_info(self.catalog.job(request.namespace, request.job_id))

    @rpc_errors
    def WatchJob(self, request, context):
        """Stream the job's state whenever it changes, until it ends."""
        self._authorized(context, request.namespace)
        last = None
        while context.is_active():
            info = job_info(self.catalog.job(request.namespace, request.job_id))
            if info != last:
                yield info
                last = info
            if info.status in ("done", "failed", "cancelled"):
                return
            time.sleep(0.2)

    @rpc_errors
    def ListJobs(self, request, context):
        who = principal(self.tokens, context)
        if request.namespace:
            who.require(request.namespace)
        jobs = [j for j in self.catalog.jobs([request.namespace] if request.namespace else None)
                if who.may_read(j.namespace)]
        return pb.JobsReply(jobs=[job_info(j) for j in jobs])

    @rpc_errors
    def CancelJob(self, request, context):
        self._authorized(context, request.namespace)
        return job_info(self.jobs.cancel(request.namespace, request.job_id))
