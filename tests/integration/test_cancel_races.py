"""A cancel that waits for a job's row lock while another transaction changes the job (a claim
takes it, a failed attempt is queued again, a release hands it back) still cancels it.

The cancel locks its jobs in active_jobs and writes through the view, which writes a row only
as the statement's snapshot read it: a job changed while the cancel waited was locked but not
cancelled, and the operator was told it had already finished while it ran (found by a red team).
store.job_cancel runs the statement again in the same transaction, which holds the lock. Each
race is made with a transaction held open by hand and the cancel seen waiting on its lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, wait_for
from helpers.lock_waits import waits_on_a_lock
from pgdrain import enqueue
from pgdrain.db import store
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]
LEASE_SECONDS = 300.0


def _claim(conn: Conn, job_id: int) -> None:
    [claimed] = claim_batch(conn, ["default"], 1, "a-run", LEASE_SECONDS, None)
    assert claimed.id == job_id


def _requeue(conn: Conn, job_id: int) -> None:
    """The running attempt fails, and the job is queued again for its next attempt."""
    token = conn.execute(
        "SELECT attempt_token FROM pgdrain.active_jobs WHERE id = %s", (job_id,)
    ).fetchone()[0]  # type: ignore[index]
    outcome = store.job_fail(conn, store.Held(job_id, token), "boom", 0.0)
    assert isinstance(outcome, store.Failed) and outcome.status == "queued"


def _cancel_by_id_once(conn: Conn, job_id: int) -> list[int]:
    """The control: the statement run once, as before the fix."""
    rows = conn.execute(query("job_cancel"), {"ids": [job_id]}).fetchall()
    return [int(r[0]) for r in rows if r[-1]]


def _cancel_by_id(conn: Conn, job_id: int) -> list[int]:
    return [c.id for c in store.job_cancel(conn, [job_id])]


def _cancel_by_filter(conn: Conn, _job_id: int) -> list[int]:
    matched = store.job_cancel_matching(conn, ["queued", "running"], queue="default")
    return [c.id for c in matched]


# (what the other transaction does, the job's state before it, its status after)
CHANGES: list[tuple[str, bool, Callable[[Conn, int], None], str]] = [
    ("a claim takes it", False, _claim, "running"),
    ("its failed attempt is queued again", True, _requeue, "queued"),
]


@pytest.mark.parametrize(
    "cancel",
    [_cancel_by_id, _cancel_by_filter, _cancel_by_id_once],
    ids=["by-id", "by-filter", "control-statement-once"],
)
@pytest.mark.parametrize(
    ("running_before", "change", "status_after"),
    [c[1:] for c in CHANGES],
    ids=[c[0] for c in CHANGES],
)
def test_a_cancel_waiting_on_a_changing_job_cancels_it(
    db_url: str,
    conn: Conn,
    cancel: Callable[[Conn, int], list[int]],
    running_before: bool,
    change: Callable[[Conn, int], None],
    status_after: str,
) -> None:
    job_id = enqueue(conn, "noop")
    if running_before:
        _claim(conn, job_id)
    cancelled: list[list[int]] = []
    with psycopg.connect(db_url) as changer, psycopg.connect(db_url) as canceller:
        change(changer, job_id)  # left uncommitted: it holds the job's row lock
        pid = canceller.info.backend_pid

        def cancel_it() -> None:
            cancelled.append(cancel(canceller, job_id))
            canceller.commit()

        thread = threading.Thread(target=cancel_it)
        thread.start()
        wait_for(lambda: waits_on_a_lock(conn, pid), 60.0, "the cancel to wait for the row lock")
        changer.commit()
        thread.join(60)
    status = conn.execute("SELECT status FROM pgdrain.jobs WHERE id = %s", (job_id,)).fetchone()[0]  # type: ignore[index]
    if cancel is _cancel_by_id_once:  # locked, not cancelled: the job goes on to run
        assert (cancelled, status) == ([[]], status_after)
    else:
        assert (cancelled, status) == ([[job_id]], "cancelled")
