"""The limits of a job, held by the table (migration 0015) and not only by build_job(): rows
written by enqueue_many(), another driver or a hand-written INSERT are held to them too. And
what one claim brings into the run: at most store.MAX_CLAIM_PAYLOAD_BYTES of payload text
(always its first job), so a batch of large payloads cannot exhaust a function's memory (10
payloads of 20 MB took one drain to 510 MB RSS against a 512 MB function)."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import psycopg
import pytest
from psycopg import errors as pg_errors

from helpers.fixtures import claim_batch, serve_instead, without_line
from pgdrain import BadInput, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.db import store
from pgdrain.db.sql import query
from pgdrain.db.store import operator_commands

Conn = psycopg.Connection[Any]
INSERT = "INSERT INTO pgdrain.jobs (queue, kind, payload, idempotency_key) VALUES (%s, %s, %s, %s)"
BAD_ROWS = {
    # constraint: (queue, kind, payload, key), each one field past its limit
    "jobs_payload_size_chk": ("default", "k", {"blob": "x" * (2 * 1024 * 1024)}, None),
    "jobs_queue_name_chk": ("emails; drop", "k", {}, None),
    "jobs_kind_length_chk": ("default", "k" * 201, {}, None),
    "jobs_key_length_chk": ("default", "k", {}, "x" * 501),
}
CONSTRAINTS = tuple(BAD_ROWS)


def _insert(conn: Conn, row: tuple[str, str, Any, str | None]) -> None:
    queue, kind, payload, key = row
    conn.execute(INSERT, (queue, kind, json.dumps(payload), key))


def _count(conn: Conn) -> int:
    found = conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone()
    assert found is not None
    return int(found[0])


@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_the_table_refuses_a_row_past_a_limit(conn: Conn, constraint: str) -> None:
    with pytest.raises(pg_errors.CheckViolation) as refused:
        _insert(conn, BAD_ROWS[constraint])
    assert refused.value.diag.constraint_name == constraint
    assert _count(conn) == 0


def test_an_empty_key_and_other_drivers_text_are_refused(conn: Conn) -> None:
    rows: list[tuple[str, str, Any, str | None]] = [
        ("default", "k", {}, ""),
        ("-dash", "k", {}, None),
        ("q" * 64, "k", {}, None),
    ]
    for row in rows:
        with pytest.raises(pg_errors.CheckViolation):
            _insert(conn, row)
    assert _count(conn) == 0


@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_control_without_the_constraint_the_row_goes_in(conn: Conn, constraint: str) -> None:
    """The control: with the constraint dropped (this test's own database), the same INSERT
    succeeds, as every one did before migration 0015."""
    conn.execute(f"ALTER TABLE pgdrain.active_jobs DROP CONSTRAINT {constraint}")
    _insert(conn, BAD_ROWS[constraint])
    assert _count(conn) == 1


def test_rows_at_the_limits_go_in(conn: Conn) -> None:
    """build_job's limits fit: a 256 KiB payload, a kind of 200, a key of 500, a queue of 63."""
    big = {"blob": "é" * (128 * 1024 - 10)}  # 2 bytes each in UTF-8: just under 256 KiB
    _insert(conn, ("q" * 63, "k" * 200, big, "x" * 500))
    _insert(conn, ("Emails.eu-1_b", "k", {"n": 1e300}, "x"))  # jsonb writes 301 digits
    assert _count(conn) == 2


def test_enqueue_many_checks_jobs_not_made_by_build_job(conn: Conn) -> None:
    """NewJob can be made directly: enqueue_many checks each job's fields and payload as
    build_job does, and writes none of them (one transaction) when one fails."""
    good = store.NewJob(kind="ok")
    bad_jobs = {
        "kind": store.NewJob(kind="k" * 201),
        "printable": store.NewJob(kind="send\temail"),  # what --kind filters take
        "queue": store.NewJob(kind="ok", queue="a b"),
        "key": store.NewJob(kind="ok", idempotency_key=""),
        "payload": store.NewJob(kind="ok", payload={"blob": "x" * (300 * 1024)}),
    }
    for field, bad in bad_jobs.items():
        with pytest.raises(BadInput, match=field if field != "key" else "idempotency key"):
            enqueue_many(conn, [good] * 6000 + [bad])  # past the first chunk of 5,000
        assert _count(conn) == 0


@pytest.mark.parametrize(
    "jobs",
    [None, [("ok", {})], [{"kind": "ok"}], ["ok"], [build_job("ok"), None]],
    ids=["none", "tuple", "dict", "kind", "list-with-none"],
)
def test_enqueue_many_refuses_what_build_job_did_not_make(conn: Conn, jobs: Any) -> None:
    """A red team's report: AttributeError or TypeError, not what to do instead."""
    with pytest.raises(BadInput, match=r"enqueue_many takes .*jobs made by pgdrain\.build_job"):
        enqueue_many(conn, jobs)
    assert _count(conn) == 0


# -- the claim's payload bound --------------------------------------------------------------------

LARGE = 900 * 1024  # bytes of payload text each: ten of them are 9 MB


def _large_jobs(conn: Conn, count: int) -> None:
    for n in range(count):
        _insert(conn, ("default", "big", {"n": n, "blob": "x" * (LARGE - 30)}, None))


def _claim(conn: Conn, statement: str) -> list[tuple[int, int]]:
    """Claim up to 10 with `statement`; (id, payload bytes) of what came back."""
    params = store.job_complete_and_claim_statement(
        [], ["default"], 10, "w", 30.0, None, None
    ).params
    rows = conn.execute(statement, params).fetchall()
    return [(int(r[1]), len(r[4].encode())) for r in rows if not r[0]]


def test_one_claim_brings_at_most_its_payload_bound(conn: Conn) -> None:
    _large_jobs(conn, 10)
    claimed = _claim(conn, query("job_complete_and_claim"))
    sizes = [size for _id, size in claimed]
    assert len(claimed) == 5, sizes  # 4 x 900 KiB come before the fifth: under 4 MiB
    assert sum(sizes[:-1]) < store.MAX_CLAIM_PAYLOAD_BYTES <= sum(sizes) + LARGE
    assert [i for i, _ in claimed] == sorted(i for i, _ in claimed)  # the claim's own order
    rest = claim_batch(conn, ["default"], 10, "w", 30.0, None)
    assert len(rest) == 5


def test_control_without_the_bound_one_claim_brings_every_payload(conn: Conn) -> None:
    """The control: the same claim without the bound's line takes the whole batch, 9 MB."""
    _large_jobs(conn, 10)
    unbounded = without_line(query("job_complete_and_claim"), "the claim's payload bound")
    claimed = _claim(conn, unbounded)
    assert len(claimed) == 10
    assert sum(size for _id, size in claimed) > 2 * store.MAX_CLAIM_PAYLOAD_BYTES


def test_a_payload_larger_than_the_bound_is_still_claimed_alone(conn: Conn) -> None:
    """Always the first job: a claim is never empty because of the bound (the constraint
    keeps a row far below it anyway)."""
    _large_jobs(conn, 1)
    conn.execute("UPDATE pgdrain.jobs SET payload = payload || '{\"more\": 1}'")
    assert len(_claim(conn, query("job_complete_and_claim"))) == 1


def test_the_bound_is_the_statements(conn: Conn) -> None:
    text = query("job_complete_and_claim")
    assert f"c.before < {store.MAX_CLAIM_PAYLOAD_BYTES}" in text
    assert store.MAX_STORED_PAYLOAD_BYTES < store.MAX_CLAIM_PAYLOAD_BYTES


# A run_at no client can read back (migration 0025): each writes through the statement other
# drivers are given (pgdrain.enqueue_statement), run_at as text.
UNREADABLE_RUN_AT = ["infinity", "10000-01-01 00:00:00+00", "-infinity"]


def _insert_at(conn: Conn, run_at: str) -> None:
    statement, params = store.job_insert_statement(build_job("k"))
    conn.execute(statement, {**params, "run_at": run_at})


@pytest.mark.parametrize("run_at", UNREADABLE_RUN_AT)
@pytest.mark.parametrize("checked", [True, False], ids=["refused", "control-no-constraint"])
def test_a_run_at_no_client_can_read_is_refused_before_it_breaks_every_exit(
    conn: Conn, run_at: str, checked: bool
) -> None:
    if not checked:
        conn.execute("ALTER TABLE pgdrain.active_jobs DROP CONSTRAINT jobs_run_at_readable_chk")
    else:
        with pytest.raises(pg_errors.CheckViolation) as refused:
            _insert_at(conn, run_at)
        assert refused.value.diag.constraint_name == "jobs_run_at_readable_chk"
        assert _count(conn) == 0
        run_at = "9999-12-29 00:00:00+00"  # the last day it takes: read back as any other
    _insert_at(conn, run_at)

    if checked or run_at == "-infinity":  # a past run_at is ready: nothing asks for its time
        assert store.run_exit(conn, "a-run", None, may_stay=True) is not None
    else:  # the exit check reads the next delayed job's run_at: every run's exit fails
        with pytest.raises(psycopg.DataError, match="too large"):
            store.run_exit(conn, "a-run", None, may_stay=True)


# A run_at no client can read, listed as NULL (job_list, job_list_finished): the guard, as written.
READABLE_GUARD = re.compile(
    r"CASE WHEN run_at > '0001-01-02 00:00:00\+00' AND run_at < '9999-12-30 00:00:00\+00'\s+"
    r"THEN (.*?) END AS"
)


def _finished_at(conn: Conn, run_at: str) -> int:
    """A failed job in the history with this run_at, as one written before migration 0025 (it
    constrains active_jobs only: the rows it found finished were already moved)."""
    row = conn.execute(
        """INSERT INTO pgdrain.finished_jobs
               (id, queue, kind, payload, status, priority, run_at, attempts, max_attempts,
                recovery_policy, reclaim_count, errors, created_at, updated_at, finished_at)
           VALUES (nextval('pgdrain.jobs_id_seq'), 'default', 'k', '{}', 'failed', 0, %s, 1, 1,
                   'retry', 0, '[]', now(), now(), now())
           RETURNING id""",
        (run_at,),
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("run_at", UNREADABLE_RUN_AT)
@pytest.mark.parametrize("guarded", [True, False], ids=["listed", "control-unguarded"])
@pytest.mark.parametrize("name", ["job_list", "job_list_finished"])
def test_a_history_row_whose_run_at_no_client_can_read_is_listed(
    conn: Conn, monkeypatch: pytest.MonkeyPatch, run_at: str, guarded: bool, name: str
) -> None:
    job_id = _finished_at(conn, run_at)
    if not guarded:
        unguarded = READABLE_GUARD.sub(r"\1 AS", query(name))
        assert unguarded != query(name)
        serve_instead(monkeypatch, operator_commands, {name: unguarded})
    statuses = ["failed"] if name == "job_list_finished" else ["failed", "done"]
    if guarded:
        [row] = store.job_list(conn, statuses, 10)
        assert (row.id, row.status, row.run_at, row.due_in_s) == (job_id, "failed", None, None)
    else:
        with pytest.raises(psycopg.Error, match=r"infinite|too large|out of range"):
            store.job_list(conn, statuses, 10)


@pytest.mark.parametrize(
    "run_at",
    [
        dt.datetime(9999, 12, 31, tzinfo=dt.UTC),
        dt.datetime(1, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
        dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),
    ],
    ids=["year-9999-end", "year-1-west", "year-1-east"],
)
def test_build_job_refuses_such_a_run_at_in_one_line(run_at: dt.datetime) -> None:
    with pytest.raises(BadInput, match="run_at must be after 0001-01-02 and before 9999-12-30"):
        build_job("k", run_at=run_at)
