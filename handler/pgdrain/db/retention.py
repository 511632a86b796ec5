"""Retention without a cron: drop the history past its age, and keep the partitions ahead.

A scheduled run calls run_once() (pgdrain.aws.run; so does a run that moves the safety net,
once per ScheduleRate per execution environment), so the history stays bounded with no extra
AWS resource. Done jobs are kept `retain_done_days`, failed and cancelled ones
`retain_failed_days` (longer: someone may still want to read why they failed). Parked jobs
are never deleted: they wait for a person. Done jobs live in one partition a day
(pgdrain.finished_jobs, migration 0018): a day past its age goes whole (DETACH and DROP), with
no row deleted; the same step makes the partitions of today and the next two days. Failed and
cancelled jobs (rare), done jobs of a day whose partition was missing (the default partition),
and the finished rows migration 0018 left in active_jobs go by rows, in batches. The rows that
migration left and that are still within their age move to finished_jobs, in batches too.
Each batch is one short statement in its own transaction, so a run killed mid-way loses nothing
but the batch in flight, and the next scheduled run carries on. Safe to run twice, and beside
another run: a deleted row matches nothing, and the partitions' functions serialise on a lock.

Each batch's transaction first sets statement_timeout and lock_timeout to the budget left less
the final margin, local to it (set_config(..., true), as the drain's Session does): a DELETE
blocked on a table lock (a migration, an operator's transaction) is cancelled there, and the
run returns with what it deleted so far (`stopped` says why) instead of waiting past its
deadline.

The same batches bound the run history (pgdrain.run_history, one line per run that exited):
lines older than `retain_done_days` go with the done jobs, a run kept as long as its jobs; with
done jobs not kept (0 days), lines older than `retain_failed_days`: they are then the only count
of done jobs."""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, NamedTuple, Protocol

import psycopg

from pgdrain.budget import Budget
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import connection, migrate, session, store
from pgdrain.db.connection import one_line
from pgdrain.errors import PgdrainError
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_RETAIN_DONE_DAYS = 7.0
DEFAULT_RETAIN_FAILED_DAYS = 30.0
DEFAULT_BATCH = 1000
# Rows that migration 0018 left in active_jobs, moved per statement.
MOVE_BATCH = 10_000
# The longest a run (the function's scheduled one, a worker's) spends on retention: what it
# leaves goes with the next.
MAX_SECONDS = 5.0
# Stop starting batches when less than this is left of the run's budget: a batch is one
# indexed DELETE of at most DEFAULT_BATCH rows, well under a second.
MIN_REMAINING_SECONDS = 2.0
# The longest the partition step waits for its locks: dropping a partition takes ACCESS
# EXCLUSIVE on the done jobs' table for an instant, and while it waits for a reader (a long
# dashboard query), completions queue behind it. Past this it gives up; the next run tries again.
PARTITION_LOCK_MS = migrate.PARTITION_LOCK_MS


class RetentionResult(NamedTuple):
    done: int  # done jobs deleted by rows (a dropped partition's are not counted)
    failed: int  # failed and cancelled jobs deleted
    complete: bool  # False: stopped for time with more to delete (the next run continues)
    # Set when a batch was cancelled at its statement or lock limit (e.g. the table was locked):
    # why the run stopped. None when every batch it started finished.
    stopped: str | None = None
    runs: int = 0  # run history lines deleted
    partitions_dropped: int = 0  # day partitions of done jobs dropped
    moved: int = 0  # finished rows moved out of active_jobs (left there by migration 0018)

    def as_dict(self) -> dict[str, int | bool]:
        """The run summary's `retention` (docs/operations.md); `stopped` is in its log line."""
        return {
            "done": self.done,
            "failed": self.failed,
            "runs": self.runs,
            "complete": self.complete,
            "partitions_dropped": self.partitions_dropped,
        }


def first_batch(
    retain_done_days: float, retain_failed_days: float
) -> store.Statement[store.RetentionBatch]:
    """The first batch alone, for a run to send with its exit (pgdrain.aws.control): on a
    quiet table it is all there is to delete."""
    return store.job_retention_batch_statement(
        retain_done_days, retain_failed_days, DEFAULT_BATCH, DEFAULT_BATCH, DEFAULT_BATCH
    )


def after_first_batch(
    done: int, failed: int, runs: int = 0, due: bool = False, batch: int = DEFAULT_BATCH
) -> RetentionResult:
    """What the first batch did: `complete` unless a kind came back full (more to delete) or
    partition housekeeping is due: run_once carries on."""
    return RetentionResult(done, failed, max(done, failed, runs) < batch and not due, runs=runs)


def run_once(
    conn: store.Connection,
    *,
    retain_done_days: float,
    retain_failed_days: float,
    budget: Budget,
    batch: int = DEFAULT_BATCH,
    min_remaining: float = MIN_REMAINING_SECONDS,
    controls: Controls = ALL_ON,
) -> RetentionResult:
    """Delete finished jobs older than their retention, batch by batch, while the budget
    leaves at least `min_remaining` seconds. `conn` is in autocommit mode. A batch cancelled at
    its limit ends the run (`stopped`). With limit_statements_to_budget off (a control), the
    batches run with the server's limits: a lock wait may then outlast the budget."""
    done = failed = runs = 0
    # A batch that came back full may have left more.
    more_done = more_failed = more_runs = True
    while more_done or more_failed or more_runs:
        remaining = budget.remaining()
        if remaining < min_remaining:
            return RetentionResult(done, failed, False, runs=runs)
        limit_ms = session.statement_limit_ms(remaining)
        batch_of = functools.partial(
            store.job_retention_batch,
            done_days=retain_done_days,
            failed_days=retain_failed_days,
            done_limit=batch if more_done else 0,
            failed_limit=batch if more_failed else 0,
            runs_limit=batch if more_runs else 0,
        )
        try:
            # One round trip: BEGIN, the limits, the batch's DELETEs and COMMIT together.
            deleted = session.run_one_statement(
                conn, limit_ms if controls.limit_statements_to_budget else None, batch_of
            )
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
            return _stopped(exc, limit_ms, RetentionResult(done, failed, False, runs=runs))
        done += deleted.done
        failed += deleted.failed
        runs += deleted.runs
        more_done = more_done and deleted.done >= batch
        more_failed = more_failed and deleted.failed >= batch
        more_runs = more_runs and deleted.runs >= batch
    result = RetentionResult(done, failed, False, runs=runs)
    # The partitions: made ahead, dropped past their age (a catalog change each).
    remaining = budget.remaining()
    if remaining < min_remaining:
        return result
    # Lock waits limited to PARTITION_LOCK_MS, the statement to what the budget leaves.
    limit_ms = session.statement_limit_ms(remaining)
    lock_ms = min(limit_ms, PARTITION_LOCK_MS)
    try:
        with conn.transaction():
            if controls.limit_statements_to_budget:
                store.finished_jobs_partition_limits(conn, lock_ms, limit_ms)
            _, dropped = store.finished_jobs_partition_keep(conn, retain_done_days)
    except psycopg.errors.LockNotAvailable as exc:
        return _stopped(exc, lock_ms, result)
    except psycopg.errors.QueryCanceled as exc:
        return _stopped(exc, limit_ms, result)
    result = result._replace(partitions_dropped=dropped)
    # What migration 0018 left in active_jobs, batch by batch, until none is left.
    moved = MOVE_BATCH
    while moved >= MOVE_BATCH:
        remaining = budget.remaining()
        if remaining < min_remaining:
            return result
        limit_ms = session.statement_limit_ms(remaining)
        move = functools.partial(store.job_history_move, limit=MOVE_BATCH)
        try:
            moved = session.run_one_statement(
                conn, limit_ms if controls.limit_statements_to_budget else None, move
            )
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
            return _stopped(exc, limit_ms, result)
        result = result._replace(moved=result.moved + moved)
    return result._replace(complete=True)


class Logger(Protocol):
    """What retention logs to: the standard library's logger or Powertools' (the function's)."""

    def info(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...


def run_on_a_connection_of_its_own(
    conninfo: str, settings: Settings, budget: Budget, logger: Logger = log
) -> RetentionResult | None:
    """run_once with the settings' ages (PGDRAIN_RETAIN_DONE, _FAILED), on a short connection
    of its own, within `budget`: the function's scheduled runs and a worker run it so. A failure
    (the database down, a setting that cannot work) is logged and gives None: the next run
    tries again."""
    quick = dataclasses.replace(
        settings, connect_timeout=max(0.5, min(settings.connect_timeout, budget.remaining()))
    )
    try:
        with connection.connect(conninfo, quick, budget) as conn:
            return run_once(
                conn,
                retain_done_days=settings.retain_done_days,
                retain_failed_days=settings.retain_failed_days,
                budget=budget,
            )
    except (PgdrainError, psycopg.Error) as exc:
        logger.warning("retention skipped: %s", one_line(exc))
        return None


def log_result(logger: Logger, settings: Settings, deleted: RetentionResult) -> None:
    logger.info(
        "retention deleted finished jobs",
        extra={
            "deleted_done": deleted.done,
            "deleted_failed": deleted.failed,
            "deleted_runs": deleted.runs,
            "partitions_dropped": deleted.partitions_dropped,
            "retention_complete": deleted.complete,
            "retain_done_days": settings.retain_done_days,
            "retain_failed_days": settings.retain_failed_days,
        },
    )


def purge_whole_days(
    conn: store.Connection, older_than_days: float, *, controls: Controls = ALL_ON
) -> int:
    """`pgdrain purge`'s first step, for every queue: the done jobs of each day that ended more
    than `older_than_days` ago go with their day's partition, not row by row; the rest is the
    caller's, by rows. Returns how many jobs went. Its lock waits are limited to
    PARTITION_LOCK_MS, as retention's partition step: past that nothing is dropped, and the
    caller deletes those jobs by rows (slower, but completions never queue behind the drop); so
    it does for a role without the right to drop partitions.
    With limit_statements_to_budget off (a test's control), it waits as long as a lock is held."""
    lock_timeout_ms = PARTITION_LOCK_MS if controls.limit_statements_to_budget else 0  # 0: none
    try:
        # One transaction, under the lock the partition functions take: no retention drops a
        # day between the count and the drop, so the count is what went.
        with conn.transaction():
            store.finished_jobs_days_lock(conn, lock_timeout_ms)
            jobs = store.finished_jobs_days_count(conn, older_than_days)
            store.finished_jobs_days_drop(conn, older_than_days)
        return jobs
    except (psycopg.errors.LockNotAvailable, psycopg.errors.InsufficientPrivilege) as exc:
        # A lock held past the limit, or a role that may delete rows but not drop partitions.
        log.warning("purge: whole days not dropped; their jobs go by rows: %s", one_line(exc))
        return 0


def _stopped(exc: psycopg.Error, limit_ms: int, result: RetentionResult) -> RetentionResult:
    stopped = f"a batch was cancelled at its limit of {limit_ms} ms: {one_line(exc)}"
    log.warning(
        "retention stopped; the next scheduled run carries on",
        extra={"reason": stopped, "deleted": result.done + result.failed},
    )
    return result._replace(complete=False, stopped=stopped)
