"""How the CLI prints what a drain did, the queue counts and jobs (cli/report.py), without a
database: every count in its place, and job data that cannot act on the terminal."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from pgdrain.cli.report import (
    format_job,
    format_job_line,
    format_jobs,
    format_result,
    format_stats,
    job_as_dict,
    plural,
    printable,
)
from pgdrain.db.store import STATS_HISTORY_BOUND, JobRow, QueueStats
from pgdrain.runner.drain import DrainResult

AT = dt.datetime(2026, 12, 1, 4, 14, 5, tzinfo=dt.UTC)


def test_a_drain_result_is_one_line_with_every_count_and_why_it_stopped() -> None:
    result = DrainResult(
        claimed=12,
        done=9,
        retried=2,
        failed=1,
        lease_lost=3,
        reclaimed=4,
        released=5,
        stop_reason="budget",
        elapsed_s=2.5,
    )
    assert format_result(result) == (
        "claimed 12, done 9, retried 2, failed 1, lease lost 3, reclaimed 4, released 5; "
        "stopped: budget after 2.5s"
    )


def test_cancelled_jobs_are_counted_on_the_line_only_when_a_run_had_some() -> None:
    result = DrainResult(claimed=3, done=1, failed=1, cancelled=1, elapsed_s=0.5)
    assert format_result(result) == (
        "claimed 3, done 1, retried 0, failed 1, cancelled 1, lease lost 0, reclaimed 0, "
        "released 0; stopped: empty after 0.5s"
    )


def test_a_run_ended_by_an_error_says_it_on_the_same_line() -> None:
    result = DrainResult(stop_reason="error", error="connection refused\n\x1b[2J")
    line = format_result(result)
    assert line.endswith("stopped: error after 0.0s (connection refused\\n\\x1b[2J)")
    assert "\n" not in line and "\x1b" not in line


def test_a_run_over_paused_queues_names_them_on_a_line_of_their_own() -> None:
    result = DrainResult(paused=["emails", "sms"], elapsed_s=0.5)
    assert format_result(result).splitlines() == [
        "claimed 0, done 0, retried 0, failed 0, lease lost 0, reclaimed 0, released 0; "
        "stopped: empty after 0.5s",
        "paused: emails, sms (no run claims their jobs; `pgdrain resume QUEUE`)",
    ]


NO_JOBS = QueueStats(
    queue="",
    queued=0,
    ready=0,
    delayed=0,
    running=0,
    done=0,
    failed=0,
    parked=0,
    cancelled=0,
    oldest_ready_age_s=0.0,
    expired_leases=0,
)


def test_the_stats_are_one_aligned_line_per_queue_under_a_header() -> None:
    lines = format_stats(
        [
            replace(
                NO_JOBS,
                queue="emails",
                ready=3,
                running=2,
                delayed=1,
                waiting=5,
                failed=4,
                oldest_ready_age_s=12.34,
            ),
            replace(
                NO_JOBS,
                queue="reports",
                done=STATS_HISTORY_BOUND,
                cancelled=1,
                expired_leases=2,
            ),
        ]
    ).splitlines()
    assert lines[0].split() == [
        "queue", "ready", "running", "delayed", "waiting", "failed", "parked",
        "oldest", "ready", "done", "cancelled", "expired",
    ]  # fmt: skip
    assert lines[1].split() == ["emails", "3", "2", "1", "5", "4", "0", "12.3s", "0", "0", "0"]
    # queue_stats stops counting finished jobs at its bound: shown as that many and more.
    assert lines[2].split() == [
        "reports", "0", "0", "0", "0", "0", "0", "0.0s", "10000+", "1", "2",
    ]  # fmt: skip
    assert len({len(line) for line in lines}) == 1  # the columns line up


def test_no_queue_at_all_is_said() -> None:
    assert format_stats([]).splitlines()[1:] == ["(no jobs)"]


FAILED_JOB = JobRow(
    id=7,
    queue="emails",
    kind="send_email",
    status="failed",
    priority=0,
    attempts=3,
    max_attempts=3,
    reclaim_count=1,
    run_at=AT,
    lease_expires_at=None,
    created_at=AT,
    updated_at=AT,
    finished_at=AT,
    last_error="ValueError: no such user",
    due_in_s=-3600.0,
)


def test_a_listed_job_is_one_line_with_its_attempts_and_last_error() -> None:
    assert format_job_line(FAILED_JOB).split() == [
        "7", "emails", "send_email", "failed", "3/3", "1", "ValueError:", "no", "such", "user",
    ]  # fmt: skip
    assert format_job_line(replace(FAILED_JOB, last_error=None)).split()[-2:] == ["3/3", "1"]


def test_the_job_list_has_a_header_and_tells_queued_jobs_apart() -> None:
    """Ready (run_at has come), retrying (a failed attempt's backoff) and scheduled (enqueued
    for later) are all `queued`: the list says which, and for how long."""
    queued = replace(FAILED_JOB, status="queued", last_error=None, reclaim_count=0)
    rows = [
        replace(queued, id=1, attempts=0, due_in_s=-1.0),
        replace(queued, id=2, attempts=1, due_in_s=12.4),
        replace(queued, id=3, attempts=0, due_in_s=300.0),
        replace(queued, id=4, status="running", attempts=1, due_in_s=-5.0),
    ]
    lines = format_jobs(rows).splitlines()
    assert lines[0].split() == [
        "id",
        "queue",
        "kind",
        "state",
        "attempt",
        "reclaims",
        "last",
        "error",
    ]
    assert [line.split()[3:6] for line in lines[1:]] == [
        ["ready", "0/3", "0"],
        ["retrying", "in", "12s"],
        ["scheduled", "in", "5m"],
        ["running", "1/3", "0"],
    ]
    assert [job_as_dict(r)["state"] for r in rows] == ["ready", "retrying", "scheduled", "running"]
    assert format_jobs([]).splitlines()[1:] == ["(no jobs)"]


def test_one_job_is_one_job() -> None:
    assert [plural(n, "job") for n in (0, 1, 2)] == ["0 jobs", "1 job", "2 jobs"]


def test_job_data_in_a_listed_job_is_escaped() -> None:
    """Kind, queue and error come from whoever enqueued the job: a newline, an escape sequence
    or a bidirectional override is shown, not obeyed."""
    line = format_job_line(
        replace(FAILED_JOB, kind="evil\u202ekind", queue="q\r", last_error="bad\n\x1b[31m")
    )
    assert "evil\\u202ekind" in line and "q\\r" in line and "bad\\n\\x1b[31m" in line
    assert line.isprintable()


def test_printable_leaves_ordinary_text_alone() -> None:
    assert printable("naïve 東京 ✓") == "naïve 東京 ✓"
    assert printable(42) == "42"
    assert printable("tab\there\x7f") == "tab\\there\\x7f"


SEPARATORS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines splits at each


def test_printable_escapes_every_line_break_splitlines_knows() -> None:
    shown = printable("a" + "b".join(SEPARATORS) + "c")
    assert shown == "a\\x0bb\\x0cb\\x1cb\\x1db\\x1eb\\x85b\\u2028b\\u2029c"
    assert len(shown.splitlines()) == 1 and shown.isprintable()


def test_a_shown_jobs_error_history_keeps_one_line_per_line_break() -> None:
    message = "one\u2028two\u2029three\x85four"
    error = {
        "attempt": 1,
        "at": "t",
        "type": "E",
        "message": message,
        "traceback": f"T {message}\n",
    }
    lines = format_job({"id": 1, "errors": [error]}).splitlines()
    assert lines == [
        "id  1",
        "errors (1):",
        "  attempt 1 at t: E: one\\u2028two\\u2029three\\x85four",
        "    T one\\u2028two\\u2029three\\x85four",
    ]


def test_a_job_as_json_has_its_times_as_iso_text() -> None:
    data = job_as_dict(FAILED_JOB)
    assert data["run_at"] == "2026-12-01T04:14:05+00:00"
    assert data["lease_expires_at"] is None and data["attempts"] == 3


def test_a_shown_job_lists_its_fields_in_order_then_its_error_history() -> None:
    job = {
        "payload": {"user_id": 42},
        "id": 7,
        "status": "failed",
        "kind": "send_email",
        "a_later_column": "x",
        "last_error": None,
        "errors": [
            {"attempt": 1, "at": "t1", "type": "ValueError", "message": "no", "traceback": "T\n"},
            "a plain message",
        ],
    }
    lines = format_job(job).splitlines()
    assert [line.split()[0] for line in lines[:6]] == [
        "id", "kind", "status", "last_error", "payload", "a_later_column",
    ]  # fmt: skip
    assert lines[3].split() == ["last_error", "-"]  # None
    assert lines[4].split(None, 1) == ["payload", '{"user_id": 42}']
    assert lines[6:] == [
        "errors (2):",
        "  attempt 1 at t1: ValueError: no",
        "    T",
        "  attempt ? at ?: Error: a plain message",
    ]
    assert format_job({"id": 1, "errors": []}).splitlines()[-1] == "errors: none recorded"
