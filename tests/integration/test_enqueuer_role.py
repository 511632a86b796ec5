"""The application's role: pgdrain_enqueuer (pgdrain/db/sql/enqueuer_role.sql) enqueues jobs
in every way pgdrain offers and kicks the function, and may do nothing else to the queue: no
update or delete of a job, no reading of another job's payload, kind or error, no job inserted
running, no claim. The application used to be told to use the worker role, which may.

The control: each statement the enqueuer is refused succeeds for the worker role."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from importlib import resources
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql

from helpers.fixtures import claim_batch
from pgdrain import Settings, build_job, enqueue, enqueue_many, enqueue_statement, kick
from pgdrain.db import store

Conn = psycopg.Connection[Any]
ROLE = "pgdrain_enqueuer"

# Each must fail for the enqueuer with InsufficientPrivilege (the control: the worker may).
REFUSED = {
    "update-a-job": "UPDATE pgdrain.jobs SET status = 'done'",
    "delete-a-job": "DELETE FROM pgdrain.jobs",
    "read-payloads": "SELECT payload FROM pgdrain.jobs",
    "read-kinds": "SELECT kind FROM pgdrain.jobs",
    "read-errors": "SELECT last_error, errors FROM pgdrain.jobs",
    "insert-running": (
        "INSERT INTO pgdrain.jobs (kind, status, attempts, attempt_token, leased_by,"
        " lease_expires_at, heartbeat_at) VALUES ('k', 'running', 1, gen_random_uuid(), 'me',"
        " now() + interval '1 hour', now())"
    ),
    "read-runs": "SELECT * FROM pgdrain.runs",
    "queue-limits": "DELETE FROM pgdrain.queue_limits",
    "delete-kicks": "DELETE FROM pgdrain.kicks",
}


def _role_sql(name: str) -> str:
    return resources.files("pgdrain.db").joinpath(f"sql/{name}").read_text()


def _as(url: str, user: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["user"] = user
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture
def granted(db_url: str) -> str:
    """The test's database with both role files applied (twice: each must be repeatable)."""
    with psycopg.connect(db_url, autocommit=True) as owner:
        for name in ("enqueuer_role.sql", "worker_role.sql", "enqueuer_role.sql"):
            owner.execute(_role_sql(name))
    return db_url


def _member_of(granted: str, admin_url: str, group: str) -> Iterator[str]:
    name = f"pgdrain_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(name), sql.Identifier(group)
            )
        )
    try:
        yield _as(granted, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def app_url(granted: str, admin_url: str) -> Iterator[str]:
    yield from _member_of(granted, admin_url, ROLE)


@pytest.fixture
def worker_url(granted: str, admin_url: str) -> Iterator[str]:
    yield from _member_of(granted, admin_url, "pgdrain_worker")


def test_the_role_is_a_nologin_group_with_only_the_documented_grants(granted: str) -> None:
    with psycopg.connect(granted, autocommit=True) as conn:
        row = conn.execute(
            "SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolbypassrls"
            " FROM pg_roles WHERE rolname = %s",
            (ROLE,),
        ).fetchone()
        assert row == (False, False, False, False, False)
        tables = conn.execute(
            "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
            " WHERE grantee = %s ORDER BY 1, 2",
            (ROLE,),
        ).fetchall()
        columns = conn.execute(
            "SELECT privilege_type, column_name FROM information_schema.column_privileges"
            " WHERE grantee = %s AND table_name = 'jobs' ORDER BY 1, 2",
            (ROLE,),
        ).fetchall()
    assert tables == [
        ("kicks", "INSERT"),
        ("kicks", "SELECT"),
        ("kicks", "UPDATE"),
        ("wakes", "DELETE"),
        ("wakes", "INSERT"),
        ("wakes", "SELECT"),
        ("wakes", "UPDATE"),
    ]
    inserted = sorted(
        [
            "queue",
            "kind",
            "payload",
            "priority",
            "run_at",
            "max_attempts",
            "recovery_policy",
            "idempotency_key",
            "sequence",
            "depends_on",
        ]
    )
    read = sorted(["id", "queue", "status", "run_at", "idempotency_key"])
    assert columns == [("INSERT", c) for c in inserted] + [("SELECT", c) for c in read]


class _Lambda:
    """Stands for boto3's Lambda client: counts the asynchronous invokes."""

    def __init__(self) -> None:
        self.events: list[bytes] = []

    def invoke(self, **kwargs: Any) -> dict[str, Any]:
        self.events.append(kwargs["Payload"])
        return {"StatusCode": 202}


def test_every_way_to_enqueue_and_kick_works_as_the_enqueuer(app_url: str, granted: str) -> None:
    with psycopg.connect(app_url, autocommit=True) as app:
        with app.transaction():
            first = enqueue(app, "noop", {"n": 1}, idempotency_key="order-1")
        # The same key again: the job it names (read by id, queue, status and key alone).
        assert enqueue(app, "noop", {"n": 2}, idempotency_key="order-1") == first
        ids = enqueue_many(app, [build_job("noop", {"n": i}) for i in range(5)])
        text, params = enqueue_statement("noop", {"n": 9}, delay=600)
        row = app.execute(text, params).fetchone()
        assert row is not None
        assert len(ids) == 5
        # The kick: the debounce, then (the delayed job) a wake-up request and its record.
        client = _Lambda()
        settings = Settings(function_name="pgdrain-drain", kick_debounce_seconds=0)
        assert kick(app, ["default"], settings=settings, client=cast(Any, client)) == ("default",)
        assert len(client.events) == 1
        store.kick_clear(app, ["default"])
        at = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        assert store.wake_reserve(app, "later", at, "kick:x", 30) is not None
        store.wake_created(app, "later", at, "kick:x")
        store.wake_release(app, "later", at, "kick:x")
    with psycopg.connect(granted, autocommit=True) as owner:
        count = owner.execute("SELECT count(*) FROM pgdrain.jobs").fetchone()
    assert count == (7,)


@pytest.mark.parametrize("statement", REFUSED.values(), ids=REFUSED.keys())
def test_the_enqueuer_may_not_touch_what_it_did_not_write(
    app_url: str, worker_url: str, granted: str, statement: str
) -> None:
    with psycopg.connect(granted, autocommit=True) as owner:
        enqueue(owner, "noop", {"secret": "another app's data"})
    with psycopg.connect(app_url) as app, pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute(statement)
    # The control: the worker role, which the application was told to use, may.
    with psycopg.connect(worker_url) as worker, worker.transaction(force_rollback=True):
        worker.execute(statement)


def test_the_enqueuer_cannot_claim(app_url: str, granted: str) -> None:
    with psycopg.connect(granted, autocommit=True) as owner:
        enqueue(owner, "noop")
    with psycopg.connect(app_url, autocommit=True) as app:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            claim_batch(app, ["default"], 1, "app", 30.0, None)


def test_the_enqueuer_enqueues_sequences_and_dependencies(app_url: str, granted: str) -> None:
    """The trigger that decides queued or waiting reads and writes what the enqueuer may not
    (pgdrain.sequences, a dependency's row): it runs with its owner's rights."""
    with psycopg.connect(app_url, autocommit=True) as app:
        first = enqueue(app, "noop", sequence="customer-1")
        second = enqueue(app, "noop", sequence="customer-1")
        after = enqueue(app, "noop", after=[first])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT * FROM pgdrain.sequences")
    with psycopg.connect(granted, autocommit=True) as owner:
        rows = owner.execute(
            "SELECT id, status FROM pgdrain.jobs WHERE id = ANY(%s) ORDER BY id",
            ([first, second, after],),
        ).fetchall()
    assert rows == [(first, "queued"), (second, "waiting"), (after, "waiting")]
