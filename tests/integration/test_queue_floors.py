"""Each queue's floor (migration 0026, docs/decisions/0017) on a real database: the claims and
the exit check start from it.

Every statement that writes a queued row takes a shared advisory lock on its queue and makes
sure a mark at or below its rows is there; only a transaction holding the queue's lock
exclusively raises the floor, and only tries to. Each test beside its control: the same
timeline with one part of the protocol taken out, and a queued job that no claim ever finds (a
job stuck for good)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, complete_one, wait_for, without_line
from helpers.lock_waits import (
    a_raise_holds_up_the_next_write,
    on_a_connection_of_its_own,
    someone_here_waits_on_a_lock,
    waits_on_a_lock,
)
from helpers.plans import plan_nodes
from helpers.sql_functions import (
    function_copy,
    function_replacing,
    function_without,
    raise_without_its_try,
)
from pgdrain import enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.db import store
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]

URGENT = -1  # sorts before the default priority: a job the floor of a default job would hide


def _marks(conn: Conn) -> list[tuple[str, int, int]]:
    """The marks, as (queue, priority, id)."""
    return [
        (str(r[0]), int(r[1]), int(r[2]))
        for r in conn.execute(
            "SELECT queue, priority, id FROM pgdrain.queue_floor_marks ORDER BY queue, priority, id"
        )
    ]


def _raise(conn: Conn) -> None:
    store.floors_raise(conn)


def _enqueue(conn: Conn, priority: int = 0, **fields: Any) -> int:
    [job_id] = enqueue_many(conn, [build_job("k", priority=priority, **fields)])
    return job_id


def _claimed_until_empty(conn: Conn) -> list[int]:
    """What runs of every queue claim, one job at a time, until a claim comes back empty (each
    completed at once)."""
    claimed: list[int] = []
    while True:
        _, jobs = store.job_complete_and_claim_statement([], None, 1, "w", 30.0, None, None).run(
            conn
        )
        if not jobs:
            return claimed
        claimed.extend(job.id for job in jobs)
        assert complete_one(conn, jobs[0].held)


def _status(conn: Conn, job_id: int) -> str:
    row = conn.execute("SELECT status FROM pgdrain.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def _lower_with(conn: Conn, function: str) -> None:
    """Both triggers call `function` in place of queue_floor_lower()."""
    for event in ("insert", "update"):
        conn.execute(
            f"CREATE OR REPLACE TRIGGER jobs_queue_floor_{event}"
            f" AFTER {event.upper()} ON pgdrain.active_jobs"
            f" REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )


def _without_triggers(conn: Conn) -> None:
    conn.execute(
        "ALTER TABLE pgdrain.active_jobs DISABLE TRIGGER jobs_queue_floor_insert,"
        " DISABLE TRIGGER jobs_queue_floor_update"
    )


def test_a_queue_with_nothing_queued_has_no_floor_and_a_run_of_every_queue_skips_it(
    conn: Conn,
) -> None:
    assert _marks(conn) == []
    first = _enqueue(conn)
    assert _marks(conn) == [("default", 0, first)]
    _enqueue(conn)  # covered by the mark: nothing written
    assert _marks(conn) == [("default", 0, first)]
    assert store.queue_depth(conn, None).ready == 2
    assert store.queue_depth(conn, ["default", "default", "other"]).ready == 2
    assert len(_claimed_until_empty(conn)) == 2
    _raise(conn)
    assert _marks(conn) == []
    assert store.queue_depth(conn, None).ready == 0
    assert not store.queue_has_ready(conn, None)


# Each way a row of priority URGENT becomes queued while its queue's floor sits at a job of the
# default priority: with the triggers the writer marks the floor below it; without them no claim
# ever reaches it.
WRITERS = [
    "enqueue",
    "enqueue in a repeatable read transaction",
    "insert by hand",
    "insert in replica mode",
    "retry of a failed attempt",
    "release by a stopping run",
    "reclaim of an expired lease",
    "release by its sequence",
    "release by its dependency",
    "retry by an operator",
    "update by hand",
]


def _make_urgent_job_queued(conn: Conn, writer: str, raise_floor: Callable[[Conn], None]) -> int:
    """Arranges the queue's floor at a job of the default priority (`raise_floor`), then queues
    an URGENT job the way `writer` does; returns that job's id."""
    if writer.startswith("enqueue"):
        _enqueue(conn)
        raise_floor(conn)
        if writer == "enqueue":
            return _enqueue(conn, URGENT)
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            return _enqueue(conn, URGENT)
    if writer.startswith("insert"):
        _enqueue(conn)
        raise_floor(conn)
        if writer == "insert in replica mode":  # as a copy of data: no ordinary trigger fires
            conn.execute("SET session_replication_role = replica")
        row = conn.execute(
            "INSERT INTO pgdrain.active_jobs (queue, kind, priority) VALUES ('default', 'k', %s)"
            " RETURNING id",
            (URGENT,),
        ).fetchone()
        conn.execute("RESET session_replication_role")
        assert row is not None
        return int(row[0])
    if writer == "update by hand":
        _enqueue(conn)
        job_id = _enqueue(conn)
        raise_floor(conn)
        conn.execute("UPDATE pgdrain.active_jobs SET priority = %s WHERE id = %s", (URGENT, job_id))
        return job_id
    if writer in ("release by its sequence", "release by its dependency"):
        first = _enqueue(conn, URGENT, sequence="s")
        after = {"sequence": "s"} if writer.endswith("sequence") else {"after": [first]}
        job_id = _enqueue(conn, URGENT, **after)
        assert _status(conn, job_id) == "waiting"
        [held] = claim_batch(conn, ["default"], 1, "w", 30.0, None)
        _enqueue(conn)
        raise_floor(conn)
        assert complete_one(conn, held.held)  # releases job_id
        return job_id
    if writer == "retry by an operator":
        job_id = _enqueue(conn, URGENT, max_attempts=1)
        [held] = claim_batch(conn, ["default"], 1, "w", 30.0, None)
        store.job_fail(conn, held.held, "boom", 0.0)
        assert _status(conn, job_id) == "failed"
        _enqueue(conn)
        raise_floor(conn)
        assert [r.id for r in store.job_retry(conn, [job_id])] == [job_id]
        return job_id
    # The job is running while the floor rises to the default job behind it.
    job_id = _enqueue(conn, URGENT)
    cap = 0.0 if writer.startswith("reclaim") else None
    [held] = claim_batch(conn, ["default"], 1, "w", 30.0, cap)
    _enqueue(conn)
    raise_floor(conn)
    if writer == "retry of a failed attempt":
        store.job_fail(conn, held.held, "boom", 0.0)
    elif writer == "release by a stopping run":
        store.job_release_many(conn, [held.held])
    else:
        assert [r.id for r in store.job_reclaim_expired(conn, 10)] == [job_id]
    return job_id


@pytest.mark.parametrize("triggers", [True, False], ids=["marked", "control-no-trigger"])
@pytest.mark.parametrize("writer", WRITERS)
def test_every_way_a_row_becomes_queued_marks_its_queue_below_it(
    conn: Conn, writer: str, triggers: bool
) -> None:
    def raise_floor(c: Conn) -> None:
        _raise(c)
        # Taken out once the floor is up (from the start, no floor at all). In replica mode the
        # control is the triggers enabled as ordinary ones, which such a session does not fire.
        if not triggers and writer == "insert in replica mode":
            c.execute(
                "ALTER TABLE pgdrain.active_jobs ENABLE TRIGGER jobs_queue_floor_insert,"
                " ENABLE TRIGGER jobs_queue_floor_update"
            )
        elif not triggers:
            _without_triggers(c)

    job_id = _make_urgent_job_queued(conn, writer, raise_floor)
    assert _status(conn, job_id) == "queued"

    claimed = _claimed_until_empty(conn)
    if triggers:
        assert claimed[0] == job_id  # the most urgent first, as without floors
        assert _status(conn, job_id) == "done"
    else:  # below the floor: every claim passes it by, and it stays queued for good
        assert job_id not in claimed
        assert _status(conn, job_id) == "queued"


LOCKED = [True, False]


@pytest.mark.parametrize("locked", LOCKED, ids=["tries-the-lock", "control-no-lock"])
def test_a_raise_while_an_enqueue_is_in_flight_keeps_the_mark_it_relies_on(
    conn: Conn, other: Conn, locked: bool
) -> None:
    raise_floor = _raise if locked else raise_without_its_try(conn, "pgdrain.queue_floors_raise()")

    first = _enqueue(conn, URGENT)  # its mark is the queue's floor
    # The application's transaction: its urgent job, after the first, relies on that mark.
    with other.transaction():
        job_id = _enqueue(other, URGENT)
        assert _marks(conn) == [("default", URGENT, first)]
        # Meanwhile a run claims the first job, and the next run raises the floor.
        [held] = claim_batch(conn, ["default"], 1, "w", 30.0, None)
        assert complete_one(conn, held.held)
        raise_floor(conn)
    # The application commits.

    claimed = _claimed_until_empty(conn)
    if locked:  # the enqueue held its queue's lock: the raise moved nothing
        assert claimed == [job_id]
    else:  # raised past a job it could not see: the queue has no floor, the job stays queued
        assert _marks(conn) == []
        assert claimed == []
        assert _status(conn, job_id) == "queued"


@pytest.mark.parametrize("locked", LOCKED, ids=["waits-for-the-raise", "control-no-lock"])
def test_an_enqueue_behind_a_raise_reads_the_raised_floor_and_marks_below_it(
    conn: Conn, other: Conn, db_url: str, locked: bool
) -> None:
    if not locked:
        function_without(
            conn,
            "pgdrain.queue_floor_lower()",
            "pg_advisory_xact_lock_shared",
            "pgdrain.lower_unlocked",
        )
        _lower_with(conn, "pgdrain.lower_unlocked")
    _enqueue(conn, URGENT)  # its mark is the floor the enqueue below will read
    later = _enqueue(conn)
    [held] = claim_batch(conn, ["default"], 1, "w", 30.0, None)
    assert complete_one(conn, held.held)
    enqueued: list[int] = []
    error: list[BaseException] = []

    def enqueue() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as app:
                enqueued.append(_enqueue(app, URGENT))
        except BaseException as exc:
            error.append(exc)

    with other.transaction():
        _raise(other)  # to the later job, not yet committed
        writer = threading.Thread(target=enqueue)
        writer.start()
        # The enqueue has written its row; with the lock it now waits for the raise.
        wait_for(
            lambda: not writer.is_alive() or someone_here_waits_on_a_lock(conn),
            what="the enqueue finished or waits for the raise",
        )
    writer.join(20)
    assert not error and len(enqueued) == 1

    claimed = _claimed_until_empty(conn)
    if locked:  # it read the raised floor once the raise committed, and marked below it
        assert claimed == [enqueued[0], later]
    else:  # it read the mark the raise was deleting, and added none: the job stays queued
        assert claimed == [later]
        assert _status(conn, enqueued[0]) == "queued"


@pytest.mark.parametrize("marks", [True, False], ids=["marks-unread", "control-reads-old-marks"])
def test_an_enqueue_in_an_older_snapshot_marks_without_reading_the_floor(
    conn: Conn, other: Conn, marks: bool
) -> None:
    if not marks:  # as under READ COMMITTED: the floor read, in the transaction's own snapshot
        function_replacing(
            conn,
            "pgdrain.queue_floor_lower()",
            "current_setting('transaction_isolation') = 'read committed'",
            "true",
            "pgdrain.lower_as_rc",
        )
        _lower_with(conn, "pgdrain.lower_as_rc")
    _enqueue(conn, URGENT)
    with other.transaction():
        # The application's REPEATABLE READ transaction takes its snapshot: the first job's
        # mark is the floor in it.
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT 1")
        # Meanwhile the first job is claimed and done, another enqueued, and the floor raised.
        [held] = claim_batch(conn, ["default"], 1, "w", 30.0, None)
        assert complete_one(conn, held.held)
        later = _enqueue(conn)
        _raise(conn)
        job_id = _enqueue(other, URGENT)

    claimed = _claimed_until_empty(conn)
    if marks:
        assert claimed == [job_id, later]
    else:  # it saw the first job's mark, gone since: the job stays queued
        assert claimed == [later]
        assert _status(conn, job_id) == "queued"


def _lock_the_marks(conn: Conn) -> None:
    with conn.transaction():
        conn.execute("LOCK TABLE pgdrain.queue_floor_marks IN SHARE MODE")


@pytest.mark.parametrize("locked", LOCKED, ids=["locks-too", "control-rc-only"])
def test_an_enqueue_in_an_older_snapshot_that_commits_during_a_raise_keeps_its_mark(
    conn: Conn, other: Conn, db_url: str, locked: bool
) -> None:
    if not locked:  # as before migration 0030: the lock under READ COMMITTED alone
        function_copy(
            conn,
            "pgdrain.queue_floor_lower()",
            "pgdrain.lower_locked_in_rc",
            lambda text: without_line(text, "pg_advisory_xact_lock_shared").replace(
                "IF read_committed THEN",
                "IF read_committed THEN PERFORM pg_advisory_xact_lock_shared("
                "hashtext('pgdrain.queue_floor'), hashtext(low.queue) & 63);",
            ),
        )
        _lower_with(conn, "pgdrain.lower_locked_in_rc")
    first = _enqueue(conn)  # its mark is the floor
    [held] = claim_batch(conn, ["default"], 1, "w", 30.0, None)
    assert complete_one(conn, held.held)
    pids: dict[str, int] = {}
    with other.transaction():
        # The application's REPEATABLE READ transaction enqueues, and stays open.
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        job_id = _enqueue(other, URGENT)
        # A session whose lock of the marks waits behind that enqueue's, and holds the raise at
        # its DELETE of the marks: between its read of the jobs and that DELETE.
        locker = on_a_connection_of_its_own(db_url, "locker", _lock_the_marks, pids)
        wait_for(lambda: "locker" in pids and waits_on_a_lock(conn, pids["locker"]), what="lock")
        raiser = on_a_connection_of_its_own(db_url, "raiser", _raise, pids)
        wait_for(
            lambda: (
                not raiser.is_alive()
                or ("raiser" in pids and waits_on_a_lock(conn, pids["raiser"]))
            ),
            what="the raise passed over the queue or waits at its DELETE",
        )
    # The application commits while the raise is where it was; then the locker, then the raise.
    locker.join(10)
    raiser.join(10)
    if locked:  # the raise passed over the queue: its writer held the lock
        assert _marks(conn) == [("default", URGENT, job_id), ("default", 0, first)]
        assert _claimed_until_empty(conn) == [job_id]
    else:  # the raise's DELETE saw the mark committed after its read of the jobs, and took it
        assert _marks(conn) == []
        assert _claimed_until_empty(conn) == []
        assert _status(conn, job_id) == "queued"


@pytest.mark.parametrize("tries", [True, False], ids=["tries", "control-waits"])
def test_a_raise_never_holds_up_an_enqueue(
    conn: Conn, other: Conn, db_url: str, tries: bool
) -> None:
    raise_statement = "SELECT pgdrain.queue_floors_raise()"
    if not tries:  # the lock waited for, not tried
        function_replacing(
            conn,
            "pgdrain.queue_floors_raise()",
            "CONTINUE WHEN NOT pg_try_advisory_xact_lock(",
            "PERFORM pg_advisory_xact_lock(",
            "pgdrain.raise_waiting",
        )
        raise_statement = "SELECT pgdrain.raise_waiting()"
    _enqueue(conn)  # the queue has a floor to raise
    # An application's transaction that enqueued, still open; the raise; the next enqueue.
    held_up = a_raise_holds_up_the_next_write(
        conn, other, db_url, _enqueue, raise_statement, _enqueue
    )

    # With the try, the raise gave up at once and the next enqueue went on; waiting, the raise
    # queued for the lock behind the open enqueue, and the next enqueue queued behind the raise.
    assert held_up is (not tries)


MARK_VALUES = "VALUES (low.queue, low.priority, low.run_at, low.id, low.run_at);"


@pytest.mark.parametrize("appends", [True, False], ids=["appends", "control-one-row-per-queue"])
def test_two_first_enqueues_into_an_empty_queue_do_not_wait_for_each_other(
    conn: Conn, other: Conn, db_url: str, appends: bool
) -> None:
    if not appends:  # one floor row per queue, lowered by an upsert
        function_replacing(
            conn,
            "pgdrain.queue_floor_lower()",
            MARK_VALUES,
            MARK_VALUES.removesuffix(";")
            + " ON CONFLICT (queue) DO UPDATE SET priority = least(queue_floor_marks.priority,"
            " excluded.priority);",
            "pgdrain.lower_upsert",
        )
        _lower_with(conn, "pgdrain.lower_upsert")
        conn.execute("CREATE UNIQUE INDEX ON pgdrain.queue_floor_marks (queue)")
    pids: dict[str, int] = {}
    done = threading.Event()

    def second() -> None:
        with psycopg.connect(db_url) as app:  # a transaction left open, as the first
            pids["second"] = app.info.backend_pid
            app.execute("SET lock_timeout = '5s'")
            _enqueue(app, queue_name="new")
            done.set()
            app.rollback()

    with other.transaction():  # the first, still open
        _enqueue(other, queue_name="new")
        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        wait_for(
            lambda: done.is_set() or waits_on_a_lock(conn, pids.get("second", 0)),
            what="the second enqueue returned or waits",
        )
        waited = not done.is_set()
    thread.join(20)

    assert waited is (not appends)


def _buffers(conn: Conn, statement: store.Statement[Any]) -> int:
    """The buffers a statement visits (EXPLAIN (ANALYZE, BUFFERS), rolled back)."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement.text, statement.params
        ).fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


# run_exit of a run of every queue that may stay, writing no history line.
EXIT_PARAMS = {
    "run_id": "r",
    "queues": None,
    "may_stay": True,
    "linger_window_s": 0.0,
    "clear_kicks": False,
    **store.RunRecord("schedule", 0, 1.0, "empty", {}).params(),
    "record": False,
}


@pytest.mark.parametrize("raised", [True, False], ids=["raised", "control-not-raised"])
def test_behind_a_held_snapshot_a_fresh_run_skips_the_jobs_claimed_since(
    conn: Conn, other: Conn, raised: bool
) -> None:
    with other.transaction():
        # A report's snapshot, held while 2,000 jobs run.
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT 1")
        enqueue_many(conn, [build_job("k") for _ in range(2000)])
        claimed = claim_batch(conn, ["default"], 2000, "w", 30.0, None)
        done = store.job_complete_many(conn, [job.held for job in claimed])
        assert len(done.applied_attempts) == 2000
        conn.execute("VACUUM pgdrain.active_jobs")
        _enqueue(conn)  # the next fresh run's one job
        if raised:
            _raise(conn)  # that run's, before its first claim

        # Its first claim (of every queue), its ready check, and a Lambda run's exit check.
        claim = _buffers(
            conn, store.job_complete_and_claim_statement([], None, 10, "w", 30, None, None)
        )
        ready = _buffers(
            conn,
            store.Statement(query("queue_has_ready"), {"queues": None}, lambda cursor: None),
        )
        exit_check = _buffers(
            conn, store.Statement(query("run_exit"), EXIT_PARAMS, lambda cursor: None)
        )
        # And a resume's look for a ready job (`pgdrain resume`, the dashboard's Resume).
        resume = _buffers(
            conn,
            store.Statement(query("queue_has_ready"), {"queues": ["default"]}, lambda cursor: None),
        )

    # Raised past them, each scan starts at the new job; else each walks the 2,000 dead entries
    # (and visits the pages of their rows) to reach it.
    # (Measured: 26, 10 and 18 raised; 132, 58 and 157 not.)
    if raised:
        assert claim < 40 and ready < 20 and exit_check < 30 and resume < 20, resume
    else:
        assert claim > 100 and ready > 40 and exit_check > 100 and resume > 40, resume


QUEUE_LOCK = "hashtext(low.queue) & 63"


@pytest.mark.parametrize("bounded", [True, False], ids=["64-at-most", "control-one-per-queue"])
def test_an_enqueue_into_a_thousand_queues_takes_64_locks_at_most(
    conn: Conn, bounded: bool
) -> None:
    """The server's lock table is shared by every transaction and bounded (about
    max_locks_per_transaction x max_connections): a lock per queue would let one transaction
    that fans out to a queue per tenant fill it, and fail every transaction that needs one."""
    if not bounded:
        function_replacing(
            conn,
            "pgdrain.queue_floor_lower()",
            QUEUE_LOCK,
            "hashtext(low.queue)",
            "pgdrain.lower_per_queue",
        )
        _lower_with(conn, "pgdrain.lower_per_queue")
    with conn.transaction():
        enqueue_many(conn, [build_job("k", queue_name=f"tenant-{n}") for n in range(1000)])
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchone()
    assert row is not None
    if bounded:
        assert row[0] <= 64
    else:
        assert row[0] > 900  # (hashtext collides a little)
    assert len(_marks(conn)) == 1000


@pytest.mark.parametrize("bounded", [True, False], ids=["100-at-most", "control-every-queue"])
def test_a_raise_visits_100_queues_at_most(conn: Conn, bounded: bool) -> None:
    if not bounded:
        function_without(
            conn, "pgdrain.queue_floors_raise()", "LIMIT 100", "pgdrain.raise_every_queue"
        )
    # 150 queues whose one job ran: each keeps its mark until a raise finds it empty.
    enqueue_many(conn, [build_job("k", queue_name=f"tenant-{n}") for n in range(150)])
    assert len(_claimed_until_empty(conn)) == 150
    conn.execute(
        "SELECT pgdrain.queue_floors_raise()" if bounded else "SELECT pgdrain.raise_every_queue()"
    )
    left = {queue for queue, _, _ in _marks(conn)}
    assert len(left) == (50 if bounded else 0)
    if bounded:  # the next raise takes the rest
        _raise(conn)
        assert _marks(conn) == []


def _marks_scans(conn: Conn, statement: store.Statement[Any]) -> list[int]:
    """How many times each scan of the floors' marks ran in a claim (EXPLAIN ANALYZE)."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement.text, statement.params
        ).fetchone()
    assert row is not None
    return [
        int(node["Actual Loops"])
        for node in plan_nodes(row[0])
        if node.get("Relation Name") == "queue_floor_marks"
    ]


@pytest.mark.parametrize("position", [True, False], ids=["from-a-position", "from-the-floor"])
def test_a_claim_whose_position_fills_it_does_not_read_the_floor(
    conn: Conn, position: bool
) -> None:
    """Behind a held snapshot the marks keep a dead version of each raise that moved them, so
    the floor is read only where a claim needs it: a queue without a position, or one whose
    position's range fell short. A run's claims from its positions read no mark."""
    enqueue_many(conn, [build_job("k") for _ in range(20)])
    before_every_job = store.ClaimPosition(0, 946_684_800_000_000, 0)  # 2000-01-01
    claim = store.job_complete_and_claim_statement(
        [],
        ["default"],
        10,
        "w",
        30,
        None,
        None,
        positions={"default": before_every_job} if position else None,
    )
    scans = _marks_scans(conn, claim)
    assert scans and all(loops == (0 if position else 1) for loops in scans)


SERVED_ONLY_FOUND = (
    "FROM (SELECT DISTINCT f.queue AS name FROM found AS f) AS s",
    "FROM unnest((SELECT names FROM served)::text[]) AS s(name)",  # every floor, as before
)


@pytest.mark.parametrize("trimmed", [True, False], ids=["only-found", "control-every-floor"])
def test_a_run_of_every_queue_names_only_the_queues_it_found_jobs_in(
    conn: Conn, trimmed: bool
) -> None:
    """A red team's report: queues whose jobs are gone keep their floors' marks until raises
    fold them in (100 queues a raise), and a run of every queue named them all in its next
    claims, probing 5,000 empty queues at every claim (0.03 of one queue's jobs/s). The claim
    now names only the queues it found jobs to claim in; the control names every floor."""
    enqueue_many(conn, [build_job("noop", queue_name=f"gone{n}") for n in range(3)])
    conn.execute("DELETE FROM pgdrain.active_jobs")  # their marks stay
    enqueue_many(conn, [build_job("noop") for _ in range(2)])
    statement = store.job_complete_and_claim_statement([], None, 1, "w", 30.0, None, None)
    text = statement.text
    if not trimmed:
        text = text.replace(*SERVED_ONLY_FOUND)
        assert text != statement.text
    rows = conn.execute(text, statement.params).fetchall()
    served = store.claim_served_queues(rows)
    if trimmed:
        assert served == ("default",)
    else:
        assert served == ("default", "gone0", "gone1", "gone2")
