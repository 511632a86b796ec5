"""The hot table holds only the work in flight (migration 0018): a job that finishes leaves
pgdrain.active_jobs for pgdrain.finished_jobs in the statement that finishes it, retry brings it
back with its id, a finished job frees its idempotency key, retention drops whole day partitions
past their age, and the migration keeps every job of a table of the old schema."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, wait_for, without_line
from helpers.history import view_write_of_0033
from pgdrain import Settings, enqueue
from pgdrain.api.registry import Registry
from pgdrain.budget import Budget
from pgdrain.db import retention, store
from pgdrain.db.migrate import migrate
from pgdrain.db.sql import migrations, query
from pgdrain.runner.drain import drain

Conn = psycopg.Connection[Any]
WORKER = "finished-test"
LEASE_SECONDS = 300.0


def _where(conn: Conn, job_id: int) -> tuple[bool, bool]:
    """(in active_jobs, in finished_jobs)."""
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pgdrain.active_jobs WHERE id = %(id)s),"
        " EXISTS (SELECT 1 FROM pgdrain.finished_jobs WHERE id = %(id)s)",
        {"id": job_id},
    ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def _running(conn: Conn, **enqueue_args: Any) -> store.ClaimedJob:
    job_id = enqueue(conn, "noop", **enqueue_args)
    [claimed] = claim_batch(conn, ["default"], 1, WORKER, LEASE_SECONDS, None)
    assert claimed.id == job_id
    return claimed


def _held(job: store.ClaimedJob) -> store.Held:
    return store.Held(job.id, job.attempt_token)


def test_a_completion_moves_the_job_in_its_own_transaction(conn: Conn, db_url: str) -> None:
    job = _running(conn)
    with psycopg.connect(db_url) as worker:  # a transaction left open until the check below
        assert store.job_complete_many(worker, [_held(job)]).applied == {job.id}
        assert _where(conn, job.id) == (True, False)  # not committed: another session sees it
        worker.commit()
    assert _where(conn, job.id) == (False, True)
    row = conn.execute(
        "SELECT status, completed_token FROM pgdrain.jobs WHERE id = %s", (job.id,)
    ).fetchone()
    assert row == ("done", job.attempt_token)


# The completion as it was before migration 0018: the row's status changes where it is.
COMPLETE_IN_PLACE = """UPDATE pgdrain.active_jobs AS j
SET status = 'done', completed_token = j.attempt_token,
    lease_expires_at = NULL, leased_by = NULL, attempt_token = NULL, heartbeat_at = NULL,
    finished_at = now(), updated_at = now()
WHERE j.id = %(id)s AND j.attempt_token = %(token)s"""


def test_control_a_completion_without_the_move_leaves_the_job_in_the_hot_table(
    conn: Conn,
) -> None:
    job = _running(conn)
    conn.execute(COMPLETE_IN_PLACE, {"id": job.id, "token": job.attempt_token})
    assert _where(conn, job.id) == (True, False)


@pytest.mark.parametrize(
    ("how", "status"),
    [("final", "failed"), ("spent", "failed"), ("cancel", "cancelled")],
)
def test_a_job_that_fails_for_good_or_cancels_itself_moves(
    conn: Conn, how: str, status: str
) -> None:
    job = _running(conn, max_attempts=1 if how == "spent" else 5)
    outcome = store.job_fail(
        conn, _held(job), "boom", 1.0, final=how == "final", cancelled=how == "cancel"
    )
    assert isinstance(outcome, store.Failed) and outcome.status == status
    assert _where(conn, job.id) == (False, True)


def test_a_retried_attempt_stays_in_the_hot_table(conn: Conn) -> None:
    job = _running(conn)
    outcome = store.job_fail(conn, _held(job), "boom", 60.0)
    assert isinstance(outcome, store.Failed) and outcome.status == "queued"
    assert _where(conn, job.id) == (True, False)


def test_an_operator_cancel_moves_the_job(conn: Conn) -> None:
    queued = enqueue(conn, "noop", delay=3600)
    job = _running(conn)
    cancelled = store.job_cancel(conn, [queued, job.id])
    assert [(c.id, c.was) for c in cancelled] == [(queued, "queued"), (job.id, "running")]
    assert _where(conn, queued) == (False, True) and _where(conn, job.id) == (False, True)
    # The cancelled attempt's completion is refused by the fence: the job is not running.
    assert store.job_complete_many(conn, [_held(job)]).applied == frozenset()


# job_retry as before migration 0033: a retried job is queued at once, whatever ran it last.
RETRY_AT_ONCE = ("run_at = coalesce(r.lease_wait_until, now())", "run_at = now()")


@pytest.mark.parametrize("waits", [True, False], ids=["waits-for-the-lease", "control-at-once"])
def test_a_retry_of_a_job_cancelled_while_running_waits_for_the_cancelled_lease(
    conn: Conn, waits: bool
) -> None:
    """An operator cancels a running job, then retries it at once. The cancelled attempt's
    code may still run until its lease ends (it learns of the cancel at its next heartbeat), so
    no run may claim the job again before then: two executions of one job at the same time."""
    job = _running(conn)
    lease_end = conn.execute(
        "SELECT lease_expires_at FROM pgdrain.active_jobs WHERE id = %s", (job.id,)
    ).fetchone()[0]  # type: ignore[index]
    store.job_cancel(conn, [job.id])
    if waits:
        [retry] = store.job_retry(conn, [job.id])
    else:
        conn.execute(view_write_of_0033().encode())  # nor does the view's trigger (0044)
        statement = query("job_retry").replace(*RETRY_AT_ONCE)
        assert statement != query("job_retry")
        conn.execute(statement, {"ids": [job.id]})
        [retry] = [store.Retry(job.id, "default", "noop", True, None)]
    assert retry.retried
    again = claim_batch(conn, ["default"], 1, WORKER, LEASE_SECONDS, None)
    if waits:
        assert retry.lease_wait_until == lease_end
        assert again == []  # the old attempt's lease still runs: nothing to claim yet
        run_at = conn.execute(
            "SELECT run_at FROM pgdrain.jobs WHERE id = %s", (job.id,)
        ).fetchone()[0]  # type: ignore[index]
        assert run_at == lease_end
    else:
        assert [j.id for j in again] == [job.id]  # claimed while its old attempt may run


@pytest.mark.parametrize("was", ["queued", "running-lease-expired"])
def test_a_retry_of_a_job_whose_cancel_left_no_live_lease_runs_at_once(
    conn: Conn, was: str
) -> None:
    if was == "queued":
        job_id = enqueue(conn, "noop")
    else:
        job_id = _running(conn).id
        conn.execute(
            "UPDATE pgdrain.active_jobs SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            (job_id,),
        )
    store.job_cancel(conn, [job_id])
    [retry] = store.job_retry(conn, [job_id])
    assert (retry.retried, retry.lease_wait_until) == (True, None)
    [again] = claim_batch(conn, ["default"], 1, WORKER, LEASE_SECONDS, None)
    assert again.id == job_id


def test_a_reclaim_that_spends_the_last_attempt_moves_the_job(conn: Conn) -> None:
    job_id = enqueue(conn, "noop", max_attempts=1)
    claim_batch(conn, ["default"], 1, WORKER, 0.05, None)
    wait_for(
        lambda: bool(
            conn.execute(
                "SELECT lease_expires_at < now() FROM pgdrain.active_jobs WHERE id = %s",
                (job_id,),
            ).fetchone()[0]  # type: ignore[index]
        ),
        60.0,
        "the lease to expire",
    )
    [reclaimed] = store.job_reclaim_expired(conn, 10)
    assert (reclaimed.id, reclaimed.status) == (job_id, "failed")
    assert _where(conn, job_id) == (False, True)


def test_retry_moves_a_failed_job_back_with_its_id(conn: Conn) -> None:
    job = _running(conn)
    store.job_fail(conn, _held(job), "boom", 0.0, final=True)
    assert _where(conn, job.id) == (False, True)
    [retried] = store.job_retry(conn, [job.id])
    assert retried.retried
    assert _where(conn, job.id) == (True, False)
    row = conn.execute(
        "SELECT status, attempts, finished_at FROM pgdrain.jobs WHERE id = %s", (job.id,)
    ).fetchone()
    assert row == ("queued", 0, None)
    [again] = claim_batch(conn, ["default"], 1, WORKER, LEASE_SECONDS, None)
    assert again.id == job.id


def test_a_finished_job_frees_its_key_and_a_retry_respects_the_new_holder(conn: Conn) -> None:
    first = enqueue(conn, "noop", idempotency_key="k1")
    assert enqueue(conn, "noop", idempotency_key="k1") == first  # held while queued
    [claimed] = claim_batch(conn, ["default"], 1, WORKER, LEASE_SECONDS, None)
    store.job_fail(conn, _held(claimed), "boom", 0.0, final=True)
    second = enqueue(conn, "noop", idempotency_key="k1")
    assert second != first
    [retry] = store.job_retry(conn, [first])
    assert (retry.retried, retry.held_by) == (False, second)


def test_a_write_through_the_view_goes_to_the_table_its_status_belongs_in(conn: Conn) -> None:
    job_id = enqueue(conn, "noop")
    conn.execute("UPDATE pgdrain.jobs SET status = 'done' WHERE id = %s", (job_id,))
    assert _where(conn, job_id) == (False, True)
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'queued', finished_at = NULL WHERE id = %s", (job_id,)
    )
    assert _where(conn, job_id) == (True, False)
    conn.execute("DELETE FROM pgdrain.jobs WHERE id = %s", (job_id,))
    assert _where(conn, job_id) == (False, False)


# -- retention by partition --------------------------------------------------------------------


def _day(days_ago: int) -> dt.date:
    return dt.datetime.now(dt.UTC).date() - dt.timedelta(days=days_ago)


def _partition(day: dt.date) -> str:
    return f"finished_jobs_{day:%Y%m%d}"


def _exists(conn: Conn, name: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"pgdrain.{name}",)).fetchone()
    return bool(row and row[0])


def _done_on(conn: Conn, day: dt.date, count: int) -> None:
    conn.execute(
        "INSERT INTO pgdrain.finished_jobs (id, queue, kind, payload, status, priority, run_at,"
        " attempts, max_attempts, recovery_policy, reclaim_count, created_at, updated_at,"
        " finished_at, errors)"
        " SELECT nextval('pgdrain.jobs_id_seq'), 'default', 'noop', '{}', 'done', 0, t, 1, 5,"
        " 'auto', 0, t, t, t, '[]'"
        " FROM (SELECT %(at)s::timestamptz AS t FROM generate_series(1, %(n)s)) AS s",
        {"at": dt.datetime.combine(day, dt.time(12), dt.UTC), "n": count},
    )


def test_retention_drops_a_day_past_its_age_and_keeps_one_within_it(conn: Conn) -> None:
    old, young = _day(9), _day(6)
    conn.execute(
        "SELECT pgdrain.finished_jobs_partition_ensure(%s, %s)", (old, young)
    )  # days of history, as migration 0018 makes them
    _done_on(conn, old, 5)
    _done_on(conn, young, 3)
    result = retention.run_once(
        conn, retain_done_days=7, retain_failed_days=30, budget=Budget.seconds(3600)
    )
    # Days 9 and 8 ago; not 7 ago, whose last hours are within the 7 days.
    assert result.complete and result.partitions_dropped == 2
    assert result.done == 0  # no row deleted: the partitions went whole
    assert not _exists(conn, _partition(old)) and _exists(conn, _partition(young))
    row = conn.execute("SELECT count(*) FROM pgdrain.jobs WHERE status = 'done'").fetchone()
    assert row == (3,)
    # The days ahead are made (today and the next two), and a second run changes nothing.
    assert all(_exists(conn, _partition(_day(-n))) for n in range(3))
    again = retention.run_once(
        conn, retain_done_days=7, retain_failed_days=30, budget=Budget.seconds(3600)
    )
    assert (again.partitions_dropped, again.done, again.complete) == (0, 0, True)


def test_making_partitions_twice_and_at_once_makes_each_once(db_url: str) -> None:
    days = (_day(-3), _day(-5))
    made: list[int] = []
    barrier = threading.Barrier(2)

    def make() -> None:
        with psycopg.connect(db_url, autocommit=True) as own:
            barrier.wait()
            row = own.execute(
                "SELECT pgdrain.finished_jobs_partition_ensure(%s, %s)", days
            ).fetchone()
            made.append(int(row[0]))  # type: ignore[index]

    threads = [threading.Thread(target=make) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(made) == [0, 3]


def test_a_done_job_of_a_day_without_its_partition_lands_in_the_default(conn: Conn) -> None:
    """Maintenance lapsed: a completion never fails for want of a partition, and retention
    deletes such rows by age."""
    _done_on(conn, _day(40), 2)
    row = conn.execute("SELECT count(*) FROM pgdrain.finished_jobs_done_default").fetchone()
    assert row == (2,)
    result = retention.run_once(
        conn, retain_done_days=7, retain_failed_days=30, budget=Budget.seconds(3600)
    )
    assert result.done == 2


# -- migration 0018 on a table of the old schema --------------------------------------------------


@pytest.fixture
def old_schema(empty_db_url: str) -> Iterator[Conn]:
    """A database at migration 0017: pgdrain.jobs still the one table."""
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        for migration in migrations():
            if migration.version < "0018":
                with conn.transaction():
                    conn.execute(migration.sql)
                    conn.execute(
                        "INSERT INTO pgdrain.migrations (version) VALUES (%s)",
                        (migration.version,),
                    )
        yield conn


OLD_SEED = """
INSERT INTO pgdrain.jobs (queue, kind, status, attempts, run_at, finished_at, idempotency_key,
                          completed_token)
SELECT 'default', 'noop', s.status, 1, now() - interval '2 days',
       CASE WHEN s.status IN ('done', 'failed', 'cancelled')
            THEN now() - g * interval '1 hour' END,
       CASE WHEN g % 7 = 0 THEN s.status || '-' || g END,
       CASE WHEN s.status = 'done' THEN gen_random_uuid() END
FROM unnest(ARRAY['queued', 'parked', 'done', 'failed', 'cancelled']) AS s(status),
     generate_series(1, 60) AS g;
INSERT INTO pgdrain.jobs (kind, status, attempts, lease_expires_at, leased_by, attempt_token,
                          heartbeat_at)
SELECT 'noop', 'running', 1, now() - interval '1 second', 'gone', gen_random_uuid(), now()
FROM generate_series(1, 20)
"""

COUNTS = "SELECT status, count(*) FROM pgdrain.jobs GROUP BY status ORDER BY status"


def test_migration_0018_keeps_every_job_and_moves_the_history(old_schema: Conn) -> None:
    for statement in OLD_SEED.split(";"):
        old_schema.execute(statement)
    before = old_schema.execute(COUNTS).fetchall()
    ids = {r[0] for r in old_schema.execute("SELECT id FROM pgdrain.jobs")}
    tokens = old_schema.execute(
        "SELECT id, completed_token FROM pgdrain.jobs WHERE status = 'done'"
    ).fetchall()

    result = migrate(old_schema)

    assert result.applied[0].startswith("0018") and result.moved == 180
    assert old_schema.execute(COUNTS).fetchall() == before
    assert {r[0] for r in old_schema.execute("SELECT id FROM pgdrain.jobs")} == ids
    row = old_schema.execute(
        "SELECT count(*) FROM pgdrain.active_jobs WHERE status IN ('done', 'failed', 'cancelled')"
    ).fetchone()
    assert row == (0,)
    # Lost-reply recovery still finds the accepted attempt of a moved job.
    moved = old_schema.execute(
        "SELECT id, completed_token FROM pgdrain.jobs WHERE status = 'done'"
    ).fetchall()
    assert sorted(moved) == sorted(tokens)


def test_jobs_in_flight_across_the_migration_all_finish_once(old_schema: Conn) -> None:
    """Queued jobs and jobs whose run died holding them (its lease expired) before the
    migration: the first run after it reclaims and finishes each, exactly once."""
    for statement in OLD_SEED.split(";"):
        old_schema.execute(statement)
    migrate(old_schema)
    url = old_schema.info.dsn
    registry = Registry()
    ran: list[int] = []
    registry.job("noop")(lambda job: ran.append(job.id))
    result = drain(Settings(batch_size=10, concurrency=2), Budget.seconds(120), registry, url)
    assert result.stop_reason == "empty"
    counts = dict(old_schema.execute(COUNTS).fetchall())
    assert counts == {"cancelled": 60, "done": 60 + 60 + 20, "failed": 60, "parked": 60}
    assert len(ran) == len(set(ran)) == 80


def test_a_drain_while_the_history_moves_loses_and_repeats_nothing(
    old_schema: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 0018's own transaction (and the later ones), then a run draining the queue
    while the finished rows it left in active_jobs move out in small batches beside it."""
    old_schema.execute(
        "INSERT INTO pgdrain.jobs (kind, status, attempts, finished_at)"
        " SELECT 'noop', 'done', 1, now() - g * interval '1 minute'"
        " FROM generate_series(1, 3000) AS g"
    )
    old_schema.execute("INSERT INTO pgdrain.jobs (kind) SELECT 'noop' FROM generate_series(1, 300)")
    # 0018's transaction and the later migrations' (which the drain's statements need), the
    # history left to move.
    for migration in migrations():
        if migration.version >= "0018":
            with old_schema.transaction():
                old_schema.execute(migration.sql)
                old_schema.execute(
                    "INSERT INTO pgdrain.migrations (version) VALUES (%s)", (migration.version,)
                )
    url = old_schema.info.dsn
    monkeypatch.setattr("pgdrain.db.migrate.MOVE_BATCH", 50)
    moved: list[int] = []

    def move() -> None:
        from pgdrain.db.migrate import after_migrations

        with psycopg.connect(url, autocommit=True) as own:
            moved.append(after_migrations(own, None))

    mover = threading.Thread(target=move)
    registry = Registry()
    ran: list[int] = []
    registry.job("noop")(lambda job: ran.append(job.id))
    mover.start()
    result = drain(Settings(batch_size=10, concurrency=2), Budget.seconds(120), registry, url)
    mover.join()
    assert result.stop_reason == "empty" and moved == [3000]
    assert len(ran) == len(set(ran)) == 300
    assert dict(old_schema.execute(COUNTS).fetchall()) == {"done": 3300}
    row = old_schema.execute("SELECT count(*) FROM pgdrain.active_jobs").fetchone()
    assert row == (0,)


# A claim as an older pgdrain writes it, through the view: the view's rows are not locked when
# read, so two such claims may read the same queued job.
CLAIM_THROUGH_THE_VIEW = """UPDATE pgdrain.jobs
SET status = 'running', attempts = attempts + 1, attempt_token = gen_random_uuid(),
    leased_by = %(worker)s, heartbeat_at = now(), lease_expires_at = now() + interval '1 hour'
WHERE id = %(id)s AND status = 'queued'
RETURNING id"""


def _guard_off(conn: Conn) -> None:
    """The control: the view's trigger without its check that the row is as the statement read
    it (this test's database only)."""
    [m18] = [m for m in migrations() if m.version == "0018"]
    start = m18.sql.index("CREATE FUNCTION pgdrain.jobs_view_write()")
    end = m18.sql.index("$$;", start) + 3
    function = m18.sql[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    conn.execute(without_line(function, "-- as the statement read it"))


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "control-unguarded"])
def test_two_claims_through_the_view_take_a_job_once(
    conn: Conn, db_url: str, guarded: bool
) -> None:
    if not guarded:
        _guard_off(conn)
    job_id = enqueue(conn, "noop")
    second: list[list[Any]] = []
    with psycopg.connect(db_url) as first, psycopg.connect(db_url) as other:
        taken = first.execute(CLAIM_THROUGH_THE_VIEW, {"worker": "a", "id": job_id}).fetchall()
        assert taken == [(job_id,)]
        other_pid = other.info.backend_pid

        def claim() -> None:
            second.append(
                other.execute(CLAIM_THROUGH_THE_VIEW, {"worker": "b", "id": job_id}).fetchall()
            )
            other.commit()

        thread = threading.Thread(target=claim)
        thread.start()
        wait_for(
            lambda: bool(
                conn.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                    (other_pid,),
                ).fetchone()[0]  # type: ignore[index]
            ),
            60.0,
            "the second claim to wait for the first's row lock",
        )
        first.commit()
        thread.join()
    row = conn.execute("SELECT leased_by FROM pgdrain.jobs WHERE id = %s", (job_id,)).fetchone()
    if guarded:
        assert second == [[]] and row == ("a",)
    else:  # both are told they took it: the job would run twice
        assert second == [[(job_id,)]] and row == ("b",)
