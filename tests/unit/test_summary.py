"""What a run reports (runner/summary.py), without a database: its counters as they grow, passed
on to an observer at once; a lost lease counted once per attempt; the DrainResult they end in;
and the kind of error that ended a run."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from pgdrain.db.store import Held
from pgdrain.errors import (
    AuthenticationFailed,
    ConfigError,
    DatabaseMisconfigured,
    DatabaseUnavailable,
)
from pgdrain.runner.summary import COUNTERS, Counters, DrainResult, Ending, ErrorKind, error_kind


def test_each_increment_reaches_the_observer_as_it_happens() -> None:
    """A Lambda timeout kills the process: progress must have left it before the end."""
    seen: list[tuple[str, int]] = []
    counters = Counters(lambda name, n: seen.append((name, n)))
    counters.add("claimed", 10)
    counters.add("done", 4)
    counters.add("done", 0)  # nothing to report
    counters.add("done", 3)
    assert seen == [("claimed", 10), ("done", 4), ("done", 3)]
    assert counters.values == {**dict.fromkeys(COUNTERS, 0), "claimed": 10, "done": 7}


def test_counters_work_without_an_observer() -> None:
    counters = Counters(None)
    counters.add("retried", 2)
    assert counters.values["retried"] == 2


def test_a_lost_lease_is_counted_and_said_once_per_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The heartbeat and the completion may both find the same attempt's lease gone: one line
    (not one per heartbeat); another attempt of the same job is another loss."""
    counters = Counters(None)
    first, second = Held(7, uuid.uuid4()), Held(7, uuid.uuid4())
    counters.lease_lost(first, "found by the heartbeat")
    counters.say_lost({}, "w1")
    counters.lease_lost(Held(7, first.token), "found by the heartbeat")
    counters.lease_lost(Held(7, first.token), "its result was not recorded")
    counters.lease_lost(second, "its result was not recorded")
    counters.say_lost({}, "w1")
    assert counters.values["lease_lost"] == 2
    assert [r.getMessage().rsplit("; ", 1)[1] for r in caplog.records] == [
        "found by the heartbeat",
        "its result was not recorded",
    ]
    assert {getattr(r, "job_id", None) for r in caplog.records} == {7}


def test_a_lease_lost_to_an_operators_cancel_says_so_and_counts_as_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not a lost lease: LeasesLost (and its alarm) stay at 0 for an operator's decision."""
    seen: list[tuple[str, int]] = []
    counters = Counters(lambda name, n: seen.append((name, n)))
    counters.lease_lost(Held(7, uuid.uuid4()), "found by the heartbeat")
    counters.lease_lost(Held(8, uuid.uuid4()), "found by the heartbeat")
    assert seen == []  # counted once why is known
    counters.say_lost({7: "cancelled", 8: "queued"}, "w1")
    assert [r.getMessage() for r in caplog.records] == [
        "job 7 cancelled by an operator: this attempt's outcome will not be recorded",
        "lease lost: another attempt may own this job; found by the heartbeat",
    ]
    assert seen == [("cancelled", 1), ("lease_lost", 1)]
    assert (counters.values["cancelled"], counters.values["lease_lost"]) == (1, 1)


def test_a_loss_whose_why_cannot_be_read_counts_as_a_lost_lease() -> None:
    """A run ended by an error says what it lost without a statement: no status to tell."""
    counters = Counters(None)
    counters.lease_lost(Held(7, uuid.uuid4()), "found by the heartbeat")
    counters.say_lost({}, "w1")
    assert (counters.values["cancelled"], counters.values["lease_lost"]) == (0, 1)


def test_the_result_holds_the_counts_and_how_the_run_ended() -> None:
    counters = Counters(None)
    counters.add("claimed", 5)
    counters.add("released", 2)
    ending = Ending("error", error="the server went away", error_kind="unavailable")
    result = counters.result(ending, abandoned=1, stale_threads=3, elapsed_s=1.23456)
    assert result == DrainResult(
        claimed=5,
        released=2,
        abandoned=1,
        stale_threads=3,
        stop_reason="error",
        error="the server went away",
        error_kind="unavailable",
        elapsed_s=1.235,
    )
    assert result.as_dict()["stop_reason"] == "error"
    assert Counters(None).result(
        Ending("budget", more_ready=True), abandoned=0, stale_threads=0, elapsed_s=0.0
    ) == DrainResult(stop_reason="budget", more_ready=True)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        # A ConfigError too, but told apart: the Lambda edge reads a rotated secret again.
        (AuthenticationFailed("password authentication failed"), "authentication"),
        (DatabaseMisconfigured("no such database"), "configuration"),
        (ConfigError("PGDRAIN_LEASE_SECONDS must be a number"), "configuration"),
        (DatabaseUnavailable("not reachable within the budget"), "unavailable"),
        (psycopg.errors.QueryCanceled("canceling statement due to timeout"), "database"),
        (RuntimeError("anything else"), "database"),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else value,
)
def test_the_kind_of_error_that_ended_a_run(error: BaseException, kind: ErrorKind) -> None:
    assert error_kind(error) == kind
