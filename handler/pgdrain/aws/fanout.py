"""Fan-out: a run that sees more ready work than it can finish in its budget starts more runs,
so a backlog drains on many Lambda invocations at once; PostgreSQL is the only coordinator.
So does a run whose ready work would keep it busy longer than PGDRAIN_FANOUT_SECONDS (10 s):
a backlog of 100 s of work that one run could finish in its 300 s drains on 10 runs in about
10 s for about the same billed duration (a spawned run's start is a small share of its work).

The decision, every FANOUT_INTERVAL_SECONDS once the run has measured its throughput (the first
as soon as MEASURE_JOBS_PER_SLOT jobs per worker slot have finished, or after
MIN_MEASURE_SECONDS at the latest: a backlog of short jobs starts its runs at once): when the
ready jobs exceed what this run finishes in its remaining seconds (its jobs per second x the
time left), the runs needed are this one plus enough full-budget runs for the rest; when they
exceed what it finishes within the horizon, enough runs to finish them within it. Runs are
counted in pgdrain.runs (a row past its deadline counts for nothing), and the reservation of
new runs serialises on the run_gate row lock, so the cap PGDRAIN_MAX_RUNS (each run holds one
connection) holds however many runs decide at once. A spawned run carries the hop count
(chain + 1): no chain reaches Lambda's recursive loop detection. Spawning happens inside a run,
after it has connected, so spawned runs never stampede a database that is still waking.

The invokes go out from a thread of their own, one after another. An invoke may take seconds
(a slow or throttled Lambda API: up to 2 tries of a 2 s connect and a 5 s read, lambda_api.py),
and the run's own thread keeps the leases of the jobs it holds alive: held there, the leases
would lapse and a spawned run would reclaim those jobs and run them again. Their outcomes are
taken up on the run's thread (`settle`), which unregisters a run that failed to start."""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pgdrain.aws import events
from pgdrain.budget import Budget
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.runner.summary import Counter
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

FANOUT_INTERVAL_SECONDS = 2.0
# The first decision: once this many jobs per worker slot have finished (each slot has gone
# round a few times: past the first claim and the threads' start), or after this long.
MEASURE_JOBS_PER_SLOT = 5
MIN_MEASURE_SECONDS = 1.0
# A spawned run's reservation counts this long until the run registers its own deadline.
SPAWN_RESERVE_SECONDS = 60.0
SPAWNED_METRIC = "RunsSpawned"
SPAWN_FAILED_METRIC = "SpawnFailed"

Invoke = Callable[[str, dict[str, Any]], None]


def runs_needed(
    ready: int,
    jobs_per_second: float,
    remaining_seconds: float,
    run_seconds: float,
    horizon_seconds: float = 0.0,
) -> int:
    """How many runs, this one included, finish `ready` jobs in time: within this run's
    remaining seconds, or within `horizon_seconds` when that is sooner (0: no horizon). Each
    run does as much per second as this one. Within the budget: this run does what its
    remaining seconds allow, and each new run (a full budget, run_seconds) the rest; within the
    horizon, every run its share. 1 when this run finishes alone."""
    within = remaining_seconds
    if 0 < horizon_seconds < remaining_seconds:
        within = horizon_seconds
    mine = jobs_per_second * within
    if ready <= mine:
        return 1
    if within < remaining_seconds:
        return math.ceil(ready / mine)
    per_run = jobs_per_second * max(run_seconds, remaining_seconds)
    if per_run <= 0:
        return 1
    return 1 + math.ceil((ready - mine) / per_run)


def useful_runs(settings: Settings, queues: tuple[str, ...] | None) -> int:
    """When every queue of the run has a concurrency limit (PGDRAIN_QUEUE_LIMITS), more runs
    than the limits' slots can fill would only find no free slot and exit. A run of every
    queue (None) may meet a queue without one."""
    limits = dict(settings.queue_limits)
    if not queues or any(q not in limits for q in queues):
        return settings.max_runs
    slots = sum(limits[q] for q in queues)
    return max(1, min(settings.max_runs, math.ceil(slots / settings.concurrency)))


class Spawner:
    def __init__(
        self,
        settings: Settings,
        trigger: events.Trigger,
        budget: Budget,
        target_arn: str | None,
        invoke: Invoke,
        *,
        count: Callable[[str, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        controls: Controls = ALL_ON,
    ) -> None:
        self._settings = settings
        self._trigger = trigger
        self._budget = budget
        self._target = target_arn
        self._invoke = invoke
        self._count = count or (lambda _name, _n: None)
        self._clock = clock
        self._next_check = clock() + MIN_MEASURE_SECONDS
        self._measured_after: float = MEASURE_JOBS_PER_SLOT * settings.concurrency  # finished
        # A spawned run gets a budget like this run's at its start (the function's timeout).
        self._run_seconds = budget.remaining() - settings.reserve_seconds
        self._useful_runs = useful_runs(settings, trigger.queues)
        self._off_the_run_thread = controls.invoke_off_the_run_thread
        self._invoker: ThreadPoolExecutor | None = None
        self._invoking: list[tuple[str, Future[None]]] = []
        self.spawned: list[str] = []  # the runs whose invoke succeeded

    @property
    def enabled(self) -> bool:
        return self._target is not None and self._trigger.chain + 1 <= self._settings.max_chain

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None:
        self.settle(session)
        finished = sum(counts.get(name, 0) for name in ("done", "retried", "failed", "cancelled"))
        due = self._clock() >= self._next_check or finished >= self._measured_after
        if not self.enabled or not due or elapsed_s <= 0:
            return
        self._next_check = self._clock() + FANOUT_INTERVAL_SECONDS
        self._measured_after = math.inf  # after the first decision, every interval
        rate = finished / elapsed_s
        remaining = self._budget.remaining() - self._settings.reserve_seconds
        if rate <= 0 or remaining <= 0:
            return
        max_runs = self._settings.max_runs
        # Counting past what max_runs runs can finish tells nothing more.
        per_run = max(self._run_seconds, remaining)
        limit = math.ceil(rate * (remaining + (max_runs - 1) * per_run)) + 1
        ready = session.run(store.queue_ready_count, self._trigger.queues, limit)
        needed = runs_needed(
            ready, rate, remaining, self._run_seconds, self._settings.fanout_seconds
        )
        needed = min(needed, self._useful_runs)
        if needed <= 1:
            return
        # One id for the decision: a repeat after a lost reply finds what it reserved.
        reserved = session.run(
            store.run_spawn,
            str(uuid.uuid4()),
            self._trigger.queues,
            self._trigger.chain + 1,
            needed,
            max_runs,
            SPAWN_RESERVE_SECONDS,
        )
        for run_id in reserved:
            self._start(run_id)
        if reserved:
            log.info(
                "fan-out: started runs",
                extra={"ready": ready, "jobs_per_s": round(rate, 1), "started": len(reserved)},
            )

    def _start(self, run_id: str) -> None:
        assert self._target is not None
        event = events.fanout_event(self._trigger.queues, self._trigger.chain + 1, run_id)
        if self._off_the_run_thread:
            if self._invoker is None:
                self._invoker = ThreadPoolExecutor(1, thread_name_prefix="pgdrain-fanout")
            future = self._invoker.submit(self._invoke, self._target, event)
        else:  # control: on the run's thread, which waits for it
            future = Future()
            try:
                self._invoke(self._target, event)
                future.set_result(None)
            except Exception as exc:
                future.set_exception(exc)
        self._invoking.append((run_id, future))

    def settle(self, session: Session | None) -> None:
        """Take up the invokes that ended: each counted, and a run that failed to start
        unregistered, so that its reservation holds no place in the cap (with no session, it
        counts until SPAWN_RESERVE_SECONDS pass). On the run's thread, which owns the session."""
        under_way: list[tuple[str, Future[None]]] = []
        for run_id, future in self._invoking:
            if not future.done():
                under_way.append((run_id, future))
                continue
            error = future.exception()
            if error is None:
                self.spawned.append(run_id)
                self._count(SPAWNED_METRIC, 1)
                continue
            # Any AWS failure: logged and counted, never fails the run.
            log.error("fan-out invoke failed", extra={"run": run_id, "error": str(error)})
            self._count(SPAWN_FAILED_METRIC, 1)
            if session is not None:
                # Safe to repeat: an unregistered run matches nothing.
                session.run(store.run_unregister, run_id)
        self._invoking = under_way

    def close(self) -> None:
        """Wait for the invokes under way, each bounded by the Lambda client's timeouts, and take
        them up: Lambda freezes a thread still running when the handler returns."""
        if self._invoker is not None:
            self._invoker.shutdown(wait=True)
            self._invoker = None
        self.settle(None)
