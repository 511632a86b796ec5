"""Least privilege: the shipped role pgdrain_worker (pgdrain/sql/worker_role.sql) is all the
drain function needs, and it can change no schema. Roles are cluster-wide, so each test makes
a login role of its own that is a member of pgdrain_worker, and drops it afterwards.

The control: a login role that is not a member cannot drain at all, and the statements the
worker is refused succeed for the schema's owner."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, LiteralString, cast

import psycopg
import pytest
from psycopg import sql

import jobs as example_jobs
from helpers.fixtures import claim_batch, job_row
from pgdrain import Budget, Settings, build_job, drain, enqueue, store

Conn = psycopg.Connection[Any]
ROLE = "pgdrain_worker"
REPO = Path(__file__).resolve().parents[2]
SETTINGS = Settings(reserve_seconds=0.5, lease_seconds=5)

# Each must fail for the worker with InsufficientPrivilege (and succeed for the owner).
DDL = (
    "CREATE TABLE pgdrain.intruder (id int)",
    "ALTER TABLE pgdrain.jobs ADD COLUMN intruder int",
    "CREATE INDEX intruder_idx ON pgdrain.jobs (kind)",
    "DROP TABLE pgdrain.kicks",
    "TRUNCATE pgdrain.jobs",
    "CREATE SCHEMA intruder",
    "CREATE TABLE public.intruder (id int)",
    "CREATE FUNCTION pgdrain.intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "SELECT * FROM pgdrain.migrations",
    "DELETE FROM pgdrain.migrations",
)


def worker_role_sql() -> str:
    return resources.files("pgdrain").joinpath("sql/worker_role.sql").read_text()


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
    statement = cast(LiteralString, worker_role_sql())
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
            (table, privilege)
            for table in ("jobs", "kicks", "queue_limits", "runs", "wakes")
            for privilege in ("DELETE", "INSERT", "SELECT", "UPDATE")
        ]
        + [("run_gate", "SELECT"), ("run_gate", "UPDATE")]  # its row lock, nothing more
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
        assert store.kick_debounce(worker, ["default"], 60.0) == ["default"]
        assert {s.queue for s in store.queue_stats(worker)} == {"default"}
        assert store.job_retry(worker, [ids[3]]) == [ids[3]]
        assert store.job_purge_finished(worker, 0) == 23


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
        assert store.run_spawn(worker, ["default"], 1, 3, 3, 60) != []
        at = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        assert store.wake_reserve(worker, "default", at, "worker-run", 30) is True
        store.wake_created(worker, "default", at, "worker-run")
        store.kick_clear(worker, ["default"])


@pytest.mark.parametrize("statement", DDL)
def test_the_worker_cannot_change_the_schema(worker_url: str, granted: str, statement: str) -> None:
    with psycopg.connect(worker_url, autocommit=True) as worker:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            worker.execute(cast(LiteralString, statement))
    # Control: the schema's owner may, so the refusal comes from the role, not the statement.
    with psycopg.connect(granted) as owner, owner.transaction(force_rollback=True):
        owner.execute(cast(LiteralString, statement))


def test_control_a_login_role_outside_the_group_cannot_drain(
    outsider_url: str, granted: str
) -> None:
    with psycopg.connect(granted, autocommit=True) as owner:
        enqueue(owner, "noop")
    result = drain(SETTINGS, Budget.seconds(10), example_jobs.jobs, outsider_url)
    assert result.stop_reason == "error"
    assert "permission denied" in str(result.error)


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
