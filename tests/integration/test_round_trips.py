"""One round trip per one-statement operation (session.py): BEGIN, the limits, the statement
and COMMIT go out in one pipeline sync, beside the control, the same operation not marked,
which takes a round trip for each. Counted from libpq's protocol trace: each ReadyForQuery the
server sends ends one exchange."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgdrain import Budget, Settings, enqueue, store
from pgdrain.session import Session

Conn = psycopg.Connection[Any]


def round_trips(session: Session, operation: Callable[..., Any], *args: Any) -> tuple[int, Any]:
    conn = session._conn
    assert conn is not None
    with tempfile.NamedTemporaryFile("w", prefix="pgdrain-trace-") as handle:
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            result = session.run(operation, *args)
        finally:
            conn.pgconn.untrace()  # flushes libpq's trace buffer
        lines = Path(handle.name).read_text().splitlines()
    messages = [line.split("\t") for line in lines]
    return sum(1 for m in messages if m[0] == "B" and m[2:3] == ["ReadyForQuery"]), result


@pytest.fixture
def session(db_url: str) -> Any:
    session = Session(db_url, Settings(), Budget.seconds(60))
    session.open()
    yield session
    session.close()


def test_a_one_statement_operation_takes_one_round_trip(session: Session, conn: Conn) -> None:
    enqueue(conn, "k")

    @store.one_statement
    def marked(c: Conn) -> bool:
        return store.queue_has_ready(c, ["default"])

    def control(c: Conn) -> bool:  # the same statement, not marked
        return store.queue_has_ready(c, ["default"])

    assert round_trips(session, marked) == (1, True)
    assert round_trips(session, control) == (4, True)  # BEGIN, limits, statement, COMMIT


def test_its_transaction_keeps_the_limits_and_read_committed(session: Session, conn: Conn) -> None:
    database = sql.Identifier(conn.info.dbname)
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = 'serializable'").format(
            database
        )
    )
    session.close()
    session.open()  # a new backend, which reads the database's default

    @store.one_statement
    def settings(c: Conn) -> tuple[str, str, str]:
        row = c.execute(
            "SELECT current_setting('transaction_isolation'), current_setting('statement_timeout'),"
            " current_setting('lock_timeout')"
        ).fetchone()
        assert row is not None
        return row[0], row[1], row[2]

    isolation, statement_timeout, lock_timeout = session.run(settings)
    assert isolation == "read committed"
    assert statement_timeout == lock_timeout and statement_timeout.endswith("s")
    assert statement_timeout != "0"


def test_a_failed_statement_is_rolled_back_and_the_connection_stays_usable(
    session: Session, conn: Conn
) -> None:
    job_id = enqueue(conn, "k")

    @store.one_statement
    def fails(c: Conn) -> None:
        c.execute(
            "UPDATE pgdrain.jobs SET priority = priority + 1 WHERE id = %(id)s"
            " RETURNING 1 / (priority - priority)",
            {"id": job_id},
        )

    with pytest.raises(psycopg.errors.DivisionByZero):
        session.run(fails)
    assert session.run(store.queue_has_ready, ["default"]) is True
    row = conn.execute("SELECT priority FROM pgdrain.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None and row[0] == 0  # the update did not commit


def test_an_operation_marked_wrongly_is_refused_before_its_second_statement(
    session: Session,
) -> None:
    @store.one_statement
    def two(c: Conn) -> None:
        c.execute("SELECT 1")
        c.execute("SELECT 2")

    with pytest.raises(AssertionError, match="second statement"):
        session.run(two)


def test_a_run_exits_in_one_round_trip(session: Session, conn: Conn) -> None:
    """The exit check and the exit are one statement (store.run_exit), decided in SQL: the kick
    rows are locked, read and cleared, and the run unregistered, in the round trip that asks."""
    from pgdrain.aws import events
    from pgdrain.aws.control import RunControl
    from pgdrain.aws.wake import Waker

    budget = Budget.seconds(60)
    control = RunControl(
        events.Trigger("enqueue", ("emails",)),
        "run-exiting",
        budget,
        waker=Waker(Settings(queues=("emails",)), None),
    )
    session.run(store.run_register, "run-exiting", ["emails"], 0, 60, hold_seconds=10)

    trips, decision = round_trips(session, control._exit_or_again, True)

    assert (trips, decision.again, decision.check.exited) == (1, False, True)
    assert conn.execute("SELECT count(*) FROM pgdrain.runs").fetchone() == (0,)


def test_a_run_registers_in_the_round_trip_of_its_reclaim(session: Session, conn: Conn) -> None:
    """Registration and the queue-limit sync are read by no one: they go with the next
    statement (Session.send_with_next), each in a transaction of its own, in its round trip."""
    session.send_with_next(store.run_register, "run-starting", ["emails"], 0, 60)
    session.send_with_next(store.queue_limit_sync, ["emails"], [("emails", 2)])

    trips, reclaimed = round_trips(session, store.job_reclaim_expired, 100)

    assert (trips, reclaimed) == (1, [])
    assert conn.execute("SELECT run_id FROM pgdrain.runs").fetchall() == [("run-starting",)]
    limits = conn.execute("SELECT queue, max_running FROM pgdrain.queue_limits").fetchall()
    assert limits == [("emails", 2)]


def test_what_goes_with_the_next_statement_is_sent_again_after_a_lost_connection(
    session: Session, conn: Conn
) -> None:
    """The connection breaks before the round trip that carries the registration: after the
    reconnect, that round trip carries it."""
    session.send_with_next(store.run_register, "run-reconnecting", ["emails"], 0, 60)
    broken = session._conn
    assert broken is not None
    conn.execute(
        "SELECT pg_terminate_backend(%s)", (broken.info.backend_pid,)
    )  # the server ends the run's connection

    assert session.run(store.job_reclaim_expired, 100) == []

    assert conn.execute("SELECT run_id FROM pgdrain.runs").fetchall() == [("run-reconnecting",)]
