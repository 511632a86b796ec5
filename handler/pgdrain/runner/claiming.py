"""Claiming: how many jobs to claim, the claim's round trip, and what its reply means.

The hot path is one statement per batch: the jobs finished since the last round trip are
marked done and the next batch is claimed together (one commit for many jobs); the completer
(completer.py) writes every other outcome. Claims go through the pipeline (pipelining.py) and
claim for slots about to free as well as the free ones (prefetch.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import Attempts, RunState
from pgdrain.runner.claim_statement import Claim, ClaimStatements
from pgdrain.runner.completer import Completer
from pgdrain.runner.pipelining import PipelinedClaims
from pgdrain.runner.prefetch import Prefetch
from pgdrain.runner.reclaim import Reclaim
from pgdrain.settings import Settings, serves

log = logging.getLogger(__name__)


class Claims:
    def __init__(
        self,
        run: RunState,
        *,
        queues: tuple[str, ...] | None,  # None: every queue
        lease_seconds: float,
        keep_done: bool,
        reclaim_limit: int,
        prefetch: Prefetch,
        completer: Completer,
        controls: Controls = ALL_ON,
    ) -> None:
        # Fed with each claim's round trip here, and each job's run time by the drain.
        self.prefetch = prefetch
        self._completer = completer
        self._session = run.session
        self._attempts = run.attempts
        self._deadline = run.deadline
        self._counters = run.counters
        self.reclaim = Reclaim(run.session, run.counters, reclaim_limit)
        self._statements = ClaimStatements(
            run.attempts,
            run.deadline,
            queues=queues,
            worker_id=run.worker_id,
            lease_seconds=lease_seconds,
            keep_done=keep_done,
            controls=controls,
        )
        self.pipelined = PipelinedClaims(self, self._statements, run.session, controls=controls)
        self._queues = queues
        self._paused: set[str] = set()  # queues a claim of this run found paused
        self._taken_from: set[str] = set()  # queues this run claimed jobs of
        # A reply lost with the connection is asked for again (claim_statement.py): what the
        # claims were sent with is not trusted after it.
        run.session.on_reconnect(self._statements.positions.reconnected)

    def complete_and_claim(self, limit: int, while_sent: Callable[[], None] | None = None) -> int:
        """One round trip: record the finished jobs, claim up to `limit` more. Returns how
        many it claimed. `while_sent` runs while the statement is on the wire."""
        self.pipelined.settle()
        claimed_now = self.pipelined.claim_now(limit, while_sent)
        if claimed_now is not None:
            return claimed_now  # read as a claim sent ahead is, with the same recovery
        claim = self._statements.new(limit)
        made = self._session.run_recovering(
            self._statements.operation(claim),
            self._statements.recover(claim),
            while_sent=while_sent,
        )
        return self.received(claim, *made)

    def received(self, claim: Claim, result: store.Fenced, claimed: list[ClaimedJob]) -> int:
        """Record a claim's reply, however it came (its own round trip, pipelined, or asked
        for after a lost reply): its completions, and the jobs it took as unstarted. Returns
        how many it took."""
        self.prefetch.claim_took(time.monotonic() - claim.sent_at)
        self._statements.received(claim, claimed)
        self.reclaim.report()
        if claimed:
            self._attempts.leases_claimed(claim.sent_at)
        self._completer.record_completions(result)
        self._attempts.unstarted.extend(claimed)
        self._counters.add("claimed", len(claimed))
        self._taken_from.update(job.queue for job in claimed)
        self._paused |= result.paused_queues
        if result.paused_queues:
            # Jobs claimed ahead of a queue paused since: given back, their attempt unspent.
            self._completer.release_unstarted(result.paused_queues)
        if claimed and self._deadline.below_reserve():
            # The claim itself took the time that was left (a slow or resuming database, a
            # reconnect): give the jobs back unstarted rather than start what cannot finish.
            self._completer.release_unstarted()
        return len(claimed)

    def paused_untaken(self) -> tuple[str, ...]:
        """The queues this run serves that its claims found paused, and took no job of."""
        untaken = self._paused - self._taken_from
        return tuple(sorted(q for q in untaken if serves(self._queues, q)))


def claim_size(
    claims: Claims, attempts: Attempts, settings: Settings, *, pipelined_claim: bool = False
) -> int:
    """How many jobs to claim now: for the free slots, and for those about to free. The claims
    on the wire hold the slots of all they may bring. A claim sent ahead (`pipelined_claim`) may
    take one batch more, only while a whole batch frees during a round trip (prefetch.py):
    it is read one round trip later than a claim made now would be, and its jobs start as the
    next claim goes out, when the slots of the batch before them have freed."""
    allowance = claims.prefetch.allowance(attempts.running_since.values(), time.monotonic())
    if pipelined_claim:
        if allowance < claims.prefetch.most or not claims.prefetch.most:
            return 0
        allowance += settings.batch_size
    return attempts.to_claim(
        settings.concurrency, settings.batch_size, allowance, claims.pipelined.slots()
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

    The jobs start after the claim has gone out, not before, so that their threads do not
    hold the interpreter while this one builds and sends it.

    While claims come back full and more are wanted, the next claim goes out before the reply
    to the last is read (pipelining.py, db/pipeline.py): one claim is on the wire between two
    turns of the loop, two while a reply is read, and the database runs the one while this
    thread reads the other and starts its jobs."""

    def start() -> None:
        attempts.start_free(submit, settings.concurrency)

    def start_all() -> None:
        attempts.start_all(submit)

    n = claim_size(claims, attempts, settings)  # unstarted attempts hold their slots already
    while_sent = start_all if attempts.unstarted else None  # None: nothing to hand over
    pipelined = claims.pipelined
    if pipelined.count():
        limit = pipelined.oldest_limit()
        if pipelined.last_full and pipelined.may_send():
            ahead = claim_size(claims, attempts, settings, pipelined_claim=True)
            if ahead > 0:
                pipelined.send(ahead)
        if pipelined.count():  # unless the connection broke and every claim was taken up
            pipelined.last_full = pipelined.read(while_sent) == limit
        made = True
    else:
        pipelined.last_full = n > 0 and claims.complete_and_claim(n, while_sent=while_sent) == n
        made = n > 0
    if start_now:
        start()
    if pipelined.last_full and not pipelined.count() and pipelined.may_send():
        ahead = claim_size(claims, attempts, settings, pipelined_claim=True)
        if ahead > 0:
            pipelined.send(ahead)  # read at the next turn, behind the claim sent then
    return made, pipelined.last_full
