"""Retention without a cron: delete finished jobs past their age, in bounded batches.

A scheduled run calls run_once() (pgdrain.aws.run; so does a run that moves the safety net,
once per ScheduleRate per execution environment), so the table stays bounded with no extra AWS
resource. Done jobs are kept `retain_done_days`, failed and cancelled ones
`retain_failed_days` (longer: someone may still want to read why they failed). Parked jobs
are never deleted: they wait for a person. Each batch is one short statement (a DELETE of
each kind) in its own transaction, so a run killed mid-way loses nothing but the batch in
flight, and the next scheduled run carries on. Safe to run twice: a deleted row matches nothing.

Each batch's transaction first sets statement_timeout and lock_timeout to the budget left less
the final margin, local to it (set_config(..., true), as the drain's Session does): a DELETE
blocked on a table lock (a migration, an operator's transaction) is cancelled there, and the
run returns with what it deleted so far (`stopped` says why) instead of waiting past its
deadline.

The same batches bound the run history (pgdrain.run_history, one line per run that exited):
lines older than `retain_done_days` go with the done jobs, a run kept as long as its jobs."""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple

import psycopg

from pgdrain.budget import Budget
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import session, store
from pgdrain.db.connection import one_line

log = logging.getLogger(__name__)

DEFAULT_RETAIN_DONE_DAYS = 7.0
DEFAULT_RETAIN_FAILED_DAYS = 30.0
DEFAULT_BATCH = 1000
# Stop starting batches when less than this is left of the run's budget: a batch is one
# indexed DELETE of at most DEFAULT_BATCH rows, well under a second.
MIN_REMAINING_SECONDS = 2.0


class RetentionResult(NamedTuple):
    done: int  # done jobs deleted
    failed: int  # failed and cancelled jobs deleted
    complete: bool  # False: stopped for time with more to delete (the next run continues)
    # Set when a batch was cancelled at its statement or lock limit (e.g. the table was locked):
    # why the run stopped. None when every batch it started finished.
    stopped: str | None = None
    runs: int = 0  # run history lines deleted

    def as_dict(self) -> dict[str, int | bool]:
        """The run summary's `retention` (docs/operations.md); `stopped` is in its log line."""
        return {
            "done": self.done,
            "failed": self.failed,
            "runs": self.runs,
            "complete": self.complete,
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
    done: int, failed: int, runs: int = 0, batch: int = DEFAULT_BATCH
) -> RetentionResult:
    """What the first batch did: `complete` unless a kind came back full (more to delete:
    run_once carries on)."""
    return RetentionResult(done, failed, max(done, failed, runs) < batch, runs=runs)


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
            # One round trip: BEGIN, the limits, the batch's two DELETEs and COMMIT together.
            deleted = session.run_one_statement(
                conn, limit_ms if controls.limit_statements_to_budget else None, batch_of
            )
        except (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled) as exc:
            stopped = f"a batch was cancelled at its limit of {limit_ms} ms: {one_line(exc)}"
            log.warning(
                "retention stopped; the next scheduled run carries on",
                extra={"reason": stopped, "deleted": done + failed},
            )
            return RetentionResult(done, failed, False, stopped, runs=runs)
        done += deleted.done
        failed += deleted.failed
        runs += deleted.runs
        more_done = more_done and deleted.done >= batch
        more_failed = more_failed and deleted.failed >= batch
        more_runs = more_runs and deleted.runs >= batch
    return RetentionResult(done, failed, True, runs=runs)
