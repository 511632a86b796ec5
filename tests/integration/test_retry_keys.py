"""`pgdrain retry` and idempotency keys (migration 0012): a key is held by the queue's queued,
running or parked job that carries it, and freed by done, failed and cancelled. A retry that
would take a key another job holds leaves that job alone and names the holder; the others are
retried. Concurrent takers of one key (another retry, an enqueue) are set up deterministically:
the first holds its transaction open on a second connection, the second is seen waiting on it
in pg_stat_activity, then the first commits."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, job_row, wait_for, without_line
from helpers.history import enqueued_as_0041
from helpers.lock_waits import waits_on_a_lock
from pgdrain import enqueue
from pgdrain.db import store
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]
KEY = "K1"


def _status(conn: Conn, job_id: int) -> str:
    return str(job_row(conn, job_id)["status"])


def _failed(conn: Conn, key: str | None = KEY, kind: str = "noop") -> int:
    """A job that ended failed (its key, if any, freed)."""
    job_id = enqueue(conn, kind, idempotency_key=key)
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'failed', attempts = 1, finished_at = now()"
        " WHERE id = %s",
        (job_id,),
    )
    return job_id


def _parked(conn: Conn, key: str | None = KEY) -> int:
    """A job whose run died with recovery_policy manual: parked by reclaim."""
    job_id = enqueue(conn, "noop", idempotency_key=key, recovery_policy="manual")
    claim_batch(conn, ["default"], 1, "a-run-that-died", 30.0, None)
    conn.execute(
        "UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
        (job_id,),
    )
    store.job_reclaim_expired(conn, 10)
    assert _status(conn, job_id) == "parked"
    return job_id


@pytest.mark.parametrize("checked", [True, False], ids=["key-checked", "control-unchecked"])
def test_a_retry_by_filter_leaves_a_job_whose_key_is_held_and_retries_the_others(
    conn: Conn, checked: bool
) -> None:
    """The issue's timeline: `enqueue boom --key K1` fails; `enqueue noop --key K1` (the key
    was freed); an unrelated failed job; `retry --failed`."""
    first = _failed(conn, kind="boom")
    holder = enqueue(conn, "noop", idempotency_key=KEY)
    unrelated = _failed(conn, key=None, kind="other")
    params = {"statuses": ["failed"], "queue": None, "kind": None, "since": None}
    if checked:
        found = store.job_retry_matching(conn, ["failed"])
        assert found == [
            store.Retry(first, "default", "boom", retried=False, held_by=holder),
            store.Retry(unrelated, "default", "other", retried=True, held_by=None),
        ]
        assert (_status(conn, first), _status(conn, unrelated)) == ("failed", "queued")
    else:  # the statement without its key check: the error, and nothing retried
        statement = without_line(query("job_retry_matching"), "AND r.held_by IS NULL")
        with pytest.raises(psycopg.errors.UniqueViolation, match="jobs_active_key_idx"):
            conn.execute(statement, params)
        assert (_status(conn, first), _status(conn, unrelated)) == ("failed", "failed")
    assert _status(conn, holder) == "queued"


def test_of_several_jobs_retried_with_one_key_the_newest_takes_it(conn: Conn) -> None:
    older, newer = _failed(conn), _failed(conn)
    other = _failed(conn, key="K2")
    found = store.job_retry(conn, [older, newer, other])
    assert [(r.id, r.retried, r.held_by) for r in found] == [
        (older, False, newer),
        (newer, True, None),
        (other, True, None),
    ]
    # Run again: the newer one, queued now, holds the key; nothing else changes.
    again = store.job_retry(conn, [older, newer, other])
    assert [(r.id, r.retried, r.held_by) for r in again] == [(older, False, newer)]


def _in_a_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


@pytest.mark.parametrize("again", [True, False], ids=["run-again", "control-once"])
@pytest.mark.parametrize("first_taker", ["retry", "enqueue"])
def test_a_key_taken_by_a_concurrent_transaction_is_seen_not_raised(
    db_url: str, conn: Conn, first_taker: str, again: bool
) -> None:
    """Two failed jobs with one key (or a failed job and a new enqueue of its key): the first
    taker's transaction holds the key, uncommitted, when the retry of the other reads its
    snapshot; the retry's update waits on it and, once it commits, meets the key. The store runs
    the retry again (a new snapshot sees the holder); the control runs the statement once."""
    older = _failed(conn)
    newer = _failed(conn) if first_taker == "retry" else None
    with (
        psycopg.connect(db_url, autocommit=True) as first,
        psycopg.connect(db_url, autocommit=True) as second,
    ):
        with first.transaction():
            if first_taker == "retry":
                assert newer is not None
                [taken] = store.job_retry(first, [newer])
                assert taken.retried
                holder = newer
            else:
                holder = enqueue(first, "noop", idempotency_key=KEY)
            if again:
                thread, out = _in_a_thread(lambda: store.job_retry(second, [older]))
            else:
                thread, out = _in_a_thread(
                    lambda: second.execute(query("job_retry"), {"ids": [older]}).fetchall()
                )
            pid = second.info.backend_pid
            wait_for(lambda: waits_on_a_lock(conn, pid), what="the retry to wait on the key")
        thread.join(30)
    assert not thread.is_alive()
    if again:
        assert "error" not in out, out
        assert out["result"] == [store.Retry(older, "default", "noop", False, holder)]
    else:
        assert isinstance(out["error"], psycopg.errors.UniqueViolation)
    assert (_status(conn, older), _status(conn, holder)) == ("failed", "queued")


def test_a_retry_in_a_transaction_that_rolls_back_changes_nothing(conn: Conn) -> None:
    """`--dry-run`: the same statement, in a transaction rolled back; its savepoints with it."""
    held, unrelated = _failed(conn), _failed(conn, key=None)
    holder = enqueue(conn, "noop", idempotency_key=KEY)
    with conn.transaction(force_rollback=True):
        found = store.job_retry_matching(conn, ["failed"])
    assert [(r.id, r.retried, r.held_by) for r in found] == [
        (held, False, holder),
        (unrelated, True, None),
    ]
    assert (_status(conn, held), _status(conn, unrelated)) == ("failed", "failed")


# -- the key of a parked job ------------------------------------------------------------------


def _the_0004_index(conn: Conn) -> None:
    """The control: the key index as migration 0004 made it, which a parked job is not in."""
    conn.execute("DROP INDEX pgdrain.jobs_active_key_idx")
    conn.execute(
        "CREATE UNIQUE INDEX jobs_active_key_idx ON pgdrain.active_jobs (queue, idempotency_key)"
        " WHERE idempotency_key IS NOT NULL AND status IN ('queued', 'running')"
    )


@pytest.mark.parametrize("held", [True, False], ids=["parked-holds", "control-0004-index"])
def test_a_parked_job_holds_its_key_until_a_person_decides(conn: Conn, held: bool) -> None:
    """A parked job's work may have happened; a person decides whether it runs again. While it
    waits, its key enqueues nothing new (that would do the work a second time), and `retry`
    keeps the key with it. With 0004's index a second job is made, and the parked one can then
    not be retried at all."""
    if not held:
        _the_0004_index(conn)
        enqueued_as_0041(conn)  # nor does the enqueue's trigger look at the key (0046)
    parked = _parked(conn)
    again = enqueue(conn, "noop", idempotency_key=KEY)
    if held:
        assert again == parked
        [retried] = store.job_retry(conn, [parked])
        assert retried.retried and _status(conn, parked) == "queued"
    else:
        assert again != parked  # two jobs for one key's work
        with pytest.raises(store.RetryContended):
            store.job_retry(conn, [parked])
        assert _status(conn, parked) == "parked"


def test_cancelling_a_parked_job_frees_its_key_and_a_cancelled_job_is_not_retried_over_it(
    conn: Conn,
) -> None:
    parked = _parked(conn)
    [cancelled] = store.job_cancel(conn, [parked])
    assert cancelled.was == "parked"
    newer = enqueue(conn, "noop", idempotency_key=KEY)
    assert newer != parked
    assert store.job_retry(conn, [parked]) == [store.Retry(parked, "default", "noop", False, newer)]
    assert _status(conn, parked) == "cancelled"


def test_a_failed_job_is_not_retried_over_a_parked_one(conn: Conn) -> None:
    failed = _failed(conn)
    parked = _parked(conn)  # enqueued after the failure freed the key
    found = store.job_retry(conn, [failed, parked])
    assert [(r.id, r.retried, r.held_by) for r in found] == [
        (failed, False, parked),
        (parked, True, None),
    ]


def test_a_retry_whose_concurrent_taker_rolls_back_takes_the_key(db_url: str, conn: Conn) -> None:
    """The third interleaving: the retry waits on a key whose taker then rolls back."""
    older, newer = _failed(conn), _failed(conn)
    with (
        psycopg.connect(db_url, autocommit=True) as first,
        psycopg.connect(db_url, autocommit=True) as second,
    ):
        with first.transaction(force_rollback=True):
            [taken] = store.job_retry(first, [newer])
            assert taken.retried
            thread, out = _in_a_thread(lambda: store.job_retry(second, [older]))
            pid = second.info.backend_pid
            wait_for(lambda: waits_on_a_lock(conn, pid), what="the retry to wait on the key")
        thread.join(30)
    assert out == {"result": [store.Retry(older, "default", "noop", True, None)]}
    assert (_status(conn, older), _status(conn, newer)) == ("queued", "failed")


def test_migration_0012_gives_each_key_to_one_unfinished_job(empty_db_url: str) -> None:
    """Under 0004 a parked job freed its key, so a database may hold a parked job and a queued
    one with the same key, or two parked ones. 0012 keeps the key with the queued or running
    job, else the newest parked one; a parked job that yields is cancelled, saying why (a person
    can retry it by id once the key is free). Every other row stays as it was."""
    from pgdrain.db.migrate import migrate
    from pgdrain.db.sql import migrations

    with psycopg.connect(empty_db_url, autocommit=True) as db:
        with db.transaction():
            for migration in migrations():
                if migration.version < "0012":
                    store.migration_record(db, migration)

        def job(status: str, key: str | None) -> int:
            row = db.execute(
                "INSERT INTO pgdrain.jobs (kind, status, idempotency_key, last_error)"
                " VALUES ('noop', %s, %s, 'lease expired before completion') RETURNING id",
                (status, key),
            ).fetchone()
            assert row is not None
            return int(row[0])

        parked_behind_queued, queued = job("parked", "a"), job("queued", "a")
        older_parked, newer_parked = job("parked", "b"), job("parked", "b")
        alone, failed = job("parked", "c"), job("failed", "c")
        other_queue = db.execute(
            "INSERT INTO pgdrain.jobs (kind, queue, status, idempotency_key)"
            " VALUES ('noop', 'other', 'parked', 'a') RETURNING id"
        ).fetchone()
        assert other_queue is not None

        assert migrate(db).applied[0] == "0012_parked_keys_and_exact_limits.sql"

        def row(job_id: int) -> tuple[str, str]:
            found = db.execute(
                "SELECT status, last_error FROM pgdrain.jobs WHERE id = %s", (job_id,)
            ).fetchone()
            assert found is not None
            return found[0], found[1]

        assert row(parked_behind_queued) == (
            "cancelled",
            "cancelled by migration 0012: parked, its idempotency key is held by job "
            f"{queued} (retry it once that job is finished); before: "
            "lease expired before completion",
        )
        assert row(older_parked)[0] == "cancelled"
        assert f"held by job {newer_parked} " in row(older_parked)[1]
        kept = [queued, newer_parked, alone, failed, int(other_queue[0])]
        assert [row(j)[0] for j in kept] == ["queued", "parked", "parked", "failed", "parked"]
        # The key of the cancelled job is free once its holder is finished: a retry by id.
        db.execute("UPDATE pgdrain.jobs SET status = 'done' WHERE id = %s", (queued,))
        [retried] = store.job_retry(db, [parked_behind_queued])
        assert retried.retried
