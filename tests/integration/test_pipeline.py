"""The way every one-statement operation leaves the process (db/pipeline.py's Pipeline), on a
connection as the drain opens it (autocommit, statements prepared: db/connection.py): groups of
statements, one Sync each; a second group goes out before the first one's reply is read and the
server runs both; the replies are read in order, each group a transaction of its own (unless
it says BEGIN and COMMIT), its rows psycopg's; each statement is prepared once per connection
under its own name, or not at all behind a transaction pooler; and once every reply is read
the connection is psycopg's again."""

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
    pipeline.send([(statement.text, statement.params)])


def _rows(pipeline: Pipeline) -> list[Any]:
    """The rows of the oldest group's one statement."""
    (reply,) = pipeline.read()
    return reply.rows


def _prepared(conn: Conn) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'pgdrain_%' ORDER BY 1"
    ).fetchall()
    return [name for (name,) in rows]


def test_two_claims_go_out_before_either_reply_is_read(conn: Conn, drain_conn: Conn) -> None:
    enqueue_many(conn, [build_job("k") for _ in range(5)])
    pipeline = Pipeline(drain_conn, prepare=True)

    _send(pipeline, _claim(2))
    _send(pipeline, _claim(3))
    assert pipeline.unread == 2
    # Seen from another connection: the server has run (and committed) both claims already.
    wait_for(lambda: statuses(conn) == [("running", 1, 5)], what="both claims to commit")

    first = store.complete_and_claim_result(_rows(pipeline), [])[1]
    second = store.complete_and_claim_result(_rows(pipeline), [])[1]
    assert (len(first), len(second), pipeline.unread) == (2, 3, 0)
    assert len({job.id for job in first + second}) == 5

    assert drain_conn.pgconn.pipeline_status != PipelineStatus.OFF
    pipeline.leave()
    assert drain_conn.pgconn.pipeline_status == PipelineStatus.OFF
    assert drain_conn.execute("SELECT 1").fetchone() == (1,)  # psycopg's connection again


def test_a_statement_is_prepared_once_under_a_name_of_its_own(conn: Conn, drain_conn: Conn) -> None:
    """In the round trip of its first execution, named after the statement; another
    statement gets another name."""
    enqueue_many(conn, [build_job("k") for _ in range(3)])
    pipeline = Pipeline(drain_conn, prepare=True)
    for _ in range(3):
        _send(pipeline, _claim(1))
        assert len(_rows(pipeline)) == 1
    pipeline.send([(query("queue_has_ready"), {"queues": ["default"]})])
    assert _rows(pipeline) == [(False,)]
    pipeline.leave()

    assert _prepared(drain_conn) == [
        "pgdrain_job_complete_and_claim_0",
        "pgdrain_queue_has_ready_1",
    ]
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
    pipeline = Pipeline(drain_conn, prepare=True)
    pipeline.send([(statement, params)])
    rows = _rows(pipeline)
    pipeline.leave()

    assert rows == drain_conn.execute(statement, params).fetchall()
    assert rows[0][4] == {"a": [1, None]} and rows[0][1] == params["token"]


def test_a_failed_statement_is_raised_as_its_reply_is_read_and_the_next_one_runs(
    conn: Conn, drain_conn: Conn
) -> None:
    """Each statement is a transaction of its own: the one behind a failure runs and commits."""
    enqueue_many(conn, [build_job("k")])
    pipeline = Pipeline(drain_conn, prepare=True)
    pipeline.send([("SELECT 1 / %(zero)s", {"zero": 0})])
    _send(pipeline, _claim(1))

    with pytest.raises(psycopg.errors.DivisionByZero):
        pipeline.read()
    assert len(_rows(pipeline)) == 1
    pipeline.leave()

    assert statuses(conn) == [("running", 1, 1)]
    assert drain_conn.execute("SELECT 1").fetchone() == (1,)


def test_a_reply_this_client_cannot_read_is_raised_as_itself_and_the_next_one_runs(
    conn: Conn, drain_conn: Conn
) -> None:
    """A value psycopg cannot hold (a timestamp past the year 9999) fails its statement's reply
    as a DataError once the group is read; the statements behind it ran, and the connection
    is the next group's (it was left busy, and every later statement failed with `cannot exit
    pipeline mode while busy`)."""
    enqueue_many(conn, [build_job("k")])
    pipeline = Pipeline(drain_conn, prepare=True)
    pipeline.send([("SELECT CAST(%(at)s AS timestamptz)", {"at": "infinity"})])
    _send(pipeline, _claim(1))

    with pytest.raises(psycopg.DataError, match="too large"):
        pipeline.read()
    assert len(_rows(pipeline)) == 1
    pipeline.leave()

    assert statuses(conn) == [("running", 1, 1)]
    assert drain_conn.execute("SELECT 1").fetchone() == (1,)


def test_a_statement_whose_prepare_failed_is_prepared_again_at_its_next_send(
    drain_conn: Conn,
) -> None:
    """Not taken for prepared: sent again, it fails as itself again, not as an unknown name."""
    pipeline = Pipeline(drain_conn, prepare=True)
    for _ in range(2):
        pipeline.send([("SELECT %(x)s::int FROM no_such_table", {"x": 1})])
        with pytest.raises(psycopg.errors.UndefinedTable):
            pipeline.read()
    pipeline.leave()
    assert _prepared(drain_conn) == []


def test_a_statement_skipped_after_a_failure_is_prepared_at_its_next_send(
    drain_conn: Conn,
) -> None:
    """A statement new to the connection, behind one that fails in its group: its PREPARE is
    skipped with it, so it is not taken for prepared. Sent again alone, it runs (taken for
    prepared, it would fail: no such prepared statement)."""
    pipeline = Pipeline(drain_conn, prepare=True)
    pipeline.send([("SELECT 1 / %(zero)s", {"zero": 0}), ("SELECT %(x)s::int + 1", {"x": 1})])
    with pytest.raises(psycopg.errors.DivisionByZero):
        pipeline.read()
    pipeline.send([("SELECT %(x)s::int + 1", {"x": 1})])
    assert pipeline.read() == [([(2,)], 1)]
    pipeline.leave()


def test_a_group_is_one_sync_and_a_failure_skips_the_rest_of_it(
    conn: Conn, drain_conn: Conn
) -> None:
    """BEGIN, a failing statement, a claim and COMMIT in one group: the claim is not run (the
    pipeline aborts up to the Sync), the group's error is the statement's, and the transaction
    it left open is there to roll back."""
    enqueue_many(conn, [build_job("k")])
    pipeline = Pipeline(drain_conn, prepare=True)
    claim = _claim(1)
    pipeline.send(
        [
            ("BEGIN", None),
            ("SELECT 1 / %(zero)s", {"zero": 0}),
            (claim.text, claim.params),
            ("COMMIT", None),
        ]
    )
    with pytest.raises(psycopg.errors.DivisionByZero):
        pipeline.read()
    pipeline.send([("ROLLBACK", None)])
    assert pipeline.read() == [([], 0)]
    pipeline.leave()
    assert statuses(conn) == [("queued", 0, 1)]


def test_behind_a_transaction_pooler_nothing_is_prepared(conn: Conn, drain_conn: Conn) -> None:
    """Unnamed statements only: a pooler in transaction mode cannot keep a prepared one."""
    enqueue_many(conn, [build_job("k") for _ in range(2)])
    pipeline = Pipeline(drain_conn, prepare=False)
    for _ in range(2):
        _send(pipeline, _claim(1))
        assert len(_rows(pipeline)) == 1
    pipeline.leave()
    assert _prepared(drain_conn) == []
