"""The heartbeat: every lease/3, one statement extends the lease of every attempt the run
holds. An attempt the statement does not return has lost its lease (reclaimed by another
run): it is never started, and a running one is told through Job.lease_lost(). The same
statement with a cap of 0 s ends the leases of the jobs still running when a run stops early
(those a stop gives back first: end_running_leases)."""

from __future__ import annotations

import logging
import time

from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.runner.attempts import RunState, leases_lost, say_lost

log = logging.getLogger(__name__)

BEATS_PER_LEASE = 3
# In the error history of a job whose attempt a stop cut short (store.job_release_stopped).
STOPPED_MESSAGE = "the run was stopped while this attempt ran (SIGTERM or SIGINT); not counted"


class Heartbeat:
    def __init__(self, run: RunState, *, lease_seconds: float, controls: Controls = ALL_ON) -> None:
        self._run = run
        self._lease_seconds = lease_seconds
        self._enabled = controls.heartbeat
        self._give_back_when_stopped = controls.give_back_attempts_a_stop_cuts_short
        self.interval = lease_seconds / BEATS_PER_LEASE
        self.next_at = time.monotonic() + self.interval

    def start(self) -> None:
        """The first beat is due one interval after the first claim, not after the connect."""
        self.next_at = time.monotonic() + self.interval

    def due_now(self) -> None:
        """The connection was replaced: beat at the next turn of the loop, not an interval
        later (the reconnect may have taken most of a lease)."""
        self.next_at = 0.0

    def beat_if_due(self) -> None:
        now = time.monotonic()
        if now >= self.next_at:
            self.beat()
            self.next_at = now + self.interval
        # Leases found lost since the last turn, by this beat too: counted and said once each.
        say_lost(self._run)

    def beat(self) -> None:
        if not self._enabled:
            return
        run = self._run
        # The claims on the wire first, so that the leases they took are extended too and the
        # renewal time below is true of every lease held.
        run.session.settle()
        held = run.attempts.held()
        if not held:
            return
        sent_at = time.monotonic()
        result = run.session.run(
            store.job_extend_leases, held, self._lease_seconds, run.deadline.lease_cap()
        )
        run.attempts.leases_renewed(sent_at)
        if result.lost_attempts:
            run.attempts.forget_lost(result.lost_attempts)
            leases_lost(run, result.lost_attempts, "found by the heartbeat")
        if run.attempts.recorded.progress:
            self._write_progress()

    def _write_progress(self) -> None:
        """The latest progress of each running attempt that recorded some, fenced (an attempt
        whose lease is gone writes nothing: the beat has counted it)."""
        run = self._run
        progress = run.attempts.recorded.progress
        pending = [
            (held, None, progress.pop(held))
            for held in list(progress)
            if held in run.attempts.running and held.token not in run.attempts.lost_tokens
        ]
        if pending:
            run.session.run(store.job_record_many, pending)

    def end_running_leases(self) -> None:
        """The run stops with jobs still running (a stop request's grace is over). Those whose
        policy is auto are queued again at once, the attempt given back: a stop (a deploy)
        must not use up a job's attempts. The others' leases end now, so another run's reclaim
        parks them at once instead of a lease later. Fenced like every beat; safe to repeat."""
        run = self._run
        held = [a.held for a in run.attempts.running.values()]
        if not held:
            return
        if self._give_back_when_stopped:
            given_back = run.session.run(store.job_release_stopped, held, STOPPED_MESSAGE)
            if given_back.applied_attempts:
                log.warning(
                    "stopping: jobs still running are queued again, their attempt not counted",
                    extra={"job_ids": sorted(h.id for h in given_back.applied_attempts)},
                )
            held = [h for h in held if h not in given_back.applied_attempts]
            if not held:
                return
        result = run.session.run(store.job_extend_leases, held, self._lease_seconds, 0.0)
        log.warning(
            "stopping: the leases of jobs still running end now; they are reclaimable",
            extra={"job_ids": sorted(h.id for h in result.applied_attempts)},
        )
        leases_lost(run, result.lost_attempts, "while ending its lease")
