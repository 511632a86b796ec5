"""A job that holds the GIL past the run's deadline. The run's own thread cannot run, so it
can neither stop in time nor give the job up: the limit of a thread pool in one Python process
(docs/reliability.md, "Limits"). What keeps the run's end safe is the lease cap: the
job's lease ends at the deadline in the database's clock, whatever the process does, so
another run may take the job then and the stuck run's late result is refused by the fence."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from helpers.fixtures import db_now, drain_process, finished_result, job_row, wait_for
from pgdrain import enqueue
from pgdrain.db import store

Conn = psycopg.Connection[Any]


def started_at(conn: Conn, job_id: int) -> Any:
    row = conn.execute(
        "SELECT at FROM public.ledger WHERE job_id = %s AND phase = 'start'", (job_id,)
    ).fetchone()
    return row[0] if row else None


@pytest.mark.parametrize("cap", [True, False], ids=["lease-capped", "lease-uncapped"])
def test_a_job_holding_the_gil_past_the_deadline_is_reclaimable_there_only_with_the_cap(
    ledger_url: str, conn: Conn, cap: bool
) -> None:
    job_id = enqueue(conn, "hold_gil", {"seconds": 8})
    args = ["--budget", "2", "--lease", "30", "--reserve", "0.5", *([] if cap else ["--no-cap"])]
    process = drain_process(ledger_url, *args)
    began = wait_for(lambda: started_at(conn, job_id), what="the job to start")

    # Past the run's deadline, with the GIL still held: the run is stuck, not gone.
    wait_for(lambda: db_now(conn) > began + dt.timedelta(seconds=2.5), what="the deadline")
    assert process.poll() is None, "the run cannot return while the job holds the GIL"
    reclaimed = [r.id for r in store.job_reclaim_expired(conn, 10)]
    assert reclaimed == ([job_id] if cap else [])

    result = finished_result(process)
    row = job_row(conn, job_id)
    if cap:
        # The stuck run woke after the job returned, past its deadline: its result is not
        # recorded (given up, or refused by the fence); the job waits for its next attempt.
        assert (row["status"], row["completed_token"]) == ("queued", None)
        assert (result["done"], result["stop_reason"]) == (0, "budget")
    else:
        # Without the cap nobody can take the job until its 30 s lease ends.
        assert row["status"] == "running"
        assert (row["lease_expires_at"] - db_now(conn)).total_seconds() > 15
