"""An application's or operator's side of a queue's state: pause and resume (pgdrain.queue_limits
holds the pause; docs/jobs.md). Both run in the caller's transaction, as enqueue does."""

from __future__ import annotations

import datetime as dt

from pgdrain.api.enqueue import check_connection
from pgdrain.db import store
from pgdrain.settings import check_queue_name

OTHER_DRIVERS = "on another driver, open a psycopg 3 connection for it"


def pause_queue(conn: store.Connection, queue: str) -> dt.datetime:
    """Stop every run from claiming `queue`'s jobs, from the commit on: scheduled, kicked and
    fan-out runs and workers alike; a run gives back, unstarted, the jobs of it that it claimed
    ahead, at its next claim. A job already started runs to its end. Kicks of the queue are
    recorded and start no run. Returns when the queue was paused. Safe to call twice: the
    second call changes nothing and returns the first pause's time."""
    check_connection(conn, "pause_queue", OTHER_DRIVERS)
    return store.queue_pause(conn, check_queue_name(queue, "pause_queue"))


def resume_queue(conn: store.Connection, queue: str) -> bool:
    """Let runs claim `queue`'s jobs again, from the commit on. Returns whether it was paused
    (False: it was not, and nothing changed: safe to call twice). Its ready jobs wait for the
    next run: kick it after the commit (pgdrain.kick([queue])), as after an enqueue; `pgdrain
    resume` and the dashboard do."""
    check_connection(conn, "resume_queue", OTHER_DRIVERS)
    return store.queue_resume(conn, check_queue_name(queue, "resume_queue"))
