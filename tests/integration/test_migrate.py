"""Migrations: applied once, in order, recorded; safe when two processes race; and the schema
they build is the one every named statement in sql/*.sql was written against."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.fixtures import wait_for
from helpers.lock_waits import someone_here_waits_on_a_lock
from pgdrain.db import migrate as pgdrain_migrate
from pgdrain.db.migrate import MigrateResult, migrate
from pgdrain.db.sql import PLACEHOLDER, migrations, query, query_names

Conn = psycopg.Connection[Any]

ROOT = Path(__file__).resolve().parents[2]
PGDRAIN = ROOT / ".venv" / "bin" / "pgdrain"
WAIT_SECONDS = 60.0
PROCESS_TIMEOUT_SECONDS = 120.0

# A catalog fingerprint of the pgdrain schema: tables, columns, constraints, indexes.
SCHEMA_FINGERPRINT = """
SELECT 'column', c.table_name || '.' || c.column_name || ' ' || c.data_type
    || ' ' || c.is_nullable || ' ' || coalesce(c.column_default, '')
FROM information_schema.columns c WHERE c.table_schema = 'pgdrain'
UNION ALL
SELECT 'constraint', conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'pgdrain'::regnamespace
UNION ALL
SELECT 'index', indexdef FROM pg_indexes WHERE schemaname = 'pgdrain'
ORDER BY 1, 2
"""


def _fingerprint(conn: Conn) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in conn.execute(SCHEMA_FINGERPRINT).fetchall()]


def _ledger(conn: Conn) -> list[str]:
    rows = conn.execute("SELECT version FROM pgdrain.migrations ORDER BY applied_at, version")
    return [r[0] for r in rows.fetchall()]


ALL_VERSIONS = sorted(m.version for m in migrations())


def test_migrate_applies_every_migration_once_then_nothing(empty_db_url: str) -> None:
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        first = migrate(conn)
        assert first.applied == tuple(m.name for m in migrations())
        assert first.already == ()
        schema = _fingerprint(conn)

        second = migrate(conn)
        assert second.applied == ()
        assert second.already == tuple(ALL_VERSIONS)
        assert _fingerprint(conn) == schema
        assert _ledger(conn) == ALL_VERSIONS


def test_migrate_on_the_migrated_template_applies_nothing(conn: Conn) -> None:
    schema = _fingerprint(conn)
    assert migrate(conn).applied == ()
    assert _fingerprint(conn) == schema


def _waiting_on_the_migration_lock(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks"
        " WHERE locktype = 'advisory' AND NOT granted"
        "   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    return int(row[0]) if row else 0


def _pgdrain(url: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONPATH": str(ROOT / "handler"),
        "PGDRAIN_CONNECT_TIMEOUT": "30",
    }
    return subprocess.Popen(
        [str(PGDRAIN), *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_migrate_behind_a_long_read_of_the_history_leaves_the_day_partitions(
    db_url: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """A red team's report: the daily `pgdrain migrate` (nothing to apply) waited its 30 s
    lock timeout to attach a day partition behind a long read, every read of the history
    queued behind it, then failed. It now waits as retention does (2 s), says so, and exits
    well: done jobs go to the default partition until a run makes the day."""
    day = conn.execute("SELECT to_char(current_date + 2, 'YYYYMMDD')").fetchone()
    assert day is not None
    conn.execute(f"DROP TABLE pgdrain.finished_jobs_{day[0]}")
    with psycopg.connect(db_url) as reader:
        reader.execute("SELECT count(*) FROM pgdrain.finished_jobs_done_default")  # held open
        with psycopg.connect(db_url, autocommit=True) as operator:
            result = migrate(operator)
    assert result.applied == ()
    assert "the day partitions of done jobs were not made" in caplog.text
    made = conn.execute("SELECT to_regclass(%s)", (f"pgdrain.finished_jobs_{day[0]}",))
    assert made.fetchone() == (None,)
    migrate(conn)  # the reader gone: made
    assert conn.execute(
        "SELECT to_regclass(%s)", (f"pgdrain.finished_jobs_{day[0]}",)
    ).fetchone() != (None,)


# Migration 0033 taken back, so that `migrate` applies it again: its first statement takes
# ACCESS EXCLUSIVE on finished_jobs, which a long read of the history holds.
UNDO_0033 = """
ALTER TABLE pgdrain.finished_jobs DROP COLUMN cancelled_lease_expires_at;
ALTER TABLE pgdrain.queue_limits DROP CONSTRAINT queue_limits_queue_name_chk;
DELETE FROM pgdrain.migrations WHERE version = '0033';
"""


@pytest.mark.parametrize(
    "try_lock_ms", [300, 600_000], ids=["short-tries", "control-one-long-wait"]
)
def test_a_migrate_behind_a_long_read_lets_the_queue_through_while_it_waits(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, try_lock_ms: int
) -> None:
    """An upgrader's report: behind a long read, migrate waited its whole lock timeout for the
    history, and every read and write of it queued behind the migration meanwhile. Each try now
    waits at most TRY_LOCK_MS, then rolls back and lets them through. The control waits in one
    try: a reader that arrives meanwhile waits past its own 3 s lock timeout."""
    monkeypatch.setattr(pgdrain_migrate, "TRY_LOCK_MS", try_lock_ms)
    conn.execute(UNDO_0033)
    outcome: list[object] = []
    with psycopg.connect(db_url) as report:
        report.execute("SELECT count(*) FROM pgdrain.finished_jobs")  # held open

        def run() -> None:
            with psycopg.connect(db_url, autocommit=True) as operator:
                outcome.append(migrate(operator, lock_timeout_s=120))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        wait_for(lambda: someone_here_waits_on_a_lock(conn), what="migrate to wait for the history")
        with psycopg.connect(db_url, autocommit=True) as reader:
            reader.execute("SET lock_timeout = '3s'")
            if try_lock_ms < 3000:
                assert reader.execute("SELECT count(*) FROM pgdrain.finished_jobs").fetchone()
            else:
                with pytest.raises(psycopg.errors.LockNotAvailable):
                    reader.execute("SELECT count(*) FROM pgdrain.finished_jobs")
        report.rollback()
        thread.join(60)
    [result] = outcome
    assert isinstance(result, MigrateResult) and [m[:4] for m in result.applied] == ["0033"]


def test_two_concurrent_migrate_processes_build_one_schema(empty_db_url: str) -> None:
    """Both processes are held at the migration lock (taken here first), then released at the
    same moment: one applies everything, the other finds nothing pending."""
    with psycopg.connect(empty_db_url, autocommit=True) as observer:
        with psycopg.connect(empty_db_url) as gate:
            gate.execute(query("migration_lock"))  # held until gate's transaction ends
            processes = [_pgdrain(empty_db_url, "migrate") for _ in range(2)]
            try:
                wait_for(
                    lambda: (
                        _waiting_on_the_migration_lock(observer) == 2
                        or any(p.poll() is not None for p in processes)
                    ),
                    WAIT_SECONDS,
                    "both migrate processes to wait on the migration lock",
                )
                assert all(p.poll() is None for p in processes), "a migrate did not wait"
            finally:
                gate.rollback()
                outputs = [p.communicate(timeout=PROCESS_TIMEOUT_SECONDS) for p in processes]

        for process, (_out, err) in zip(processes, outputs, strict=True):
            assert process.returncode == 0, err
            assert err == ""
        messages = sorted(out.strip() for out, _ in outputs)
        assert messages == sorted(
            [
                "applied: " + ", ".join(m.name for m in migrations()),
                "nothing to apply: the schema is up to date",
            ]
        )
        assert _ledger(observer) == ALL_VERSIONS  # each recorded once
        row = observer.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgdrain'"
        ).fetchone()
        assert row == (1,)


@pytest.fixture(scope="module")
def explain_conn(module_db_url: str) -> Iterator[Conn]:
    """One migrated database for every EXPLAIN below: they only read the catalog."""
    with psycopg.connect(module_db_url, autocommit=True) as conn:
        yield conn


def _placeholders(statement: str) -> list[str]:
    return sorted(set(PLACEHOLDER.findall(statement)))


# BEGIN, COMMIT and ROLLBACK have no plan to EXPLAIN: test_round_trips.py runs them; nor has
# LISTEN: the worker's tests run it (tests/integration/test_worker.py).
NO_PLAN = ("transaction_begin", "transaction_commit", "transaction_rollback", "kick_listen")


@pytest.mark.parametrize("name", [n for n in query_names() if n not in NO_PLAN])
def test_every_named_statement_fits_the_migrated_schema(explain_conn: Conn, name: str) -> None:
    """EXPLAIN parses, resolves every table, column, function and type, and plans the
    statement, without running it. Parameters go to the server unbound (NULL, untyped), so
    each one's type must follow from the statement and the schema."""
    statement = query(name)
    params = dict.fromkeys(_placeholders(statement))
    with explain_conn.transaction(force_rollback=True):
        explain_conn.execute("EXPLAIN " + statement, params)


def test_control_a_statement_against_a_missing_column_is_caught(explain_conn: Conn) -> None:
    """The check above would catch a statement that names a column the migrations dropped."""
    statement = query("job_fail").replace("last_error = ", "last_error_text = ", 1)
    with (
        explain_conn.transaction(force_rollback=True),
        pytest.raises(psycopg.errors.UndefinedColumn),
    ):
        explain_conn.execute("EXPLAIN " + statement, dict.fromkeys(_placeholders(statement)))


def test_migration_files_are_numbered_and_distinct() -> None:
    names = [m.name for m in migrations()]
    assert all(re.fullmatch(r"\d{4}_[a-z0-9_]+\.sql", n) for n in names), names
    # Numbers are handed out to parallel branches (0007 before 0004-0006 are merged): distinct
    # and increasing here; once every branch is merged they are 0001.. without a gap again.
    assert ALL_VERSIONS == sorted(set(ALL_VERSIONS)) and ALL_VERSIONS[0] == "0001"
