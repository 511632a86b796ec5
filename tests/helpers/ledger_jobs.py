"""Job kinds the drain tests use. Each records what happened in public.ledger (job id, attempt
token, phase) through its own connection, so a test can see every attempt that ran."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

import psycopg

from pgdrain import Job, Registry

jobs = Registry()
LEDGER_URL_VARIABLE = "PGDRAIN_TEST_LEDGER_URL"

LEDGER_TABLE = """
CREATE TABLE IF NOT EXISTS public.ledger (
    id        bigserial   PRIMARY KEY,
    job_id    bigint      NOT NULL,
    token     uuid        NOT NULL,
    attempt   integer     NOT NULL,
    phase     text        NOT NULL,
    detail    text,
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
)"""

_local = threading.local()
_opened: list[psycopg.Connection[Any]] = []  # closed by close_connections() at test teardown


def _ledger() -> psycopg.Connection[Any]:
    url = os.environ[LEDGER_URL_VARIABLE]
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or getattr(_local, "url", None) != url:
        conn = psycopg.connect(url, autocommit=True)
        _local.conn, _local.url = conn, url
        _opened.append(conn)
    return conn


def close_connections() -> None:
    while _opened:
        _opened.pop().close()


def record(job: Job, phase: str, detail: str | None = None) -> None:
    _ledger().execute(
        "INSERT INTO public.ledger (job_id, token, attempt, phase, detail)"
        " VALUES (%s, %s, %s, %s, %s)",
        (job.id, job.attempt_token, job.attempt, phase, detail),
    )


@jobs.job("noop")
def noop(job: Job) -> None:
    pass


@jobs.job("ledger")
def ledger(job: Job) -> None:
    record(job, "return")


@jobs.job("slow")
def slow(job: Job) -> None:
    """Works payload["seconds"] (only on the attempts listed in payload["slow_attempts"], if
    given), without looking at its lease: the runner's fence must protect the outcome."""
    record(job, "start")
    slow_attempts = job.payload.get("slow_attempts")
    if slow_attempts is None or job.attempt in slow_attempts:
        finish = time.monotonic() + float(job.payload["seconds"])
        while time.monotonic() < finish:
            time.sleep(0.02)
    record(job, "return")


@jobs.job("hold_gil")
def hold_gil(job: Job) -> None:
    """Holds the GIL for payload["seconds"]: a call through ctypes.PyDLL keeps it (here libc's
    sleep), as a C extension that never releases it would, so no other thread of the process
    runs meanwhile, the run's own loop included."""
    record(job, "start")
    ctypes.PyDLL(None).sleep(int(job.payload["seconds"]))
    record(job, "return")


@jobs.job("observe_sessions")
def observe_sessions(job: Job) -> None:
    """While this job runs, record the state of every pgdrain session on the server."""
    rows = (
        _ledger()
        .execute(
            "SELECT coalesce(string_agg(state, ',' ORDER BY pid), '') FROM pg_stat_activity"
            " WHERE application_name = 'pgdrain' AND datname = current_database()"
        )
        .fetchone()
    )
    record(job, "sessions", rows[0] if rows else "")


@jobs.job("die")
def die(job: Job) -> None:
    """Kills its own process on every attempt: a poison job."""
    record(job, "start")
    os._exit(17)
