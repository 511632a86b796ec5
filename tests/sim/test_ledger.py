"""The simulator's ledger: the buffered form (the backlog trace's) writes the same rows as a
statement per row, and nothing added before a flush or a close is left unwritten."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgdrain import Job, enqueue
from sim import jobs

ROWS = "SELECT job_id, attempt, phase, env, run_at FROM pgdrain_sim.ledger ORDER BY id"


@pytest.fixture
def ledger_db(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[psycopg.Connection[Any]]:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv(jobs.ENV_ID_VARIABLE, "env-1")
    with psycopg.connect(db_url, autocommit=True) as conn:
        for statement in jobs.LEDGER_DDL:
            conn.execute(statement)
        yield conn
    jobs.close_ledger()


def _jobs(conn: psycopg.Connection[Any], count: int) -> list[Job]:
    ids = [enqueue(conn, jobs.KIND, {"ms": 0}) for _ in range(count)]
    return [
        Job(i, jobs.KIND, "default", {"ms": 0}, 1, 3, uuid.uuid4(), lambda: 1.0, ()) for i in ids
    ]


def _record_each(claimed: list[Job]) -> None:
    for job in claimed:
        jobs.record(job, "start")
    for job in claimed:
        jobs.record(job, "done")


def test_the_buffered_ledger_writes_the_rows_a_statement_per_row_writes(
    ledger_db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    claimed = _jobs(ledger_db, 3)
    _record_each(claimed)
    each = ledger_db.execute(ROWS).fetchall()
    ledger_db.execute("TRUNCATE pgdrain_sim.ledger")
    monkeypatch.setenv(jobs.LEDGER_VARIABLE, "buffered")

    _record_each(claimed)
    jobs.flush_ledger()

    assert ledger_db.execute(ROWS).fetchall() == each
    assert [row[2] for row in each] == ["start"] * 3 + ["done"] * 3
    assert all(row[3] == "env-1" and row[4] is not None for row in each)


def test_closing_the_buffered_ledger_writes_what_it_holds(
    ledger_db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jobs.LEDGER_VARIABLE, "buffered")
    monkeypatch.setattr(jobs, "FLUSH_EVERY_S", 60.0)  # nothing is written on its own meanwhile
    _record_each(_jobs(ledger_db, 50))

    jobs.close_ledger()

    assert ledger_db.execute("SELECT count(*) FROM pgdrain_sim.ledger").fetchone() == (100,)


def test_a_buffered_row_is_timestamped_when_it_is_added_not_when_it_is_written(
    ledger_db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(jobs.LEDGER_VARIABLE, "buffered")
    monkeypatch.setattr(jobs, "clock", lambda: 1_000_000_000.0)  # 2001-09-09T01:46:40Z
    _record_each(_jobs(ledger_db, 1))
    jobs.flush_ledger()

    ats = ledger_db.execute("SELECT extract(epoch FROM at) FROM pgdrain_sim.ledger").fetchall()
    assert [float(at) for (at,) in ats] == [1_000_000_000.0] * 2
