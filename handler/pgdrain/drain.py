"""One drain run: reclaim expired leases, claim batches until nothing is ready, run the job
functions on a worker pool, heartbeat every lease/3, and stop in time for the deadline.

Only this thread talks to the database, and every statement commits at once in a short
transaction of its own (READ COMMITTED, its statement and lock timeouts bounded by the budget
left: session.py): no transaction is open while a job runs, and no session state is used, so
the same SQL works through PgBouncer in transaction mode. Workers never touch the database;
their outcomes come back on a queue.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from pgdrain import execute, periodic, store
from pgdrain import stop as stop_module
from pgdrain.abandoned import ThreadWatch, stale_threads
from pgdrain.attempts import Attempts, RunState
from pgdrain.budget import Budget
from pgdrain.claims import COMPLETION_FLUSH_SECONDS, Claims
from pgdrain.deadline import Deadline
from pgdrain.errors import PgdrainError
from pgdrain.heartbeat import Heartbeat
from pgdrain.pool import WorkerPool
from pgdrain.registry import Registry
from pgdrain.session import Session
from pgdrain.settings import Settings
from pgdrain.stop import StopRequest
from pgdrain.summary import (
    Counter,
    Counters,
    DrainResult,
    ErrorKind,
    Observer,
    StopReason,
    error_kind,
    one_line,
)

__all__ = [
    "DrainResult",
    "Observer",
    "RunHooks",
    "SafetySwitches",
    "StopRequest",
    "default_worker_id",
    "drain",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SafetySwitches:
    """Safety mechanisms, on in every real run. A test turns one off to show the failure it
    prevents; nothing else should."""

    heartbeat: bool = True
    cap_lease_at_deadline: bool = True
    limit_statements_to_budget: bool = True  # statement_timeout/lock_timeout per transaction
    pin_read_committed: bool = True
    mark_abandoned_lost: bool = True  # a job the run gives up on sees lease_lost() at once
    recover_lost_replies: bool = True  # a claim retried after a reconnect asks what it took
    reconnect_within_leases: bool = True  # a reconnect gives up before the leases it holds end


class RunHooks(Protocol):
    """What the control plane (pgdrain.aws.control) does inside a run, on the run's one
    connection: register the run once connected, decide on fan-out after each claim, and
    before exiting on an empty claim say whether to drain again (a kick it may have missed)."""

    def after_connect(self, session: Session) -> None: ...

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None: ...

    def before_exit(self, session: Session) -> bool: ...


class _NoHooks:
    def after_connect(self, session: Session) -> None:
        pass

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None:
        pass

    def before_exit(self, session: Session) -> bool:
        return False


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
    hooks: RunHooks | None = None,
    stop: StopRequest | None = None,
) -> DrainResult:
    """Run until no job is ready and none is running, until the budget is spent, or until
    `stop` is requested."""
    return _Run(
        settings,
        budget,
        registry,
        conninfo,
        queues=tuple(queues or settings.queues),
        worker_id=worker_id or default_worker_id(),
        observer=observer,
        switches=switches,
        hooks=hooks or _NoHooks(),
        stop=stop or stop_module.current() or StopRequest(),
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
        hooks: RunHooks,
        stop: StopRequest,
    ) -> None:
        self.settings = settings
        self.hooks = hooks
        self.stop = stop
        self.stop_until: float | None = None  # end of the grace once a stop was requested
        self.registry = registry
        self.queues = queues
        self.worker_id = worker_id
        self.started = time.monotonic()
        self.counters = Counters(observer)
        self.attempts = Attempts()
        self.deadline = Deadline(budget, settings.reserve_seconds, switches.cap_lease_at_deadline)
        self.session = Session(
            conninfo,
            settings,
            budget,
            limit_to_budget=switches.limit_statements_to_budget,
            read_committed=switches.pin_read_committed,
            lease_seconds_left=(lambda: self.attempts.lease_seconds_left(settings.lease_seconds))
            if switches.reconnect_within_leases
            else None,
            on_reconnect=lambda: self.heartbeat.due_now(),
        )
        state = RunState(self.session, self.attempts, self.deadline, self.counters, worker_id)
        self.claims = Claims(
            state,
            queues=queues,
            lease_seconds=settings.lease_seconds,
            reclaim_limit=settings.reclaim_limit,
            recover_lost_replies=switches.recover_lost_replies,
        )
        self.heartbeat = Heartbeat(
            state, lease_seconds=settings.lease_seconds, enabled=switches.heartbeat
        )
        # Refill once half the slots are free (or none is busy): short jobs still come in batches.
        self.refill_at = max(1, min(settings.concurrency, settings.batch_size) // 2)
        self.threads = ThreadWatch(enabled=switches.mark_abandoned_lost)

    def execute(self) -> DrainResult:
        stop_reason: StopReason = "empty"
        error: str | None = None
        kind: ErrorKind | None = None
        more_ready = False
        stale = stale_threads()
        if stale:
            log.warning(
                "job threads abandoned by earlier runs in this process are still running",
                extra={"stale_threads": stale, "worker": self.worker_id},
            )
        pool: WorkerPool[store.ClaimedJob] = WorkerPool(self.settings.concurrency, self._run_job)
        self.stop.on_request(pool.wake)
        try:
            self.session.open()
            self.hooks.after_connect(self.session)
            self.claims.reclaim_expired()
            # Due slots of periodic kinds, once each (idempotency keys): no statement when none.
            self.session.run(periodic.enqueue_due, self.registry.periodics)
            stop_reason = self._loop(pool)
            if stop_reason == "budget":
                more_ready = self.session.run(store.queue_has_ready, self.queues)
        except (PgdrainError, psycopg.Error) as exc:
            stop_reason, error, kind = "error", one_line(exc), error_kind(exc)
            log.error("drain stopped: %s", error, extra={"worker": self.worker_id})
        finally:
            self.threads.give_up(self.attempts.running, self.attempts.lost_tokens)
            pool.close()
            self.session.close()
        result = DrainResult(
            **self.counters.values,
            abandoned=len(self.attempts.running),
            stale_threads=stale,
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
        if deadline.below_reserve():
            # Say why nothing is claimed: a timeout set too close to the reserve, or a connect
            # that used the budget up, would otherwise look like an empty queue.
            log.warning(
                "budget of %.1f s left is below the reserve of %.1f s: nothing will be claimed",
                deadline.remaining(),
                deadline.reserve_seconds,
                extra=self._where(),
            )
            stopping = True
        while True:
            if self.stop.requested() and self.stop_until is None:
                self.stop_until = time.monotonic() + self.stop.grace_seconds
                stopping = True
                log.warning(
                    "%s: no more claims; running jobs get %.0f s to finish",
                    self.stop.signal_name,
                    self.stop.grace_seconds,
                    extra={"running": len(attempts.running), **self._where()},
                )
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
                    elapsed = time.monotonic() - self.started
                    self.hooks.after_round_trip(self.session, dict(self.counters.values), elapsed)
                while attempts.unstarted and len(attempts.running) < concurrency:
                    pool.submit(attempts.start_next())
            # Finished jobs ride on the next claim; when none came in time, write them alone.
            if claims.completion_due():
                claims.flush_completions()

            if not attempts.busy():
                claims.flush_completions()
                if self.stop_until is not None:
                    return "stopped"
                if stopping or deadline.below_reserve():
                    return "budget"
                if self.hooks.before_exit(self.session):
                    continue  # a kick came in that the last claim may have missed
                return "empty"
            if self.stop_until is not None and time.monotonic() >= self.stop_until:
                claims.flush_completions()
                claims.end_running_leases()
                return "stopped"
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
        if self.stop_until is not None:
            wake_at = min(wake_at, self.stop_until)
        return max(0.0, wake_at - now)

    def _run_job(self, claimed: store.ClaimedJob) -> None:
        """In a worker thread: call the job's function, watched in case the run gives up."""
        self.threads.run(
            claimed.held,
            lambda: execute.run_job(
                self.registry, claimed, self.deadline.remaining, self.attempts.lost_tokens
            ),
        )

    def _collect(self, pool: WorkerPool[store.ClaimedJob], wait: float) -> None:
        """Wait up to `wait` seconds for an outcome and take all that are ready. Successes wait
        for the next round trip (at most COMPLETION_FLUSH_SECONDS); failures are recorded at
        once."""
        try:
            outcome = pool.outcomes.get(timeout=wait) if wait > 0 else pool.outcomes.get_nowait()
        except queue_mod.Empty:
            return
        while True:
            if outcome is None:
                pass  # a wake-up: the loop looks at the stop request
            elif outcome.error is None:
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
