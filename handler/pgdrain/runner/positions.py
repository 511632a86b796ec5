"""Where a run's next claim of each queue starts (docs/decisions/0011): after the last job the
run claimed there, so that a claim does not walk again the index entries of the jobs claimed
before it. Those entries stay until vacuum removes them, and while any snapshot older than them
is held open (a report, a pg_dump, a forgotten session) vacuum cannot: from the start of the
queue, every claim would read them all.

The positions are the run's, set from each claim's reply (claim_statement.py). A queue's scan
starts after its position and reads the rest of that priority's ready jobs; when those run out
before the claim's limit, the same statement reads the queue from its floor (hot_path.sql; a key
no queued job sorts before, migration 0026), so a claim still comes back short only when nothing
more is ready. What sorts before a position (a more urgent job enqueued since, a job committed
late with an earlier run_at, a job another run held locked or gave back) is found when the
positions are dropped: at a short claim, after a reconnect, and at least every
POSITION_MAX_AGE, so it waits at most that long. A run of every
queue also names the queues its last claim from the start found jobs to claim in, for as long,
so that its claims need not read every queue's floor again (nor probe queues left empty)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pgdrain.db.store import ClaimedJob, ClaimPosition

# How long a run's claims may start from positions (and name the queues found before) before
# one reads every queue from its start again.
POSITION_MAX_AGE = 1.0


@dataclass(frozen=True, slots=True)
class ClaimStart:
    """Where one claim starts, fixed when it is made: the position of each queue it reads from
    one, the queues it names for a run of every queue (None: it finds them itself), when the
    claim that last read every queue from its start was made, and under which connection."""

    positions: Mapping[str, ClaimPosition]
    served: tuple[str, ...] | None
    since: float
    connection: int


class Positions:
    def __init__(
        self, *, enabled: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._enabled = enabled
        self._clock = clock
        self._at: dict[str, ClaimPosition] = {}
        self._served: tuple[str, ...] | None = None
        self._since: float | None = None  # None: nothing kept, the next claim reads from the start
        self._connection = 0  # counts reconnects

    def start(self) -> ClaimStart:
        """Where the next claim starts: from the positions kept, unless they are
        POSITION_MAX_AGE old (then, as without any, from the start of every queue)."""
        now = self._clock()
        if self._since is not None and now - self._since >= POSITION_MAX_AGE:
            self.drop()
        if self._since is None:
            return ClaimStart({}, None, now, self._connection)
        return ClaimStart(dict(self._at), self._served, self._since, self._connection)

    def received(
        self,
        start: ClaimStart,
        claimed: Sequence[ClaimedJob],
        limit: int,
        served: tuple[str, ...] | None,
    ) -> None:
        """A claim's reply: each queue's position is the last job it claimed there (`claimed`
        is in the claim's order); a queue it took nothing from has none. A short claim keeps
        those and drops the queues found. A claim made before the last reconnect changes
        nothing (its reply was asked for after a lost one: the reconnect dropped them).
        `served`: the queues the claim found itself, if it did."""
        if not self._enabled or start.connection != self._connection:
            return
        self._at = {
            job.queue: ClaimPosition(job.priority, job.run_at_us, job.id) for job in claimed
        }
        if len(claimed) < limit:
            # Short: the queues it read ran out, or their share of the batch did (a claim
            # naming many queues: hot_path.sql). The next finds the queues again (a run of
            # every queue); those it took jobs from keep their positions, so a queue whose
            # share held it back is claimed from its position, with a larger share. With none
            # taken, as at the start.
            self._served = None
            self._since = start.since if self._at else None
            return
        self._served = start.served if served is None else served
        self._since = start.since

    def drop(self) -> None:
        """The next claim reads every queue from its start (and finds them, if the run serves
        every queue)."""
        self._at = {}
        self._served = None
        self._since = None

    def reconnected(self) -> None:
        """The connection broke: what the claims on it were sent with is not trusted."""
        self.drop()
        self._connection += 1
