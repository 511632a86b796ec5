"""Prefetch: the next batch is claimed while the current one still runs.

Without it the run alternates: the jobs run while the database waits, then the database runs
the claim while the worker threads wait. So the claim for the slots that will free while it is
on the wire is sent before they free: the jobs run while the statement (which also completes
the last batch) travels and executes.

How many: the worker slots that free during one round trip, from the smoothed time a job takes
to run (d) and a claim to come back (r): concurrency x r / d, at most a batch (`most_ahead`:
more when a batch is larger than the slots). With jobs of a tenth of a round trip that is a
whole batch; with 5 ms jobs and 1.5 ms round trips, 3 of 10; with jobs longer than concurrency
round trips, none (the claims alternate as before). A job claimed ahead holds a lease and an
attempt while it waits, and it waits about one round trip: the slots it was claimed for free
by the time it arrives. It waits in the worker pool, handed over while the next claim is on
the wire, and starts as soon as a thread frees. One slow job cuts the allowance at once (the
average moves a fifth of the way, and a 5 s job is far over any round trip). Never at
concurrency 1: strict ordering holds one job at a time.

That count assumes the slots free one after another. Jobs claimed together start together and,
when they take about as long, end together: the batch frees at once, the count-based claim goes
out only then, and the slots stand empty for a round trip (or two: the first claim takes only
what half-empty slots allow). So wherever prefetch pays at all (that count is at least
one), the running jobs expected to end within one round trip (started at least the smoothed job
time less a round trip ago) count as about to free as well, and the run wakes when the next one
comes within a round trip of its end: the claim for their slots arrives as they end
(docs/decisions/0006)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from pgdrain.controls import ALL_ON, Controls

# How far each new measurement moves the smoothed figures.
SMOOTHING = 0.2


class Prefetch:
    def __init__(self, batch_size: int, concurrency: int, *, controls: Controls = ALL_ON) -> None:
        # The most claimed ahead: a batch; with a batch larger than the slots, enough that the
        # next claim still takes a whole batch while the last one waits for threads.
        enabled = controls.prefetch and concurrency > 1
        self._most = most_ahead(batch_size, concurrency) if enabled else 0
        self._concurrency = concurrency
        self._job_seconds: float | None = None
        self._round_trip_seconds: float | None = None

    @property
    def most(self) -> int:
        """The most prefetched (0: prefetch is off)."""
        return self._most

    def job_ran(self, seconds: float) -> None:
        self._job_seconds = _smoothed(self._job_seconds, seconds)

    def claim_took(self, seconds: float) -> None:
        self._round_trip_seconds = _smoothed(self._round_trip_seconds, seconds)

    def allowance(self, running_since: Iterable[float] = (), now: float = 0.0) -> int:
        """How many jobs beyond the free slots the next claim may take: the slots that free
        during a round trip, and at least the running jobs (started at `running_since`, oldest
        first, monotonic seconds) expected to end within one."""
        steady = self._steady()
        if steady == 0 or steady == self._most:
            return steady
        ending, _ = self._ending(running_since, now)
        return min(self._most, max(steady, ending))

    def wake_at(self, running_since: Iterable[float], now: float) -> float:
        """When the next running job comes within a round trip of its expected end (a claim
        for its slot is due then): a moment after `now`, or infinity (none, or claiming ahead
        does not pay)."""
        steady = self._steady()
        if steady == 0 or steady == self._most:
            return math.inf
        return self._ending(running_since, now)[1]

    def _ending(self, running_since: Iterable[float], now: float) -> tuple[int, float]:
        """How many running jobs are within one round trip of their expected end, and when the
        next one will be (infinity: none is left)."""
        assert self._job_seconds is not None and self._round_trip_seconds is not None
        lead = self._job_seconds - self._round_trip_seconds  # from a job's start
        ending = 0
        for started in running_since:
            if started + lead > now:
                return ending, started + lead  # those started after it end after it
            ending += 1
        return ending, math.inf

    def _steady(self) -> int:
        """The slots that free during one round trip when jobs end one after another."""
        job, trip = self._job_seconds, self._round_trip_seconds
        if not self._most or job is None or trip is None:
            return 0
        if job <= 0:
            return self._most
        return min(self._most, int(self._concurrency * trip / job))


def most_ahead(batch_size: int, concurrency: int) -> int:
    """A batch; or, when a batch is larger than the slots, 2 x batch - concurrency: a claim
    takes at most concurrency + this - the attempts held (claiming.claim_size), and just after a
    reply those are its whole batch, so with less the claims would alternate between a batch
    and the slots' worth."""
    return max(batch_size, 2 * batch_size - concurrency)


def _smoothed(average: float | None, value: float) -> float:
    return value if average is None else average + SMOOTHING * (value - average)
