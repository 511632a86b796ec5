"""Apply pending schema migrations, in order, each recorded in pgdrain.migrations.

Two processes running this at the same moment serialise on a transaction-scoped advisory lock
(safe through a transaction pooler); the second finds nothing pending. Any session may take an
advisory lock (the least-privileged worker role too), and a migration's DDL waits for the
sessions that hold its tables, so every lock is waited for at most `lock_timeout_s`: then one
line names who holds the migration lock, instead of a migrate that hangs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from pgdrain.db import store
from pgdrain.db.sql import migrations
from pgdrain.errors import PgdrainError

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_SECONDS = 30.0
# The longest the day partitions' step waits for its lock (as retention's: db/retention.py).
PARTITION_LOCK_MS = 2000


class MigrationLocked(PgdrainError):
    """Another session holds a lock the migration needs; nothing was applied. (Exit code 1.)"""


# Finished rows moved per transaction after the migrations (migration 0018 leaves them in
# active_jobs rather than hold its locks while it copies them).
MOVE_BATCH = 10_000


@dataclass(frozen=True)
class MigrateResult:
    applied: tuple[str, ...]
    already: tuple[str, ...]
    moved: int = 0  # finished rows moved from active_jobs to finished_jobs, batch by batch


def migrate(
    conn: psycopg.Connection[Any], *, lock_timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_SECONDS
) -> MigrateResult:
    """Apply what is pending. lock_timeout_s=None waits for locks as long as it takes (the
    server's default): only tests use it, to show the hang the timeout prevents."""
    pending_names: list[str] = []
    try:
        with conn.transaction():
            if lock_timeout_s is not None:  # 0 would mean "no timeout" to PostgreSQL: 1 ms
                store.migration_lock_timeout(conn, max(1, int(lock_timeout_s * 1000)))
            store.migration_lock(conn)
            done = store.migration_applied(conn)
            for migration in migrations():
                if migration.version not in done:
                    store.migration_record(conn, migration)
                    pending_names.append(migration.name)
    except psycopg.errors.LockNotAvailable:
        # The transaction is rolled back: nothing was applied. Say who is in the way.
        holders = store.migration_lock_holders(conn)
        who = ", ".join(f"pid {h.pid} (role {h.role!r}, {h.application!r})" for h in holders)
        raise MigrationLocked(
            f"migrate gave up waiting for a lock (lock_timeout {lock_timeout_s} s) and "
            "applied nothing: "
            + (
                f"the migration lock is held by {who}"
                if holders
                else "a session holds a table the migration changes"
            )
        ) from None
    moved = after_migrations(conn, lock_timeout_s)
    return MigrateResult(applied=tuple(pending_names), already=tuple(sorted(done)), moved=moved)


def after_migrations(conn: psycopg.Connection[Any], lock_timeout_s: float | None) -> int:
    """Each its own short transaction, once the migrations have committed: the day partitions
    of done jobs ahead (today and the next two days), then the finished rows migration 0018
    left in active_jobs, moved to finished_jobs batch by batch (row locks only: a live queue
    goes on). Safe to run twice and beside a run's retention, which does the same."""
    try:
        with conn.transaction():
            if lock_timeout_s is not None:
                # As retention's: attaching a day takes ACCESS EXCLUSIVE on the default
                # partition, and while it waits for a reader (a long report, a pg_dump) every
                # read of the history queues behind it. Not made now, the next run makes them.
                limit_ms = min(max(1, int(lock_timeout_s * 1000)), PARTITION_LOCK_MS)
                store.migration_lock_timeout(conn, limit_ms)
            store.finished_jobs_partition_keep(conn, done_days=None)
    except psycopg.errors.LockNotAvailable:
        log.warning(
            "the day partitions of done jobs were not made: a session holds the history's "
            "default partition (a long read, a pg_dump); a run's retention or the next migrate "
            "makes them, and done jobs go to the default partition meanwhile"
        )
    moved, total = MOVE_BATCH, 0
    while moved >= MOVE_BATCH:
        with conn.transaction():
            moved = store.job_history_move(conn, MOVE_BATCH)
        total += moved
    return total
