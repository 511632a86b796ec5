"""A deadlock between the application and a run (docs/decisions/0014): a transaction that
enqueues jobs of sequence keys b, then a, while a run's completion finishes the heads of a and
b (in the order of their ids), locks the keys' rows in the other order. PostgreSQL ends one of
the two. When it ends the run's statement, that statement rolled back whole, so the run sends
it again (Session.resend_deadlocked): without that, the run ended with an error and the jobs it
had finished ran again once their leases expired.

The run is made the victim on purpose: its connection checks for a deadlock after 1 s, the
application's after 60 s, and the application closes the cycle once the run is seen waiting
(pg_locks), well within that second."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import jobs as example_jobs
from helpers.fixtures import claim_batch, job_row, wait_for
from helpers.lock_waits import someone_here_waits_on_a_lock
from pgdrain import Budget, Settings, enqueue
from pgdrain.controls import Controls
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.runner.drain import DrainResult, drain_with

Conn = psycopg.Connection[Any]


def _with_options(url: str, options: str) -> str:
    return psycopg.conninfo.make_conninfo(url, options=options)


@pytest.mark.parametrize("resend", [True, False], ids=["resent", "control: not resent"])
def test_a_completion_ended_by_a_deadlock_is_sent_again(
    db_url: str, conn: Conn, resend: bool
) -> None:
    heads = {key: enqueue(conn, "noop", {}, sequence=key) for key in ("a", "b")}
    held = {c.id: c.held for c in claim_batch(conn, ["default"], 2, "w", 60.0, None)}
    finished = [held[heads["a"]], held[heads["b"]]]
    session = Session(
        _with_options(db_url, "-c deadlock_timeout=1000"),
        Settings(),
        Budget.seconds(60),
        controls=Controls(resend_a_deadlocked_statement=resend),
    )
    session.open()
    outcome: list[object] = []

    def complete() -> None:
        try:
            outcome.append(session.run(store.job_complete_many, finished))
        except psycopg.Error as exc:
            outcome.append(exc)

    with psycopg.connect(_with_options(db_url, "-c deadlock_timeout=60000")) as app:
        enqueue(app, "noop", {"n": 1}, sequence="b")  # holds key b until it commits
        completing = threading.Thread(target=complete)
        completing.start()
        # Only the run can be waiting: the application waits for nothing yet.
        wait_for(lambda: someone_here_waits_on_a_lock(conn), what="the run to wait for key b")
        enqueue(app, "noop", {"n": 2}, sequence="a")  # waits for a, which the run holds
        app.commit()
    completing.join(timeout=30)
    session.close()

    [result] = outcome
    if resend:
        assert isinstance(result, store.Fenced), result
        assert len(result.applied_attempts) == 2
        assert {job_row(conn, i)["status"] for i in heads.values()} == {"done"}
    else:
        # The control: the run's statement is the one ended; the jobs stay running, to be
        # reclaimed and run again.
        assert isinstance(result, psycopg.errors.DeadlockDetected), result
        assert {job_row(conn, i)["status"] for i in heads.values()} == {"running"}


@pytest.mark.parametrize("resend", [True, False], ids=["resent", "control: not resent"])
def test_a_drain_whose_completion_is_ended_by_a_deadlock_records_its_jobs_done(
    db_url: str, conn: Conn, resend: bool
) -> None:
    """The same cycle against a whole run: its jobs' completion (with its next claim) is the
    statement ended. With the resend the run ends empty, both jobs done, once each; the
    control ends with the error and leaves both running, to run again after their lease."""
    heads = {key: enqueue(conn, "noop", {}, sequence=key) for key in ("a", "b")}
    outcome: list[DrainResult] = []
    with psycopg.connect(_with_options(db_url, "-c deadlock_timeout=60000")) as app:
        enqueue(app, "noop", {"n": 1}, sequence="b")  # holds key b until it commits
        draining = threading.Thread(
            target=lambda: outcome.append(
                drain_with(
                    Controls(resend_a_deadlocked_statement=resend),
                    Settings(batch_size=2, concurrency=2),
                    Budget.seconds(60),
                    example_jobs.jobs,
                    _with_options(db_url, "-c deadlock_timeout=1000"),
                )
            )
        )
        draining.start()
        wait_for(lambda: someone_here_waits_on_a_lock(conn), what="the run to wait for key b")
        enqueue(app, "noop", {"n": 2}, sequence="a")  # waits for a, which the run holds
        app.commit()
    draining.join(timeout=60)

    [result] = outcome
    statuses = {job_row(conn, i)["status"] for i in heads.values()}
    if resend:
        assert (result.stop_reason, result.done, result.error) == ("empty", 4, None), result
        assert statuses == {"done"}
        assert {job_row(conn, i)["attempts"] for i in heads.values()} == {1}
    else:
        assert result.stop_reason == "error" and "deadlock" in str(result.error), result
        assert statuses == {"running"}
