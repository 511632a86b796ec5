"""Through PgBouncer in transaction mode (PGDRAIN_POOLER=transaction): the drain, the heartbeat,
reclaim, kick debouncing and migrations all work, because pgdrain keeps no session state and
prepares no statement. The control: the same drains with psycopg's default prepared statements
(pooler='session') fail through the same pooler, because two client connections leave and look for
statements under the same names on one server session."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, job_row, wait_for
from helpers.pgbouncer import PgBouncer, find_pgbouncer
from pgdrain import Budget, DrainResult, Job, Registry, Settings, build_job, drain
from pgdrain.db import store
from pgdrain.db.connection import connection_kwargs
from pgdrain.db.migrate import migrate

pytestmark = pytest.mark.skipif(
    find_pgbouncer() is None,
    reason="pgbouncer not found (Debian: apt-get install pgbouncer; .ci/run installs it)",
)

Conn = psycopg.Connection[Any]
TRANSACTION = Settings.from_env({"PGDRAIN_POOLER": "transaction", "PGDRAIN_RESERVE_SECONDS": "0.5"})
SESSION = Settings.from_env({"PGDRAIN_POOLER": "session", "PGDRAIN_RESERVE_SECONDS": "0.5"})
BUDGET_SECONDS = 60.0

registry = Registry()


@registry.job("noop")
def _noop(job: Job) -> None:
    pass


@pytest.fixture(scope="module")
def bouncer(server_url: str) -> Iterator[PgBouncer]:
    with PgBouncer(server_url, pool_mode="transaction", pool_size=2) as running:
        yield running


@pytest.fixture
def pooled_url(bouncer: PgBouncer, db_url: str) -> str:
    """The test's own database, reached through the pooler."""
    return bouncer.url(db_url)


def _pooled(url: str, settings: Settings = TRANSACTION) -> Conn:
    return psycopg.connect(url, **connection_kwargs(settings, 10))


def _enqueue(conn: Conn, count: int, kind: str = "noop") -> None:
    store.job_insert_many(conn, [build_job(kind, {"n": i}) for i in range(count)])


def _drain_concurrently(url: str, settings: Settings, runs: int = 3) -> list[DrainResult]:
    """`runs` drains at once through the pooler: more clients than its 2 server connections,
    so their transactions take turns on the same server sessions."""
    results: list[DrainResult] = []
    lock = threading.Lock()

    def one() -> None:
        result = drain(settings, Budget.seconds(BUDGET_SECONDS), registry, url)
        with lock:
            results.append(result)

    threads = [threading.Thread(target=one) for _ in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("retain_done", ["7", "0"], ids=["done-kept", "done-not-kept"])
def test_concurrent_drains_pass_through_the_transaction_pooler(
    conn: Conn, pooled_url: str, retain_done: str
) -> None:
    """With done jobs kept they are moved to the history; not kept (PGDRAIN_RETAIN_DONE=0),
    deleted: the same drains, through the same pooler."""
    settings = Settings.from_env(
        {"PGDRAIN_POOLER": "transaction", "PGDRAIN_RESERVE_SECONDS": "0.5",
         "PGDRAIN_RETAIN_DONE": retain_done}
    )  # fmt: skip
    _enqueue(conn, 300)
    results = _drain_concurrently(pooled_url, settings)
    assert [r.stop_reason for r in results] == ["empty"] * 3, [r.error for r in results]
    assert sum(r.done for r in results) == 300
    left = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FROM pgdrain.jobs"
    )
    assert left.fetchone() == ((300, 300) if retain_done != "0" else (0, 0))


def test_a_dependent_is_claimed_by_the_run_that_completed_its_dependency(
    conn: Conn, pooled_url: str
) -> None:
    """The completion's NOTICE (jobs made ready) reaches the run through the pooler."""
    first = store.job_insert(conn, build_job("noop"))[0]
    store.job_insert(conn, build_job("noop", after=[first]))
    result = drain(TRANSACTION, Budget.seconds(BUDGET_SECONDS), registry, pooled_url)
    assert (result.done, result.stop_reason) == (2, "empty")


@pytest.fixture(scope="module")
def one_server_bouncer(server_url: str) -> Iterator[PgBouncer]:
    """A pool of one server connection: every client's transactions run on the same server
    session, so whatever one client leaves in that session meets the next client for certain."""
    with PgBouncer(server_url, pool_mode="transaction", pool_size=1) as running:
        yield running


def _drain_one_after_another(
    conn: Conn, url: str, settings: Settings, runs: int = 2
) -> list[DrainResult]:
    """Each drain gets 100 jobs, so it runs its claim more than psycopg's prepare threshold
    (5 executions) and, unless told not to, prepares it as `_pg3_0`, the first name on every new
    connection. The next drain's connection starts that count again on the same server session."""
    results = []
    for _ in range(runs):
        _enqueue(conn, 100)
        results.append(drain(settings, Budget.seconds(BUDGET_SECONDS), registry, url))
    return results


def test_drains_one_after_another_share_a_server_session(
    conn: Conn, db_url: str, one_server_bouncer: PgBouncer
) -> None:
    results = _drain_one_after_another(conn, one_server_bouncer.url(db_url), TRANSACTION)
    assert [(r.stop_reason, r.done) for r in results] == [("empty", 100)] * 2, [
        r.error for r in results
    ]


def test_control_with_prepared_statements_the_same_drains_fail(
    conn: Conn, db_url: str, one_server_bouncer: PgBouncer
) -> None:
    results = _drain_one_after_another(conn, one_server_bouncer.url(db_url), SESSION)
    errors = [r.error for r in results if r.stop_reason == "error"]
    assert errors, "prepared statements went through a transaction pooler unharmed"
    assert all("prepared statement" in str(e) for e in errors), errors


def test_heartbeats_extend_the_lease_through_the_pooler(db_url: str, pooled_url: str) -> None:
    """A job that outlives its lease: it returns only after it has seen the heartbeat move its
    lease forward three times (every lease/3 = 0.5 s here), through the pooler."""
    seen: list[Any] = []
    watcher = Registry()

    @watcher.job("outlive_the_lease")
    def outlive_the_lease(job: Job) -> None:
        with psycopg.connect(db_url, autocommit=True) as observer:

            def extended_three_times() -> bool:
                row = observer.execute(
                    "SELECT lease_expires_at FROM pgdrain.jobs WHERE id = %s", (job.id,)
                ).fetchone()
                if row and (not seen or row[0] != seen[-1]):
                    seen.append(row[0])
                return len(seen) >= 4

            wait_for(extended_three_times, timeout=60, what="three heartbeats")

    with psycopg.connect(db_url, autocommit=True) as direct:
        [job_id] = store.job_insert_many(direct, [build_job("outlive_the_lease")])
        settings = Settings.from_env(
            {
                "PGDRAIN_POOLER": "transaction",
                "PGDRAIN_LEASE_SECONDS": "1.5",
                "PGDRAIN_RESERVE_SECONDS": "0.5",
            }
        )
        result = drain(settings, Budget.seconds(BUDGET_SECONDS), watcher, pooled_url)
        assert (result.stop_reason, result.done, result.lease_lost) == ("empty", 1, 0)
        row = job_row(direct, job_id)
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert seen == sorted(seen)


def test_reclaim_through_the_pooler(conn: Conn, pooled_url: str) -> None:
    _enqueue(conn, 1)
    with _pooled(pooled_url) as pooled:
        [claimed] = claim_batch(pooled, ["default"], 1, "dead-worker", 30.0, None)
    conn.execute("UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 second'")
    result = drain(TRANSACTION, Budget.seconds(BUDGET_SECONDS), registry, pooled_url)
    assert (result.reclaimed, result.done, result.stop_reason) == (1, 1, "empty")
    row = job_row(conn, claimed.id)
    assert (row["status"], row["attempts"], row["reclaim_count"]) == ("done", 2, 1)


def test_kick_debounce_through_the_pooler(pooled_url: str) -> None:
    """Eight callers at once: one wins each queue's window; then each calls again, past
    psycopg's prepare threshold (5 executions), and nothing breaks."""
    callers = 8
    barrier = threading.Barrier(callers)
    won: list[list[str]] = []
    later: list[list[str]] = []
    lock = threading.Lock()

    def caller() -> None:
        with _pooled(pooled_url) as pooled:
            barrier.wait(timeout=60)
            first = store.kick_debounce(pooled, ["emails", "reports"], 60.0).invoke
            again = [store.kick_debounce(pooled, ["emails"], 60.0).invoke for _ in range(6)]
        with lock:
            won.append(first)
            later.extend(again)

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = sorted(q for queues in won for q in queues)
    assert winners == ["emails", "reports"]
    assert later == [[]] * (6 * callers)


def test_migrate_through_the_pooler(empty_db_url: str, bouncer: PgBouncer) -> None:
    with _pooled(bouncer.url(empty_db_url)) as pooled:
        first = migrate(pooled)
        second = migrate(pooled)
    assert first.applied and not second.applied
