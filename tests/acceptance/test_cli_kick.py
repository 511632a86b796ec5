"""`pgdrain enqueue` and `pgdrain retry` kick the drain function after their commit, as the
application's pgdrain.kick() does (PGDRAIN_FUNCTION_NAME, debounced in the database), and say
what the kick did. Each command runs as a user runs it, in a process of its own, with Lambda
mocked by moto in that process (helpers.cli_under_moto); the Invoke it makes is then handed to
the real handler here, which drains the job. The control: the same commands with the kick
switched off (the CLI of before): no run is started, and the job waits for the schedule."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.aws import (
    ACCOUNT,
    FUNCTION_NAME,
    REGION,
    aws_environment,
    create_function,
    handler_env,
    invoke_handler,
    mocked_aws,
)
from helpers.cli import EXIT_OK, ROOT, Run, only_line, run_pgdrain
from helpers.fixtures import job_row
from pgdrain.aws import events

Conn = psycopg.Connection[Any]
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
}


def pgdrain(
    db_url: str,
    tmp_path: Path,
    *args: str,
    function: str | None = FUNCTION_NAME,
    control_no_kick: bool = False,
    lambda_endpoint: str | None = None,
    queues: str | None = None,
) -> tuple[Run, list[dict[str, Any]]]:
    """The command, with the function `function` configured (None: PGDRAIN_FUNCTION_NAME
    unset), and the Invoke calls it made."""
    invokes = tmp_path / f"invokes-{len(list(tmp_path.iterdir()))}.jsonl"
    env = {
        "DATABASE_URL": db_url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(ROOT / "tests")]),
        "PGDRAIN_TEST_INVOKES": str(invokes),
        **FAKE_AWS,
    }
    if function is not None:
        env["PGDRAIN_FUNCTION_NAME"] = function
    if queues is not None:
        env["PGDRAIN_QUEUES"] = queues
    options = ["--control-no-kick"] if control_no_kick else []
    if lambda_endpoint is not None:
        options += ["--lambda-endpoint", lambda_endpoint]
    run = run_pgdrain(
        *options, "--", *args, env=env, drop=("PGDRAIN_", "AWS_"), module="helpers.cli_under_moto"
    )
    assert "Traceback" not in run.err, run.err
    calls = [json.loads(line) for line in invokes.read_text(encoding="utf-8").splitlines()]
    return run, calls


@pytest.fixture
def function(monkeypatch: pytest.MonkeyPatch, db_url: str) -> Iterator[None]:
    """The drain function's handler in this process, draining the emails queue."""
    aws_environment(monkeypatch)
    handler_env(monkeypatch, DATABASE_URL=db_url, PGDRAIN_QUEUES="emails")
    with mocked_aws():
        create_function()
        yield


def _status(conn: Conn, job_id: int) -> str:
    return str(job_row(conn, job_id)["status"])


def _fail(conn: Conn, job_id: int) -> None:
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'failed', attempts = 1, finished_at = now()"
        " WHERE id = %s",
        (job_id,),
    )


@pytest.mark.parametrize("kick", [True, False], ids=["kicks", "control-no-kick"])
def test_an_enqueued_job_starts_a_run_at_once(
    conn: Conn, db_url: str, tmp_path: Path, function: None, kick: bool
) -> None:
    run, calls = pgdrain(
        db_url, tmp_path, "enqueue", "noop", "--queue", "emails", control_no_kick=not kick
    )

    assert (run.code, run.err) == (EXIT_OK, "")
    said = run.out.splitlines()
    match = re.fullmatch(r"enqueued job (\d+)", said[0])
    assert match is not None, run.out
    job_id = int(match.group(1))
    if kick:
        assert said[1:] == [f"kicked {FUNCTION_NAME} (queues: emails)"]
        assert [(c["function"], c["type"]) for c in calls] == [(FUNCTION_NAME, "Event")]
        assert calls[0]["event"] == events.enqueue_event(["emails"])
        # The run that Invoke starts drains the job.
        assert invoke_handler(calls[0]["event"])["result"]["done"] == 1
        assert _status(conn, job_id) == "done"
    else:  # the CLI of before: nothing starts a run; the job waits for the schedule
        assert (said[1:], calls) == ([], [])
        assert _status(conn, job_id) == "queued"


@pytest.mark.parametrize("kick", [True, False], ids=["kicks", "control-no-kick"])
def test_a_retried_job_starts_a_run_at_once(
    conn: Conn, db_url: str, tmp_path: Path, function: None, kick: bool
) -> None:
    from pgdrain import enqueue

    job_id = enqueue(conn, "noop", queue="emails")
    _fail(conn, job_id)

    dry, calls = pgdrain(db_url, tmp_path, "retry", str(job_id), "--dry-run")
    assert (dry.code, dry.out.splitlines(), calls) == (
        EXIT_OK,
        [f"would queue again: [{job_id}]"],
        [],
    )

    run, calls = pgdrain(db_url, tmp_path, "retry", str(job_id), control_no_kick=not kick)

    assert (run.code, run.err) == (EXIT_OK, "")
    said = run.out.splitlines()
    assert said[0] == f"queued again: [{job_id}]"
    if kick:
        assert said[1:] == [f"kicked {FUNCTION_NAME} (queues: emails)"]
        assert [c["event"] for c in calls] == [events.enqueue_event(["emails"])]
        assert invoke_handler(calls[0]["event"])["result"]["done"] == 1
        assert _status(conn, job_id) == "done"
    else:
        assert (said[1:], calls) == ([], [])
        assert _status(conn, job_id) == "queued"


def test_retry_by_filter_kicks_each_queue_it_queued_again(
    conn: Conn, db_url: str, tmp_path: Path
) -> None:
    from pgdrain import enqueue

    jobs = [enqueue(conn, "noop", queue=q) for q in ("emails", "sms", "emails")]
    for job_id in jobs:
        _fail(conn, job_id)

    run, calls = pgdrain(db_url, tmp_path, "retry", "--failed")

    assert (run.code, run.err) == (EXIT_OK, "")
    assert run.out.splitlines()[0] == "queued again: 3 jobs"
    assert run.out.splitlines()[-1] == f"kicked {FUNCTION_NAME} (queues: emails, sms)"
    assert [c["event"] for c in calls] == [events.enqueue_event(["emails", "sms"])]


def test_cancelling_a_sequences_head_kicks_the_queue_of_the_next(
    conn: Conn, db_url: str, tmp_path: Path
) -> None:
    from pgdrain import enqueue

    head = enqueue(conn, "noop", queue="emails", sequence="customer-1")
    nxt = enqueue(conn, "noop", queue="sms", sequence="customer-1")

    run, calls = pgdrain(db_url, tmp_path, "cancel", str(head))

    assert (run.code, run.err) == (EXIT_OK, "")
    assert _status(conn, nxt) == "queued"
    assert run.out.splitlines()[-1] == f"kicked {FUNCTION_NAME} (queues: sms)"
    assert [c["event"] for c in calls] == [events.enqueue_event(["sms"])]


def test_without_a_function_the_commands_say_nothing_of_kicks(
    conn: Conn, db_url: str, tmp_path: Path
) -> None:
    run, calls = pgdrain(db_url, tmp_path, "enqueue", "noop", function=None)
    assert (run.code, run.err, calls) == (EXIT_OK, "", [])
    assert re.fullmatch(r"enqueued job (\d+)\n", run.out), run.out
    job_id = int(run.out.split()[-1])
    _fail(conn, job_id)

    run, calls = pgdrain(db_url, tmp_path, "retry", str(job_id), function=None)
    assert (run.code, run.err, run.out, calls) == (EXIT_OK, "", f"queued again: [{job_id}]\n", [])


def test_a_kick_that_fails_says_why_and_the_job_stays_enqueued(
    conn: Conn, db_url: str, tmp_path: Path
) -> None:
    with socket.socket() as probe:  # a port nothing listens on: the Lambda API is unreachable
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    run, calls = pgdrain(db_url, tmp_path, "enqueue", "noop", lambda_endpoint=endpoint)

    assert run.code == EXIT_OK  # the job is committed: the kick is only a latency optimisation
    assert only_line(run.err).startswith("pgdrain: WARNING kick failed;"), run.err
    first, second = run.out.splitlines()
    job_id = int(first.split()[-1])
    assert second.startswith(f"not kicked: invoking {FUNCTION_NAME} failed (Could not connect")
    assert second.endswith("; the next kick or the schedule drains the jobs")
    assert len(calls) >= 1  # tried; a failed invoke suppresses nothing:
    assert _status(conn, job_id) == "queued"
    row = conn.execute("SELECT kicked_at = '-infinity' FROM pgdrain.kicks").fetchone()
    assert row == (True,)


def test_a_kick_within_the_debounce_window_says_a_run_takes_it(
    conn: Conn, db_url: str, tmp_path: Path
) -> None:
    first, calls = pgdrain(db_url, tmp_path, "enqueue", "noop")
    assert first.out.splitlines()[1:] == [f"kicked {FUNCTION_NAME} (queues: default)"]
    assert len(calls) == 1

    second, calls = pgdrain(db_url, tmp_path, "enqueue", "noop")

    assert (second.code, second.err, calls) == (EXIT_OK, "", [])
    assert second.out.splitlines()[1:] == [
        f"not kicked for default: a run of {FUNCTION_NAME} started moments ago, a live run "
        "or a pending wake-up takes the jobs"
    ]


def test_a_delayed_job_asks_for_a_wake_up_instead_of_a_run(
    conn: Conn, db_url: str, tmp_path: Path
) -> None:
    arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FUNCTION_NAME}"
    run, calls = pgdrain(db_url, tmp_path, "enqueue", "noop", "--delay", "600", function=arn)

    assert (run.code, run.err) == (EXIT_OK, "")
    said = run.out.splitlines()[1]
    assert re.fullmatch(
        rf"not kicked for default: nothing is ready yet; {re.escape(arn)} will wake up at \S+",
        said,
    ), said
    assert [c["event"]["pgdrain"]["reason"] for c in calls] == ["later"]
    assert calls[0]["function"] == arn


@pytest.mark.parametrize("kick", [True, False], ids=["kicks", "control-no-kick"])
def test_resume_kicks_a_paused_queue_whose_jobs_are_ready(
    conn: Conn, db_url: str, tmp_path: Path, function: None, kick: bool
) -> None:
    """`pgdrain pause`, an enqueue whose kick is recorded and starts no run, `pgdrain resume`
    that kicks (each command a process of its own); the control resumes without the kick."""
    paused, calls = pgdrain(db_url, tmp_path, "pause", "emails")
    assert (paused.code, paused.err, calls) == (EXIT_OK, "", [])
    assert re.fullmatch(r"paused emails \(since \S+\)\n", paused.out), paused.out
    again, _ = pgdrain(db_url, tmp_path, "pause", "emails", "--json")
    assert (
        json.loads(again.out)["paused_at"]
        == json.loads(pgdrain(db_url, tmp_path, "pause", "emails", "--json")[0].out)["paused_at"]
    )  # pausing twice changes nothing

    enqueued, calls = pgdrain(db_url, tmp_path, "enqueue", "noop", "--queue", "emails")
    assert (enqueued.code, calls) == (EXIT_OK, [])  # the kick is held: no run
    assert enqueued.out.splitlines()[1] == (
        "not kicked for emails: paused; the kick is recorded (`pgdrain resume QUEUE` kicks it)"
    )
    job_id = int(enqueued.out.splitlines()[0].split()[-1])
    row = conn.execute("SELECT requested_at IS NOT NULL FROM pgdrain.kicks").fetchone()
    assert row == (True,)  # recorded, not lost
    stats, _ = pgdrain(db_url, tmp_path, "stats", "--json")
    assert [q["paused"] for q in json.loads(stats.out)] == [True]
    listed, _ = pgdrain(db_url, tmp_path, "jobs", "--json")
    assert [j["queue_paused"] for j in json.loads(listed.out)] == [True]

    resumed, calls = pgdrain(db_url, tmp_path, "resume", "emails", control_no_kick=not kick)

    assert (resumed.code, resumed.err) == (EXIT_OK, "")
    assert resumed.out.splitlines()[0] == "resumed emails"
    if kick:
        assert resumed.out.splitlines()[1:] == [f"kicked {FUNCTION_NAME} (queues: emails)"]
        assert [c["event"] for c in calls] == [events.enqueue_event(["emails"])]
        assert invoke_handler(calls[0]["event"])["result"]["done"] == 1
        assert _status(conn, job_id) == "done"
    else:  # nothing starts a run: the job waits for the schedule
        assert (resumed.out.splitlines()[1:], calls) == ([], [])
        assert _status(conn, job_id) == "queued"
    twice, calls = pgdrain(db_url, tmp_path, "resume", "emails")
    assert twice.out.splitlines()[0] == "not paused: nothing changed for emails"


@pytest.mark.parametrize("function", [FUNCTION_NAME, None], ids=["function", "workers"])
def test_an_enqueue_into_a_queue_these_settings_do_not_drain_says_so(
    conn: Conn, db_url: str, tmp_path: Path, function: str | None
) -> None:
    """A red team's report: with PGDRAIN_QUEUES=default, `pgdrain enqueue` of a job in `emails`
    said only `enqueued job N`, though nothing these settings start drains it (and with a
    function configured, the kick's refusal failed the command after its commit)."""
    run, calls = pgdrain(
        db_url,
        tmp_path,
        "enqueue",
        "noop",
        "--queue",
        "emails",
        function=function,
        queues="default",
    )
    assert (run.code, run.err, calls) == (EXIT_OK, "", [])
    first, second = run.out.splitlines()
    assert second.startswith("not kicked for emails: not among PGDRAIN_QUEUES (default)"), run.out
    assert _status(conn, int(first.split()[-1])) == "queued"


def test_resume_asks_for_a_wake_up_when_the_queues_jobs_are_due_later(
    conn: Conn, db_url: str, tmp_path: Path, function: None
) -> None:
    """A red team's report: `pgdrain resume` kicked only a queue with a job ready, and the kick
    held while it was paused had set no wake-up: a job due in two minutes waited for the hourly
    safety net. The resume now kicks as an enqueue does."""
    pgdrain(db_url, tmp_path, "pause", "emails")
    pgdrain(db_url, tmp_path, "enqueue", "noop", "--queue", "emails", "--delay", "120")
    resumed, calls = pgdrain(db_url, tmp_path, "resume", "emails")
    assert (resumed.code, resumed.err) == (EXIT_OK, "")
    assert resumed.out.splitlines()[1].startswith(
        f"not kicked for emails: nothing is ready yet; {FUNCTION_NAME} will wake up at "
    ), resumed.out
    assert [c["event"]["pgdrain"]["reason"] for c in calls] == ["later"]
