"""How the CLI and the demo print a drain's summary, the queue counts and jobs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from pgdrain import store
from pgdrain.drain import DrainResult


def format_result(result: DrainResult) -> str:
    line = (
        f"claimed {result.claimed}, done {result.done}, retried {result.retried}, "
        f"failed {result.failed}, lease lost {result.lease_lost}, reclaimed {result.reclaimed}, "
        f"released {result.released}; stopped: {result.stop_reason} after {result.elapsed_s}s"
    )
    return line + (f" ({result.error})" if result.error else "")


def format_stats(rows: Sequence[store.QueueStats]) -> str:
    """One line per queue: what an operator reads first (ready, running, delayed, failed,
    parked, the oldest ready job's wait), then done, cancelled and expired leases."""
    header = (
        f"{'queue':<16}{'ready':>8}{'running':>9}{'delayed':>9}{'failed':>8}{'parked':>8}"
        f"{'oldest ready':>14}{'done':>9}{'cancelled':>11}{'expired':>9}"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.queue:<16}{r.ready:>8}{r.running:>9}{r.delayed:>9}{r.failed:>8}{r.parked:>8}"
            f"{r.oldest_ready_age_s:>13.1f}s{r.done:>9}{r.cancelled:>11}{r.expired_leases:>9}"
        )
    if not rows:
        lines.append("(no jobs)")
    return "\n".join(lines)


def job_as_dict(row: store.JobRow) -> dict[str, Any]:
    """A listed job as `pgdrain jobs --json` prints it: timestamps as ISO 8601 text."""
    return {
        k: v.isoformat() if isinstance(v, dt.datetime) else v
        for k, v in dataclasses.asdict(row).items()
    }


def format_job_line(r: store.JobRow) -> str:
    error = f"  {r.last_error}" if r.last_error else ""
    return (
        f"{r.id:>8} {r.queue:<12} {r.kind:<14} {r.status:<9} "
        f"attempt {r.attempts}/{r.max_attempts} reclaims {r.reclaim_count}{error}"
    )


# `pgdrain jobs show`: the columns in this order, then any others (a later migration's),
# then the error history.
_SHOW_ORDER = (
    "id", "queue", "kind", "status", "priority", "attempts", "max_attempts",
    "recovery_policy", "reclaim_count", "run_at", "created_at", "updated_at", "finished_at",
    "lease_expires_at", "leased_by", "heartbeat_at", "attempt_token", "completed_token",
    "idempotency_key", "last_error", "payload",
)  # fmt: skip


def format_job(job: dict[str, Any]) -> str:
    """Every field of one job (store.job_show), one per line, and its error history."""
    keys = [k for k in _SHOW_ORDER if k in job]
    keys += sorted(k for k in job if k not in _SHOW_ORDER and k != "errors")
    width = max(len(k) for k in keys)
    lines = []
    for key in keys:
        value = job[key]
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        lines.append(f"{key:<{width}}  {'-' if value is None else text}")
    errors = job.get("errors")
    if isinstance(errors, list):
        lines.append(f"errors ({len(errors)}):" if errors else "errors: none recorded")
        for e in errors:
            e = e if isinstance(e, dict) else {"message": e}
            lines.append(
                f"  attempt {e.get('attempt', '?')} at {e.get('at', '?')}: "
                f"{e.get('type', 'Error')}: {e.get('message', '')}"
            )
            traceback = e.get("traceback")
            if traceback:
                lines.extend("    " + line for line in str(traceback).rstrip().splitlines())
    return "\n".join(lines)
