"""Least privilege: the shipped role pgdrain_worker (pgdrain/db/sql/worker_role.sql) is all the
drain function needs, and it can change no schema. Roles are cluster-wide, so each test makes
a login role of its own that is a member of pgdrain_worker, and drops it afterwards.

The control: a login role that is not a member cannot drain at all, and the statements the
worker is refused succeed for the schema's owner."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import jobs as example_jobs
from helpers.fixtures import claim_batch, job_row, wait_for
from pgdrain import Budget, Settings, build_job, drain, enqueue, pause_queue, resume_queue
from pgdrain.db import store
from pgdrain.db.migrate import MigrationLocked, migrate

Conn = psycopg.Connection[Any]
ROLE = "pgdrain_worker"
REPO = Path(__file__).resolve().parents[2]
SETTINGS = Settings(reserve_seconds=0.5, lease_seconds=5)

# Each must fail for the worker with InsufficientPrivilege (and succeed for the owner).
DDL = (
    "CREATE TABLE pgdrain.intruder (id int)",
    "ALTER TABLE pgdrain.active_jobs ADD COLUMN intruder int",
    "CREATE INDEX intruder_idx ON pgdrain.active_jobs (kind)",
    "DROP TABLE pgdrain.kicks",
    "TRUNCATE pgdrain.active_jobs",
    "TRUNCATE pgdrain.finished_jobs",
    "DROP TABLE pgdrain.finished_jobs_done_default",
    "DROP VIEW pgdrain.jobs",
    "CREATE SCHEMA intruder",
    "CREATE TABLE public.intruder (id int)",
    "CREATE FUNCTION pgdrain.intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "SELECT * FROM pgdrain.migrations",
    "DELETE FROM pgdrain.migrations",
)


def worker_role_sql() -> str:
    return resources.files("pgdrain.db").joinpath("sql/worker_role.sql").read_text()


def _as(url: str, user: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["user"] = user
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def _login_role(admin_url: str, member: bool) -> Iterator[str]:
    name = f"pgdrain_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        statement = "CREATE ROLE {} LOGIN IN ROLE {}" if member else "CREATE ROLE {} LOGIN"
        identifiers = [sql.Identifier(name), sql.Identifier(ROLE)][: 2 if member else 1]
        admin.execute(sql.SQL(statement).format(*identifiers))
    try:
        yield name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def granted(db_url: str) -> str:
    """The test's database with worker_role.sql applied (twice: it must be repeatable)."""
    statement = worker_role_sql()
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute(statement)
        owner.execute(statement)
    return db_url


@pytest.fixture
def worker_url(granted: str, admin_url: str) -> Iterator[str]:
    """The test's database, as a fresh login role that is a member of pgdrain_worker."""
    for name in _login_role(admin_url, member=True):
        yield _as(granted, name)


@pytest.fixture
def outsider_url(granted: str, admin_url: str) -> Iterator[str]:
    """The test's database, as a login role that is not a member of pgdrain_worker."""
    for name in _login_role(admin_url, member=False):
        yield _as(granted, name)


def test_the_role_is_a_nologin_group_with_only_the_documented_grants(granted: str) -> None:
    with psycopg.connect(granted, autocommit=True) as conn:
        row = conn.execute(
            "SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole FROM pg_roles"
            " WHERE rolname = %s",
            (ROLE,),
        ).fetchone()
        assert row == (False, False, False, False)
        grants = conn.execute(
            "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
            " WHERE grantee = %s ORDER BY 1, 2",
            (ROLE,),
        ).fetchall()
    expected = sorted(
        [
            *(
                (table, privilege)
                for table in (
                    "active_jobs",
                    "finished_jobs",
                    "jobs",
                    "kicks",
                    "queue_limits",
                    "runs",
                    "wakes",
                )
                for privilege in ("DELETE", "INSERT", "SELECT", "UPDATE")
            ),
            # retention deletes the rows of these partitions by name (migration 0018)
            *(
                (table, privilege)
                for table in ("finished_jobs_done_default", "finished_jobs_failed")
                for privilege in ("DELETE", "SELECT")
            ),
            # a run records each periodic slot it enqueued; it never deletes one
            *(("periodic_slots", privilege) for privilege in ("INSERT", "SELECT", "UPDATE")),
            ("run_gate", "SELECT"),  # its row lock, nothing more
            ("run_gate", "UPDATE"),
            # a run's exit writes its history line, retention deletes old ones; none changes
            *(("run_history", privilege) for privilege in ("DELETE", "INSERT", "SELECT")),
            # the reclaim and a run's exit read the floor; only lease_floor_raise moves it
            ("lease_floor", "SELECT"),
            # the claims and the checks read the queues' floors (the view, and one queue's
            # marks by index: migration 0035); only the triggers and queue_floors_raise write
            # marks
            ("queue_floors", "SELECT"),
            ("queue_floor_marks", "SELECT"),
        ]
    )
    assert grants == expected


def test_a_drain_of_real_jobs_succeeds_as_the_worker(worker_url: str, granted: str) -> None:
    with psycopg.connect(worker_url, autocommit=True) as worker:
        assert worker.execute("SELECT current_user").fetchone() != ("postgres",)
        # A job whose drain died: its lease expired, so this drain reclaims it.
        stuck = enqueue(worker, "noop")
        claim_batch(worker, ["default"], 1, "dead", 30.0, None)
        ids = [
            enqueue(worker, "noop"),
            enqueue(worker, "sleep", {"seconds": 0.2}),
            enqueue(worker, "flaky", {"failures": 1}),
            enqueue(worker, "fail", max_attempts=1),
        ]
        store.job_insert_many(worker, [build_job("noop", {"n": i}) for i in range(20)])
        with psycopg.connect(granted, autocommit=True) as owner:
            owner.execute(
                "UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 second'"
                " WHERE id = %s",
                (stuck,),
            )
        result = drain(SETTINGS, Budget.seconds(60), example_jobs.jobs, worker_url)
        assert result.stop_reason == "empty", result.error
        assert (result.done, result.retried, result.failed, result.reclaimed) == (23, 1, 1, 1)
        statuses = [job_row(worker, i)["status"] for i in ids]
        assert statuses == ["done", "done", "queued", "failed"]
        # What else the function and the CLI do: kicks, stats, retry, purge.
        # (the flaky job's retry is due later: the kick asks for its wake-up)
        assert list(store.kick_debounce(worker, ["default"], 60.0).later) == ["default"]
        assert {s.queue for s in store.queue_stats(worker)} == {"default"}
        assert [r.id for r in store.job_retry(worker, [ids[3]]) if r.retried] == [ids[3]]
        assert store.job_purge_finished(worker, 0) == 23


def test_retention_makes_and_drops_partitions_as_the_worker(worker_url: str, granted: str) -> None:
    """The worker creates and drops no table itself: the partition functions do it as the
    schema's owner, and retention's row deletes name the partitions it was granted."""
    import datetime as dt

    from pgdrain.db import retention

    old = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=10)
    with psycopg.connect(granted, autocommit=True) as owner:
        owner.execute("SELECT pgdrain.finished_jobs_partition_ensure(%s, %s)", (old, old))
    with psycopg.connect(worker_url, autocommit=True) as worker:
        job_id = enqueue(worker, "noop")
        worker.execute(
            "UPDATE pgdrain.jobs SET status = 'failed', finished_at = now() - interval '40 days'"
            " WHERE id = %s",
            (job_id,),
        )
        result = retention.run_once(
            worker, retain_done_days=7, retain_failed_days=30, budget=Budget.seconds(60)
        )
        assert (result.complete, result.failed, result.partitions_dropped) == (True, 1, 1)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute(f"DROP TABLE pgdrain.finished_jobs_{dt.datetime.now(dt.UTC):%Y%m%d}")


@pytest.mark.parametrize("bounded", [True, False], ids=["the-days-ahead", "control-any-range"])
def test_the_worker_makes_no_day_partition_of_a_range_it_chooses(
    worker_url: str, granted: str, bounded: bool
) -> None:
    """The worker may have the owner make the day partitions of today to the day after
    tomorrow, and no others: with a range of its choosing, a job's code made a table a day,
    for centuries (migration 0048). The control grants the function with a range, as before."""
    if not bounded:
        with psycopg.connect(granted, autocommit=True) as owner:
            owner.execute(
                "GRANT EXECUTE ON FUNCTION pgdrain.finished_jobs_partition_ensure(date, date)"
                " TO pgdrain_worker"
            )
    far = "SELECT pgdrain.finished_jobs_partition_ensure('3000-01-01', '3000-01-10')"
    with psycopg.connect(worker_url, autocommit=True) as worker:
        worker.execute("SELECT pgdrain.finished_jobs_partition_ensure_ahead()")
        if bounded:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute(far)
        else:
            assert worker.execute(far).fetchone() == (10,)


def test_the_control_plane_works_as_the_worker(worker_url: str) -> None:
    """Registration, the fan-out gate, queue limits, the exit check and a wake-up reservation:
    every statement a run's control plane makes, under the worker's grants."""
    import datetime as dt

    from pgdrain.aws import events
    from pgdrain.aws.control import RunControl
    from pgdrain.aws.wake import Waker

    budget = Budget.seconds(60)
    control = RunControl(
        events.Trigger("schedule", ("default",)),
        "worker-run",
        budget,
        waker=Waker(SETTINGS, None),
        queue_limits=(("default", 2),),
    )
    with psycopg.connect(worker_url, autocommit=True) as worker:
        enqueue(worker, "noop")
        result = drain(SETTINGS, budget, example_jobs.jobs, worker_url, hooks=control)
        assert (result.stop_reason, result.done) == ("empty", 1), result.error
        # Its exit wrote its history line; retention deletes the line once it is old.
        [line] = store.run_history_list(worker)
        assert (line.run_id, line.stop_reason) == (control.run_id, "empty")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute("UPDATE pgdrain.run_history SET done = 0")
        assert store.job_retention_batch(worker, 0, 0, 0, 0, 10).runs == 1
        assert store.run_spawn(worker, str(uuid.uuid4()), ["default"], 1, 3, 3, 60) != []
        at = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        assert store.wake_reserve(worker, "default", at, "worker-run", 30) is not None
        store.wake_created(worker, "default", at, "worker-run")
        store.kick_clear(worker, ["default"])
        # A limit's count that drifted high is recounted, and what it held back counted.
        enqueue(worker, "noop")
        worker.execute("UPDATE pgdrain.queue_limits SET running = max_running")
        assert store.queue_depth_held_statement(["default"]).run(worker).ready == 1
        [recounted] = store.queue_limit_recount_statement(["default"]).run(worker)
        assert (recounted.was, recounted.running) == (2, 0)
        # `pgdrain pause` and resume on the function's role (migrations 0039, 0042).
        assert pause_queue(worker, "default") is not None
        assert resume_queue(worker, "default") is True


@pytest.mark.parametrize("regranted", [True, False], ids=["by-0019", "control: not granted"])
def test_a_role_granted_before_the_run_history_still_exits(
    worker_url: str, granted: str, regranted: bool
) -> None:
    """A database whose worker role was granted before migration 0019: the migration grants
    the new table to it, so the worker's exit (which now writes its line there) does not fail
    before worker_role.sql is run again. The control takes the grant back after migrating."""
    with psycopg.connect(granted, autocommit=True) as owner:
        # As it was before 0019: no table, no ledger entry (nor of 0023 and 0027, its
        # columns); then `pgdrain migrate`.
        owner.execute("DROP TABLE pgdrain.run_history")
        owner.execute("DELETE FROM pgdrain.migrations WHERE version IN ('0019', '0023', '0027')")
        assert [m.split("_")[0] for m in migrate(owner).applied] == ["0019", "0023", "0027"]
        if not regranted:
            owner.execute("REVOKE ALL ON pgdrain.run_history FROM pgdrain_worker")
    record = store.RunRecord("schedule", 0, 1.0, "empty", {})
    with psycopg.connect(worker_url, autocommit=True) as worker:
        store.run_register(worker, "old-grant", ["default"], 0, 60.0)
        if not regranted:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                store.run_exit(worker, "old-grant", ["default"], record=record)
            return
        assert store.run_exit(worker, "old-grant", ["default"], record=record).exited
        assert [r.run_id for r in store.run_history_list(worker)] == ["old-grant"]


@pytest.mark.parametrize("regranted", [True, False], ids=["by-0024", "control: not granted"])
def test_a_role_granted_before_the_lease_floor_still_reclaims(
    worker_url: str, granted: str, regranted: bool
) -> None:
    """A database whose worker role was granted before migration 0024: the migration grants it
    the floor and its raise, so a run's reclaim (which now reads the one and sends the other)
    does not fail before worker_role.sql is run again. The control takes them back."""
    with psycopg.connect(granted, autocommit=True) as owner:
        # As it was before 0024; then `pgdrain migrate`.
        owner.execute("DROP TABLE pgdrain.lease_floor")
        owner.execute("DROP FUNCTION pgdrain.lease_floor_raise()")
        owner.execute("DROP FUNCTION pgdrain.lease_floor_lower() CASCADE")
        owner.execute("DELETE FROM pgdrain.migrations WHERE version = '0024'")
        assert [m.split("_")[0] for m in migrate(owner).applied] == ["0024"]
        if not regranted:
            owner.execute("REVOKE ALL ON pgdrain.lease_floor FROM pgdrain_worker")
        enqueue(owner, "noop")
    with psycopg.connect(worker_url, autocommit=True) as worker:
        if not regranted:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                store.job_reclaim_expired(worker, 10)
            return
        [held] = claim_batch(worker, ["default"], 1, "w-dead", 30.0, 0.0)
        store.floors_raise(worker)
        assert [r.id for r in store.job_reclaim_expired(worker, 10)] == [held.id]


@pytest.mark.parametrize("regranted", [True, False], ids=["by-0026", "control: not granted"])
def test_a_role_granted_before_the_queue_floors_still_claims(
    worker_url: str, granted: str, regranted: bool
) -> None:
    """A database whose worker role was granted before migration 0026: the migrations grant it
    the queues' floors and their raise (0026) and their marks (0035, which the claim probes), so
    a run's claims do not fail before worker_role.sql is run again. The control takes them
    back."""
    with psycopg.connect(granted, autocommit=True) as owner:
        # As it was before 0026; then `pgdrain migrate`.
        owner.execute("DROP VIEW pgdrain.queue_floors")
        owner.execute("DROP TABLE pgdrain.queue_floor_marks")
        owner.execute("DROP FUNCTION pgdrain.queue_floors_raise()")
        owner.execute("DROP FUNCTION pgdrain.queue_floor_lower() CASCADE")
        owner.execute("DELETE FROM pgdrain.migrations WHERE version IN ('0026', '0035')")
        enqueue(owner, "noop")  # queued before the migration: the migration marks it
        assert [m.split("_")[0] for m in migrate(owner).applied] == ["0026", "0035"]
        if not regranted:
            owner.execute(
                "REVOKE ALL ON pgdrain.queue_floors, pgdrain.queue_floor_marks FROM pgdrain_worker"
            )
    with psycopg.connect(worker_url, autocommit=True) as worker:
        if not regranted:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                claim_batch(worker, ["default"], 1, "w", 30.0, None)
            return
        store.floors_raise(worker)
        assert len(claim_batch(worker, ["default"], 1, "w", 30.0, None)) == 1


@pytest.mark.parametrize("statement", DDL)
def test_the_worker_cannot_change_the_schema(worker_url: str, granted: str, statement: str) -> None:
    with psycopg.connect(worker_url, autocommit=True) as worker:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute(statement)
    # Control: the schema's owner may, so the refusal comes from the role, not the statement.
    with psycopg.connect(granted) as owner, owner.transaction(force_rollback=True):
        owner.execute(statement)


def test_control_a_login_role_outside_the_group_cannot_drain(
    outsider_url: str, granted: str
) -> None:
    with psycopg.connect(granted, autocommit=True) as owner:
        enqueue(owner, "noop")
    result = drain(SETTINGS, Budget.seconds(10), example_jobs.jobs, outsider_url)
    assert result.stop_reason == "error"
    assert "permission denied" in str(result.error)


# What PUBLIC holds by default and worker_role.sql takes away in the queue's database. Each
# must fail for the worker there, and (the control) succeed for the same login role in a
# database where the file was not applied.
PUBLIC_BY_DEFAULT = (
    "CREATE TEMP TABLE intruder (id int)",
    "SELECT lo_create(0)",
    "SELECT lo_creat(-1)",
    "SELECT lo_from_bytea(0, 'data'::bytea)",
    "SELECT lo_put(lo_create(0), 0, 'data'::bytea)",
)


@pytest.mark.parametrize("statement", PUBLIC_BY_DEFAULT)
def test_the_worker_may_not_use_temp_tables_or_large_objects(
    granted: str, admin_url: str, empty_db_url: str, statement: str
) -> None:
    for name in _login_role(admin_url, member=True):
        with psycopg.connect(_as(granted, name)) as worker:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                worker.execute(statement)
        # Control: the same role, where the file was not applied (PUBLIC's defaults).
        with psycopg.connect(_as(empty_db_url, name)) as worker:
            with worker.transaction(force_rollback=True):
                worker.execute(statement)


def test_connect_to_other_databases_is_the_owners_choice(
    granted: str, admin_url: str, empty_db_url: str
) -> None:
    """By default the worker can connect to any database (PUBLIC holds CONNECT). Revoking it
    from PUBLIC on another database shuts the worker out there; revoking it on the queue's own
    database does not, since worker_role.sql granted CONNECT to pgdrain_worker itself."""
    for name in _login_role(admin_url, member=True):
        other = _as(empty_db_url, name)
        with psycopg.connect(other) as worker:  # the default: allowed
            assert worker.execute("SELECT 1").fetchone() == (1,)
        with psycopg.connect(admin_url, autocommit=True) as admin:
            for url in (empty_db_url, granted):
                dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
                admin.execute(
                    sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(
                        sql.Identifier(str(dbname))
                    )
                )
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(other).close()
        with psycopg.connect(_as(granted, name)) as worker:
            assert worker.execute("SELECT 1").fetchone() == (1,)
        for outsider in _login_role(admin_url, member=False):
            with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
                psycopg.connect(_as(granted, outsider)).close()


def _hold_the_migration_lock(worker: Conn) -> int:
    worker.execute("SELECT pg_advisory_lock(hashtext('pgdrain.migrate'))")
    row = worker.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def test_a_worker_holding_the_migration_lock_cannot_hang_migrate(
    worker_url: str, granted: str
) -> None:
    """Any role may take an advisory lock. migrate waits at most its lock timeout, applies
    nothing, and names the session in its way."""
    with psycopg.connect(worker_url, autocommit=True) as worker:
        pid = _hold_the_migration_lock(worker)
        role = psycopg.conninfo.conninfo_to_dict(worker_url)["user"]
        with psycopg.connect(granted, autocommit=True) as owner:
            with pytest.raises(MigrationLocked) as raised:
                migrate(owner, lock_timeout_s=0.2)
    message = str(raised.value)
    assert f"the migration lock is held by pid {pid} (role {role!r}" in message
    assert "applied nothing" in message and "\n" not in message


def test_control_without_the_lock_timeout_migrate_waits_for_the_worker(
    worker_url: str, granted: str
) -> None:
    """The same lock, no timeout: migrate blocks for as long as the worker holds it (seen in
    pg_locks, not timed), and goes on only when the worker lets go."""
    with psycopg.connect(worker_url, autocommit=True) as worker:
        _hold_the_migration_lock(worker)
        outcome: list[object] = []

        def run() -> None:
            with psycopg.connect(granted, autocommit=True) as owner:
                outcome.append(migrate(owner, lock_timeout_s=None))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        with psycopg.connect(granted, autocommit=True) as observer:

            def waiting() -> bool:
                row = observer.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()
                return bool(row and row[0])

            wait_for(waiting, what="migrate to wait for the advisory lock")
            assert thread.is_alive() and outcome == []
        worker.execute("SELECT pg_advisory_unlock(hashtext('pgdrain.migrate'))")
        thread.join(timeout=60)
    assert not thread.is_alive() and len(outcome) == 1


def test_migrate_as_the_worker_fails_with_one_line(worker_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": worker_url, "PYTHONPATH": str(REPO / "handler")}
    run = subprocess.run(
        [sys.executable, "-m", "pgdrain.cli", "migrate"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and "permission denied" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
