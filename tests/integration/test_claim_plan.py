"""The claim reads only what it claims even when the table's statistics do not know the backlog.

A burst of jobs into a table that was analysed when no job was queued (autovacuum off here, so
that nothing analyses it meanwhile) makes the planner believe few jobs are ready. Left free, it
then claims through jobs_queued_run_at_idx and sorts every ready job of the queue at every
claim. The drain's connection does not let it pick an explicit sort where an index gives the
order (hot_path.sql, session_limits: enable_sort off), so the claim walks jobs_ready_idx and
stops at its limit. The control is the same statement, data and settings
with sorts allowed again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.plans import plan_nodes
from pgdrain.db import store
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]

READY = 50_000  # at 20,000 the planner still finds jobs_ready_idx
LIMIT = 10


@pytest.fixture
def burst(db_url: str) -> Iterator[Conn]:
    """A table analysed with a short history of finished jobs (now in finished_jobs: the table
    the claim reads was analysed empty), then READY ready jobs."""
    with psycopg.connect(db_url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("ALTER TABLE pgdrain.active_jobs SET (autovacuum_enabled = false)")
        conn.execute(
            "INSERT INTO pgdrain.jobs (kind, status, attempts, finished_at)"
            " SELECT 'noop', 'done', 1, now() FROM generate_series(1, 1000)"
        )
        conn.execute("ANALYZE pgdrain.active_jobs, pgdrain.finished_jobs")
        conn.execute(
            "INSERT INTO pgdrain.active_jobs (kind) SELECT 'noop' FROM generate_series(1, %s)",
            (READY,),
        )
        yield conn


def _claim_scan(conn: Conn, *, sorts_allowed: bool) -> tuple[set[str], int]:
    """Under the drain connection's settings: the indexes the claim's plan uses and the rows
    its scans of pgdrain.active_jobs returned (EXPLAIN ANALYZE, rolled back)."""
    params = {
        "done_ids": [],
        "done_tokens": [],
        "queues": ["default"],
        "limit": LIMIT,
        "worker": "w",
        "lease_seconds": 30.0,
        "cap_seconds": None,
        "claim_id": None,
        "keep_done": True,
        "position_queue": [],
        "position_priority": [],
        "position_run_at_us": [],
        "position_id": [],
    }
    with conn.transaction(force_rollback=True):
        store.session_limits(conn, 60_000)
        if sorts_allowed:
            conn.execute("SET LOCAL enable_sort = on")
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + query("job_complete_and_claim"), params
        ).fetchone()
    assert row is not None
    scans = [
        n
        for n in plan_nodes(row[0])
        if n.get("Relation Name") == "active_jobs" and "Index" in n["Node Type"]
    ]
    return {n["Index Name"] for n in scans}, sum(n["Actual Rows"] for n in scans)


def test_a_claim_after_a_burst_reads_only_what_it_claims(burst: Conn) -> None:
    indexes, rows = _claim_scan(burst, sorts_allowed=False)
    assert "jobs_ready_idx" in indexes
    # The probe's one row, the claimed rows, their primary-key lookups.
    assert rows <= 1 + 2 * LIMIT


def test_control_with_sorts_allowed_the_claim_reads_every_ready_job(burst: Conn) -> None:
    indexes, rows = _claim_scan(burst, sorts_allowed=True)
    assert "jobs_ready_idx" not in indexes
    assert rows >= READY
