"""Periodic kinds through real drains: each due slot is enqueued once, by whichever run starts
first after it falls due, and runs; the next run finds the slot taken, whatever became of the
first slot's job (done, purged)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from helpers.fixtures import serve_instead, without_line
from pgdrain import Budget, Job, Registry, Settings, drain
from pgdrain.db.sql import query
from pgdrain.db.store import hot_path

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


def _statuses(conn: Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT status FROM pgdrain.jobs ORDER BY id").fetchall()]


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def test_a_due_slot_is_enqueued_once_and_runs_once_across_runs(db_url: str, conn: Conn) -> None:
    run(db_url)
    run(db_url)
    assert _statuses(conn) == ["done"]
    assert len(ran) == 1
    row = conn.execute("SELECT kind, to_char(slot, 'MM-DD HH24:MI') FROM pgdrain.periodic_slots")
    assert row.fetchall() == [("yearly_report", "01-01 00:00")]


def test_a_slot_whose_job_was_purged_is_not_enqueued_again(db_url: str, conn: Conn) -> None:
    run(db_url)
    conn.execute("DELETE FROM pgdrain.jobs")  # retention, or a freed idempotency key
    run(db_url)
    assert _statuses(conn) == [] and len(ran) == 1


def test_control_without_the_slot_guard_every_run_enqueues_the_slot_again(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    unguarded = without_line(query("periodic_enqueue"), "WHERE p.slot < excluded.slot")
    serve_instead(monkeypatch, hot_path, {"periodic_enqueue": unguarded})
    run(db_url)
    run(db_url)
    assert _statuses(conn) == ["done", "done"]
    assert len(ran) == 2


def _tenant(queue: str) -> Registry:
    """A deployment of a tenant's own: the same code, the same kind, its own queue."""
    registry = Registry()

    @registry.periodic("0 0 1 1 *", kind="cleanup", queue=queue)
    def cleanup(job: Job) -> None:
        ran.append(job.id)

    return registry


def test_the_same_kind_in_two_queues_has_a_slot_in_each(db_url: str, conn: Conn) -> None:
    """A red team's finding: two deployments sharing a database, each with `cleanup` on its
    own queue, took each other's slots (the row was kept per kind): one tenant's cleanup never
    ran. Each queue now has its own row, and each slot is still enqueued once per queue."""
    for queue in ("tenant_a", "tenant_b", "tenant_a"):
        drain(Settings(queues=(queue,)), Budget.seconds(30), _tenant(queue), db_url)
    rows = conn.execute("SELECT queue, status FROM pgdrain.jobs ORDER BY queue").fetchall()
    assert rows == [("tenant_a", "done"), ("tenant_b", "done")]
    assert len(ran) == 2


def test_a_slot_enqueued_before_slots_were_kept_per_queue_is_not_enqueued_again(
    db_url: str, conn: Conn
) -> None:
    """A row from before migration 0037 names no queue: its slot counts for every queue."""
    run(db_url)
    conn.execute("DELETE FROM pgdrain.jobs")
    conn.execute("UPDATE pgdrain.periodic_slots SET queue = ''")
    run(db_url)
    assert _statuses(conn) == [] and len(ran) == 1
