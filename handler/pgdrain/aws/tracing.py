"""A job middleware for Powertools Tracer: each job runs in its own X-Ray subsegment,
`## job KIND`, annotated with the job's id, kind, queue and attempt (annotations are indexed:
filter traces by them). The payload is never recorded, as `capture_response=False` keeps job
data out of traces; a job's exception is recorded on its subsegment by the provider.

    from aws_lambda_powertools import Tracer
    from pgdrain.aws.tracing import tracer_middleware

    tracer = Tracer()
    jobs.middleware(tracer_middleware(tracer))

Here, at the edge, because the core must not import aws_lambda_powertools."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from aws_lambda_powertools import Tracer

from pgdrain.api.registry import Job


def tracer_middleware(tracer: Tracer) -> Callable[[Job], AbstractContextManager[object]]:
    """A middleware (Registry.middleware) tracing each job through `tracer`'s provider."""

    @contextmanager
    def trace(job: Job) -> Iterator[object]:
        with tracer.provider.in_subsegment(name=f"## job {job.kind}") as subsegment:
            subsegment.put_annotation("job_id", str(job.id))
            subsegment.put_annotation("job_kind", job.kind)
            subsegment.put_annotation("job_queue", job.queue)
            subsegment.put_annotation("job_attempt", str(job.attempt))
            yield subsegment

    return trace
