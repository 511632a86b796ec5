"""The run history (pgdrain.run_history, migration 0019): the line a run's exit writes, once,
and retention's bound on it. What `pgdrain runs` and the dashboard's control page list."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.aws import aws_environment, handler_env, invoke_handler, mocked_aws
from helpers.cli import run_pgdrain
from helpers.dashboard import dashboard_event, dashboard_function
from helpers.fixtures import serve_instead
from pgdrain import Budget, enqueue
from pgdrain.cli.report import DONE_NOT_KEPT
from pgdrain.db import retention, store
from pgdrain.db.sql import query
from pgdrain.db.store import control_plane
from pgdrain.ui import pages

Conn = psycopg.Connection[Any]
KICK = {"pgdrain": {"reason": "enqueue", "queues": ["default"]}}
RECORD = store.RunRecord("wake", 0, 2.5, "empty", {"claimed": 3, "done": 2, "failed": 1})
# The line of run_exit that makes a repeated exit write nothing more.
GUARD = "    ON CONFLICT (run_id) DO NOTHING  -- the exit repeated: the first line stands\n"


@pytest.fixture
def function(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The drain function's handler, as `pgdrain invoke` runs it (no schedule is created)."""
    aws_environment(monkeypatch)
    handler_env(monkeypatch, DATABASE_URL=db_url, AWS_SAM_LOCAL="true")
    with mocked_aws():
        yield


def test_a_run_leaves_one_line_with_its_trigger_and_counts(function: None, conn: Conn) -> None:
    with conn.transaction():
        for i in range(3):
            enqueue(conn, "noop", {"i": i})
        enqueue(conn, "fail", {}, max_attempts=1)
        enqueue(conn, "flaky", {"failures": 1})  # retried later: the run leaves it queued

    summary = invoke_handler(KICK)

    assert summary["ok"] is True, summary
    [line] = store.run_history_list(conn)
    result = summary["result"]
    assert (line.trigger, line.queues, line.chain, line.stop_reason) == (
        "enqueue",
        ["*"],  # the function drains every queue (PGDRAIN_QUEUES unset)
        0,
        "empty",
    )
    counted = (line.claimed, line.done, line.failed, line.retried, line.cancelled, line.lease_lost)
    assert counted == (5, 3, 1, 1, 0, 0)
    names = ("claimed", "done", "failed", "retried", "cancelled", "lease_lost")
    assert counted == tuple(result[name] for name in names)
    assert line.started_at <= line.finished_at
    assert 0 <= line.duration_s <= result["elapsed_s"] + 1.0
    # Its registration is gone: the line is where a run that ended is seen.
    assert store.run_list(conn) == []


def test_each_run_has_a_line_of_its_own_newest_first(function: None, conn: Conn) -> None:
    invoke_handler(KICK)
    enqueue(conn, "noop", {})
    invoke_handler({"pgdrain": {"reason": "wake"}})

    lines = store.run_history_list(conn)
    assert [(r.trigger, r.done) for r in lines] == [("wake", 1), ("enqueue", 0)]
    assert len({r.run_id for r in lines}) == 2
    assert [r.trigger for r in store.run_history_list(conn, limit=1)] == ["wake"]


def _exit(conn: Conn, run_id: str, statement: str = "") -> None:
    """The exit statement of a run that found nothing, with its history line: store.run_exit,
    or `statement` (a control's variant of it) with the same parameters."""
    if not statement:
        store.run_exit(conn, run_id, ["default"], record=RECORD)
        return
    params = {
        "run_id": run_id,
        "queues": ["default"],
        "may_stay": False,
        "linger_window_s": 0.0,
        "clear_kicks": True,
        **RECORD.params(),
    }
    conn.execute(statement, params)


def _lines(conn: Conn, run_id: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgdrain.run_history WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("guarded", [True, False], ids=["on-conflict", "control: no guard"])
def test_an_exit_sent_again_after_a_lost_reply_writes_one_line(conn: Conn, guarded: bool) -> None:
    """A lost reply: the session sends the exit statement again. The line is keyed by the
    run's id and the insert does nothing on conflict. The control removes both (the key and
    the ON CONFLICT line, in a transaction rolled back): the same two sends write two lines."""
    store.run_register(conn, "run-1", ["default"], 0, 60.0)
    with conn.transaction(force_rollback=True):
        if guarded:
            _exit(conn, "run-1")
            _exit(conn, "run-1")
        else:
            conn.execute("ALTER TABLE pgdrain.run_history DROP CONSTRAINT run_history_pkey")
            statement = query("run_exit")
            assert GUARD in statement
            _exit(conn, "run-1", statement.replace(GUARD, ""))
            _exit(conn, "run-1", statement.replace(GUARD, ""))
        assert _lines(conn, "run-1") == (1 if guarded else 2)


def test_a_line_keeps_cancelled_jobs_apart_from_failed_ones_and_lost_leases(conn: Conn) -> None:
    counts = {"claimed": 4, "done": 1, "failed": 1, "cancelled": 2, "lease_lost": 0}
    store.run_register(conn, "run-3", ["default"], 0, 60.0)
    store.run_exit(
        conn, "run-3", ["default"], record=store.RunRecord("wake", 0, 1.0, "empty", counts)
    )
    [line] = store.run_history_list(conn)
    assert (line.claimed, line.done, line.failed, line.cancelled, line.lease_lost) == (
        4,
        1,
        1,
        2,
        0,
    )


def test_a_run_that_stays_to_drain_again_writes_no_line_yet(conn: Conn) -> None:
    enqueue(conn, "noop", {})
    store.run_register(conn, "run-2", ["default"], 0, 60.0)
    check = store.run_exit(conn, "run-2", ["default"], may_stay=True, record=RECORD)
    assert (check.exited, check.ready) == (False, True)
    assert _lines(conn, "run-2") == 0
    conn.execute("DELETE FROM pgdrain.jobs")
    assert store.run_exit(conn, "run-2", ["default"], may_stay=True, record=RECORD).exited
    assert _lines(conn, "run-2") == 1


def _ended_days_ago(conn: Conn, days: float, count: int) -> set[str]:
    ids: set[str] = set()
    for _ in range(count):
        run_id = f"run-{len(ids)}-{days}"
        store.run_exit(conn, run_id, ["default"], record=RECORD)
        conn.execute(
            "UPDATE pgdrain.run_history SET finished_at = now() - %s * interval '1 day',"
            " started_at = now() - %s * interval '1 day' WHERE run_id = %s",
            (days, days, run_id),
        )
        ids.add(run_id)
    return ids


def test_retention_deletes_old_lines_and_keeps_recent_ones(conn: Conn) -> None:
    """Lines older than PGDRAIN_RETAIN_DONE go, in batches (here of 2), with the done jobs."""
    old = _ended_days_ago(conn, 8, 5)
    recent = _ended_days_ago(conn, 6, 2)

    deleted = retention.run_once(
        conn, retain_done_days=7, retain_failed_days=30, budget=Budget.seconds(60), batch=2
    )

    assert (deleted.runs, deleted.complete) == (5, True)
    assert {r.run_id for r in store.run_history_list(conn)} == recent
    assert not old & {r.run_id for r in store.run_history_list(conn)}


def test_control_a_longer_retention_keeps_them_all(conn: Conn) -> None:
    _ended_days_ago(conn, 8, 3)
    deleted = retention.run_once(
        conn, retain_done_days=9, retain_failed_days=30, budget=Budget.seconds(60)
    )
    assert deleted.runs == 0
    assert len(store.run_history_list(conn)) == 3


# With done jobs not kept, the lines are kept as long as failed jobs: a written-out copy of the
# rule, without it, is the control.
RUNS_AS_LONG_AS_FAILED = re.compile(
    r"CASE WHEN %\(done_days\)s::float8 > 0 THEN %\(done_days\)s::float8\s+"
    r"ELSE %\(failed_days\)s::float8 END"
)


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "control-with-the-done-jobs"])
def test_with_done_jobs_not_kept_the_lines_are_kept_as_long_as_failed_jobs(
    conn: Conn, monkeypatch: pytest.MonkeyPatch, kept: bool
) -> None:
    """PGDRAIN_RETAIN_DONE=0: the run history is the only count of done jobs left, so its
    lines stay PGDRAIN_RETAIN_FAILED days; the control deletes them all at every pass."""
    if not kept:
        text = RUNS_AS_LONG_AS_FAILED.sub("%(done_days)s::float8", query("job_retention_batch"))
        assert text != query("job_retention_batch")
        serve_instead(monkeypatch, control_plane, {"job_retention_batch": text})
    recent = _ended_days_ago(conn, 2, 2)
    _ended_days_ago(conn, 31, 2)

    deleted = retention.run_once(
        conn, retain_done_days=0, retain_failed_days=30, budget=Budget.seconds(60)
    )

    assert deleted.runs == (2 if kept else 4)
    assert {r.run_id for r in store.run_history_list(conn)} == (recent if kept else set())


@pytest.mark.parametrize("retain_done", ["0", "7"], ids=["not-kept", "control-kept"])
def test_a_run_records_whether_it_kept_its_done_jobs_and_stats_and_the_dashboard_say_so(
    function: None, db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, retain_done: str
) -> None:
    """PGDRAIN_RETAIN_DONE is the function's setting: the operator's shell and the dashboard
    function do not have it. The run's line records it (migration 0027), so there `stats` and
    the queues page say that done jobs are missing from their counts. The control: the same run
    with done jobs kept, and neither says it."""
    monkeypatch.setenv("PGDRAIN_RETAIN_DONE", retain_done)
    enqueue(conn, "noop", {})
    assert store.runs_keep_done(conn) is None  # no run has said

    summary = invoke_handler(KICK)

    assert summary["ok"] is True, summary
    not_kept = retain_done == "0"
    assert store.runs_keep_done(conn) is not not_kept
    stats = run_pgdrain("stats", env={"DATABASE_URL": db_url})  # no PGDRAIN_ variable
    assert stats.code == 0, stats.err
    assert (stats.out.splitlines()[-1] == DONE_NOT_KEPT) is not_kept
    page = dashboard_function(db_url).resolve(dashboard_event("GET", "/"), None)
    assert page["statusCode"] == 200
    assert ("Done jobs are not kept" in page["body"]) is not_kept


def test_the_control_page_lists_the_lines_as_text(conn: Conn) -> None:
    """Every value from the table is escaped (a queue or trigger with markup shows as text)."""
    store.run_exit(
        conn,
        "run-x",
        ["<script>alert(1)</script>"],
        record=store.RunRecord('<img src=x onerror="1">', 2, 75.0, "budget", {"done": 7}),
    )
    [line] = store.run_history_list(conn)
    body = pages.control_page([], [], [], [], line.finished_at, [line])
    assert "<script>alert" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "<img" not in body and "&lt;img src=x onerror=&quot;1&quot;&gt; (hop 2)" in body
    assert "1m 15s" in body and "budget" in body
    empty = pages.control_page([], [], [], [], line.finished_at, [])
    assert "No run has ended yet" in empty
