"""Job kinds for the tests of `pgdrain worker` (PGDRAIN_JOBS=helpers.worker_jobs, tests/ on
PYTHONPATH). Each says what it did through the job's own row, or a file the test names."""

from __future__ import annotations

import time
from pathlib import Path

from pgdrain import Job, Registry, RetryIn

jobs = Registry()

RETRY_IN_SECONDS = 1.5


@jobs.job("ok")
def ok(job: Job) -> None:
    pass


@jobs.job("retry_once")
def retry_once(job: Job) -> None:
    """Asks for a retry in RETRY_IN_SECONDS on its first attempt; done on its second."""
    if job.attempt == 1:
        raise RetryIn(RETRY_IN_SECONDS)


@jobs.job("sleep")
def sleep(job: Job) -> None:
    """Says it started (the file payload["started"]), then works payload["seconds"], or until
    its lease is lost."""
    Path(job.payload["started"]).write_text(str(job.id), encoding="utf-8")
    ends_at = time.monotonic() + float(job.payload["seconds"])
    while time.monotonic() < ends_at and not job.lease_lost():
        time.sleep(0.02)
