"""The job author's side of a failure, through a real drain on a real database: the error
history, hostile error texts, the outcome exceptions, unknown kinds."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import psycopg
import pytest

from helpers.fixtures import db_now, job_row
from pgdrain import (
    Budget,
    Cancel,
    Discard,
    DrainResult,
    Job,
    Registry,
    RetryIn,
    Settings,
    Snooze,
    drain,
    enqueue,
)
from pgdrain.api import outcomes

Conn = psycopg.Connection[Any]

jobs = Registry()


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


@jobs.job("noop")
def noop(job: Job) -> None:
    pass


@jobs.job("boom", backoff=lambda attempt: 0.0)  # retried at once: three attempts in one run
def boom(job: Job) -> None:
    raise ValueError(f"boom on attempt {job.attempt}")


@jobs.job("nul")
def nul(job: Job) -> None:
    raise RuntimeError("before\x00after")


@jobs.job("surrogate")
def surrogate(job: Job) -> None:
    raise RuntimeError("bad \udc80 byte")


@jobs.job("broken_str")
def broken_str(job: Job) -> None:
    raise BrokenStr()


@jobs.job("huge")
def huge(job: Job) -> None:
    raise RuntimeError("x" * 1_000_000)


@jobs.job("retry_in")
def retry_in(job: Job) -> None:
    raise RetryIn(600, "the API said come back later")


@jobs.job("snooze")
def snooze(job: Job) -> None:
    raise Snooze(600)


@jobs.job("fail_then_snooze", backoff=lambda attempt: 0.0)  # attempt 2 in the same run
def fail_then_snooze(job: Job) -> None:
    if job.attempt == 1:
        raise ValueError("the real error")
    raise Snooze(600)


@jobs.job("discard")
def discard(job: Job) -> None:
    raise Discard("the account was deleted")


@jobs.job("cancel")
def cancel(job: Job) -> None:
    raise Cancel("the user cancelled the export")


class RateLimited(RetryIn):
    """An application's own: its delay set from a header, not checked by RetryIn's __init__."""

    def __init__(self, retry_after: object) -> None:
        Exception.__init__(self, "rate limited")
        self.seconds = retry_after  # type: ignore[assignment]


@jobs.job("retry_after_nan")
def retry_after_nan(job: Job) -> None:
    raise RateLimited(float("nan"))


def run(url: str, registry: Registry = jobs, **settings: Any) -> DrainResult:
    return drain(Settings(**settings), Budget.seconds(30), registry, url)


# -- the error history ----------------------------------------------------------------------


def test_each_failed_attempt_is_kept_with_message_type_traceback_attempt_and_time(
    db_url: str, conn: Conn
) -> None:
    job_id = enqueue(conn, "boom", max_attempts=3)
    before = db_now(conn)
    result = run(db_url)
    assert (result.retried, result.failed, result.stop_reason) == (2, 1, "empty")
    row = job_row(conn, job_id)
    assert row["status"] == "failed"
    assert row["last_error"] == "ValueError: boom on attempt 3"
    errors = row["errors"]
    assert [e["attempt"] for e in errors] == [1, 2, 3]
    assert [e["message"] for e in errors] == [f"boom on attempt {n}" for n in (1, 2, 3)]
    assert {e["type"] for e in errors} == {"ValueError"}
    for entry in errors:
        assert "Traceback (most recent call last)" in entry["traceback"]
        assert 'raise ValueError(f"boom on attempt {job.attempt}")' in entry["traceback"]
        assert dt.datetime.fromisoformat(entry["at"]) >= before


def test_a_failure_is_logged_with_its_traceback_id_kind_and_attempt(
    db_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = enqueue(conn, "boom", max_attempts=1)
    with caplog.at_level("WARNING", logger="pgdrain"):
        run(db_url)
    [record] = [r for r in caplog.records if r.getMessage() == "job failed"]
    fields = record.__dict__
    assert (fields["job_id"], fields["kind"], fields["attempt"]) == (job_id, "boom", 1)
    assert fields["error"] == "ValueError: boom on attempt 1"
    assert "Traceback (most recent call last)" in fields["traceback"]


# -- hostile error texts (docs/reliability.md, "Job functions") ----------------------------

HOSTILE = {
    "nul": "RuntimeError: before\\x00after",
    "surrogate": "RuntimeError: bad \\udc80 byte",
    "broken_str": "BrokenStr: <str() raised RuntimeError>",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_error_text_is_recorded_and_the_run_goes_on(
    db_url: str, conn: Conn, kind: str
) -> None:
    hostile = enqueue(conn, kind)
    others = [enqueue(conn, "noop") for _ in range(3)]
    result = run(db_url, concurrency=4, batch_size=4)
    assert (result.stop_reason, result.done, result.retried) == ("empty", 3, 1)
    row = job_row(conn, hostile)
    assert (row["status"], row["attempts"]) == ("queued", 1)
    assert row["last_error"] == HOSTILE[kind]
    entry = row["errors"][0]
    assert f"{entry['type']}: {entry['message']}" == HOSTILE[kind]
    assert {job_row(conn, job_id)["status"] for job_id in others} == {"done"}


def _without_sanitizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch outcomes' sanitizing off: texts pass through as str() gives them."""

    def unsafe_str(error: BaseException) -> str:
        return str(error)

    monkeypatch.setattr(outcomes, "sanitize", lambda text: text)
    monkeypatch.setattr(outcomes, "safe_str", unsafe_str)


@pytest.mark.parametrize("kind", ["nul", "surrogate"])
def test_control_without_sanitizing_a_nul_or_surrogate_stops_the_run(
    db_url: str, conn: Conn, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run with sanitizing off: the run stops, its hostile job left `running`."""
    _without_sanitizing(monkeypatch)
    hostile = enqueue(conn, kind)
    try:
        result = run(db_url, concurrency=4, batch_size=4)
    except UnicodeEncodeError:  # the surrogate: out of drain() altogether
        pass
    else:
        assert result.stop_reason == "error"  # NUL: the server refused the text
    assert job_row(conn, hostile)["status"] == "running"


def test_control_without_the_fallback_a_broken_str_loses_the_jobs_error(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fallback off, the error recorded is the one __str__ raised while it was being
    recorded: the job's own exception type is lost."""
    _without_sanitizing(monkeypatch)
    job_id = enqueue(conn, "broken_str")
    run(db_url)
    assert job_row(conn, job_id)["last_error"] == "RuntimeError: __str__ itself fails"


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "control-unchecked"])
def test_a_delay_no_statement_can_store_is_retried_and_the_run_goes_on(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, checked: bool
) -> None:
    """A red team's report: a RetryIn subclass's own NaN delay made the statement recording
    it fail: the run stopped, and a job beside it that had returned stayed `running`, to run
    again once reclaimed. The control: the delay taken as the job gave it, as before."""
    if not checked:
        monkeypatch.setattr(outcomes, "_seconds", lambda value, what: value)
    hostile = enqueue(conn, "retry_after_nan")
    others = [enqueue(conn, "noop") for _ in range(3)]
    result = run(db_url, concurrency=4, batch_size=4)
    if checked:
        assert (result.stop_reason, result.done, result.retried) == ("empty", 3, 1)
        assert job_row(conn, hostile)["status"] == "queued"
        assert {job_row(conn, job_id)["status"] for job_id in others} == {"done"}
    else:
        assert result.stop_reason == "error"
        assert job_row(conn, hostile)["status"] == "running"


def test_a_huge_error_text_is_bounded(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "huge")
    run(db_url)
    row = job_row(conn, job_id)
    assert len(row["last_error"]) == outcomes.MAX_ERROR_LENGTH
    assert len(row["errors"][0]["traceback"]) <= outcomes.MAX_TRACEBACK_LENGTH
    assert row["last_error"].endswith("…")


# -- outcomes a job chooses by raising ------------------------------------------------------


def _seconds_until_run(conn: Conn, job_id: int) -> float:
    row = conn.execute(
        "SELECT extract(epoch FROM run_at - now())::float8 FROM pgdrain.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return float(row[0])


def test_retry_in_spends_an_attempt_and_waits_exactly_the_given_time(
    db_url: str, conn: Conn
) -> None:
    job_id = enqueue(conn, "retry_in")
    assert run(db_url).retried == 1
    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 1)
    assert row["last_error"] == "RetryIn: the API said come back later"
    assert 590 < _seconds_until_run(conn, job_id) <= 600
    assert len(row["errors"]) == 1


def test_snooze_gives_the_attempt_back_and_adds_no_error(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "snooze", max_attempts=1)  # a snooze is not a spent attempt
    assert run(db_url).retried == 1
    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"], row["errors"]) == ("queued", 0, [])
    assert row["last_error"] is None
    assert 590 < _seconds_until_run(conn, job_id) <= 600


def test_a_snooze_after_a_failure_keeps_the_real_error_and_logs_at_info(
    db_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = enqueue(conn, "fail_then_snooze", max_attempts=5)
    with caplog.at_level("INFO", logger="pgdrain"):
        assert run(db_url).retried == 2  # the failure, then the snooze
    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 1)  # the snooze gave its attempt back
    assert row["last_error"] == "ValueError: the real error"
    assert [(e["attempt"], e["message"]) for e in row["errors"]] == [(1, "the real error")]
    [snoozed] = [r for r in caplog.records if r.getMessage() == "job snoozed"]
    assert (snoozed.levelname, snoozed.__dict__["job_id"]) == ("INFO", job_id)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "job will be retried"
    ]


def test_a_jobs_own_cancel_is_logged_as_cancelled_not_failed(
    db_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = enqueue(conn, "cancel")
    with caplog.at_level("INFO", logger="pgdrain"):
        run(db_url)
    outcomes_logged = [r for r in caplog.records if r.getMessage().startswith("job ")]
    assert [(r.getMessage(), r.levelname) for r in outcomes_logged] == [
        ("job cancelled", "WARNING")
    ]
    assert outcomes_logged[0].__dict__["job_id"] == job_id
    assert job_row(conn, job_id)["status"] == "cancelled"


@pytest.mark.parametrize(
    ("kind", "status", "message"),
    [
        ("discard", "failed", "discarded: the account was deleted"),
        ("cancel", "cancelled", "cancelled: the user cancelled the export"),
    ],
)
def test_discard_fails_and_cancel_cancels_the_job_at_once(
    db_url: str, conn: Conn, kind: str, status: str, message: str
) -> None:
    """Counted as what they are: a cancel is not a failure (JobsFailed's alarm stays quiet)."""
    job_id = enqueue(conn, kind, max_attempts=5)
    result = run(db_url)
    assert (result.failed, result.cancelled) == ((1, 0) if status == "failed" else (0, 1))
    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"], row["last_error"]) == (status, 1, message)
    assert row["errors"][0]["message"] == message and row["finished_at"] is not None
    assert row["errors"][0]["type"] == kind.capitalize()


def test_outcome_exceptions_reject_bad_seconds() -> None:
    for bad in (-1, float("nan"), float("inf"), True, 1e300, 10**400, -(10**400)):
        with pytest.raises(ValueError):
            RetryIn(bad)
        with pytest.raises(ValueError):
            Snooze(bad)


@pytest.mark.parametrize(
    "backoff",
    [lambda attempt: float("nan"), lambda attempt: 1e300, lambda attempt: 1 / 0],
    ids=["nan", "overflow", "raises"],
)
def test_a_kinds_bad_backoff_falls_back_to_the_default_and_the_run_goes_on(
    db_url: str, conn: Conn, backoff: Any
) -> None:
    registry = Registry()

    @registry.job("bad_backoff", backoff=backoff)
    def bad_backoff(job: Job) -> None:
        raise RuntimeError("fails")

    job_id = enqueue(conn, "bad_backoff")
    result = run(db_url, registry)
    assert (result.stop_reason, result.retried) == ("empty", 1)
    assert 5 < _seconds_until_run(conn, job_id) <= 12.5  # the default: 10 s ± 25 %


def test_control_without_the_fallback_a_bad_backoff_stops_the_run(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run with the kind's backoff used as it comes: PostgreSQL refuses the interval,
    the run stops, and the job is left `running`."""
    monkeypatch.setattr(outcomes, "delay", lambda backoff, attempt: backoff(attempt))
    registry = Registry()

    @registry.job("bad_backoff", backoff=lambda attempt: 1e300)
    def bad_backoff(job: Job) -> None:
        raise RuntimeError("fails")

    job_id = enqueue(conn, "bad_backoff")
    assert run(db_url, registry).stop_reason == "error"
    assert job_row(conn, job_id)["status"] == "running"


# -- an unknown kind is retried, as River does ----------------------------------------------


def test_an_unknown_kind_is_retried_with_backoff_and_says_why(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "no_such_kind")
    result = run(db_url)
    assert (result.retried, result.failed) == (1, 0)
    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 1)
    assert "no function is registered for job kind 'no_such_kind'" in row["last_error"]
    assert "a deploy may not have reached every function" in row["last_error"]
    assert _seconds_until_run(conn, job_id) > 5  # the ordinary backoff: ~10 s ± 25 %


def test_an_unknown_kind_the_job_enqueues_is_its_own_error(db_url: str, conn: Conn) -> None:
    """A red team's report: a job enqueueing a typo'd kind was retried as deploy lag, its
    traceback dropped."""
    registry = Registry()

    @registry.job("signup", backoff=lambda attempt: 600.0)
    def signup(job: Job) -> None:
        with psycopg.connect(db_url, autocommit=True) as own:
            registry.enqueue(own, "send_emial")

    job_id = enqueue(conn, "signup")
    assert run(db_url, registry).retried == 1
    row = job_row(conn, job_id)
    assert "deploy" not in row["last_error"]
    assert 'registry.enqueue(own, "send_emial")' in row["errors"][0]["traceback"]
    assert _seconds_until_run(conn, job_id) > 300  # the kind's own backoff


def test_an_unknown_kind_fails_once_its_attempts_are_spent(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "no_such_kind", max_attempts=1)
    assert run(db_url).failed == 1
    assert job_row(conn, job_id)["status"] == "failed"
