"""The job author's API through a real drain on a real database: async jobs, middleware,
per-kind options (defaults at enqueue, backoff, timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import psycopg
import pytest

from helpers.fixtures import job_row
from helpers.threads import started_threads
from pgdrain import (
    BadInput,
    Budget,
    DrainResult,
    Job,
    Registry,
    RetryPolicy,
    Settings,
    drain,
    enqueue,
)
from pgdrain.db import sql
from pgdrain.db.store import hot_path
from pgdrain.errors import UnknownJobKind

Conn = psycopg.Connection[Any]

jobs = Registry()
ran: list[tuple[str, int]] = []  # (kind, job id) of every run that got through
events: list[str] = []  # what the middleware saw


@jobs.job("async_ok")
async def async_ok(job: Job) -> None:
    await asyncio.sleep(0)
    ran.append(("async_ok", job.id))


@jobs.job("async_loop_id")
async def async_loop_id(job: Job) -> None:
    ran.append(("loop", id(asyncio.get_running_loop())))


@jobs.job("async_boom")
async def async_boom(job: Job) -> None:
    await asyncio.sleep(0)
    raise ValueError("async boom")


async def _helper(job: Job) -> None:
    ran.append(("helper", job.id))


@jobs.job("returns_coroutine")
def returns_coroutine(job: Job) -> Coroutine[Any, Any, None]:
    return _helper(job)  # a mistake: nothing awaits it


@jobs.job("sync_ok")
def sync_ok(job: Job) -> None:
    ran.append(("sync_ok", job.id))


@jobs.job(
    "shaped", queue="emails", priority=-3, max_attempts=7, recovery_policy="manual", timeout=30
)
def shaped(job: Job) -> None:
    ran.append(("shaped", job.id))


@jobs.job("own_backoff", backoff=RetryPolicy(base_seconds=1000, cap_seconds=1000, jitter=0))
def own_backoff(job: Job) -> None:
    raise RuntimeError("later")


@jobs.job("overruns", timeout=0.05)
def overruns(job: Job) -> None:
    # Works until its own deadline has passed (job.remaining() reports the timeout's end).
    while job.remaining() > -0.01:
        time.sleep(0.005)


@jobs.job("async_overruns", timeout=0.05)
async def async_overruns(job: Job) -> None:
    await asyncio.Event().wait()  # never set: only the timeout ends it


@jobs.job("remaining")
def remaining(job: Job) -> None:
    ran.append(("remaining", round(job.remaining())))


@jobs.job("remaining_timeout", timeout=5)
def remaining_timeout(job: Job) -> None:
    ran.append(("remaining", round(job.remaining())))


@jobs.middleware
def outer(job: Job) -> contextlib.AbstractContextManager[None]:
    return _tracking("outer", job)


@jobs.middleware
def inner(job: Job) -> contextlib.AbstractContextManager[None]:
    return _tracking("inner", job)


@contextlib.contextmanager
def _tracking(name: str, job: Job) -> Iterator[None]:
    events.append(f"{name} enter {job.kind}")
    try:
        yield
    except Exception as exc:
        events.append(f"{name} saw {type(exc).__name__}")
        raise
    events.append(f"{name} exit {job.kind}")


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()
    events.clear()


def run(url: str, **settings: Any) -> DrainResult:
    return drain(Settings(**settings), Budget.seconds(30), jobs, url)


# -- async def jobs -------------------------------------------------------------------------


def test_an_async_job_runs_on_an_event_loop(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "async_ok")
    assert run(db_url).done == 1
    assert ran == [("async_ok", job_id)]
    assert job_row(conn, job_id)["status"] == "done"


def test_a_worker_thread_reuses_one_event_loop(db_url: str, conn: Conn) -> None:
    for _ in range(3):
        enqueue(conn, "async_loop_id")
    assert run(db_url, concurrency=1).done == 3
    assert len({loop for _, loop in ran}) == 1


def test_an_async_job_that_raises_is_retried_with_its_error(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "async_boom")
    assert run(db_url).retried == 1
    assert job_row(conn, job_id)["last_error"] == "ValueError: async boom"


def test_a_sync_job_returning_a_coroutine_is_an_error_not_success(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "returns_coroutine")
    result = run(db_url)
    assert (result.done, result.retried) == (0, 1)
    row = job_row(conn, job_id)
    assert row["last_error"].startswith("NotAwaited: the function for job kind")
    assert ran == []  # the coroutine never ran (and was closed: no "never awaited" warning)


# -- middleware -----------------------------------------------------------------------------


def test_middleware_wraps_each_job_outermost_first_and_sees_its_error(
    db_url: str, conn: Conn
) -> None:
    enqueue(conn, "sync_ok")
    run(db_url)
    assert events == [
        "outer enter sync_ok",
        "inner enter sync_ok",
        "inner exit sync_ok",
        "outer exit sync_ok",
    ]
    events.clear()
    enqueue(conn, "async_boom")
    run(db_url)
    assert events == [
        "outer enter async_boom",
        "inner enter async_boom",
        "inner saw ValueError",
        "outer saw ValueError",
    ]


def test_middleware_runs_in_the_jobs_own_thread(db_url: str, conn: Conn) -> None:
    threads: list[str] = []
    registry = Registry()

    @registry.middleware
    def where(job: Job) -> contextlib.AbstractContextManager[None]:
        threads.append(threading.current_thread().name)
        return contextlib.nullcontext()

    @registry.job("noop")
    def noop(job: Job) -> None:
        pass

    enqueue(conn, "noop")
    drain(Settings(), Budget.seconds(30), registry, db_url)
    [name] = threads
    assert name.startswith("pgdrain-job")


def test_a_run_with_nothing_to_do_starts_no_job_thread(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Most runs find nothing: they start none of the concurrency's threads (each costs ~0.1
    ms to start); a run with jobs starts them all."""
    started = started_threads(monkeypatch)
    registry = Registry()

    @registry.job("noop")
    def noop(job: Job) -> None:
        pass

    def job_threads() -> list[str]:
        return [name for name in started if name.startswith("pgdrain-job")]

    settings = Settings(concurrency=50, batch_size=50)
    empty = drain(settings, Budget.seconds(30), registry, db_url)
    assert (empty.claimed, job_threads()) == (0, [])
    for _ in range(3):
        enqueue(conn, "noop")
    ran = drain(settings, Budget.seconds(30), registry, db_url)
    assert ran.done == 3
    assert len(job_threads()) == 50


# -- per-kind options -----------------------------------------------------------------------


def test_enqueue_through_the_registry_takes_the_kinds_defaults(conn: Conn) -> None:
    job_id = jobs.enqueue(conn, "shaped", {"to": "a@example.com"})
    row = job_row(conn, job_id)
    assert (row["queue"], row["priority"], row["max_attempts"], row["recovery_policy"]) == (
        "emails",
        -3,
        7,
        "manual",
    )


def test_an_argument_given_at_enqueue_wins_over_the_kinds_default(conn: Conn) -> None:
    job_id = jobs.enqueue(conn, "shaped", queue="urgent", priority=0, max_attempts=1)
    row = job_row(conn, job_id)
    assert (row["queue"], row["priority"], row["max_attempts"], row["recovery_policy"]) == (
        "urgent",
        0,
        1,
        "manual",
    )


def test_enqueue_statement_through_the_registry_takes_the_kinds_defaults(conn: Conn) -> None:
    sql, params = jobs.enqueue_statement("shaped", {"to": "a@example.com"}, priority=1)
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    job = job_row(conn, row[0])
    assert (job["queue"], job["priority"], job["max_attempts"]) == ("emails", 1, 7)


def test_plain_enqueue_keeps_its_own_defaults(conn: Conn) -> None:
    row = job_row(conn, enqueue(conn, "shaped"))
    assert (row["queue"], row["priority"], row["max_attempts"]) == ("default", 0, 5)


def test_a_kind_the_registry_does_not_know_is_refused_naming_the_nearest(conn: Conn) -> None:
    """A typo would be retried and then failed by every run: refused at once, nothing
    written. pgdrain.enqueue, which knows no registry, takes any kind."""
    known = next(iter(jobs.kinds()))
    typo = known[:-1]
    with pytest.raises(UnknownJobKind, match=f"did you mean {known!r}"):
        jobs.enqueue(conn, typo)
    with pytest.raises(UnknownJobKind, match="'elsewhere'"):
        jobs.enqueue_statement("elsewhere")
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)
    row = job_row(conn, enqueue(conn, "elsewhere"))
    assert (row["queue"], row["max_attempts"]) == ("default", 5)


@pytest.mark.parametrize("kind", [None, 5], ids=["none", "int"])
def test_a_kind_that_is_not_text_is_refused_as_plain_enqueue_refuses_it(
    conn: Conn, kind: Any
) -> None:
    """A red team's report: a TypeError from the nearest-kind lookup."""
    with pytest.raises(BadInput, match="job kind must be a non-empty string"):
        enqueue(conn, kind)
    with pytest.raises(BadInput, match="job kind must be a non-empty string"):
        jobs.enqueue(conn, kind)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"queue": "no spaces"}, "queue"),
        ({"queue": ""}, "queue"),  # passed as the default, then refused at every enqueue
        ({"recovery_policy": ""}, "recovery_policy"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"priority": 2**40}, "priority"),
        ({"recovery_policy": "never"}, "recovery_policy"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"backoff": 3}, "backoff"),
    ],
)
def test_bad_kind_options_fail_at_import(options: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        Registry().job("x", **options)


def test_a_kinds_backoff_sets_its_retry_delay(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "own_backoff")
    run(db_url)
    row = conn.execute(
        "SELECT extract(epoch FROM run_at - now())::float8 FROM pgdrain.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None and 990 < row[0] <= 1000  # the default would be ~10 s


def test_remaining_reports_the_timeout_when_it_ends_before_the_budget(
    db_url: str, conn: Conn
) -> None:
    enqueue(conn, "remaining_timeout")
    enqueue(conn, "remaining", priority=1)
    run(db_url, concurrency=1)
    [(_, with_timeout), (_, budget_only)] = ran
    assert with_timeout <= 5 < budget_only


def test_a_sync_job_returning_after_its_timeout_is_failed(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "overruns")
    result = run(db_url)
    assert (result.done, result.retried) == (0, 1)
    assert "over its timeout of 0.05 s" in job_row(conn, job_id)["last_error"]


def test_an_async_job_is_cancelled_at_its_timeout(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "async_overruns")
    result = run(db_url)
    assert (result.done, result.retried) == (0, 1)
    assert "cancelled at its timeout of 0.05 s" in job_row(conn, job_id)["last_error"]


seen: list[Job] = []


@jobs.job("sees_itself", queue="mirror", max_attempts=4)
def sees_itself(job: Job) -> None:
    seen.append(job)


def test_a_job_receives_each_of_its_rows_fields_in_its_own_name(db_url: str, conn: Conn) -> None:
    """Each field of the Job a function receives is its row's (the attempt's token is the one
    recorded as completed)."""
    seen.clear()
    job_id = jobs.enqueue(conn, "sees_itself", {"to": "a@example.com", "n": 3})
    result = drain(Settings(queues=("mirror",)), Budget.seconds(30), jobs, db_url)
    assert result.done == 1
    [job] = seen
    row = job_row(conn, job_id)
    assert (job.id, job.kind, job.queue, job.payload) == (
        job_id,
        "sees_itself",
        "mirror",
        {"to": "a@example.com", "n": 3},
    )
    assert (job.attempt, job.max_attempts) == (1, 4) == (row["attempts"], row["max_attempts"])
    assert job.attempt_token == row["completed_token"]
    assert 0 < job.remaining() <= 30 and not job.lease_lost()


PAYLOADS = [
    {},
    {"to": "a@example.com", "tags": ["x", "y"], "nested": {"n": 3, "f": 1.5, "none": None}},
    {"text": '  spaces, tabs\t, a newline\n, quotes " and unicode é ✓  '},
    [1, 2, {"a": []}],
    "a string alone",
    12345678901234567890,
]


@jobs.job("reads_payload", queue="payloads")
def reads_payload(job: Job) -> None:
    seen.append(job)


def test_a_payload_reaches_the_job_as_json_reads_its_row(db_url: str, conn: Conn) -> None:
    """Whatever shape the payload has, the job gets what json.loads makes of the row's jsonb
    text (ClaimedJob.payload reads that text without json.loads's wrappers)."""
    seen.clear()
    ids = [jobs.enqueue(conn, "reads_payload", payload) for payload in PAYLOADS]
    result = drain(Settings(queues=("payloads",)), Budget.seconds(30), jobs, db_url)
    assert result.done == len(PAYLOADS)
    got = {job.id: job.payload for job in seen}
    for job_id, payload in zip(ids, PAYLOADS, strict=True):
        row = conn.execute("SELECT payload::text FROM pgdrain.jobs WHERE id = %s", (job_id,))
        [(text,)] = row.fetchall()
        assert got[job_id] == json.loads(text) == payload


# A test's mock clock, the way teams mock time in SQL: a schema ahead of pg_catalog on the path.
MOCK_CLOCK = """
CREATE SCHEMA clock;
CREATE FUNCTION clock.now() RETURNS timestamptz LANGUAGE sql
    AS $$ SELECT pg_catalog.now() + interval '1 day' $$;
SET search_path = clock, pg_catalog, public;
"""


@pytest.mark.parametrize("qualified", [True, False], ids=["server-clock", "control-unqualified"])
def test_an_enqueue_reads_the_clock_the_drain_reads_whatever_the_search_path(
    conn: Conn, qualified: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's report: with a now() of its own earlier on the application's search_path,
    an enqueue computed run_at from it; the drain (its path pinned to pg_catalog) saw the job a
    day in the future, while `jobs` and `stats` called it ready."""
    if not qualified:  # job_insert as it was: now() and make_interval as the path finds them
        real = sql.query
        unqualified = (
            real("job_insert")
            .replace("pg_catalog.now()", "now()")
            .replace("pg_catalog.make_interval", "make_interval")
        )
        assert unqualified != real("job_insert")
        monkeypatch.setattr(
            hot_path, "query", lambda name: unqualified if name == "job_insert" else real(name)
        )
    conn.execute(MOCK_CLOCK)
    job_id = enqueue(conn, "noop", delay=0)
    conn.execute("SET search_path = pg_catalog, public")
    ahead = conn.execute(
        "SELECT run_at > now() + interval '1 hour' FROM pgdrain.active_jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert ahead == (not qualified,)
