"""The completer: the one place a run writes its jobs' outcomes.

A finished job is recorded done with the next claim (claiming.py: one statement completes the
last batch and claims the next, one commit for many jobs), or alone once it has waited
COMPLETION_FLUSH_SECONDS for one. A failure is written at once, with its retry backoff. Jobs
claimed and not started are given back without spending an attempt. Every write is fenced by
the attempt's token: an attempt whose lease was lost writes nothing and is counted lost."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable

from pgdrain.api import outcomes, retry
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import Attempts, RunState, leases_lost, say_lost
from pgdrain.runner.claim_statement import Result, after_a_lost_reply
from pgdrain.runner.prefetch import Prefetch
from pgdrain.runner.worker_threads import Outcome

log = logging.getLogger(__name__)

# A finished job is recorded as done with the next claim, or at the latest after this long:
# one commit for many jobs, without holding results back from the database.
COMPLETION_FLUSH_SECONDS = 0.1


class Completer:
    def __init__(self, run: RunState, *, keep_done: bool, controls: Controls = ALL_ON) -> None:
        self._run = run
        self._keep_done = keep_done  # False: a done job is deleted (Settings.keeps_done)
        self._session = run.session
        self._attempts = run.attempts
        self._counters = run.counters
        self._recover_lost_replies = controls.recover_lost_replies

    def completion_due(self) -> bool:
        return bool(self._attempts.finished) and (
            time.monotonic() >= self._attempts.first_finished_at + COMPLETION_FLUSH_SECONDS
        )

    def flush(self) -> None:
        """Write the jobs finished since the last claim as done, alone."""
        self._session.settle()  # the pipelined claims' replies come before this statement's
        held = [a.held for a in self._attempts.take_finished()]
        if not held:
            return

        @store.one_statement
        def complete(conn: store.Connection) -> Result:
            return store.job_complete_many(conn, held, keep_done=self._keep_done), []

        again = (
            after_a_lost_reply(complete, None, held, keep_done=self._keep_done)
            if self._recover_lost_replies
            else complete
        )
        self.record_completions(self._session.run_recovering(complete, again)[0])

    def release_unstarted(self, queues: Collection[str] | None = None) -> None:
        """Give back what has not started, those waiting in the pool for a thread included
        (only those of `queues`, when given: paused queues)."""
        if queues is not None and not self._attempts.holds_any_of(queues):
            return  # the common case: nothing to read first, nothing to send
        self._session.settle()  # the pipelined claims first: their jobs are unstarted too
        if queues is None:
            taken = self._attempts.take_unstarted()
        else:
            taken = self._attempts.take_unstarted_of(queues)
        held = [a.held for a in taken]
        if not held:
            return
        result = self._session.run(store.job_release_many, held)
        self._counters.add("released", len(result.applied_attempts))
        leases_lost(self._run, result.lost_attempts, "while releasing it")

    def record_failure(self, claimed: store.ClaimedJob, error: BaseException) -> None:
        """Write a failed attempt's outcome (outcomes.decide) in one fenced statement: retried,
        snoozed or failed, its error appended to the job's history. The worker thread has
        usually decided already (AttemptFailed); anything else is decided here with the
        default backoff. Every text was sanitized and bounded by outcomes, so no error text a
        job raises (NUL, a lone surrogate, a __str__ that raises) can stop the run."""
        if isinstance(error, outcomes.AttemptFailed):
            decision = error.decision
        else:
            decision = outcomes.decide(error, claimed.attempt, retry.backoff_seconds)
        outcome = self._session.run(
            store.job_fail,
            claimed.held,
            decision.message,
            decision.delay_seconds,
            decision.final,
            error_record=_error_record(decision),
            spend_attempt=decision.spend_attempt,
            cancelled=decision.cancelled,
        )
        if isinstance(outcome, store.LeaseLost):
            leases_lost(self._run, [claimed.held], "its failure was not recorded")
            return
        final = outcome.status != "queued"  # failed, or cancelled by the job itself
        # A snooze counts as retried: the job is queued again (its attempt given back).
        if not final:
            self._counters.add("retried", 1)
        elif outcome.status == "cancelled":
            self._counters.add("cancelled", 1)
        else:
            self._counters.add("failed", 1)
        _log_failure(claimed, decision, final)

    def record_values(self, claimed: store.ClaimedJob) -> bool:
        """Write the output and progress the attempt recorded, if any, before its outcome (a
        statement only for an attempt that recorded something). False: its lease is gone."""
        recorded = self._attempts.recorded
        output = recorded.outputs.pop(claimed.held, None)
        progress = recorded.progress.pop(claimed.held, None)
        if output is None and progress is None:
            return True
        self._session.settle()  # the pipelined claims' replies come before this statement's
        result = self._session.run(store.job_record_many, [(claimed.held, output, progress)])
        if result.lost_attempts:
            leases_lost(self._run, result.lost_attempts, "its output was not recorded")
            return False
        return True

    def say_lost(self) -> None:
        """Log the lost attempts not said yet, with why (attempts.say_lost)."""
        say_lost(self._run)

    def record_completions(self, result: store.Fenced) -> None:
        self._counters.add("done", len(result.applied_attempts))
        leases_lost(self._run, result.lost_attempts, "its result was not recorded")


def record_outcomes(
    completer: Completer,
    attempts: Attempts,
    prefetch: Prefetch,
    outcomes: Iterable[Outcome[ClaimedJob]],
) -> None:
    """Take the jobs' outcomes (WorkerPool.take). Successes wait for the next round trip (at
    most COMPLETION_FLUSH_SECONDS); failures are recorded at once."""
    recorded = attempts.recorded
    for outcome in outcomes:
        prefetch.job_ran(outcome.seconds)
        if outcome.error is None:
            if (recorded.outputs or recorded.progress) and not completer.record_values(
                outcome.item
            ):
                attempts.stop_running(outcome.item)  # its lease is gone: not completed
                continue
            attempts.finish(outcome.item)
        else:
            attempts.stop_running(outcome.item)
            if recorded.progress or recorded.outputs:
                completer.record_values(outcome.item)
            completer.record_failure(outcome.item, outcome.error)


def _error_record(decision: outcomes.Decision) -> dict[str, str | None] | None:
    """The entry appended to the job's error history, or None when the outcome keeps none."""
    if not decision.record:
        return None
    return {
        # The shape `pgdrain jobs show` reads (migration 0007): it prints "type: message", so
        # the message goes without the "Type: " that last_error starts with.
        "message": decision.message.removeprefix(f"{decision.error_type}: "),
        "type": decision.error_type,
        "traceback": decision.traceback or None,
    }


def _log_failure(claimed: store.ClaimedJob, decision: outcomes.Decision, final: bool) -> None:
    """One line per outcome: WARNING for a failure, a retry or a job's own Cancel; INFO for a
    snooze, which is no error (the job waits on something, its attempt given back)."""
    if decision.cancelled:
        level, message = logging.WARNING, "job cancelled"
    elif final:
        level, message = logging.WARNING, "job failed"
    elif not decision.spend_attempt:
        level, message = logging.INFO, "job snoozed"
    else:
        level, message = logging.WARNING, "job will be retried"
    log.log(
        level,
        message,
        extra={
            "job_id": claimed.id,
            "kind": claimed.kind,
            "attempt": claimed.attempt,
            "max_attempts": claimed.max_attempts,
            "error_type": decision.error_type,
            "error": decision.message,
            "traceback": decision.traceback or None,
            "retry_in_s": None if final else round(decision.delay_seconds, 1),
        },
    )
