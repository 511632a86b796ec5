"""Retention (pgdrain.retention.run_once) on a real database: which rows go, and that it works
in bounded batches and stops when its budget does."""

from __future__ import annotations

from typing import Any

import psycopg

from pgdrain import enqueue, retention
from pgdrain.budget import Budget

Conn = psycopg.Connection[Any]


def _job(conn: Conn, status: str, days_ago: float) -> int:
    """A job in `status` since `days_ago` days (a parked job has no finished_at)."""
    job_id = enqueue(conn, "noop")
    conn.execute(
        "UPDATE pgdrain.jobs SET status = %(status)s, attempts = 1,"
        " finished_at = CASE WHEN %(status)s = 'parked' THEN NULL"
        "                    ELSE now() - %(days)s * interval '1 day' END,"
        " updated_at = now() - %(days)s * interval '1 day'"
        " WHERE id = %(id)s",
        {"status": status, "days": days_ago, "id": job_id},
    )
    return job_id


def _ids(conn: Conn) -> set[int]:
    return {int(r[0]) for r in conn.execute("SELECT id FROM pgdrain.jobs")}


def _plenty() -> Budget:
    return Budget.seconds(3600)


def test_each_status_is_kept_for_its_own_age(conn: Conn) -> None:
    old_done, young_done = _job(conn, "done", 8), _job(conn, "done", 6)
    old_failed, young_failed = _job(conn, "failed", 31), _job(conn, "failed", 8)
    old_cancelled = _job(conn, "cancelled", 31)
    old_parked = _job(conn, "parked", 365)  # waits for a person: never deleted
    queued = enqueue(conn, "noop")

    result = retention.run_once(conn, retain_done_days=7, retain_failed_days=30, budget=_plenty())

    assert result == retention.RetentionResult(done=1, failed=2, complete=True)
    assert _ids(conn) == {young_done, young_failed, old_parked, queued}
    assert not {old_done, old_failed, old_cancelled} & _ids(conn)


def test_it_runs_again_safely(conn: Conn) -> None:
    _job(conn, "done", 8)
    first = retention.run_once(conn, retain_done_days=7, retain_failed_days=30, budget=_plenty())
    second = retention.run_once(conn, retain_done_days=7, retain_failed_days=30, budget=_plenty())
    assert (first.done, second.done, second.complete) == (1, 0, True)


class CountingClock:
    """A clock that moves one second each time the budget reads it: a deterministic stand-in
    for batches taking time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _batches_within(conn: Conn, budget_seconds: float) -> retention.RetentionResult:
    budget = Budget.seconds(budget_seconds, clock=CountingClock())
    return retention.run_once(
        conn,
        retain_done_days=7,
        retain_failed_days=30,
        budget=budget,
        batch=2,
        min_remaining=0.5,
    )


def test_batches_stop_when_the_budget_does(conn: Conn) -> None:
    """Ten old rows, batches of two, a budget whose clock reads 3, 2, 1, 0 seconds left before
    each batch (three batches above the 0.5 s floor): six go, the result says there is more,
    and the next run carries on."""
    for _ in range(10):
        _job(conn, "done", 8)
    result = _batches_within(conn, 4.0)
    assert result == retention.RetentionResult(done=6, failed=0, complete=False)
    assert len(_ids(conn)) == 4
    assert _batches_within(conn, 100.0) == retention.RetentionResult(4, 0, True)


def test_control_a_budget_already_spent_deletes_nothing(conn: Conn) -> None:
    for _ in range(10):
        _job(conn, "done", 8)
    result = _batches_within(conn, 0.0)
    assert result == retention.RetentionResult(done=0, failed=0, complete=False)
    assert len(_ids(conn)) == 10
