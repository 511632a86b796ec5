"""Per-queue concurrency limits that hold across all concurrent runs (PGDRAIN_QUEUE_LIMITS):
a queue calling a rate-limited API at 2 at a time. The claim locks the queue's limit row and
reads the running count the last claim committed (a trigger keeps it). The race without the
lock is reproduced deterministically (a second claim while the first is uncommitted), beside
the same timeline with it; then two real drains at once never run more than the limit."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, complete_and_claim, wait_for, without_line
from helpers.ledger_jobs import jobs as registry
from pgdrain import Budget, Settings, drain, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.aws import events
from pgdrain.aws.control import RunControl
from pgdrain.aws.wake import Waker
from pgdrain.db import store
from pgdrain.db.sql import query
from pgdrain.settings import parse_queue_limits

Conn = psycopg.Connection[Any]
LIMIT = 2
LOCK_LINE = "FOR UPDATE OF l"


def _enqueue(conn: Conn, n: int, kind: str = "noop", **payload: Any) -> None:
    with conn.transaction():
        enqueue_many(conn, [build_job(kind, payload, queue_name="emails") for _ in range(n)])


def _running(conn: Conn) -> tuple[int, int]:
    """(running jobs, the limit row's running count)."""
    jobs = conn.execute("SELECT count(*) FROM pgdrain.jobs WHERE status = 'running'").fetchone()
    row = conn.execute("SELECT running FROM pgdrain.queue_limits WHERE queue = 'emails'")
    counted = row.fetchone()
    assert jobs is not None and counted is not None
    return int(jobs[0]), int(counted[0])


def _params(worker: str) -> dict[str, Any]:
    return {
        "done_ids": [],
        "done_tokens": [],
        "queues": ["emails"],
        "limit": 10,
        "worker": worker,
        "lease_seconds": 30,
        "cap_seconds": None,
        "claim_id": None,
        "keep_done": True,
        "position_queue": [],
        "position_priority": [],
        "position_run_at_us": [],
        "position_id": [],
    }


def test_the_setting() -> None:
    assert parse_queue_limits("emails=2, sms=5,") == (("emails", 2), ("sms", 5))
    assert Settings.from_env({"PGDRAIN_QUEUE_LIMITS": "emails=2"}).queue_limits == (("emails", 2),)


@pytest.mark.parametrize("locked", [True, False], ids=["row-lock", "control-no-lock"])
def test_two_claims_at_once_keep_the_limit(db_url: str, conn: Conn, locked: bool) -> None:
    store.queue_limit_sync(conn, ["emails"], [("emails", LIMIT)])
    _enqueue(conn, 10)
    statement = query("job_complete_and_claim")
    if not locked:
        statement = without_line(statement, LOCK_LINE)
    first = psycopg.connect(db_url, autocommit=True)
    second = psycopg.connect(db_url, autocommit=True)
    second_pid = second.info.backend_pid
    claimed: dict[str, int] = {}

    def claim_second() -> None:
        rows = second.execute(statement, _params("second")).fetchall()
        claimed["second"] = sum(1 for r in rows if not r[0])

    try:
        with first.transaction():
            rows = first.execute(statement, _params("first")).fetchall()
            claimed["first"] = sum(1 for r in rows if not r[0])
            thread = threading.Thread(target=claim_second)
            thread.start()  # the second claim, while the first is not committed yet
            if locked:  # it waits on the queue's limit row
                wait_for(lambda: _waits(conn, second_pid), what="the second claim to wait")
            else:
                thread.join(10)
        thread.join(10)
    finally:
        first.close()
        second.close()

    assert claimed["first"] == LIMIT
    if locked:
        assert claimed["second"] == 0
        assert _running(conn) == (LIMIT, LIMIT)
    else:  # both saw two free slots: four run at once
        assert claimed["second"] == LIMIT
        assert _running(conn)[0] == 2 * LIMIT


def _waits(conn: Conn, pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0])


def test_the_count_follows_every_way_an_attempt_ends(conn: Conn) -> None:
    store.queue_limit_sync(conn, ["emails"], [("emails", 5)])
    _enqueue(conn, 5)
    a, b, c, d, e = claim_batch(conn, ["emails"], 5, "w", 30, None)
    assert _running(conn) == (5, 5)
    store.job_complete_many(conn, [a.held])
    store.job_fail(conn, b.held, "boom", 60)
    store.job_release_many(conn, [c.held])
    conn.execute(
        "UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s", (d.id,)
    )
    store.job_reclaim_expired(conn, 10)
    assert _running(conn) == (1, 1)  # e still runs
    complete_and_claim(conn, [e.held], ["emails"], 10, "w", 30, None)
    # e's completion frees its slot within the same statement: the claim takes its place
    assert _running(conn)[0] == _running(conn)[1]


def test_two_drains_at_once_never_run_more_than_the_limit(ledger_url: str, conn: Conn) -> None:
    settings = Settings(queues=("emails",), concurrency=4, reserve_seconds=0.5)
    store.queue_limit_sync(conn, ["emails"], [("emails", LIMIT)])
    _enqueue(conn, 12, kind="slow", seconds=0.1)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    done: list[int] = []

    def one(name: str) -> None:
        try:
            budget = Budget.seconds(60)
            control = RunControl(
                events.Trigger("enqueue", ("emails",)),
                name,
                budget,
                waker=Waker(settings, None),
                queue_limits=(("emails", LIMIT),),
            )
            barrier.wait()
            result = drain(settings, budget, registry, ledger_url, worker_id=name, hooks=control)
            done.append(result.done)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(f"run-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert errors == []
    assert sum(done) == 12
    assert _most_at_once(conn) <= LIMIT
    assert _running(conn) == (0, 0)


class _LimitsUnwritten:
    """A run's hooks that write no limit: `pgdrain drain` and `pgdrain worker` as they were."""

    def after_connect(self, session: Any) -> bool:
        return True

    def after_round_trip(self, session: Any, counts: Any, elapsed_s: float) -> None:
        pass

    def before_exit(self, session: Any) -> bool:
        return False


def _most_at_once(conn: Conn) -> int:
    """The most attempts ever running at once, from the ledger of starts and returns."""
    row = conn.execute(
        "SELECT max(c) FROM (SELECT sum(CASE phase WHEN 'start' THEN 1 ELSE -1 END)"
        " OVER (ORDER BY at, CASE phase WHEN 'start' THEN 1 ELSE 0 END) AS c"
        " FROM public.ledger) AS s"
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("writes", [True, False], ids=["writes-its-limit", "control-unwritten"])
def test_a_drain_outside_the_function_keeps_its_configured_limit(
    ledger_url: str, conn: Conn, writes: bool
) -> None:
    settings = Settings(
        queues=("emails",), concurrency=4, reserve_seconds=0.5, queue_limits=(("emails", 1),)
    )
    _enqueue(conn, 4, kind="slow", seconds=0.3)
    hooks = None if writes else _LimitsUnwritten()
    assert drain(settings, Budget.seconds(60), registry, ledger_url, hooks=hooks).done == 4
    if writes:  # as `pgdrain drain` and `pgdrain worker` run: the limit row written, and kept
        assert _most_at_once(conn) == 1
        assert _running(conn) == (0, 0)
    else:  # no row holds the limit: the four run at once
        assert _most_at_once(conn) > 1


def test_a_scheduled_run_drops_a_limit_no_longer_configured(db_url: str, conn: Conn) -> None:
    store.queue_limit_sync(conn, ["emails"], [("emails", LIMIT)])
    settings = Settings(queues=("emails",))
    budget = Budget.seconds(30)
    control = RunControl(
        events.Trigger("schedule", ("emails",)), "housekeeping", budget, waker=Waker(settings, None)
    )
    drain(settings, budget, registry, db_url, hooks=control)
    assert conn.execute("SELECT count(*) FROM pgdrain.queue_limits").fetchone() == (0,)
