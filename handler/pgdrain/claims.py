"""Claiming and completing: the round trips that move a run's attempts between states.

The hot path is one statement per batch: the jobs finished since the last round trip are
marked done and the next batch is claimed together (one commit for many jobs). A finished job
waits at most COMPLETION_FLUSH_SECONDS for a claim to carry it; after that it is written alone.
Failures are written at once, with the retry backoff."""

from __future__ import annotations

import logging
import time

from pgdrain import outcomes, retry, store
from pgdrain.attempts import RunState

log = logging.getLogger(__name__)

# A finished job is recorded as done with the next claim, or at the latest after this long:
# one commit for many jobs, without holding results back from the database.
COMPLETION_FLUSH_SECONDS = 0.1


class Claims:
    def __init__(
        self, run: RunState, *, queues: tuple[str, ...], lease_seconds: float, reclaim_limit: int
    ) -> None:
        self._session = run.session
        self._attempts = run.attempts
        self._deadline = run.deadline
        self._counters = run.counters
        self._worker_id = run.worker_id
        self._queues = queues
        self._lease_seconds = lease_seconds
        self._reclaim_limit = reclaim_limit

    def reclaim_expired(self) -> None:
        """Take back jobs whose lease expired (a run that died): queued again, or failed."""
        reclaimed = self._session.run(store.job_reclaim_expired, self._reclaim_limit)
        for job in reclaimed:
            log.warning(
                "reclaimed a job whose lease expired",
                extra={"job_id": job.id, "status": job.status, "reclaims": job.reclaim_count},
            )
        self._counters.add("reclaimed", len(reclaimed))

    def complete_and_claim(self, limit: int) -> None:
        """One round trip: record the finished jobs, claim up to `limit` more."""
        finished = self._attempts.take_finished()
        result, claimed = self._session.run(
            store.job_complete_and_claim,
            [a.held for a in finished],
            self._queues,
            limit,
            self._worker_id,
            self._lease_seconds,
            self._deadline.lease_cap(),
        )
        self._record_completions(result)
        self._attempts.unstarted.extend(claimed)
        self._counters.add("claimed", len(claimed))
        if claimed and self._deadline.below_reserve():
            # The claim itself took the time that was left (a slow or resuming database):
            # give the jobs back unstarted rather than start what cannot finish.
            self.release_unstarted()

    def completion_due(self) -> bool:
        return bool(self._attempts.finished) and (
            time.monotonic() >= self._attempts.first_finished_at + COMPLETION_FLUSH_SECONDS
        )

    def flush_completions(self) -> None:
        finished = self._attempts.take_finished()
        if finished:
            held = [a.held for a in finished]
            self._record_completions(self._session.run(store.job_complete_many, held))

    def release_unstarted(self) -> None:
        held = [a.held for a in self._attempts.take_unstarted()]
        result = self._session.run(store.job_release_many, held)
        self._counters.add("released", len(result.applied))
        for job_id in result.lost:
            self._lease_lost(job_id, "while releasing it")

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
        record = (
            {
                # The shape `pgdrain jobs show` reads (migration 0007): it prints "type: message",
                # so the message goes without the "Type: " that last_error starts with.
                "message": decision.message.removeprefix(f"{decision.error_type}: "),
                "type": decision.error_type,
                "traceback": decision.traceback or None,
            }
            if decision.record
            else None
        )
        outcome = self._session.run(
            store.job_fail,
            claimed.held,
            decision.message,
            decision.delay_seconds,
            decision.final,
            error_record=record,
            spend_attempt=decision.spend_attempt,
        )
        if isinstance(outcome, store.LeaseLost):
            self._lease_lost(claimed.id, "its failure was not recorded")
            return
        final = outcome.status == "failed"
        # A snooze counts as retried: the job is queued again (its attempt given back).
        self._counters.add("failed" if final else "retried", 1)
        log.warning(
            "job failed"
            if final
            else "job snoozed"
            if not decision.spend_attempt
            else "job will be retried",
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

    def _record_completions(self, result: store.Fenced) -> None:
        self._counters.add("done", len(result.applied))
        for job_id in result.lost:
            self._lease_lost(job_id, "its result was not recorded")

    def _lease_lost(self, job_id: int, how: str) -> None:
        self._counters.lease_lost(job_id, how, self._worker_id)
