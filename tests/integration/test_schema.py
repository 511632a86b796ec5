"""The schema keeps its own invariants: impossible rows are refused by CHECK constraints, and
the partial indexes the claim and the reclaim rely on exist and are used."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]

LEASE = {
    "lease_expires_at": "now() + interval '1 minute'",
    "leased_by": "'worker-1'",
    "attempt_token": "gen_random_uuid()",
    "heartbeat_at": "now()",
}
NO_LEASE = dict.fromkeys(LEASE, "NULL")

# (what is wrong, the columns set, the constraint that must refuse it)
IMPOSSIBLE_ROWS = [
    ("queued with a lease", {"status": "'queued'", **LEASE}, "jobs_lease_chk"),
    ("done with a lease", {"status": "'done'", **LEASE}, "jobs_lease_chk"),
    ("running without a lease", {"status": "'running'", **NO_LEASE}, "jobs_lease_chk"),
    (
        "running without a token",
        {"status": "'running'", **LEASE, "attempt_token": "NULL"},
        "jobs_lease_chk",
    ),
    (
        "queued with only a token",
        {"status": "'queued'", "attempt_token": "gen_random_uuid()"},
        "jobs_lease_chk",
    ),
    ("negative attempts", {"attempts": "-1"}, "jobs_counts_chk"),
    ("negative reclaim_count", {"reclaim_count": "-1"}, "jobs_counts_chk"),
    ("max_attempts 0", {"max_attempts": "0"}, "jobs_counts_chk"),
    ("unknown status", {"status": "'paused'"}, "jobs_status_chk"),
    ("parked with a lease", {"status": "'parked'", **LEASE}, "jobs_lease_chk"),
    ("cancelled with a lease", {"status": "'cancelled'", **LEASE}, "jobs_lease_chk"),
    ("unknown recovery_policy", {"recovery_policy": "'sometimes'"}, "jobs_recovery_policy_chk"),
    ("empty kind", {"kind": "''"}, "jobs_kind_chk"),
    ("empty queue", {"queue": "''"}, "jobs_queue_chk"),
]


@pytest.fixture(scope="module")
def shared(module_db_url: str) -> Iterator[Conn]:
    with psycopg.connect(module_db_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def tx(shared: Conn) -> Iterator[Conn]:
    """The module's database inside a transaction that is rolled back after the test."""
    with shared.transaction(force_rollback=True):
        yield shared


def _insert(conn: Conn, columns: dict[str, str]) -> None:
    """Insert one row with the given column expressions (test-owned literals only)."""
    values = {"kind": "'send_email'", **columns}
    names = sql.SQL(", ").join(sql.Identifier(c) for c in values)
    exprs = sql.SQL(", ").join(sql.SQL(v) for v in values.values())
    conn.execute(sql.SQL("INSERT INTO pgdrain.jobs ({}) VALUES ({})").format(names, exprs))


@pytest.mark.parametrize(
    ("columns", "constraint"),
    [pytest.param(columns, constraint, id=what) for what, columns, constraint in IMPOSSIBLE_ROWS],
)
def test_check_constraints_refuse_impossible_rows(
    tx: Conn, columns: dict[str, str], constraint: str
) -> None:
    with pytest.raises(errors.CheckViolation) as refused, tx.transaction():
        _insert(tx, columns)
    assert refused.value.diag.constraint_name == constraint
    row = tx.execute("SELECT count(*) FROM pgdrain.jobs").fetchone()
    assert row == (0,)


@pytest.mark.parametrize(
    "columns",
    [
        pytest.param({}, id="queued without a lease"),
        pytest.param({"status": "'running'", **LEASE}, id="running with the whole lease"),
        pytest.param({"status": "'done'", "attempts": "1"}, id="done"),
        pytest.param({"status": "'failed'", "max_attempts": "1"}, id="failed"),
        pytest.param({"recovery_policy": "'manual'"}, id="manual recovery"),
    ],
)
def test_control_possible_rows_are_accepted(tx: Conn, columns: dict[str, str]) -> None:
    _insert(tx, columns)
    row = tx.execute("SELECT count(*) FROM pgdrain.jobs").fetchone()
    assert row == (1,)


# Migration 0021's checks, on the table a row lands in: active_jobs (queued) or, through the
# view, finished_jobs (done), each with a constraint of its own name.
FLOW_ROWS = [
    ("empty sequence", "queued", {"sequence": "''"}, "jobs_sequence_chk"),
    ("empty sequence, done", "done", {"sequence": "''"}, "finished_jobs_sequence_chk"),
    ("no dependencies", "queued", {"depends_on": "'{}'"}, "jobs_depends_on_chk"),
    ("no dependencies, done", "done", {"depends_on": "'{}'"}, "finished_jobs_depends_on_chk"),
    ("both", "queued", {"sequence": "'s'", "depends_on": "'{1}'"}, "jobs_flow_chk"),
    ("both, done", "done", {"sequence": "'s'", "depends_on": "'{1}'"}, "finished_jobs_flow_chk"),
]


@pytest.mark.parametrize(
    ("status", "columns", "constraint"),
    [pytest.param(st, c, k, id=what) for what, st, c, k in FLOW_ROWS],
)
def test_both_tables_refuse_an_impossible_sequence_or_dependency_list(
    tx: Conn, status: str, columns: dict[str, str], constraint: str
) -> None:
    with pytest.raises(errors.CheckViolation) as refused, tx.transaction():
        _insert(tx, {"status": f"'{status}'", "attempts": "1", **columns})
    assert refused.value.diag.constraint_name == constraint


def test_an_update_cannot_take_the_lease_away_from_a_running_job(tx: Conn) -> None:
    _insert(tx, {"status": "'running'", **LEASE})
    with pytest.raises(errors.CheckViolation), tx.transaction():
        tx.execute("UPDATE pgdrain.jobs SET attempt_token = NULL")
    with pytest.raises(errors.CheckViolation), tx.transaction():
        tx.execute("UPDATE pgdrain.jobs SET status = 'queued'")


def test_the_jobs_table_has_the_designed_columns(shared: Conn) -> None:
    rows = shared.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = 'pgdrain' AND table_name = 'jobs'"
    ).fetchall()
    assert dict(rows) == {
        "id": "bigint",
        "queue": "text",
        "kind": "text",
        "payload": "jsonb",
        "status": "text",
        "priority": "integer",
        "run_at": "timestamp with time zone",
        "attempts": "integer",
        "max_attempts": "integer",
        "recovery_policy": "text",
        "reclaim_count": "integer",
        "lease_expires_at": "timestamp with time zone",
        "leased_by": "text",
        "attempt_token": "uuid",
        "heartbeat_at": "timestamp with time zone",
        "idempotency_key": "text",
        "last_error": "text",
        "created_at": "timestamp with time zone",
        "updated_at": "timestamp with time zone",
        "finished_at": "timestamp with time zone",
        # Migration 0003 keeps the accepted attempt's token on a done job.
        "completed_token": "uuid",
        # 0007 and 0008 (either creates it): every failed attempt's error, as River's `errors`.
        "errors": "jsonb",
        # 0009: the client-chosen id of the claim that took a running job (lost replies).
        "claim_id": "uuid",
        # 0021: sequences, dependencies and what a job recorded.
        "sequence": "text",
        "depends_on": "ARRAY",
        "has_dependents": "boolean",
        "output": "jsonb",
        "progress": "jsonb",
    }


@pytest.mark.parametrize(
    ("index", "columns", "predicate"),
    [
        ("jobs_ready_idx", "(queue, priority, run_at, id)", "WHERE (status = 'queued'::text)"),
        ("jobs_lease_idx", "(lease_expires_at)", "WHERE (status = 'running'::text)"),
    ],
)
def test_the_partial_indexes_exist(shared: Conn, index: str, columns: str, predicate: str) -> None:
    row = shared.execute(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'pgdrain' AND indexname = %s",
        (index,),
    ).fetchone()
    assert row is not None, f"{index} is missing"
    assert f"ON pgdrain.active_jobs USING btree {columns} {predicate}" in row[0]


# Every job writes entries into the indexes of pgdrain.active_jobs and finished_jobs as it moves
# (enqueued, claimed, finished), and each one its claim or completion writes into costs about 5%
# of the SQL ceiling (migration 0011, which dropped one). So each is here on purpose: who reads
# it.
JOBS_INDEXES = {
    "jobs_pkey": "every fenced write, by id",
    "jobs_ready_idx": "the claim, in priority order",
    "jobs_queued_run_at_idx": "the ready checks, the claim's empty-queue guard, stats",
    "jobs_lease_idx": "reclaim, the exit check, stats, recovery of a lost claim",
    "jobs_active_key_idx": "idempotency keys of queued, running, parked and waiting jobs",
    # Empty once migration 0018's history has moved (finished rows leave at once): they cost
    # a write nothing, and find what is left to move.
    "jobs_finished_idx": "moving the history 0018 left behind, by finished_at",
    "jobs_finished_queue_idx": "parked jobs in stats and lists of one status",
    # Partial: a job without a sequence, or not waiting, has no entry (a plain drain writes
    # none into them).
    "jobs_sequence_idx": "a sequence's holder and next waiting job (migration 0021)",
    "jobs_waiting_depends_on_idx": "the waiting dependents of a job that finished",
    "jobs_waiting_queue_idx": "stats' and the queues page's waiting counts (migration 0022)",
}
# Of the history (finished_jobs, each partition the same): what its readers need, no more.
FINISHED_INDEXES = {
    "finished_jobs_id_idx": "jobs show, lost-reply recovery, retry, a page of jobs by id",
    "finished_jobs_queue_idx": "stats' bounded counts; lists of one finished status, by id",
    "finished_jobs_failed_finished_idx": "retention of failed and cancelled jobs, by age",
    "finished_jobs_done_finished_idx": "done jobs by age (BRIN: costs a completion nothing)",
    # Partial: only the rows of jobs a cancel cut short (migration 0042).
    "finished_jobs_cancelled_lease_idx": "leases of jobs cancelled while running (limits' slots)",
}


def test_the_jobs_tables_have_only_the_indexes_their_statements_read(shared: Conn) -> None:
    rows = shared.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = 'pgdrain'"
        " AND tablename = 'active_jobs'"
    ).fetchall()
    assert {row[0] for row in rows} == set(JOBS_INDEXES)
    parents = shared.execute(
        "SELECT c.relname FROM pg_class AS c"
        " WHERE c.relkind IN ('i', 'I') AND c.relnamespace = 'pgdrain'::regnamespace"
        " AND c.relname LIKE 'finished\\_jobs\\_%'"
        " AND NOT EXISTS (SELECT 1 FROM pg_inherits AS i WHERE i.inhrelid = c.oid)"
    ).fetchall()
    assert {row[0] for row in parents} == set(FINISHED_INDEXES)


def _plan_indexes(plan: Any) -> set[str]:
    """Every index named anywhere in an EXPLAIN (FORMAT JSON) plan."""
    found: set[str] = set()
    if isinstance(plan, dict):
        if "Index Name" in plan:
            found.add(plan["Index Name"])
        for value in plan.values():
            found |= _plan_indexes(value)
    elif isinstance(plan, list):
        for value in plan:
            found |= _plan_indexes(value)
    return found


def _seed_history(conn: Conn) -> None:
    """A few thousand rows, as a queue looks after a while: mostly finished history, a little
    ready work, a few running jobs (two with expired leases)."""
    conn.execute(
        "INSERT INTO pgdrain.jobs (kind, status, attempts, finished_at)"
        " SELECT 'send_email', 'done', 1, now() - g * interval '1 second'"
        " FROM generate_series(1, 4800) AS g"
    )
    conn.execute(
        "INSERT INTO pgdrain.jobs (kind, priority) SELECT 'send_email', g % 3"
        " FROM generate_series(1, 150) AS g"
    )
    conn.execute(
        "INSERT INTO pgdrain.jobs (kind, status, attempts, lease_expires_at, leased_by,"
        "                          attempt_token, heartbeat_at)"
        " SELECT 'send_email', 'running', 1, now() + (g - 3) * interval '1 minute', 'w',"
        "        gen_random_uuid(), now()"
        " FROM generate_series(1, 50) AS g"
    )
    conn.execute("ANALYZE pgdrain.jobs")


def _explain(conn: Conn, name: str, params: dict[str, Any]) -> Any:
    row = conn.execute("EXPLAIN (FORMAT JSON) " + query(name), params).fetchone()
    assert row is not None
    return row[0]


def test_the_claim_uses_the_ready_index(conn: Conn) -> None:
    _seed_history(conn)
    plan = _explain(
        conn,
        "job_complete_and_claim",
        {
            "done_ids": [],
            "done_tokens": [],
            "queues": ["default"],
            "limit": 10,
            "worker": "w",
            "lease_seconds": 30.0,
            "cap_seconds": None,
            "claim_id": None,
            "keep_done": True,
            "position_queue": [],
            "position_priority": [],
            "position_run_at_us": [],
            "position_id": [],
        },
    )
    assert "jobs_ready_idx" in _plan_indexes(plan), plan


def test_the_reclaim_uses_the_lease_index(conn: Conn) -> None:
    _seed_history(conn)
    plan = _explain(conn, "job_reclaim_expired", {"limit": 100})
    assert "jobs_lease_idx" in _plan_indexes(plan), plan
