"""Statements sent ahead on one connection (db/pipeline.py's Pipeline), on a connection as the
drain opens it (autocommit, statements prepared: db/connection.py): a second statement goes
out before the first one's reply is read and the server runs both; the replies are read in
order, each statement in a transaction of its own, its rows psycopg's; each statement is
prepared once per connection; and once every reply is read the connection is psycopg's again."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.pq import PipelineStatus

from helpers.fixtures import statuses, wait_for
from pgdrain import Budget, Settings, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.db import connection, store
from pgdrain.db.pipeline import Pipeline
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]


@pytest.fixture
def drain_conn(db_url: str) -> Iterator[Conn]:
    """The test's database, connected as the drain connects (PGDRAIN_POOLER=session)."""
    with connection.connect(db_url, Settings(), Budget.seconds(30)) as conn:
        assert conn.autocommit and conn.prepare_threshold is not None
        yield conn


def _claim(limit: int) -> store.Statement[Any]:
    return store.job_complete_and_claim_statement([], ["default"], limit, "w", 30.0, 30.0, None)


def _send(pipeline: Pipeline, statement: store.Statement[Any]) -> None:
    pipeline.send(statement.text, statement.params)


def _prepared(conn: Conn) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'pgdrain_ahead_%' ORDER BY 1"
    ).fetchall()
    return [name for (name,) in rows]


def test_two_claims_go_out_before_either_reply_is_read(conn: Conn, drain_conn: Conn) -> None:
    enqueue_many(conn, [build_job("k") for _ in range(5)])
    pipeline = Pipeline(drain_conn)

    _send(pipeline, _claim(2))
    _send(pipeline, _claim(3))
    assert pipeline.unread == 2
    # Seen from another connection: the server has run (and committed) both claims already.
    wait_for(lambda: statuses(conn) == [("running", 1, 5)], what="both claims to commit")

    first = store.complete_and_claim_result(pipeline.read(), [])[1]
    second = store.complete_and_claim_result(pipeline.read(), [])[1]
    assert (len(first), len(second), pipeline.unread) == (2, 3, 0)
    assert len({job.id for job in first + second}) == 5

    assert drain_conn.pgconn.pipeline_status != PipelineStatus.OFF
    pipeline.leave()
    assert drain_conn.pgconn.pipeline_status == PipelineStatus.OFF
    assert drain_conn.execute("SELECT 1").fetchone() == (1,)  # psycopg's connection again


def test_a_statement_is_prepared_once_under_a_name_of_its_own(conn: Conn, drain_conn: Conn) -> None:
    """In the round trip of its first execution; another statement gets another name."""
    enqueue_many(conn, [build_job("k") for _ in range(3)])
    pipeline = Pipeline(drain_conn)
    for _ in range(3):
        _send(pipeline, _claim(1))
        assert len(pipeline.read()) == 1
    pipeline.send(query("queue_has_ready"), {"queues": ["default"]})
    assert pipeline.read() == [(False,)]
    pipeline.leave()

    assert _prepared(drain_conn) == ["pgdrain_ahead_0", "pgdrain_ahead_1"]
    assert statuses(conn) == [("running", 1, 3)]


def test_the_rows_are_psycopgs_value_for_value(drain_conn: Conn) -> None:
    statement = (
        "SELECT %(n)s::bigint, %(token)s::uuid, %(at)s::timestamptz, %(ids)s::bigint[],"
        " '{\"a\": [1, null]}'::jsonb, NULL::text, 'x'::text"
    )
    params = {
        "n": 2**40,
        "token": uuid.uuid4(),
        "at": dt.datetime(2026, 12, 1, 4, 14, 5, 123456, tzinfo=dt.UTC),
        "ids": [1, 2, 3],
    }
    pipeline = Pipeline(drain_conn)
    pipeline.send(statement, params)
    rows = pipeline.read()
    pipeline.leave()

    assert rows == drain_conn.execute(statement, params).fetchall()
    assert rows[0][4] == {"a": [1, None]} and rows[0][1] == params["token"]


def test_a_failed_statement_is_raised_as_its_reply_is_read_and_the_next_one_runs(
    conn: Conn, drain_conn: Conn
) -> None:
    """Each statement is a transaction of its own: the one behind a failure runs and commits."""
    enqueue_many(conn, [build_job("k")])
    pipeline = Pipeline(drain_conn)
    pipeline.send("SELECT 1 / %(zero)s", {"zero": 0})
    _send(pipeline, _claim(1))

    with pytest.raises(psycopg.errors.DivisionByZero):
        pipeline.read()
    assert len(pipeline.read()) == 1
    pipeline.leave()

    assert statuses(conn) == [("running", 1, 1)]
    assert drain_conn.execute("SELECT 1").fetchone() == (1,)


def test_a_statement_whose_prepare_failed_is_prepared_again_at_its_next_send(
    drain_conn: Conn,
) -> None:
    """Not taken for prepared: sent again, it fails as itself again, not as an unknown name."""
    pipeline = Pipeline(drain_conn)
    for _ in range(2):
        pipeline.send("SELECT %(x)s::int FROM no_such_table", {"x": 1})
        with pytest.raises(psycopg.errors.UndefinedTable):
            pipeline.read()
    pipeline.leave()
    assert _prepared(drain_conn) == []
