"""The drain's own transactions, each mechanism beside its control: statement and lock
timeouts no longer than the budget left, and READ COMMITTED whatever the server's default
isolation is."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers.fixtures import db_now, job_row, wait_for
from helpers.lock_waits import named_waits_on_a_lock
from pgdrain import Budget, DrainResult, Job, Registry, Settings, drain, enqueue
from pgdrain.controls import Controls
from pgdrain.runner.drain import drain_with

Conn = psycopg.Connection[Any]


class Gate:
    """A job kind that signals when it starts and returns when the test lets it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.registry = Registry()
        self.registry.job("gate")(self._run)

    def _run(self, job: Job) -> None:
        self.started.set()
        assert self.release.wait(60), "the test never released the job"


def in_background(
    url: str, registry: Registry, budget: float, switches: Controls, **settings: Any
) -> tuple[threading.Thread, list[DrainResult]]:
    results: list[DrainResult] = []
    thread = threading.Thread(
        target=lambda: results.append(
            drain_with(switches, Settings(**settings), Budget.seconds(budget), registry, url)
        ),
        daemon=True,
    )
    thread.start()
    return thread, results


# On its own connection the drain's connection keeps the limits; behind a transaction pooler
# each transaction carries its own (session.py). Both must hold.
POOLERS = pytest.mark.parametrize("pooler", ["session", "transaction"])


@POOLERS
@pytest.mark.parametrize("limited", [True, False], ids=["limited", "unlimited"])
def test_a_drain_blocked_on_a_table_lock_ends_by_its_deadline_only_with_the_limits(
    db_url: str, conn: Conn, limited: bool, pooler: str
) -> None:
    gate = Gate()
    gate.release.set()
    enqueue(conn, "gate")
    budget = 2.0
    switches = Controls(limit_statements_to_budget=limited)
    with psycopg.connect(db_url) as locker:  # a migration, or an operator's long transaction
        locker.execute("LOCK TABLE pgdrain.jobs IN ACCESS EXCLUSIVE MODE")
        began = db_now(conn)
        thread, results = in_background(
            db_url, gate.registry, budget, switches, reserve_seconds=0.5, pooler=pooler
        )
        if limited:
            thread.join(30)
            # The run ended while the lock was still held: its statement gave up, not the lock.
            assert not thread.is_alive()
            [result] = results
            assert result.stop_reason == "error"
            assert result.error is not None and "timeout" in result.error
            assert result.elapsed_s <= budget
        else:
            wait_for(lambda: named_waits_on_a_lock(conn, "pgdrain"), what="the drain to wait")
            wait_for(
                lambda: (db_now(conn) - began).total_seconds() > budget + 1, what="deadline + 1"
            )
            assert thread.is_alive() and named_waits_on_a_lock(conn, "pgdrain"), "still blocked"
        locker.rollback()
    thread.join(30)
    assert not thread.is_alive()
    if not limited:
        [result] = results
        assert result.elapsed_s > budget  # ran past its deadline: a Lambda would be killed


@POOLERS
@pytest.mark.parametrize("default", ["serializable", "repeatable read"])
@pytest.mark.parametrize("pinned", [True, False], ids=["read-committed", "server-default"])
def test_a_completion_that_waited_for_a_concurrent_update_is_recorded_under_any_default(
    db_url: str, conn: Conn, default: str, pinned: bool, pooler: str
) -> None:
    dbname = conn.info.dbname
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
            sql.Identifier(dbname), sql.Literal(default)
        )
    )
    gate = Gate()
    job_id = enqueue(conn, "gate")
    switches = Controls(pin_read_committed=pinned)
    thread, results = in_background(db_url, gate.registry, 60, switches, pooler=pooler)
    assert gate.started.wait(30)
    with psycopg.connect(db_url) as other:  # e.g. an operator touching the row
        other.execute("UPDATE pgdrain.jobs SET updated_at = now() WHERE id = %s", (job_id,))
        gate.release.set()  # the job returns; its completion waits for `other`'s row lock
        wait_for(lambda: named_waits_on_a_lock(conn, "pgdrain"), what="the completion to wait")
        other.commit()
    thread.join(30)
    [result] = results
    row = job_row(conn, job_id)
    if pinned:
        assert (result.stop_reason, result.done, row["status"]) == ("empty", 1, "done")
    else:
        # The update re-checked nothing: a serialization failure ended the run.
        assert result.stop_reason == "error" and result.error is not None
        assert "serialize" in result.error
        assert (result.done, row["status"]) == (0, "running")


def test_a_budget_below_the_reserve_claims_nothing_and_says_so(
    db_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = enqueue(conn, "gate")
    caplog.set_level(logging.INFO, logger="pgdrain")
    result = drain(Settings(reserve_seconds=3), Budget.seconds(2), Gate().registry, db_url)
    assert (result.claimed, result.stop_reason, result.more_ready) == (0, "budget", True)
    assert job_row(conn, job_id)["status"] == "queued"
    said = [r.getMessage() for r in caplog.records if "below the reserve" in r.getMessage()]
    assert len(said) == 1 and "nothing will be claimed" in said[0]
