"""Apply pending schema migrations, in order, each recorded in pgdrain.migrations.

Two processes running this at the same moment serialise on a transaction-scoped advisory lock
(safe through a transaction pooler); the second finds nothing pending. Any session may take an
advisory lock (the least-privileged worker role too), and a migration's DDL waits for the
sessions that hold its tables (a long report, a pg_dump). While it waits for a table, every
enqueue and claim that needs the table queues behind it, so one try of the pending migrations
(one transaction) waits at most TRY_LOCK_MS for any lock, then rolls back, lets them through,
and tries again, until `lock_timeout_s` has passed: then one line names who holds the
migration lock, instead of a migrate that hangs or holds the queue up for the whole wait."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from pgdrain.db import store
from pgdrain.db.sql import migrations
from pgdrain.errors import PgdrainError

log = logging.getLogger(__name__)

DEFAULT_LOCK_TIMEOUT_SECONDS = 30.0
# The longest one try waits for a lock: how long a live queue may be held up by one try.
TRY_LOCK_MS = 2000
# The pause after the n-th try that met a lock (n times this, at most TRY_PAUSE_MAX_S): the
# queue's writers held up meanwhile go through.
TRY_PAUSE_S = 0.5
TRY_PAUSE_MAX_S = 5.0
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
    """Apply what is pending, in one transaction, tried again while a lock is in its way.
    lock_timeout_s=None waits for locks as long as it takes (the server's default): only tests
    use it, to show the hang the timeout prevents."""
    deadline = None if lock_timeout_s is None else time.monotonic() + lock_timeout_s
    tries = 0
    while True:
        tries += 1
        try:
            pending_names, done = _apply_pending(conn, _try_lock_ms(deadline))
            break
        except psycopg.errors.LockNotAvailable:
            # The try is rolled back whole: nothing applied, no lock held. Safe to try again.
            left = 0.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise _locked(conn, lock_timeout_s, tries) from None
            pause = min(left, TRY_PAUSE_S * tries, TRY_PAUSE_MAX_S)
            log.info(
                "migrate met a lock another session holds; it let the queue through and tries "
                "again in %.1f s",
                pause,
            )
            time.sleep(pause)
    moved = after_migrations(conn, lock_timeout_s)
    return MigrateResult(applied=tuple(pending_names), already=tuple(sorted(done)), moved=moved)


def _try_lock_ms(deadline: float | None) -> int | None:
    """What one try may wait for a lock: TRY_LOCK_MS, or what is left before the deadline."""
    if deadline is None:
        return None
    left_ms = int((deadline - time.monotonic()) * 1000)
    return max(1, min(TRY_LOCK_MS, left_ms))  # 0 would mean "no timeout" to PostgreSQL


def _apply_pending(
    conn: psycopg.Connection[Any], lock_ms: int | None
) -> tuple[list[str], set[str]]:
    """One try: every pending migration, and its ledger row, in one transaction."""
    pending_names: list[str] = []
    with conn.transaction():
        if lock_ms is not None:
            store.lock_timeout(conn, lock_ms)
        store.migration_lock(conn)
        done = store.migration_applied(conn)
        for migration in migrations():
            if migration.version not in done:
                store.migration_record(conn, migration)
                pending_names.append(migration.name)
    return pending_names, done


def _locked(
    conn: psycopg.Connection[Any], lock_timeout_s: float | None, tries: int
) -> PgdrainError:
    """The one line that says migrate gave up, and who is in its way."""
    holders = store.migration_lock_holders(conn)
    who = ", ".join(f"pid {h.pid} (role {h.role!r}, {h.application!r})" for h in holders)
    return MigrationLocked(
        f"migrate gave up waiting for a lock (lock_timeout {lock_timeout_s} s, {tries} "
        f"{'try' if tries == 1 else 'tries'}) and applied nothing: "
        + (
            f"the migration lock is held by {who}"
            if holders
            else "a session holds a table the migration changes (a long read, a pg_dump)"
        )
    )


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
                store.lock_timeout(conn, limit_ms)
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
