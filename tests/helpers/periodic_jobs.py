"""Periodic kinds as docs/jobs.md declares them (PGDRAIN_JOBS=helpers.periodic_jobs): `cleanup`
on the maintenance queue every 15 minutes, and `report` on the default queue every 6 hours."""

from __future__ import annotations

import datetime as dt

from pgdrain import Job, Registry

jobs = Registry()


@jobs.periodic("*/15 * * * *", kind="cleanup", payload={"days": 7}, queue="maintenance")
def cleanup(job: Job) -> None:
    pass


@jobs.periodic(every=dt.timedelta(hours=6), kind="report")
def report(job: Job) -> None:
    pass
