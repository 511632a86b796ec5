"""The control plane inside one run (drain()'s RunHooks): register the run once connected,
fan out after round trips (fanout.py), and before exiting on an empty claim, the trailing edge
of kicks and the wake-up (wake.py).

Trailing-edge kicks. The invariant: every enqueue followed by kick() is followed by a run that
claims after that enqueue committed. kick() invokes at most once per debounce window and
records every request (pgdrain.kicks.requested_at). A run about to exit locks its queues' kick
rows and, in the same transaction, looks for a ready job (SKIP LOCKED) and for a kick whose
transaction started after its own; either means drain again. Otherwise it clears the debounce
(the next kick invokes) and unregisters before the rows are unlocked. So a kick suppressed
while this run is active lands either before the check (its job is seen, or the kick is
newer than the check's snapshot) or after the exit (it invokes): none falls in between."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pgdrain import store
from pgdrain.aws import events
from pgdrain.aws.fanout import Spawner
from pgdrain.aws.wake import WakeOutcome, Waker
from pgdrain.budget import Budget
from pgdrain.session import Session
from pgdrain.summary import Counter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExitDecision:
    again: bool
    check: store.ExitCheck


class RunControl:
    """drain()'s hooks for one run. `trailing_edge=False` is the leading-edge debounce of
    before, kept only for the test that shows the kick it loses; `before_exit_check` lets a
    test hold the run between its last empty claim and its exit."""

    def __init__(
        self,
        trigger: events.Trigger,
        run_id: str,
        budget: Budget,
        *,
        waker: Waker,
        spawner: Spawner | None = None,
        queue_limits: tuple[tuple[str, int], ...] = (),
        trailing_edge: bool = True,
        before_exit_check: Callable[[], None] | None = None,
        next_periodic_slot: Callable[[], dt.datetime | None] = lambda: None,
    ) -> None:
        self.trigger = trigger
        self.run_id = run_id
        self._budget = budget
        self._waker = waker
        self._spawner = spawner
        self._queue_limits = tuple((q, n) for q, n in queue_limits if q in trigger.queues)
        self._trailing_edge = trailing_edge
        self._before_exit_check = before_exit_check
        self._next_periodic_slot = next_periodic_slot
        self.wake = WakeOutcome(None, "none")
        self.drained_again = 0

    def after_connect(self, session: Session) -> None:
        session.run(
            store.run_register,
            self.run_id,
            self.trigger.queues,
            self.trigger.chain,
            self._budget.remaining(),
        )
        # Limits configured here are written by every run; a limit removed from the setting is
        # dropped by the next scheduled run (housekeeping), which costs the others nothing.
        if self._queue_limits or self.trigger.reason == "schedule":
            session.run(store.queue_limit_sync, self.trigger.queues, self._queue_limits)

    def after_round_trip(
        self, session: Session, counts: Mapping[Counter, int], elapsed_s: float
    ) -> None:
        if self._spawner is not None:
            self._spawner.after_round_trip(session, counts, elapsed_s)

    def before_exit(self, session: Session) -> bool:
        if self._before_exit_check is not None:
            self._before_exit_check()
        decision = session.run(self._exit_or_again, True)
        if decision.again:
            self.drained_again += 1
            log.info(
                "a kick or a ready job arrived after the last claim: draining again",
                extra={"kicked": decision.check.kicked, "ready": decision.check.ready},
            )
            return True
        due_at = self._with_periodic_slot(decision.check.due_at)
        self.wake = self._waker.ensure(session, self.trigger.queues, due_at, self.run_id)
        return False

    def after_budget(self, session: Session, continued: bool) -> None:
        """A run that stopped for time, on a short connection of its own after the drain: it
        exits the same way (the kick window cleared, unregistered) and makes sure of the
        wake-up for work due later. Ready work is the continuation's; when there is none (the
        hop limit), a wake-up at the next step starts a new chain (a schedule is not a Lambda
        hop) instead of leaving the work to the hourly safety net."""
        decision = session.run(self._exit_or_again, False)
        due_at = decision.check.due_at
        if decision.check.ready and not continued:
            now = dt.datetime.now(dt.UTC)
            due_at = now if due_at is None else min(due_at, now)
        due_at = self._with_periodic_slot(due_at)
        self.wake = self._waker.ensure(session, self.trigger.queues, due_at, self.run_id)

    def _with_periodic_slot(self, due_at: dt.datetime | None) -> dt.datetime | None:
        """The earlier of the queues' next due moment and the next slot of a periodic kind:
        a run at that slot enqueues its job (periodic.enqueue_due) and drains it, so periodic
        work needs no schedule of its own and the database sleeps between slots."""
        slot = self._next_periodic_slot()
        if slot is None:
            return due_at
        return slot if due_at is None else min(due_at, slot)

    def _exit_or_again(self, conn: store.Connection, may_drain_again: bool) -> ExitDecision:
        # One short transaction: the kick rows stay locked from the check to the exit, so no
        # kick can be suppressed in between. Repeating it (after a reconnect) is safe: the
        # check only reads, and the exit clears and deletes what is already cleared or gone.
        with conn.transaction():
            check = store.run_exit_check(conn, self.trigger.queues)
            again = may_drain_again and self._trailing_edge and (check.kicked or check.ready)
            if not again and self._trailing_edge:
                store.run_exit(conn, self.run_id, self.trigger.queues)
            elif not again:
                store.run_unregister(conn, self.run_id)
        return ExitDecision(again, check)

    def summary(self) -> dict[str, Any]:
        spawned = [] if self._spawner is None else self._spawner.spawned
        return {**self.wake.as_dict(), "spawned": len(spawned), "drained_again": self.drained_again}
