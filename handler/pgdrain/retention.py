"""Retention without a cron: delete finished jobs past their age, in bounded batches.

The scheduled run calls run_once() (pgdrain.aws.run, trigger "schedule"), so the table stays
bounded with no extra AWS resource. Done jobs are kept `retain_done_days`, failed and cancelled
ones `retain_failed_days` (longer: someone may still want to read why they failed). Parked jobs
are never deleted: they wait for a person. Each batch is one short DELETE in its own
transaction, so a run killed mid-way loses nothing but the batch in flight, and the next
scheduled run carries on. Safe to run twice: a deleted row matches nothing.

Each batch's transaction first sets statement_timeout and lock_timeout to the budget left less
the final margin, local to it (set_config(..., true), as the drain's Session does): a DELETE
blocked on a table lock (a migration, an operator's transaction) is cancelled there, and the
run returns with what it deleted so far (`stopped` says why) instead of waiting past its
deadline."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from pgdrain import session, store
from pgdrain.budget import Budget
from pgdrain.summary import one_line

log = logging.getLogger(__name__)

DEFAULT_RETAIN_DONE_DAYS = 7.0
DEFAULT_RETAIN_FAILED_DAYS = 30.0
DEFAULT_BATCH = 1000
# Stop starting batches when less than this is left of the run's budget: a batch is one
# indexed DELETE of at most DEFAULT_BATCH rows, well under a second.
MIN_REMAINING_SECONDS = 2.0


@dataclass(frozen=True)
class RetentionResult:
    done: int  # done jobs deleted
    failed: int  # failed and cancelled jobs deleted
    complete: bool  # False: stopped for time with more to delete (the next run continues)
    # Set when a batch was cancelled at its statement or lock limit (e.g. the table was locked):
    # why the run stopped. None when every batch it started finished.
    stopped: str | None = None

    def as_dict(self) -> dict[str, int | bool]:
        """The run summary's `retention` (docs/operations.md); `stopped` is in its log line."""
        return {"done": self.done, "failed": self.failed, "complete": self.complete}


def run_once(
    conn: store.Connection,
    *,
    retain_done_days: float,
    retain_failed_days: float,
    budget: Budget,
    batch: int = DEFAULT_BATCH,
    min_remaining: float = MIN_REMAINING_SECONDS,
    limit_to_budget: bool = True,
) -> RetentionResult:
    """Delete finished jobs older than their retention, batch by batch, while the budget
    leaves at least `min_remaining` seconds. `conn` is in autocommit mode. A batch cancelled at
    its limit ends the run (`stopped`). `limit_to_budget=False` (a test's control) runs the
    batches with the server's limits: a lock wait may then outlast the budget."""
    done = _delete(conn, ("done",), retain_done_days, budget, batch, min_remaining, limit_to_budget)
    if done.stopped is not None:
        return RetentionResult(done.deleted, 0, False, done.stopped)
    failed = _delete(
        conn,
        ("failed", "cancelled"),
        retain_failed_days,
        budget,
        batch,
        min_remaining,
        limit_to_budget,
    )
    return RetentionResult(
        done.deleted, failed.deleted, done.complete and failed.complete, failed.stopped
    )


@dataclass(frozen=True)
class _Pass:
    deleted: int
    complete: bool
    stopped: str | None = None


def _delete(
    conn: store.Connection,
    statuses: Sequence[store.FinishedStatus],
    days: float,
    budget: Budget,
    batch: int,
    min_remaining: float,
    limit_to_budget: bool,
) -> _Pass:
    total = 0
    while (remaining := budget.remaining()) >= min_remaining:
        limit_ms = session.statement_limit_ms(remaining)
        try:
            # One round trip: BEGIN, the limits, the batch's DELETE and COMMIT together.
            deleted = session.run_one_statement(
                conn,
                limit_ms if limit_to_budget else None,
                lambda c: store.job_purge_finished(c, days, batch, statuses=statuses),
            )
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
            stopped = f"a batch was cancelled at its limit of {limit_ms} ms: {one_line(exc)}"
            log.warning(
                "retention stopped; the next scheduled run carries on",
                extra={"reason": stopped, "deleted": total},
            )
            return _Pass(total, False, stopped)
        total += deleted
        if deleted < batch:
            return _Pass(total, True)
    return _Pass(total, False)
