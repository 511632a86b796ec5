"""The dashboard's pages, rendered from the store's records. Every value that comes from a job
goes through html.text() or html.cell(); everything else here is our own text."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from pgdrain.db import store
from pgdrain.settings import QUEUE_NAME
from pgdrain.ui import charts
from pgdrain.ui.html import (
    MAX_CELL,
    MAX_TEXT,
    cell,
    duration,
    exact,
    moment,
    post_button,
    pretty_json,
    table,
    text,
    url,
)

# What an action's redirect may say on the page it lands on: a fixed set, never reflected text,
# shown only under the seal the action issued (app._Dashboard._after).
NOTICES = {
    "retried": "Queued again: a run will pick it up (the page refreshes while it waits).",
    "retried-after-lease": "Queued again, to run when the lease of the attempt cancelled while "
    "it ran ends (its run_at): until then that attempt's code may still be running.",
    "cancelled": "Cancelled.",
    "not-retried": "Not retried: it is no longer failed, parked or cancelled.",
    "not-retried-key": "Not retried: a newer job holds its idempotency key and does its work.",
    "not-retried-dependency": "Not retried: a job it depends on failed, was cancelled or is no "
    "longer kept, so it would never run.",
    "not-cancelled": "Not cancelled: it had already finished.",
    "already-cancelled": "Not cancelled: it was already cancelled.",
    "paused": "Paused: no run claims its jobs; its kicks are recorded and held until it is "
    "resumed.",
    "resumed": "Resumed: runs claim its jobs again.",
    "resumed-kicked": "Resumed, and the drain function was kicked for its ready jobs.",
    "not-paused": "It was not paused: nothing changed.",
}
# A job page not found, where the function's runs do not keep their done jobs.
DONE_NOT_KEPT_GONE = (
    "Done jobs are not kept (PGDRAIN_RETAIN_DONE=0): one that finished done is gone."
)
RETRYABLE = ("failed", "parked", "cancelled")
CANCELLABLE = ("queued", "running", "parked", "waiting")
BULK_STATUSES = ("failed", "parked")  # what retry by filter takes, as `pgdrain retry --failed`
ERRORS_SHOWN = 50  # a job's page shows its latest errors, at most this many
BULK_SHOWN = 100  # retry by filter lists this many of the jobs it would queue again


def notice(key: str | None) -> str:
    message = NOTICES.get(key or "")
    return f'<div class="notice">{message}</div>' if message else ""


def _history(count: int) -> str:
    return f"{count:,}+" if count >= store.STATS_HISTORY_BOUND else f"{count:,}"


def _num(value: int) -> str:
    return f'<span class="num">{value:,}</span>'


def queue_state(
    row: store.QueueStats, kick: store.KickRow | None = None, token: str | None = None
) -> str:
    """What the queue is doing for runs: `active`, or `paused` (its jobs wait, its kicks are
    recorded and held: the latest is shown), with the button that changes it."""
    if row.paused:
        state = '<span class="status-paused">paused</span>'
        if kick is not None and kick.requested_at is not None:
            state += f'<br><span class="muted">kick held: {moment(kick.requested_at)}</span>'
        verb = "resume"
    else:
        state, verb = "active", "pause"
    if token is None or not QUEUE_NAME.match(row.queue):
        # A name no job can have (a row written by hand in queue_limits): no button, whose
        # path would be the name's, as the action refuses it.
        return state
    return f"{state} {post_button(_queue_path(row.queue, verb), verb.capitalize(), token, {})}"


def _queue_path(queue: str, verb: str) -> str:
    """The path of a queue's action, the name percent-encoded (a path segment of its own)."""
    return f"/queues/{quote(queue, safe='')}/{verb}"


def _limit(limit: store.QueueLimitRow | None) -> str:
    """Running / concurrency limit, and the current rate window's starts / rate."""
    if limit is None:
        return "-"
    parts = []
    if limit.max_running is not None:
        parts.append(f"{limit.running}/{limit.max_running}")
    if limit.rate_limit is not None:
        parts.append(f"{limit.window_started}/{limit.rate_limit} per {limit.rate_seconds} s")
    return " · ".join(parts) or "-"


def queues_page(
    stats: Sequence[store.QueueStats],
    limits: Sequence[store.QueueLimitRow],
    throughput: store.Throughput,
    now: dt.datetime,
    *,
    kicks: Sequence[store.KickRow] = (),
    token: str | None = None,
    notice_key: str | None = None,
    done_kept: bool = True,
) -> str:
    hour = now.replace(second=0, microsecond=0) - dt.timedelta(minutes=59)
    day_step = dt.timedelta(minutes=15)
    day_start = now.replace(minute=now.minute // 15 * 15, second=0, microsecond=0)
    day_start -= dt.timedelta(hours=24) - day_step
    hour_rows = charts.buckets(throughput, hour, now, dt.timedelta(minutes=1))
    day_rows = charts.buckets(throughput, day_start, now, day_step)
    limit_of = {limit.queue: limit for limit in limits}
    kick_of = {kick.queue: kick for kick in kicks}
    last_hour: dict[str, tuple[int, int]] = {}
    # The count stopped at its bound within the hour: the hour's sums are lower bounds.
    hour_cut = "+" if throughput.counted_from > hour else ""
    for m in throughput.minutes:
        if m.minute >= hour:
            done, failed = last_hour.get(m.queue, (0, 0))
            last_hour[m.queue] = (done + m.done, failed + m.failed)
    rows = []
    for r in stats:
        limit = limit_of.get(r.queue)
        done_h, failed_h = last_hour.get(r.queue, (0, 0))
        rows.append(
            [
                f'<a href="{url("/jobs", {"queue": r.queue})}">{cell(r.queue)}</a>',
                queue_state(r, kick_of.get(r.queue), token),
                _num(r.ready),
                _num(r.running),
                _num(r.delayed),
                f'<a href="{url("/jobs", {"queue": r.queue, "status": "waiting"})}">'
                f"{_num(r.waiting)}</a>",
                f'<a href="{url("/jobs", {"queue": r.queue, "status": "failed"})}">'
                f"{_history(r.failed)}</a>",
                f'<a href="{url("/jobs", {"queue": r.queue, "status": "parked"})}">'
                f"{_history(r.parked)}</a>",
                duration(r.oldest_ready_age_s) if r.ready else "-",
                f"{done_h:,}{hour_cut} / {failed_h:,}{hour_cut}",
                _history(r.done),
                _history(r.cancelled),
                _num(r.expired_leases),
                _limit(limit),
            ]
        )
    headers = [
        "queue", "state", "ready", "running", "delayed", "waiting", "failed", "parked",
        "oldest ready",
        "done / failed (last hour)", "done", "cancelled", "expired leases", "limits",
    ]  # fmt: skip
    minute = dt.timedelta(minutes=1)
    hour_chart = charts.bar_chart("Jobs finished per minute, last hour", hour_rows, minute)
    day_chart = charts.bar_chart("Jobs finished per minute, last day", day_rows, day_step)
    bound = ""
    if throughput.counted_from > throughput.since:
        bound = (
            f'<p class="muted">The charts and the last hour\'s column count the newest '
            f"{store.THROUGHPUT_BOUND:,} finished jobs: before {moment(throughput.counted_from)} "
            "(grey; + in the column) they are not counted.</p>"
        )
    # With done jobs not kept (the runs' PGDRAIN_RETAIN_DONE=0, as they record it), the done
    # column and the charts' green leave them out: said above the table, not found out later.
    not_kept = (
        ""
        if done_kept
        else '<p class="not-kept">Done jobs are not kept: the runs delete them as they finish '
        "(PGDRAIN_RETAIN_DONE=0), so the done column and the charts count only jobs of a "
        'sequence or with dependents. The <a href="/control">control plane</a>\'s run history '
        "counts each run's done jobs.</p>"
    )
    return (
        "<h1>Queues</h1>"
        + notice(notice_key)
        + not_kept
        + f'<p class="muted">As of {moment(now)}. Finished counts above '
        f"{store.STATS_HISTORY_BOUND:,} show as {store.STATS_HISTORY_BOUND:,}+. "
        f'<a href="{url("/", {"refresh": 5})}">Refresh every 5 s</a></p>'
        + table(headers, rows, "No jobs yet.")
        + "<h2>Jobs finished per minute</h2>"
        '<p class="muted">Done (green) and failed (red).</p><div class="charts">'
        f'<div class="chart">Last hour, per minute{hour_chart}</div>'
        f'<div class="chart">Last day, per minute (15-minute average){day_chart}</div>'
        f"</div>{bound}"
    )


def _filter_form(filters: Mapping[str, str | None]) -> str:
    statuses = "".join(
        f'<option value="{s}"{" selected" if filters.get("status") == s else ""}>{s}</option>'
        for s in store.STATUSES
    )

    def field(name: str, placeholder: str) -> str:
        return (
            f'<label>{name} <input name="{name}" value="{text(filters.get(name) or "")}" '
            f'placeholder="{placeholder}" size="14"></label>'
        )

    return (
        '<form method="get" action="/jobs" class="filters">'
        + field("queue", "any")
        + field("kind", "any")
        + f'<label>status <select name="status"><option value="">any</option>{statuses}'
        "</select></label>"
        + field("since", "30m, 2h, 7d, ISO")
        + '<button type="submit">Filter</button> <a href="/jobs">clear</a></form>'
    )


def jobs_page(
    filters: Mapping[str, str | None],
    rows: Sequence[store.JobRow],
    next_before: int | None,
    *,
    token: str | None,
    retried: tuple[int | None, int | None] | None = None,
) -> str:
    """A page of jobs, newest first; `token` is None when actions are off. `retried`: what the
    retry by filter this page follows queued again, and left to the jobs that hold its keys."""
    body = [
        _retried_notice(*retried) if retried else "",
        "<h1>Jobs</h1>",
        _filter_form(filters),
        table(
            ["id", "queue", "kind", "status", "attempts", "updated", "last error"],
            (
                [
                    f'<a href="/jobs/{r.id}">{r.id}</a>',
                    cell(r.queue),
                    exact(r.kind),
                    f'<span class="status-{r.status}">{r.status}</span>',
                    f"{r.attempts}/{r.max_attempts}",
                    moment(r.updated_at),
                    cell(r.last_error),
                ]
                for r in rows
            ),
            "No job matches.",
        ),
    ]
    links = []
    if filters.get("before"):
        links.append(f'<a href="{url("/jobs", {**filters, "before": None})}">« newest</a>')
    if next_before is not None:
        links.append(f'<a href="{url("/jobs", {**filters, "before": next_before})}">older »</a>')
    body.append(f"<p>{' · '.join(links)}</p>")
    status = filters.get("status")
    if token is not None and status in BULK_STATUSES:
        fields = {k: filters.get(k) for k in ("queue", "kind", "since", "status")}
        body.append(
            "<h2>Retry by filter</h2>"
            f"<p>Queue again every {status} job matching these filters, with a fresh set of "
            "attempts. The next page shows how many first, and asks.</p>"
            + post_button("/retry", f"Retry every matching {status} job…", token, fields)
        )
    return "".join(body)


# The columns a job's page shows first, in this order; any others (a later migration's) after.
_SHOW_ORDER = (
    "id", "queue", "kind", "status", "priority", "attempts", "max_attempts",
    "recovery_policy", "reclaim_count", "run_at", "created_at", "updated_at", "finished_at",
    "lease_expires_at", "leased_by", "heartbeat_at", "attempt_token", "idempotency_key",
    "sequence", "depends_on", "has_dependents", "progress", "last_error",
)  # fmt: skip
_TIMES = {"run_at", "created_at", "updated_at", "finished_at", "lease_expires_at", "heartbeat_at"}
_LONG = {"payload", "errors", "output", "undecoded"}


def job_page(job: Mapping[str, Any], *, token: str | None, notice_key: str | None) -> str:
    status = str(job.get("status"))
    job_id = int(job["id"])
    actions = []
    if token is not None and status in RETRYABLE:
        actions.append(post_button(f"/jobs/{job_id}/retry", "Retry…", token, {}))
    if token is not None and status in CANCELLABLE:
        actions.append(post_button(f"/jobs/{job_id}/cancel", "Cancel…", token, {}))
    keys = [k for k in _SHOW_ORDER if k in job]
    keys += sorted(k for k in job if k not in _SHOW_ORDER and k not in _LONG)
    # Values Python cannot hold (store.job_show): their JSON text, with why.
    undecoded: Mapping[str, str] = job.get("undecoded") or {}
    fields = "".join(
        f"<dt>{text(k)}</dt><dd>{_field(k, job[k], undecoded.get(k))}</dd>"
        for k in keys
        if k != "status"
    )
    parts = [
        notice(notice_key),
        f'<h1>Job {job_id} <span class="status-{text(status)}">{text(status)}</span></h1>',
        f"<p>{' '.join(actions)}</p>" if actions else "",
        f"<dl>{fields}</dl>",
        "<h2>Payload</h2>",
        _undecoded(undecoded["payload"], job["payload"])
        if "payload" in undecoded
        else f"<pre>{pretty_json(job.get('payload'))}</pre>",
        # What the job's function returned (migration 0021); absent before that migration.
        *(
            [
                "<h2>Output</h2>",
                _undecoded(undecoded["output"], job["output"])
                if "output" in undecoded
                else f"<pre>{pretty_json(job['output'])}</pre>"
                if job["output"] is not None
                else '<p class="muted">None recorded.</p>',
            ]
            if "output" in job
            else []
        ),
        "<h2>Errors</h2>",
        _undecoded(undecoded["errors"], job["errors"])
        if "errors" in undecoded
        else _errors(job.get("errors"), job.get("last_error")),
    ]
    return "".join(parts)


def _undecoded(why: str, raw: object) -> str:
    """A value Python cannot hold: why, then its JSON text (cut as any long text is)."""
    return f'<p class="cut">Not decoded: {text(why)}. Its JSON text:</p><pre>{text(raw)}</pre>'


def _field(key: str, value: object, undecoded: str | None = None) -> str:
    if undecoded is not None:
        return _undecoded(undecoded, value)
    if value is None:
        return "-"
    if key == "kind":
        return exact(value, MAX_TEXT)
    if key == "depends_on" and isinstance(value, list):  # each dependency's own page
        return " ".join(f'<a href="/jobs/{int(d)}">{int(d)}</a>' for d in value)
    if key in _TIMES and isinstance(value, str):
        return moment(value)
    if isinstance(value, dict | list):  # a later migration's structured column
        return f"<pre>{pretty_json(value)}</pre>"
    return text(value)


def _errors(errors: object, last_error: object) -> str:
    if not isinstance(errors, list) or not errors:
        if last_error:
            return f"<pre>{text(last_error)}</pre>"
        return '<p class="muted">None recorded.</p>'
    shown = errors[-ERRORS_SHOWN:]
    out = []
    if len(errors) > len(shown):
        out.append(f'<p class="muted">The latest {len(shown)} of {len(errors)} attempts.</p>')
    for e in reversed(shown):
        e = e if isinstance(e, dict) else {"message": e}
        out.append(
            f"<h3>Attempt {text(e.get('attempt', '?'))} · {moment(e.get('at'))} · "
            f"{text(e.get('type', 'Error'), MAX_CELL)}</h3>"
            f"<pre>{text(e.get('message', ''))}</pre>"
        )
        if e.get("traceback"):
            out.append(f"<pre>{text(e['traceback'])}</pre>")
    return "".join(out)


def confirm_page(job: Mapping[str, Any], verb: str, token: str) -> str:
    job_id = int(job["id"])
    what = {
        "retry": "Queue it again, with a fresh set of attempts?",
        "cancel": "Cancel it? A queued job never runs; a running one loses its lease, and its "
        "outcome is refused.",
    }[verb]
    return (
        f"<h1>{verb.capitalize()} job {job_id}?</h1>"
        f'<div class="confirm"><p>Job {job_id} · {cell(job.get("queue"))} · '
        f'{exact(job.get("kind"))} · <span class="status-{text(job.get("status"))}">'
        f"{text(job.get('status'))}</span></p><p>{what}</p>"
        + post_button(f"/jobs/{job_id}/{verb}", f"Yes, {verb} job {job_id}", token, {"confirm": 1})
        + f' <a href="/jobs/{job_id}">No, back to the job</a></div>'
    )


def confirm_queue_page(queue: str, verb: str, token: str) -> str:
    what = {
        "pause": "Pause it? No run claims its jobs until it is resumed (a job already started "
        "runs to its end); its kicks are recorded and start no run.",
        "resume": "Resume it? Runs claim its jobs again, and the drain function is kicked if "
        "any is ready.",
    }[verb]
    return (
        f"<h1>{verb.capitalize()} queue {cell(queue)}?</h1>"
        f'<div class="confirm"><p>{what}</p>'
        + post_button(_queue_path(queue, verb), f"Yes, {verb} {text(queue)}", token, {"confirm": 1})
        + ' <a href="/">No, back to the queues</a></div>'
    )


def _retried_notice(queued: int | None, held: int | None) -> str:
    if queued is None:
        return ""
    kept = f" Not retried: {held:,} (a newer job holds its key)." if held else ""
    return f'<div class="notice">Queued again: {queued:,} jobs.{kept}</div>'


def bulk_page(
    filters: Mapping[str, str | None],
    preview: store.RetryPreview,
    *,
    token: str,
) -> str:
    """Retry by filter: what would be queued again (read without a change: its count and the
    first BULK_SHOWN jobs) with the button that does it. A job whose idempotency key another
    job holds is listed apart: it is not retried (the CLI's `retry` says the same)."""
    status = filters.get("status") or "failed"
    count = preview.would_retry
    held = [r for r in preview.first if r.held_by is not None]
    not_retried = (
        f"<h2>Not retried: the key is held ({preview.key_held:,})</h2>"
        + table(
            ["id", "queue", "kind", "key held by"],
            (
                [
                    f'<a href="/jobs/{r.id}">{r.id}</a>',
                    cell(r.queue),
                    exact(r.kind),
                    f'<a href="/jobs/{r.held_by}">{r.held_by}</a>',
                ]
                for r in held
            ),
            "None.",
        )
        if held
        else ""
    )  # by filter: failed or parked jobs, whose dependencies were done (store.Retry)
    shown = [r for r in preview.first if r.retried]
    listing = table(
        ["id", "queue", "kind"],
        ([f'<a href="/jobs/{m.id}">{m.id}</a>', cell(m.queue), exact(m.kind)] for m in shown),
        "None.",
    )
    more = f'<p class="muted">And {count - len(shown):,} more.</p>' if count > len(shown) else ""
    back = url("/jobs", {k: filters.get(k) for k in ("queue", "kind", "status", "since")})
    described = "".join(
        f"<li>{k}: {exact(v) if k == 'kind' else text(v)}</li>"
        for k, v in filters.items()
        if v and k != "since_at"
    )
    if not count:
        return (
            f"<h1>No {text(status)} job matches</h1><ul>{described}</ul>"
            f'{not_retried}<p><a href="{back}">Back to the jobs</a></p>'
        )
    fields = {**{k: v for k, v in filters.items() if k != "since"}, "confirm": 1}
    return (
        f"<h1>Retry {count:,} {text(status)} jobs?</h1><ul>{described}</ul>"
        f'<div class="confirm"><p>{count:,} jobs match now (a dry run: nothing has '
        "changed yet). Each is queued again with a fresh set of attempts.</p>"
        + post_button("/retry", f"Yes, retry {count:,} jobs", token, fields)
        + f' <a href="{back}">No, back to the jobs</a></div>{listing}{more}{not_retried}'
    )


def control_page(
    runs: Sequence[store.RunRow],
    wakes: Sequence[store.WakeRow],
    kicks: Sequence[store.KickRow],
    limits: Sequence[store.QueueLimitRow],
    now: dt.datetime,
    ended: Sequence[store.RunHistoryRow] = (),
) -> str:
    ended_rows = (
        [
            text(r.trigger) + (f" (hop {r.chain})" if r.chain else ""),
            cell(", ".join(r.queues)),
            moment(r.started_at),
            f"{r.duration_s:.1f}s" if r.duration_s < 60 else duration(r.duration_s),
            _num(r.claimed),
            _num(r.done),
            _num(r.failed),
            _num(r.retried),
            text(r.stop_reason) + (" (continued)" if r.continued else ""),
        ]
        for r in ended
    )
    run_rows = (
        [
            cell(r.run_id),
            cell(", ".join(r.queues)),
            str(r.chain),
            moment(r.started_at),
            duration(r.age_s),
            moment(r.deadline),
            "live" if r.live else "past its deadline (killed, or about to be forgotten)",
        ]
        for r in runs
    )
    wake_rows = (
        [
            cell(w.queue_set),
            moment(w.wake_at),
            f"in {duration(w.in_s)}" if w.pending else f"{duration(-w.in_s)} ago",
            text(w.state) + ("" if w.pending else " (done)"),
        ]
        for w in wakes
    )
    kick_rows = (
        [
            cell(k.queue),
            moment(k.requested_at),
            moment(k.kicked_at),
            f"held by a run until {moment(k.held_until)}" if k.held_until else "-",
        ]
        for k in kicks
    )
    limit_rows = ([cell(q.queue), str(q.running), str(q.max_running)] for q in limits)
    return (
        "<h1>Control plane</h1>"
        f'<p class="muted">As of {moment(now)}. A run is listed under Runs from when it '
        "registers (or is reserved by the run that fans out) until it exits; its exit writes its "
        "line under Recent runs. A run that never exits (killed at its timeout, or ended by an "
        "error) has no line there: it stays under Runs, past its deadline, for an hour.</p>"
        "<h2>Runs</h2>"
        + table(
            ["run", "queues", "chain", "started", "running for", "deadline", "state"],
            run_rows,
            "No run is draining now.",
        )
        + f'<h2>Recent runs</h2><p class="muted">The last {len(ended)} that ended, newest '
        "first (<code>pgdrain runs</code>).</p>"
        + table(
            [
                "trigger",
                "queues",
                "started",
                "took",
                "claimed",
                "done",
                "failed",
                "retried",
                "stop reason",
            ],
            ended_rows,
            "No run has ended yet (or retention deleted them).",
        )
        + "<h2>Wake-ups</h2>"
        + table(["queues", "at", "when", "state"], wake_rows, "No wake-up recorded.")
        + "<h2>Kicks</h2>"
        + table(
            ["queue", "last asked for", "last invoked a run", "held"],
            kick_rows,
            "No kick recorded.",
        )
        + "<h2>Queue limits</h2>"
        + table(["queue", "running", "limit"], limit_rows, "No limit (PGDRAIN_QUEUE_LIMITS).")
    )


def error_page(message: str) -> str:
    return f'<div class="error">{text(message)}</div>'
