"""A kick's wake-up request ({"reason": "later"}): a delayed job was kicked while nothing in its
queue was ready, so a run now would only find nothing and keep a sleeping database awake for
its suspend delay. The kick has reserved the wake-up in pgdrain.wakes already; the function
takes up that reservation and creates the one-shot schedule, without a run.

Anyone who may invoke the function may send such an event, and a schedule outlives the access
that made it (each one later wakes the database). So a request creates a schedule only for a
wake-up the database holds under the kick's own id (a random one, sent only in the request),
due within the horizon (wake.WAKE_HORIZON_SECONDS) and on the precision (events.parse): a
request the database does not hold creates nothing and runs nothing (`refused`; a run's
earlier wake-up may have taken its place, and that run makes the next). Checking is one short
connection to a database the kick has just used.

When the schedule cannot be made (no scheduler configured here, the moment has come or is past
the horizon, the database cannot say, the creation failed), the request drops the kick's record
of the wake-up, and the invocation drains as a kicked run does: that run makes the wake-up
itself (or reports it, locally) when it ends."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from pgdrain.aws.events import Trigger
from pgdrain.aws.secrets import resolve_conninfo
from pgdrain.aws.wake import WAKE_HORIZON_SECONDS, WakeOutcome, Waker, queue_set
from pgdrain.budget import Budget
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import connection, store
from pgdrain.errors import PgdrainError
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

# A schedule cannot fire in the past: a request whose moment is this close is drained now.
MIN_LEAD_SECONDS = 1.0


def answer(
    trigger: Trigger,
    waker: Waker,
    drained: Sequence[str] | None,
    budget: Budget,
    *,
    controls: Controls = ALL_ON,
) -> dict[str, Any] | None:
    """The invocation's summary once the schedule exists (or the request is refused), or None:
    drain instead (after `forget`). The wake-up is for `drained`, every queue of the function,
    as a kicked run's is: a run that ends with the same work due names the same schedule,
    whose second creation is a ConflictException, and nothing runs twice."""
    assert trigger.wake_at is not None and trigger.reserved_by is not None
    now = dt.datetime.now(dt.UTC)
    if not waker.can_schedule or trigger.wake_at <= now + dt.timedelta(seconds=MIN_LEAD_SECONDS):
        return None
    queues = None if trigger.queues is None else list(trigger.queues)
    summary: dict[str, Any] = {"ok": True, "trigger": trigger.reason, "queues": queues}
    if controls.check_wake_requests:
        settings = waker.settings
        horizon = WAKE_HORIZON_SECONDS + settings.wake_precision_seconds  # a kick rounds up
        if trigger.wake_at > now + dt.timedelta(seconds=horizon):
            log.warning(
                "wake-up request past the horizon: no schedule; draining instead",
                extra={"wake_at": trigger.wake_at.isoformat()},
            )
            return None
        recorded = _confirmed(trigger, settings, budget, horizon)
        if recorded is None:
            return None
        if not recorded:
            refused = WakeOutcome(trigger.wake_at, "refused")
            log.warning(
                "wake-up request not recorded in pgdrain.wakes (an earlier wake-up took its "
                "place, or no kick sent it): no schedule, no run",
                extra={**refused.as_dict(), "reserved_by": trigger.reserved_by},
            )
            return summary | refused.as_dict()
    outcome = waker.ensure_without_database(drained, trigger.wake_at)
    if outcome.action == "failed":
        return None
    summary |= outcome.as_dict()
    log.info("wake-up request answered; no run now", extra=outcome.as_dict())
    return summary


def _confirmed(trigger: Trigger, settings: Settings, budget: Budget, horizon: float) -> bool | None:
    """Whether pgdrain.wakes holds the request's wake-up under its kick's id, now taken up as
    created (None: the database could not say; the drain that follows reports why)."""
    assert trigger.wake_at is not None and trigger.reserved_by is not None
    try:
        conninfo = resolve_conninfo(settings)
        with connection.connect(conninfo, settings, budget) as conn:
            key = queue_set(trigger.queues)
            return store.wake_confirm(conn, key, trigger.wake_at, trigger.reserved_by, horizon)
    except (PgdrainError, psycopg.Error) as exc:
        log.warning("could not check the wake-up request against pgdrain.wakes: %s", exc)
        return None


def forget(trigger: Trigger, settings: Settings, budget: Budget) -> None:
    """Drop the kick's record of the wake-up it could not make: the next kicks of its queues
    would trust it (the run this invocation becomes makes the function's own). Safe to repeat:
    it deletes only the kick's own row, if it is still there. A failure is logged: the run
    after it reports the database's state in its own words."""
    assert trigger.wake_at is not None and trigger.reserved_by is not None
    try:
        conninfo = resolve_conninfo(settings)
        with connection.connect(conninfo, settings, budget) as conn, conn.transaction():
            key = queue_set(trigger.queues)
            store.wake_release(conn, key, trigger.wake_at, trigger.reserved_by)
    except (PgdrainError, psycopg.Error) as exc:
        log.warning("could not drop the kick's wake-up record: %s", exc)
