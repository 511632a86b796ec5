"""The dashboard in a real browser (Playwright driving Debian's Chromium), served by the same
resolver and local server as `pgdrain ui`, against a real PostgreSQL: each page, each action
(retry a failed job and watch a drain run it, cancel, retry by filter with its count first),
job data that tries to run script, and forged POSTs refused.

PGDRAIN_UI_SCREENSHOTS=docs writes the pages' screenshots to docs/ui-*.png (README and
docs/operations.md show them); otherwise they go to the test's temporary folder."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright import sync_api as playwright_api
from psycopg.types.json import Jsonb

from helpers.fixtures import job_row
from pgdrain import Job, Registry, enqueue
from pgdrain.aws import events
from pgdrain.aws.control import RunControl
from pgdrain.aws.wake import Waker
from pgdrain.budget import Budget
from pgdrain.db import store
from pgdrain.runner.drain import DrainResult, drain
from pgdrain.settings import Settings
from pgdrain.ui import app as ui_app
from pgdrain.ui import csrf, local

pytestmark = pytest.mark.browser

Conn = psycopg.Connection[Any]
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("PGDRAIN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HOSTILE_SCRIPT = "<script>alert('payload')</script>"
HOSTILE_ATTRIBUTE = '"><img src=x onerror=alert(1)>'
MEGABYTE = 1024 * 1024

jobs = Registry()


@jobs.job("ok")
def ok(job: Job) -> None:
    pass


@jobs.job("flaky", max_attempts=1)
def flaky(job: Job) -> None:
    """Fails until the file in its payload exists."""
    if not Path(job.payload["fixed"]).exists():
        raise ConnectionError("smtp.example.com refused the connection")


@jobs.job("hostile", max_attempts=1)
def hostile(job: Job) -> None:
    # NUL and bytes that are not UTF-8 (lone surrogates), through the real failure path.
    bad = b"\xff\xfe".decode("utf-8", "surrogateescape")
    raise ValueError(f"{HOSTILE_SCRIPT} {HOSTILE_ATTRIBUTE} nul:\x00: bad:{bad}:")


def run_drain(url: str) -> DrainResult:
    return drain(Settings(queues=("default", "emails")), Budget.seconds(30), jobs, url)


def run_kicked(url: str) -> DrainResult:
    """A drain with the control plane of a kicked run (as the function's): its exit writes its
    line in the run history."""
    settings, budget = Settings(queues=("default", "emails")), Budget.seconds(30)
    control = RunControl(
        events.Trigger("enqueue", settings.queues),
        "pgdrain-drain:9d2f61c0",
        budget,
        waker=Waker(settings, None),
    )
    observer = control.counting(lambda _name, _n: None)  # as the function counts for it
    return drain(settings, budget, jobs, url, observer=observer, hooks=control)


# Runs that ended earlier in the day, for the screenshot (the kicked drain's is real).
EARLIER_RUNS = (
    ("schedule", 0, 1.8, "empty", {"claimed": 0}, 2400),
    ("wake", 0, 12.4, "empty", {"claimed": 57, "done": 55, "retried": 2}, 1500),
    ("enqueue", 0, 291.0, "budget", {"claimed": 4012, "done": 4010, "failed": 2}, 900),
    ("continue", 1, 37.5, "empty", {"claimed": 813, "done": 813}, 600),
)


def _earlier_runs(conn: Conn) -> None:
    for n, (trigger, chain, took, stop, counts, ago_s) in enumerate(EARLIER_RUNS):
        run_id = f"pgdrain-drain:earlier-{n}"
        record = store.RunRecord(trigger, chain, took, stop, counts, continued=stop == "budget")
        store.run_exit(conn, run_id, ["emails", "reports"], record=record)
        conn.execute(
            "UPDATE pgdrain.run_history SET started_at = started_at - %s * interval '1 s',"
            " finished_at = finished_at - %s * interval '1 s' WHERE run_id = %s",
            (ago_s, ago_s, run_id),
        )


# -- the server and the browser ------------------------------------------------------------------


class Dashboard:
    """The dashboard served on 127.0.0.1 by local.server, in a thread of this process."""

    def __init__(self, url: str, *, actions: bool = True) -> None:
        @contextlib.contextmanager
        def connect() -> Iterator[store.Connection]:
            with psycopg.connect(url, autocommit=True) as conn:
                yield conn

        self.tokens = csrf.Tokens(os.urandom(32))
        config = ui_app.UiConfig(actions=actions, tokens=self.tokens)
        self.httpd = local.Server(lambda: ui_app.build(connect, config), 0)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Page:
    """A browser page that records every dialog (alert) and console error."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.page.on("dialog", self._dialog)

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()


@pytest.fixture
def dashboard(db_url: str) -> Iterator[Dashboard]:
    served = Dashboard(db_url)
    yield served
    served.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    opened = Page(browser)
    yield opened
    opened.context.close()


def _screenshot(page: Any, name: str, tmp_path: Path) -> None:
    folder = ROOT / "docs" if os.environ.get("PGDRAIN_UI_SCREENSHOTS") == "docs" else tmp_path
    page.screenshot(path=str(folder / f"ui-{name}.png"), full_page=True)


# -- the pages -------------------------------------------------------------------------------------


def _seed(conn: Conn, url: str, fixed: Path) -> dict[str, int]:
    """What an operator would find on a working day: four queues, a backlog, jobs finished over
    the last day, a failed job with its traceback, a live run, a wake-up and kicks."""
    failed = enqueue(
        conn,
        "flaky",
        {"fixed": str(fixed), "to": "ada@example.com"},
        queue="emails",
        max_attempts=1,
    )
    _earlier_runs(conn)
    run_kicked(url)
    conn.execute(
        """INSERT INTO pgdrain.jobs (queue, kind, status, attempts, run_at, finished_at)
           SELECT (ARRAY['emails', 'reports', 'webhooks', 'default'])[1 + mod(g, 4)],
                  (ARRAY['send_email', 'build_report', 'deliver', 'resize'])[1 + mod(g, 4)],
                  CASE WHEN mod(g, 23) = 0 THEN 'failed' ELSE 'done' END, 1,
                  now() - g * interval '17 seconds', now() - g * interval '17 seconds'
           FROM generate_series(1, 5000) AS g"""
    )
    conn.execute(
        """INSERT INTO pgdrain.jobs (queue, kind, run_at)
           SELECT (ARRAY['emails','reports'])[1 + mod(g, 2)], 'send_email',
                  now() + (mod(g, 3) - 1) * interval '10 minutes'
           FROM generate_series(1, 240) AS g"""
    )
    for queue in ("emails", "reports"):
        conn.execute(
            "INSERT INTO pgdrain.kicks (queue, kicked_at, requested_at, run_until) "
            "VALUES (%s, now() - interval '40 s', now() - interval '3 s', now() + interval '20 s')"
            " ON CONFLICT (queue) DO UPDATE SET kicked_at = excluded.kicked_at,"  # the run's row
            " requested_at = excluded.requested_at, run_until = excluded.run_until",
            (queue,),
        )
    conn.execute(
        "INSERT INTO pgdrain.runs (run_id, queues, chain, started_at, deadline) VALUES "
        "('pgdrain-drain:4b1e0c7a', ARRAY['emails','reports'], 0, now() - interval '42 s', "
        "now() + interval '258 s')"
    )
    conn.execute(
        "INSERT INTO pgdrain.wakes (queue_set, wake_at, state, reserved_by, reserved_until) "
        "VALUES ('emails,reports', date_trunc('minute', now()) + interval '11 minutes', "
        "'created', 'pgdrain-drain:4b1e0c7a', now())"
    )
    conn.execute("INSERT INTO pgdrain.queue_limits (queue, max_running) VALUES ('webhooks', 4)")
    return {"failed": failed}


def test_every_page_renders_and_its_screenshot_is_taken(
    conn: Conn, db_url: str, dashboard: Dashboard, page: Page, tmp_path: Path
) -> None:
    ids = _seed(conn, db_url, tmp_path / "fixed")
    p = page.page
    p.goto(dashboard.base + "/")
    assert p.locator("h1").inner_text() == "Queues"
    emails = p.locator("tr", has=p.locator("a", has_text="emails")).first
    assert "active" in emails.inner_text()
    assert p.locator("svg rect").count() > 50  # bars of both charts
    _screenshot(p, "queues", tmp_path)

    # A click that navigates returns once the new page starts loading: each waits for its load,
    # or what is read next may come from a page half parsed.
    with p.expect_navigation():
        p.click("header >> text=Jobs")
    p.select_option("select[name=status]", "failed")
    p.fill("input[name=queue]", "emails")
    with p.expect_navigation():
        p.click("button:has-text('Filter')")
    assert p.url.endswith("/jobs?queue=emails&kind=&status=failed&since=")
    assert p.locator("tbody tr").count() >= 1
    _screenshot(p, "jobs", tmp_path)

    p.goto(f"{dashboard.base}/jobs/{ids['failed']}")
    assert "ConnectionError: smtp.example.com refused the connection" in p.inner_text("main")
    assert "Traceback (most recent call last)" in p.inner_text("main")
    assert "ada@example.com" in p.inner_text("pre")  # the payload
    _screenshot(p, "job", tmp_path)

    with p.expect_navigation():
        p.click("header >> text=Control plane")
    main = p.inner_text("main")
    assert "pgdrain-drain:4b1e0c7a" in main and "live" in main
    assert "emails,reports" in main  # the pending wake-up
    assert "held by a run until" in main  # kicks held while the run drains
    # The kicked drain's line in Recent runs, newest first: trigger, queues, claimed 1, failed 1.
    recent = p.locator("h2:has-text('Recent runs') ~ table").first.locator("tbody tr")
    assert recent.count() == 1 + len(EARLIER_RUNS)
    cells = recent.first.locator("td").all_inner_texts()
    assert (cells[0], cells[1], cells[4:7], cells[8]) == (
        "enqueue",
        "default, emails",
        ["1", "0", "1"],
        "empty",
    )
    _screenshot(p, "control", tmp_path)
    assert page.dialogs == []


def test_the_jobs_page_pages_newest_first(conn: Conn, dashboard: Dashboard, page: Page) -> None:
    ids = [enqueue(conn, "ok", {"n": n}) for n in range(ui_app.PAGE_SIZE + 5)]
    p = page.page
    p.goto(dashboard.base + "/jobs")
    first = [int(t) for t in p.locator("tbody tr td:first-child").all_inner_texts()]
    assert first == sorted(ids, reverse=True)[: ui_app.PAGE_SIZE]
    with p.expect_navigation():
        p.click("text=older »")
    second = [int(t) for t in p.locator("tbody tr td:first-child").all_inner_texts()]
    assert second == sorted(ids, reverse=True)[ui_app.PAGE_SIZE :]
    assert p.locator("text=older »").count() == 0


def test_a_bad_filter_is_one_line_and_a_400(dashboard: Dashboard, page: Page) -> None:
    response = page.page.goto(dashboard.base + "/jobs?since=yesterday")
    assert response is not None and response.status == 400
    assert page.page.inner_text(".error").startswith("since 'yesterday' is neither an age")


# -- the actions -----------------------------------------------------------------------------------


def test_retry_a_failed_job_then_watch_a_drain_run_it(
    conn: Conn, db_url: str, dashboard: Dashboard, page: Page, tmp_path: Path
) -> None:
    fixed = tmp_path / "fixed"
    job_id = enqueue(conn, "flaky", {"fixed": str(fixed)}, max_attempts=1)
    run_drain(db_url)
    assert job_row(conn, job_id)["status"] == "failed"
    p = page.page
    p.goto(dashboard.base + f"/jobs/{job_id}")
    assert "ConnectionError" in p.inner_text("main")
    p.click("button:has-text('Retry…')")
    assert p.locator("h1").inner_text() == f"Retry job {job_id}?"
    assert job_row(conn, job_id)["status"] == "failed"  # asking changed nothing
    p.click(f"button:has-text('Yes, retry job {job_id}')")
    assert "Queued again" in p.inner_text(".notice")
    assert job_row(conn, job_id)["status"] == "queued"
    fixed.touch()  # the cause is fixed; a run picks the job up
    assert run_drain(db_url).done == 1
    p.reload()
    assert p.locator("h1 span").inner_text() == "done"
    p.reload()  # reloading the landing page repeats nothing (the action was a POST, then 303)
    assert job_row(conn, job_id)["attempts"] == 1


def test_cancel_a_queued_job(conn: Conn, dashboard: Dashboard, page: Page) -> None:
    job_id = enqueue(conn, "ok", delay=3600)
    p = page.page
    p.goto(dashboard.base + f"/jobs/{job_id}")
    p.click("button:has-text('Cancel…')")
    assert "A queued job never runs" in p.inner_text(".confirm")
    p.click("text=No, back to the job")
    assert job_row(conn, job_id)["status"] == "queued"
    p.click("button:has-text('Cancel…')")
    p.click(f"button:has-text('Yes, cancel job {job_id}')")
    assert p.inner_text(".notice") == "Cancelled."
    assert job_row(conn, job_id)["status"] == "cancelled"
    assert p.locator("button:has-text('Cancel…')").count() == 0


def test_retry_by_filter_shows_the_count_before_it_runs(
    conn: Conn, db_url: str, dashboard: Dashboard, page: Page, tmp_path: Path
) -> None:
    never = tmp_path / "never"
    failed = [
        enqueue(conn, "flaky", {"fixed": str(never)}, queue="emails", max_attempts=1)
        for _ in range(3)
    ]
    other = enqueue(conn, "flaky", {"fixed": str(never)}, max_attempts=1)
    run_drain(db_url)
    p = page.page
    p.goto(dashboard.base + "/jobs?queue=emails&status=failed")
    p.click("button:has-text('Retry every matching failed job…')")
    assert p.locator("h1").inner_text() == "Retry 3 failed jobs?"
    assert "a dry run: nothing has changed yet" in p.inner_text(".confirm")
    assert {job_row(conn, i)["status"] for i in [*failed, other]} == {"failed"}
    _screenshot(p, "retry", tmp_path)
    p.click("button:has-text('Yes, retry 3 jobs')")
    assert p.inner_text(".notice") == "Queued again: 3 jobs."
    assert [job_row(conn, i)["status"] for i in failed] == ["queued"] * 3
    assert job_row(conn, other)["status"] == "failed"  # another queue: not matched


def test_a_read_only_dashboard_offers_no_action_and_refuses_one(
    conn: Conn, db_url: str, page: Page
) -> None:
    job_id = enqueue(conn, "flaky", {"fixed": "/nonexistent"}, max_attempts=1)
    run_drain(db_url)
    served = Dashboard(db_url, actions=False)
    try:
        p = page.page
        p.goto(served.base + f"/jobs/{job_id}")
        assert p.locator("form[method=post]").count() == 0
        response = p.request.post(
            served.base + f"/jobs/{job_id}/retry",
            form={"confirm": "1", "token": served.tokens.issue("local")},
            headers={"Origin": served.base},
        )
        assert response.status == 403
        assert job_row(conn, job_id)["status"] == "failed"
    finally:
        served.close()


# -- forged requests ------------------------------------------------------------------------------


def _forge(page: Page, dashboard: Dashboard, job_id: int, **overrides: Any) -> Any:
    """A retry POST as another site's page would send it (through the browser's request API,
    so that Origin is whatever the test says)."""
    form = {"confirm": "1", "token": dashboard.tokens.issue("local")}
    headers = {"Origin": dashboard.base}
    form.update(overrides.get("form", {}))
    headers.update(overrides.get("headers", {}))
    for key in overrides.get("drop", ()):
        form.pop(key, None)
    return page.page.request.post(
        f"{dashboard.base}/jobs/{job_id}/retry", form=form, headers=headers, max_redirects=0
    )


@pytest.fixture
def failed_job(conn: Conn, db_url: str) -> int:
    job_id = enqueue(conn, "flaky", {"fixed": "/nonexistent"}, max_attempts=1)
    run_drain(db_url)
    assert job_row(conn, job_id)["status"] == "failed"
    return job_id


def test_a_post_with_its_token_and_origin_is_done(
    conn: Conn, dashboard: Dashboard, page: Page, failed_job: int
) -> None:
    """The control for the refusals below: the same POST, token and origin right, works."""
    assert _forge(page, dashboard, failed_job).status == 303
    assert job_row(conn, failed_job)["status"] == "queued"


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param({"drop": ["token"]}, id="no token"),
        pytest.param({"form": {"token": "1700000000.deadbeef"}}, id="forged token"),
        pytest.param({"headers": {"Origin": "https://evil.example"}}, id="foreign origin"),
        pytest.param({"headers": {"Origin": "null"}}, id="opaque origin"),
    ],
)
def test_a_forged_post_is_refused(
    conn: Conn, dashboard: Dashboard, page: Page, failed_job: int, forged: dict[str, Any]
) -> None:
    response = _forge(page, dashboard, failed_job, **forged)
    assert response.status == 403
    assert "refused" in response.text()
    assert job_row(conn, failed_job)["status"] == "failed"


def test_a_get_changes_nothing(
    conn: Conn, dashboard: Dashboard, page: Page, failed_job: int
) -> None:
    response = page.page.goto(f"{dashboard.base}/jobs/{failed_job}/retry?confirm=1")
    assert response is not None and response.status in (404, 405)
    assert job_row(conn, failed_job)["status"] == "failed"


def test_pause_a_queue_see_its_kick_held_then_resume_it(
    conn: Conn, db_url: str, dashboard: Dashboard, page: Page, tmp_path: Path
) -> None:
    """Pause from the queues page (confirmed), a kick of the queue recorded and held while a
    drain claims nothing of it, resume (confirmed), and the drain runs the job."""
    job_id = enqueue(conn, "ok", queue="emails")
    p = page.page
    p.goto(dashboard.base + "/")
    emails = p.locator("tr", has=p.locator("a", has_text="emails")).first
    emails.locator("button:has-text('Pause')").click()
    assert p.locator("h1").inner_text() == "Pause queue emails?"
    assert conn.execute("SELECT count(*) FROM pgdrain.queue_limits").fetchone() == (0,)
    p.click("button:has-text('Yes, pause emails')")
    assert p.inner_text(".notice").startswith("Paused: no run claims its jobs")
    store.kick_debounce(conn, ["emails"], 10.0)  # the application's kick after an enqueue
    assert run_drain(db_url).done == 0  # held: the paused queue is not claimed
    p.reload()
    emails = p.locator("tr", has=p.locator("a", has_text="emails")).first
    assert "paused" in emails.inner_text() and "kick held:" in emails.inner_text()
    _screenshot(p, "paused", tmp_path)
    p.reload()  # reloading the landing page repeats nothing
    emails.locator("button:has-text('Resume')").click()
    p.click("button:has-text('Yes, resume emails')")
    assert p.inner_text(".notice") == "Resumed: runs claim its jobs again."
    assert run_drain(db_url).done == 1
    assert job_row(conn, job_id)["status"] == "done"
    assert page.dialogs == []


@pytest.mark.parametrize("done_kept", [False, True], ids=["not-kept", "control-kept"])
def test_with_done_jobs_not_kept_the_queues_page_says_so_and_links_to_the_runs(
    conn: Conn, dashboard: Dashboard, page: Page, done_kept: bool
) -> None:
    """The function's runs deleted their done jobs (PGDRAIN_RETAIN_DONE=0, on their history
    lines): the queues page says its done column leaves them out, and its link opens the run
    history, which counts them. The control: the same run with done jobs kept."""
    enqueue(conn, "ok", queue="emails")
    counts = {"claimed": 40, "done": 40}
    record = store.RunRecord("schedule", 0, 1.0, "empty", counts, done_kept=done_kept)
    store.run_exit(conn, "pgdrain-drain:today", ["emails"], record=record)
    p = page.page
    p.goto(dashboard.base + "/")
    note = p.locator(".not-kept")
    if done_kept:
        assert note.count() == 0
        return
    assert note.inner_text().startswith("Done jobs are not kept")
    with p.expect_navigation():
        note.locator("a").click()
    assert p.locator("h1").inner_text() == "Control plane"
    assert "schedule" in p.inner_text("body")
    assert page.dialogs == []


def test_a_pause_without_its_token_is_refused(conn: Conn, dashboard: Dashboard, page: Page) -> None:
    url = f"{dashboard.base}/queues/emails/pause"
    headers = {"Origin": dashboard.base}
    refused = page.page.request.post(url, form={"confirm": "1"}, headers=headers, max_redirects=0)
    assert refused.status == 403
    assert conn.execute("SELECT count(*) FROM pgdrain.queue_limits").fetchone() == (0,)
    form = {"confirm": "1", "token": dashboard.tokens.issue("local")}
    done = page.page.request.post(url, form=form, headers=headers, max_redirects=0)
    assert done.status == 303  # the control: the same POST with its token pauses
    assert [q.queue for q in store.queue_stats(conn) if q.paused] == ["emails"]


# -- job data that tries to run script -------------------------------------------------------------


def test_job_data_renders_as_text_and_runs_no_script(
    conn: Conn, db_url: str, dashboard: Dashboard, page: Page
) -> None:
    """A kind, payload, error and traceback that carry markup, an attribute breakout, NUL,
    bytes that are not UTF-8 and a megabyte of text: shown as text, no dialog, no element
    injected, the huge one cut with a marker."""
    raised = enqueue(
        conn, "hostile", {"note": HOSTILE_SCRIPT, "attr": HOSTILE_ATTRIBUTE}, max_attempts=1
    )
    run_drain(db_url)
    # What the database can hold that the job API refuses: markup in the kind, and a
    # megabyte-long error with markup at its start (a queue name is checked by the table).
    planted = enqueue(conn, "ok", {"big": "x"})
    conn.execute(
        "UPDATE pgdrain.jobs SET kind = %s, status = 'failed', last_error = %s, "
        "errors = %s, finished_at = now() WHERE id = %s",
        (
            HOSTILE_SCRIPT,
            HOSTILE_SCRIPT + "y" * MEGABYTE,
            Jsonb([{"attempt": 1, "type": HOSTILE_ATTRIBUTE, "message": HOSTILE_SCRIPT,
                    "traceback": HOSTILE_SCRIPT * 3, "at": dt.datetime.now(dt.UTC).isoformat()}]),
            planted,
        ),
    )  # fmt: skip
    p = page.page
    for path in ("/", "/jobs", f"/jobs/{raised}", f"/jobs/{planted}", "/jobs?status=failed"):
        response = p.goto(dashboard.base + path)
        assert response is not None and response.status == 200, path
        assert p.locator("main script").count() == 0, path
        assert p.locator("main img").count() == 0, path
    p.goto(dashboard.base + f"/jobs/{raised}")
    main = p.inner_text("main")
    assert HOSTILE_SCRIPT in main and HOSTILE_ATTRIBUTE in main  # the payload and the error
    assert "nul:\\x00:" in main  # NUL, as the failure path stored it, visible
    assert "bad:\\udcff\\udcfe:" in main  # the bytes that were not UTF-8, visible
    p.goto(dashboard.base + f"/jobs/{planted}")
    main = p.inner_text("main")
    assert main.count(HOSTILE_SCRIPT) >= 3  # kind, last error, the attempt's message...
    assert "more characters not shown" in main
    assert len(p.content()) < MEGABYTE / 2  # the megabyte was cut, not sent
    p.goto(dashboard.base + "/jobs?status=failed")
    assert HOSTILE_SCRIPT in p.inner_text("tbody")
    assert page.dialogs == []
