"""The attempts a run holds, by stage: claimed but not started, running, finished but not yet
recorded as done. Only the run's main thread changes them; worker threads read `lost_tokens`.

Every attempt is keyed by (job id, attempt token), never by the job id alone: one run can hold
two attempts of the same job at once (its lease expired while the first ran, another run
reclaimed it, and this run claimed it again), and the older attempt's outcome must not touch
the newer one's bookkeeping."""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass

from pgdrain.deadline import Deadline
from pgdrain.session import Session
from pgdrain.store import ClaimedJob, Held
from pgdrain.summary import Counters


class Attempts:
    def __init__(self) -> None:
        self.unstarted: deque[ClaimedJob] = deque()
        self.running: dict[Held, ClaimedJob] = {}
        # When each running attempt was handed to a worker (monotonic), oldest first: claim-ahead
        # reads which are about to end (claim_ahead.py).
        self.running_since: dict[Held, float] = {}
        self.finished: list[ClaimedJob] = []  # returned; their completion rides on a round trip
        self.first_finished_at = 0.0
        # Tokens of attempts whose lease was found gone; Job.lease_lost() reads it from the
        # worker threads (a set lookup: no lock, no object per job).
        self.lost_tokens: set[uuid.UUID] = set()
        # When the oldest lease the run holds was last set or extended (monotonic, taken just
        # before the statement was sent, so never later than the database's own now()).
        self._renewed_at: float | None = None

    def held(self) -> list[Held]:
        """Every attempt whose lease is ours to keep, finished ones waiting for their write
        included."""
        return [a.held for a in (*self.running.values(), *self.unstarted, *self.finished)]

    def leases_renewed(self, at: float) -> None:
        """A heartbeat sent at `at` extended every lease the run holds."""
        self._renewed_at = at

    def leases_claimed(self, at: float) -> None:
        """A claim sent at `at` took new leases; older ones keep their own renewal time."""
        if self._renewed_at is None:
            self._renewed_at = at

    def lease_seconds_left(self, lease_seconds: float) -> float | None:
        """How long, at least, the oldest lease held still runs (None: none is held)."""
        if not (self.running or self.unstarted or self.finished):
            self._renewed_at = None
            return None
        if self._renewed_at is None:
            return None
        return self._renewed_at + lease_seconds - time.monotonic()

    def busy(self) -> bool:
        return bool(self.running or self.unstarted)

    def to_claim(self, concurrency: int, batch_size: int, ahead: int = 0) -> int:
        """How many jobs to claim now: what free worker slots can start at once (a job claimed
        and left waiting would spend an attempt if the process died), plus `ahead` for slots
        about to free (claim_ahead.py), at most a batch; none until half the slots are free,
        unless none is busy (running or claimed to run), so short jobs still come in batches."""
        wanted = min(concurrency + ahead - len(self.running) - len(self.unstarted), batch_size)
        refill_at = max(1, min(concurrency, batch_size) // 2)
        return wanted if wanted > 0 and (not self.busy() or wanted >= refill_at) else 0

    def start_free(self, submit: Callable[[ClaimedJob], None], concurrency: int) -> None:
        """Hand unstarted attempts to `submit` while a worker slot is free."""
        while self.unstarted and len(self.running) < concurrency:
            submit(self.start_next())

    def start_next(self) -> ClaimedJob:
        attempt = self.unstarted.popleft()
        self.running[attempt.held] = attempt
        self.running_since[attempt.held] = time.monotonic()
        return attempt

    def stop_running(self, attempt: ClaimedJob) -> None:
        """The attempt's function returned or raised: it no longer runs."""
        self.running.pop(attempt.held, None)
        self.running_since.pop(attempt.held, None)

    def finish(self, attempt: ClaimedJob) -> None:
        self.stop_running(attempt)
        if not self.finished:
            self.first_finished_at = time.monotonic()
        self.finished.append(attempt)

    def take_finished(self) -> list[ClaimedJob]:
        finished, self.finished = self.finished, []
        return finished

    def take_unstarted(self) -> list[ClaimedJob]:
        unstarted = list(self.unstarted)
        self.unstarted.clear()
        return unstarted

    def forget_lost(self, lost: Collection[Held]) -> None:
        """A heartbeat found these leases gone: never start them, and tell running ones."""
        for attempt in list(self.unstarted):
            if attempt.held in lost:
                self.unstarted.remove(attempt)
        for held in lost:
            if held in self.running:
                self.lost_tokens.add(held.token)


@dataclass(frozen=True)
class RunState:
    """What the parts of one run share: its connection, its attempts, its deadline, its
    counters, and the name it claims under."""

    session: Session
    attempts: Attempts
    deadline: Deadline
    counters: Counters
    worker_id: str
