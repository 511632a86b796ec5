"""Helpers shared by the test layers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgdrain import Budget, Settings, enqueue
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.db.sql import query
from pgdrain.runner.attempts import Attempts, RunState
from pgdrain.runner.deadline import Deadline
from pgdrain.runner.summary import Counters


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy, or fail after `timeout` seconds.
    Waits for a state, never for "a bit"."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def without_line(statement: str, fragment: str) -> str:
    """A test-only copy of a real statement with the line holding `fragment` removed: the
    control that shows what that line (a fence, a lock) prevents."""
    lines = statement.splitlines()
    kept = [line for line in lines if fragment not in line]
    # A statement whose fenced write has two parts (a job queued again, a job that ends and
    # moves to finished_jobs) fences each: every such line goes.
    assert len(kept) < len(lines), f"{fragment!r} must stand on a line of its own"
    return "\n".join(kept)


def serve_instead(monkeypatch: pytest.MonkeyPatch, module: object, texts: dict[str, str]) -> None:
    """Test-only copies of real statements (`texts`, by name), served in place of theirs to
    `module` (a pgdrain.db.store module: it reads its statements with query()): the control
    that shows what the part taken out of them prevents."""
    monkeypatch.setattr(module, "query", lambda name: texts.get(name) or query(name))


# The fence written for a plan that reads by primary key: the token of a running row.
FENCE_ON_RUNNING = re.compile(
    r"CASE WHEN j\.status = 'running' THEN j\.attempt_token END"
    r" = (ANY\(%\(\w+\)[sb]::uuid\[\]\)|%\(\w+\)[sb]|[\w.]+)"
)


# The fence of a statement given a list of held attempts, found by primary key (`j.id =
# ANY(ids)` on the line before): a CASE that compares a short list in turn and hashes a long one.
FENCE_ON_LIST = re.compile(
    r"WHERE j\.id = ANY\((?P<ids>%\(\w+\)[sb])::bigint\[\]\)\n(?P<indent>\s*)"
    r"AND CASE WHEN j\.status = 'running' THEN CASE\n.*?\bEND END\n",
    re.S,
)


def unfenced(name: str) -> str:
    """The named statement without its attempt_token fence: the line goes, or (where the fence
    is written inside a CASE) only the token's comparison, so that rows must still be running
    and the token is the one thing changed. A completion then records the token it was given
    (a join on the pairs): with the fence, that is the row's own; without it, a stale
    attempt's, which is what the controls look for."""
    statement = query(name)
    if FENCE_ON_LIST.search(statement):
        # A completion deletes the job from active_jobs and inserts it into finished_jobs with
        # the token of the attempt it accepted.
        completion = "j.attempt_token AS completed_token" in statement

        def running_only(m: re.Match[str]) -> str:
            ids, indent = m["ids"], m["indent"]
            if not completion:
                return f"WHERE j.id = ANY({ids}::bigint[])\n{indent}AND j.status = 'running'\n"
            tokens = ids.replace("ids", "tokens")
            return (
                f"USING unnest({ids}::bigint[], {tokens}::uuid[]) AS held(id, token)\n"
                f"{indent[:-2]}WHERE j.id = held.id\n{indent}AND j.status = 'running'\n"
            )

        replaced, count = FENCE_ON_LIST.subn(running_only, statement)
        assert count == 1, f"{name}: one fence expected"
        if completion:
            return (
                replaced.replace("RETURNING j.*", "RETURNING j.*, held.token AS held_token", 1)
                .replace("j.attempt_token AS completed_token", "j.held_token AS completed_token")
                .replace("j.attempt_token AS token FROM ended", "j.held_token AS token FROM ended")
            )
        return replaced
    if FENCE_ON_RUNNING.search(statement):
        replaced, count = FENCE_ON_RUNNING.subn("j.status = 'running'", statement)
        assert count >= 1, f"{name}: a fence expected"
        return replaced
    return without_line(statement, "AND j.attempt_token = ")


def job_row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        row = cur.execute("SELECT * FROM pgdrain.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None, f"job {job_id} does not exist"
    return row


def job_of_kind(conn: psycopg.Connection[Any], kind: str, *, max_attempts: int = 5) -> int:
    """A job of a kind enqueue refuses (control characters), as a row written before it did, or
    by the application's own SQL: what the commands must still show safely."""
    job_id = enqueue(conn, "placeholder", {}, max_attempts=max_attempts)
    conn.execute("UPDATE pgdrain.jobs SET kind = %s WHERE id = %s", (kind, job_id))
    return job_id


@pytest.fixture
def ledger_url(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The test's database with public.ledger, exported for the job kinds of helpers.ledger_jobs."""
    from helpers import ledger_jobs

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(ledger_jobs.LEDGER_TABLE)
    monkeypatch.setenv(ledger_jobs.LEDGER_URL_VARIABLE, db_url)
    yield db_url
    ledger_jobs.close_connections()


RUN_WORKER = "w-test"  # the worker a `run_state` claims as


@pytest.fixture
def run_state(db_url: str) -> Iterator[RunState]:
    """What the units of one run share (its session, open on the test's database, its attempts,
    deadline and counters): a unit of the runner driven alone, without the drain's loop."""
    budget = Budget.seconds(60)
    session = Session(db_url, Settings(), budget)
    session.open()
    try:
        yield RunState(session, Attempts(), Deadline(budget, 1.0), Counters(None), RUN_WORKER)
    finally:
        session.close()


TESTS_DIR = Path(__file__).resolve().parent.parent
HANDLER_DIR = TESTS_DIR.parent / "handler"


def drain_process(url: str, *args: str) -> subprocess.Popen[str]:
    """Start helpers.drain_process in a process of its own."""
    env = {**os.environ, "PYTHONPATH": f"{TESTS_DIR}{os.pathsep}{HANDLER_DIR}"}
    return subprocess.Popen(
        [sys.executable, "-m", "helpers.drain_process", url, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished_result(process: subprocess.Popen[str], timeout: float = 60.0) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"drain process failed ({process.returncode}): {err}"
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def db_now(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def claim_batch(
    conn: psycopg.Connection[Any],
    queues: list[str],
    limit: int,
    worker: str,
    lease_seconds: float,
    cap_seconds: float | None,
) -> list[store.ClaimedJob]:
    """Claim up to `limit` ready jobs, completing nothing: the claim a drain makes first."""
    return complete_and_claim(conn, [], queues, limit, worker, lease_seconds, cap_seconds)[1]


def complete_and_claim(
    conn: psycopg.Connection[Any],
    finished: Sequence[store.Held],
    queues: Sequence[str],
    limit: int,
    worker: str,
    lease_seconds: float,
    cap_seconds: float | None,
    claim_id: uuid.UUID | None = None,
) -> tuple[store.Fenced, list[store.ClaimedJob]]:
    """The drain's claim (job_complete_and_claim) made once, on `conn`."""
    return store.job_complete_and_claim_statement(
        finished, queues, limit, worker, lease_seconds, cap_seconds, claim_id
    ).run(conn)


def complete_one(conn: psycopg.Connection[Any], job: store.Held) -> bool:
    """Mark one job done; False means its lease was lost and nothing was written."""
    return job.id in store.job_complete_many(conn, [job]).applied


def statuses(conn: psycopg.Connection[Any]) -> list[tuple[str, int, int]]:
    """(status, attempts, how many jobs), in order: what a drain left behind."""
    return conn.execute(
        "SELECT status, attempts, count(*)::int FROM pgdrain.jobs GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()


# JSON that PostgreSQL stores but Python's json cannot read: nested 2,000 deep (RecursionError),
# an integer of 5,000 digits (ValueError: past sys.get_int_max_str_digits()).
UNREADABLE_JSON = {"deep": "[" * 2000 + "]" * 2000, "digits": '{"n": %s}' % ("9" * 5000)}


def unreadable_job(conn: psycopg.Connection[Any], text: str) -> int:
    """A job whose payload, output, progress and error history hold `text`, written by plain SQL
    (pgdrain itself refuses such values)."""
    row = conn.execute(
        "INSERT INTO pgdrain.jobs (kind, payload) VALUES ('k', %(v)s::jsonb) RETURNING id",
        {"v": text},
    ).fetchone()
    assert row is not None
    conn.execute(
        "UPDATE pgdrain.jobs SET output = %(v)s::jsonb, progress = %(v)s::jsonb,"
        " errors = jsonb_build_array(%(v)s::jsonb) WHERE id = %(id)s",
        {"v": text, "id": row[0]},
    )
    return int(row[0])
