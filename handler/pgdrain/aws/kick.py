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
A queue whose next job is due later gets no run now: a kicked delayed job is started by a wake-up
at its run_at, not by a run now that finds nothing (and keeps a sleeping database awake for
minutes). A queue with nothing queued at all (the enqueue rolled back, or a run took the job
already) is invoked as a ready one is: the kick cannot tell, and the run finds what there is.
If no wake-up pending for the queue comes early enough, the kick reserves one in pgdrain.wakes,
in the same transaction as its debounce, and invokes the function with a wake-up request
({"reason": "later"}) that takes up that reservation and creates the one-shot schedule, without
a run. A request that never takes it up (the function could not reach the database) leaves a
reservation that holds WAKE_HOLD_SECONDS only: the next kick or run makes the wake-up again.

    with conn.transaction():
        pgdrain.enqueue(conn, "send_email", {"user_id": 42}, queue="emails")
    pgdrain.kick(conn, ["emails"])      # after the commit: the run must see the job

A kick is a latency optimisation, never a requirement: the schedule drains whatever a lost or
failed kick left behind, so a failed invoke is logged and not raised into the application.

Where no function drains (development, or a worker in a container), the same call wakes
`pgdrain worker` by NOTIFY instead; PGDRAIN_KICK and pgdrain.api.kick_target say which."""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from psycopg import pq

from pgdrain.api.enqueue import check_connection
from pgdrain.api.kick_target import kick_target, notify_worker
from pgdrain.aws.events import enqueue_event, later_event
from pgdrain.aws.lambda_api import invoke_async
from pgdrain.aws.wake import WAKE_HOLD_SECONDS, queue_set, wake_moment
from pgdrain.db import store
from pgdrain.errors import BadInput
from pgdrain.settings import Settings, check_queue_name, describe_queues, serves

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

log = logging.getLogger(__name__)


class KickOutcome(NamedTuple):
    """What one kick did, queue by queue (what `pgdrain enqueue` and `pgdrain retry` say)."""

    function: str | None  # None: no function is configured (PGDRAIN_FUNCTION_NAME unset)
    invoked: tuple[str, ...] = ()  # a run was invoked for these queues
    # Nothing ready yet: a wake-up at this time was requested for these queues.
    wakes: tuple[tuple[tuple[str, ...], dt.datetime], ...] = ()
    # A run invoked within the debounce window, a live run, or a pending wake-up takes them.
    covered: tuple[str, ...] = ()
    error: str | None = None  # an invoke failed: what the Lambda API said
    # Paused (pgdrain.pause_queue): the kick is recorded; resuming kicks them.
    paused: tuple[str, ...] = ()


def kick(
    conn: store.Connection,
    queues: Sequence[str],
    *,
    settings: Settings | None = None,
    client: LambdaClient | None = None,
) -> tuple[str, ...]:
    """Ask the drain function to run for `queues`, at most once per debounce window per queue.
    Returns the queues it was invoked for: empty when every queue was kicked recently, when
    kicks are off (PGDRAIN_KICK=off), or when the invoke failed. A queue whose next job is due
    later is not among them: that job gets a wake-up request instead (when no wake-up pending
    for it comes early enough), which starts no run now.

    Without a function (PGDRAIN_KICK=worker, or PGDRAIN_FUNCTION_NAME unset off AWS), a NOTIFY
    wakes `pgdrain worker` instead; it returns the queues when a worker heard it
    (pgdrain.api.kick_target). On AWS without PGDRAIN_FUNCTION_NAME it raises ConfigError.

    Call it after the enqueue has committed, on a connection with no transaction open.
    A queue the function does not drain (PGDRAIN_QUEUES restricts it) raises BadInput: its
    jobs would wait for a function that drains it, so the application hears of it at once."""
    return kick_outcome(conn, queues, settings=settings, client=client).invoked


def kick_outcome(
    conn: store.Connection,
    queues: Sequence[str],
    *,
    settings: Settings | None = None,
    client: LambdaClient | None = None,
) -> KickOutcome:
    """kick(), saying what it did for each queue (KickOutcome)."""
    check_connection(conn, "kick", "on another driver, kick on a psycopg 3 connection of its own")
    settings = settings or Settings.from_env(os.environ)
    # Sorted: concurrent kicks (and exiting runs) lock the kick rows in one order, no deadlock.
    names = tuple(sorted(set(check_queue_name(q, "kick") for q in _as_list(queues))))
    if not names:
        raise BadInput("kick: name at least one queue")
    outside = [q for q in names if not serves(settings.queues, q)]
    if outside:
        raise BadInput(
            f"kick: queue {outside[0]!r} is not drained by this function "
            f"(PGDRAIN_QUEUES={describe_queues(settings.queues)}): its jobs would wait; add "
            "it to PGDRAIN_QUEUES, or unset PGDRAIN_QUEUES to drain every queue"
        )
    # Raises on AWS without PGDRAIN_FUNCTION_NAME: not a kick that nobody hears.
    target = kick_target(settings, os.environ)
    if target == "off":
        log.debug("kick skipped: PGDRAIN_KICK=off", extra={"queues": names})
        return KickOutcome(None)
    if conn.closed:
        raise BadInput("kick: the connection is closed; kick on an open one after the commit")
    status = conn.info.transaction_status
    if status != pq.TransactionStatus.IDLE:
        # Refused for a worker too, though its NOTIFY would wait for the commit: code that
        # kicks a local worker must work unchanged against the function.
        raise BadInput(
            "kick: the connection has a transaction open; call kick() after the enqueue "
            "commits, or the drain it starts may not see the new jobs"
        )
    if target == "worker":
        return KickOutcome(None, notify_worker(conn, names))
    function = settings.function_name
    assert function, "kick_target() is 'lambda' only with a function name"
    reserved_by = f"kick:{uuid.uuid4()}"
    with conn.transaction():
        decision = store.kick_debounce(
            conn,
            names,
            settings.kick_debounce_seconds,
            settings.wake_precision_seconds,
            hold_seconds=kick_hold_seconds(settings),
        )
        wakes = _record_wakes(conn, decision.later, settings, reserved_by)
    requested: list[tuple[tuple[str, ...], dt.datetime]] = []
    errors: list[str] = []
    for queues, wake_at, replaced in wakes:
        error = _request_wake(conn, function, queues, wake_at, reserved_by, client, replaced)
        if error is None:
            requested.append((tuple(queues), wake_at))
        else:
            errors.append(error)
    due = decision.invoke
    if not due:
        log.debug("kick: no run needed now", extra={"queues": names})
        invoked: tuple[str, ...] = ()
    else:
        invoked, error = _invoke(function, due, client)
        if error is not None:
            errors.append(error)
            # Safe to repeat: it only lets the next kick invoke (at worst one more invocation).
            with conn.transaction():
                store.kick_clear(conn, due)
    # Neither invoked for nor given a wake-up of its own: a run or a pending wake-up has it.
    asked = set(due) | {q for queues, _, _ in wakes for q in queues} | set(decision.paused)
    covered = tuple(q for q in names if q not in asked)
    return KickOutcome(
        function,
        invoked,
        tuple(requested),
        covered,
        errors[0] if errors else None,
        tuple(decision.paused),
    )


def _record_wakes(
    conn: store.Connection,
    later: dict[str, dt.datetime],
    settings: Settings,
    reserved_by: str,
) -> list[tuple[list[str], dt.datetime, store.Replaced | None]]:
    """Reserve a wake-up for each queue whose next job is due later, one per wake-up moment
    (the queues due in the same minute share it): kicks and runs after this one make none of
    their own while it holds. The function this kick invokes takes it up (created) and drops
    it if it cannot create the schedule; untaken, it holds WAKE_HOLD_SECONDS (wake_confirm).
    Each comes with the later wake-up it replaced, put back if the request cannot be sent."""
    by_moment: dict[dt.datetime, list[str]] = {}
    for queue, due_at in sorted(later.items()):
        moment = wake_moment(due_at, settings.wake_precision_seconds)
        by_moment.setdefault(moment, []).append(queue)
    wakes = []
    for moment, queues in sorted(by_moment.items()):
        key = queue_set(queues)
        reserved = store.wake_reserve(conn, key, moment, reserved_by, WAKE_HOLD_SECONDS)
        if reserved is not None:
            wakes.append((queues, moment, reserved.replaced))
    return wakes


def _request_wake(
    conn: store.Connection,
    function: str,
    queues: list[str],
    wake_at: dt.datetime,
    reserved_by: str,
    client: LambdaClient | None,
    replaced: store.Replaced | None = None,
) -> str | None:
    """Invoke the function with a wake-up request; None, or what the failure was."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        invoke_async(function, later_event(queues, wake_at, reserved_by), client)
    except ImportError as exc:  # an application installed without the [aws] extra
        error = f"{exc.name or exc}: install pgdrain[aws] to kick the function"
    except (BotoCoreError, ClientError, RuntimeError) as exc:
        error = str(exc)
    else:
        log.debug(
            "kick: wake-up requested", extra={"queues": queues, "wake_at": wake_at.isoformat()}
        )
        return None
    log.warning(
        "kick: the wake-up request failed; the next kick or run asks again",
        extra={"queues": queues, "function": function, "error": error},
    )
    # Safe to repeat: it changes only this kick's own reservation of the wake-up. The later
    # wake-up it replaced (another kick's request on its way, a schedule made) is put back.
    with conn.transaction():
        store.wake_release(conn, queue_set(queues), wake_at, reserved_by, replaced)
    return error


def kick_hold_seconds(settings: Settings) -> float:
    """How long the runs of a queue hold its kicks: from the invoke until the run it starts
    holds them itself, and then ahead of each of its claims. A third of a lease, as the
    heartbeat: a run that died stops holding them about as soon as its jobs are reclaimable."""
    return settings.lease_seconds / 3


def _invoke(
    function: str, queues: Sequence[str], client: LambdaClient | None
) -> tuple[tuple[str, ...], str | None]:
    """The queues invoked for, or none and what the failure was."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        invoke_async(function, enqueue_event(queues), client)
    except ImportError as exc:  # an application installed without the [aws] extra
        return _failed(
            function, queues, f"{exc.name or exc}: install pgdrain[aws] to kick the function"
        )
    except (BotoCoreError, ClientError, RuntimeError) as exc:
        return _failed(function, queues, str(exc))
    log.debug("kicked", extra={"queues": list(queues), "function": function})
    return tuple(queues), None


def _failed(function: str, queues: Sequence[str], error: str) -> tuple[tuple[str, ...], str]:
    log.warning(
        "kick failed; the next kick invokes again",
        extra={"queues": list(queues), "function": function, "error": error},
    )
    return (), error


def _as_list(queues: Sequence[str]) -> list[str]:
    if isinstance(queues, str):  # kick(conn, "emails") means one queue, not six letters
        return [queues]
    if not isinstance(queues, Iterable):
        raise BadInput("kick: queues must be a list of queue names")
    items = list(queues)
    if not all(isinstance(q, str) for q in items):
        raise BadInput("kick: queue names must be strings")
    return items
