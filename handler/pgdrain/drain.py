"""One drain run: reclaim expired leases, claim batches until nothing is ready, run the job
functions on a worker pool, heartbeat every lease/3, and stop in time for the deadline.

Only this thread talks to the database, and every statement autocommits: no transaction is
open while a job runs, and no session state is used, so the same SQL works through PgBouncer
in transaction mode. Workers never touch the database; their outcomes come back on a queue."""

from __future__ import annotations

import logging
import os
import queue as queue_mod
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import psycopg

from pgdrain import db, retry, store
from pgdrain.budget import Budget
from pgdrain.errors import (
    AuthenticationFailed,
    DatabaseUnavailable,
    PgdrainError,
    UnknownJobKind,
)
from pgdrain.pool import WorkerPool
from pgdrain.registry import Job, Registry
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

HEARTBEATS_PER_LEASE = 3
MAX_ERROR_LENGTH = 2000
# Stop waiting for running jobs this long before the deadline, so the run can still answer.
FINAL_MARGIN_SECONDS = 0.5
# A finished job is recorded as done with the next claim, or at the latest after this long:
# one commit for many jobs, without holding results back from the database.
COMPLETION_FLUSH_SECONDS = 0.1

T = TypeVar("T")

# Called with a counter name ("claimed", "done", ...) and how much it grew, as the run goes:
# a Lambda timeout kills the process, so progress must leave it before the end.
Observer = Callable[[str, int], None]


@dataclass(frozen=True)
class DrainResult:
    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    lease_lost: int = 0
    reclaimed: int = 0
    released: int = 0
    abandoned: int = 0  # still running when the run had to return; reclaimable at the deadline
    stop_reason: str = "empty"  # empty | budget | error
    more_ready: bool = False  # ready jobs were left (only looked at when the budget ran out)
    error: str | None = None
    error_kind: str | None = None  # "authentication", "unavailable" or "database" with an error
    elapsed_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
) -> DrainResult:
    """Run until no job is ready and none is running, or until the budget is spent."""
    run = _Run(
        settings=settings,
        budget=budget,
        registry=registry,
        conninfo=conninfo,
        queues=tuple(queues or settings.queues),
        worker_id=worker_id or default_worker_id(),
        observer=observer,
    )
    return run.execute()


class _Run:
    def __init__(
        self,
        *,
        settings: Settings,
        budget: Budget,
        registry: Registry,
        conninfo: str,
        queues: tuple[str, ...],
        worker_id: str,
        observer: Observer | None,
    ) -> None:
        self.settings = settings
        self.budget = budget
        self.registry = registry
        self.conninfo = conninfo
        self.queues = queues
        self.worker_id = worker_id
        self.observer = observer
        self.counts: dict[str, int] = dict.fromkeys(
            ("claimed", "done", "retried", "failed", "lease_lost", "reclaimed", "released"), 0
        )
        self.conn: psycopg.Connection[Any] | None = None
        self.buffer: deque[store.ClaimedJob] = deque()  # claimed, not started
        self.running: dict[int, store.ClaimedJob] = {}
        self.finished: list[store.ClaimedJob] = []  # returned, not yet recorded as done
        self.first_finished_at = 0.0
        self.refill_at = max(1, min(settings.concurrency, settings.batch_size) // 2)
        self.lost_ids: set[int] = set()
        # Tokens of attempts whose lease a heartbeat found gone; Job.lease_lost() reads it
        # from the worker threads (a set lookup: no lock, no object per job).
        self.lost_tokens: set[uuid.UUID] = set()
        self.started = time.monotonic()

    # -- the run -------------------------------------------------------------------------

    def execute(self) -> DrainResult:
        stop_reason, error, error_kind, more_ready = "empty", None, None, False
        pool: WorkerPool[store.ClaimedJob] = WorkerPool(self.settings.concurrency, self._run_job)
        try:
            self.conn = db.connect(self.conninfo, self.settings, self.budget)
            self._reclaim()
            stop_reason = self._loop(pool)
            if stop_reason == "budget":
                more_ready = self._db(store.queue_has_ready, self.queues)
        except (PgdrainError, psycopg.Error) as exc:
            stop_reason, error, error_kind = "error", _one_line(exc), _error_kind(exc)
            log.error("drain stopped: %s", error, extra={"worker": self.worker_id})
        finally:
            pool.close()
            if self.conn is not None:
                self.conn.close()
        result = DrainResult(
            **self.counts,
            abandoned=len(self.running),
            stop_reason=stop_reason,
            more_ready=more_ready,
            error=error,
            error_kind=error_kind,
            elapsed_s=round(time.monotonic() - self.started, 3),
        )
        log.info("drain finished", extra={"summary": result.as_dict()})
        return result

    def _loop(self, pool: WorkerPool[store.ClaimedJob]) -> str:
        interval = self.settings.lease_seconds / HEARTBEATS_PER_LEASE
        next_heartbeat = time.monotonic() + interval
        stopping = False
        while True:
            if not stopping and self.budget.exhausted(self.settings.reserve_seconds):
                stopping = True
                log.info("budget below reserve: no more claims", extra=self._where())
            if stopping and self.buffer:
                self._release_buffer()

            if not stopping:
                # Claim only what free worker slots can start now: a job claimed and left
                # waiting would spend an attempt if the process died. Refill once half the
                # slots are free (or none is busy), so that short jobs still come in batches.
                free = self.settings.concurrency - len(self.running) - len(self.buffer)
                wanted = min(free, self.settings.batch_size)
                if wanted > 0 and (not self.running or wanted >= self.refill_at):
                    self._complete_and_claim(wanted)
                while self.buffer and len(self.running) < self.settings.concurrency:
                    attempt = self.buffer.popleft()
                    self.running[attempt.id] = attempt
                    pool.submit(attempt)
            # Finished jobs ride on the next claim; when none came in time, write them alone.
            if (
                self.finished
                and time.monotonic() >= self.first_finished_at + COMPLETION_FLUSH_SECONDS
            ):
                self._flush_completions()

            if not self.running and not self.buffer:
                self._flush_completions()
                out_of_time = stopping or self.budget.exhausted(self.settings.reserve_seconds)
                return "budget" if out_of_time else "empty"
            if stopping and self.budget.remaining() <= FINAL_MARGIN_SECONDS:
                self._flush_completions()
                log.warning(
                    "deadline reached with jobs still running; their leases end now",
                    extra={"running": sorted(self.running)},
                )
                return "budget"

            now = time.monotonic()
            wake_at = next_heartbeat
            if self.finished:
                wake_at = min(wake_at, self.first_finished_at + COMPLETION_FLUSH_SECONDS)
            # Wake in time to stop claiming (at the reserve) or to answer (the final margin):
            # a job that outlasts the budget must not hold the run past its deadline.
            margin = FINAL_MARGIN_SECONDS if stopping else self.settings.reserve_seconds
            wake_at = min(wake_at, now + self.budget.remaining() - margin)
            self._collect(pool, max(0.0, wake_at - now))

            now = time.monotonic()
            if now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + interval

    def _cap(self) -> float | None:
        """The longest a lease may run: to the run's deadline, never past it."""
        return self.budget.remaining() if self.settings.cap_lease_at_deadline else None

    def _reclaim(self) -> None:
        reclaimed = self._db(store.job_reclaim_expired, self.settings.reclaim_limit)
        for job in reclaimed:
            log.warning(
                "reclaimed a job whose lease expired",
                extra={"job_id": job.id, "status": job.status, "reclaims": job.reclaim_count},
            )
        self._count("reclaimed", len(reclaimed))

    def _complete_and_claim(self, limit: int) -> bool:
        """One round trip: record the finished jobs, claim up to `limit` more."""
        finished, self.finished = self.finished, []
        result, claimed = self._db(
            store.job_complete_and_claim,
            [a.held for a in finished],
            self.queues,
            limit,
            self.worker_id,
            self.settings.lease_seconds,
            self._cap(),
        )
        self._record_completions(result)
        self.buffer.extend(claimed)
        self._count("claimed", len(claimed))
        if claimed and self.budget.exhausted(self.settings.reserve_seconds):
            # The claim itself took the time that was left (a slow or resuming database):
            # give the jobs back unstarted rather than start what cannot finish.
            self._release_buffer()
        return bool(claimed)

    def _flush_completions(self) -> None:
        if self.finished:
            finished, self.finished = self.finished, []
            self._record_completions(self._db(store.job_complete_many, [a.held for a in finished]))

    def _record_completions(self, result: store.Fenced) -> None:
        self._count("done", len(result.applied))
        for job_id in result.lost:
            self._lease_lost(job_id, "its result was not recorded")

    def _run_job(self, claimed: store.ClaimedJob) -> None:
        """In a worker thread: look up the function and call it. No database access here."""
        function = self.registry.function_for(claimed.kind)
        function(
            Job(
                id=claimed.id,
                kind=claimed.kind,
                queue=claimed.queue,
                payload=claimed.payload,
                attempt=claimed.attempt,
                max_attempts=claimed.max_attempts,
                attempt_token=claimed.attempt_token,
                _remaining=self.budget.remaining,
                _lost_tokens=self.lost_tokens,
            )
        )

    def _collect(self, pool: WorkerPool[store.ClaimedJob], wait: float) -> None:
        """Wait up to `wait` seconds for an outcome and take all that are ready. Successes wait
        in self.finished for the next round trip (at most COMPLETION_FLUSH_SECONDS); failures
        are recorded at once."""
        try:
            outcome = pool.outcomes.get(timeout=wait) if wait > 0 else pool.outcomes.get_nowait()
        except queue_mod.Empty:
            return
        while True:
            self.running.pop(outcome.item.id, None)
            if outcome.error is None:
                if not self.finished:
                    self.first_finished_at = time.monotonic()
                self.finished.append(outcome.item)
            else:
                self._fail(outcome.item, outcome.error)
            try:
                outcome = pool.outcomes.get_nowait()
            except queue_mod.Empty:
                return

    def _fail(self, claimed: store.ClaimedJob, error: BaseException) -> None:
        message = _error_text(error)
        permanent = isinstance(error, UnknownJobKind)
        delay = 0.0 if permanent else retry.backoff_seconds(claimed.attempt)
        if permanent:
            message = f"{message} (not retried: register the kind, then `pgdrain retry`)"
        outcome = self._db(store.job_fail, claimed.held, message, delay, permanent)
        if isinstance(outcome, store.LeaseLost):
            self._lease_lost(claimed.id, "its failure was not recorded")
            return
        final = outcome.status == "failed"
        self._count("failed" if final else "retried", 1)
        log.warning(
            "job failed" if final else "job will be retried",
            extra={
                "job_id": claimed.id,
                "kind": claimed.kind,
                "attempt": claimed.attempt,
                "max_attempts": claimed.max_attempts,
                "error_type": type(error).__name__,
                "retry_in_s": None if final else round(delay, 1),
            },
        )

    def _heartbeat(self) -> None:
        if not self.settings.heartbeat:
            return
        # Finished jobs waiting for their completion to be written are still ours to keep.
        held = [a.held for a in (*self.running.values(), *self.buffer, *self.finished)]
        if not held:
            return
        result = self._db(store.job_extend_leases, held, self.settings.lease_seconds, self._cap())
        if not result.lost:
            return
        for attempt in list(self.buffer):
            if attempt.id in result.lost:
                self.buffer.remove(attempt)  # never start a job we no longer own
        for job_id in result.lost:
            if job_id in self.running:
                self.lost_tokens.add(self.running[job_id].attempt_token)
            self._lease_lost(job_id, "found by the heartbeat")

    def _release_buffer(self) -> None:
        held = [a.held for a in self.buffer]
        self.buffer.clear()
        result = self._db(store.job_release_many, held)
        self._count("released", len(result.applied))
        for job_id in result.lost:
            self._lease_lost(job_id, "while releasing it")

    # -- helpers -------------------------------------------------------------------------

    def _lease_lost(self, job_id: int, how: str) -> None:
        log.warning(
            "lease lost: another attempt may own this job; %s",
            how,
            extra={"job_id": job_id, "worker": self.worker_id},
        )
        if job_id not in self.lost_ids:
            self.lost_ids.add(job_id)
            self._count("lease_lost", 1)

    def _count(self, name: str, n: int) -> None:
        if n:
            self.counts[name] += n
            if self.observer is not None:
                self.observer(name, n)

    def _where(self) -> dict[str, Any]:
        return {"worker": self.worker_id, "remaining_s": round(self.budget.remaining(), 2)}

    def _db(self, operation: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a queue operation; if the connection broke (a restart, a failover), reconnect
        within the budget and try once more. Every statement is fenced or idempotent, so a
        repeat cannot overwrite another attempt's work."""
        assert self.conn is not None
        try:
            return operation(self.conn, *args, **kwargs)
        except psycopg.OperationalError as exc:
            if not self.conn.closed and not self.conn.broken:
                raise
            log.warning("database connection lost; reconnecting", extra={"reason": _one_line(exc)})
            self.conn = db.connect(self.conninfo, self.settings, self.budget)
            return operation(self.conn, *args, **kwargs)


def _error_kind(exc: BaseException) -> str:
    if isinstance(exc, AuthenticationFailed):
        return "authentication"
    if isinstance(exc, DatabaseUnavailable):
        return "unavailable"
    return "database"


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text[:MAX_ERROR_LENGTH]


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, psycopg.Error):
        return db.describe(exc)
    if isinstance(exc, DatabaseUnavailable):
        return str(exc)
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
