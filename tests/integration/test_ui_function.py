"""The dashboard against a real PostgreSQL, as the Lambda function serves it: the store's
bounded reads behind its pages, a request as a Function URL hands it over (an IAM caller, a
token issued to that caller), and the database roles of dashboard_role.sql: the read-only role
serves every page and cannot change a job whatever the dashboard asks, the actions role can
retry and cancel and nothing more. The control: the schema's owner can do what they cannot."""

from __future__ import annotations

import datetime as dt
import html
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from importlib import resources
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers.dashboard import ADA, SECRET, dashboard_event, dashboard_function
from helpers.fixtures import UNREADABLE_JSON, job_row, unreadable_job, wait_for
from helpers.history import view_write_of_0033
from helpers.lock_waits import someone_here_waits_on_a_lock
from pgdrain import enqueue, pause_queue, resume_queue
from pgdrain.db import store
from pgdrain.db.migrate import migrate
from pgdrain.db.store import operator_commands
from pgdrain.errors import PgdrainError
from pgdrain.ui import app as ui_app
from pgdrain.ui import lambda_entry
from pgdrain.ui.pages import DONE_NOT_KEPT_GONE, NOTICES

Conn = psycopg.Connection[Any]


def _finish(conn: Conn, ids: list[int], status: str, ago: dt.timedelta) -> None:
    conn.execute(
        "UPDATE pgdrain.jobs SET status = %s, finished_at = now() - %s WHERE id = ANY(%s)",
        (status, ago, ids),
    )


# -- the store's reads -----------------------------------------------------------------------


def test_finished_jobs_are_counted_per_minute_and_queue(conn: Conn) -> None:
    done = [enqueue(conn, "k", queue="a") for _ in range(3)]
    failed = [enqueue(conn, "k", queue="b") for _ in range(2)]
    old = [enqueue(conn, "k", queue="a")]
    _finish(conn, done, "done", dt.timedelta(minutes=5))
    _finish(conn, failed, "failed", dt.timedelta(minutes=5))
    _finish(conn, old, "done", dt.timedelta(days=2))
    since = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    counted = store.job_finished_per_minute(conn, since)
    assert counted.counted_from == since  # under the bound: every minute is whole
    assert {(m.queue, m.done, m.failed) for m in counted.minutes} == {("a", 3, 0), ("b", 0, 2)}


def test_past_the_bound_the_count_says_where_it_stopped(conn: Conn) -> None:
    ids = [enqueue(conn, "k") for _ in range(6)]
    for i, job_id in enumerate(ids):  # one a minute, the newest first
        _finish(conn, [job_id], "done", dt.timedelta(minutes=i, seconds=30))
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    counted = store.job_finished_per_minute(conn, since, limit=4)
    assert sum(m.done for m in counted.minutes) == 4
    assert counted.counted_from == counted.minutes[0].minute + dt.timedelta(minutes=1)


def test_the_control_plane_tables_read_with_never_as_none(conn: Conn) -> None:
    conn.execute(
        "INSERT INTO pgdrain.kicks (queue, kicked_at, requested_at) "
        "VALUES ('q', '-infinity', now())"
    )
    conn.execute(
        "INSERT INTO pgdrain.runs (run_id, queues, deadline) "
        "VALUES ('r1', ARRAY['q'], now() + interval '1 minute'), "
        "('dead', ARRAY['q'], now() - interval '1 minute')"
    )
    conn.execute(
        "INSERT INTO pgdrain.wakes (queue_set, wake_at, state, reserved_by, reserved_until) "
        "VALUES ('q', now() + interval '5 minutes', 'created', 'r1', now())"
    )
    (kick,) = store.kick_list(conn)
    assert (kick.queue, kick.kicked_at, kick.held_until) == ("q", None, None)
    assert {(r.run_id, r.live) for r in store.run_list(conn)} == {("r1", True), ("dead", False)}
    (wake,) = store.wake_list(conn)
    assert wake.pending and 240 < wake.in_s <= 300


def test_job_list_pages_before_an_id(conn: Conn) -> None:
    ids = [enqueue(conn, "k") for _ in range(5)]
    page = store.job_list(conn, store.STATUSES, 2, before=ids[3])
    assert [r.id for r in page] == [ids[2], ids[1]]


# -- the function, as a Function URL invokes it ------------------------------------------------


def _token(function: Any, job_id: int, caller: str = ADA) -> str:
    page = function.resolve(dashboard_event("GET", f"/jobs/{job_id}", caller=caller), None)
    match = re.search(r'name="token" value="([^"]+)"', page["body"])
    assert match, "the page offers no action"
    return match.group(1)


def _unsealed(answer: dict[str, Any]) -> str:
    """An action's redirect without the seal of its notice (a token: it changes each time)."""
    return re.sub(r"&seal=[^&]+", "", answer["headers"]["Location"])


def _failed(conn: Conn, kind: str = "k") -> int:
    job_id = enqueue(conn, kind)
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'failed', finished_at = now(), last_error = 'boom' "
        "WHERE id = %s",
        (job_id,),
    )
    return job_id


def test_the_function_serves_every_page(db_url: str, conn: Conn) -> None:
    job_id = _failed(conn)
    function = dashboard_function(db_url)
    for target in ("/", "/jobs", "/jobs?status=failed", f"/jobs/{job_id}", "/control"):
        answer = function.resolve(dashboard_event("GET", target), None)
        assert answer["statusCode"] == 200, (target, answer["body"][-300:])
        assert "default-src 'none'" in answer["headers"]["Content-Security-Policy"]
    assert function.resolve(dashboard_event("GET", "/nope"), None)["statusCode"] == 404


def test_a_jobs_page_shows_its_output_progress_sequence_and_dependencies_escaped(
    db_url: str, conn: Conn
) -> None:
    first = enqueue(conn, "step", sequence="<s>")
    dependency = enqueue(conn, "step")
    job_id = enqueue(conn, "step", after=[dependency])
    conn.execute(
        "UPDATE pgdrain.active_jobs SET output = %s, progress = %s WHERE id = ANY(%s)",
        ('{"html": "<b>out</b>"}', '{"step": "<i>2</i>"}', [first, job_id]),
    )
    function = dashboard_function(db_url)
    body = function.resolve(dashboard_event("GET", f"/jobs/{job_id}"), None)["body"]
    assert f'<dt>depends_on</dt><dd><a href="/jobs/{dependency}">{dependency}</a></dd>' in body
    assert "<h2>Output</h2>" in body and "&lt;b&gt;out&lt;/b&gt;" in body
    assert "&lt;i&gt;2&lt;/i&gt;" in body
    assert "<b>" not in body and "<i>" not in body
    body = function.resolve(dashboard_event("GET", f"/jobs/{first}"), None)["body"]
    assert "<dt>sequence</dt><dd>&lt;s&gt;</dd>" in body
    assert "<s>" not in body
    body = function.resolve(dashboard_event("GET", f"/jobs/{dependency}"), None)["body"]
    assert "<dt>has_dependents</dt><dd>True</dd>" in body
    assert '<h2>Output</h2><p class="muted">None recorded.</p>' in body


def test_the_jobs_page_reads_no_output_or_progress_it_does_not_show(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's report: every listed job's output (up to megabytes) was read and decoded,
    60 done jobs of 250 KB each made the page eight times slower. `pgdrain jobs --json` reads
    them: the control."""
    ids = [enqueue(conn, "k", queue="q") for _ in range(2)]
    conn.execute(
        "UPDATE pgdrain.active_jobs SET output = %s, progress = '{\"step\": 2}' WHERE id = %s",
        ('{"o": "x"}', ids[0]),
    )
    _finish(conn, [ids[1]], "done", dt.timedelta(0))
    conn.execute("UPDATE pgdrain.jobs SET output = '[1]' WHERE id = %s", (ids[1],))
    read: list[str | None] = []
    decode = operator_commands.decode_stored

    def reading(text: str | None) -> tuple[Any, str | None]:
        read.append(text)
        return decode(text)

    monkeypatch.setattr(operator_commands, "decode_stored", reading)
    function = dashboard_function(db_url)
    for target in ("/jobs?queue=q", "/jobs?queue=q&status=done"):  # job_list, job_list_finished
        assert function.resolve(dashboard_event("GET", target), None)["statusCode"] == 200
    assert [t for t in read if t is not None] == []
    listed = store.job_list(conn, ["queued"], 10, queue="q")  # as `pgdrain jobs --json`
    assert [(r.output, r.progress) for r in listed] == [({"o": "x"}, {"step": 2})]
    [done] = store.job_list(conn, ["done"], 10, queue="q")
    assert done.output == [1]


@pytest.mark.parametrize("kind", sorted(UNREADABLE_JSON))
def test_a_jobs_page_shows_values_python_cannot_hold_as_their_json_text(
    db_url: str, conn: Conn, kind: str
) -> None:
    job_id = unreadable_job(conn, UNREADABLE_JSON[kind])
    function = dashboard_function(db_url)
    page = function.resolve(dashboard_event("GET", f"/jobs/{job_id}"), None)
    assert page["statusCode"] == 200, page["body"][-300:]
    body = page["body"]
    assert "<dt>kind</dt><dd>k</dd>" in body  # the rest of the page shows
    # payload, output, progress and errors: each says so, and shows its text.
    assert body.count('<p class="cut">Not decoded: ') == 4
    assert html.escape(UNREADABLE_JSON[kind][:100]) in body
    listed = function.resolve(dashboard_event("GET", "/jobs"), None)
    assert listed["statusCode"] == 200 and f"/jobs/{job_id}" in listed["body"]


def test_the_dashboard_cancels_a_waiting_job_and_what_waits_on_it(db_url: str, conn: Conn) -> None:
    dependency = enqueue(conn, "step")
    waiting = enqueue(conn, "step", after=[dependency])
    behind = enqueue(conn, "step", after=[waiting])
    function = dashboard_function(db_url)
    answer = function.resolve(
        dashboard_event(
            "POST", f"/jobs/{waiting}/cancel", f"confirm=1&token={_token(function, waiting)}"
        ),
        None,
    )
    assert answer["statusCode"] == 303
    assert [job_row(conn, i)["status"] for i in (dependency, waiting, behind)] == [
        "queued",
        "cancelled",
        "cancelled",
    ]
    assert conn.execute(
        "SELECT count(*) FROM pgdrain.finished_jobs WHERE id = ANY(%s)", ([waiting, behind],)
    ).fetchone() == (2,)


def test_the_handler_builds_the_dashboard_once_from_its_environment(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lambda_entry, "_app", None)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("PGDRAIN_UI_SECRET", SECRET)
    first = lambda_entry.lambda_handler(dashboard_event("GET", "/control"), None)
    built = lambda_entry._app
    second = lambda_entry.lambda_handler(dashboard_event("GET", "/"), None)
    assert (first["statusCode"], second["statusCode"]) == (200, 200)
    assert built is not None and lambda_entry._app is built  # per environment, not per request


def test_the_function_retries_for_the_caller_it_issued_the_token_to(
    db_url: str, conn: Conn
) -> None:
    job_id = _failed(conn)
    function = dashboard_function(db_url)
    eve = "arn:aws:iam::123456789012:user/eve"
    stolen = function.resolve(
        dashboard_event(
            "POST", f"/jobs/{job_id}/retry", f"confirm=1&token={_token(function, job_id)}", eve
        ),
        None,
    )
    assert stolen["statusCode"] == 403  # Ada's token, sent by Eve's request
    assert job_row(conn, job_id)["status"] == "failed"
    # Another execution environment (another cold start) shares the key: the token holds.
    other = dashboard_function(db_url)
    answer = other.resolve(
        dashboard_event(
            "POST", f"/jobs/{job_id}/retry", f"confirm=1&token={_token(function, job_id)}"
        ),
        None,
    )
    assert answer["statusCode"] == 303
    assert _unsealed(answer) == f"/jobs/{job_id}?refresh=2&notice=retried"
    assert job_row(conn, job_id)["status"] == "queued"


def _key_held(conn: Conn) -> int:
    """A failed job whose idempotency key a newer queued job holds."""
    job_id = enqueue(conn, "k", idempotency_key="welcome-42")
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'failed', finished_at = now() WHERE id = %s", (job_id,)
    )
    enqueue(conn, "k", idempotency_key="welcome-42")
    return job_id


def _dependency_failed(conn: Conn) -> int:
    """A job cancelled because the job it depends on failed."""
    failed = _failed(conn)
    return enqueue(conn, "k", after=[failed])


@pytest.mark.parametrize(
    ("make", "notice"),
    [(_key_held, "not-retried-key"), (_dependency_failed, "not-retried-dependency")],
    ids=["key-held", "dependency-failed"],
)
def test_a_retry_that_queues_nothing_says_why(
    db_url: str, conn: Conn, make: Any, notice: str
) -> None:
    job_id = make(conn)
    before = job_row(conn, job_id)["status"]
    function = dashboard_function(db_url)
    form = f"confirm=1&token={_token(function, job_id)}"
    answer = function.resolve(dashboard_event("POST", f"/jobs/{job_id}/retry", form), None)
    assert _unsealed(answer) == f"/jobs/{job_id}?notice={notice}"
    assert job_row(conn, job_id)["status"] == before
    page = function.resolve(dashboard_event("GET", answer["headers"]["Location"]), None)
    assert html.escape(NOTICES[notice], quote=False) in page["body"]


def test_a_retry_of_a_job_cancelled_while_running_says_it_waits_for_the_lease(
    db_url: str, conn: Conn
) -> None:
    job_id = enqueue(conn, "k")
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'running', attempts = 1, leased_by = 'a-run',"
        " lease_expires_at = now() + interval '5 minutes', attempt_token = gen_random_uuid(),"
        " heartbeat_at = now() WHERE id = %s",
        (job_id,),
    )
    function = dashboard_function(db_url)
    for verb in ("cancel", "retry"):
        form = f"confirm=1&token={_token(function, job_id)}"
        answer = function.resolve(dashboard_event("POST", f"/jobs/{job_id}/{verb}", form), None)
        assert answer["statusCode"] == 303, answer["body"][-300:]
    assert _unsealed(answer) == f"/jobs/{job_id}?notice=retried-after-lease"
    page = function.resolve(dashboard_event("GET", answer["headers"]["Location"]), None)
    assert html.escape(NOTICES["retried-after-lease"], quote=False) in page["body"]


@pytest.mark.parametrize("done_kept", [False, True], ids=["not-kept", "control-kept"])
def test_a_job_not_found_where_done_jobs_are_not_kept_may_be_gone(
    db_url: str, conn: Conn, done_kept: bool
) -> None:
    record = store.RunRecord("schedule", 0, 0.1, "empty", {}, done_kept=done_kept)
    store.run_exit(conn, "run-1", ["default"], may_stay=False, clear_kicks=False, record=record)
    function = dashboard_function(db_url)
    page = function.resolve(dashboard_event("GET", "/jobs/4242"), None)
    assert page["statusCode"] == 404
    assert (DONE_NOT_KEPT_GONE in page["body"]) is not done_kept


@pytest.mark.parametrize(
    ("target", "status"),
    [
        ("/jobs?before=%C2%B2", 400),  # '²': str.isdigit() takes it, int() refuses it
        ("/?refresh=%C2%B2", 200),
        ("/jobs/" + "1" * 5000, 404),  # past int()'s 4,300 digits
        ("/control?refresh=" + "9" * 5000, 200),
    ],
)
def test_a_number_no_int_reads_is_answered_not_raised(
    db_url: str, target: str, status: int
) -> None:
    """A red team's report: each failed the request (a 502 from the Function URL)."""
    function = dashboard_function(db_url)
    assert function.resolve(dashboard_event("GET", target), None)["statusCode"] == status


def test_a_token_whose_time_is_no_int_is_refused(db_url: str, conn: Conn) -> None:
    job_id = _failed(conn)
    function = dashboard_function(db_url)
    answer = function.resolve(
        dashboard_event("POST", f"/jobs/{job_id}/retry", "confirm=1&token=%C2%B2.x"), None
    )
    assert answer["statusCode"] == 403


def test_a_retry_by_filter_redirects_so_that_a_reload_repeats_nothing(
    db_url: str, conn: Conn
) -> None:
    first, second = _failed(conn), _failed(conn)
    function = dashboard_function(db_url)
    form = f"status=failed&since=2h&confirm=1&token={_token(function, first)}"
    answer = function.resolve(dashboard_event("POST", "/retry", form), None)
    assert answer["statusCode"] == 303
    location = answer["headers"]["Location"]
    assert _unsealed(answer) == "/jobs?since=2h&status=failed&notice=bulk-retried&retried=2&held=0"
    assert {job_row(conn, i)["status"] for i in (first, second)} == {"queued"}
    page = function.resolve(dashboard_event("GET", location), None)
    assert '<div class="notice">Queued again: 2 jobs.</div>' in page["body"]


def test_a_kind_filter_is_taken_exactly_as_given(db_url: str, conn: Conn) -> None:
    """A red team's report: `kind=send%20` was stripped, so the jobs page listed the kind
    "send" and retry by filter retried its jobs, leaving the "send " job failed."""
    spaced, plain = _failed(conn, "send "), _failed(conn, "send")
    function = dashboard_function(db_url)
    body = function.resolve(dashboard_event("GET", "/jobs?kind=send%20&status=failed"), None)[
        "body"
    ]
    assert f'href="/jobs/{spaced}"' in body and f'href="/jobs/{plain}"' not in body
    assert "<td>&quot;send &quot;</td>" in body  # told apart from "send" on sight
    form = f"status=failed&kind=send%20&confirm=1&token={_token(function, spaced)}"
    answer = function.resolve(dashboard_event("POST", "/retry", form), None)
    assert answer["statusCode"] == 303
    assert [job_row(conn, i)["status"] for i in (spaced, plain)] == ["queued", "failed"]


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "control-forged"])
def test_a_notice_shows_only_as_the_action_sealed_it(db_url: str, conn: Conn, sealed: bool) -> None:
    """A red team's report: `/jobs?notice=bulk-retried&retried=123456789` said "Queued again:
    123,456,789 jobs." and `/jobs/ID?notice=cancelled` "Cancelled." on a queued job: a link
    from anywhere put words on the page. A notice shows under the seal its action issued to
    the same caller, for the same page and the same counts."""
    job_id = _failed(conn)
    function = dashboard_function(db_url)
    form = f"status=failed&confirm=1&token={_token(function, job_id)}"
    location = function.resolve(dashboard_event("POST", "/retry", form), None)["headers"][
        "Location"
    ]
    queued = enqueue(conn, "k")
    seal = re.search(r"seal=([^&]+)", location)
    assert seal
    forged = [
        location.replace("retried=1", "retried=123456789"),  # other counts
        f"/jobs/{queued}?notice=cancelled&seal={seal.group(1)}",  # another page, another notice
        f"/jobs/{queued}?notice=cancelled",
    ]
    eve = "arn:aws:iam::123456789012:user/eve"
    for target, caller in [
        (location, ADA) if sealed else (location, eve),
        *((f, ADA) for f in forged),
    ]:
        body = function.resolve(dashboard_event("GET", target, caller=caller), None)["body"]
        shown = '<div class="notice">' in body
        assert shown is (sealed and target == location), target


def test_a_second_cancel_says_the_job_was_already_cancelled(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "k")
    function = dashboard_function(db_url)
    form = f"confirm=1&token={_token(function, job_id)}"
    for notice in ("cancelled", "already-cancelled"):  # the second: from a page left open
        answer = function.resolve(dashboard_event("POST", f"/jobs/{job_id}/cancel", form), None)
        assert _unsealed(answer) == f"/jobs/{job_id}?notice={notice}"
    page = function.resolve(dashboard_event("GET", answer["headers"]["Location"]), None)
    assert html.escape(NOTICES["already-cancelled"], quote=False) in page["body"]


@pytest.mark.parametrize(("verb", "status"), [("retry", "queued"), ("cancel", "failed")])
def test_an_action_the_jobs_state_does_not_allow_is_not_offered(
    db_url: str, conn: Conn, verb: str, status: str
) -> None:
    """A red team's report: the retry of a queued job was asked for, as if it could be."""
    job_id = _failed(conn) if status == "failed" else enqueue(conn, "k")
    function = dashboard_function(db_url)
    tokens = lambda_entry.config_from_env({"PGDRAIN_UI_SECRET": SECRET}).tokens
    form = f"token={tokens.issue(ADA)}"
    answer = function.resolve(dashboard_event("POST", f"/jobs/{job_id}/{verb}", form), None)
    assert answer["statusCode"] == 409
    assert f"job {job_id} is {status}: only a" in answer["body"]
    assert "Yes, " not in answer["body"]


def test_the_function_offers_no_action_unless_asked(db_url: str, conn: Conn) -> None:
    job_id = _failed(conn)
    function = dashboard_function(db_url, actions=False)
    page = function.resolve(dashboard_event("GET", f"/jobs/{job_id}"), None)
    assert 'method="post"' not in page["body"]
    tokens = lambda_entry.config_from_env({"PGDRAIN_UI_SECRET": SECRET}).tokens
    form = f"confirm=1&token={tokens.issue(ADA)}"
    answer = function.resolve(dashboard_event("POST", f"/jobs/{job_id}/retry", form), None)
    assert answer["statusCode"] == 403
    assert job_row(conn, job_id)["status"] == "failed"


# -- the database roles ------------------------------------------------------------------------


def _role_sql() -> str:
    return resources.files("pgdrain.db").joinpath("sql/dashboard_role.sql").read_text()


def _as(url: str, user: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["user"] = user
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture
def granted(db_url: str) -> str:
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute(_role_sql())
        owner.execute(_role_sql())  # safe to run again
    return db_url


def _login(admin_url: str, group: str) -> Iterator[str]:
    name = f"pgdrain_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(name), sql.Identifier(group)
            )
        )
    try:
        yield name
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture
def reader(admin_url: str) -> Iterator[str]:
    yield from _login(admin_url, "pgdrain_dashboard")


@pytest.fixture
def operator(admin_url: str) -> Iterator[str]:
    yield from _login(admin_url, "pgdrain_dashboard_actions")


REFUSED = (
    "INSERT INTO pgdrain.jobs (kind) VALUES ('x')",
    "INSERT INTO pgdrain.active_jobs (kind) VALUES ('x')",
    "DELETE FROM pgdrain.jobs",
    "DELETE FROM pgdrain.active_jobs",
    "DELETE FROM pgdrain.finished_jobs",
    "UPDATE pgdrain.kicks SET run_until = NULL",
    "DELETE FROM pgdrain.runs",
    "DELETE FROM pgdrain.run_history",
    "SELECT * FROM pgdrain.migrations",
    "CREATE TABLE pgdrain.intruder (id int)",
    "TRUNCATE pgdrain.active_jobs",
    "TRUNCATE pgdrain.finished_jobs",
)
# The actions role records the kick a resume sends (as every kick is debounced), nothing more.
ACTIONS_REFUSED = (
    *(s for s in REFUSED if "pgdrain.kicks" not in s),
    "DELETE FROM pgdrain.kicks",
    # Only what a retry and a cancel write: not work of its own choosing, nor a job's history.
    "UPDATE pgdrain.jobs SET kind = 'x', payload = '{}'",
    "UPDATE pgdrain.jobs SET errors = '[]', last_error = NULL",
    "UPDATE pgdrain.active_jobs SET payload = '{}'",
    "UPDATE pgdrain.active_jobs SET status = 'done'",  # finished in place, never run
    # A queue's limits: pause and resume write them as the owner (migration 0039).
    "UPDATE pgdrain.queue_limits SET max_running = NULL, rate_limit = NULL",
    "UPDATE pgdrain.queue_limits SET running = 0",
    "INSERT INTO pgdrain.queue_limits (queue, max_running) VALUES ('other', 1)",
    "DELETE FROM pgdrain.queue_limits",
)


def test_the_read_only_role_serves_every_page_and_changes_nothing(
    granted: str, conn: Conn, reader: str
) -> None:
    job_id = _failed(conn)
    url = _as(granted, reader)
    function = dashboard_function(url)  # actions on in the function: the role is what holds
    for target in ("/", "/jobs", f"/jobs/{job_id}", "/control"):
        assert function.resolve(dashboard_event("GET", target), None)["statusCode"] == 200, target
    form = f"confirm=1&token={_token(function, job_id)}"
    answer = function.resolve(dashboard_event("POST", f"/jobs/{job_id}/retry", form), None)
    assert answer["statusCode"] == 503 and "permission denied" in answer["body"]
    assert job_row(conn, job_id)["status"] == "failed"
    with psycopg.connect(url, autocommit=True) as as_reader:
        for statement in ("UPDATE pgdrain.jobs SET priority = 1", *REFUSED):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                as_reader.execute(statement)


def test_the_actions_role_retries_and_cancels_and_nothing_more(
    granted: str, conn: Conn, operator: str
) -> None:
    failed, queued = _failed(conn), enqueue(conn, "k", delay=3600)
    conn.execute("INSERT INTO pgdrain.queue_limits (queue, max_running) VALUES ('default', 2)")
    url = _as(granted, operator)
    function = dashboard_function(url)
    for job_id, verb, status in ((failed, "retry", "queued"), (queued, "cancel", "cancelled")):
        form = f"confirm=1&token={_token(function, job_id)}"
        answer = function.resolve(dashboard_event("POST", f"/jobs/{job_id}/{verb}", form), None)
        assert answer["statusCode"] == 303, answer["body"][-300:]
        assert job_row(conn, job_id)["status"] == status
    for verb, paused in (("pause", True), ("resume", False)):  # a pause is a row; resume kicks
        form = f"confirm=1&token={_token(function, failed)}"
        answer = function.resolve(dashboard_event("POST", f"/queues/default/{verb}", form), None)
        assert answer["statusCode"] == 303, answer["body"][-300:]
        assert [q.queue for q in store.queue_stats(conn) if q.paused] == (
            ["default"] if paused else []
        )
    with psycopg.connect(url, autocommit=True) as as_operator:
        for statement in ACTIONS_REFUSED:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                as_operator.execute(statement)


@pytest.mark.parametrize("regranted", [True, False], ids=["by-0028", "control: not granted"])
def test_a_dashboard_role_granted_before_the_floors_were_read_still_resumes(
    granted: str, conn: Conn, operator: str, regranted: bool
) -> None:
    """A database whose dashboard roles were granted before migration 0028: a resume now looks
    for a ready job from its queue's floor, and the migrations grant the floors (0028) and their
    marks (0035, which the resume's check probes), so Resume does not fail before
    dashboard_role.sql is run again. The control takes the grants back."""
    revoke = (
        "REVOKE SELECT ON pgdrain.queue_floors, pgdrain.queue_floor_marks FROM pgdrain_dashboard"
    )
    with psycopg.connect(granted, autocommit=True) as owner:
        # As it was before 0028; then `pgdrain migrate`.
        owner.execute(revoke)
        owner.execute("DELETE FROM pgdrain.migrations WHERE version IN ('0028', '0035')")
        assert [m.split("_")[0] for m in migrate(owner).applied] == ["0028", "0035"]
        if not regranted:
            owner.execute(revoke)
    enqueue(conn, "k")
    store.queue_pause(conn, "default")
    function = dashboard_function(_as(granted, operator))
    form = f"confirm=1&token={_token(function, enqueue(conn, 'k'))}"
    answer = function.resolve(dashboard_event("POST", "/queues/default/resume", form), None)
    if regranted:
        assert answer["statusCode"] == 303, answer["body"][-300:]
        assert not any(q.paused for q in store.queue_stats(conn))
    else:
        assert answer["statusCode"] == 503 and "permission denied" in answer["body"]


@pytest.mark.parametrize("narrowed", [True, False], ids=["by-0032", "control: as before"])
def test_an_actions_role_granted_before_0032_no_longer_rewrites_a_jobs_kind(
    granted: str, conn: Conn, operator: str, narrowed: bool
) -> None:
    """A red team's report: the actions role could rewrite any column of any job. A role
    granted before migration 0032 (UPDATE on every column) is narrowed by the migration."""
    with psycopg.connect(granted, autocommit=True) as owner:
        owner.execute(  # as before
            "GRANT UPDATE ON pgdrain.jobs, pgdrain.active_jobs TO pgdrain_dashboard_actions"
        )
        if narrowed:
            owner.execute("DELETE FROM pgdrain.migrations WHERE version = '0032'")
            assert [m.split("_")[0] for m in migrate(owner).applied] == ["0032"]
    job_id = _failed(conn)
    with psycopg.connect(_as(granted, operator), autocommit=True) as as_operator:
        rewrite = "UPDATE pgdrain.jobs SET kind = 'x' WHERE id = %s"
        if narrowed:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                as_operator.execute(rewrite, (job_id,))
        else:
            as_operator.execute(rewrite, (job_id,))
            assert job_row(conn, job_id)["kind"] == "x"


@pytest.mark.parametrize("narrowed", [True, False], ids=["by-0039", "control: as before"])
def test_an_actions_role_granted_before_0039_no_longer_writes_queue_limits_yet_pauses(
    granted: str, conn: Conn, operator: str, narrowed: bool
) -> None:
    """A red team's report: the actions role, granted INSERT, UPDATE and DELETE on
    queue_limits to pause and resume, could clear any queue's limits. Migration 0039 takes the
    writes back from a role granted before it; pause and resume run as the owner."""
    with psycopg.connect(granted, autocommit=True) as owner:
        owner.execute(  # as before
            "GRANT SELECT, UPDATE, INSERT, DELETE ON pgdrain.queue_limits"
            " TO pgdrain_dashboard_actions"
        )
        owner.execute("INSERT INTO pgdrain.queue_limits (queue, max_running) VALUES ('api', 2)")
        if narrowed:
            owner.execute("DELETE FROM pgdrain.migrations WHERE version = '0039'")
            assert [m.split("_")[0] for m in migrate(owner).applied] == ["0039"]
    with psycopg.connect(_as(granted, operator), autocommit=True) as as_operator:
        cleared = "UPDATE pgdrain.queue_limits SET max_running = NULL WHERE queue = 'api'"
        if narrowed:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                as_operator.execute(cleared)
            assert pause_queue(as_operator, "api") is not None
            assert resume_queue(as_operator, "api") is True
        else:
            as_operator.execute(cleared)
    row = conn.execute("SELECT max_running FROM pgdrain.queue_limits WHERE queue = 'api'")
    assert row.fetchone() == ((2,) if narrowed else (None,))


def _view_write_unguarded() -> str:
    """jobs_view_write as migration 0033 makes it, without its check of the acting role."""
    text = (
        resources.files("pgdrain.db")
        .joinpath("sql/migrations/0033_cancelled_leases_and_dashboard_writes.sql")
        .read_text()
    )
    function = text[text.index("CREATE OR REPLACE FUNCTION pgdrain.jobs_view_write()") :]
    guard = re.search(
        r"    IF TG_OP = 'UPDATE'\n       AND NOT has_column_privilege.*?END IF;\n", function, re.S
    )
    assert guard is not None
    return function.replace(guard.group(0), "")


# What a column's grant cannot stop (a security review): values no retry or cancel writes.
BEYOND_RETRY_AND_CANCEL = {
    "done without running": "status = 'done', finished_at = now()",
    "failed by hand": "status = 'failed', finished_at = now()",
    "delayed": "run_at = now() + interval '1 year'",
    "a lease of its own": "status = 'running', attempts = 1, lease_expires_at = now() + "
    "interval '1 hour', leased_by = 'me', attempt_token = gen_random_uuid(), heartbeat_at = now()",
}


@pytest.mark.parametrize("guarded", [True, False], ids=["by-0033", "control: unguarded"])
@pytest.mark.parametrize("change", list(BEYOND_RETRY_AND_CANCEL), ids=list(BEYOND_RETRY_AND_CANCEL))
def test_the_actions_role_changes_a_job_only_as_a_retry_or_a_cancel_does(
    granted: str, conn: Conn, operator: str, change: str, guarded: bool
) -> None:
    """The red team's timeline: a job with a dependent waiting on it. Marked done by the
    actions role, it would release the dependent without having run."""
    if not guarded:
        with psycopg.connect(granted, autocommit=True) as owner:
            owner.execute(_view_write_unguarded().encode())
    first = enqueue(conn, "k")
    dependent = enqueue(conn, "k", after=[first])
    statement = f"UPDATE pgdrain.jobs SET {BEYOND_RETRY_AND_CANCEL[change]} WHERE id = %s"  # noqa: S608

    def state() -> tuple[Any, ...]:
        row = job_row(conn, first)
        return row["status"], row["run_at"], job_row(conn, dependent)["status"]

    before = state()
    with psycopg.connect(_as(granted, operator), autocommit=True) as as_operator:
        if guarded:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="retry or cancel"):
                as_operator.execute(statement.encode(), (first,))
        else:
            as_operator.execute(statement.encode(), (first,))
    assert (state() == before) == guarded
    if change == "done without running" and not guarded:
        assert (state()[0], state()[2]) == ("done", "queued")  # released, never run


@pytest.mark.parametrize("kept", [True, False], ids=["by-0044", "control-0033"])
def test_a_retry_by_hand_of_a_job_cancelled_while_running_waits_for_its_lease(
    granted: str, conn: Conn, operator: str, kept: bool
) -> None:
    """A security review: the actions role's own UPDATE, written as a retry, queued a job
    cancelled while running for now, beside the attempt whose code may run until its lease
    ends (`pgdrain retry` waits for it). The control: the view's trigger as 0033 made it."""
    if not kept:
        with psycopg.connect(granted, autocommit=True) as owner:
            owner.execute(view_write_of_0033().encode())
    job_id = enqueue(conn, "k")
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'running', attempts = 1, leased_by = 'run-a',"
        " lease_expires_at = now() + interval '10 minutes', attempt_token = gen_random_uuid(),"
        " heartbeat_at = now() WHERE id = %s",
        (job_id,),
    )
    with psycopg.connect(_as(granted, operator), autocommit=True) as as_operator:
        as_operator.execute(
            "UPDATE pgdrain.jobs SET status = 'cancelled', attempt_token = NULL,"
            " lease_expires_at = NULL, leased_by = NULL, heartbeat_at = NULL WHERE id = %s",
            (job_id,),
        )
        as_operator.execute(
            "UPDATE pgdrain.jobs SET status = 'queued', attempts = 0, finished_at = NULL,"
            " run_at = now() WHERE id = %s",
            (job_id,),
        )
    row = conn.execute(
        "SELECT status, run_at > now() + interval '9 minutes' FROM pgdrain.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row == ("queued", kept)  # the control: claimable at once


def test_a_pause_takes_only_a_queue_name_a_job_can_have(granted: str, operator: str) -> None:
    """A security review: a paused queue's name from queue_limits went into the path of the
    dashboard's Resume button, and a name like this one posted elsewhere."""
    with psycopg.connect(_as(granted, operator), autocommit=True) as as_operator:
        with pytest.raises(psycopg.errors.CheckViolation, match="queue_limits_queue_name_chk"):
            as_operator.execute("SELECT pgdrain.queue_pause('pq/../../jobs/1/cancel?')")
        as_operator.execute("SELECT pgdrain.queue_pause('emails.v2')")  # the control


@pytest.mark.parametrize("asked", [True, False], ids=["iso-asked", "control-not-asked"])
def test_the_dashboard_reads_a_database_whose_datestyle_is_not_iso(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, asked: bool
) -> None:
    """An operator's report: with the database's DateStyle `SQL, DMY` every page that shows a
    time failed (psycopg reads timestamps only in ISO). Each request's connection asks for ISO."""
    if not asked:
        monkeypatch.setattr(store, "operator_session", lambda _conn: None)
    conn.execute(f"ALTER DATABASE \"{conn.info.dbname}\" SET DateStyle = 'SQL, DMY'")
    _failed(conn)
    function = dashboard_function(db_url)
    if asked:
        for target in ("/", "/jobs", "/control"):
            answer = function.resolve(dashboard_event("GET", target), None)
            assert answer["statusCode"] == 200, (target, answer["body"][-300:])
    else:
        with pytest.raises(NotImplementedError, match="DateStyle"):
            function.resolve(dashboard_event("GET", "/jobs"), None)


def test_control_the_owner_may_do_what_the_dashboards_roles_may_not(granted: str) -> None:
    with psycopg.connect(granted) as owner:
        for statement in REFUSED:
            owner.execute(statement)
        owner.rollback()


# -- a page's reads are bounded ------------------------------------------------------------------


def _page_behind_a_lock(url: str, conn: Conn) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """GET /jobs while another session holds the jobs table: the page's read waits on it."""
    function = dashboard_function(url, actions=False)
    return _behind_a_lock(
        conn, lambda: function.resolve(dashboard_event("GET", "/jobs?kind=k"), None)
    )


def _behind_a_lock(
    conn: Conn, request: Callable[[], dict[str, Any]]
) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """`request` in a thread while another session holds the jobs table: it waits on it."""
    answers: list[dict[str, Any]] = []
    conn.execute("BEGIN")
    conn.execute("LOCK TABLE pgdrain.jobs IN ACCESS EXCLUSIVE MODE")
    thread = threading.Thread(target=lambda: answers.append(request()))
    thread.start()
    return thread, answers


class _Invocation:
    """A Lambda context with this much time left."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.mark.parametrize("confirmed", [False, True], ids=["preview", "retry"])
def test_a_retry_by_filter_that_takes_too_long_is_stopped_and_said(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, confirmed: bool
) -> None:
    """A red team's report: the preview ran the retry itself, every row through the view's
    trigger, unbounded (20,000 jobs: 9.4 s); past the function's Timeout, a 502. The preview
    reads within a page's time; the retry within the invocation's time left."""
    job_id = _failed(conn)
    monkeypatch.setattr(ui_app, "READ_TIMEOUT_MS", 200)
    function = dashboard_function(db_url)
    form = f"status=failed&token={_token(function, job_id)}" + ("&confirm=1" if confirmed else "")
    invocation = _Invocation(ui_app.ACTION_MARGIN_MS + 300)
    thread, answers = _behind_a_lock(
        conn, lambda: function.resolve(dashboard_event("POST", "/retry", form), invocation)
    )
    try:
        thread.join(timeout=10)
        assert not thread.is_alive()
    finally:
        conn.execute("ROLLBACK")
    thread.join(timeout=30)
    (answer,) = answers
    assert answer["statusCode"] == 503
    said = "the retry took longer than the 0.3 s" if confirmed else "took longer than 0.2 s"
    assert said in answer["body"] and "nothing was retried" in answer["body"]
    assert job_row(conn, job_id)["status"] == "failed"


def test_the_retry_preview_says_what_the_retry_does_and_sends_a_page(conn: Conn) -> None:
    failed = [_failed(conn) for _ in range(4)]
    held = _key_held(conn)
    preview = store.job_retry_matching_preview(conn, ["failed"], shown=2)
    assert (preview.would_retry, preview.key_held) == (4, 1)
    assert [(r.id, r.retried, r.held_by) for r in preview.first] == [
        (failed[0], True, None),
        (failed[1], True, None),
        (held, False, held + 1),
    ]
    with conn.transaction():
        done = store.job_retry_matching(conn, ["failed"])
    assert sorted(r.id for r in done if r.retried) == failed
    assert [(r.id, r.held_by) for r in done if not r.retried] == [(held, held + 1)]


def test_a_read_that_takes_too_long_gives_up_with_one_line(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ui_app, "READ_TIMEOUT_MS", 200)
    thread, answers = _page_behind_a_lock(db_url, conn)
    try:
        thread.join(timeout=30)
        assert not thread.is_alive()
    finally:
        conn.execute("ROLLBACK")
    (answer,) = answers
    assert answer["statusCode"] == 503
    assert "took longer than 0.2 s and was stopped: narrow it" in answer["body"]


def test_control_without_the_timeout_the_read_waits_as_long_as_it_takes(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "operator_read_timeout", lambda conn, timeout_ms: None)
    monkeypatch.setattr(ui_app, "READ_TIMEOUT_MS", 200)
    thread, answers = _page_behind_a_lock(db_url, conn)
    try:
        thread.join(timeout=2)
        assert thread.is_alive() and answers == []  # ten times the timeout, still waiting
    finally:
        conn.execute("ROLLBACK")
    thread.join(timeout=30)
    assert answers[0]["statusCode"] == 200


@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "control-unbounded"])
def test_an_action_on_a_job_locked_elsewhere_gives_up_and_changes_nothing(
    db_url: str, conn: Conn, bounded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction left open on a job's row: the dashboard's cancel, seen waiting for it,
    gives up after ACTION_LOCK_TIMEOUT_MS with a 503 that says so, and nothing changes. The
    control (no bound) waits as long as the row is held, and cancels once it is let go."""
    monkeypatch.setattr(ui_app, "ACTION_LOCK_TIMEOUT_MS", 1000 if bounded else 0)
    job_id = enqueue(conn, "k")
    function = dashboard_function(db_url)
    form = f"confirm=1&token={_token(function, job_id)}"
    answers: list[dict[str, Any]] = []

    def cancel() -> None:
        event = dashboard_event("POST", f"/jobs/{job_id}/cancel", form)
        answers.append(function.resolve(event, None))

    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT 1 FROM pgdrain.active_jobs WHERE id = %s FOR UPDATE", (job_id,))
        thread = threading.Thread(target=cancel)
        thread.start()
        wait_for(lambda: someone_here_waits_on_a_lock(conn), what="the cancel to wait on the row")
        if bounded:
            thread.join(30)
            assert answers[0]["statusCode"] == 503
            assert f"job {job_id} is locked by another transaction" in answers[0]["body"]
        holder.rollback()
    thread.join(30)
    assert not thread.is_alive()
    assert store.job_status_many(conn, [job_id])[job_id] == ("queued" if bounded else "cancelled")


@pytest.mark.parametrize("secret", ["stored", "missing"])
def test_the_token_key_is_read_from_its_secret_at_cold_start(
    monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    """The template gives the secret's ARN, not the key (a red team's report: the key, in the
    function's configuration, let whoever may read that configuration mint tokens). A form
    token issued by one execution environment holds in another, as with the key given; a
    secret that cannot be read is one line at cold start, without its value."""
    import boto3

    from helpers.aws import REGION, aws_environment, mocked_aws

    aws_environment(monkeypatch)
    key = "k" * 48
    with mocked_aws():
        arn = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:pgdrain/ui-AbCdEf"
        if secret == "stored":
            client = boto3.client("secretsmanager", region_name=REGION)
            arn = client.create_secret(Name="pgdrain/ui", SecretString=key)["ARN"]
        env = {"PGDRAIN_UI_ACTIONS": "true", "PGDRAIN_UI_SECRET_ARN": arn}
        if secret == "missing":
            with pytest.raises(PgdrainError) as raised:
                lambda_entry.config_from_env(env)
            assert str(raised.value).startswith("PGDRAIN_UI_SECRET_ARN: could not read the secret")
            # A dashboard that only reads needs no key, so it reads no secret.
            assert not lambda_entry.config_from_env({**env, "PGDRAIN_UI_ACTIONS": "false"}).actions
            # The function answers each request with the one line (503), and tries again.
            for name, value in {**env, "DATABASE_URL": "postgresql://unused"}.items():
                monkeypatch.setenv(name, value)
            monkeypatch.setattr(lambda_entry, "_app", None)
            for _ in range(2):
                answer = lambda_entry.lambda_handler(dashboard_event("GET", "/"), None)
                assert answer["statusCode"] == 503, answer
                assert "PGDRAIN_UI_SECRET_ARN: could not read the secret" in answer["body"]
            assert lambda_entry._app is None
            return
        from_secret = lambda_entry.config_from_env(env)
    given = lambda_entry.config_from_env({"PGDRAIN_UI_ACTIONS": "true", "PGDRAIN_UI_SECRET": key})
    assert given.tokens.valid(from_secret.tokens.issue(ADA), ADA)


@pytest.mark.parametrize("granted_wakes", [True, False], ids=["by-0049", "control-not-granted"])
def test_a_resume_of_a_queue_whose_jobs_are_due_later_reserves_their_wake_up(
    granted: str,
    conn: Conn,
    operator: str,
    monkeypatch: pytest.MonkeyPatch,
    granted_wakes: bool,
) -> None:
    """A red team's report: Resume kicked only a queue with a job ready, and the kick held
    while it was paused set no wake-up: a job due in two minutes waited for the hourly safety
    net. Resumed as the actions role, the kick reserves the wake-up (migration 0049 lets the
    role write pgdrain.wakes). The control takes that grant back: the kick fails, said."""
    from helpers.aws import FUNCTION_NAME, aws_environment, create_function, mocked_aws

    with psycopg.connect(granted, autocommit=True) as owner:
        # A role granted before 0049, then `pgdrain migrate` (the control: not migrated).
        owner.execute("REVOKE ALL ON pgdrain.wakes FROM pgdrain_dashboard_actions")
        if granted_wakes:
            owner.execute("DELETE FROM pgdrain.migrations WHERE version = '0049'")
            assert [m.split("_")[0] for m in migrate(owner).applied] == ["0049"]
    aws_environment(monkeypatch)
    monkeypatch.setenv("PGDRAIN_FUNCTION_NAME", FUNCTION_NAME)
    enqueue(conn, "k", delay=120)
    store.queue_pause(conn, "default")
    with mocked_aws():
        create_function()
        function = dashboard_function(_as(granted, operator))
        form = f"confirm=1&token={_token(function, enqueue(conn, 'k', delay=120))}"
        answer = function.resolve(dashboard_event("POST", "/queues/default/resume", form), None)
    assert answer["statusCode"] == 303, answer["body"][-300:]
    wakes = conn.execute("SELECT count(*) FROM pgdrain.wakes").fetchone()
    assert wakes == ((1,) if granted_wakes else (0,))
