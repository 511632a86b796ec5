"""The queue operations one by one, on a real database."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg.types.json import Jsonb

from helpers.fixtures import claim_batch, complete_one, job_row
from pgdrain import BadInput, build_job, enqueue, enqueue_many, workflow
from pgdrain.db import store

Conn = psycopg.Connection[Any]


def _claim(conn: Conn, limit: int = 10, lease: float = 30.0) -> list[store.ClaimedJob]:
    return claim_batch(conn, ["default"], limit, "test-worker", lease, None)


def test_a_job_goes_queued_running_done(conn: Conn) -> None:
    job_id = enqueue(conn, "noop", {"x": 1})
    [claimed] = _claim(conn)
    assert (claimed.id, claimed.attempt, claimed.payload) == (job_id, 1, {"x": 1})
    row = job_row(conn, job_id)
    assert row["status"] == "running" and row["attempt_token"] == claimed.attempt_token
    assert complete_one(conn, store.Held(claimed.id, claimed.attempt_token))
    row = job_row(conn, job_id)
    assert row["status"] == "done" and row["attempt_token"] is None
    assert row["finished_at"] is not None


def test_claim_respects_priority_then_run_at_then_id(conn: Conn) -> None:
    low = enqueue(conn, "noop", priority=5)
    high = enqueue(conn, "noop", priority=-1)
    later = enqueue(conn, "noop", priority=5)
    assert [c.id for c in _claim(conn)] == [high, low, later]


def test_a_delayed_job_is_not_ready(conn: Conn) -> None:
    enqueue(conn, "noop", delay=60)
    assert _claim(conn) == []


def test_claim_takes_only_its_queues(conn: Conn) -> None:
    enqueue(conn, "noop", queue="emails")
    assert _claim(conn) == []
    assert len(claim_batch(conn, ["emails"], 10, "w", 30, None)) == 1


def test_the_lease_is_capped_at_the_deadline(conn: Conn) -> None:
    enqueue(conn, "noop")
    [claimed] = claim_batch(conn, ["default"], 1, "w", 600.0, 5.0)
    row = conn.execute(
        "SELECT extract(epoch FROM lease_expires_at - now()) FROM pgdrain.jobs WHERE id = %s",
        (claimed.id,),
    ).fetchone()
    assert row is not None and 3.0 < row[0] <= 5.0


def test_fail_retries_with_the_given_delay_then_fails_at_max_attempts(conn: Conn) -> None:
    job_id = enqueue(conn, "noop", max_attempts=2)
    [first] = _claim(conn)
    outcome = store.job_fail(conn, store.Held(job_id, first.attempt_token), "boom", 0.0)
    assert isinstance(outcome, store.Failed) and outcome.status == "queued"
    [second] = _claim(conn)
    assert second.attempt == 2
    outcome = store.job_fail(conn, store.Held(job_id, second.attempt_token), "boom again", 0.0)
    assert isinstance(outcome, store.Failed) and outcome.status == "failed"
    assert job_row(conn, job_id)["last_error"] == "boom again"


def test_release_gives_the_attempt_back(conn: Conn) -> None:
    job_id = enqueue(conn, "noop")
    [claimed] = _claim(conn)
    result = store.job_release_many(conn, [store.Held(job_id, claimed.attempt_token)])
    assert result.applied == {job_id}
    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 0)


def test_a_repeated_idempotency_key_returns_the_same_job(conn: Conn) -> None:
    first = enqueue(conn, "noop", idempotency_key="order-42")
    second = enqueue(conn, "noop", {"other": True}, idempotency_key="order-42")
    assert first == second
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (1,)


def test_enqueue_joins_the_callers_transaction(conn: Conn) -> None:
    with conn.transaction(force_rollback=True):
        enqueue(conn, "noop")
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)


def _enqueue_one(conn: Conn) -> None:
    enqueue(conn, "noop")


def _enqueue_many(conn: Conn) -> None:
    enqueue_many(conn, [build_job("noop"), build_job("noop")])


def _workflow(conn: Conn) -> None:
    with workflow(conn) as wf:
        wf.enqueue("noop", after=[wf.enqueue("noop")])


ENQUEUES = [_enqueue_one, _enqueue_many, _workflow]


@pytest.mark.parametrize("enqueue_on", ENQUEUES, ids=["enqueue", "enqueue_many", "workflow"])
@pytest.mark.parametrize("end", ["rollback", "commit"])
def test_a_fresh_connection_not_autocommit_leaves_the_commit_to_its_caller(
    db_url: str, conn: Conn, enqueue_on: Any, end: str
) -> None:
    """psycopg's default connection, no transaction open yet: the jobs are in the caller's
    transaction (a red team's report: enqueue_many and workflow committed on their own)."""
    with psycopg.connect(db_url) as app:
        enqueue_on(app)
        assert app.info.transaction_status == pq.TransactionStatus.INTRANS
        assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)
        app.rollback() if end == "rollback" else app.commit()
    [(count,)] = conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchall()
    assert count == (0 if end == "rollback" else 1 if enqueue_on is _enqueue_one else 2)


@pytest.mark.parametrize("enqueue_on", ENQUEUES[1:], ids=["enqueue_many", "workflow"])
def test_on_an_autocommit_connection_many_jobs_commit_as_one(conn: Conn, enqueue_on: Any) -> None:
    enqueue_on(conn)
    assert conn.info.transaction_status == pq.TransactionStatus.IDLE
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (2,)


def test_a_failed_many_leaves_the_callers_transaction_usable(db_url: str) -> None:
    """All or none, in a savepoint: the caller's earlier write stays, and it may go on."""
    missing = 2**40  # no such job: the insert that depends on it fails
    with psycopg.connect(db_url) as app:
        enqueue(app, "noop")
        with pytest.raises(BadInput):
            enqueue_many(app, [build_job("noop"), build_job("noop", after=[missing])])
        with pytest.raises(BadInput):
            with workflow(app) as wf:
                wf.enqueue("noop")
                wf.enqueue("noop", after=[missing])
        enqueue(app, "noop")
        app.commit()
        assert app.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (2,)


def test_enqueue_many_is_one_statement_for_the_whole_list(conn: Conn) -> None:
    jobs = [enqueue_job(i) for i in range(1000)]
    ids = store.job_insert_many(conn, jobs)
    assert len(ids) == 1000
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (1000,)


def enqueue_job(i: int) -> store.NewJob:
    from pgdrain import build_job

    return build_job("noop", {"i": i})


def test_reclaim_requeues_an_expired_lease_and_counts_it(conn: Conn) -> None:
    job_id = enqueue(conn, "noop")
    _claim(conn, lease=1)
    conn.execute("UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 second'")
    [reclaimed] = store.job_reclaim_expired(conn, 10)
    assert (reclaimed.id, reclaimed.status, reclaimed.reclaim_count) == (job_id, "queued", 1)
    assert "lease expired" in job_row(conn, job_id)["last_error"]


def test_reclaim_parks_a_manual_job_instead_of_retrying_it(conn: Conn) -> None:
    job_id = enqueue(conn, "noop", recovery_policy="manual")
    _claim(conn, lease=1)
    conn.execute("UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 second'")
    [reclaimed] = store.job_reclaim_expired(conn, 10)
    assert reclaimed.status == "parked"
    row = job_row(conn, job_id)
    # Not finished (retention never deletes it), not ready (no run claims it), no lease.
    assert (row["finished_at"], row["attempt_token"]) == (None, None)
    assert _claim(conn) == []


def test_reclaim_fails_an_auto_job_whose_attempts_are_spent(conn: Conn) -> None:
    job_id = enqueue(conn, "noop", max_attempts=1)
    _claim(conn, lease=1)
    conn.execute("UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 second'")
    [reclaimed] = store.job_reclaim_expired(conn, 10)
    assert reclaimed.status == "failed"
    assert job_row(conn, job_id)["finished_at"] is not None


@pytest.mark.parametrize("max_attempts", [2, 1], ids=["requeued", "failed"])
def test_reclaim_appends_the_lost_attempt_to_the_error_history(
    conn: Conn, max_attempts: int
) -> None:
    job_id = enqueue(conn, "noop", max_attempts=max_attempts)
    _claim(conn, lease=1)
    # A full history: the oldest entry gives way, as in job_fail.
    full = [{"message": f"m{i}", "type": "E", "traceback": None, "attempt": 0} for i in range(50)]
    conn.execute(
        "UPDATE pgdrain.jobs SET errors = %s, lease_expires_at = now() - interval '1 second'",
        (Jsonb(full),),
    )
    [reclaimed] = store.job_reclaim_expired(conn, 10)
    assert reclaimed.status == ("queued" if max_attempts == 2 else "failed")
    row = job_row(conn, job_id)
    assert len(row["errors"]) == 50 and row["errors"][0]["message"] == "m1"
    lost = row["errors"][-1]
    assert lost == {
        "message": row["last_error"],
        "type": "LeaseExpired",
        "traceback": None,
        "attempt": 1,
        "at": lost["at"],
    }
    assert row["last_error"].startswith("lease expired before completion (attempt 1 of ")
    assert store.job_reclaim_expired(conn, 10) == []  # safe to repeat: appended once
    assert job_row(conn, job_id)["errors"] == row["errors"]


def test_stats_counts_per_queue_and_status(conn: Conn) -> None:
    enqueue(conn, "noop")
    enqueue(conn, "noop", delay=60)
    enqueue(conn, "noop", queue="emails")
    stats = {s.queue: s for s in store.queue_stats(conn)}
    assert (stats["default"].queued, stats["default"].ready) == (2, 1)
    assert stats["emails"].queued == 1


def test_the_fence_refuses_a_stale_token(conn: Conn) -> None:
    job_id = enqueue(conn, "noop")
    _claim(conn)
    stale = store.Held(job_id, uuid.uuid4())
    assert not complete_one(conn, stale)
    assert job_row(conn, job_id)["status"] == "running"
