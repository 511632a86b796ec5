"""Idempotency keys (migrations 0004 and 0012): unique per queue, and only among unfinished
jobs. While a job with the key is queued, running (or parked: tests/integration/
test_retry_keys.py), the key returns that job; once it is done or failed, the key is free and
enqueues a new job. A failed job whose key was taken since is not retried by `pgdrain retry`
(the newer job does the work)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, complete_one, job_row
from helpers.history import enqueued_as_0041
from helpers.sql_functions import function_text
from pgdrain import enqueue
from pgdrain.db import store
from pgdrain.db.migrate import migrate
from pgdrain.db.sql import migrations

Conn = psycopg.Connection[Any]


def _id(row: tuple[Any, ...] | None) -> int:
    assert row is not None
    return int(row[0])


def _claim(conn: Conn, queue: str = "default") -> store.ClaimedJob:
    [job] = claim_batch(conn, [queue], 1, "test", 30.0, None)
    return job


def test_a_key_returns_the_unfinished_job_queued_or_running(conn: Conn) -> None:
    first = enqueue(conn, "noop", idempotency_key="order-42")
    assert enqueue(conn, "noop", {"other": True}, idempotency_key="order-42") == first
    _claim(conn)
    assert job_row(conn, first)["status"] == "running"
    assert enqueue(conn, "noop", idempotency_key="order-42") == first


def test_keys_of_different_queues_do_not_collide(conn: Conn) -> None:
    emails = enqueue(conn, "noop", queue="emails", idempotency_key="order-42")
    sms = enqueue(conn, "noop", queue="sms", idempotency_key="order-42")
    assert emails != sms
    assert enqueue(conn, "noop", queue="sms", idempotency_key="order-42") == sms


def test_a_done_job_frees_its_key(conn: Conn) -> None:
    """Was: the same key returned the old, done job's id for ever."""
    first = enqueue(conn, "noop", idempotency_key="nightly-2026-12-01")
    assert complete_one(conn, _claim(conn).held)
    second = enqueue(conn, "noop", idempotency_key="nightly-2026-12-01")
    assert second != first
    assert (job_row(conn, first)["status"], job_row(conn, second)["status"]) == (
        "done",
        "queued",
    )


def test_a_failed_job_frees_its_key_and_is_not_retried_over_a_newer_one(conn: Conn) -> None:
    first = enqueue(conn, "noop", idempotency_key="k", max_attempts=1)
    failed = store.job_fail(conn, _claim(conn).held, "boom", 0.0, final=True)
    assert not isinstance(failed, store.LeaseLost)
    assert job_row(conn, first)["status"] == "failed"
    second = enqueue(conn, "noop", idempotency_key="k")
    assert second != first
    # The newer job holds the key: retrying the failed one would make two; it is left failed.
    assert store.job_retry(conn, [first]) == [store.Retry(first, "default", "noop", False, second)]
    assert job_row(conn, first)["status"] == "failed"
    # Control: once the newer job is done, the key is free and the retry goes through.
    assert complete_one(conn, _claim(conn).held)
    assert store.job_retry(conn, [first]) == [store.Retry(first, "default", "noop", True, None)]
    assert job_row(conn, first)["status"] == "queued"


def test_enqueue_many_skips_only_keys_held_in_the_same_queue(conn: Conn) -> None:
    from pgdrain import build_job, enqueue_many

    held = enqueue(conn, "noop", idempotency_key="a")
    ids = enqueue_many(
        conn,
        [
            build_job("noop", idempotency_key="a"),  # held in default: skipped
            build_job("noop", queue_name="other", idempotency_key="a"),
            build_job("noop", idempotency_key="b"),
        ],
    )
    assert len(ids) == 2 and held not in ids


def test_migration_0004_keeps_existing_rows_and_frees_finished_keys(empty_db_url: str) -> None:
    """A database at 0003 with keys under the old rule (one per database), some on finished
    jobs: 0004 applies, every row stays, and a finished job's key enqueues anew."""
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        with conn.transaction():
            for migration in migrations():
                if migration.version < "0004":
                    store.migration_record(conn, migration)
        # Rows as 0003's code wrote them (today's enqueue speaks 0004's index).
        insert = "INSERT INTO pgdrain.jobs (kind, idempotency_key) VALUES ('noop', %s) RETURNING id"
        done = _id(conn.execute(insert, ("done-key",)).fetchone())
        conn.execute(
            "UPDATE pgdrain.jobs SET status = 'done', finished_at = now() WHERE id = %s", (done,)
        )
        queued = _id(conn.execute(insert, ("queued-key",)).fetchone())
        before = conn.execute("SELECT id, status, idempotency_key FROM pgdrain.jobs").fetchall()

        assert migrate(conn).applied[0] == "0004_idempotency_per_queue.sql"

        after = conn.execute("SELECT id, status, idempotency_key FROM pgdrain.jobs").fetchall()
        assert sorted(after) == sorted(before)
        assert enqueue(conn, "noop", idempotency_key="queued-key") == queued
        assert enqueue(conn, "noop", idempotency_key="done-key") not in (done, queued)


def _count(conn: Conn, statement: str) -> int:
    row = conn.execute(statement.encode()).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("found", [True, False], ids=["the-holder", "control-0041"])
def test_a_held_key_enqueued_with_flow_returns_its_holder_and_writes_nothing(
    conn: Conn, found: bool
) -> None:
    """A red team's finding: a held key enqueued again `after=` a cancelled job inserted a new
    cancelled job and returned its id; with a sequence, it made the sequence's row."""
    if not found:
        enqueued_as_0041(conn)
    ended = enqueue(conn, "k")
    store.job_cancel(conn, [ended])
    holder = enqueue(conn, "k", idempotency_key="order-7")
    jobs_before = _count(conn, "SELECT count(*) FROM pgdrain.jobs")
    again = enqueue(conn, "k", idempotency_key="order-7", after=[ended])
    in_sequence = enqueue(conn, "k", idempotency_key="order-7", sequence="never-used")
    made = _count(conn, "SELECT count(*) FROM pgdrain.sequences WHERE sequence = 'never-used'")
    if found:
        assert (again, in_sequence) == (holder, holder)
        assert (_count(conn, "SELECT count(*) FROM pgdrain.jobs"), made) == (jobs_before, 0)
    else:  # a cancelled job of the key, its id returned; the sequence's row made
        assert again != holder and job_row(conn, again)["status"] == "cancelled"
        assert (in_sequence, made) == (holder, 1)


@pytest.mark.parametrize("waits", [True, False], ids=["waits-for-the-lease", "control-0041"])
def test_a_key_whose_job_was_cancelled_running_starts_its_next_job_after_the_lease(
    conn: Conn, waits: bool
) -> None:
    """A red team's finding: cancelling a running job freed its key at once, and the next job
    of the key ran beside the cancelled attempt's code, which may run until its lease ends."""
    if not waits:
        enqueued_as_0041(conn)
    first = enqueue(conn, "k", idempotency_key="charge-7")
    [claimed] = claim_batch(conn, ["default"], 1, "run-a", 300.0, None)
    assert claimed.id == first
    lease_end = job_row(conn, first)["lease_expires_at"]
    store.job_cancel(conn, [first])
    second = enqueue(conn, "k", idempotency_key="charge-7")
    assert second != first  # the key is free: a new job
    again = claim_batch(conn, ["default"], 1, "run-b", 300.0, None)
    if waits:
        assert (again, job_row(conn, second)["run_at"]) == ([], lease_end)
    else:
        assert [j.id for j in again] == [second]  # beside the cancelled attempt


@pytest.mark.parametrize("locked", [True, False], ids=["serialization-failure", "control-read"])
def test_a_held_key_whose_holder_finished_after_the_snapshot_is_never_dropped(
    db_url: str, conn: Conn, locked: bool
) -> None:
    """A review's finding: the holder read, not locked, from a REPEATABLE READ snapshot older
    than its finish: the enqueue returned the finished holder and inserted nothing, its work
    lost. Locked, it is a serialization failure, and the transaction run again makes the job.
    The control reads the holder without the lock."""
    if not locked:
        text = function_text(conn, "pgdrain.jobs_flow_enqueued()")
        assert text.count("FOR KEY SHARE;") == 1
        conn.execute(text.replace("FOR KEY SHARE;", ";").encode())
    holder = enqueue(conn, "k", idempotency_key="K")
    [claimed] = claim_batch(conn, ["default"], 1, "run-a", 300.0, None)
    with psycopg.connect(db_url) as app:
        app.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        app.execute("SELECT count(*) FROM pgdrain.jobs")  # the snapshot: the holder unfinished
        assert complete_one(conn, claimed.held)  # the holder finishes, the key is free
        if locked:
            with pytest.raises(psycopg.errors.SerializationFailure):
                enqueue(app, "k", idempotency_key="K", sequence="s")
            app.rollback()
            again = enqueue(app, "k", idempotency_key="K", sequence="s")  # run again
            app.commit()
            assert again != holder and job_row(conn, again)["status"] == "queued"
        else:
            assert enqueue(app, "k", idempotency_key="K", sequence="s") == holder
            app.commit()
            assert _count(conn, "SELECT count(*) FROM pgdrain.jobs") == 1  # dropped
