"""One drain run: reclaim expired leases, claim batches until nothing is ready, run the job
functions on a worker pool, heartbeat every lease/3, and stop in time for the deadline.

Only this thread talks to the database, and every statement autocommits: no transaction is
open while a job runs, and no session state is used, so the same SQL works through PgBouncer
in transaction mode. Workers never touch the database; their outcomes come back on a queue.

The pieces, each in its own module: attempts.py (what the run holds), claims.py (claiming and
completing), heartbeat.py, deadline.py, session.py (the one connection), summary.py (counters
and the result), execute.py (calling a job's function), pool.py (the worker
threads)."""

from __future__ import annotations

import logging
import os
import queue as queue_mod
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from pgdrain import execute, store
from pgdrain.attempts import Attempts
from pgdrain.budget import Budget
from pgdrain.claims import COMPLETION_FLUSH_SECONDS, Claims
from pgdrain.deadline import Deadline
from pgdrain.errors import PgdrainError
from pgdrain.heartbeat import Heartbeat
from pgdrain.pool import WorkerPool
from pgdrain.registry import Registry
from pgdrain.session import Session
from pgdrain.settings import Settings
from pgdrain.summary import (
    Counters,
    DrainResult,
    ErrorKind,
    Observer,
    StopReason,
    error_kind,
    one_line,
)

__all__ = ["DrainResult", "Observer", "SafetySwitches", "default_worker_id", "drain"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SafetySwitches:
    """Safety mechanisms, on in every real run. A test turns one off to show the failure it
    prevents; nothing else should."""

    heartbeat: bool = True
    cap_lease_at_deadline: bool = True


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def drain(
    settings: Settings,
    budget: Budget,
    registry: Registry,
    conninfo: str,
    *,
    queues: Sequence[str] | None = None,
    worker_id: str | None = None,
    observer: Observer | None = None,
    switches: SafetySwitches = SafetySwitches(),  # frozen: safe as a default
) -> DrainResult:
    """Run until no job is ready and none is running, or until the budget is spent."""
    return _Run(
        settings,
        budget,
        registry,
        conninfo,
        queues=tuple(queues or settings.queues),
        worker_id=worker_id or default_worker_id(),
        observer=observer,
        switches=switches,
    ).execute()


class _Run:
    def __init__(
        self,
        settings: Settings,
        budget: Budget,
        registry: Registry,
        conninfo: str,
        *,
        queues: tuple[str, ...],
        worker_id: str,
        observer: Observer | None,
        switches: SafetySwitches,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.queues = queues
        self.worker_id = worker_id
        self.started = time.monotonic()
        self.counters = Counters(observer)
        self.attempts = Attempts()
        self.deadline = Deadline(budget, settings.reserve_seconds, switches.cap_lease_at_deadline)
        self.session = Session(conninfo, settings, budget)
        self.claims = Claims(
            self.session,
            self.attempts,
            self.deadline,
            self.counters,
            queues=queues,
            lease_seconds=settings.lease_seconds,
            reclaim_limit=settings.reclaim_limit,
            worker_id=worker_id,
        )
        self.heartbeat = Heartbeat(
            self.session,
            self.attempts,
            self.deadline,
            self.counters,
            lease_seconds=settings.lease_seconds,
            worker_id=worker_id,
            enabled=switches.heartbeat,
        )
        # Refill once half the slots are free (or none is busy): short jobs still come in batches.
        self.refill_at = max(1, min(settings.concurrency, settings.batch_size) // 2)

    def execute(self) -> DrainResult:
        stop_reason: StopReason = "empty"
        error: str | None = None
        kind: ErrorKind | None = None
        more_ready = False
        pool: WorkerPool[store.ClaimedJob] = WorkerPool(self.settings.concurrency, self._run_job)
        try:
            self.session.open()
            self.claims.reclaim_expired()
            stop_reason = self._loop(pool)
            if stop_reason == "budget":
                more_ready = self.session.run(store.queue_has_ready, self.queues)
        except (PgdrainError, psycopg.Error) as exc:
            stop_reason, error, kind = "error", one_line(exc), error_kind(exc)
            log.error("drain stopped: %s", error, extra={"worker": self.worker_id})
        finally:
            pool.close()
            self.session.close()
        result = DrainResult(
            **self.counters.values,
            abandoned=len(self.attempts.running),
            stop_reason=stop_reason,
            more_ready=more_ready,
            error=error,
            error_kind=kind,
            elapsed_s=round(time.monotonic() - self.started, 3),
        )
        log.info("drain finished", extra={"summary": result.as_dict()})
        return result

    def _loop(self, pool: WorkerPool[store.ClaimedJob]) -> StopReason:
        attempts, claims, deadline = self.attempts, self.claims, self.deadline
        concurrency = self.settings.concurrency
        stopping = False
        self.heartbeat.start()
        while True:
            if not stopping and deadline.below_reserve():
                stopping = True
                log.info("budget below reserve: no more claims", extra=self._where())
            if stopping and attempts.unstarted:
                claims.release_unstarted()

            if not stopping:
                # Claim only what free worker slots can start now: a job claimed and left
                # waiting would spend an attempt if the process died.
                free = concurrency - len(attempts.running) - len(attempts.unstarted)
                wanted = min(free, self.settings.batch_size)
                if wanted > 0 and (not attempts.running or wanted >= self.refill_at):
                    claims.complete_and_claim(wanted)
                while attempts.unstarted and len(attempts.running) < concurrency:
                    pool.submit(attempts.start_next())
            # Finished jobs ride on the next claim; when none came in time, write them alone.
            if claims.completion_due():
                claims.flush_completions()

            if not attempts.busy():
                claims.flush_completions()
                return "budget" if stopping or deadline.below_reserve() else "empty"
            if stopping and deadline.at_final_margin():
                claims.flush_completions()
                log.warning(
                    "deadline reached with jobs still running; their leases end now",
                    extra={"running": sorted(h.id for h in attempts.running)},
                )
                return "budget"

            self._collect(pool, self._seconds_to_wait(stopping))
            self.heartbeat.beat_if_due()

    def _seconds_to_wait(self, stopping: bool) -> float:
        """Until the next thing the loop must do: a heartbeat, a due completion write, or a
        deadline check."""
        now = time.monotonic()
        wake_at = self.heartbeat.next_at
        if self.attempts.finished:
            wake_at = min(wake_at, self.attempts.first_finished_at + COMPLETION_FLUSH_SECONDS)
        wake_at = min(wake_at, now + self.deadline.seconds_until_check(stopping))
        return max(0.0, wake_at - now)

    def _run_job(self, claimed: store.ClaimedJob) -> None:
        execute.run_job(self.registry, claimed, self.deadline.remaining, self.attempts.lost_tokens)

    def _collect(self, pool: WorkerPool[store.ClaimedJob], wait: float) -> None:
        """Wait up to `wait` seconds for an outcome and take all that are ready. Successes wait
        for the next round trip (at most COMPLETION_FLUSH_SECONDS); failures are recorded at
        once."""
        try:
            outcome = pool.outcomes.get(timeout=wait) if wait > 0 else pool.outcomes.get_nowait()
        except queue_mod.Empty:
            return
        while True:
            if outcome.error is None:
                self.attempts.finish(outcome.item)
            else:
                self.attempts.stop_running(outcome.item)
                self.claims.record_failure(outcome.item, outcome.error)
            try:
                outcome = pool.outcomes.get_nowait()
            except queue_mod.Empty:
                return

    def _where(self) -> dict[str, Any]:
        return {"worker": self.worker_id, "remaining_s": round(self.deadline.remaining(), 2)}
