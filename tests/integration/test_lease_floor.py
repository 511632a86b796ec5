"""The floor the reclaim starts from (migration 0024, docs/decisions/0017) on a real database.

Every statement that writes a running row takes a shared advisory lock and lowers the floor
below its leases; only a transaction holding the lock exclusively raises it, and only tries to.
Each test beside its control: the same timeline with one part of the protocol taken out, and a
job whose lease expired that no reclaim ever takes back (a lost job)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, wait_for, without_line
from helpers.lock_waits import (
    a_raise_holds_up_the_next_write,
    someone_here_waits_on_a_lock,
)
from helpers.sql_functions import function_replacing, function_without, raise_without_its_try
from pgdrain import enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.db import store
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]

LOCKED = [True, False]
LOCKED_IDS = ["locked", "control-no-lock"]


def _floor(conn: Conn) -> str:
    row = conn.execute("SELECT at::text FROM pgdrain.lease_floor").fetchone()
    assert row is not None
    return str(row[0])


def _raise(conn: Conn) -> None:
    store.floors_raise(conn)


def _reclaimed(conn: Conn) -> list[int]:
    return sorted(r.id for r in store.job_reclaim_expired(conn, 100))


def _ended_at_once(conn: Conn) -> list[int]:
    """A job claimed by a run that dies at once: its lease capped at 0 s, expired when read."""
    enqueue_many(conn, [build_job("k")])
    return [job.id for job in claim_batch(conn, ["default"], 1, "w-dead", 30.0, 0.0)]


@pytest.mark.parametrize("locked", LOCKED, ids=LOCKED_IDS)
def test_a_raise_while_a_claim_is_in_flight_leaves_the_floor_below_it(
    conn: Conn, other: Conn, locked: bool
) -> None:
    raise_floor = _raise if locked else raise_without_its_try(conn, "pgdrain.lease_floor_raise()")

    # A run's claim, not yet committed: its job's lease is written, and already expired.
    with other.transaction():
        claimed = _ended_at_once(other)
        # Another run raises the floor meanwhile. It cannot see the claimed job.
        raise_floor(conn)
    # The claim commits.

    if locked:  # the claim held the lock: the raise moved nothing
        assert _floor(conn) == "-infinity"
        assert _reclaimed(conn) == claimed
    else:  # raised past a lease it could not see: that job is never taken back
        assert _floor(conn) == "infinity"
        assert _reclaimed(conn) == []
        assert conn.execute("SELECT status FROM pgdrain.jobs").fetchall() == [("running",)]


@pytest.mark.parametrize("locked", LOCKED, ids=LOCKED_IDS)
def test_a_claim_behind_a_raise_reads_the_raised_floor_and_lowers_it(
    conn: Conn, other: Conn, db_url: str, locked: bool
) -> None:
    if not locked:
        function_without(
            conn,
            "pgdrain.lease_floor_lower()",
            "pg_advisory_xact_lock_shared",
            "pgdrain.lower_unlocked",
        )
        conn.execute(
            "CREATE OR REPLACE TRIGGER jobs_lease_floor_update AFTER UPDATE ON pgdrain.active_jobs"
            " REFERENCING NEW TABLE AS new_rows"
            " FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.lower_unlocked()"
        )
    enqueue_many(conn, [build_job("k")])
    claimed: list[int] = []
    error: list[BaseException] = []

    def claim() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as run:
                claimed.extend(j.id for j in claim_batch(run, ["default"], 1, "w-dead", 30.0, 0.0))
        except BaseException as exc:
            error.append(exc)

    with other.transaction():
        _raise(other)  # nothing runs: raised to 'infinity', not yet committed
        writer = threading.Thread(target=claim)
        writer.start()
        # The claim's statement has written its row; with the lock it now waits for the raise.
        wait_for(
            lambda: not writer.is_alive() or someone_here_waits_on_a_lock(conn),
            what="the claim finished or waits for the raise",
        )
    writer.join(20)
    assert not error and len(claimed) == 1

    if locked:  # it read the floor after the raise committed, and lowered it to its lease
        assert _floor(conn) != "infinity"
        assert _reclaimed(conn) == claimed
    else:  # it read the floor before the raise committed, and left it above its lease
        assert _floor(conn) == "infinity"
        assert _reclaimed(conn) == []


WRITERS = ["claim", "heartbeat", "update by hand", "insert by hand", "insert in replica mode"]


@pytest.mark.parametrize("triggers", [True, False], ids=["lowered", "control-no-trigger"])
@pytest.mark.parametrize("writer", WRITERS)
def test_every_write_of_a_running_row_lowers_the_floor_below_its_lease(
    conn: Conn, writer: str, triggers: bool
) -> None:
    enqueue_many(conn, [build_job("k")])
    if writer == "heartbeat":  # a lease far ahead, raised to: the floor is that lease
        [held] = claim_batch(conn, ["default"], 1, "w", 600.0, None)
    _raise(conn)
    before = _floor(conn)
    assert before != "-infinity"
    if not triggers:
        # In replica mode the control is the triggers enabled as ordinary ones (migration 0026
        # made them ALWAYS), which such a session does not fire.
        state = "ENABLE" if writer == "insert in replica mode" else "DISABLE"
        conn.execute(
            f"ALTER TABLE pgdrain.active_jobs {state} TRIGGER jobs_lease_floor_update,"
            f" {state} TRIGGER jobs_lease_floor_insert"
        )

    # Each writes a lease that is already over.
    if writer == "claim":
        [held] = claim_batch(conn, ["default"], 1, "w", 30.0, 0.0)
        expired = [held.id]
    elif writer == "heartbeat":  # a stopping run ends its leases: capped at 0 s
        store.job_extend_leases(conn, [held.held], 30.0, 0.0)
        expired = [held.id]
    elif writer == "update by hand":
        expired = [
            r[0]
            for r in conn.execute(
                "UPDATE pgdrain.active_jobs SET status = 'running', attempts = 1,"
                " attempt_token = gen_random_uuid(), leased_by = 'by hand',"
                " heartbeat_at = now(), lease_expires_at = now() - interval '1 minute'"
                " RETURNING id"
            ).fetchall()
        ]
    else:
        conn.execute("DELETE FROM pgdrain.active_jobs")
        if writer == "insert in replica mode":  # as a copy of data: no ordinary trigger fires
            conn.execute("SET session_replication_role = replica")
        expired = [
            r[0]
            for r in conn.execute(
                "INSERT INTO pgdrain.active_jobs (queue, kind, status, attempts,"
                " attempt_token, leased_by, heartbeat_at, lease_expires_at)"
                " VALUES ('default', 'k', 'running', 1, gen_random_uuid(), 'by hand', now(),"
                " now() - interval '1 minute') RETURNING id"
            ).fetchall()
        ]
        conn.execute("RESET session_replication_role")

    if triggers:
        assert _floor(conn) != before
        assert _reclaimed(conn) == expired
    else:
        assert _floor(conn) == before
        assert _reclaimed(conn) == []


@pytest.mark.parametrize("tries", [True, False], ids=["tries", "control-waits"])
def test_a_raise_never_holds_up_a_claim(conn: Conn, other: Conn, db_url: str, tries: bool) -> None:
    raise_statement = query("floors_raise")
    if not tries:  # the lock waited for, not tried
        function_replacing(
            conn,
            "pgdrain.lease_floor_raise()",
            "IF NOT pg_try_advisory_xact_lock(hashtext('pgdrain.lease_floor'))"
            " THEN RETURN; END IF;",
            "PERFORM pg_advisory_xact_lock(hashtext('pgdrain.lease_floor'));",
            "pgdrain.raise_waiting",
        )
        raise_statement = "SELECT pgdrain.raise_waiting()"
    enqueue_many(conn, [build_job("k") for _ in range(2)])
    # An application's transaction that claims, still open; the raise; the next claim.
    held_up = a_raise_holds_up_the_next_write(
        conn,
        other,
        db_url,
        lambda c: claim_batch(c, ["default"], 1, "w-slow", 30.0, None),
        raise_statement,
        lambda c: claim_batch(c, ["default"], 1, "w-next", 30.0, None),
    )

    # With the try, the raise gave up at once and the next claim went on; waiting, the raise
    # queued for the lock behind the open claim, and the next claim queued behind the raise.
    assert held_up is (not tries)


# The reclaim's rows found by joining the expired ones on running rows, as before migration
# 0024: planned generic on statistics that saw few running rows, each join walked all of
# jobs_lease_idx.
BY_PRIMARY_KEY = "    WHERE j.id = ANY(ARRAY(SELECT e.id FROM expired AS e))"
FENCE_IN_A_CASE = "CASE WHEN j.status = 'running' THEN j.attempt_token END = expired.attempt_token"


def _joined_on_running_rows(statement: str) -> str:
    assert statement.count(BY_PRIMARY_KEY) == 2 and statement.count(FENCE_IN_A_CASE) == 2
    joined = without_line(statement, BY_PRIMARY_KEY).replace(
        "      AND j.id = expired.id", "    WHERE j.id = expired.id"
    )
    return joined.replace(
        FENCE_IN_A_CASE, "j.status = 'running' AND j.attempt_token = expired.attempt_token"
    )


def _reclaim_buffers(conn: Conn, statement: str) -> int:
    """The buffers the reclaim visits as a run sends it: prepared, on its generic plan, under
    the drain's settings (EXPLAIN (ANALYZE, BUFFERS), in a transaction rolled back)."""
    conn.execute(("PREPARE reclaim(int) AS " + statement.replace("%(limit)s", "$1")).encode())
    try:
        with conn.transaction(force_rollback=True):
            store.session_limits(conn, 60_000)
            conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            row = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE reclaim(100)"
            ).fetchone()
    finally:
        conn.execute("DEALLOCATE reclaim")
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


@pytest.mark.parametrize(
    ("raised", "by_primary_key"),
    [(True, True), (False, True), (True, False)],
    ids=["raised", "control-not-raised", "control-joined-on-running-rows"],
)
def test_behind_a_held_snapshot_the_reclaim_skips_the_jobs_that_ran_since(
    conn: Conn, other: Conn, raised: bool, by_primary_key: bool
) -> None:
    statement = query("job_reclaim_expired")
    if not by_primary_key:
        statement = _joined_on_running_rows(statement)
    with other.transaction():
        # A report's snapshot, held while 2,000 jobs run.
        other.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT 1")
        enqueue_many(conn, [build_job("k") for _ in range(2000)])
        # Claimed with leases that are already over (as a day later), then done: each leaves
        # a dead entry in jobs_lease_idx that no vacuum may remove while the snapshot is held.
        claimed = claim_batch(conn, ["default"], 2000, "w", 30.0, 0.0)
        done = store.job_complete_many(conn, [job.held for job in claimed])
        assert len(done.applied_attempts) == 2000
        conn.execute("VACUUM pgdrain.active_jobs")
        if raised:
            _raise(conn)  # the next run's, before its reclaim

        visited = _reclaim_buffers(conn, statement)

    # Raised past them, the scan starts after them and the rows are found by primary key;
    # else a scan walks every one of them to find none.
    if raised and by_primary_key:
        assert visited < 30
    else:
        assert visited > 50
