"""A database that is down, resuming, or restarted in the middle of a run. These tests stop and
start a PostgreSQL server of their own (helpers.restartable_pg), never the shared one.

- down for the whole budget: the run retries, then ends with stop_reason 'error' and one
  ERROR line (no traceback), and writes nothing;
- resuming while the run waits: the run connects when it comes up and drains;
- restarted mid-run: the run reconnects and loses no job;
- down past the budget mid-run: the run ends with 'error'; the jobs it could not finish are
  left to reclaim (their leases end at its deadline) and the next run completes them."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers import restartable_pg
from helpers.fixtures import wait_for
from helpers.restartable_pg import RestartableServer
from pgdrain import Budget, DrainResult, Job, Registry, Settings, build_job, drain
from pgdrain.db import store
from pgdrain.db.migrate import migrate

pytestmark = pytest.mark.skipif(
    restartable_pg.available() is not None, reason=str(restartable_pg.available())
)

PASSWORD = "s3cret-Passw0rd"  # trust auth ignores it; it must appear in no log line
SETTINGS = Settings(lease_seconds=3.0, reserve_seconds=0.5, connect_timeout=2.0, concurrency=4)

registry = Registry()
release = threading.Event()  # set: `held` jobs may return


@registry.job("quick")
def _quick(job: Job) -> None:
    time.sleep(0.05)


@registry.job("held")
def _held(job: Job) -> None:
    """Runs until the test lets it return (or its run's budget is nearly spent)."""
    while not release.is_set() and job.remaining() > 1.0:
        time.sleep(0.01)


@pytest.fixture(scope="module")
def server() -> Iterator[RestartableServer]:
    with RestartableServer() as running:
        yield running


@pytest.fixture
def url(server: RestartableServer) -> Iterator[str]:
    """A fresh migrated database on the restartable server, with a password in the URL."""
    if not server.is_running():
        server.start()
    name = f"faults_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(server.url(name), autocommit=True) as conn:
        migrate(conn)
    release.clear()
    yield server.url(name, password=PASSWORD)
    release.set()
    if not server.is_running():
        server.start()
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _statuses(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT status, count(*) FROM pgdrain.jobs GROUP BY 1").fetchall()
    return {status: int(n) for status, n in rows}


def _expired_leases(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgdrain.jobs"
            " WHERE status = 'running' AND lease_expires_at < now()"
        ).fetchone()
    return int(row[0]) if row else 0


def _enqueue(url: str, kind: str, count: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        store.job_insert_many(conn, [build_job(kind, {"n": i}) for i in range(count)])


def _in_background(target: Any) -> tuple[threading.Thread, list[DrainResult]]:
    out: list[DrainResult] = []
    thread = threading.Thread(target=lambda: out.append(target()))
    thread.start()
    return thread, out


def _logged(caplog: pytest.LogCaptureFixture, fragment: str) -> bool:
    return any(fragment in r.getMessage() for r in caplog.records)


def _assert_no_secret(caplog: pytest.LogCaptureFixture, result: DrainResult) -> None:
    text = "\n".join(r.getMessage() + repr(getattr(r, "__dict__", {})) for r in caplog.records)
    assert PASSWORD not in text and PASSWORD not in repr(result)


def test_a_run_that_starts_while_the_database_is_down_ends_with_one_error_line(
    server: RestartableServer, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.stop()
    caplog.set_level(logging.INFO)
    result = drain(SETTINGS, Budget.seconds(4), registry, url)
    assert result.stop_reason == "error"
    assert result.error is not None and "database unreachable after" in result.error
    assert "\n" not in result.error
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert "Connection refused" in errors[0].getMessage()
    assert all(r.exc_info is None and r.exc_text is None for r in caplog.records)
    retries = [r for r in caplog.records if "not reachable yet" in r.getMessage()]
    assert len(retries) >= 2, "the run gave up without retrying inside its budget"
    _assert_no_secret(caplog, result)


def test_a_run_that_starts_while_the_database_resumes_connects_and_drains(
    server: RestartableServer, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _enqueue(url, "quick", 20)
    server.stop()
    caplog.set_level(logging.INFO)
    thread, out = _in_background(lambda: drain(SETTINGS, Budget.seconds(60), registry, url))
    wait_for(lambda: _logged(caplog, "not reachable yet"), timeout=30, what="a connect retry")
    server.start()  # the database resumes while the run is retrying
    thread.join(timeout=120)
    [result] = out
    assert (result.stop_reason, result.done) == ("empty", 20), result.error
    assert _statuses(url) == {"done": 20}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    _assert_no_secret(caplog, result)


def test_a_restart_in_the_middle_of_a_run_loses_no_job(
    server: RestartableServer, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Four jobs are running when the server goes down; they return while it is down, so
    their completions cannot be written; the run reconnects and writes them."""
    _enqueue(url, "held", 4)
    _enqueue(url, "quick", 30)
    caplog.set_level(logging.INFO)
    thread, out = _in_background(lambda: drain(SETTINGS, Budget.seconds(90), registry, url))
    wait_for(lambda: _statuses(url).get("running", 0) >= 4, timeout=30, what="4 running jobs")
    server.stop()
    release.set()  # the held jobs return now, with the database down
    wait_for(
        lambda: _logged(caplog, "connection lost; reconnecting"),
        timeout=30,
        what="the run to notice the restart",
    )
    server.start()
    thread.join(timeout=120)
    [result] = out
    assert result.stop_reason == "empty", result.error
    assert _statuses(url) == {"done": 34}
    assert result.done == 34 and result.lease_lost == 0
    _assert_no_secret(caplog, result)


def test_down_past_the_budget_mid_run_leaves_the_jobs_to_reclaim(
    server: RestartableServer, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    _enqueue(url, "held", 4)
    caplog.set_level(logging.INFO)
    thread, out = _in_background(lambda: drain(SETTINGS, Budget.seconds(6), registry, url))
    wait_for(lambda: _statuses(url).get("running", 0) >= 4, timeout=30, what="4 running jobs")
    server.stop()
    release.set()
    thread.join(timeout=120)
    [first] = out
    assert first.stop_reason == "error"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and all(r.exc_info is None for r in caplog.records)

    server.start()
    # Their leases end by the first run's deadline, so the next run can take them back.
    assert _statuses(url) == {"running": 4}
    wait_for(lambda: _expired_leases(url) == 4, timeout=30, what="the leases to end")
    second = drain(SETTINGS, Budget.seconds(60), registry, url)
    assert (second.reclaimed, second.done, second.stop_reason) == (4, 4, "empty")
    assert _statuses(url) == {"done": 4}
    _assert_no_secret(caplog, first)
