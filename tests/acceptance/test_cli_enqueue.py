"""The real `pgdrain` command, run as a user runs it: enqueue, stats, and what it does with bad
input (exit 2, one line naming the problem, nothing written) and a database that is down
(exit 1, one line)."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.cli import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    ROOT,
    Run,
    count_jobs,
    only_line,
    run_pgdrain,
)
from helpers.fixtures import job_row

Conn = psycopg.Connection[Any]
HERE = Path(__file__).resolve().parent


def pgdrain(url: str, *args: str | bytes, **env: str) -> Run:
    """Run the command with DATABASE_URL=url and the kinds of enqueue_jobs, nothing else of
    ours set."""
    pythonpath = os.pathsep.join([str(ROOT / "handler"), str(HERE)])
    return run_pgdrain(
        *args,
        env={"DATABASE_URL": url, "PYTHONPATH": pythonpath, "PGDRAIN_JOBS": "enqueue_jobs", **env},
    )


# The happy path, each on a fresh database.


def test_enqueue_one_job_with_every_option(conn: Conn, db_url: str) -> None:
    run = pgdrain(
        db_url,
        "enqueue",
        "send_email",
        "--payload",
        '{"email_id": 7}',
        "--queue",
        "emails",
        "--priority",
        "3",
        "--max-attempts",
        "2",
        "--delay",
        "60",
        "--recovery-policy",
        "manual",
    )
    assert (run.code, run.err) == (EXIT_OK, "")
    match = re.fullmatch(r"enqueued job (\d+)", run.out.strip())
    assert match, run.out
    row = job_row(conn, int(match.group(1)))
    assert (row["kind"], row["payload"], row["queue"], row["status"]) == (
        "send_email",
        {"email_id": 7},
        "emails",
        "queued",
    )
    assert (row["priority"], row["max_attempts"], row["recovery_policy"]) == (3, 2, "manual")
    delayed = conn.execute(
        "SELECT run_at > now() + interval '50 seconds' FROM pgdrain.jobs WHERE id = %s",
        (row["id"],),
    ).fetchone()
    assert delayed == (True,)


def test_enqueue_count_inserts_that_many(conn: Conn, db_url: str) -> None:
    run = pgdrain(db_url, "enqueue", "send_email", "--count", "25")
    assert (run.code, run.err) == (EXIT_OK, "")
    assert re.fullmatch(r"enqueued 25 jobs \(\d+\.\.\d+\)", run.out.strip()), run.out
    assert count_jobs(conn) == 25


def test_enqueue_with_a_key_returns_the_same_job_twice(conn: Conn, db_url: str) -> None:
    first = pgdrain(db_url, "enqueue", "send_email", "--key", "order-42")
    second = pgdrain(db_url, "enqueue", "send_email", "--key", "order-42")
    assert (first.code, second.code) == (EXIT_OK, EXIT_OK)
    [first_id] = re.findall(r"\d+", first.out)
    [second_id] = re.findall(r"\d+", second.out)
    assert first_id == second_id
    assert "exists" in second.out
    assert count_jobs(conn) == 1


def test_stats_json_shape(conn: Conn, db_url: str) -> None:
    assert pgdrain(db_url, "enqueue", "send_email", "--count", "3").code == EXIT_OK
    assert pgdrain(db_url, "enqueue", "resize", "--queue", "images", "--delay", "600").code == 0

    run = pgdrain(db_url, "stats", "--json")

    assert (run.code, run.err) == (EXIT_OK, "")
    stats = json.loads(run.out)
    assert isinstance(stats, list)
    assert [s["queue"] for s in stats] == ["default", "images"]
    for entry in stats:
        assert set(entry) == {
            "queue",
            "queued",
            "ready",
            "delayed",
            "running",
            "done",
            "failed",
            "parked",
            "cancelled",
            "oldest_ready_age_s",
            "expired_leases",
            "paused",
            "waiting",
        }
        numbers = set(entry) - {"queue", "oldest_ready_age_s", "paused"}
        assert all(type(entry[k]) is int for k in numbers)
        assert entry["paused"] is False
        assert isinstance(entry["oldest_ready_age_s"], float)
    default, images = stats
    assert (default["queued"], default["ready"], default["done"]) == (3, 3, 0)
    assert (images["queued"], images["ready"], images["oldest_ready_age_s"]) == (1, 0, 0.0)
    assert images["delayed"] == 1


def test_stats_json_on_an_empty_queue_is_an_empty_list(db_url: str) -> None:
    run = pgdrain(db_url, "stats", "--json")
    assert (run.code, json.loads(run.out)) == (EXIT_OK, [])


# The kind's decorator options (PGDRAIN_JOBS=operator_jobs: `shaped` sets all four) are the
# defaults of `enqueue KIND`, as for jobs.enqueue() in code; a flag given wins.


def with_kinds(url: str, *args: str, jobs: str = "operator_jobs", path: str = "") -> Run:
    pythonpath = os.pathsep.join(p for p in (str(ROOT / "handler"), str(HERE), path) if p)
    return pgdrain(url, *args, PYTHONPATH=pythonpath, PGDRAIN_JOBS=jobs)


def _options(conn: Conn, run: Run) -> list[tuple[str, int, int, str]]:
    """The queue, priority, max_attempts and recovery_policy of each job the run enqueued."""
    assert (run.code, run.err) == (EXIT_OK, ""), run
    ids = [int(n) for n in re.findall(r"\d+", run.out)]
    rows = conn.execute(
        "SELECT queue, priority, max_attempts, recovery_policy FROM pgdrain.jobs"
        " WHERE id BETWEEN %s AND %s ORDER BY id",
        (min(ids), max(ids)),
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


COMMAND_DEFAULTS = ("default", 0, 5, "auto")


def test_enqueue_takes_the_kinds_decorator_options(conn: Conn, db_url: str) -> None:
    assert _options(conn, with_kinds(db_url, "enqueue", "shaped")) == [("q1", 3, 3, "manual")]
    many = with_kinds(db_url, "enqueue", "shaped", "--count", "3")
    assert _options(conn, many) == [("q1", 3, 3, "manual")] * 3


def test_enqueue_flags_win_over_the_kinds_options(conn: Conn, db_url: str) -> None:
    """Flags equal to the command's own defaults too: a flag given is never replaced."""
    args = ["--queue", "default", "--priority", "0", "--max-attempts", "5"]
    every = with_kinds(db_url, "enqueue", "shaped", *args, "--recovery-policy", "auto")
    assert _options(conn, every) == [COMMAND_DEFAULTS]
    some = with_kinds(db_url, "enqueue", "shaped", "--queue", "emails", "--priority", "-2")
    assert _options(conn, some) == [("emails", -2, 3, "manual")]


def test_enqueue_of_a_kind_the_module_does_not_register_is_refused(conn: Conn, db_url: str) -> None:
    """A typo would be retried and then failed by every drain: exit 2, the nearest kind
    named, nothing written. --unregistered enqueues it, with the command's defaults."""
    run = with_kinds(db_url, "enqueue", "shapd")
    assert (run.code, run.out) == (EXIT_BAD_INPUT, ""), run
    assert "did you mean 'shaped'?" in only_line(run.err)
    assert count_jobs(conn) == 0
    unregistered = with_kinds(db_url, "enqueue", "not_registered", "--unregistered")
    assert _options(conn, unregistered) == [COMMAND_DEFAULTS]


def test_control_without_the_module_the_kinds_options_are_not_applied(
    conn: Conn, db_url: str
) -> None:
    """The same kind, enqueued without the module (--unregistered): the command's defaults,
    so the options above came from operator_jobs."""
    unregistered = with_kinds(db_url, "enqueue", "shaped", "--unregistered")
    assert _options(conn, unregistered) == [COMMAND_DEFAULTS]


def test_enqueue_with_a_module_that_cannot_load_is_refused_and_writes_nothing(
    conn: Conn, db_url: str, tmp_path: Path
) -> None:
    """As `drain` does: the kinds cannot be checked, so nothing is written."""
    (tmp_path / "broken_enqueue_jobs.py").write_text('raise RuntimeError("no API key")\n')
    (tmp_path / "syntax_enqueue_jobs.py").write_text("def broken(:\n")
    for jobs, fragment in [
        ("broken_enqueue_jobs", "failed to import: RuntimeError: no API key"),
        ("syntax_enqueue_jobs", "failed to import: SyntaxError"),
        ("no_such_jobs_module", "was not found"),
    ]:
        run = with_kinds(db_url, "enqueue", "shaped", jobs=jobs, path=str(tmp_path))
        assert (run.code, run.out) == (EXIT_BAD_INPUT, ""), run
        line = only_line(run.err)
        assert line.startswith("pgdrain: error: PGDRAIN_JOBS:") and fragment in line, line
    assert count_jobs(conn) == 0


# Bad input: exit 2, exactly one line on stderr naming the problem, and no row written.
# These share one database (a bad command writes nothing, which each case checks).


BAD_INPUT: list[tuple[str, Sequence[str | bytes], str]] = [
    ("invalid JSON payload", ["send_email", "--payload", "{not json"], "--payload"),
    ("NaN payload", ["send_email", "--payload", "NaN"], "JSON"),
    ("empty kind", [""], "kind"),
    ("blank kind", ["   "], "kind"),
    ("non-UTF-8 kind", [b"\xff\xfesend"], "kind"),
    ("kind too long", ["k" * 201], "kind"),
    ("negative delay", ["send_email", "--delay", "-5"], "--delay"),
    ("infinite delay", ["send_email", "--delay", "inf"], "--delay"),
    ("max attempts 0", ["send_email", "--max-attempts", "0"], "max_attempts"),
    ("non-numeric max attempts", ["send_email", "--max-attempts", "five"], "--max-attempts"),
    ("non-numeric count", ["send_email", "--count", "many"], "--count"),
    ("count 0", ["send_email", "--count", "0"], "--count"),
    ("non-numeric priority", ["send_email", "--priority", "high"], "--priority"),
    ("priority out of range", ["send_email", "--priority", "99999999999"], "priority"),
    ("queue with SQL metacharacters", ["send_email", "--queue", "q';--"], "queue"),
    ("unknown recovery policy", ["send_email", "--recovery-policy", "never"], "recovery-policy"),
    ("empty key", ["send_email", "--key", ""], "key"),
    ("key with count", ["send_email", "--key", "k", "--count", "2"], "--key"),
    ("NUL in payload", ["send_email", "--payload", '{"a": "\\u0000"}'], "NUL"),
    ("lone surrogate in payload", ["send_email", "--payload", '{"a": "\\ud800"}'], "UTF-8"),
    ("non-UTF-8 bytes in payload", [b"send_email", b"--payload", b'{"a": "\xff"}'], "UTF-8"),
    ("payload file missing", ["send_email", "--payload", "@/no/such/file.json"], "--payload"),
]


@pytest.mark.parametrize(
    ("args", "problem"),
    [pytest.param(args, problem, id=what) for what, args, problem in BAD_INPUT],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    module_db_url: str, args: Sequence[str | bytes], problem: str
) -> None:
    with psycopg.connect(module_db_url, autocommit=True) as conn:
        before = count_jobs(conn)
        run = pgdrain(module_db_url, "enqueue", *args)
        after = count_jobs(conn)
    assert run.code == EXIT_BAD_INPUT, run
    line = only_line(run.err)
    assert line.startswith("pgdrain: error: ")
    assert problem in line
    assert run.out == ""
    assert after == before


def test_a_payload_over_256_kib_from_a_file_exits_2_and_writes_nothing(
    module_db_url: str, tmp_path: Path
) -> None:
    # One command-line argument is capped at 128 KiB on Linux, so a large payload comes from
    # a file (`--payload @FILE`). The limit counts UTF-8 bytes: "é" is two.
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"body": "é" * 150_000}, ensure_ascii=False), encoding="utf-8")
    with psycopg.connect(module_db_url, autocommit=True) as conn:
        before = count_jobs(conn)
        run = pgdrain(module_db_url, "enqueue", "send_email", "--payload", f"@{big}")
        after = count_jobs(conn)
    assert run.code == EXIT_BAD_INPUT, run
    line = only_line(run.err)
    assert "payload is 300" in line and "limit is 262144" in line
    assert after == before


def test_control_the_same_command_with_good_input_writes(module_db_url: str) -> None:
    """The bad-input cases above differ from this one in their bad argument only."""
    with psycopg.connect(module_db_url, autocommit=True) as conn:
        before = count_jobs(conn)
        run = pgdrain(module_db_url, "enqueue", "send_email", "--payload", '{"a": "é"}')
        assert (run.code, run.err) == (EXIT_OK, "")
        assert count_jobs(conn) == before + 1
        conn.execute("DELETE FROM pgdrain.jobs")


# A database that is down.


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("args", [["enqueue", "send_email"], ["stats"]], ids=["enqueue", "stats"])
def test_a_database_that_is_down_gives_exit_1_and_one_line(args: list[str]) -> None:
    port = _closed_port()
    run = pgdrain(
        f"postgresql://postgres@127.0.0.1:{port}/pgdrain", *args, PGDRAIN_CONNECT_TIMEOUT="1"
    )
    assert run.code == EXIT_FAILURE, run
    line = only_line(run.err)
    assert line.startswith("pgdrain: error: database unreachable")
    assert f"port {port}" in line  # names where it tried
    assert "Traceback" not in run.err
    assert run.out == ""


@pytest.mark.parametrize("args", [["jobs"], ["stats"], ["enqueue", "send_email"]])
def test_an_operator_command_retries_a_database_that_is_down_quietly(args: list[str]) -> None:
    """Retries inside the connect timeout (5 s less the 3 s reserve) print nothing: one line
    on stderr, the error naming how many attempts it made. With -v, each retry is a line."""
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/pgdrain"
    run = pgdrain(url, *args, PGDRAIN_CONNECT_TIMEOUT="5")
    assert run.code == EXIT_FAILURE, run
    line = only_line(run.err)
    attempts = re.search(r"database unreachable after (\d+) attempt\(s\)", line)
    assert attempts and int(attempts.group(1)) >= 2, line  # it did retry
    assert run.out == ""

    verbose = pgdrain(url, "-v", *args, PGDRAIN_CONNECT_TIMEOUT="5")
    retries = [r for r in verbose.err.splitlines() if "INFO database not reachable yet" in r]
    assert verbose.code == EXIT_FAILURE and len(retries) >= 1, verbose
