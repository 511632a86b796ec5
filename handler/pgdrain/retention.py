"""Retention without a cron: delete finished jobs past their age, in bounded batches.

The scheduled run calls run_once() (pgdrain.aws.run, trigger "schedule"), so the table stays
bounded with no extra AWS resource. Done jobs are kept `retain_done_days`, failed and cancelled
ones `retain_failed_days` (longer: someone may still want to read why they failed). Parked jobs
are never deleted: they wait for a person. Each batch is one short DELETE in its own
transaction (autocommit), so a run killed mid-way loses nothing but the batch in flight, and
the next scheduled run carries on. Safe to run twice: a deleted row matches nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgdrain import store
from pgdrain.budget import Budget

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

    def as_dict(self) -> dict[str, int | bool]:
        return {"done": self.done, "failed": self.failed, "complete": self.complete}


def run_once(
    conn: store.Connection,
    *,
    retain_done_days: float,
    retain_failed_days: float,
    budget: Budget,
    batch: int = DEFAULT_BATCH,
    min_remaining: float = MIN_REMAINING_SECONDS,
) -> RetentionResult:
    """Delete finished jobs older than their retention, batch by batch, while the budget
    leaves at least `min_remaining` seconds. `conn` is in autocommit mode."""
    done, done_complete = _delete(conn, ("done",), retain_done_days, budget, batch, min_remaining)
    failed, failed_complete = _delete(
        conn, ("failed", "cancelled"), retain_failed_days, budget, batch, min_remaining
    )
    return RetentionResult(done, failed, done_complete and failed_complete)


def _delete(
    conn: store.Connection,
    statuses: Sequence[store.FinishedStatus],
    days: float,
    budget: Budget,
    batch: int,
    min_remaining: float,
) -> tuple[int, bool]:
    total = 0
    while not budget.exhausted(min_remaining):
        deleted = store.job_purge_finished(conn, days, batch, statuses=statuses)
        total += deleted
        if deleted < batch:
            return total, True
    return total, False
