"""Job kinds for the operator commands' tests (PGDRAIN_JOBS=operator_jobs, tests/acceptance on
PYTHONPATH)."""

from __future__ import annotations

import time
from pathlib import Path

from pgdrain import Job, Registry

jobs = Registry()


@jobs.job("ok")
def ok(job: Job) -> None:
    pass


@jobs.job("wait")
def wait(job: Job) -> None:
    """Says it started (payload["started"] file), then waits until its lease is lost (a cancel)
    or the test releases it (payload["release"] file), and writes which it was."""
    started, release = Path(job.payload["started"]), Path(job.payload["release"])
    started.write_text(str(job.id), encoding="utf-8")
    while not job.lease_lost() and not release.exists():
        time.sleep(0.02)
    seen = "lease lost" if job.lease_lost() else "released"
    Path(job.payload["seen"]).write_text(seen, encoding="utf-8")


@jobs.job("shaped", queue="q1", max_attempts=3, priority=3, recovery_policy="manual")
def shaped(job: Job) -> None:
    """A kind with every enqueue option set in its decorator: `pgdrain enqueue shaped` takes
    them as its defaults."""


@jobs.job("count")
def count(job: Job) -> dict[str, int]:
    """Records progress, and returns its output."""
    job.record_progress(1.0)
    return {"counted": int(job.payload.get("n", 0))}
