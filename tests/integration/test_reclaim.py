"""Taking back expired leases at the start of a run (runner/reclaim.py's Reclaim) on a real
database: the reclaim goes in the round trip of the run's next statement, before it, so that
statement already sees the jobs queued again; it is counted and logged once that round trip is
back; and a run that never sent another statement still reclaims at its end."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, statuses
from pgdrain import enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.db import store
from pgdrain.runner.attempts import RunState
from pgdrain.runner.reclaim import Reclaim

Conn = psycopg.Connection[Any]


def _expired(conn: Conn, n: int, max_attempts: int = 5) -> None:
    """`n` jobs held by a run that died: claimed with a lease capped at 0 s (ended at once)."""
    enqueue_many(conn, [build_job("k", max_attempts=max_attempts) for _ in range(n)])
    claim_batch(conn, ["default"], n, "w-dead", 30.0, 0.0)


def test_the_reclaim_goes_before_the_next_statement_in_its_round_trip(
    conn: Conn, run_state: RunState, caplog: pytest.LogCaptureFixture
) -> None:
    _expired(conn, 2)
    reclaim = Reclaim(run_state.session, run_state.counters, limit=100)
    reclaim.send_with_next()
    reclaim.report()  # its round trip has not been made: nothing to say yet
    assert run_state.counters.values["reclaimed"] == 0
    assert statuses(conn) == [("running", 1, 2)]

    # The next statement sees the jobs it queued again: it went first, in the same round trip.
    assert run_state.session.run(store.queue_has_ready, ["default"]) is True
    reclaim.report()
    reclaim.report()  # reported once

    assert run_state.counters.values["reclaimed"] == 2
    assert statuses(conn) == [("queued", 1, 2)]
    logged = [r for r in caplog.records if r.getMessage() == "reclaimed a job whose lease expired"]
    assert [(getattr(r, "status", None), getattr(r, "reclaims", None)) for r in logged] == [
        ("queued", 1),
        ("queued", 1),
    ]


def test_a_run_that_sent_nothing_else_still_reclaims_at_its_end(
    conn: Conn, run_state: RunState
) -> None:
    _expired(conn, 1, max_attempts=1)  # its only attempt spent: failed, not queued again
    reclaim = Reclaim(run_state.session, run_state.counters, limit=100)
    reclaim.send_with_next()

    reclaim.finish()

    assert run_state.counters.values["reclaimed"] == 1
    assert statuses(conn) == [("failed", 1, 1)]


def test_a_reclaim_takes_back_at_most_its_limit(conn: Conn, run_state: RunState) -> None:
    _expired(conn, 3)
    reclaim = Reclaim(run_state.session, run_state.counters, limit=2)
    reclaim.send_with_next()

    reclaim.finish()

    assert run_state.counters.values["reclaimed"] == 2
    assert statuses(conn) == [("queued", 1, 2), ("running", 1, 1)]


def test_a_live_lease_is_not_taken_back(conn: Conn, run_state: RunState) -> None:
    enqueue_many(conn, [build_job("k")])
    claim_batch(conn, ["default"], 1, "w-alive", 30.0, None)
    reclaim = Reclaim(run_state.session, run_state.counters, limit=100)
    reclaim.send_with_next()

    reclaim.finish()

    assert run_state.counters.values["reclaimed"] == 0
    assert statuses(conn) == [("running", 1, 1)]
