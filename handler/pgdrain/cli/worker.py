"""`pgdrain worker`: the long-running worker (pgdrain.runner.worker) in a terminal or a
container. A line per drain that did something or found ready jobs in queues it does not serve
(or, with --json, a JSON object per drain), and one when it stops; exit 0 after a stop by
SIGINT or SIGTERM."""

from __future__ import annotations

import json
import sys

from pgdrain.api.kick_target import CHANNEL
from pgdrain.api.registry import Registry
from pgdrain.cli.report import format_result
from pgdrain.errors import BadInput
from pgdrain.runner.stop import StopRequest, stop_on_signals
from pgdrain.runner.summary import DrainResult
from pgdrain.runner.worker import Worker, WorkerSummary
from pgdrain.settings import Settings, describe_queues


def check(settings: Settings) -> None:
    """Refuse settings the worker cannot work with, before anything starts."""
    if settings.pooler == "transaction":
        raise BadInput(
            "pgdrain worker LISTENs for kicks, which a transaction pooler "
            "(PGDRAIN_POOLER=transaction) does not pass on: give it a DATABASE_URL that "
            "reaches the database directly (or the pooler in session mode)"
        )


def run(
    settings: Settings, registry: Registry, conninfo: str, *, grace_s: float, as_json: bool
) -> int:
    unserved_said: list[set[str]] = [set()]  # the queues the last line said it leaves

    def report(result: DrainResult, reason: str) -> None:
        unserved = set(result.unserved)
        if as_json:
            print(json.dumps({"event": "drain", "woken_by": reason, **result.as_dict()}))
        elif (
            result.claimed
            or result.reclaimed
            or result.stop_reason == "error"
            or not unserved <= unserved_said[0]  # ready jobs it leaves: said when they change
        ):
            print(f"{reason}: {format_result(result)}")
            unserved_said[0] = unserved
        else:  # a queue served elsewhere meanwhile is said again when it fills again
            unserved_said[0] &= unserved
        sys.stdout.flush()

    queues = describe_queues(settings.queues)
    print(
        f"pgdrain worker: draining {queues} when kicked (LISTEN {CHANNEL}) and when work "
        "falls due; Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    with stop_on_signals(StopRequest(grace_s)) as stop:
        summary = Worker(settings, registry, conninfo, stop=stop, report=report).run()
    print(_stopped(summary, stop.signal_name, as_json), flush=True)
    return 0


def _stopped(summary: WorkerSummary, signal_name: str, as_json: bool) -> str:
    if as_json:
        return json.dumps({"event": "stopped", "signal": signal_name, **summary.as_dict()})
    totals = summary.totals
    drains = "1 drain" if summary.drains == 1 else f"{summary.drains} drains"
    return (
        f"stopped by {signal_name} after {drains}: claimed {totals['claimed']}, "
        f"done {totals['done']}, retried {totals['retried']}, failed {totals['failed']}"
    )
