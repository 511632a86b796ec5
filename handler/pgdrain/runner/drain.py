"""One drain run: reclaim expired leases, claim batches until nothing is ready, run the job
functions on a worker pool, heartbeat every lease/3, and stop in time for the deadline.

Only the run's loop talks to the database, and every statement commits at once in a short
transaction of its own (READ COMMITTED, its statement and lock timeouts bounded by the budget
left: db/session.py): no transaction is open while a job runs, and no session state is used, so
the same SQL works through PgBouncer in transaction mode. Worker threads never touch the
database; their outcomes come back on a queue. At concurrency 1 the loop runs on a thread of
its own and runs the job there itself; the calling thread does the loop's duties while the job
runs, never both at once (loop_thread.py).

The pieces, each in its own module of runner/: attempts.py (what the run holds), reclaim.py
(expired leases, at the start), limits.py (a limit's drifted count, at the start), claiming.py
(claims, with prefetch.py and pipelining.py), completer.py (every outcome written),
heartbeat.py, deadline.py, stop.py (when the run stops claiming: the reserve or a stop
request, and its grace), summary.py (counters and the result), execute.py (calling a job's
function), worker_threads.py, loop_thread.py; and db/session.py, the one connection."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, TypedDict, Unpack

import psycopg

from pgdrain.api import periodic
from pgdrain.api.registry import Registry
from pgdrain.budget import Budget
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.connection import one_line
from pgdrain.db.session import Session
from pgdrain.errors import PgdrainError
from pgdrain.runner import execute
from pgdrain.runner import stop as stop_module
from pgdrain.runner.abandoned import ThreadWatch, warn_of_stale_threads
from pgdrain.runner.attempts import Attempts, RunState
from pgdrain.runner.claiming import Claims, claim_and_start, claim_size
from pgdrain.runner.completer import COMPLETION_FLUSH_SECONDS, Completer, record_outcomes
from pgdrain.runner.deadline import Deadline
from pgdrain.runner.heartbeat import Heartbeat
from pgdrain.runner.limits import LimitRecount, send_configured_limits
from pgdrain.runner.loop_thread import GivenUp, LoopThread, OneSlot
from pgdrain.runner.prefetch import Prefetch
from pgdrain.runner.stop import Stopping, StopRequest
from pgdrain.runner.summary import (
    UNSERVED_COUNT_BOUND,
    Counter,
    Counters,
    DrainResult,
    Ending,
    Observer,
    StopReason,
    error_kind,
)
from pgdrain.runner.worker_threads import Outcome, WorkerPool
from pgdrain.settings import Settings

__all__ = [
    "DrainResult",
    "Observer",
    "RunHooks",
    "StopRequest",
    "default_worker_id",
    "drain",
    "drain_with",
]

log = logging.getLogger(__name__)


class RunHooks(Protocol):
    """What the control plane (pgdrain.aws.control) does inside a run, on the run's one
    connection: register the run once connected (False: it is not admitted, and claims
    nothing), decide on fan-out after each claim, and before exiting on an empty claim say
    whether to drain again (a kick it may have missed)."""

    def after_connect(self, session: Session) -> bool: ...

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None: ...

    def before_exit(self, session: Session) -> bool: ...


class _Standalone:
    """A run of its own (no control plane): it writes its queue limits, nothing more."""

    def __init__(self, settings: Settings, queues: Sequence[str] | None) -> None:
        self._settings = settings
        self._queues = queues

    def after_connect(self, session: Session) -> bool:
        send_configured_limits(session, self._settings, self._queues)
        return True

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None:
        pass

    def before_exit(self, session: Session) -> bool:
        return False


class _Pool(Protocol):
    """Where a run's jobs run: worker threads (worker_threads.py), or at concurrency 1 the
    loop's own thread (loop_thread.py)."""

    def submit(self, item: store.ClaimedJob) -> None: ...

    def take(self, wait: float) -> Iterable[Outcome[store.ClaimedJob]]: ...

    def take_back(self) -> list[store.ClaimedJob]: ...

    def wake(self) -> None: ...

    def close(self) -> None: ...


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class RunOptions(TypedDict, total=False):
    """drain()'s keyword arguments, as drain_with() passes them on."""

    queues: Sequence[str] | None
    worker_id: str | None
    observer: Observer | None
    hooks: RunHooks | None
    stop: StopRequest | None


def drain(
    settings: Settings,
    budget: Budget,
    registry: Registry,
    conninfo: str,
    *,
    queues: Sequence[str] | None = None,
    worker_id: str | None = None,
    observer: Observer | None = None,
    hooks: RunHooks | None = None,
    stop: StopRequest | None = None,
) -> DrainResult:
    """Run until no job is ready and none is running, until the budget is spent, or until
    `stop` is requested."""
    options = RunOptions(
        queues=queues, worker_id=worker_id, observer=observer, hooks=hooks, stop=stop
    )
    return drain_with(ALL_ON, settings, budget, registry, conninfo, **options)


def drain_with(
    controls: Controls,
    settings: Settings,
    budget: Budget,
    registry: Registry,
    conninfo: str,
    **options: Unpack[RunOptions],
) -> DrainResult:
    """`drain` with some of its mechanisms switched off: for tests' controls and benchmarks
    only (pgdrain.controls)."""
    queues, worker_id, stop = options.get("queues"), options.get("worker_id"), options.get("stop")
    served = settings.queues if queues is None else tuple(queues)
    hooks = options.get("hooks")
    return _Run(
        settings,
        budget,
        registry,
        conninfo,
        queues=served,
        worker_id=worker_id or default_worker_id(),
        observer=options.get("observer"),
        controls=controls,
        hooks=hooks or _Standalone(settings, served),
        stop=stop or stop_module.current() or StopRequest(),
    ).execute()


# ONE_SLOT: at concurrency 1 nothing else can happen until the job has run (the next claim
# waits for its slot), so the loop hands a claimed job over just before it waits for the
# outcome, not as soon as the claim's reply is in: take() then runs it on the loop's own
# thread (loop_thread.py, docs/decisions/0003). Until then the job is unstarted, as a
# prefetched one is: it holds its slot, its lease is kept, and a stop or the reserve
# releases it.


def _session(
    conninfo: str, settings: Settings, budget: Budget, controls: Controls, attempts: Attempts
) -> Session:
    """The run's connection."""
    return Session(
        conninfo,
        settings,
        budget,
        lease_seconds_left=lambda: attempts.lease_seconds_left(settings.lease_seconds),
        pipelining=controls.pipelining,
        controls=controls,
    )


def _claims(
    state: RunState,
    settings: Settings,
    controls: Controls,
    queues: tuple[str, ...] | None,
    completer: Completer,
) -> Claims:
    """The run's claims."""
    return Claims(
        state,
        queues=queues,
        lease_seconds=settings.lease_seconds,
        keep_done=settings.keeps_done,
        reclaim_limit=settings.reclaim_limit,
        prefetch=Prefetch(settings.batch_size, settings.concurrency, controls=controls),
        completer=completer,
        controls=controls,
    )


def drained_periodics(
    registry: Registry, queues: tuple[str, ...] | None, controls: Controls
) -> tuple[periodic.Periodic, ...]:
    """The periodic kinds a run enqueues: those of the queues it drains. A slot of a queue it
    does not drain would wait for a run that never comes (or another deployment's run, which
    enqueues it itself)."""
    if not controls.periodics_of_drained_queues:
        return registry.periodics
    return periodic.of_queues(registry.periodics, queues)


class _Run:
    def __init__(
        self,
        settings: Settings,
        budget: Budget,
        registry: Registry,
        conninfo: str,
        *,
        queues: tuple[str, ...] | None,
        worker_id: str,
        observer: Observer | None,
        controls: Controls,
        hooks: RunHooks,
        stop: StopRequest,
    ) -> None:
        self.settings = settings
        self.controls = controls
        self.hooks = hooks
        self.registry = registry
        self.queues = queues
        self.worker_id = worker_id
        self.started = time.monotonic()
        self.counters = Counters(observer)
        self.attempts = Attempts(settings.lease_seconds, controls.tell_jobs_of_a_lapsed_lease)
        self.deadline = Deadline(budget, settings.reserve_seconds, controls=controls)
        self.stopping = Stopping(stop, self.deadline, worker_id)
        self.session = _session(conninfo, settings, budget, controls, self.attempts)
        self.session.on_reconnect(lambda: self.heartbeat.due_now())
        state = RunState(self.session, self.attempts, self.deadline, self.counters, worker_id)
        self.completer = Completer(state, keep_done=settings.keeps_done, controls=controls)
        self.claims = _claims(state, settings, controls, queues, self.completer)
        self.heartbeat = Heartbeat(state, lease_seconds=settings.lease_seconds, controls=controls)
        self.limits = LimitRecount(self.session, queues, controls=controls)
        self.threads = ThreadWatch(controls=controls)

    def execute(self) -> DrainResult:
        stale = warn_of_stale_threads(self.worker_id)
        if self.settings.concurrency == 1 and self.controls.job_on_loop_thread:
            ending = _OnOneThread(self).execute()
        else:
            ending = _on_worker_threads(self)
        running, elapsed_s = len(self.attempts.running), time.monotonic() - self.started
        result = self.counters.result(
            ending, abandoned=running, stale_threads=stale, elapsed_s=elapsed_s
        )
        log.info("drain finished", extra={"summary": result.as_dict()})
        return result

    def drain(self, pool: _Pool) -> Ending:
        try:
            self.session.open()
            if not self.hooks.after_connect(self.session):
                return Ending("at_cap")  # not admitted (PGDRAIN_MAX_RUNS): claims nothing
            # Go with the first claim, in its round trip (and the registration before them).
            self.claims.reclaim.send_with_next()
            self.limits.send_with_next()
            # Due slots of periodic kinds, once each (idempotency keys).
            if periodics := drained_periodics(self.registry, self.queues, self.controls):
                self.session.run(periodic.enqueue_due, periodics)
            stop_reason = self._loop(pool)
            self.claims.reclaim.finish()  # a run that never claimed still reclaims
            self.limits.finish()
            return self.ending(stop_reason)
        except (PgdrainError, psycopg.Error) as exc:
            return _failed(exc, self.worker_id)

    def ending(self, stop_reason: StopReason) -> Ending:
        """How the run ends (not an error), with the queues it leaves: unserved, or paused."""
        self.completer.say_lost()
        ready = stop_reason == "budget" and self.session.run(store.queue_has_ready, self.queues)
        unserved = () if stop_reason == "stopped" else _unserved(self.session, self.queues)
        return Ending(stop_reason, ready, unserved=unserved, paused=self.claims.paused_untaken())

    def let_go(self, pool: _Pool) -> None:
        """The run ends: nothing it holds will run after it."""
        self.attempts.take_back()  # never run after the run; their leases end
        self.threads.give_up(self.attempts.running, self.attempts.lost_tokens)
        self.counters.say_lost({}, self.worker_id)  # an error ended it: why is not read
        pool.close()
        self.session.close()

    def _loop(self, pool: _Pool) -> StopReason:
        attempts, claims, completer = self.attempts, self.claims, self.completer
        stopping = self.stopping
        start_when_waiting = self.settings.concurrency == 1  # ONE_SLOT, above
        self.heartbeat.start()
        stopping.check_budget_at_start()
        while True:
            claimed = full = False
            if stopping.may_claim(running=len(attempts.running)):
                claimed, full = claim_and_start(
                    claims, attempts, pool.submit, self.settings, start_now=not start_when_waiting
                )
                if claimed:
                    elapsed = time.monotonic() - self.started
                    self.hooks.after_round_trip(self.session, dict(self.counters.values), elapsed)
            else:
                completer.release_unstarted()  # those waiting in the pool for a thread too
            # Finished jobs ride on the next claim; when none came in time, write them alone.
            if completer.completion_due():
                completer.flush()

            if not attempts.busy() and not claims.pipelined.count():
                completer.flush()
                reason = stopping.reason_when_idle()
                if reason is None and _claim_again(self):
                    continue  # jobs made ready, or a kick, that the last claim may have missed
                return reason or "empty"
            ending_now = self.must_end_with_jobs_running()
            if ending_now is not None:
                return ending_now

            # A full claim and prefetch, or a claim on the wire: the next claim goes out (or
            # the one on the wire is read) at once.
            ahead = claims.pipelined.count() or (
                full and claim_size(claims, attempts, self.settings)
            )
            wait = 0.0 if ahead else self._seconds_to_wait()
            if start_when_waiting:
                attempts.start_free(pool.submit, 1)
            record_outcomes(completer, attempts, claims.prefetch, pool.take(wait))
            self.heartbeat.beat_if_due()

    def must_end_with_jobs_running(self) -> StopReason | None:
        """The run ends now with jobs still running: a stop's grace is over, or the deadline's
        final margin is reached. What is finished is recorded first."""
        if self.stopping.grace_over():
            self.completer.flush()
            self.heartbeat.end_running_leases()
            return "stopped"
        if self.stopping.at_final_margin():
            self.completer.flush()
            log.warning(
                "deadline reached with jobs still running; their leases end now",
                extra={"running": sorted(h.id for h in self.attempts.running)},
            )
            return "budget"
        return None

    def _seconds_to_wait(self) -> float:
        """Until the next thing the loop must do: a heartbeat, a due completion write, a
        deadline (or grace) check, or a claim for slots about to free."""
        now = time.monotonic()
        wake_at = min(self.heartbeat.next_at, self.stopping.next_check_at(now))
        if self.attempts.finished:
            wake_at = min(wake_at, self.attempts.first_finished_at + COMPLETION_FLUSH_SECONDS)
        wake_at = min(
            wake_at, self.claims.prefetch.wake_at(self.attempts.running_since.values(), now)
        )
        return max(0.0, wake_at - now)

    def run_job(self, claimed: store.ClaimedJob) -> None:
        """In a worker thread: call the job's function, watched in case the run gives up."""
        self.attempts.started(claimed.held)
        self.threads.run(
            claimed.held,
            lambda: execute.run_job(
                self.registry, claimed, self.deadline.remaining, *self.attempts.job_view()
            ),
        )


def _claim_again(run: _Run) -> bool:
    """Whether an idle run claims once more before it ends: a completion made jobs ready that
    the claim in its statement could not see (one snapshot), or the control plane saw a kick."""
    return run.session.take_made_ready() or run.hooks.before_exit(run.session)


def _unserved(session: Session, queues: tuple[str, ...] | None) -> tuple[tuple[str, int], ...]:
    """A run restricted to some queues: the others with jobs ready, and how many."""
    if queues is None:
        return ()
    return tuple(session.run(store.queue_ready_elsewhere, queues, UNSERVED_COUNT_BOUND))


def _failed(exc: PgdrainError | psycopg.Error, worker_id: str) -> Ending:
    error = one_line(exc)
    log.error("drain stopped: %s", error, extra={"worker": worker_id})
    return Ending("error", error=error, error_kind=error_kind(exc))


def _use(run: _Run, pool: _Pool) -> None:
    """`pool` runs the run's jobs: what waits in it is taken back, a stop request wakes it."""
    take_back_waiting = run.controls.take_back_waiting_jobs
    run.attempts.take_back_with(pool.take_back if take_back_waiting else lambda: [])
    run.stopping.request.on_request(pool.wake)


def _on_worker_threads(run: _Run) -> Ending:
    """The jobs on a pool of worker threads; the loop on the calling thread."""
    pool: WorkerPool[store.ClaimedJob] = WorkerPool(run.settings.concurrency, run.run_job)
    _use(run, pool)
    try:
        return run.drain(pool)
    finally:
        run.let_go(pool)


class _OnOneThread:
    """A run at concurrency 1: the loop and its jobs on a thread of their own, watched from
    the calling thread, which does the loop's duties while a job runs (loop_thread.py)."""

    def __init__(self, run: _Run) -> None:
        self.run = run

    def execute(self) -> Ending:
        run = self.run
        slot: OneSlot[store.ClaimedJob] = OneSlot(run.run_job, controls=run.controls)
        _use(run, slot)

        def drain_and_let_go() -> Ending:
            given_up = False
            try:
                return run.drain(slot)
            except GivenUp:
                given_up = True  # the calling thread let go of it all already
                raise
            finally:
                if not given_up:
                    run.let_go(slot)

        loop_thread = LoopThread(slot, drain_and_let_go)
        loop_thread.start()
        ending = loop_thread.watch(self._next_duty_at, self._duties, lambda: run.let_go(slot))
        assert ending is not None
        return ending

    def _duties(self) -> Ending | None:
        """From the calling thread while the loop's thread runs its job (the connection is
        idle): what the loop does on each pass while a job runs elsewhere. An ending when the
        run must end with the job still running."""
        run = self.run
        try:
            if not run.stopping.may_claim(running=len(run.attempts.running)):
                run.completer.release_unstarted()
            if run.completer.completion_due():
                run.completer.flush()
            stop_reason = run.must_end_with_jobs_running()
            if stop_reason is not None:
                return run.ending(stop_reason)
            run.heartbeat.beat_if_due()
            return None
        except (PgdrainError, psycopg.Error) as exc:
            return _failed(exc, run.worker_id)

    def _next_duty_at(self) -> float:
        """When the loop, were it free, would next have something to do while a job runs: a
        heartbeat, the reserve or the final margin, the end of a stop's grace."""
        return min(self.run.heartbeat.next_at, self.run.stopping.next_check_at(time.monotonic()))
