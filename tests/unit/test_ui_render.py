"""The dashboard without a database: job data rendered as text (and the control: the same page
without escaping carries live markup), the page's policy, the forms' tokens and the origin
check, the charts' buckets, and a local HTTP request turned into the Function URL event that
Lambda hands over."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest

from pgdrain.db import store
from pgdrain.errors import BadInput, ConfigError
from pgdrain.ui import app, charts, csrf, html, lambda_entry, local, pages

HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"


def _job(**fields: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "id": 7,
        "queue": "emails",
        "kind": HOSTILE,
        "status": "failed",
        "attempts": 1,
        "max_attempts": 1,
        "payload": {"note": HOSTILE},
        "last_error": HOSTILE,
        "errors": [{"attempt": 1, "type": HOSTILE, "message": HOSTILE, "traceback": HOSTILE}],
    }
    job.update(fields)
    return job


def _markup(document: str) -> list[str]:
    """The tags of a page that could run or load something."""
    return re.findall(r"<(?:script|img|iframe|object|embed)\b", document, re.IGNORECASE)


def test_job_data_is_escaped_on_every_page_that_shows_it() -> None:
    token = "1.x"
    rendered = [
        pages.job_page(_job(), token=token, notice_key=None),
        pages.confirm_page(_job(), "retry", token),
        pages.jobs_page({"kind": HOSTILE}, [], None, token=token),
        pages.bulk_page(
            {"status": "failed", "kind": HOSTILE},
            store.RetryPreview(
                1,
                1,
                [
                    store.Retry(7, "emails", HOSTILE, True, None),
                    store.Retry(8, "emails", HOSTILE, False, 7),
                ],
            ),
            token=token,
        ),
    ]
    for body in rendered:
        assert _markup(body) == []
        assert "&lt;script&gt;" in body


def test_control_without_escaping_the_same_page_carries_live_markup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pages, "text", lambda value, limit=0: str(value))
    monkeypatch.setattr(pages, "cell", lambda value: str(value))
    body = pages.job_page(_job(), token=None, notice_key=None)
    assert "<script" in body.lower() and "<img" in body.lower()


# What plain SQL may write in a job's error history where pgdrain writes an ISO time, a
# number and text: each rendered as its text. A red team's report: each was a 502.
ODD_ERROR_RECORDS: dict[str, tuple[dict[str, Any], str]] = {
    "at-number": ({"attempt": 1, "at": 1700000000, "message": "m"}, "1700000000"),
    "at-list": ({"at": [1]}, "[1]"),
    "at-object": ({"at": {"a": "<b>"}}, "{&quot;a&quot;: &quot;&lt;b&gt;&quot;}"),
    "at-no-utc-form": ({"at": "0001-01-01T00:00:00+05:00"}, "0001-01-01T00:00:00+05:00"),
    "at-not-a-time": ({"at": "<i>soon</i>"}, "&lt;i&gt;soon&lt;/i&gt;"),
    "other-fields": (
        {"at": True, "attempt": {"x": 1}, "type": None, "message": [2], "traceback": {"t": 3}},
        "true",
    ),
}


@pytest.mark.parametrize("record", list(ODD_ERROR_RECORDS), ids=list(ODD_ERROR_RECORDS))
def test_an_error_record_of_any_shape_is_shown_as_its_text(record: str) -> None:
    error, shown = ODD_ERROR_RECORDS[record]
    body = pages.job_page(_job(errors=[error, "plain", None]), token=None, notice_key=None)
    assert f"<h3>Attempt {html.text(error.get('attempt', '?'))} · {shown} · " in body
    assert _markup(body) == []


def test_a_time_is_shown_in_utc() -> None:
    assert html.moment("2024-01-01T02:00:00+02:00") == "2024-01-01 00:00:00 UTC"
    assert html.moment(dt.datetime(2024, 1, 1, tzinfo=dt.UTC)) == "2024-01-01 00:00:00 UTC"
    assert html.moment(None) == "-"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("a\x00b", "a\\x00b"),
        ("esc\x1b[31m", "esc\\x1b[31m"),
        ("tab\tnew\nline", "tab\tnew\nline"),
        ("\u202eevil", "\\u202eevil"),
        (b"\xff\xfeok".decode("utf-8", "surrogateescape"), "\\udcff\\udcfeok"),
        (b"\xff\xfeok", "\\xff\\xfeok"),
        ("\"quoted\" & 'single'", "&quot;quoted&quot; &amp; &#x27;single&#x27;"),
    ],
)
def test_text_shows_what_cannot_be_shown_as_escapes(value: object, shown: str) -> None:
    out = html.text(value)
    assert out == shown
    out.encode("utf-8")  # no lone surrogate left: the page encodes


def test_a_huge_value_is_cut_with_a_marker() -> None:
    out = html.text("y" * 1_000_000)
    assert out.startswith("y" * html.MAX_TEXT + ' <span class="cut">')
    assert f"{1_000_000 - html.MAX_TEXT:,} more characters not shown" in out
    assert len(html.cell("z" * 10_000)) < html.MAX_CELL + 100


def test_the_page_allows_no_script_and_only_its_own_styles() -> None:
    document, policy = html.page("t", "<p>x</p>", active="/")
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'none'"
    assert "script-src" not in directives  # so default-src 'none': no script runs
    nonce = re.search(r"'nonce-([^']+)'", directives["style-src"])
    assert nonce and f'<style nonce="{nonce.group(1)}">' in document
    assert directives["form-action"] == "'self'" and directives["frame-ancestors"] == "'none'"
    assert html.page("t", "", active="/")[1] != policy  # a fresh nonce per page


def test_links_carry_job_data_percent_encoded() -> None:
    assert html.url("/jobs", {"kind": '"><x', "queue": None}) == "/jobs?kind=%22%3E%3Cx"


def _paused(queue: str) -> store.QueueStats:
    return store.QueueStats(queue, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, 0, paused=True)


def test_a_queue_button_posts_to_its_own_queue_only() -> None:
    """A paused queue's row comes from pgdrain.queue_limits, whose name no CHECK holds: a name
    written there by hand gets no button, so its path cannot post to another action."""
    button = pages.queue_state(_paused("emails.v2"), token="t")
    assert 'action="/queues/emails.v2/resume"' in button
    hostile = pages.queue_state(_paused("pq/../../jobs/1/cancel?"), token="t")
    assert "<form" not in hostile and "paused" in hostile
    confirm = pages.confirm_queue_page("emails.v2", "pause", "t")
    assert 'action="/queues/emails.v2/pause"' in confirm


# -- tokens and origins ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_is_valid_for_whom_it_was_issued_until_it_expires() -> None:
    clock = Clock()
    tokens = csrf.Tokens(b"k" * 32, clock)
    token = tokens.issue("arn:aws:iam::1:user/ada")
    assert tokens.valid(token, "arn:aws:iam::1:user/ada")
    assert not tokens.valid(token, "arn:aws:iam::1:user/eve")  # another operator's
    assert not csrf.Tokens(b"j" * 32, clock).valid(token, "arn:aws:iam::1:user/ada")
    issued, mac = token.split(".")
    assert not tokens.valid(f"{int(issued) + 1}.{mac}", "arn:aws:iam::1:user/ada")
    for bad in (None, "", "x", "1.2.3", f"{issued}.", "-1.abc", "9" * 20 + ".abc"):
        assert not tokens.valid(bad, "arn:aws:iam::1:user/ada")
    clock.now += csrf.TOKEN_LIFETIME_SECONDS + 1
    assert not tokens.valid(token, "arn:aws:iam::1:user/ada")


def test_control_a_token_from_a_clock_slightly_ahead_is_accepted_not_one_far_ahead() -> None:
    clock = Clock()
    ahead = csrf.Tokens(b"k" * 32, lambda: clock.now + csrf.CLOCK_SKEW_SECONDS - 1)
    far = csrf.Tokens(b"k" * 32, lambda: clock.now + csrf.CLOCK_SKEW_SECONDS + 5)
    tokens = csrf.Tokens(b"k" * 32, clock)
    assert tokens.valid(ahead.issue("a"), "a")
    assert not tokens.valid(far.issue("a"), "a")


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "ok"),
    [
        ("http://127.0.0.1:8080", "127.0.0.1:8080", (), True),
        ("https://abc.lambda-url.eu-west-1.on.aws", "abc.lambda-url.eu-west-1.on.aws", (), True),
        ("https://evil.example", "127.0.0.1:8080", (), False),
        ("http://127.0.0.1:9999", "127.0.0.1:8080", (), False),
        ("null", "127.0.0.1:8080", (), False),
        (None, "127.0.0.1:8080", (), False),
        ("javascript://127.0.0.1:8080", "127.0.0.1:8080", (), False),
        ("http://localhost:9000", "abc.lambda-url.on.aws", ("http://localhost:9000",), True),
    ],
)
def test_only_a_post_from_the_dashboards_own_origin_passes(
    origin: str | None, host: str, allowed: tuple[str, ...], ok: bool
) -> None:
    assert csrf.same_origin(origin, host, allowed) is ok


# -- charts ----------------------------------------------------------------------------------


def _minute(hh: int, mm: int) -> dt.datetime:
    return dt.datetime(2026, 1, 2, hh, mm, tzinfo=dt.UTC)


def test_counts_land_in_their_bucket_and_what_was_not_counted_is_grey() -> None:
    throughput = store.Throughput(
        since=_minute(10, 0),
        counted_from=_minute(10, 2),
        minutes=[
            store.MinuteCount(_minute(10, 1), "a", 5, 0, 0),
            store.MinuteCount(_minute(10, 2), "a", 3, 1, 0),
            store.MinuteCount(_minute(10, 2), "b", 2, 0, 1),
            store.MinuteCount(_minute(10, 4), "a", 1, 1, 0),
        ],
    )
    rows = charts.buckets(throughput, _minute(10, 0), _minute(10, 5), dt.timedelta(minutes=1))
    assert [(b.done, b.failed, b.counted) for b in rows] == [
        (0, 0, False),
        (5, 0, False),  # the oldest minute the bound reached: only part of it was counted
        (5, 1, True),
        (0, 0, True),
        (1, 1, True),
    ]
    svg = charts.bar_chart("t", rows, dt.timedelta(minutes=1))
    assert svg.count('fill="#e5e7eb"') == 2 and "not counted" in svg
    assert svg.count('fill="#dc2626"') == 2  # failed, stacked on done
    only_b = charts.buckets(
        throughput, _minute(10, 0), _minute(10, 5), dt.timedelta(minutes=5), "b"
    )
    assert [(b.done, b.failed) for b in only_b] == [(2, 0)]


# -- requests --------------------------------------------------------------------------------


def test_a_local_request_becomes_the_event_lambda_would_hand_over() -> None:
    event = local.to_event(
        "POST",
        "/jobs/7/retry?x=1",
        {"Host": "127.0.0.1:8080", "Origin": "http://127.0.0.1:8080"},
        b"token=1.ab&confirm=1&kind=%3Cscript%3E",
        "127.0.0.1",
    )
    assert event["version"] == "2.0" and event["rawPath"] == "/jobs/7/retry"
    assert event["requestContext"]["http"]["method"] == "POST"
    request = app.Request.from_event(event)
    assert request.headers["origin"] == "http://127.0.0.1:8080"
    assert (request.arg("token"), request.arg("confirm"), request.arg("kind")) == (
        "1.ab",
        "1",
        "<script>",
    )
    assert request.identity == "local"


@pytest.mark.parametrize(
    ("target", "path", "query"),
    [("//jobs", "//jobs", ""), ("//evil.example/x?a=1", "//evil.example/x", "a=1"), ("/", "/", "")],
)
def test_a_local_request_target_is_a_path_never_a_host(target: str, path: str, query: str) -> None:
    """A red team's report: `GET //jobs` served the queues page (`jobs` read as a host)."""
    event = local.to_event("GET", target, {"Host": "127.0.0.1:8080"}, b"", "127.0.0.1")
    assert (event["rawPath"], event["rawQueryString"]) == (path, query)
    assert event["requestContext"]["http"]["path"] == path


def test_the_caller_on_aws_is_the_iam_principal() -> None:
    event = local.to_event("GET", "/", {}, b"", "1.2.3.4")
    event["requestContext"]["authorizer"] = {"iam": {"userArn": "arn:aws:iam::1:user/ada"}}
    assert app.Request.from_event(event).identity == "arn:aws:iam::1:user/ada"


def test_a_huge_form_is_refused() -> None:
    event = local.to_event("POST", "/retry", {}, b"x" * (app.MAX_BODY_BYTES + 1), "1.2.3.4")
    with pytest.raises(app.Refused) as refused:
        app.Request.from_event(event)
    assert refused.value.status == 413


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("queue=bad%20queue", "is not a queue name"),
        ("kind=%1b", "is not a job kind"),
        ("status=lost", "status must be one of"),
        ("before=-3", "before must be a job id"),
        ("since=yesterday", "neither an age"),
    ],
)
def test_a_bad_filter_says_what_is_wrong(query: str, message: str) -> None:
    request = app.Request.from_event(local.to_event("GET", f"/jobs?{query}", {}, b"", "x"))
    with pytest.raises(BadInput, match=message):
        app.parse_filters(request)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PGDRAIN_UI_ACTIONS": "yes"}, "must be true or false"),
        ({"PGDRAIN_UI_SECRET": "short"}, "at least 32 characters"),
    ],
)
def test_the_function_refuses_bad_settings(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        lambda_entry.config_from_env(env)


def test_the_function_reads_only_unless_actions_are_on() -> None:
    assert lambda_entry.config_from_env({}).actions is False
    on = lambda_entry.config_from_env(
        {"PGDRAIN_UI_ACTIONS": "true", "PGDRAIN_UI_SECRET": "s" * 32, "PGDRAIN_UI_ORIGINS": "a, b/"}
    )
    assert on.actions and on.origins == {"a", "b"}


@pytest.mark.parametrize("cut_at_minutes_ago", [10, 120], ids=["within-the-hour", "before-it"])
def test_the_last_hours_column_says_when_the_count_stopped_within_the_hour(
    cut_at_minutes_ago: int,
) -> None:
    """A red team's finding: 60,000 jobs done in the last hour read "50,000 / 0", as exact,
    when the count stopped at its bound. Past the bound within the hour, the sums are lower
    bounds, marked +; the control, a count whole for the hour, is exact."""
    now = dt.datetime(2026, 12, 7, 12, 0, 30, tzinfo=dt.UTC)
    since = now - dt.timedelta(days=1)
    cut = now.replace(second=0) - dt.timedelta(minutes=cut_at_minutes_ago)
    minutes = [  # within the hour, after the cut
        store.MinuteCount(now.replace(second=0) - dt.timedelta(minutes=i), "emails", 100, 1, 0)
        for i in range(2, 6)
    ]
    stats = store.QueueStats("emails", 0, 0, 0, 0, 400, 4, 0, 0, 0.0, 0)
    page = pages.queues_page([stats], [], store.Throughput(since, cut, minutes), now)
    within = cut_at_minutes_ago < 60
    assert ("400+ / 4+" in page) is within
    assert ("400 / 4<" in page) is not within
    assert "(grey; + in the column)" in page
