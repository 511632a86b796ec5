"""`pgdrain drain` with periodic kinds (helpers.periodic_jobs, docs/jobs.md's example): it
enqueues the slots of the kinds of the queues it drains, and says at its start which kind no
run of this configuration takes (its queue is not in PGDRAIN_QUEUES)."""

from __future__ import annotations

import os
from typing import Any

import psycopg

from helpers.cli import EXIT_OK, ROOT, only_line, run_pgdrain

Conn = psycopg.Connection[Any]


def _env(db_url: str, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(ROOT / "tests")]),
        "PGDRAIN_JOBS": "helpers.periodic_jobs",
        **extra,
    }


def test_drain_warns_of_a_periodic_kind_on_a_queue_it_does_not_drain(
    conn: Conn, db_url: str
) -> None:
    run = run_pgdrain("drain", "--budget", "10", env=_env(db_url, PGDRAIN_QUEUES="default"))

    assert run.code == EXIT_OK, run.err
    assert only_line(run.err) == (
        "pgdrain: WARNING periodic kind 'cleanup' goes to queue 'maintenance', which is not "
        "drained here (PGDRAIN_QUEUES=default): its slots are not enqueued and wake nothing; "
        "add the queue to PGDRAIN_QUEUES, or drain it elsewhere"
    )
    rows = conn.execute("SELECT queue, kind, status FROM pgdrain.jobs").fetchall()
    assert rows == [("default", "report", "done")]  # cleanup's slot is not left to wait


def test_drain_restricted_on_purpose_says_nothing_of_it(conn: Conn, db_url: str) -> None:
    run = run_pgdrain("drain", "--budget", "10", "--queues", "default", env=_env(db_url))
    assert (run.code, run.err) == (EXIT_OK, "")


def test_drain_of_every_kinds_queue_runs_them_all(conn: Conn, db_url: str) -> None:
    env = _env(db_url, PGDRAIN_QUEUES="default,maintenance")
    run = run_pgdrain("drain", "--budget", "10", env=env)
    assert (run.code, run.err) == (EXIT_OK, "")
    rows = conn.execute("SELECT queue, kind, status FROM pgdrain.jobs ORDER BY queue").fetchall()
    assert rows == [("default", "report", "done"), ("maintenance", "cleanup", "done")]
