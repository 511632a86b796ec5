"""`pgdrain invoke`, run as a user runs it: the handler from template.yaml, the sample events of
infra/events, env.json overrides as sam applies them; the result as JSON on stdout, the
function's own output (logs, metrics) on stderr."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.aws import emf_records, log_records, metric_totals
from helpers.cli import Run, run_pgdrain
from pgdrain import enqueue

Conn = psycopg.Connection[Any]


def invoke(url: str, *args: str, stdin: str | None = None) -> Run:
    """`pgdrain invoke ...` in the repository, with DATABASE_URL=url and no PGDRAIN_* set.
    The URL says sslmode=prefer: the template's PGSSLMODE requires TLS, which the test server
    does not have (a sslmode in the URL wins, as it would in the function)."""
    return run_pgdrain(
        "invoke",
        *args,
        env={"DATABASE_URL": _with_sslmode(url, "prefer")},
        stdin=(stdin or "").encode(),
        drop=("PGDRAIN_", "POWERTOOLS_"),
    )


def _with_sslmode(url: str, mode: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["sslmode"] = mode
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def test_the_templates_tls_is_what_invoke_runs_with(db_url: str) -> None:
    """The template requires TLS (DatabaseSslMode): `pgdrain invoke` runs with it, and a
    server without it is refused at once, in one line that says what to do; a sslmode in the
    URL wins."""
    run = run_pgdrain(
        "invoke",
        "-e",
        "infra/events/schedule.json",
        env={"DATABASE_URL": db_url},
        drop=("PGDRAIN_", "POWERTOOLS_", "PGSSLMODE"),
    )
    if "host=/" in db_url or "@/" in db_url:  # a Unix socket: libpq uses no TLS there
        assert run.code == 0, run.err
        return
    assert run.code == 1
    error = run.result()["error"]
    assert "server does not support SSL, but SSL was required" in error
    assert "end the URL with ?sslmode=disable" in error  # what to do, in the same line


def _enqueue(conn: Conn, queue: str, count: int) -> None:
    with conn.transaction():
        for i in range(count):
            enqueue(conn, "noop", {"i": i}, queue=queue)


def _statuses(conn: Conn) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        "SELECT queue, status, count(*) FROM pgdrain.jobs GROUP BY queue, status"
    ).fetchall()
    return {(r[0], r[1]): int(r[2]) for r in rows}


def test_the_scheduled_event_drains_the_queue(db_url: str, conn: Conn) -> None:
    _enqueue(conn, "default", 25)

    run = invoke(db_url, "-e", "infra/events/schedule.json")

    assert run.code == 0, run.err
    result = run.result()
    # queues null: the function drains every queue (PGDRAIN_QUEUES unset in infra/env.json)
    assert (result["ok"], result["trigger"], result["queues"]) == (True, "schedule", None)
    assert result["result"]["done"] == 25
    assert result["result"]["stop_reason"] == "empty"
    assert _statuses(conn) == {("default", "done"): 25}
    # The function's own output went to stderr: structured logs and EMF metrics.
    messages = [line["message"] for line in log_records(run.err)]
    assert "run finished" in messages
    assert metric_totals(emf_records(run.err))["JobsSucceeded"] == 25
    assert {line["function_name"] for line in log_records(run.err)} == {"local-drain"}


def test_pgdrain_runs_lists_the_run_an_invoke_made(db_url: str, conn: Conn) -> None:
    """The run's exit wrote its line; `pgdrain runs`, a process of its own, prints it."""
    _enqueue(conn, "default", 4)
    assert invoke(db_url, "-e", "infra/events/enqueue.json").code == 0
    env = {"DATABASE_URL": db_url}

    listed = run_pgdrain("runs", "--json", env=env)
    shown = run_pgdrain("runs", "--limit", "5", env=env)

    assert listed.code == 0, listed.err
    [line] = json.loads(listed.out)
    assert (line["trigger"], line["queues"], line["stop_reason"]) == ("enqueue", ["*"], "empty")
    assert (line["claimed"], line["done"], line["failed"]) == (4, 4, 0)
    assert line["finished_at"] >= line["started_at"]
    assert shown.code == 0, shown.err
    header, row = shown.out.splitlines()
    assert header.split()[:3] == ["finished", "(UTC)", "trigger"]
    fields = row.split()  # date, time, trigger, took, claimed, done, failed, retried, stop, queues
    assert fields[2] == "enqueue" and fields[3].endswith("s")
    assert fields[4:] == ["4", "4", "0", "0", "empty", "*"]
    assert run_pgdrain("runs", "--limit", "0", env=env).code == 2


def test_env_json_overrides_what_the_template_declares(
    db_url: str, conn: Conn, tmp_path: Path
) -> None:
    _enqueue(conn, "default", 3)
    _enqueue(conn, "emails", 4)
    _enqueue(conn, "reports", 2)  # not in the overridden PGDRAIN_QUEUES
    env_json = tmp_path / "env.json"
    env_json.write_text(
        json.dumps(
            {
                "Parameters": {"PGDRAIN_QUEUES": "default,emails", "NOT_IN_TEMPLATE": "x"},
                "DrainFunction": {"PGDRAIN_CONCURRENCY": "2"},
            }
        )
    )
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pgdrain": {"reason": "enqueue", "queues": ["emails"]}}))

    run = invoke(db_url, "DrainFunction", "-e", str(event), "--env-vars", str(env_json))

    assert run.code == 0, run.err
    assert run.result()["result"]["done"] == 7  # a kicked run drains all of PGDRAIN_QUEUES
    assert _statuses(conn) == {
        ("default", "done"): 3,
        ("emails", "done"): 4,
        ("reports", "queued"): 2,
    }
    assert "not in the template, ignored (as sam does): NOT_IN_TEMPLATE" in run.err


@pytest.mark.parametrize(
    "event",
    ['["a list"]', '{"pgdrain": {"reason": "enqueue", "queues": ["no such queue"]}}', "{}"],
    ids=["list", "bad-queue", "empty"],
)
def test_a_bad_event_fails_with_the_reason_and_drains_nothing(
    db_url: str, conn: Conn, event: str
) -> None:
    _enqueue(conn, "default", 2)

    run = invoke(db_url, "-e", "-", stdin=event)

    assert run.code == 1
    result = run.result()
    assert result["ok"] is False and result["error"]
    assert _statuses(conn) == {("default", "queued"): 2}
    errors = [line for line in log_records(run.err) if line["level"] == "ERROR"]
    assert [line["message"] for line in errors] == [f"bad event: {result['error']}"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("-t", "nothing.yaml"),
            "no template nothing.yaml: run `pgdrain invoke` in the folder of a SAM project "
            "(`pgdrain init` writes one), or name its template with --template",
        ),
        (
            ("Nope",),
            "template.yaml has no function 'Nope' (it has DrainFunction, WebDashboardFunction)",
        ),
        (("-e", "nothing.json"), "cannot read the event nothing.json: No such file or directory"),
    ],
    ids=["template", "function", "event"],
)
def test_bad_arguments_exit_2_with_one_line(
    db_url: str, args: tuple[str, ...], message: str
) -> None:
    run = invoke(db_url, *args)
    assert run.code == 2
    assert run.out == ""
    assert run.err.strip().splitlines()[-1] == f"pgdrain: error: {message}"


def test_a_shell_variable_the_template_sets_otherwise_is_said_unused(db_url: str) -> None:
    """A pooler's red team: PGDRAIN_POOLER=transaction exported in the shell was dropped
    without a word (the template's Pooler, session, wins, as the stack's would): the run left
    its session settings on a pooled connection. Now it is said, and --env-vars gives it."""
    run = run_pgdrain(
        "invoke",
        "-e",
        "infra/events/schedule.json",
        env={"DATABASE_URL": _with_sslmode(db_url, "prefer"), "PGDRAIN_POOLER": "transaction"},
        drop=("PGDRAIN_", "POWERTOOLS_"),
    )
    assert run.code == 0, run.err
    said = "set in your shell, but the template gives its own value"
    assert [line for line in run.err.splitlines() if said in line] == [
        "pgdrain: set in your shell, but the template gives its own value, which the function "
        "got (give yours with --env-vars): PGDRAIN_POOLER"
    ]
