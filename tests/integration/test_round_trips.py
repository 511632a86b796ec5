"""One round trip per one-statement operation (session.py): BEGIN, the limits, the statement
and COMMIT go out in one pipeline sync, beside the control, the same operation not marked,
which takes a round trip for each. Counted from libpq's protocol trace: each ReadyForQuery the
server sends ends one exchange."""

from __future__ import annotations

import functools
import re
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest
from psycopg import sql

from helpers.fixtures import complete_and_claim
from helpers.protocol import traced_connections
from pgdrain import Budget, Registry, Settings, drain, enqueue
from pgdrain.db import session as session_module
from pgdrain.db import store
from pgdrain.db.session import Session

Conn = psycopg.Connection[Any]


def round_trips(session: Session, operation: Callable[..., Any], *args: Any) -> tuple[int, Any]:
    return traced(session, lambda: session.run(operation, *args))


def traced(session: Session, call: Callable[[], Any]) -> tuple[int, Any]:
    """The round trips `call` makes on the session's connection, and its result."""
    trips, _, result = traced_statements(session, call)
    return trips, result


def traced_statements(session: Session, call: Callable[[], Any]) -> tuple[int, int, Any]:
    """The round trips and the statements `call` makes on the session's connection, and its
    result."""
    messages, result = traced_messages(session, call)
    trips = sum(1 for m in messages if m[0] == "B" and m[2:3] == ["ReadyForQuery"])
    sent = sum(1 for m in messages if m[0] == "F" and m[2:3] in (["Execute"], ["Query"]))
    return trips, sent, result


def traced_messages(session: Session, call: Callable[[], Any]) -> tuple[list[list[str]], Any]:
    """The protocol messages `call` exchanges on the session's connection (libpq's trace: the
    direction, F or B, the length, the message's name...), and its result."""
    conn = session._conn
    assert conn is not None
    with tempfile.NamedTemporaryFile("w", prefix="pgdrain-trace-") as handle:
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            result = call()
        finally:
            conn.pgconn.untrace()  # flushes libpq's trace buffer
        lines = Path(handle.name).read_text().splitlines()
    return [line.split("\t") for line in lines], result


@pytest.fixture
def session(db_url: str) -> Any:
    # Behind a transaction pooler: every transaction carries its limits (the one-statement
    # tests below count what it sends); the connection that keeps them has tests of its own.
    session = Session(db_url, Settings(pooler="transaction"), Budget.seconds(60))
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
    session.run(store.run_register, control.run_id, ["emails"], 0, 60, hold_seconds=10)

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


def test_one_statement_operations_go_through_one_pipeline_of_the_current_connection(
    session: Session, conn: Conn
) -> None:
    """The pipeline (and the statements it prepared) is kept from one round trip to the next;
    each operation still reads only its own rows, and after a reconnect the pipeline is the
    new connection's."""

    def selecting(value: int) -> Callable[[Conn], list[Any]]:
        @store.one_statement
        def select(c: Conn) -> list[Any]:
            return c.execute("SELECT %s::int", (value,)).fetchall()

        return select

    first_rows = session.run(selecting(1))
    first = session._pipeline
    second_rows = session.run(selecting(2))
    assert session._pipeline is first and first is not None
    assert first._conn is session._conn
    assert (first_rows, second_rows) == ([(1,)], [(2,)])

    broken = session._conn
    assert broken is not None
    conn.execute("SELECT pg_terminate_backend(%s)", (broken.info.backend_pid,))
    third_rows = session.run(selecting(3))
    third = session._pipeline
    assert third is not first and third is not None and third._conn is session._conn
    assert session._conn is not broken
    assert third_rows == [(3,)]


def _expire_a_lease(conn: Conn) -> int:
    """A job left running by a run that died: its lease ended a second ago."""
    job_id = enqueue(conn, "k")
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'running', attempts = 1, leased_by = 'gone',"
        " attempt_token = gen_random_uuid(), heartbeat_at = now() - interval '1 minute',"
        " lease_expires_at = now() - interval '1 second'"
        " WHERE id = %s",
        (job_id,),
    )
    return job_id


@pytest.mark.parametrize("together", [True, False], ids=["read with next", "control: alone"])
def test_a_statement_read_with_the_next_one_shares_its_round_trip(
    session: Session, conn: Conn, together: bool
) -> None:
    """The run's reclaim goes with its first claim (Session.read_with_next): both results come
    back in one round trip, in order (what the reclaim queued again is there for the next
    statement). The control sends the reclaim as an operation of its own: two round trips."""
    job_id = _expire_a_lease(conn)

    if together:
        later = session.read_with_next(store.job_reclaim_expired_statement(100))
        assert not later.received  # nothing is sent before the next operation
        trips, ready = round_trips(session, store.queue_has_ready, ["default"])
        reclaimed = later.value()
    else:
        first, reclaimed = round_trips(session, store.job_reclaim_expired, 100)
        second, ready = round_trips(session, store.queue_has_ready, ["default"])
        trips = first + second

    assert (trips, ready) == ((1 if together else 2), True)
    assert [(r.id, r.status) for r in reclaimed] == [(job_id, "queued")]


def test_a_statement_read_with_the_next_is_sent_again_after_a_lost_connection(
    session: Session, conn: Conn
) -> None:
    job_id = _expire_a_lease(conn)
    later = session.read_with_next(store.job_reclaim_expired_statement(100))
    broken = session._conn
    assert broken is not None
    conn.execute("SELECT pg_terminate_backend(%s)", (broken.info.backend_pid,))

    assert session.run(store.queue_has_ready, ["default"]) is True

    assert [r.id for r in later.value()] == [job_id]


def test_what_waits_for_a_next_statement_can_be_sent_alone(session: Session, conn: Conn) -> None:
    """A run that stops before its first claim still sends its reclaim (Session.send_pending)."""
    job_id = _expire_a_lease(conn)
    later = session.read_with_next(store.job_reclaim_expired_statement(100))

    trips, _ = traced(session, session.send_pending)

    assert trips == 1 and [r.id for r in later.value()] == [job_id]
    trips, _ = traced(session, session.send_pending)
    assert trips == 0  # nothing left to send


def test_a_drain_of_an_empty_queue_takes_one_round_trip(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reclaim and the first claim go together; with nothing claimed the drain ends."""
    with traced_connections(monkeypatch) as round_trips_of:
        result = drain(Settings(), Budget.seconds(30), Registry(), db_url)
        assert round_trips_of() == [1]

    assert result.stop_reason == "empty" and result.error is None


def test_a_job_whose_lease_expired_is_reclaimed_and_run_by_the_next_run(
    db_url: str, conn: Conn
) -> None:
    """The reclaim rides on the first claim, before it: that claim takes the job back."""
    job_id = _expire_a_lease(conn)
    registry = Registry()
    registry.job("k")(lambda job: None)

    result = drain(Settings(), Budget.seconds(30), registry, db_url)

    assert (result.reclaimed, result.claimed, result.done) == (1, 1, 1)
    row = conn.execute("SELECT status, attempts FROM pgdrain.jobs WHERE id = %s", (job_id,))
    assert row.fetchone() == ("done", 2)


@pytest.mark.parametrize("pooler", ["session", "transaction"], ids=["alone", "in its transaction"])
@pytest.mark.parametrize("called", ["while_sent", "before"], ids=["on the wire", "control: before"])
def test_work_given_with_a_statement_runs_while_the_server_runs_that_statement(
    db_url: str,
    conn: Conn,
    pooler: Literal["session", "transaction"],
    called: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the drain does while its claim is on the wire (starting the prefetched jobs) runs
    once the server has the statement: here a statement that waits on an advisory lock this
    test holds, so the server is seen running it (waiting in pg_locks) from inside the
    callback. The control calls the same callback just before the statement, as the drain
    started its jobs before: the server has nothing to run yet. (The limits a connection
    keeps go with a first statement: they stay fresh for the rest of the test.)"""
    monkeypatch.setattr(session_module, "KEEP_SECONDS", 60.0)
    session = Session(db_url, Settings(pooler=pooler), Budget.seconds(3600))
    session.open()
    assert session.run(store.queue_has_ready, ["default"]) is False
    key = 715_004
    conn.execute("SELECT pg_advisory_lock(%s)", (key,))
    seen: list[bool] = []

    @store.one_statement
    def waits(c: Conn) -> int:
        row = c.execute("SELECT pg_advisory_xact_lock(%s)::text IS NULL", (key,)).fetchone()
        return 1 if row else 0

    def look() -> None:
        assert session._conn is not None
        seen.append(_waits_on_advisory_lock(conn, session._conn.info.backend_pid, called))
        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    try:
        if called == "before":
            look()
            got = session.run_recovering(waits, waits)
        else:
            got = session.run_recovering(waits, waits, while_sent=look)
        assert got == 1
        assert session.run(store.queue_has_ready, ["default"]) is False  # still usable
    finally:
        session.close()

    assert seen == [called == "while_sent"]


@pytest.mark.parametrize("pooler", ["session", "transaction"], ids=["alone", "in its transaction"])
def test_an_error_in_work_done_while_a_statement_is_out_leaves_the_connection_usable(
    db_url: str,
    conn: Conn,
    pooler: Literal["session", "transaction"],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Work done while a statement is out (the drain's hand-over of prefetched jobs) that
    raises: the pipeline reads the statement's reply before the error leaves it, so the
    statement has done all it does (here it committed its insert) and the connection takes
    the next one; then the error is raised."""
    conn.execute("CREATE TABLE marks (n int)")
    session = _session_sending_alone(db_url, monkeypatch, pooler)

    @store.one_statement
    def mark(c: Conn) -> int:
        return len(c.execute("INSERT INTO public.marks VALUES (1) RETURNING n").fetchall())

    try:
        with pytest.raises(RuntimeError, match="can't start new thread"):
            session.run_recovering(mark, mark, while_sent=_thread_start_fails)
        assert session.run(store.queue_has_ready, ["default"]) is False
    finally:
        session.close()
    assert conn.execute("SELECT count(*) FROM marks").fetchone() == (1,)


@pytest.mark.parametrize("rolled_back", [True, False], ids=["rolled back", "control: left"])
def test_an_error_in_work_done_while_a_failing_statement_is_out_leaves_the_connection_usable(
    db_url: str, rolled_back: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both fail, in an explicit transaction (behind a transaction pooler): the work's error
    is raised (the statement's as its cause), and the transaction the failed statement left
    open (its COMMIT skipped) is rolled back, so the connection takes the next statement. The
    control leaves it open: the next statement is refused."""
    session = _session_sending_alone(db_url, monkeypatch, "transaction")
    if not rolled_back:
        monkeypatch.setattr(store, "transaction_rollback", lambda conn: None)

    @store.one_statement
    def divides(c: Conn) -> int:
        return len(c.execute("SELECT 1 / 0").fetchall())

    try:
        with pytest.raises(RuntimeError, match="can't start new thread") as raised:
            session.run_recovering(divides, divides, while_sent=_thread_start_fails)
        assert isinstance(raised.value.__cause__, psycopg.errors.DivisionByZero)
        if rolled_back:
            assert session.run(store.queue_has_ready, ["default"]) is False
        else:
            with pytest.raises(psycopg.errors.InFailedSqlTransaction):
                session.run(store.queue_has_ready, ["default"])
    finally:
        session.close()


def _session_sending_alone(
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    pooler: Literal["session", "transaction"] = "session",
) -> Session:
    """A session whose one-statement operations go alone (behind no pooler: the limits its
    connection keeps sent with a first statement and fresh for the rest of the test), or,
    behind a transaction pooler, each in a transaction of its own."""
    monkeypatch.setattr(session_module, "KEEP_SECONDS", 60.0)
    session = Session(db_url, Settings(pooler=pooler), Budget.seconds(3600))
    session.open()
    assert session._conn is not None
    assert session.run(store.queue_has_ready, ["default"]) is False
    return session


def _thread_start_fails() -> None:
    """Work done while a statement is out that fails, as handing a job to a pool that cannot
    start a thread does."""
    raise RuntimeError("can't start new thread")


def _waits_on_advisory_lock(conn: Conn, pid: int, called: str) -> bool:
    """Whether backend `pid` comes to wait on an advisory lock, looked for up to 5 s (the
    control, where it never can, looks once: nothing has been sent to wait)."""
    deadline = time.monotonic() + (5.0 if called == "while_sent" else 0.0)
    while True:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
            " AND NOT granted",
            (pid,),
        ).fetchone()
        if row is not None and row[0] > 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


@store.one_statement
def _limits(c: Conn) -> tuple[str, str, str, str, str]:
    row = c.execute(
        "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),"
        " current_setting('transaction_isolation'), current_setting('plan_cache_mode'),"
        " current_setting('jit') || ' ' || current_setting('enable_sort')"
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2], row[3], row[4]


def _ms(setting: str) -> float:
    value = float(re.sub(r"[a-z]+$", "", setting))
    return value * {"ms": 1, "s": 1000, "min": 60_000}[re.sub(r"^[0-9.]+", "", setting)]


@pytest.mark.parametrize("pooler", ["session", "transaction"], ids=["keeps", "control: pooler"])
def test_a_connection_of_its_own_keeps_its_limits_and_sends_each_statement_alone(
    db_url: str, conn: Conn, pooler: Literal["session", "transaction"]
) -> None:
    """The first statement sends the limits the connection keeps (BEGIN, them, it, COMMIT);
    the next goes alone, its own implicit transaction, and still runs under them: READ
    COMMITTED whatever the database's default, bounded by the budget, without JIT, without an
    explicit sort where an index gives the order, and on generic plans. Behind
    a transaction pooler (the control) every statement carries its transaction's."""
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = 'serializable'").format(
            sql.Identifier(conn.info.dbname)
        )
    )
    session = Session(db_url, Settings(pooler=pooler), Budget.seconds(60))
    session.open()
    try:
        first_trips, first_sent, first = traced_statements(session, lambda: session.run(_limits))
        trips, sent, second = traced_statements(session, lambda: session.run(_limits))
    finally:
        session.close()

    assert (first_trips, trips) == (1, 1)
    assert (first_sent, sent) == ((4, 1) if pooler == "session" else (4, 4))
    for timeout, lock_timeout, isolation, plans, jit_and_sort in (first, second):
        assert isolation == "read committed"
        assert timeout == lock_timeout and 0 < _ms(timeout) <= 59_500
        assert (plans, jit_and_sort) == ("force_generic_plan", "off off")


def test_the_kept_limit_is_sent_again_when_the_budget_falls_below_it(db_url: str) -> None:
    left = [60.0]
    session = Session(db_url, Settings(), Budget(lambda: left[0]))
    session.open()
    try:
        long = _ms(session.run(_limits)[0])
        left[0] = 5.0  # less left than the limit the connection keeps
        short = _ms(session.run(_limits)[0])
        same = _ms(session.run(_limits)[0])
    finally:
        session.close()

    assert 58_000 <= long <= 59_000  # 60 s less the final margin and the keep interval
    assert short <= 4_500 and same == short


def test_after_a_failed_statement_the_limits_are_sent_again(db_url: str, conn: Conn) -> None:
    """A statement that fails may roll back the transaction that set them: the next one sends
    them again, so the connection never runs on limits it was not sent."""
    session = Session(db_url, Settings(), Budget.seconds(60))
    session.open()

    @store.one_statement
    def fails(c: Conn) -> None:
        c.execute("SELECT 1 / 0")

    try:
        session.run(_limits)
        with pytest.raises(psycopg.errors.DivisionByZero):
            session.run(fails)
        trips, sent, (timeout, _, isolation, _, _) = traced_statements(
            session, lambda: session.run(_limits)
        )
    finally:
        session.close()

    assert (trips, sent) == (1, 4)  # BEGIN, the limits, the statement, COMMIT
    assert isolation == "read committed" and 0 < _ms(timeout) <= 59_500


@pytest.mark.parametrize("through", ["pipeline", "cursor"], ids=["pipeline", "control: cursor"])
def test_every_claim_is_one_round_trip_also_the_one_that_prepares_it(
    db_url: str, conn: Conn, through: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a connection that keeps its limits the claims go alone, one round trip each: the
    pipeline prepares a statement in the round trip of its first execution (and again for a
    new set of parameter types). The control executes them on psycopg's own cursor, which
    prepares a statement at its sixth execution in a round trip of its own. (The first claim
    sends the limits the connection keeps; they stay fresh for the rest of the test.)"""
    monkeypatch.setattr(session_module, "KEEP_SECONDS", 60.0)
    with conn.transaction():
        for _ in range(100):
            enqueue(conn, "k")
    session = Session(db_url, Settings(), Budget.seconds(3600))
    session.open()
    held: list[store.Held] = []
    trips = []
    try:
        for _ in range(16):

            @store.one_statement
            def claim(c: Conn, held: list[store.Held] = held) -> list[store.ClaimedJob]:
                made = complete_and_claim(c, held, ("default",), 5, "w", 30.0, None, uuid.uuid4())
                return made[1]

            assert session._conn is not None
            on_cursor = functools.partial(claim, session._conn)
            messages, claimed = traced_messages(
                session,
                functools.partial(session.run, claim) if through == "pipeline" else on_cursor,
            )
            trips.append(sum(1 for m in messages if m[0] == "B" and m[2:3] == ["ReadyForQuery"]))
            held = [job.held for job in claimed]
    finally:
        session.close()

    if through == "pipeline":
        assert trips == [1] * 16
    else:
        # The first through the session sent the limits; after it, the seventh is the sixth
        # with completions (the first completed none: an empty list, parameter types of its
        # own), which psycopg prepares in a round trip alone.
        assert trips == [1] * 6 + [2] + [1] * 9
