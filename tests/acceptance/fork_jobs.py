"""Job kinds for the test of a job whose forked child returns (PGDRAIN_JOBS=fork_jobs,
tests/acceptance on PYTHONPATH). Each records where it ran in the file FORK_LOG names."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pgdrain import Job, Registry

jobs = Registry()


def _record(what: str) -> None:
    with Path(os.environ["FORK_LOG"]).open("a", encoding="utf-8") as log:
        log.write(f"{what} {os.getpid()}\n")


@jobs.job("fork")
def fork(job: Job) -> None:
    """Forks once a work job runs beside it, and lets the child return."""
    while not Path(job.payload["started"]).exists():
        time.sleep(0.01)
    if os.fork() == 0:
        _record("child")
        return  # into the run, in the child: what a job should never let a child do
    _record("parent")
    time.sleep(0.5)  # the child returns first


@jobs.job("work")
def work(job: Job) -> None:
    _record(f"work {job.id}")
    Path(job.payload["started"]).touch()
    time.sleep(1.0)  # its thread busy while the child returns
