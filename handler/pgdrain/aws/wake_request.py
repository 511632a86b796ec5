"""A kick's wake-up request ({"reason": "later"}): a delayed job was kicked while nothing in its
queue was ready, so a run now would only find nothing and keep a sleeping database awake for
its suspend delay. The kick has recorded the wake-up in pgdrain.wakes already; the function
creates the one-shot schedule and returns, without connecting to the database.

When that cannot be done (no scheduler configured here, the moment has come, the creation
failed), the request drops the kick's record of the wake-up, and the invocation drains as a
kicked run does: that run makes the wake-up itself (or reports it, locally) when it ends."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from pgdrain.aws.events import Trigger
from pgdrain.aws.secrets import resolve_conninfo
from pgdrain.aws.wake import Waker, queue_set
from pgdrain.budget import Budget
from pgdrain.db import connection, store
from pgdrain.errors import PgdrainError
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

# A schedule cannot fire in the past: a request whose moment is this close is drained now.
MIN_LEAD_SECONDS = 1.0


def answer(trigger: Trigger, waker: Waker, drained: Sequence[str] | None) -> dict[str, Any] | None:
    """The invocation's summary once the schedule exists, or None: drain instead (after
    `forget`). The wake-up is for `drained`, every queue of the function, as a kicked run's
    is: a run that ends with the same work due names the same schedule, whose second creation
    is a ConflictException, and nothing runs twice."""
    assert trigger.wake_at is not None
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=MIN_LEAD_SECONDS)
    if not waker.can_schedule or trigger.wake_at <= soon:
        return None
    outcome = waker.ensure_without_database(drained, trigger.wake_at)
    if outcome.action == "failed":
        return None
    queues = None if trigger.queues is None else list(trigger.queues)
    summary = {"ok": True, "trigger": trigger.reason, "queues": queues}
    summary |= outcome.as_dict()
    log.info("wake-up request answered; no run now", extra=outcome.as_dict())
    return summary


def forget(trigger: Trigger, settings: Settings, budget: Budget) -> None:
    """Drop the kick's record of the wake-up, so that the run this invocation becomes can make
    it. Safe to repeat: it deletes only the kick's own row, if it is still there. A failure
    is logged: the run after it reports the database's state in its own words."""
    assert trigger.wake_at is not None and trigger.reserved_by is not None
    try:
        conninfo = resolve_conninfo(settings)
        with connection.connect(conninfo, settings, budget) as conn, conn.transaction():
            key = queue_set(trigger.queues)
            store.wake_release(conn, key, trigger.wake_at, trigger.reserved_by)
    except (PgdrainError, psycopg.Error) as exc:
        log.warning("could not drop the kick's wake-up record: %s", exc)
