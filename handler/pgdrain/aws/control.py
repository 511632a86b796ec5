"""The control plane inside one run (drain()'s RunHooks): register the run once connected,
fan out after round trips (fanout.py), and before exiting on an empty claim, the trailing edge
of kicks and the wake-up (wake.py).

Registration. Each invocation registers in pgdrain.runs under an id of its own: its worker's
name (function:request id) and a random suffix, since async delivery is at least once and a
copy of an event may come with the same request id. A fan-out run takes up the place its
spawner reserved (the event's `run`) once (store.run_admit, under the fan-out gate); a copy of
its event, or a run that started after its reservation lapsed, drains only while fewer than
PGDRAIN_MAX_RUNS runs are live, and otherwise ends at once (stop reason "at_cap"). So neither
copy ends the other's registration, and the cap holds however often an event is delivered.

History. The statement that ends a run's registration (store.run_exit) also writes its line in
pgdrain.run_history: trigger, duration, counts (the drain's observer, wrapped by counting()),
stop reason. Keyed by run_id, so an exit sent again after a lost reply writes nothing more.

Trailing-edge kicks. The invariant: every enqueue followed by kick() is followed by a run that
claims after that enqueue committed. kick() invokes at most once per debounce window and
records every request (pgdrain.kicks.requested_at). A run about to exit locks its queues' kick
rows and, in the same transaction, looks for a ready job (SKIP LOCKED) and for a kick whose
transaction started after its own; either means drain again. Otherwise it clears the debounce
(the next kick invokes) and unregisters before the rows are unlocked. So a kick suppressed
while this run is active lands either before the check (its job is seen, or the kick is
newer than the check's snapshot) or after the exit (it invokes): none falls in between.

A burst is one invocation. While a run claims, it holds its queues' kicks (run_until, renewed
every half hold, a third of a lease): kick() invokes no other run for a job that this run's
exit check will see. And a run that finds nothing left does not exit while its queues were
kicked less than one debounce window ago (PGDRAIN_KICK_DEBOUNCE_SECONDS, at most
MAX_LINGER_SECONDS): it lingers, claiming again every eighth of the window, and exits once a
window has passed without a kick (or its budget nears the reserve). Kicks that come while it
lingers are suppressed (the window stays open: the run has not exited) and their jobs are
claimed by it, so an application that enqueues and kicks more slowly than a run drains does
not start one invocation per lull."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from pgdrain.api import periodic
from pgdrain.aws import events
from pgdrain.aws.fanout import Spawner
from pgdrain.aws.wake import WakeOutcome, Waker
from pgdrain.budget import Budget
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.session import Later, Session
from pgdrain.runner.limits import LimitRecount
from pgdrain.runner.summary import Counter
from pgdrain.settings import DEFAULT_MAX_RUNS

log = logging.getLogger(__name__)


LINGER_STEPS = 8  # a lingering run claims again this many times per debounce window
# A long debounce window (it may be set up to an hour) must not keep an idle run alive that long.
MAX_LINGER_SECONDS = 5.0


def linger_step(kick_age_s: float | None, window_s: float, time_left_s: float) -> float:
    """How long a run with nothing to claim waits before claiming again instead of exiting:
    0 (exit) once the latest kick of its queues is a window old, when its queues were never
    kicked, or when the wait would reach into the reserve (time_left_s: the budget left above
    it). Pure: the caller reads the kick's age from the database clock."""
    window_s = min(window_s, MAX_LINGER_SECONDS)
    if kick_age_s is None or window_s <= 0:
        return 0.0
    step = min(window_s - kick_age_s, window_s / LINGER_STEPS)
    if step <= 0 or step >= time_left_s:
        return 0.0
    return step


class ExitDecision(NamedTuple):
    again: bool
    check: store.ExitCheck
    linger_s: float = 0.0  # > 0: neither drain again now nor exit; claim again after this


class RunControl:
    """drain()'s hooks for one run, named `name` (its worker's id; its registration adds a
    suffix, so copies of one event never share it: run_id). `trailing_edge=False` is the
    leading-edge debounce of before, kept only for the test that shows the kick it loses;
    `before_exit_check` lets a test hold the run between its last empty claim and its exit;
    `controls` switches a mechanism off for a test's control (pgdrain.controls)."""

    def __init__(
        self,
        trigger: events.Trigger,
        name: str,
        budget: Budget,
        *,
        waker: Waker,
        spawner: Spawner | None = None,
        max_runs: int = DEFAULT_MAX_RUNS,
        queue_limits: tuple[tuple[str, int], ...] = (),
        queue_rates: tuple[tuple[str, int, int], ...] = (),
        trailing_edge: bool = True,
        linger_window_s: float = 0.0,
        reserve_seconds: float = 0.0,
        kick_hold_s: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        utc_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        before_exit_check: Callable[[], None] | None = None,
        periodics: Sequence[periodic.Periodic] = (),
        retention_batch: Callable[[], store.Statement[store.RetentionBatch] | None] = lambda: None,
        retention_limit_ms: int | None = None,
        done_kept: bool = True,
        controls: Controls = ALL_ON,
    ) -> None:
        self.trigger = trigger
        self._controls = controls
        if controls.register_each_invocation:
            self.run_id = f"{name}#{uuid.uuid4().hex[:12]}"
        else:  # as before: a copy of an event registers under the same id as the first
            self.run_id = trigger.run_id or name
        self._max_runs = max_runs
        self._budget = budget
        self._waker = waker
        self._spawner = spawner
        self._queue_limits = tuple(
            (q, n) for q, n in queue_limits if trigger.queues is None or q in trigger.queues
        )
        self._queue_rates = tuple(
            rate for rate in queue_rates if trigger.queues is None or rate[0] in trigger.queues
        )
        self._trailing_edge = trailing_edge
        self._linger_window_s = linger_window_s
        self._reserve_seconds = reserve_seconds
        self._sleep = sleep
        self._clock = clock
        self._kick_hold_s = kick_hold_s
        self._hold_renew_at = 0.0
        self._before_exit_check = before_exit_check
        # The periodic kinds whose slots this run wakes up for: those of the queues it drains,
        # the kinds its drain enqueues (runner/drain.py).
        if controls.periodics_of_drained_queues:
            periodics = periodic.of_queues(periodics, trigger.queues)
        self._periodics = periodic.EnqueuedSince(
            periodics, catch_up=controls.enqueue_slots_fallen_due, clock=utc_clock
        )
        self._retention_batch = retention_batch
        self._retention_limit_ms = retention_limit_ms
        self._done_kept = done_kept  # for its history line: Settings.keeps_done
        self._retention: Later[store.RetentionBatch] | None = None
        self._controls = controls
        self._exit_depth: Later[store.QueueDepth] | None = None
        self.wake = WakeOutcome(None, "none")
        self.drained_again = 0
        self.lingered = 0  # times the run waited for a burst's next kick instead of exiting
        # The run's counts as they grow (counting()), for the history line its exit writes.
        self.counts: dict[str, int] = {}
        self._counts_lock = threading.Lock()
        self._started = clock()

    def counting(self, observer: Callable[[str, int], None]) -> Callable[[str, int], None]:
        """The drain's observer: counts for the run's history line, then `observer`."""

        def observe(name: str, n: int) -> None:
            with self._counts_lock:  # whatever thread a count comes from
                self.counts[name] = self.counts.get(name, 0) + n
            observer(name, n)

        return observe

    def _counted(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self.counts)

    def _record(self, stop_reason: str, continued: bool = False) -> store.RunRecord:
        """The line the run's exit writes to pgdrain.run_history."""
        return store.RunRecord(
            trigger=self.trigger.reason,
            chain=self.trigger.chain,
            elapsed_s=self._clock() - self._started,
            stop_reason=stop_reason,
            counts=self._counted(),
            drained_again=self.drained_again,
            lingered=self.lingered,
            continued=continued,
            done_kept=self._done_kept,
        )

    def after_connect(self, session: Session) -> bool:
        reserved = self.trigger.run_id
        if reserved is not None and self._controls.register_each_invocation:
            # A fan-out run: in a round trip of its own, read before it claims anything. Safe
            # to repeat after a lost reply (store.run_admit).
            admitted = session.run(
                store.run_admit,
                self.run_id,
                reserved,
                self.trigger.queues,
                self.trigger.chain,
                self._budget.remaining(),
                self._max_runs,
                self._kick_hold_s,
            )
            if not admitted:
                log.warning(
                    "fan-out run not admitted: its reserved place is taken or lapsed (its event "
                    "delivered again, or started late) and PGDRAIN_MAX_RUNS runs are live; it "
                    "claims nothing",
                    extra={"reserved": reserved, "max_runs": self._max_runs},
                )
                return False
        else:
            # Sent with the drain's first statement (the reclaim), in its round trip: neither
            # result is read, and both are safe to repeat (session.send_with_next).
            session.send_with_next(
                store.run_register,
                self.run_id,
                self.trigger.queues,
                self.trigger.chain,
                self._budget.remaining(),
                self._kick_hold_s,
            )
        self._hold_renew_at = self._clock() + self._kick_hold_s / 2
        self._periodics.enqueued()  # the drain enqueues its due slots next (runner/drain.py)
        # Limits configured here are written by every run; a limit removed from the setting is
        # dropped by the next scheduled run (housekeeping), which costs the others nothing.
        if self._queue_limits or self._queue_rates or self.trigger.housekeeping:
            session.send_with_next(
                store.queue_limit_sync,
                self.trigger.queues,
                self._queue_limits,
                self._queue_rates,
            )
        return True

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None:
        self._renew_kick_hold(session)
        if self._spawner is not None:
            self._spawner.after_round_trip(session, counts, elapsed_s)

    def _renew_kick_hold(self, session: Session) -> None:
        """While it claims, the run holds its queues' kicks (kick() does not invoke another run
        for a job this run will see). Renewed at half the hold, so it never lapses while the
        run claims; a run busy with long jobs stops renewing, and kicks start more runs."""
        if self._kick_hold_s <= 0 or self._clock() < self._hold_renew_at:
            return
        hold = min(self._kick_hold_s, self._budget.remaining())
        session.run(store.kick_hold, self.trigger.queues, hold)
        self._hold_renew_at = self._clock() + self._kick_hold_s / 2

    def before_exit(self, session: Session) -> bool:
        if self._before_exit_check is not None:
            self._before_exit_check()
        if self._spawner is not None:
            self._spawner.settle(session)  # a run that failed to start leaves the cap first
        if self._retention is None:
            # The run's housekeeping, when it has any, goes with its exit, in its round trip
            # (before it, each in a transaction of its own): one batch of finished jobs past
            # their retention. Safe to repeat (a deleted row matches nothing), so harmless when
            # the run drains again instead of exiting.
            first_batch = self._retention_batch()
            if first_batch is not None:
                self._retention = session.read_with_next(first_batch, self._retention_limit_ms)
        # In the exit check's round trip too, each in a transaction of its own before it: a
        # limit whose count drifted high is recounted (the check then sees the slots it
        # freed), and the ready jobs the run leaves are counted (held back by a full limit).
        self._periodics.enqueue_fallen_due(session)
        limits = LimitRecount(session, self.trigger.queues, controls=self._controls)
        limits.send_with_next()
        if self._controls.count_ready_at_exit:
            self._exit_depth = session.read_with_next(
                store.queue_depth_held_statement(self.trigger.queues)
            )
        decision = session.run(self._exit_or_again, True)
        limits.report()
        if decision.again:
            self.drained_again += 1
            log.info(
                "a kick or a ready job arrived after the last claim: draining again",
                extra={"kicked": decision.check.kicked, "ready": decision.check.ready},
            )
            return True
        if decision.linger_s > 0:
            # Outside any transaction: lingering holds the connection, never a lock.
            self.lingered += 1
            self._sleep(decision.linger_s)
            return True
        due_at = self._with_periodic_slot(decision.check.due_at)
        self.wake = self._waker.ensure(session, due_at, self.run_id)
        return False

    @property
    def exit_depth(self) -> store.QueueDepth | None:
        """The ready jobs left in the run's queues, counted with its last exit check: none
        unless a full limit holds them back (None when not counted)."""
        later = self._exit_depth
        return later.value() if later is not None and later.received else None

    @property
    def retention_deleted(self) -> store.RetentionBatch | None:
        """What the retention batch sent with the exit did (done, failed and run lines deleted,
        housekeeping due), if it was sent."""
        later = self._retention
        return later.value() if later is not None and later.received else None

    def after_budget(self, session: Session, continued: bool) -> None:
        """A run that stopped for time, on a short connection of its own after the drain: it
        exits the same way (the kick window cleared, unregistered) and makes sure of the
        wake-up for work due later. Ready work is the continuation's; when there is none (the
        hop limit), a wake-up at the next step starts a new chain (a schedule is not a Lambda
        hop) instead of leaving the work to the hourly safety net."""
        decision = session.run(self._exit_or_again, False, "budget", continued)
        due_at = decision.check.due_at
        # `kicked`: a kick this run held back (its window) committed after the check's snapshot:
        # its job is not counted ready, and no run was invoked for it.
        if (decision.check.ready or decision.check.kicked) and not continued:
            now = dt.datetime.now(dt.UTC)
            due_at = now if due_at is None else min(due_at, now)
        due_at = self._with_periodic_slot(due_at)
        self.wake = self._waker.ensure(session, due_at, self.run_id)

    def _with_periodic_slot(self, due_at: dt.datetime | None) -> dt.datetime | None:
        """The earlier of the queues' next due moment and the next slot of a periodic kind:
        a run at that slot enqueues its job (periodic.enqueue_due) and drains it, so periodic
        work needs no schedule of its own and the database sleeps between slots."""
        slot = self._periodics.next_slot()
        if slot is None:
            return due_at
        return slot if due_at is None else min(due_at, slot)

    @store.one_statement
    def _exit_or_again(
        self,
        conn: store.Connection,
        may_drain_again: bool,
        stop_reason: str = "empty",
        continued: bool = False,
    ) -> ExitDecision:
        # One statement (store.run_exit), so one round trip: the kick rows stay locked from the
        # check to the exit, so no kick can be suppressed in between, and SQL decides. Repeating
        # it (after a reconnect) is safe: the check only reads, and the exit clears and deletes
        # what is already cleared or gone, and writes no second history line. A lingering run
        # neither exits nor unregisters: it is still the run the open window is waiting on,
        # and a later check decides again.
        stays = may_drain_again and self._trailing_edge
        window = min(self._linger_window_s, MAX_LINGER_SECONDS) if stays else 0.0
        time_left = self._budget.remaining() - self._reserve_seconds
        if time_left <= window / LINGER_STEPS:
            window = 0.0  # no time left to linger in: exit
        check = store.run_exit(
            conn,
            self.run_id,
            self.trigger.queues,
            may_stay=stays,
            linger_window_s=window,
            clear_kicks=self._trailing_edge,
            record=self._record(stop_reason, continued),
        )
        if check.exited:
            return ExitDecision(False, check)
        if check.kicked or check.ready:
            return ExitDecision(True, check)
        # Stayed to linger: the latest kick is younger than the window.
        linger = linger_step(check.kick_age_s, window, time_left) or window / LINGER_STEPS
        return ExitDecision(False, check, linger)

    def close(self) -> None:
        """After the drain, before the handler returns: the fan-out invokes still under way end."""
        if self._spawner is not None:
            self._spawner.close()

    def summary(self) -> dict[str, Any]:
        spawned = [] if self._spawner is None else self._spawner.spawned
        return {
            **self.wake.as_dict(),
            "spawned": len(spawned),
            "drained_again": self.drained_again,
            "lingered": self.lingered,
        }
