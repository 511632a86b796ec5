"""Claim-ahead: the next batch is claimed while the current one still runs.

Without it the run alternates: the jobs run while the database waits, then the database runs
the claim while the worker threads wait. So the claim for the slots that will free while it is
on the wire is sent before they free: the jobs run while the statement (which also completes
the last batch) travels and executes.

How many: the worker slots that free during one round trip, from the smoothed time a job takes
to run (d) and a claim to come back (r): concurrency x r / d, at most a batch. With jobs of a
tenth of a round trip that is a whole batch; with 5 ms jobs and 1.5 ms round trips, 3 of 10;
with jobs longer than concurrency round trips, none (the claims alternate as before). A job
claimed ahead holds a lease and an attempt while it waits, and it waits about one round trip:
the slots it was claimed for free by the time it arrives. One slow job cuts the allowance at
once (the average moves a fifth of the way, and a 5 s job is far over any round trip). Never
at concurrency 1: strict ordering holds one job at a time."""

from __future__ import annotations

# How far each new measurement moves the smoothed figures.
SMOOTHING = 0.2


class ClaimAhead:
    def __init__(self, batch_size: int, concurrency: int, *, enabled: bool = True) -> None:
        self._batch = batch_size if enabled and concurrency > 1 else 0
        self._concurrency = concurrency
        self._job_seconds: float | None = None
        self._round_trip_seconds: float | None = None

    def job_ran(self, seconds: float) -> None:
        self._job_seconds = _smoothed(self._job_seconds, seconds)

    def claim_took(self, seconds: float) -> None:
        self._round_trip_seconds = _smoothed(self._round_trip_seconds, seconds)

    def allowance(self) -> int:
        """How many jobs beyond the free slots the next claim may take."""
        job, trip = self._job_seconds, self._round_trip_seconds
        if not self._batch or job is None or trip is None:
            return 0
        if job <= 0:
            return self._batch
        return min(self._batch, int(self._concurrency * trip / job))


def _smoothed(average: float | None, value: float) -> float:
    return value if average is None else average + SMOOTHING * (value - average)
