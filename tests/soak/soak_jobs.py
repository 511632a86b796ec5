"""The soak's job kinds (PGDRAIN_JOBS=soak.soak_jobs). Each records, through a connection of
its own, a `start` row in soak.ledger when it begins and a `return` row just before it returns
(job id, attempt token, attempt, the process id), so the soak can compare every attempt that
ran with the one whose completion pgdrain accepted (pgdrain.jobs.completed_token)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psycopg

from pgdrain import Job, Registry

jobs = Registry()

LEDGER_CONNECT_TIMEOUT_SECONDS = 5

LEDGER_DDL = """
CREATE SCHEMA IF NOT EXISTS soak;
CREATE TABLE IF NOT EXISTS soak.ledger (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id   bigint      NOT NULL,
    token    uuid        NOT NULL,
    attempt  integer     NOT NULL,
    phase    text        NOT NULL CHECK (phase IN ('start', 'return')),
    pid      integer     NOT NULL,
    at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS ledger_job_idx ON soak.ledger (job_id);
"""

_local = threading.local()


def _connection() -> psycopg.Connection[Any]:
    """One connection per worker thread, opened again after a database restart broke it."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(
            os.environ["DATABASE_URL"],
            autocommit=True,
            connect_timeout=LEDGER_CONNECT_TIMEOUT_SECONDS,
            application_name="soak-ledger",
        )
        _local.conn = conn
    return conn


def record(job: Job, phase: str) -> None:
    _connection().execute(
        "INSERT INTO soak.ledger (job_id, token, attempt, phase, pid) VALUES (%s, %s, %s, %s, %s)",
        (job.id, job.attempt_token, job.attempt, phase, os.getpid()),
    )


@jobs.job("noop")
def noop(job: Job) -> None:
    record(job, "start")
    record(job, "return")


@jobs.job("nap")
def nap(job: Job) -> None:
    """Sleeps payload["ms"] milliseconds, without looking at its lease: the fence alone must
    keep a late result out."""
    record(job, "start")
    time.sleep(float(job.payload.get("ms", 10)) / 1000.0)
    record(job, "return")


@jobs.job("flaky")
def flaky(job: Job) -> None:
    """Fails its first payload["failures"] attempts, then succeeds."""
    record(job, "start")
    if job.attempt <= int(job.payload.get("failures", 1)):
        raise RuntimeError(f"flaky failure on attempt {job.attempt}")
    record(job, "return")
