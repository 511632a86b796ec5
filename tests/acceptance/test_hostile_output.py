"""Every command's output, with job data that tries to act on the terminal: a kind holding an
OSC title sequence, BEL, a clear-screen and a right-to-left override, and an error text with
ESC, CR and LF. No command may print one of those characters raw (`report.printable` shows
them as escapes), and each record stays on its line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psycopg

from helpers.cli import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, ROOT, Run, run_pgdrain
from helpers.fixtures import job_of_kind

Conn = psycopg.Connection[Any]
HERE = Path(__file__).resolve().parent
RAW_CONTROLS = ("\x1b", "\r", "\x07", "\u202e")
HOSTILE_KIND = "\x1b]0;pwned\x07\x1b[2J\u202eevil"
ESCAPED_KIND = "\\x1b]0;pwned\\x07\\x1b[2J\\u202eevil"


def run_cli(url: str, *args: str) -> Run:
    return run_pgdrain(
        *args,
        env={
            "DATABASE_URL": url,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(HERE)]),
            "PGDRAIN_JOBS": "catalogue_jobs",
            "PGDRAIN_RESERVE_SECONDS": "0.5",
        },
    )


def _assert_nothing_raw(command: str, run: Run) -> None:
    for text in (run.out, run.err):
        raw = [c for c in RAW_CONTROLS if c in text]
        assert not raw, f"`pgdrain {command}` printed {raw!r} raw: {text!r}"


def _failed_hostile_job(conn: Conn, url: str) -> int:
    """A job of the hostile kind, failed by a drain (no function is registered for it)."""
    job_id = job_of_kind(conn, HOSTILE_KIND, max_attempts=1)  # enqueue refuses the kind
    drained = run_cli(url, "-v", "drain", "--budget", "30")
    assert drained.code == EXIT_OK, drained
    _assert_nothing_raw("drain", drained)
    return job_id


def test_no_command_prints_job_data_raw(db_url: str, conn: Conn) -> None:
    job_id = _failed_hostile_job(conn, db_url)
    commands: list[tuple[str, ...]] = [
        ("stats",),
        ("jobs",),
        ("jobs", "--status", "failed"),
        ("jobs", "show", str(job_id)),
        ("retry", "--failed", "--dry-run"),
        ("retry", "--failed"),
        ("cancel", str(job_id)),
        ("retry", str(job_id)),
        ("purge", "--dry-run"),
        ("enqueue", HOSTILE_KIND),  # refused: the CLI takes printable kinds only
    ]
    shown = {}
    for args in commands:
        run = run_cli(db_url, *args)
        assert run.code in (EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT), run
        _assert_nothing_raw(" ".join(args), run)
        shown[args] = run
    # The kind is there, escaped, where a command names it.
    for args in [("jobs",), ("jobs", "show", str(job_id)), ("retry", "--failed")]:
        assert ESCAPED_KIND in shown[args].out, (args, shown[args].out)
    dry = shown[("retry", "--failed", "--dry-run")].out.splitlines()
    assert dry == ["would queue again: 1 job", f"{job_id:>8} default      {ESCAPED_KIND}"]


def test_control_the_data_is_hostile_as_stored(db_url: str, conn: Conn) -> None:
    """The control: the same job read back without `printable` (`jobs --json`, decoded) holds
    the raw characters, which retry --failed printed as they were before."""
    job_id = _failed_hostile_job(conn, db_url)
    listed = run_cli(db_url, "jobs", "--json")
    assert listed.code == EXIT_OK, listed
    _assert_nothing_raw("jobs --json", listed)  # JSON escapes them itself
    (row,) = json.loads(listed.out)
    assert row["id"] == job_id and row["kind"] == HOSTILE_KIND
    assert all(c in row["kind"] for c in ("\x1b", "\x07", "\u202e"))
    old_line = f"{job_id:>8} {'default':<12} {row['kind']}"  # retry --failed's line before
    assert any(c in old_line for c in RAW_CONTROLS)
