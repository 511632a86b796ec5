"""The attempts a run holds, by stage: claimed but not started, running, finished but not yet
recorded as done. Only the run's main thread changes them; worker threads read `lost_tokens`."""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

from pgdrain.deadline import Deadline
from pgdrain.session import Session
from pgdrain.store import ClaimedJob, Held
from pgdrain.summary import Counters


class Attempts:
    def __init__(self) -> None:
        self.unstarted: deque[ClaimedJob] = deque()
        self.running: dict[int, ClaimedJob] = {}
        self.finished: list[ClaimedJob] = []  # returned; their completion rides on a round trip
        self.first_finished_at = 0.0
        # Tokens of attempts whose lease was found gone; Job.lease_lost() reads it from the
        # worker threads (a set lookup: no lock, no object per job).
        self.lost_tokens: set[uuid.UUID] = set()

    def held(self) -> list[Held]:
        """Every attempt whose lease is ours to keep, finished ones waiting for their write
        included."""
        return [a.held for a in (*self.running.values(), *self.unstarted, *self.finished)]

    def busy(self) -> bool:
        return bool(self.running or self.unstarted)

    def start_next(self) -> ClaimedJob:
        attempt = self.unstarted.popleft()
        self.running[attempt.id] = attempt
        return attempt

    def finish(self, attempt: ClaimedJob) -> None:
        self.running.pop(attempt.id, None)
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

    def forget_lost(self, lost: Collection[int]) -> None:
        """A heartbeat found these leases gone: never start them, and tell running ones."""
        for attempt in list(self.unstarted):
            if attempt.id in lost:
                self.unstarted.remove(attempt)
        for job_id in lost:
            if job_id in self.running:
                self.lost_tokens.add(self.running[job_id].attempt_token)


@dataclass(frozen=True)
class RunState:
    """What the parts of one run share: its connection, its attempts, its deadline, its
    counters, and the name it claims under."""

    session: Session
    attempts: Attempts
    deadline: Deadline
    counters: Counters
    worker_id: str
