"""One claim of a run: the attempts it records done, how many jobs it may take, and the id it
is stored under, chosen before it is sent; the statement that makes it, and what is run
instead after its reply was lost."""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import Attempts
from pgdrain.runner.deadline import Deadline
from pgdrain.runner.positions import ClaimStart, Positions

log = logging.getLogger(__name__)

UUID_MASK = (1 << 128) - 1

Result = tuple[store.Fenced, list[ClaimedJob]]


@dataclass(slots=True)
class Claim:
    """One claim as sent: the attempts it records done, the slots it asks jobs for, and where
    its scan of each queue starts."""

    claim_id: uuid.UUID  # stored on the rows it claims: job_claim_recover finds them by it
    finished: list[ClaimedJob]  # the attempts it records done
    held: list[store.Held]  # theirs
    limit: int
    sent_at: float  # monotonic, taken before it is sent
    start: ClaimStart
    served: tuple[str, ...] | None = None  # the queues it found itself, once read


class ClaimStatements:
    def __init__(
        self,
        attempts: Attempts,
        deadline: Deadline,
        *,
        queues: tuple[str, ...] | None,  # None: every queue
        worker_id: str,
        lease_seconds: float,
        keep_done: bool,
        controls: Controls = ALL_ON,
        clock: Callable[[], float] = time.monotonic,  # the positions' age
    ) -> None:
        self._attempts = attempts
        self._keep_done = keep_done
        self._deadline = deadline
        self._queues = queues
        self._worker_id = worker_id
        self._lease_seconds = lease_seconds
        self._recover_lost_replies = controls.recover_lost_replies
        # Claim ids: one random base per run, counted up, so a claim's id costs no call into
        # the OS (uuid4 reads os.urandom, which gives up the GIL). Unique within the run; two
        # runs' ids meet only if their random 128-bit bases lie within the number of claims of
        # each other.
        self._claim_ids = itertools.count(uuid.uuid4().int)
        self.positions = Positions(enabled=controls.claim_from_position, clock=clock)

    def new(self, limit: int) -> Claim:
        """A claim of up to `limit` jobs that records done every attempt finished by now."""
        finished = self._attempts.take_finished()
        claim_id = uuid.UUID(int=next(self._claim_ids) & UUID_MASK)
        held = [a.held for a in finished]
        return Claim(claim_id, finished, held, limit, time.monotonic(), self.positions.start())

    def statement(self, claim: Claim) -> store.Statement[Result]:
        made = store.job_complete_and_claim_statement(
            claim.held,
            claim.start.served if self._queues is None else self._queues,
            claim.limit,
            self._worker_id,
            self._lease_seconds,
            self._deadline.lease_cap(),
            claim.claim_id,
            positions=claim.start.positions,
            keep_done=self._keep_done,
        )
        return store.Statement(made.text, made.params, lambda cur: self.read(claim, cur.fetchall()))

    def read(self, claim: Claim, rows: list[Any]) -> Result:
        """The claim's reply read (sent alone or pipelined)."""
        claim.served = store.claim_served_queues(rows)
        return store.complete_and_claim_result(rows, claim.held)

    def received(self, claim: Claim, claimed: list[ClaimedJob]) -> None:
        """What the claim took moves the run's positions (Claims.received, however the reply
        came)."""
        self.positions.received(claim.start, claimed, claim.limit, claim.served)

    def operation(self, claim: Claim) -> Callable[[store.Connection], Result]:
        @store.one_statement
        def make(conn: store.Connection) -> Result:
            return self.statement(claim).run(conn)

        return make

    def recover(self, claim: Claim) -> Callable[[store.Connection], Result]:
        """What runs in place of `claim` after its reply was lost (the control, with
        recover_lost_replies off: the claim itself, again)."""
        make = self.operation(claim)
        if not self._recover_lost_replies:
            return make
        return after_a_lost_reply(make, claim.claim_id, claim.held, keep_done=self._keep_done)


def after_a_lost_reply(
    make: Callable[[store.Connection], Result],
    claim_id: uuid.UUID | None,
    finished: list[store.Held],
    *,
    keep_done: bool,
) -> Callable[[store.Connection], Result]:
    """`make` (a statement that completes `finished` and claims under `claim_id`), safe to run
    after its reply was lost: if it committed, its completions (found by completed_token; with
    done jobs not kept, `keep_done` False, by none of its attempts still holding its job) or
    its claims (found by claim_id) say so, and they are taken as its result: nothing is
    claimed twice, no completion is counted lost. If neither exists, nothing of it committed
    (or it claimed and completed nothing), so it is made now, once, under the same claim id."""

    def make_again(conn: store.Connection) -> Result:
        done, claimed = store.job_claim_recover(conn, claim_id, finished, keep_done=keep_done)
        if done.applied_attempts or claimed:
            log.warning(
                "a statement committed before its reply was lost; what it did is kept",
                extra={"claimed": len(claimed), "completed": len(done.applied_attempts)},
            )
            return done, claimed
        return make(conn)

    return make_again
