"""Periodic kinds through real drains: each due slot is enqueued once, by whichever run starts
first after it falls due, and runs; the next run finds the slot taken."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgdrain import Budget, Job, Registry, Settings, drain, periodic

Conn = psycopg.Connection[Any]

jobs = Registry()
ran: list[int] = []


# Yearly: the latest due slot is this year's, the same for every run in this test (unless the
# test straddles midnight on New Year's Eve UTC).
@jobs.periodic("0 0 1 1 *", kind="yearly_report", payload={"format": "csv"}, queue="reports")
def yearly_report(job: Job) -> None:
    assert job.payload == {"format": "csv"}
    ran.append(job.id)


def run(url: str) -> None:
    drain(Settings(queues=("reports",)), Budget.seconds(30), jobs, url)


def _periodic_rows(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT kind, status, idempotency_key FROM pgdrain.jobs ORDER BY id"
    ).fetchall()


def test_a_due_slot_is_enqueued_once_and_runs_once_across_runs(db_url: str, conn: Conn) -> None:
    ran.clear()
    run(db_url)
    run(db_url)
    [(kind, status, key)] = _periodic_rows(conn)
    assert (kind, status) == ("yearly_report", "done")
    assert key.startswith("pgdrain:periodic:yearly_report:") and key.endswith("-01-01T00:00Z")
    assert len(ran) == 1


def test_control_without_the_slot_key_every_run_enqueues_the_slot_again(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran.clear()
    monkeypatch.setattr(periodic.Periodic, "key", lambda self, slot: None)
    run(db_url)
    run(db_url)
    assert [status for _, status, _ in _periodic_rows(conn)] == ["done", "done"]
    assert len(ran) == 2
