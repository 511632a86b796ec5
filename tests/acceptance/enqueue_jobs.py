"""The job kinds `pgdrain enqueue`'s tests enqueue (PGDRAIN_JOBS=enqueue_jobs, tests/acceptance
on PYTHONPATH): registered without options, so the command's own defaults apply."""

from __future__ import annotations

from pgdrain import Job, Registry

jobs = Registry()


@jobs.job("send_email")
def send_email(job: Job) -> None:
    pass


@jobs.job("resize")
def resize(job: Job) -> None:
    pass
