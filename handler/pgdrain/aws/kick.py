"""Kick the drain function right after the application commits an enqueue, so a job does not
wait for the next scheduled run.

A burst of enqueues must not become a burst of invocations: each kick first records itself in
pgdrain.kicks, one row per queue (requested_at), and only a queue whose last invoke is older
than the debounce window (PGDRAIN_KICK_DEBOUNCE_SECONDS) is invoked again. Concurrent callers
serialise on that row, so one of them wins per window. The winner invokes
PGDRAIN_FUNCTION_NAME asynchronously (InvocationType='Event'); the run it starts drains
everything ready, including the jobs of every kick that was coalesced into it.

While a run drains a queue (from the invoke that starts it, and then while it claims), it
holds the queue's kicks: they invoke nothing, since its exit check will see their jobs.

The debounce is on the trailing edge (pgdrain.aws.control): a run about to exit drains again
for a kick that arrived after its last claim, and clears the window when it exits, so the next
kick invokes. An invoke that fails clears the window too: a failed kick suppresses nothing.
A queue with nothing ready whose next job is covered by a pending wake-up is not invoked at all:
a kicked delayed job is started by its wake-up, not by a run now that finds nothing.

    with conn.transaction():
        pgdrain.enqueue(conn, "send_email", {"user_id": 42}, queue="emails")
    pgdrain.kick(conn, ["emails"])      # after the commit: the run must see the job

A kick is a latency optimisation, never a requirement: the schedule drains whatever a lost or
failed kick left behind, so a failed invoke is logged and not raised into the application."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg import pq

from pgdrain import store
from pgdrain.aws.events import enqueue_event
from pgdrain.aws.lambda_api import invoke_async
from pgdrain.errors import BadInput
from pgdrain.settings import Settings, check_queue_name

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

log = logging.getLogger(__name__)


def kick(
    conn: store.Connection,
    queues: Sequence[str],
    *,
    settings: Settings | None = None,
    client: LambdaClient | None = None,
) -> tuple[str, ...]:
    """Ask the drain function to run for `queues`, at most once per debounce window per queue.
    Returns the queues it was invoked for: empty when every queue was kicked recently, when no
    function is configured (PGDRAIN_FUNCTION_NAME unset: local use), or when the invoke failed.

    Call it after the enqueue has committed, on a connection with no transaction open."""
    settings = settings or Settings.from_env(os.environ)
    # Sorted: concurrent kicks (and exiting runs) lock the kick rows in one order, no deadlock.
    names = tuple(sorted(set(check_queue_name(q, "kick") for q in _as_list(queues))))
    if not names:
        raise BadInput("kick: name at least one queue")
    if not settings.function_name:
        log.debug("kick skipped: PGDRAIN_FUNCTION_NAME is not set", extra={"queues": names})
        return ()
    status = conn.info.transaction_status
    if status != pq.TransactionStatus.IDLE:
        raise BadInput(
            "kick: the connection has a transaction open; call kick() after the enqueue "
            "commits, or the drain it starts may not see the new jobs"
        )
    with conn.transaction():
        due = store.kick_debounce(
            conn,
            names,
            settings.kick_debounce_seconds,
            settings.wake_precision_seconds,
            hold_seconds=kick_hold_seconds(settings),
        )
    if not due:
        log.debug("kick debounced: kicked within the window", extra={"queues": names})
        return ()
    invoked = _invoke(settings.function_name, due, client)
    if not invoked:
        # Safe to repeat: it only lets the next kick invoke (at worst one more invocation).
        with conn.transaction():
            store.kick_clear(conn, due)
    return invoked


def kick_hold_seconds(settings: Settings) -> float:
    """How long the runs of a queue hold its kicks: from the invoke until the run it starts
    holds them itself, and then ahead of each of its claims. A third of a lease, as the
    heartbeat: a run that died stops holding them about as soon as its jobs are reclaimable."""
    return settings.lease_seconds / 3


def _invoke(function: str, queues: Sequence[str], client: LambdaClient | None) -> tuple[str, ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        invoke_async(function, enqueue_event(queues), client)
    except (BotoCoreError, ClientError, RuntimeError) as exc:
        log.warning(
            "kick failed; the next kick invokes again",
            extra={"queues": list(queues), "function": function, "error": str(exc)},
        )
        return ()
    log.debug("kicked", extra={"queues": list(queues), "function": function})
    return tuple(queues)


def _as_list(queues: Sequence[str]) -> list[str]:
    if isinstance(queues, str):  # kick(conn, "emails") means one queue, not six letters
        return [queues]
    items = list(queues)
    if not all(isinstance(q, str) for q in items):
        raise BadInput("kick: queue names must be strings")
    return items
