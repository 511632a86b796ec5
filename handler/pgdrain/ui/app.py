"""The dashboard's routes, on Powertools' event handler. A request is a Lambda Function URL
event (payload 2.0): on AWS as Lambda hands it over, locally as local.py builds it from an HTTP
request. Pages read through the store functions the CLI's operator commands use; GET changes
nothing; every action is a POST from this dashboard's own origin with its token, and asks
first."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as dt
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal
from urllib.parse import parse_qs, urlencode

import psycopg
from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver, Response

from pgdrain.db import connection, store
from pgdrain.errors import BadInput, ConfigError, PgdrainError
from pgdrain.settings import QUEUE_NAME
from pgdrain.ui import pages
from pgdrain.ui.csrf import Tokens, same_origin
from pgdrain.ui.html import page

log = logging.getLogger(__name__)

PAGE_SIZE = 50
# A page's reads give up after this long (a filter that no index serves, on a long history).
READ_TIMEOUT_MS = 5000
# An action on one job or queue waits this long for its row (a transaction left open on it):
# then nothing changes, and the page says so.
ACTION_LOCK_TIMEOUT_MS = 5000
# What an action on Lambda leaves of the invocation's time to roll back and answer.
ACTION_MARGIN_MS = 2000
MAX_BODY_BYTES = 64 * 1024  # a form's fields: ids and filters
MAX_KIND_LENGTH = 200
MAX_SINCE_DAYS = 36_500
MAX_REFRESH_SECONDS = 3600
# How long a chart looks back: the day chart's 24 hours.
CHART_WINDOW = dt.timedelta(hours=24)
_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])\Z")
_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

Connect = Callable[[], AbstractContextManager[store.Connection]]


@dataclasses.dataclass(frozen=True)
class UiConfig:
    """actions: retry and cancel are offered (else the dashboard only reads); tokens: the CSRF
    tokens' issuer; origins: origins besides the dashboard's own whose POSTs are accepted (a
    proxy in front that rewrites Host)."""

    actions: bool
    tokens: Tokens
    origins: frozenset[str] = frozenset()


class Refused(Exception):
    """A request the dashboard will not serve: its status and one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    form: dict[str, list[str]]
    identity: str  # who is asking: the IAM caller on AWS, `local` locally

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> Request:
        context = event.get("requestContext") or {}
        http = context.get("http") or {}
        headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
        body = event.get("body") or ""
        raw = base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()
        if len(raw) > MAX_BODY_BYTES:
            raise Refused(413, f"the form is larger than {MAX_BODY_BYTES} bytes")
        iam = (context.get("authorizer") or {}).get("iam") or {}
        return cls(
            method=str(http.get("method", "GET")).upper(),
            path=str(event.get("rawPath", "/")),
            query=parse_qs(str(event.get("rawQueryString") or ""), keep_blank_values=True),
            headers=headers,
            form=parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True),
            identity=str(iam.get("userArn") or iam.get("callerId") or "local"),
        )

    def arg(self, name: str, *, exact: bool = False) -> str | None:
        """The field's last value; None when absent or empty. Stripped of surrounding spaces
        unless `exact`: a value compared as it is (a kind, a queue), as the CLI's options are."""
        values = (self.form if self.method == "POST" else self.query).get(name)
        value = values[-1] if values else ""
        return (value if exact else value.strip()) or None


def whole_number(text: str | None, digits: int = 19) -> int | None:
    """`text` as a whole number when it is one in ASCII digits, at most `digits` long; else
    None. str.isdigit() alone takes digits int() refuses ('²'), and int() refuses more than
    4,300 digits: either would fail the request instead of answering it."""
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > digits:
        return None
    return int(text)


FILTERS = ("queue", "kind", "status", "since", "before")
# Compared with a job's own value: "send " is another kind than "send".
EXACT_FILTERS = ("queue", "kind")


def parse_filters(request: Request) -> dict[str, str | None]:
    """The jobs filters as given (text, for links and forms), each checked as the CLI checks
    its options: one line saying what is wrong (400) otherwise."""
    filters = {k: request.arg(k, exact=k in EXACT_FILTERS) for k in FILTERS}
    queue, kind, status, before = (filters[k] for k in ("queue", "kind", "status", "before"))
    if queue is not None and not QUEUE_NAME.match(queue):
        raise BadInput(f"{queue[:40]!r} is not a queue name")
    if kind is not None and (len(kind) > MAX_KIND_LENGTH or not kind.isprintable()):
        raise BadInput(f"{kind[:40]!r} is not a job kind")
    if status is not None and status not in store.STATUSES:
        raise BadInput(f"status must be one of {', '.join(store.STATUSES)}")
    if before is not None and not 0 < (whole_number(before) or 0) < 2**63:
        raise BadInput("before must be a job id")
    since_at = request.arg("since_at")
    if since_at is not None:  # a confirmation carries the time its preview computed
        filters["since_at"] = parse_since(since_at).isoformat()
    elif filters["since"] is not None:
        filters["since_at"] = parse_since(filters["since"]).isoformat()
    return filters


def parse_since(text: str) -> dt.datetime:
    """An age (90s, 30m, 2h, 7d: that long ago) or an ISO 8601 time (naive = UTC), as the
    CLI's --since."""
    now = dt.datetime.now(dt.UTC)
    if match := _AGE.match(text):
        seconds = float(match[1]) * _AGE_UNITS[match[2]]
        if seconds > MAX_SINCE_DAYS * 86400:
            raise BadInput(f"since {text!r} reaches back more than 100 years")
        return now - dt.timedelta(seconds=seconds)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise BadInput(
            f"since {text[:40]!r} is neither an age (90s, 30m, 2h, 7d) nor an ISO 8601 time"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _since(filters: Mapping[str, str | None]) -> dt.datetime | None:
    value = filters.get("since_at")
    return dt.datetime.fromisoformat(value) if value else None


def html_response(
    status: int, title: str, body: str, *, active: str = "", refresh: int | None = None
) -> Response[str]:
    document, policy = page(title, body, active=active, refresh=refresh)
    return Response(
        status_code=status,
        content_type="text/html; charset=utf-8",
        body=document,
        headers={
            "Content-Security-Policy": policy,
            "X-Content-Type-Options": "nosniff",
            "X-Frame-Options": "DENY",
            "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store",
        },
    )


def redirect(location: str) -> Response[str]:
    """After an action: 303, so that reloading the page it lands on repeats nothing."""
    return Response(status_code=303, body="", headers={"Location": location})


def build(connect: Connect, config: UiConfig) -> LambdaFunctionUrlResolver:
    """The dashboard: its routes on a resolver, reading and acting through `connect()`."""
    app = LambdaFunctionUrlResolver()
    dashboard = _Dashboard(app, connect, config)
    app.get("/")(dashboard.queues)
    app.get("/jobs")(dashboard.jobs)
    app.get("/jobs/<job_id>")(dashboard.job)
    app.post("/jobs/<job_id>/<verb>")(dashboard.act)
    app.post("/retry")(dashboard.retry_matching)
    app.post("/queues/<queue>/<verb>")(dashboard.queue_act)
    app.get("/control")(dashboard.control)
    app.not_found(lambda _exc: html_response(404, "Not found", pages.error_page("No such page.")))
    app.exception_handler(Refused)(
        lambda exc: html_response(exc.status, "Refused", pages.error_page(str(exc)))
    )
    app.exception_handler(BadInput)(
        lambda exc: html_response(400, "Bad request", pages.error_page(str(exc)))
    )
    app.exception_handler(psycopg.errors.QueryCanceled)(_too_long)
    # ConfigError is a BadInput, but of the database settings, not of the request.
    app.exception_handler([PgdrainError, ConfigError])(_unavailable)
    app.exception_handler(psycopg.Error)(_unavailable)
    return app


def _kick(conn: store.Connection, queue: str) -> bool:
    """Start the drain function for `queue` (PGDRAIN_FUNCTION_NAME), as `pgdrain enqueue` and
    `pgdrain resume` do; whether it was invoked. Never fails the action: the resume is
    committed, and the next run (a wake-up, the schedule) takes the jobs."""
    from pgdrain.aws.kick import kick_outcome
    from pgdrain.settings import Settings

    try:
        settings = Settings.from_env(os.environ)
        if not settings.function_name:
            return False
        return bool(kick_outcome(conn, [queue], settings=settings).invoked)
    except (PgdrainError, psycopg.Error) as exc:
        log.warning("dashboard resume: the kick failed", extra={"queue": queue, "error": str(exc)})
        return False


def _retried(outcome: list[store.Retry]) -> str:
    """The notice of a retry that queued the job again: now, or after a cancelled lease."""
    if any(r.lease_wait_until is not None for r in outcome):
        return "retried-after-lease"
    return "retried"


def _not_retried(outcome: list[store.Retry]) -> str:
    """The notice of a retry that queued nothing again: why, where the statement said."""
    if any(r.dependency is not None for r in outcome):
        return "not-retried-dependency"
    if any(r.held_by is not None for r in outcome):
        return "not-retried-key"
    return "not-retried"


# What an action's redirect tells the page it lands on, under a seal (_Dashboard._after).
NOTICE_FIELDS = ("notice", "retried", "held")


def _seal_subject(identity: str, path: str, notice: Mapping[str, str]) -> str:
    """What a notice's seal is issued to: the caller, the page, and every notice field."""
    return "\n".join(
        [identity, "notice", path, *(f"{k}={notice.get(k, '')}" for k in NOTICE_FIELDS)]
    )


def _too_long(_exc: Exception) -> Response[str]:
    message = (
        f"the query took longer than {READ_TIMEOUT_MS / 1000:g} s and was stopped: narrow it "
        "with a status or a queue (those are read from an index; a kind or a time alone walks "
        "the jobs from the newest)"
    )
    return html_response(503, "Too long", pages.error_page(message))


def _unavailable(exc: Exception) -> Response[str]:
    reason = connection.describe(exc) if isinstance(exc, psycopg.Error) else str(exc)
    log.warning("dashboard request failed: %s", reason)
    return html_response(503, "Database error", pages.error_page(f"database error: {reason}"))


class _Dashboard:
    def __init__(self, app: LambdaFunctionUrlResolver, connect: Connect, config: UiConfig) -> None:
        self._app = app
        self._connect = connect
        self._config = config

    @contextlib.contextmanager
    def _reading(self) -> Iterator[store.Connection]:
        """A connection for a page's reads, each bounded by READ_TIMEOUT_MS."""
        with self._connect() as conn, conn.transaction():
            store.operator_read_timeout(conn, READ_TIMEOUT_MS)
            yield conn

    @contextlib.contextmanager
    def _acting_on(self, conn: store.Connection, what: str) -> Iterator[None]:
        """One transaction for an action on `what` (a job, a queue), whose lock waits give up
        after ACTION_LOCK_TIMEOUT_MS: rolled back, and a 503 that says so."""
        try:
            with conn.transaction():
                store.lock_timeout(conn, ACTION_LOCK_TIMEOUT_MS)
                yield
        except psycopg.errors.LockNotAvailable:
            raise Refused(
                503,
                f"{what} is locked by another transaction, still open after "
                f"{ACTION_LOCK_TIMEOUT_MS / 1000:g} s: nothing was changed; try again",
            ) from None

    def _request(self) -> Request:
        return Request.from_event(self._app.current_event.raw_event)

    def _token(self, request: Request) -> str | None:
        """The token for this page's forms; None when actions are off (no forms)."""
        return self._config.tokens.issue(request.identity) if self._config.actions else None

    def _check_post(self, request: Request) -> str:
        """Refuse (403) an action that is off, from another origin, or without this
        dashboard's token; return the token for the page that follows."""
        if not self._config.actions:
            raise Refused(403, "actions are off: this dashboard only reads")
        if not same_origin(
            request.headers.get("origin"), request.headers.get("host"), self._config.origins
        ):
            raise Refused(403, "refused: the request does not come from this dashboard's pages")
        if not self._config.tokens.valid(request.arg("token"), request.identity):
            raise Refused(403, "refused: the form's token is missing or expired; reload the page")
        return self._config.tokens.issue(request.identity)

    def _after(
        self,
        path: str,
        request: Request,
        notice: Mapping[str, str],
        other: Mapping[str, object] | None = None,
    ) -> str:
        """Where an action redirects: `path` with its notice (and counts), sealed for this
        caller and path, so that a link made elsewhere cannot put words on the page."""
        seal = self._config.tokens.issue(_seal_subject(request.identity, path, notice))
        return f"{path}?{urlencode({**(other or {}), **notice, 'seal': seal})}"

    def _sealed(self, request: Request) -> dict[str, str]:
        """The notice fields of this page's URL when their seal holds (an action's redirect to
        this caller); else none."""
        notice = {k: v for k in NOTICE_FIELDS if (v := request.arg(k)) is not None}
        subject = _seal_subject(request.identity, request.path, notice)
        return notice if self._config.tokens.valid(request.arg("seal"), subject) else {}

    def _refresh(self, request: Request) -> int | None:
        seconds = whole_number(request.arg("refresh"), 9)
        if seconds is None:
            return None
        return min(max(seconds, 1), MAX_REFRESH_SECONDS)

    def queues(self) -> Response[str]:
        request = self._request()
        with self._reading() as conn:
            stats = store.queue_stats(conn)
            limits = store.queue_limit_list(conn)
            kicks = store.kick_list(conn)
            now = dt.datetime.now(dt.UTC)
            throughput = store.job_finished_per_minute(conn, now - CHART_WINDOW)
            done_kept = store.runs_keep_done(conn) is not False
        body = pages.queues_page(
            stats,
            limits,
            throughput,
            now,
            kicks=kicks,
            token=self._token(request),
            notice_key=self._sealed(request).get("notice"),
            done_kept=done_kept,
        )
        return html_response(200, "Queues", body, active="/", refresh=self._refresh(request))

    def queue_act(self, queue: str, verb: str) -> Response[str]:
        """Pause or resume a queue: a confirmation page first, then (confirm=1) the action. A
        resume kicks the drain function as `pgdrain resume` does: a run when a job of the queue
        is ready, a wake-up when one is due later."""
        request = self._request()
        if verb not in ("pause", "resume") or not QUEUE_NAME.match(queue):
            raise Refused(404, "No such action.")
        token = self._check_post(request)
        if request.arg("confirm") != "1":
            title = f"{verb.capitalize()} queue {queue}?"
            return html_response(200, title, pages.confirm_queue_page(queue, verb, token))
        with self._connect() as conn:
            if verb == "pause":
                with self._acting_on(conn, f"queue {queue}"):
                    store.queue_pause(conn, queue)
                key = "paused"
            else:
                with self._acting_on(conn, f"queue {queue}"):
                    was_paused = store.queue_resume(conn, queue)
                ready = store.queue_has_ready(conn, [queue])
                # A run when a job is ready, else a wake-up for the next one due (as kick()).
                kicked = _kick(conn, queue) and ready
                key = ("resumed-kicked" if kicked else "resumed") if was_paused else "not-paused"
        log.info("dashboard %s", verb, extra={"queue": queue, "by": request.identity, "key": key})
        return redirect(self._after("/", request, {"notice": key}))

    def jobs(self) -> Response[str]:
        request = self._request()
        filters = parse_filters(request)
        status = filters["status"]
        with self._reading() as conn:
            rows = store.job_list(
                conn,
                [status] if status else list(store.STATUSES),
                PAGE_SIZE + 1,
                queue=filters["queue"],
                kind=filters["kind"],
                since=_since(filters),
                before=int(filters["before"]) if filters["before"] else None,
                values=False,  # the page shows neither progress nor output
            )
        next_before = rows[PAGE_SIZE - 1].id if len(rows) > PAGE_SIZE else None
        shown = {k: v for k, v in filters.items() if k != "since_at"}
        retried = None
        notice = self._sealed(request)
        if notice.get("notice") == "bulk-retried":  # after a retry by filter: its counts
            retried = (
                whole_number(notice.get("retried"), 9),
                whole_number(notice.get("held"), 9),
            )
        body = pages.jobs_page(
            shown, rows[:PAGE_SIZE], next_before, token=self._token(request), retried=retried
        )
        return html_response(200, "Jobs", body, active="/jobs")

    def job(self, job_id: str) -> Response[str]:
        request = self._request()
        found = self._find(job_id)
        notice_key = self._sealed(request).get("notice")
        body = pages.job_page(found, token=self._token(request), notice_key=notice_key)
        refresh = self._refresh(request)
        if refresh and found.get("status") not in ("queued", "running"):
            refresh = None  # it has finished: nothing more to watch
        return html_response(200, f"Job {found['id']}", body, active="/jobs", refresh=refresh)

    def _find(self, job_id: str) -> dict[str, Any]:
        if not 0 < (whole_number(job_id) or 0) < 2**63:
            raise Refused(404, "No such job.")
        with self._reading() as conn:
            found = store.job_show(conn, int(job_id))
            # The function's runs delete their done jobs: the id may be one of those.
            gone = found is None and store.runs_keep_done(conn) is False
        if found is None:
            note = f" {pages.DONE_NOT_KEPT_GONE}" if gone else ""
            raise Refused(404, f"No job {int(job_id)}.{note}")
        return found

    def act(self, job_id: str, verb: str) -> Response[str]:
        """Retry or cancel one job: a confirmation page first, then (confirm=1) the action."""
        request = self._request()
        if verb not in ("retry", "cancel"):
            raise Refused(404, "No such action.")
        token = self._check_post(request)
        found = self._find(job_id)
        status = found.get("status")
        if request.arg("confirm") != "1":
            allowed = pages.RETRYABLE if verb == "retry" else pages.CANCELLABLE
            if status not in allowed:  # asked from a page older than the job's state
                raise Refused(
                    409,
                    f"job {found['id']} is {status}: only a {', '.join(allowed[:-1])} or "
                    f"{allowed[-1]} job can be {'retried' if verb == 'retry' else 'cancelled'}",
                )
            title = f"{verb.capitalize()} job {found['id']}?"
            return html_response(200, title, pages.confirm_page(found, verb, token), active="/jobs")
        with self._connect() as conn:
            # Each try of a retry or a cancel reads a snapshot of its own (store.job_retry,
            # store.job_cancel), whatever the server's default isolation.
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            with self._acting_on(conn, f"job {found['id']}"):
                if verb == "retry":
                    outcome = store.job_retry(conn, [found["id"]])
                    done = any(r.retried for r in outcome)
                    key = _retried(outcome) if done else _not_retried(outcome)
                else:
                    done = bool(store.job_cancel(conn, [found["id"]]))
                    key = "cancelled" if done else "not-cancelled"
                    if not done and status == "cancelled":
                        key = "already-cancelled"
        log.info(
            "dashboard %s",
            verb,
            extra={"job_id": found["id"], "by": request.identity, "done": done},
        )
        watch = {"refresh": 2} if key == "retried" else {}
        return redirect(self._after(f"/jobs/{found['id']}", request, {"notice": key}, watch))

    def retry_matching(self) -> Response[str]:
        """Retry by filter, as `pgdrain retry --failed|--parked [filters]`: first what it would
        do, with its count, then (confirm=1) the retry, stopped if it outlasts the invocation."""
        request = self._request()
        token = self._check_post(request)
        filters = parse_filters(request)
        statuses: list[Literal["failed", "parked"]]
        if filters["status"] == "failed":
            statuses = ["failed"]
        elif filters["status"] == "parked":
            statuses = ["parked"]
        else:
            raise BadInput("retry by filter takes status failed or parked")
        if request.arg("confirm") != "1":
            return self._retry_preview(filters, statuses, token)
        bound = self._time_left_ms()
        try:
            with self._connect() as conn:
                conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED  # as act() says
                with conn.transaction():
                    # Past the invocation's end: stopped and said, not a 502 while it runs on.
                    if bound is not None:
                        store.operator_read_timeout(conn, bound)
                    matched = store.job_retry_matching(
                        conn,
                        statuses,
                        queue=filters["queue"],
                        kind=filters["kind"],
                        since=_since(filters),
                    )
        except psycopg.errors.QueryCanceled:
            took = "the database's statement_timeout"
            if bound is not None:
                took = f"the {bound / 1000:g} s this request had left"
            raise Refused(
                503,
                f"the retry took longer than {took} and was stopped: nothing was retried. Narrow "
                f"the filter (a queue, a kind, since), or run `pgdrain retry --{statuses[0]}` with "
                "the same filters",
            ) from None
        retried = sum(r.retried for r in matched)
        log.info("dashboard retry by filter", extra={"jobs": retried, "by": request.identity})
        # To the jobs it matched, as every action redirects (303): a reload repeats nothing.
        since = filters["since"] or filters.get("since_at")
        shown = {"queue": filters["queue"], "kind": filters["kind"], "since": since}
        query = {k: v for k, v in shown.items() if v} | {"status": filters["status"]}
        held = sum(r.held_by is not None for r in matched)
        counts = {"notice": "bulk-retried", "retried": str(retried), "held": str(held)}
        return redirect(self._after("/jobs", request, counts, query))

    def _retry_preview(
        self,
        filters: Mapping[str, str | None],
        statuses: list[Literal["failed", "parked"]],
        token: str,
    ) -> Response[str]:
        """What the retry would do, read within a page's time: its counts and a first page."""
        try:
            with self._reading() as conn:
                preview = store.job_retry_matching_preview(
                    conn,
                    statuses,
                    queue=filters["queue"],
                    kind=filters["kind"],
                    since=_since(filters),
                    shown=pages.BULK_SHOWN,
                )
        except psycopg.errors.QueryCanceled:
            raise Refused(
                503,
                f"counting the matching jobs took longer than {READ_TIMEOUT_MS / 1000:g} s and "
                "was stopped: nothing was retried. Narrow the filter (a queue, a kind, since), "
                f"or run `pgdrain retry --{statuses[0]}` with the same filters",
            ) from None
        body = pages.bulk_page(filters, preview, token=token)
        return html_response(200, "Retry by filter", body, active="/jobs")

    def _time_left_ms(self) -> int | None:
        """How long an action's statement may take: the invocation's time left on Lambda, less
        ACTION_MARGIN_MS to roll back and answer; None locally, where it takes what it takes."""
        context = getattr(self._app, "lambda_context", None)
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        if remaining is None:
            return None
        return max(int(remaining()) - ACTION_MARGIN_MS, 1)

    def control(self) -> Response[str]:
        request = self._request()
        with self._reading() as conn:
            runs = store.run_list(conn)
            ended = store.run_history_list(conn)
            wakes = store.wake_list(conn)
            kicks = store.kick_list(conn)
            limits = store.queue_limit_list(conn)
        now = dt.datetime.now(dt.UTC)
        body = pages.control_page(runs, wakes, kicks, limits, now, ended)
        return html_response(
            200, "Control plane", body, active="/control", refresh=self._refresh(request)
        )
