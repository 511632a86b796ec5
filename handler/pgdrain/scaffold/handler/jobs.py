"""Your job kinds. The function imports this module at a cold start (template.yaml's
JobsModule parameter, `jobs` by default, sets PGDRAIN_JOBS); the `pgdrain` command imports it
from the Python path (`export PYTHONPATH=handler` in the project's folder).

A job function takes a pgdrain.Job. Returning means done; raising means retried with backoff
(failed once max_attempts is reached); raising pgdrain.RetryIn, Snooze, Discard or Cancel
chooses another outcome. Delivery is at least once: a job may run again after a crash, so make
its effects idempotent (key them by job.id). The job author's guide: pgdrain's docs/jobs.md.

Code this module imports goes in this folder (handler/, the function's CodeUri); the packages
it needs go in requirements.txt beside it."""

from __future__ import annotations

from pgdrain import Job, Registry

jobs = Registry()


@jobs.job("hello")
def hello(job: Job) -> None:
    """`pgdrain enqueue hello --payload '{"name": "world"}'`: prints a greeting (on Lambda, into
    the function's log)."""
    print(f"hello, {job.payload.get('name', 'world')}")
