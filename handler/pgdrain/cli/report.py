"""How the CLI and the demo print a drain's summary, the queue counts and jobs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import unicodedata
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pgdrain.db import store
from pgdrain.runner.drain import DrainResult
from pgdrain.runner.summary import UNSERVED_COUNT_BOUND
from pgdrain.settings import describe_queues, serves

if TYPE_CHECKING:
    from pgdrain.aws.kick import KickOutcome

# Characters that reorder the text shown after them (the "Trojan Source" controls); category
# Cf, so listed here beside the Cc control characters.
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


# Control characters (Cc: ESC, CR, LF, \x0b, \x0c, \x1c-\x1e, DEL, C1 such as \x85) and the
# line and paragraph separators (Zl, Zp: U+2028, U+2029), which str.splitlines and some
# terminals take for line breaks.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def printable(text: object) -> str:
    """`text` safe for a terminal: control characters (ESC sequences, CR, newlines, DEL, C1),
    line and paragraph separators and bidirectional overrides from job data are shown as
    escapes (\\x1b, \\u2028, \\u202e) instead of acting on the terminal or splitting a line."""
    value = str(text)
    if value.isprintable():  # the common case, in C
        return value
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in _ESCAPED_CATEGORIES or ch in _BIDI_CONTROLS
        else ch
        for ch in value
    )


def plural(count: int, noun: str) -> str:
    """ "1 job", "2 jobs"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def format_result(result: DrainResult) -> str:
    """The summary line; then a line naming the queues it serves that were paused (it took no
    job of them), and one when it left ready jobs in queues it does not serve (a restriction:
    --queues, PGDRAIN_QUEUES)."""
    # Cancelled only when a job was: the line most runs print stays as it was.
    cancelled = f"cancelled {result.cancelled}, " if result.cancelled else ""
    line = (
        f"claimed {result.claimed}, done {result.done}, retried {result.retried}, "
        f"failed {result.failed}, {cancelled}lease lost {result.lease_lost}, "
        f"reclaimed {result.reclaimed}, released {result.released}; "
        f"stopped: {result.stop_reason} after {result.elapsed_s}s"
    )
    line += f" ({printable(result.error)})" if result.error else ""
    if result.paused:
        line += "\n" + format_paused([printable(q) for q in result.paused])
    if result.unserved:
        line += "\n" + format_unserved(
            result.unserved, "this drain does not serve (--queues, PGDRAIN_QUEUES)"
        )
    return line


def format_unserved(unserved: Mapping[str, int], outside: str) -> str:
    """Queues with ready jobs that a restricted drain does not serve, in one line: "not
    drained: 3 ready jobs in queues <outside>: emails (1 ready), sms (2 ready)"."""
    counts = ", ".join(
        f"{printable(q)} ({_bounded(n, UNSERVED_COUNT_BOUND)} ready)" for q, n in unserved.items()
    )
    total = sum(unserved.values())
    where = "a queue" if len(unserved) == 1 else "queues"
    return f"not drained: {plural(total, 'ready job')} in {where} {outside}: {counts}"


def _bounded(count: int, bound: int) -> str:
    return f"{count}+" if count >= bound else str(count)


# The line `stats` ends with when done jobs are not kept: its done column counts only those moved.
DONE_NOT_KEPT = (
    "done: PGDRAIN_RETAIN_DONE=0, so only jobs of a sequence or with dependents are kept done; "
    "`pgdrain runs` counts the done jobs of the function's runs"
)


def format_stats(
    rows: Sequence[store.QueueStats],
    served: tuple[str, ...] | None = None,
    *,
    keeps_done: bool = True,
) -> str:
    """One line per queue: what an operator reads first (ready, running, delayed, waiting,
    failed, parked, the oldest ready job's wait), then done, cancelled and expired leases. With
    `served` (PGDRAIN_QUEUES restricts the drains), a last line names the queues with ready
    jobs that such a drain leaves; without `keeps_done`, one says what the done column counts."""
    header = (
        f"{'queue':<16}{'ready':>8}{'running':>9}{'delayed':>9}{'waiting':>9}{'failed':>8}"
        f"{'parked':>8}"
        f"{'oldest ready':>14}{'done':>9}{'cancelled':>11}{'expired':>9}"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"{printable(r.queue):<16}{r.ready:>8}{r.running:>9}{r.delayed:>9}{r.waiting:>9}"
            f"{_history(r.failed):>8}{_history(r.parked):>8}{r.oldest_ready_age_s:>13.1f}s"
            f"{_history(r.done):>9}{_history(r.cancelled):>11}{r.expired_leases:>9}"
        )
    if not rows:
        lines.append("(no jobs)")
    paused = [printable(r.queue) for r in rows if r.paused]
    if paused:
        lines.append(format_paused(paused))
    unserved = {r.queue: r.ready for r in rows if r.ready and not serves(served, r.queue)}
    if unserved:
        outside = f"outside PGDRAIN_QUEUES={describe_queues(served)}"
        lines.append(format_unserved(unserved, outside))
    if not keeps_done:
        lines.append(DONE_NOT_KEPT)
    return "\n".join(lines)


def limits_reached(q: store.QueueLimitRow) -> list[str]:
    """Which of the queue's limits hold its ready jobs back now: its concurrency limit reached,
    its rate window's starts used up; none when neither."""
    why = []
    if q.max_running is not None and q.running >= q.max_running:
        why.append(f"concurrency limit {q.max_running} reached")
    if q.rate_limit is not None and q.window_started >= q.rate_limit:
        why.append(f"rate {q.rate_limit} per {q.rate_seconds}s used up")
    return why


def format_held(limits: Sequence[store.QueueLimitRow], ready: int) -> str | None:
    """The line a drain ends with when queues it serves hold `ready` jobs back at their
    limits: "held by limits: 40 ready jobs in emails (rate 10 per 60s used up)". None if none."""
    if not ready:
        return None
    parts = [f"{printable(q.queue)} ({', '.join(limits_reached(q))})" for q in limits]
    return (
        f"held by limits: {plural(ready, 'ready job')} in {', '.join(parts)} "
        "(pgdrain.queue_limits, as a run's PGDRAIN_QUEUE_LIMITS wrote it; the next run, or "
        "`pgdrain worker`, claims them when a slot or window frees)"
    )


def format_paused(queues: Sequence[str]) -> str:
    """The line `stats`, `jobs` and a drain's summary end with while queues are paused."""
    return f"paused: {', '.join(queues)} (no run claims their jobs; `pgdrain resume QUEUE`)"


def _history(count: int) -> str:
    """A count of finished jobs: queue_stats stops counting at its bound, shown as 10000+."""
    return _bounded(count, store.STATS_HISTORY_BOUND)


def format_migrated(applied: Sequence[str]) -> str:
    """What a migration did, as `migrate` and `demo` both say it."""
    if applied:
        return "applied: " + ", ".join(applied)
    return "nothing to apply: the schema is up to date"


def job_as_dict(row: store.JobRow) -> dict[str, Any]:
    """A listed job as `pgdrain jobs --json` prints it: timestamps as ISO 8601 text, and its
    state (the status, a queued job told apart: ready, retrying or scheduled) in place of
    due_in_s (run_at says when), and `undecoded` only when a value was not decoded."""
    job = {
        k: v.isoformat() if isinstance(v, dt.datetime) else v
        for k, v in dataclasses.asdict(row).items()
        if k != "due_in_s" and not (k == "undecoded" and v is None)
    }
    return job | {"state": row.state}


def format_jobs(rows: Sequence[store.JobRow]) -> str:
    """A header row, then one line per job."""
    header = (
        f"{'id':>8} {'queue':<12} {'kind':<14} {'state':<20} {'attempt':<8}{'reclaims':>8}  "
        "last error"
    )
    lines = [format_job_line(r) for r in rows] or ["(no jobs)"]
    return "\n".join([header, *lines])


def format_job_line(r: store.JobRow) -> str:
    """One listed job; kind, queue and error are job data, escaped for the terminal. A job
    waiting for its run_at says how long: "retrying in 12s", "scheduled in 5m"."""
    state = r.state
    if state in ("retrying", "scheduled") and r.due_in_s is not None:
        state += f" in {_duration(r.due_in_s)}"
    error = f"  {printable(r.last_error)}" if r.last_error else ""
    attempt = f"{r.attempts}/{r.max_attempts}"
    return (
        f"{r.id:>8} {printable(r.queue):<12} {printable(r.kind):<14} {state:<20} "
        f"{attempt:<8}{r.reclaim_count:>8}{error}"
    )


def _duration(seconds: float) -> str:
    """A wait, short: 45s, 12m, 3h, 2d."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{round(seconds / size)}{unit}"
    return f"{round(seconds)}s"


def run_as_dict(row: store.RunHistoryRow) -> dict[str, Any]:
    """A run that ended as `pgdrain runs --json` prints it: timestamps as ISO 8601 text."""
    return {
        k: v.isoformat() if isinstance(v, dt.datetime) else v
        for k, v in dataclasses.asdict(row).items()
    }


def format_runs(rows: Sequence[store.RunHistoryRow]) -> str:
    """A header row, then one line per run that ended, newest first (`pgdrain runs`)."""
    header = (
        f"{'finished (UTC)':<19} {'trigger':<9}{'took':>7} {'claimed':>8}{'done':>7}"
        f"{'failed':>7}{'retried':>8}  {'stop':<7} queues"
    )
    lines = [
        f"{r.finished_at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} {printable(r.trigger):<9}"
        f"{_took(r.duration_s):>7} {r.claimed:>8}{r.done:>7}{r.failed:>7}{r.retried:>8}  "
        f"{printable(r.stop_reason):<7} {printable(', '.join(r.queues))}"
        + (" (continued)" if r.continued else "")
        for r in rows
    ] or ["(no run has ended yet, or retention deleted them)"]
    return "\n".join([header, *lines])


def _took(seconds: float) -> str:
    """A run's duration: 0.4s, 12.0s, then as _duration."""
    return f"{max(0.0, seconds):.1f}s" if seconds < 60 else _duration(seconds)


# `pgdrain jobs show`: the columns in this order, then any others (a later migration's),
# then the error history.
_SHOW_ORDER = (
    "id", "queue", "kind", "status", "priority", "attempts", "max_attempts",
    "recovery_policy", "reclaim_count", "run_at", "created_at", "updated_at", "finished_at",
    "lease_expires_at", "leased_by", "heartbeat_at", "attempt_token", "completed_token",
    "idempotency_key", "sequence", "depends_on", "has_dependents", "last_error", "payload",
    "progress", "output",
)  # fmt: skip


def format_job(job: dict[str, Any]) -> str:
    """Every field of one job (store.job_show), one per line, and its error history."""
    keys = [k for k in _SHOW_ORDER if k in job]
    keys += sorted(k for k in job if k not in _SHOW_ORDER and k not in ("errors", "undecoded"))
    width = max(len(k) for k in keys)
    # Values Python cannot hold (store.job_show): their JSON text, after why.
    undecoded: dict[str, str] = job.get("undecoded") or {}
    lines = []
    for key in keys:
        value = job[key]
        text = json.dumps(value) if isinstance(value, dict | list) else str(value)
        if key in undecoded:
            text = f"(not decoded: {undecoded[key]}; its JSON text:) {text}"
        lines.append(f"{key:<{width}}  {'-' if value is None else printable(text)}")
    errors = job.get("errors")
    if "errors" in undecoded:
        lines.append(
            printable(f"errors: (not decoded: {undecoded['errors']}; its JSON text:) {errors}")
        )
    elif isinstance(errors, list):
        lines.append(f"errors ({len(errors)}):" if errors else "errors: none recorded")
        for e in errors:
            e = e if isinstance(e, dict) else {"message": e}
            lines.append(
                printable(
                    f"  attempt {e.get('attempt', '?')} at {e.get('at', '?')}: "
                    f"{e.get('type', 'Error')}: {e.get('message', '')}"
                )
            )
            traceback = e.get("traceback")
            if traceback:
                # Split at newlines only: any other line break is shown escaped, in its line.
                lines.extend(
                    "    " + printable(line) for line in str(traceback).rstrip().split("\n")
                )
    return "\n".join(lines)


def format_kick(outcome: KickOutcome) -> list[str]:
    """What a command's kick did, a line per outcome: the function invoked, a wake-up asked
    for, the queues a run or a pending wake-up already covers, or why the invoke failed."""
    function = printable(outcome.function)
    lines = []
    if outcome.invoked:
        lines.append(f"kicked {function} (queues: {', '.join(outcome.invoked)})")
    for queues, wake_at in outcome.wakes:
        lines.append(
            f"not kicked for {', '.join(queues)}: nothing is ready yet; {function} will wake "
            f"up at {wake_at.isoformat()}"
        )
    if outcome.paused:
        lines.append(
            f"not kicked for {', '.join(outcome.paused)}: paused; the kick is recorded "
            "(`pgdrain resume QUEUE` kicks it)"
        )
    if outcome.covered:
        lines.append(
            f"not kicked for {', '.join(outcome.covered)}: a run of {function} started "
            "moments ago, a live run or a pending wake-up takes the jobs"
        )
    if outcome.error is not None:
        lines.append(
            f"not kicked: invoking {function} failed ({printable(outcome.error)}); the next "
            "kick or the schedule drains the jobs"
        )
    return lines
