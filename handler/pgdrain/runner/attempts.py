"""The attempts a run holds, by stage: claimed but not started, running, finished but not yet
recorded as done. Only the run's loop changes them (at concurrency 1 the calling thread too,
while the loop's thread runs its job, never both at once: loop_thread.py); job threads read
`lost_tokens` and say when each attempt they were handed starts (`started`).

Every attempt is keyed by (job id, attempt token), never by the job id alone: one run can hold
two attempts of the same job at once (its lease expired while the first ran, another run
reclaimed it, and this run claimed it again), and the older attempt's outcome must not touch
the newer one's bookkeeping."""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterator
from itertools import chain
from typing import NamedTuple

from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.db.store import ClaimedJob, Held
from pgdrain.runner.deadline import Deadline
from pgdrain.runner.execute import Recorded
from pgdrain.runner.summary import Counters


class Attempts:
    def __init__(self, lease_seconds: float | None = None, told_of_lapses: bool = True) -> None:
        # The lease a claim and a beat take: a job hears lease_lost() once that long has
        # passed since the last renewal was sent (lease_lapsed); None: only when found gone.
        self._lease_seconds = lease_seconds if told_of_lapses else None
        self.unstarted: deque[ClaimedJob] = deque()
        # Handed to the worker pool: running, or (claimed ahead) waiting there for a thread.
        self.running: dict[Held, ClaimedJob] = {}
        # When each running attempt started (monotonic; when it was handed over, until its
        # thread says), oldest first: prefetch reads which are about to end (prefetch.py).
        self.running_since: dict[Held, float] = {}
        # The attempts handed over that no thread has taken yet (WorkerPool.take_back).
        self._take_back_waiting: Callable[[], list[ClaimedJob]] = list
        self.finished: list[ClaimedJob] = []  # returned; their completion rides on a round trip
        self.first_finished_at = 0.0
        # Tokens of attempts whose lease was found gone; Job.lease_lost() reads it from the
        # worker threads (a set lookup: no lock, no object per job).
        self.lost_tokens: set[uuid.UUID] = set()
        # When the oldest lease the run holds was last set or extended (monotonic, taken just
        # before the statement was sent, so never later than the database's own now()).
        self._renewed_at: float | None = None
        # Outputs and progress that job threads recorded, not written yet (execute.Recorded).
        self.recorded = Recorded({}, {})

    def job_view(self) -> tuple[set[uuid.UUID], Recorded, Callable[[], bool]]:
        """What a job thread reads and writes: the lost tokens, where it records, and whether
        the leases may have lapsed unrenewed."""
        return self.lost_tokens, self.recorded, self.lease_lapsed

    def held(self) -> list[Held]:
        """Every attempt whose lease is ours to keep, finished ones waiting for their write
        included; not a running one whose lease was found gone (it is not ours any more)."""
        return [a.held for a in self._holding()]

    def _holding(self) -> Iterator[ClaimedJob]:
        lost = self.lost_tokens
        for attempt in chain(self.running.values(), self.unstarted, self.finished):
            if not lost or attempt.attempt_token not in lost:
                yield attempt

    def leases_renewed(self, at: float) -> None:
        """A heartbeat sent at `at` extended every lease the run holds."""
        self._renewed_at = at

    def leases_claimed(self, at: float) -> None:
        """A claim sent at `at` took new leases; older ones keep their own renewal time. With
        none held (the run idle, or every attempt still running found lost: a beat renews
        only the leases held), there is no older one, and the count starts at `at`."""
        if self._renewed_at is None or next(self._holding(), None) is None:
            self._renewed_at = at

    def lease_seconds_left(self, lease_seconds: float) -> float | None:
        """How long, at least, the oldest lease held still runs (None: none is held)."""
        if not (self.running or self.unstarted or self.finished):
            self._renewed_at = None
            return None
        if self._renewed_at is None:
            return None
        return self._renewed_at + lease_seconds - time.monotonic()

    def lease_lapsed(self) -> bool:
        """The oldest lease held may have run out: no renewal sent in the last lease (a
        heartbeat still waiting for its reply: a pooler's queue, a stalled server). Another
        run may own its job by now. Read by job threads: one read of a float, no lock."""
        renewed_at, lease = self._renewed_at, self._lease_seconds
        if renewed_at is None or lease is None:
            return False
        return time.monotonic() > renewed_at + lease

    def busy(self) -> bool:
        return bool(self.running or self.unstarted)

    def to_claim(
        self, concurrency: int, batch_size: int, ahead: int = 0, on_the_wire: int = 0
    ) -> int:
        """How many jobs to claim now: what free worker slots can start at once (a job claimed
        and left waiting would spend an attempt if the process died), plus `ahead` for slots
        about to free (prefetch.py), at most a batch; none until half the slots are free,
        unless none is busy (running or claimed to run), so short jobs still come in batches.
        `on_the_wire`: the jobs that claims sent and not yet read may bring (they hold slots)."""
        held = len(self.running) + len(self.unstarted) + on_the_wire
        wanted = min(concurrency + ahead - held, batch_size)
        refill_at = max(1, min(concurrency, batch_size) // 2)
        return wanted if wanted > 0 and (not held or wanted >= refill_at) else 0

    def start_free(self, submit: Callable[[ClaimedJob], None], concurrency: int) -> None:
        """Hand unstarted attempts to `submit` while a worker slot is free."""
        while self.unstarted and len(self.running) < concurrency:
            submit(self.start_next())

    def start_all(self, submit: Callable[[ClaimedJob], None]) -> None:
        """Hand every unstarted attempt to `submit`: those beyond the free slots wait in the
        pool and start as its threads free, while the run's thread waits for a claim's reply
        (it could start them only once the reply is in)."""
        while self.unstarted:
            submit(self.start_next())

    def started(self, held: Held) -> None:
        """Called by the worker thread as the attempt starts. It changes the value of a key the
        run's thread put in before handing the attempt over, and which only the attempt's
        outcome removes: no key comes or goes, so the run's thread may iterate meanwhile."""
        self.running_since[held] = time.monotonic()

    def take_back_with(self, take_back: Callable[[], list[ClaimedJob]]) -> None:
        """Where `take_back` finds the attempts handed over that no thread has started."""
        self._take_back_waiting = take_back

    def take_back(self) -> None:
        """Make the attempts waiting in the pool for a thread unstarted again (ahead of those
        claimed since, as they were): none of them will run, so releasing or forgetting the
        unstarted attempts covers them too."""
        waiting = self._take_back_waiting()
        for attempt in waiting:
            self.running.pop(attempt.held, None)
            self.running_since.pop(attempt.held, None)
        self.unstarted.extendleft(reversed(waiting))

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
        self.take_back()
        unstarted = list(self.unstarted)
        self.unstarted.clear()
        return unstarted

    def holds_any_of(self, queues: Collection[str]) -> bool:
        """Whether an attempt of `queues` is unstarted or handed over (maybe waiting)."""
        return any(a.queue in queues for a in (*self.unstarted, *self.running.values()))

    def take_unstarted_of(self, queues: Collection[str]) -> list[ClaimedJob]:
        """Take the unstarted attempts of `queues` (a paused queue's), those waiting in the pool
        included; the others stay, in their order."""
        self.take_back()
        taken = [a for a in self.unstarted if a.queue in queues]
        if taken:
            kept = [a for a in self.unstarted if a.queue not in queues]
            self.unstarted.clear()
            self.unstarted.extend(kept)
        return taken

    def forget_lost(self, lost: Collection[Held]) -> None:
        """A heartbeat found these leases gone: never start them, and tell running ones."""
        self.take_back()  # the rest are handed over again with the next claim
        for attempt in list(self.unstarted):
            if attempt.held in lost:
                self.unstarted.remove(attempt)
        for held in lost:
            if held in self.running:
                self.lost_tokens.add(held.token)


def leases_lost(run: RunState, lost: Collection[Held], how: str) -> None:
    """Attempts whose lease is gone (a fenced statement matched nothing): counted now, said by
    say_lost."""
    for held in lost:
        run.counters.lease_lost(held, how)


def say_lost(run: RunState) -> None:
    """Log the lost attempts not said yet, once each, with why when the job's status tells (an
    operator cancelled it): read in a statement of its own, rarely needed. Called where the
    run may send a statement (the heartbeat's turn, the run's end)."""
    if not run.counters.unsaid:
        return
    run.session.settle()  # the replies sent ahead first: they may hold more
    ids = sorted({held.id for held in run.counters.unsaid})
    run.counters.say_lost(run.session.run(store.job_status_many, ids), run.worker_id)


class RunState(NamedTuple):
    """What the parts of one run share: its connection, its attempts, its deadline, its
    counters, and the name it claims under."""

    session: Session
    attempts: Attempts
    deadline: Deadline
    counters: Counters
    worker_id: str
