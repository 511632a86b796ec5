"""A worker role can ALTER ROLE itself: PostgreSQL lets every role set its own session defaults
(`ALTER ROLE CURRENT_USER SET ...`), and they apply to every session it opens. A compromised job
holding the drain's credentials could so make the next runs fail: read-only transactions, a 1 ms
statement timeout, a serializable default, another DateStyle, search_path or client_encoding.
The run sets what it relies on itself, per transaction (behind a transaction pooler) or per
session (hot_path.sql's transaction_begin, transaction_limits and session_limits; the client
encoding in the startup packet), so each of these leaves a drain of real jobs unharmed.

The controls: the statements as they were (the lines marked `a role's own default` removed)
fail the drain under a read-only default; a connection of the role's own reads its payloads in
LATIN1 and fails on a job whose payload is not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, Literal

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

import jobs as example_jobs
from pgdrain import Budget, Settings, drain, enqueue
from pgdrain.db import connection
from pgdrain.db import sql as statement_files

Conn = psycopg.Connection[Any]
GROUP = "pgdrain_worker"
PINNED = "a role's own default"
JOBS = 6
HOSTILE = {  # the setting, and its value as ALTER ROLE ... SET writes it
    "read-only": ("default_transaction_read_only", "on"),
    "statement-timeout-1ms": ("statement_timeout", "1"),
    "lock-timeout-1ms": ("lock_timeout", "1"),
    "serializable": ("default_transaction_isolation", "serializable"),
    "idle-in-transaction-1ms": ("idle_in_transaction_session_timeout", "1"),
    "datestyle": ("DateStyle", "'SQL, DMY'"),
    "search-path": ("search_path", "public, pg_catalog"),
    "latin1": ("client_encoding", "LATIN1"),
}


def _as(url: str, user: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["user"] = user
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture
def worker_url(db_url: str, admin_url: str) -> Iterator[str]:
    """The test's database, as a fresh login role in pgdrain_worker (worker_role.sql)."""
    from importlib import resources

    role_sql = resources.files("pgdrain.db").joinpath("sql/worker_role.sql").read_text()
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute(role_sql)
    name = f"pgdrain_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(name), sql.Identifier(GROUP)
            )
        )
    try:
        yield _as(db_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def _set_own_default(worker_url: str, name: str, value: str) -> None:
    """As the worker itself: nothing but its own login is needed."""
    with psycopg.connect(worker_url, autocommit=True) as me:
        # The values are this module's own constants, written as SQL.
        me.execute(
            sql.SQL("ALTER ROLE CURRENT_USER SET {} = {}").format(
                sql.Identifier(name.lower()),
                sql.SQL(value),
            )
        )
    with psycopg.connect(worker_url, autocommit=True) as fresh:  # a new session has it
        row = fresh.execute(sql.SQL("SHOW {}").format(sql.Identifier(name.lower()))).fetchone()
        assert row is not None and value.strip("'")[:3].lower() in row[0].lower(), row


def _jobs(conn: Conn) -> None:
    for n in range(JOBS):
        enqueue(conn, "noop", {"n": n, "name": "名前"})  # not LATIN1


def _drain(worker_url: str, pooler: Literal["session", "transaction"]) -> Any:
    settings = Settings(reserve_seconds=0.5, lease_seconds=5, pooler=pooler)
    return drain(settings, Budget.seconds(20.0), example_jobs.jobs, worker_url)


def _done(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgdrain.jobs WHERE status = 'done'").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("pooler", ["session", "transaction"])
@pytest.mark.parametrize(("name", "value"), HOSTILE.values(), ids=HOSTILE.keys())
def test_the_roles_own_defaults_do_not_reach_the_drain(
    worker_url: str,
    conn: Conn,
    name: str,
    value: str,
    pooler: Literal["session", "transaction"],
) -> None:
    _set_own_default(worker_url, name, value)
    _jobs(conn)
    result = _drain(worker_url, pooler)
    assert (result.stop_reason, result.error) == ("empty", None), result
    assert (result.done, _done(conn)) == (JOBS, JOBS)


@pytest.mark.parametrize("pooler", ["session", "transaction"])
def test_control_the_statements_as_they_were_fail_under_a_read_only_default(
    worker_url: str,
    conn: Conn,
    monkeypatch: pytest.MonkeyPatch,
    pooler: Literal["session", "transaction"],
) -> None:
    loaded = statement_files.statements()
    old = {
        name: s._replace(text=without_lines(s.text, PINNED))
        for name, s in loaded.items()
        if name in ("transaction_begin", "transaction_limits", "session_limits")
    }
    assert all(PINNED not in s.text and s.text != loaded[n].text for n, s in old.items())
    monkeypatch.setattr(statement_files, "statements", lambda: {**loaded, **old})
    _set_own_default(worker_url, "default_transaction_read_only", "on")
    _jobs(conn)
    result = _drain(worker_url, pooler)
    assert result.stop_reason == "error", result
    assert "read-only transaction" in str(result.error), result
    assert _done(conn) == 0


def test_control_a_connection_of_the_roles_own_reads_in_its_encoding(
    worker_url: str, conn: Conn
) -> None:
    """A connection that does not name its client encoding gets the role's: LATIN1 cannot
    carry the payload, and the read fails. pgdrain's connection names UTF8."""
    _set_own_default(worker_url, "client_encoding", "LATIN1")
    _jobs(conn)
    statement = "SELECT payload::text FROM pgdrain.jobs LIMIT 1"
    with psycopg.connect(worker_url, autocommit=True) as plain:
        with pytest.raises(pg_errors.UntranslatableCharacter):
            plain.execute(statement).fetchone()
    with connection.connect(worker_url, Settings(), Budget.seconds(10.0)) as ours:
        row = ours.execute(statement).fetchone()
        assert row is not None and "名前" in row[0]


def without_lines(text: str, fragment: str) -> str:
    return "\n".join(line for line in text.splitlines() if fragment not in line)
