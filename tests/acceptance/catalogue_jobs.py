"""Job kinds that misbehave, for the bad-input catalogue (PGDRAIN_JOBS=catalogue_jobs with
tests/acceptance on PYTHONPATH). Each misbehaves on the attempts listed in payload["on"]
(every attempt when absent) and returns on the others."""

from __future__ import annotations

import os
import time

from pgdrain import Job, Registry

jobs = Registry()


def _misbehaves(job: Job) -> bool:
    on = job.payload.get("on")
    return on is None or job.attempt in on


@jobs.job("ok")
def ok(job: Job) -> None:
    pass


@jobs.job("explode")
def explode(job: Job) -> None:
    if _misbehaves(job):
        raise RuntimeError(f"boom on attempt {job.attempt}")


@jobs.job("hang")
def hang(job: Job) -> None:
    """Never returns, and never looks at its lease or the budget."""
    while _misbehaves(job):
        time.sleep(0.05)


@jobs.job("suicide")
def suicide(job: Job) -> None:
    """Ends its whole process at once: nothing in `finally` runs, as in a crash or an OOM kill."""
    if _misbehaves(job):
        os._exit(9)


@jobs.job("explode_ansi")
def explode_ansi(job: Job) -> None:
    """Fails with an error text that would clear the screen, rewrite the line and reverse it."""
    raise RuntimeError("\x1b[2J\rgotcha\n\u202eevil\x07")
