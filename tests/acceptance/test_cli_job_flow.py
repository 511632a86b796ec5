"""Sequences, dependencies and recorded output through the `pgdrain` command, each step a
fresh process as a user runs it: enqueue with --sequence and --after, drain, and `jobs show`
(text and --json) with the output, progress, sequence and dependencies."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import psycopg

from helpers.cli import EXIT_BAD_INPUT, EXIT_OK, ROOT, Run, only_line, run_pgdrain
from helpers.fixtures import UNREADABLE_JSON, job_row, unreadable_job
from pgdrain.cli.report import DONE_NOT_KEPT

Conn = psycopg.Connection[Any]
HERE = Path(__file__).resolve().parent


def pgdrain(url: str, *args: str) -> Run:
    env = {
        "DATABASE_URL": url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(HERE)]),
        "PGDRAIN_JOBS": "operator_jobs",
    }
    run = run_pgdrain(*args, env=env)
    assert "Traceback" not in run.err, run.err
    return run


def _enqueued(url: str, *args: str) -> int:
    run = pgdrain(url, "enqueue", "count", *args)
    assert run.code == EXIT_OK, run.err
    match = re.match(r"enqueued job (\d+)", run.out)
    assert match, run.out
    return int(match[1])


def test_jobs_show_gives_sequence_dependencies_and_output(db_url: str, conn: Conn) -> None:
    first = _enqueued(db_url, "--payload", '{"n": 2}', "--sequence", "customer-42")
    second = _enqueued(db_url, "--sequence", "customer-42")
    after = _enqueued(db_url, "--after", str(first), "--after", str(second))
    assert [job_row(conn, i)["status"] for i in (first, second, after)] == [
        "queued",
        "waiting",
        "waiting",
    ]

    shown = pgdrain(db_url, "jobs", "show", str(second)).out
    assert re.search(r"^status\s+waiting$", shown, re.M)
    assert re.search(r"^sequence\s+customer-42$", shown, re.M)

    assert pgdrain(db_url, "drain", "--budget", "30").code == EXIT_OK
    assert [job_row(conn, i)["status"] for i in (first, second, after)] == ["done"] * 3

    shown = pgdrain(db_url, "jobs", "show", str(after)).out
    assert re.search(rf"^depends_on\s+\[{first}, {second}\]$", shown, re.M)
    shown = pgdrain(db_url, "jobs", "show", str(first)).out
    assert re.search(r'^output\s+\{"counted": 2\}$', shown, re.M)
    assert re.search(r"^progress\s+1.0$", shown, re.M)

    as_json = json.loads(pgdrain(db_url, "jobs", "show", str(first), "--json").out)
    assert (as_json["output"], as_json["sequence"]) == ({"counted": 2}, "customer-42")
    listed = json.loads(pgdrain(db_url, "jobs", "--status", "done", "--json").out)
    by_id = {row["id"]: row for row in listed}
    assert by_id[first]["output"] == {"counted": 2}
    assert by_id[after]["depends_on"] == [first, second]


def test_jobs_show_gives_values_python_cannot_hold_as_their_json_text(
    db_url: str, conn: Conn
) -> None:
    for kind, text in sorted(UNREADABLE_JSON.items()):
        job_id = unreadable_job(conn, text)
        shown = pgdrain(db_url, "jobs", "show", str(job_id))
        assert shown.code == EXIT_OK, shown.err
        assert re.search(r"^kind\s+k$", shown.out, re.M)  # the rest shows
        for field in ("payload", "output", "progress"):
            assert re.search(rf"^{field}\s+\(not decoded: .*\) {re.escape(text)}$", shown.out, re.M)
        assert re.search(r"^errors: \(not decoded: ", shown.out, re.M)
        as_json = pgdrain(db_url, "jobs", "show", str(job_id), "--json")
        assert as_json.code == EXIT_OK, as_json.err
        job = json.loads(as_json.out)
        assert job["kind"] == "k" and job["payload"] == text, kind
        assert set(job["undecoded"]) == {"payload", "output", "progress", "errors"}
    listed = pgdrain(db_url, "jobs", "--json")
    assert listed.code == EXIT_OK, listed.err
    assert [set(j["undecoded"]) for j in json.loads(listed.out)] == [{"output", "progress"}] * 2


def test_a_missing_dependency_is_one_line_and_nothing_is_written(db_url: str, conn: Conn) -> None:
    run = pgdrain(db_url, "enqueue", "count", "--after", "424242")
    assert run.code == EXIT_BAD_INPUT
    assert "job 424242 (a dependency) does not exist" in only_line(run.err)
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)


def test_cancel_waiting_cancels_the_waiting_jobs_and_leaves_the_rest(
    db_url: str, conn: Conn
) -> None:
    head = _enqueued(db_url, "--sequence", "s")
    behind = _enqueued(db_url, "--sequence", "s")
    dependent = _enqueued(db_url, "--after", str(head))
    plain = _enqueued(db_url)
    run = pgdrain(db_url, "cancel", "--waiting")
    assert run.code == EXIT_OK, run.err
    assert [job_row(conn, i)["status"] for i in (head, behind, dependent, plain)] == [
        "queued",
        "cancelled",
        "cancelled",
        "queued",
    ]
    assert conn.execute(
        "SELECT count(*) FROM pgdrain.finished_jobs WHERE id = ANY(%s)", ([behind, dependent],)
    ).fetchone() == (2,)


def test_with_done_jobs_not_kept_a_drain_deletes_them_but_a_sequences(
    db_url: str, conn: Conn
) -> None:
    """PGDRAIN_RETAIN_DONE=0, as a user sets it: the drain deletes a plain done job, and moves
    the jobs of a sequence (their rows release the next one)."""
    plain = _enqueued(db_url)
    first = _enqueued(db_url, "--sequence", "customer-7")
    second = _enqueued(db_url, "--sequence", "customer-7")
    env = {
        "DATABASE_URL": db_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(HERE)]),
        "PGDRAIN_JOBS": "operator_jobs",
        "PGDRAIN_RETAIN_DONE": "0",
    }
    drained = run_pgdrain("drain", "--budget", "30", env=env)
    assert drained.code == EXIT_OK, drained.err
    assert [job_row(conn, i)["status"] for i in (first, second)] == ["done", "done"]
    shown = pgdrain(db_url, "jobs", "show", str(plain))
    assert shown.code != EXIT_OK
    assert only_line(shown.err) == f"pgdrain: error: no job {plain}"  # a shell keeping them
    # Where done jobs are not kept, an id that matches nothing may be a job that finished
    for command in (["jobs", "show"], ["cancel"], ["retry"]):
        gone = run_pgdrain(*command, str(plain), env=env)
        assert gone.code != EXIT_OK
        assert only_line(gone.err).endswith(
            "(done jobs are not kept, PGDRAIN_RETAIN_DONE=0: one that finished done is gone)"
        ), gone.err
    # stats says what its done column counts now
    stats = run_pgdrain("stats", env=env)
    assert stats.code == EXIT_OK, stats.err
    assert stats.out.splitlines()[-1] == DONE_NOT_KEPT
    assert DONE_NOT_KEPT not in pgdrain(db_url, "stats").out


def test_a_budget_longer_than_postgresqls_longest_timeout_drains(db_url: str, conn: Conn) -> None:
    """A red team's report: --budget takes up to 1e9 s, but past 2,147,483 s (statement_timeout's
    largest, in ms) every drain failed at its start. Its limits are now PostgreSQL's largest."""
    job_id = _enqueued(db_url)
    drained = pgdrain(db_url, "drain", "--budget", "1e9")
    assert (drained.code, drained.err) == (EXIT_OK, ""), drained
    assert job_row(conn, job_id)["status"] == "done"
