"""The run's one connection. Each operation runs in a transaction of its own, READ COMMITTED
(the claim's SKIP LOCKED and the fenced updates rely on it), its statement_timeout and
lock_timeout no longer than what is left of the budget less the final margin, set local to the
transaction so that nothing outlives it behind a pooler.

An operation marked store.one_statement goes in one round trip: BEGIN, the limits, its
statement and COMMIT with one Sync, through libpq's pipeline (db/pipeline.py): every
one-statement operation leaves the process that one way.
Statements whose result is read later (`send_with_next`, `read_with_next`: the registration,
the first reclaim) ride in the next round trip, each in a transaction of its own; only
statements safe to repeat, since a broken connection sends them again. Other operations run
their statements one after another inside one transaction.

On a connection of its own (PGDRAIN_POOLER=session, the default) the connection keeps the
limits (store.session_limits), sent again at least every KEEP_SECONDS, after an error and a
reconnect, and at every statement near the end; a one-statement operation then goes alone as
its own implicit transaction, prepared in the round trip of its first execution. Work to do
while a statement is out (`while_sent`) is done once it has been sent, before its reply is
read. Claims may be pipelined there
(runner/pipelining.py, db/pipeline.py), with the kept limits halved (may_send_ahead); every
reply still owed is read before any other statement (`settle`). A broken connection is
reconnected within the budget and the statement tried once more. A transaction cancelled at
its BEGIN or limits (the role's own statement_timeout, before the run's limits take effect)
is sent again. Why: docs/decisions/0005 and 0008."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, LiteralString, NamedTuple, TypeVar, cast

import psycopg
from psycopg.pq import TransactionStatus

from pgdrain.budget import FINAL_MARGIN_SECONDS, Budget
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import connection, store
from pgdrain.db.connection import one_line
from pgdrain.db.pipeline import Pipeline, Reply, Row, Statement
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")

# The shortest limit a statement gets, however little budget is left: 0 would mean no limit.
MIN_TIMEOUT_MS = 50
# PostgreSQL's largest statement_timeout and lock_timeout (an int of ms, about 24.8 days): a
# longer budget's limit is this one.
MAX_TIMEOUT_MS = 2**31 - 1
# How long a connection keeps the limits it was sent before they are sent again.
KEEP_SECONDS = 0.5
# A statement sent ahead is sent only while the kept limits stay fresh this much longer
# (Session.may_send_ahead): the check and the send are a few calls apart.
SEND_AHEAD_SLACK_SECONDS = 0.01
# A transaction cancelled at its BEGIN or limits (Session._resend_cut_setup) is sent this many
# times at most.
SETUP_CUT_TRIES = 3
# Tries of a statement ended to break a deadlock (resend_deadlocked).
DEADLOCK_TRIES = 3
# What migration 0021's trigger jobs_flow_finished says when a job it finished made others
# ready (a sequence's next job, dependents).
MADE_READY_NOTICE = "pgdrain: jobs made ready"


def ready_queues(diag: psycopg.errors.Diagnostic) -> list[str]:
    """The queues of the jobs a MADE_READY_NOTICE says were made ready (its detail); none for
    any other notice."""
    if diag.message_primary != MADE_READY_NOTICE:
        return []
    return [q for q in (diag.message_detail or "").split(",") if q]


def statement_limit_ms(remaining: float) -> int:
    """The statement and lock limit for a transaction started with `remaining` seconds of
    budget left: that less the final margin (Session, retention), at most PostgreSQL's own
    maximum."""
    # Inside the final margin (the run's last flush) a statement may use what is left.
    left = max(remaining - FINAL_MARGIN_SECONDS, min(remaining, FINAL_MARGIN_SECONDS))
    return min(MAX_TIMEOUT_MS, max(MIN_TIMEOUT_MS, round(left * 1000)))


class Later(Generic[T]):
    """The result of a statement sent with another one: there once that round trip is back."""

    def __init__(self) -> None:
        self._received = False
        self._value: T | None = None

    @property
    def received(self) -> bool:
        return self._received

    def value(self) -> T:
        assert self._received, "its round trip has not been made yet"
        return cast(T, self._value)

    def _receive(self, value: T) -> None:
        self._value, self._received = value, True


class WithNext(NamedTuple):
    """A statement that goes with the next round trip, in a transaction of its own."""

    send: Callable[[psycopg.Connection[Any]], psycopg.Cursor[Any] | None]
    receive: Callable[[psycopg.Cursor[Any]], None] | None = None  # None: nobody reads it
    limit_ms: int | None = None  # a tighter statement and lock limit than its round trip's

    def delivered(self, cursor: psycopg.Cursor[Any] | None) -> None:
        if self.receive is not None and cursor is not None:
            self.receive(cursor)


class Session:
    def __init__(
        self,
        conninfo: str,
        settings: Settings,
        budget: Budget,
        *,
        lease_seconds_left: Callable[[], float | None] | None = None,
        on_reconnect: Callable[[], None] | None = None,
        pipelining: bool = False,
        controls: Controls = ALL_ON,
    ) -> None:
        self._conninfo = conninfo
        self._settings = settings
        self._budget = budget
        self._limit_to_budget = limit_to_budget = controls.limit_statements_to_budget
        self._read_committed = read_committed = controls.pin_read_committed
        self._resend_cut = controls.resend_a_transaction_cut_at_its_limits
        self._resend_deadlocked = controls.resend_a_deadlocked_statement
        self._conn: psycopg.Connection[Any] | None = None
        # While the run holds leases, a reconnect may not outlast them: the heartbeat cannot
        # run until it succeeds, and a lease that expires meanwhile lets another run start the
        # job while ours still runs it. None: the whole budget.
        self._lease_seconds_left = lease_seconds_left if controls.reconnect_within_leases else None
        self._on_reconnect = [] if on_reconnect is None else [on_reconnect]
        self._with_next: list[WithNext] = []
        # Every one-statement operation's way out (pipeline.py), on this connection; and what
        # reads the claims sent ahead, called before any other statement goes out (settle_with).
        self._pipeline: Pipeline | None = None
        self._made_ready = False
        self._settle: Callable[[], None] | None = None
        # A session whose statements are pipelined keeps half the limits: see may_send_ahead.
        self._halve_kept_limits = pipelining and controls.halve_limits_when_pipelining
        # None: every transaction carries its limits (a transaction pooler).
        self._kept = (
            _KeptLimits()
            if settings.pooler == "session" and limit_to_budget and read_committed
            else None
        )

    def open(self) -> None:
        self._conn = self._connect()

    def _on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary == MADE_READY_NOTICE:
            self._made_ready = True

    def take_made_ready(self) -> bool:
        """Whether a statement since the last call finished a job that made others ready
        (migration 0021's trigger says so): the claim in that statement could not see them."""
        made_ready, self._made_ready = self._made_ready, False
        return made_ready

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def on_reconnect(self, call: Callable[[], None]) -> None:
        """`call` runs after each reconnect, after those added before it (the run's heartbeat:
        due at once; its claims' positions: dropped)."""
        self._on_reconnect.append(call)

    def settle_with(self, settle: Callable[[], None]) -> None:
        """`settle` reads every statement sent ahead (send_ahead): the session calls it before
        any other statement goes out, so that the connection is psycopg's again."""
        self._settle = settle

    def settle(self) -> None:
        """Read every statement sent ahead (settle_with's), if any is unread."""
        if self.ahead_unread():
            assert self._settle is not None, "statements sent ahead need settle_with"
            self._settle()

    def may_send_ahead(self) -> bool:
        """Whether a statement may go out now behind one whose reply is not read yet: on a
        connection that keeps its limits, sent less than KEEP_SECONDS ago and not near the end,
        that prepares its statements, with nothing waiting to go with the next round trip.

        Why it still ends by the final margin: it starts when the one before it ends, and that
        one had started by the time the reply before it was read, before this one was sent
        (the run reads one reply for each statement it sends ahead), give or take the server's
        own scheduling. Each may run as long as the kept limit, which is sent as half of what
        will be left KEEP_SECONDS later, less the final margin (`halve_kept_limits`): both end
        by the final margin. With the whole of it, a claim behind one that waited on a lock
        until its limit could wait as long again, past the deadline."""
        conn, kept = self._conn, self._kept
        if kept is None or conn is None or conn.closed or self._with_next:
            return False
        if conn.prepare_threshold is None:
            return False
        remaining = self._budget.remaining()
        if remaining - KEEP_SECONDS <= FINAL_MARGIN_SECONDS:
            return False  # near the end every statement sends its limits: none goes ahead
        # Fresh a moment from now too: the statement goes out a few microseconds after this.
        return kept.fresh(
            time.monotonic() + SEND_AHEAD_SLACK_SECONDS, statement_limit_ms(remaining)
        )

    def send_ahead(self, statement: store.Statement[Any]) -> None:
        """Send `statement` (store.one_statement's kind) without reading its reply: read_ahead
        reads the replies in the order their statements were sent. Only when may_send_ahead()
        has just said so."""
        assert self._pipeline is not None
        self._pipeline.send([(statement.text, statement.params)])

    def ahead_unread(self) -> int:
        return 0 if self._pipeline is None else self._pipeline.unread

    def read_ahead(self) -> list[Row]:
        """The rows of the oldest statement sent ahead and not read. Once every reply is read,
        the connection leaves pipeline mode."""
        pipeline, conn = self._pipeline, self._conn
        assert pipeline is not None and conn is not None
        try:
            return pipeline.read()[0].rows
        except psycopg.Error:
            if self._kept is not None:
                self._kept.forget()  # as after any failed statement
            raise
        finally:
            if not pipeline.unread and not conn.closed:
                pipeline.leave()

    def broken(self) -> bool:
        return self._conn is None or self._conn.closed or self._conn.broken

    def reconnect(self, exc: BaseException) -> None:
        """The connection broke: connect again within the budget (no longer than the leases
        held last), forgetting what was on the wire."""
        log.warning("database connection lost; reconnecting", extra={"reason": one_line(exc)})
        assert self._conn is not None
        self._conn.close()
        self._conn = self._connect(self._reconnect_budget())
        for call in self._on_reconnect:
            call()

    def timeout_ms(self) -> int:
        """The longest any statement may take: what is left of the budget less the final
        margin, so that a statement cancelled at its limit still leaves the run time to end
        and answer before the deadline."""
        return statement_limit_ms(self._budget.remaining())

    def run(self, operation: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a pgdrain.db.store operation; after a broken connection, reconnect and run it once
        more. Only for statements that are safe to repeat even when the first try committed
        and only its reply was lost: the heartbeat (extending a lease twice extends it once),
        reads, and fenced writes whose repeat matches no row (a release or a failure recorded
        twice is refused by the fence: the state is right, only the count says "lost").
        A claim must not simply be repeated: see run_recovering."""

        def once(conn: psycopg.Connection[Any]) -> T:
            return operation(conn, *args, **kwargs)

        if getattr(operation, "one_statement", False):
            once = store.one_statement(once)
        return self.run_recovering(once, once)

    def send_with_next(self, operation: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Send a one-statement operation whose result is not read with the next operation
        this session runs (in its round trip when that one is a one-statement operation too).
        Only for operations safe to repeat: a broken connection sends them again."""
        assert getattr(operation, "one_statement", False), "only one-statement operations"

        def send(conn: psycopg.Connection[Any]) -> None:
            operation(conn, *args, **kwargs)

        self._with_next.append(WithNext(send))

    def read_with_next(
        self, statement: store.Statement[T], limit_ms: int | None = None
    ) -> Later[T]:
        """Send `statement` with the next operation this session runs, in its round trip, and
        read its result when that is back. Only statements safe to repeat: a broken connection
        sends them again. `limit_ms` bounds it tighter than the round trip's own limit."""
        later: Later[T] = Later()
        self._with_next.append(
            WithNext(
                statement.send, lambda cursor: later._receive(statement.read(cursor)), limit_ms
            )
        )
        return later

    def send_pending(self) -> None:
        """Send what waits for a next operation, alone: a run that ends before its first claim
        still registers, reclaims and reads what it asked for."""
        if self._with_next:
            self.run_recovering(_nothing, _nothing)

    def run_recovering(
        self,
        first: Callable[[psycopg.Connection[Any]], T],
        again: Callable[[psycopg.Connection[Any]], T],
        *,
        while_sent: Callable[[], None] | None = None,
    ) -> T:
        """Run `first`; if the connection breaks, reconnect and run `again` instead: it first
        asks what `first` already did (it may have committed before the reply was lost) and
        does only the rest. `while_sent` is called once `first`'s statement is on the wire,
        before its reply is awaited (a one-statement operation; others never call it): work
        that needs no reply is done while the database runs the statement."""
        assert self._conn is not None, "open() the session first"
        self.settle()  # the connection is psycopg's again (or a new one)
        try:
            return self._transaction(self._conn, first, while_sent)
        except psycopg.OperationalError as exc:
            if not self._conn.closed and not self._conn.broken:
                raise
            self.reconnect(exc)
            return self._transaction(self._conn, again)

    def _reconnect_budget(self) -> Budget:
        """The budget, or less: no longer than the oldest lease held still runs. A reconnect
        that cannot finish in time gives up (DatabaseUnavailable), and the run tells its
        running jobs their leases are lost, before another run can take them."""
        leases = self._lease_seconds_left
        if leases is None or leases() is None:
            return self._budget
        budget = self._budget

        def remaining() -> float:
            left = leases()
            return budget.remaining() if left is None else min(budget.remaining(), left)

        return Budget(remaining)

    def _transaction(
        self,
        conn: psycopg.Connection[Any],
        operation: Callable[[psycopg.Connection[Any]], T],
        while_sent: Callable[[], None] | None = None,
    ) -> T:
        before, self._with_next = self._with_next, []
        try:
            return self._in_transactions(conn, before, operation, while_sent)
        except psycopg.OperationalError:
            if conn.closed or conn.broken:
                self._with_next = before + self._with_next  # sent again after the reconnect
            raise

    def _in_transactions(
        self,
        conn: psycopg.Connection[Any],
        before: list[WithNext],
        operation: Callable[[psycopg.Connection[Any]], T],
        while_sent: Callable[[], None] | None,
    ) -> T:
        if not self._limit_to_budget and not self._read_committed:
            for earlier in before:
                earlier.delivered(earlier.send(conn))
            return operation(conn)  # controls off: the server's defaults
        one_statement = getattr(operation, "one_statement", False)
        if self._kept is not None and one_statement:
            return self._with_kept_limits(before, operation, while_sent)
        timeout_ms = self.timeout_ms() if self._limit_to_budget else None
        if self._read_committed and one_statement:
            return self._round_trip(operation, before, timeout_ms, while_sent=while_sent)
        if before:
            self._round_trip(_nothing, before, timeout_ms)
        # BEGIN ISOLATION LEVEL READ COMMITTED (conn.isolation_level), the limits, the
        # statements, COMMIT: one transaction, so the SET LOCALs end with it, a round trip
        # each: its statements need each other's results.
        tries = 0
        while True:
            tries += 1
            limited = False
            try:
                with conn.transaction():
                    if self._limit_to_budget:
                        store.transaction_limits(conn, self.timeout_ms())
                    limited = True
                    return operation(conn)
            except psycopg.errors.QueryCanceled as exc:
                if limited or not self._resend_cut_setup(exc, tries):
                    raise

    def _with_kept_limits(
        self,
        before: list[WithNext],
        operation: Callable[[psycopg.Connection[Any]], T],
        while_sent: Callable[[], None] | None,
    ) -> T:
        """A one-statement operation on a connection that keeps its limits: alone when they are
        fresh; else in an explicit transaction that sends them again (its own isolation level
        is fixed when it begins, so BEGIN ISOLATION LEVEL READ COMMITTED pins it)."""
        kept = self._kept
        assert kept is not None
        now = time.monotonic()
        remaining = self._budget.remaining()
        allowed = statement_limit_ms(remaining)
        try:
            if kept.fresh(now, allowed):
                return self._round_trip(
                    operation, before, allowed, alone=True, while_sent=while_sent
                )
            kept.forget()
            near_the_end = remaining - KEEP_SECONDS <= FINAL_MARGIN_SECONDS
            keep_ms = allowed if near_the_end else statement_limit_ms(remaining - KEEP_SECONDS)
            if self._halve_kept_limits and not near_the_end:
                keep_ms = max(MIN_TIMEOUT_MS, keep_ms // 2)  # see may_send_ahead
            result = self._round_trip(
                operation, before, allowed, keep_ms=keep_ms, while_sent=while_sent
            )
            if not near_the_end:  # near the end, every statement sends them, exact
                kept.sent(now, keep_ms)
            return result
        except BaseException:
            kept.forget()  # a transaction that sent them may have rolled back
            raise

    def _round_trip(
        self,
        operation: Callable[[psycopg.Connection[Any]], T],
        before: Sequence[WithNext],
        timeout_ms: int | None,
        *,
        alone: bool = False,
        keep_ms: int | None = None,
        while_sent: Callable[[], None] | None = None,
    ) -> T:
        assert self._conn is not None and self._pipeline is not None
        tries = 0
        while True:
            tries += 1
            trip = OneRoundTrip(
                self._conn,
                self._pipeline,
                timeout_ms,
                before,
                alone=alone,
                keep_ms=keep_ms,
                while_sent=while_sent,
            )
            try:
                result = operation(cast(psycopg.Connection[Any], trip))
                trip.send_rest()
                return result
            except psycopg.errors.QueryCanceled as exc:
                if not trip.cut_at_its_limits or not self._resend_cut_setup(exc, tries):
                    raise
                while_sent = None  # its work is done: it ran once the first try was sent
            except psycopg.errors.DeadlockDetected as exc:
                if not self.resend_deadlocked(exc, tries):
                    raise
                while_sent = None

    def _resend_cut_setup(self, exc: psycopg.errors.QueryCanceled, tries: int) -> bool:
        """Whether to send again a transaction cancelled at its BEGIN or its limits, as the
        role's own statement_timeout (ALTER ROLE ... SET, which no grant can deny) does on a
        server slow there: those run before the run's limits take effect, behind a transaction
        pooler in every transaction. Safe to send again: nothing after the limits ran and the
        transaction rolled back; what rode with it (send_with_next) is safe to repeat."""
        if not self._resend_cut or tries >= SETUP_CUT_TRIES:
            return False
        log.warning(
            "a transaction was cancelled before its limits took effect (the role's own "
            "statement_timeout?); sending it again",
            extra={"reason": one_line(exc)},
        )
        return True

    def resend_deadlocked(self, exc: psycopg.errors.DeadlockDetected, tries: int) -> bool:
        """Whether to send again a transaction PostgreSQL ended to break a deadlock. Safe: the
        victim's transaction rolled back whole, so its statement did nothing (a fenced
        completion records nothing, a claim claims nothing), and what rode with it is safe to
        repeat. The other transaction holds its locks until it ends, so the next try waits for
        it instead of meeting it again."""
        if not self._resend_deadlocked or tries >= DEADLOCK_TRIES:
            return False
        log.warning(
            "a statement was ended to break a deadlock; sending it again",
            extra={"reason": one_line(exc)},
        )
        return True

    def _connect(self, budget: Budget | None = None) -> psycopg.Connection[Any]:
        if self._kept is not None:
            self._kept.forget()  # a new connection keeps nothing
        conn = connection.connect(self._conninfo, self._settings, budget or self._budget)
        conn.add_notice_handler(self._on_notice)
        # Prepared under names of its own on a connection of its own; behind a transaction
        # pooler, which cannot keep them, every statement goes unnamed.
        self._pipeline = Pipeline(conn, prepare=conn.prepare_threshold is not None)
        if self._read_committed:
            # Sent with each BEGIN, not as session state: safe behind a transaction pooler.
            # READ WRITE too: a role may make its own transactions read-only by default.
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            conn.read_only = False
        return conn


class _KeptLimits:
    """The limit a connection was last sent (ms), and when (time.monotonic())."""

    def __init__(self) -> None:
        self._limit_ms: int | None = None
        self._sent_at = 0.0

    def fresh(self, now: float, allowed_ms: int) -> bool:
        return (
            self._limit_ms is not None
            and now - self._sent_at < KEEP_SECONDS
            and self._limit_ms <= allowed_ms
        )

    def sent(self, now: float, limit_ms: int) -> None:
        self._limit_ms, self._sent_at = limit_ms, now

    def forget(self) -> None:
        self._limit_ms = None


@store.one_statement
def _nothing(conn: psycopg.Connection[Any]) -> None:
    """An operation that executes nothing: run, it sends only what was to go with it."""


def run_one_statement(
    conn: psycopg.Connection[Any],
    timeout_ms: int | None,
    operation: Callable[[psycopg.Connection[Any]], T],
) -> T:
    """Run a store.one_statement operation on an autocommit connection in one round trip: its
    statement in a READ COMMITTED transaction of its own, limited to timeout_ms (None: the
    server's limits), BEGIN and COMMIT sent with it (retention's batches)."""
    pipeline = Pipeline(conn, prepare=False)
    trip = OneRoundTrip(conn, pipeline, timeout_ms, ())
    result = operation(cast(psycopg.Connection[Any], trip))
    trip.send_rest()
    return result


class _Captured:
    """Stands for a connection to a store function: keeps the statements it executes, runs
    none (they go out with the round trip that carries them)."""

    def __init__(self) -> None:
        self.statements: list[Statement] = []

    def execute(self, statement: LiteralString, params: Any = None) -> Reply:
        self.statements.append((statement, params))
        return Reply([], 0)


def _captured(call: Callable[[psycopg.Connection[Any]], object]) -> list[Statement]:
    captured = _Captured()
    call(cast(psycopg.Connection[Any], captured))
    return captured.statements


class OneRoundTrip:
    """The connection a one-statement operation is given: its execute sends what rides with
    it (each in a transaction of its own), then BEGIN, the limits, the statement and COMMIT
    (or the statement alone, its own implicit transaction), with one Sync; calls `while_sent`
    once they are out; and returns the statement's reply once the whole reply is read. A
    second execute is a mistake in the operation (it was marked one_statement wrongly) and is
    refused before anything is sent."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        pipeline: Pipeline,
        timeout_ms: int | None,
        before: Sequence[WithNext],
        *,
        alone: bool = False,
        keep_ms: int | None = None,
        while_sent: Callable[[], None] | None = None,
    ) -> None:
        self._conn = conn
        self._pipeline = pipeline
        self._timeout_ms = timeout_ms
        self._before = before
        self._alone = alone
        self._keep_ms = keep_ms
        self._while_sent = while_sent
        self._sent = False
        self._setup: set[int] = set()  # where each transaction's BEGIN and limits are in the group
        # The group failed with a cancel at a BEGIN or limits: none of its statements ran after.
        self.cut_at_its_limits = False

    def execute(self, statement: LiteralString, params: Any = None) -> Reply:
        if self._sent:
            raise AssertionError("an operation marked one_statement ran a second statement")
        reply = self._send((statement, params))
        assert reply is not None
        return reply

    def send_rest(self) -> None:
        """The operation executed nothing: send what was to go with it, alone."""
        if not self._sent and self._before:
            self._send(None)

    def _send(self, statement: Statement | None) -> Reply | None:
        self._sent = True
        group: list[Statement] = []
        read_at: list[int] = []  # where in `group` each statement's reply will be
        for earlier in self._before:
            read_at.append(self._add(group, _captured(earlier.send), earlier.limit_ms))
        if statement is not None:
            if self._alone:
                group.append(statement)
                read_at.append(len(group) - 1)
            else:
                read_at.append(self._add(group, [statement], keep_ms=self._keep_ms))
        self._pipeline.send(group)
        work_error: BaseException | None = None
        if statement is not None and self._while_sent is not None:
            try:
                self._while_sent()  # the server runs the statement meanwhile
            except BaseException as exc:  # raised once the reply is read
                work_error = exc
        try:
            replies = self._read()
        except BaseException as read_error:
            if work_error is not None:
                raise work_error from read_error  # it came first; the statement's error too
            raise
        if work_error is not None:
            raise work_error
        for earlier, at in zip(self._before, read_at, strict=False):
            earlier.delivered(cast(psycopg.Cursor[Any], replies[at]))
        return replies[read_at[-1]] if statement is not None else None

    def _read(self) -> list[Reply]:
        pipeline, conn = self._pipeline, self._conn
        try:
            return pipeline.read()
        except psycopg.Error as exc:
            self.cut_at_its_limits = (
                isinstance(exc, psycopg.errors.QueryCanceled) and pipeline.failed_at in self._setup
            )
            # A failed statement skipped the COMMIT, and a Sync does not end an explicit
            # transaction: roll it back, so that the connection is usable again.
            if not conn.broken and conn.info.transaction_status == TransactionStatus.INERROR:
                pipeline.send(_captured(store.transaction_rollback))
                pipeline.read()
            raise
        finally:
            if not conn.closed and not pipeline.unread:
                pipeline.leave()

    def _add(
        self,
        group: list[Statement],
        statements: list[Statement],
        limit_ms: int | None = None,
        keep_ms: int | None = None,
    ) -> int:
        """Add `statements` to `group` in a transaction of their own (BEGIN, the limits, them,
        COMMIT); returns where the last one's reply will be. `keep_ms`: the connection's limits
        from now on, this transaction's too; else this transaction's alone, no higher than
        `limit_ms`."""
        timeout_ms = self._timeout_ms
        if timeout_ms is not None and limit_ms is not None:
            timeout_ms = min(timeout_ms, limit_ms)
        limits: list[Statement] = []
        if keep_ms is not None:
            limits = _captured(lambda c: store.session_limits(c, keep_ms))
        elif timeout_ms is not None:
            limits = _captured(lambda c: store.transaction_limits(c, timeout_ms))
        setup = [*_captured(store.transaction_begin), *limits]
        self._setup.update(range(len(group), len(group) + len(setup)))
        group += [*setup, *statements]
        last = len(group) - 1
        group += _captured(store.transaction_commit)
        return last
