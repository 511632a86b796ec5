"""Claiming and completing: the round trips that move a run's attempts between states.

The hot path is one statement per batch: the jobs finished since the last round trip are
marked done and the next batch is claimed together (one commit for many jobs). A finished job
waits at most COMPLETION_FLUSH_SECONDS for a claim to carry it; after that it is written alone.
Failures are written at once, with the retry backoff."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from pgdrain.api import outcomes, retry
from pgdrain.db import store
from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import Attempts, RunState
from pgdrain.runner.claim_statement import Claim, ClaimStatements
from pgdrain.runner.pipelining import SentAhead
from pgdrain.runner.prefetch import ClaimAhead
from pgdrain.runner.reclaim import Reclaim
from pgdrain.runner.worker_threads import Outcome
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

# A finished job is recorded as done with the next claim, or at the latest after this long:
# one commit for many jobs, without holding results back from the database.
COMPLETION_FLUSH_SECONDS = 0.1


class Claims:
    def __init__(
        self,
        run: RunState,
        *,
        queues: tuple[str, ...],
        lease_seconds: float,
        reclaim_limit: int,
        recover_lost_replies: bool = True,
        ahead: ClaimAhead | None = None,
        send_ahead: bool = False,
        count_on_the_wire: bool = True,
    ) -> None:
        # Fed with each claim's round trip here, and each job's run time by the drain.
        self.ahead = ahead or ClaimAhead(1, 1, enabled=False)
        self._session = run.session
        self._recover_lost_replies = recover_lost_replies
        self._attempts = run.attempts
        self._deadline = run.deadline
        self._counters = run.counters
        self._worker_id = run.worker_id
        self.reclaim = Reclaim(run.session, run.counters, reclaim_limit)
        self._statements = ClaimStatements(
            run.attempts,
            run.deadline,
            queues=queues,
            worker_id=run.worker_id,
            lease_seconds=lease_seconds,
            recover_lost_replies=recover_lost_replies,
        )
        self.sent_ahead = SentAhead(
            self,
            self._statements,
            run.session,
            run.deadline,
            enabled=send_ahead,
            count_slots=count_on_the_wire,
        )

    def complete_and_claim(self, limit: int, while_sent: Callable[[], None] | None = None) -> int:
        """One round trip: record the finished jobs, claim up to `limit` more. Returns how
        many it claimed. `while_sent` runs while the statement is on the wire."""
        self.sent_ahead.settle()
        claimed_now = self.sent_ahead.claim_now(limit, while_sent)
        if claimed_now is not None:
            return claimed_now  # read as a claim sent ahead is, with the same recovery
        claim = self._statements.new(limit)
        made = self._session.run_recovering(
            self._statements.operation(claim), self._statements.again(claim), while_sent=while_sent
        )
        claimed = self.received(claim, *made)
        if claimed and self._deadline.below_reserve():
            # The claim itself took the time that was left (a slow or resuming database):
            # give the jobs back unstarted rather than start what cannot finish.
            self.release_unstarted()
        return claimed

    def received(self, claim: Claim, result: store.Fenced, claimed: list[ClaimedJob]) -> int:
        """Record a claim's reply: its completions, and the jobs it took as unstarted. Returns
        how many it took."""
        self.ahead.claim_took(time.monotonic() - claim.sent_at)
        self.reclaim.report()
        if claimed:
            self._attempts.leases_claimed(claim.sent_at)
        self._record_completions(result)
        self._attempts.unstarted.extend(claimed)
        self._counters.add("claimed", len(claimed))
        return len(claimed)

    def completion_due(self) -> bool:
        return bool(self._attempts.finished) and (
            time.monotonic() >= self._attempts.first_finished_at + COMPLETION_FLUSH_SECONDS
        )

    def flush_completions(self) -> None:
        self.sent_ahead.settle()  # their replies come before this statement's
        held = [a.held for a in self._attempts.take_finished()]
        if not held:
            return

        @store.one_statement
        def complete(conn: store.Connection) -> store.Fenced:
            return store.job_complete_many(conn, held)

        def complete_again(conn: store.Connection) -> store.Fenced:
            # Safe after a lost reply: the attempts already recorded done are found by
            # completed_token; only the others are completed now (fenced, as ever).
            done, _ = store.job_claim_recover(conn, None, held)
            rest = store.job_complete_many(
                conn, [h for h in held if h not in done.applied_attempts]
            )
            return store.Fenced(done.applied_attempts | rest.applied_attempts, rest.lost_attempts)

        self._record_completions(
            self._session.run_recovering(
                complete, complete_again if self._recover_lost_replies else complete
            )
        )

    def release_unstarted(self) -> None:
        """Give back what has not started, those waiting in the pool for a thread included."""
        self.sent_ahead.settle()  # the claims on the wire first: their jobs are unstarted too
        held = [a.held for a in self._attempts.take_unstarted()]
        if not held:
            return
        result = self._session.run(store.job_release_many, held)
        self._counters.add("released", len(result.applied_attempts))
        for gone in result.lost_attempts:
            self._lease_lost(gone, "while releasing it")

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
            self._lease_lost(claimed.held, "its failure was not recorded")
            return
        final = outcome.status != "queued"  # failed, or cancelled by the job itself
        # A snooze counts as retried: the job is queued again (its attempt given back). A
        # job's own Cancel counts as failed (the summary has no counter of its own for it).
        self._counters.add("failed" if final else "retried", 1)
        _log_failure(claimed, decision, final)

    def _record_completions(self, result: store.Fenced) -> None:
        self._counters.add("done", len(result.applied_attempts))
        for held in result.lost_attempts:
            self._lease_lost(held, "its result was not recorded")

    def _lease_lost(self, held: store.Held, how: str) -> None:
        self._counters.lease_lost(held, how, self._worker_id)


def wanted(
    claims: Claims, attempts: Attempts, settings: Settings, *, sending_ahead: bool = False
) -> int:
    """How many jobs to claim now: for the free slots, and for those about to free. The claims
    on the wire hold the slots of all they may bring. A claim sent ahead (`sending_ahead`) may
    take one batch more, only while a whole batch frees during a round trip (claim_ahead.py):
    it is read one round trip later than a claim made now would be, and its jobs start as the
    next claim goes out, when the slots of the batch before them have freed."""
    allowance = claims.ahead.allowance(attempts.running_since.values(), time.monotonic())
    if sending_ahead:
        if allowance < claims.ahead.most or not claims.ahead.most:
            return 0
        allowance += settings.batch_size
    return attempts.to_claim(
        settings.concurrency, settings.batch_size, allowance, claims.sent_ahead.held()
    )


def claim_and_start(
    claims: Claims,
    attempts: Attempts,
    submit: Callable[[ClaimedJob], None],
    settings: Settings,
    *,
    start_now: bool = True,
) -> tuple[bool, bool]:
    """Claim what is wanted and, while that claim is on the wire, hand everything claimed ahead
    to the pool, whose threads start each as one frees (this thread, waiting for the reply,
    could not); then start what came, as far as slots are free (`start_now=False`: the caller
    starts them, with Attempts.start_free). Returns (claimed, full): whether a claim was read,
    and whether it took all it asked for (a short one means the queue is drained for now: the
    next claim waits for an outcome, so an empty queue is not polled).

    The jobs start after the claim has gone out, not before: started first, their threads
    took the interpreter from this one while it built and sent the claim, and the claim went
    out only once they had run (Python and the database took turns instead of overlapping).

    While claims come back full and more are wanted, the next claim goes out before the reply
    to the last is read (sent_ahead.py, pipeline.py): one claim is on the wire between two
    turns of the loop, two while a reply is read, and the database runs the one while this
    thread reads the other and starts its jobs."""

    def start() -> None:
        attempts.start_free(submit, settings.concurrency)

    def start_all() -> None:
        attempts.start_all(submit)

    n = wanted(claims, attempts, settings)  # unstarted attempts hold their slots already
    while_sent = start_all if attempts.unstarted else None  # None: nothing to hand over
    sent_ahead = claims.sent_ahead
    if sent_ahead.count():
        limit = sent_ahead.oldest_limit()
        if sent_ahead.last_full and sent_ahead.may_send():
            ahead = wanted(claims, attempts, settings, sending_ahead=True)
            if ahead > 0:
                sent_ahead.send(ahead)
        if sent_ahead.count():  # unless the connection broke and every claim was taken up
            sent_ahead.last_full = sent_ahead.read(while_sent) == limit
        made = True
    else:
        sent_ahead.last_full = n > 0 and claims.complete_and_claim(n, while_sent=while_sent) == n
        made = n > 0
    if start_now:
        start()
    if sent_ahead.last_full and not sent_ahead.count() and sent_ahead.may_send():
        ahead = wanted(claims, attempts, settings, sending_ahead=True)
        if ahead > 0:
            sent_ahead.send(ahead)  # read at the next turn, behind the claim sent then
    return made, sent_ahead.last_full


def record_outcomes(
    claims: Claims, attempts: Attempts, outcomes: Iterable[Outcome[ClaimedJob]]
) -> None:
    """Take the jobs' outcomes (WorkerPool.take). Successes wait for the next round trip (at
    most COMPLETION_FLUSH_SECONDS); failures are recorded at once."""
    for outcome in outcomes:
        claims.ahead.job_ran(outcome.seconds)
        if outcome.error is None:
            attempts.finish(outcome.item)
        else:
            attempts.stop_running(outcome.item)
            claims.record_failure(outcome.item, outcome.error)


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
