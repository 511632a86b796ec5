"""The big table (docs/benchmarks.md, "Big table"): the statements that end a run, the claim,
queue_depth, queue_stats and reclaim, timed on a table of 2,000,000 finished rows and 200,000
queued ones.

`python -m bench.run --only bigtable` runs this section alone and rewrites docs/benchmarks.md
with the other sections' figures read back from docs/benchmarks.json; `make bench` runs it
with the rest.

The table: finished rows first (the oldest lead the heap, as in a table that has lived), 5%
of them failed, over four queues; then the backlog over the same queues, half ready and half
due tomorrow, three priorities; a fifth queue whose 20,000 jobs are all delayed (a run's last
claim and ready check find nothing there); 100 running jobs, 10 of them with an expired
lease. VACUUM ANALYZE, as autovacuum would have left it.

Each statement runs `warmup` times, then `runs` times, timed from the client (execute and
fetch, one round trip on a local socket): the median and the 90th percentile are reported.
A statement that writes (the claim, reclaim) runs in a transaction rolled back each time, so
every run sees the same table. Each is planned as a run plans it: what a run sends, under the
settings its connection keeps (hot_path.sql, session_limits: generic plans, no JIT, no explicit
sort where an index gives the order; psycopg prepares a statement at its sixth execution);
`pgdrain stats`, which runs on a connection of its own, with a plan of its own each time
(never prepared). Beside each figure: the indexes its plan uses and whether it
holds a sequential scan of pgdrain.jobs. The statements as they were before migration 0005
(commit 82125ec) are timed the same way on the same table without that migration's indexes
(their text is kept below): the schema and statements as they were."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from bench.common import Server, log
from pgdrain.db import store
from pgdrain.db.sql import PLACEHOLDER, query

FINISHED = 2_000_000
QUEUED = 200_000
DELAYED_ONLY_JOBS = 20_000
QUEUES = ["default", "email", "reports", "webhooks"]
DELAYED_ONLY = "reminders"
NEW_INDEXES = ["jobs_queued_run_at_idx", "jobs_finished_queue_idx"]  # migration 0005's
EXIT = {
    "run_id": "bench",
    "clear_kicks": False,
    "linger_window_s": 1.0,
    "may_stay": False,
    # As a run exits: with its history line (written once; the repeats find it there).
    **store.RunRecord("schedule", 0, 1.0, "empty", {}).params(),
}
# What store.session_limits sets, reset after each statement timed under it.
SESSION_SETTINGS = [
    "statement_timeout",
    "lock_timeout",
    "jit",
    "enable_sort",
    "plan_cache_mode",
    "default_transaction_isolation",
]

SEED: list[LiteralString] = [
    """INSERT INTO pgdrain.jobs (queue, kind, status, attempts, run_at, finished_at)
       SELECT (%(queues)s::text[])[1 + mod(g, 4)], 'noop',
              CASE WHEN mod(g, 20) = 0 THEN 'failed' ELSE 'done' END, 1,
              now() - interval '3 days' + g * interval '100 ms',
              now() - interval '3 days' + g * interval '100 ms'
       FROM generate_series(1, %(finished)s) AS g""",
    """INSERT INTO pgdrain.jobs (queue, kind, priority, run_at)
       SELECT (%(queues)s::text[])[1 + mod(g, 4)], 'noop', mod(g / 4, 3),
              CASE WHEN mod(g / 12, 2) = 0 THEN now() - g * interval '1 ms'
                   ELSE now() + interval '1 day' + g * interval '1 s' END
       FROM generate_series(1, %(queued)s) AS g""",
    """INSERT INTO pgdrain.jobs (queue, kind, priority, run_at)
       SELECT %(delayed_queue)s, 'noop', mod(g, 3), now() + interval '1 day' + g * interval '1 s'
       FROM generate_series(1, %(delayed)s) AS g""",
    """INSERT INTO pgdrain.jobs (queue, kind, status, attempts, lease_expires_at, leased_by,
                               attempt_token, heartbeat_at)
       SELECT 'default', 'noop', 'running', 1, now() + (g - 11) * interval '1 minute', 'w',
              gen_random_uuid(), now()
       FROM generate_series(1, 100) AS g""",
]

# The statements as they were before migration 0005 (commit 82125ec), for the comparison.
BEFORE_HAS_READY: LiteralString = """SELECT EXISTS (
    SELECT 1 FROM pgdrain.jobs
    WHERE status = 'queued' AND queue = ANY(%(queues)s::text[]) AND run_at <= now()
) AS ready"""

BEFORE_STATS: LiteralString = """SELECT queue,
       count(*) FILTER (WHERE status = 'queued')                      AS queued,
       count(*) FILTER (WHERE status = 'queued' AND run_at <= now())  AS ready,
       count(*) FILTER (WHERE status = 'running')                     AS running,
       count(*) FILTER (WHERE status = 'done')                        AS done,
       count(*) FILTER (WHERE status = 'failed')                      AS failed,
       coalesce(extract(epoch FROM now() - min(run_at)
                FILTER (WHERE status = 'queued' AND run_at <= now())), 0)::float8
                                                                      AS oldest_ready_age_s,
       count(*) FILTER (WHERE status = 'running' AND lease_expires_at < now())
                                                                      AS expired_leases
FROM pgdrain.jobs
GROUP BY queue
ORDER BY queue"""


def _before_claim() -> LiteralString:
    """The claim without the empty-queue guard added with migration 0005."""
    statement = query("job_complete_and_claim")
    guard = re.search(
        r"^ *CROSS JOIN LATERAL \(\n *SELECT 1 FROM pgdrain\.\w+\n.*?^ *\) AS has_ready\n",
        statement,
        re.MULTILINE | re.DOTALL,
    )
    if guard is None:
        raise ValueError("job_complete_and_claim has no empty-queue guard (has_ready) to remove")
    return statement[: guard.start()] + statement[guard.end() :]


def _claim(queues: list[str]) -> dict[str, Any]:
    return {
        "done_ids": [],
        "done_tokens": [],
        "queues": queues,
        "limit": 10,
        "worker": "bench",
        "lease_seconds": 30.0,
        "cap_seconds": None,
        "claim_id": None,
        "keep_done": True,
        "position_queue": [],
        "position_priority": [],
        "position_run_at_us": [],
        "position_id": [],
    }


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    statement: LiteralString
    params: dict[str, Any]
    writes: bool = False
    on_drain: bool = True  # sent by a run, under its connection's settings (else the CLI's)
    prepared: bool = False  # repeated within a run: psycopg prepares it from its sixth execution
    version: str = "now"  # "now" (HEAD's statements) or "before" (the text at 82125ec)


def cases() -> list[Case]:
    now = [
        Case(
            "has_ready", "queue_has_ready, 4 queues", query("queue_has_ready"), {"queues": QUEUES}
        ),
        Case(
            "has_ready_empty",
            "queue_has_ready, nothing ready",
            query("queue_has_ready"),
            {"queues": [DELAYED_ONLY]},
        ),
        Case(
            "claim",
            "job_complete_and_claim, batch 10, 4 queues",
            query("job_complete_and_claim"),
            _claim(QUEUES),
            writes=True,
            prepared=True,
        ),
        Case(
            "claim_empty",
            "job_complete_and_claim, nothing ready (a run's last claim)",
            query("job_complete_and_claim"),
            _claim([DELAYED_ONLY]),
            writes=True,
            prepared=True,
        ),
        Case("depth", "queue_depth, 4 queues", query("queue_depth"), {"queues": QUEUES}),
        Case("stats", "queue_stats (`pgdrain stats`)", query("queue_stats"), {}, on_drain=False),
        Case(
            "reclaim",
            "job_reclaim_expired, limit 100",
            query("job_reclaim_expired"),
            {"limit": 100},
            writes=True,
        ),
        Case(
            "exit",
            "run_exit, 4 queues (a run's exit check)",
            query("run_exit"),
            {"queues": QUEUES, **EXIT},
            writes=True,
        ),
        Case(
            "exit_empty",
            "run_exit, nothing ready",
            query("run_exit"),
            {"queues": [DELAYED_ONLY], **EXIT},
            writes=True,
        ),
    ]
    # As they ran then: no settings kept by the connection, the claim prepared.
    then: dict[str, Any] = {"on_drain": False, "version": "before"}
    before = [
        Case("has_ready", "", BEFORE_HAS_READY, {"queues": QUEUES}, **then),
        Case("has_ready_empty", "", BEFORE_HAS_READY, {"queues": [DELAYED_ONLY]}, **then),
        Case("claim", "", _before_claim(), _claim(QUEUES), writes=True, prepared=True, **then),
        Case(
            "claim_empty",
            "",
            _before_claim(),
            _claim([DELAYED_ONLY]),
            writes=True,
            prepared=True,
            **then,
        ),
        Case("stats", "", BEFORE_STATS, {}, **then),
    ]
    return now + before


def template(server: Server, timings: dict[str, float] | None = None) -> str:
    """A migrated database holding the big table: built at migration 0017 (pgdrain.jobs one
    table, as a queue that has lived holds it), then migrated as `pgdrain migrate` does it.
    `timings` (if given) gets how long migration 0018 held its locks (its one transaction),
    and how long moving the history took after it (row locks only), in seconds."""
    from pgdrain.db.migrate import after_migrations
    from pgdrain.db.sql import migrations

    name = server.create()
    with psycopg.connect(server.url(name), autocommit=True) as conn:
        later = []
        for migration in migrations():
            if migration.version >= "0018":
                later.append(migration)
                continue
            with conn.transaction():
                conn.execute(migration.sql)
                conn.execute(
                    "INSERT INTO pgdrain.migrations (version) VALUES (%s)", (migration.version,)
                )
        params = {
            "queues": QUEUES,
            "finished": FINISHED,
            "queued": QUEUED,
            "delayed_queue": DELAYED_ONLY,
            "delayed": DELAYED_ONLY_JOBS,
        }
        for statement in SEED:
            conn.execute(statement, params)
        conn.execute("VACUUM ANALYZE pgdrain.jobs")
        start = time.perf_counter()
        with conn.transaction():
            for migration in later:
                conn.execute(migration.sql)
                conn.execute(
                    "INSERT INTO pgdrain.migrations (version) VALUES (%s)", (migration.version,)
                )
        locked = time.perf_counter() - start
        start = time.perf_counter()
        moved = after_migrations(conn, None)
        moving = time.perf_counter() - start
        log(
            f"migration 0018 on the big table: its transaction (the locks) {locked * 1000:.0f} ms;"
            f" then {moved:,} finished rows moved in {moving:.1f} s, in batches"
        )
        if timings is not None:
            timings.update({"locked_s": locked, "moved": moved, "moving_s": moving})
        conn.execute("VACUUM ANALYZE pgdrain.active_jobs, pgdrain.finished_jobs")
    return name


def _nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from _nodes(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _nodes(value)


def _explained(conn: psycopg.Connection[Any], case: Case) -> Any:
    """The plan the statement runs on: for a run's statement, the generic plan (PREPARE, then
    EXPLAIN EXECUTE under the drain's settings); else the one planned for these parameters."""
    if not case.on_drain:
        with conn.transaction(force_rollback=True):
            row = conn.execute("EXPLAIN (FORMAT JSON) " + case.statement, case.params).fetchone()
        assert row is not None
        return row[0]
    names = list(dict.fromkeys(PLACEHOLDER.findall(case.statement)))
    numbered = PLACEHOLDER.sub(lambda m: f"${names.index(m.group(1)) + 1}", case.statement)
    args = sql.SQL(", ").join(sql.Literal(case.params[n]) for n in names)
    # All in one rolled-back transaction: after a ROLLBACK psycopg deallocates every prepared
    # statement of the connection (DEALLOCATE ALL), this one too.
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("PREPARE bench_plan AS {}").format(sql.SQL(numbered)))
        store.session_limits(conn, 60_000)  # undone by the rollback
        explain = sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE bench_plan ({})").format(args)
        row = conn.execute(explain).fetchone()
        conn.execute("DEALLOCATE bench_plan")
    assert row is not None
    return row[0]


def plan_summary(conn: psycopg.Connection[Any], case: Case) -> tuple[list[str], bool]:
    """(indexes the plan uses, whether it scans pgdrain.jobs sequentially)."""
    plan = _explained(conn, case)
    nodes = list(_nodes(plan))
    indexes = sorted({n["Index Name"] for n in nodes if "Index Name" in n})
    seq = any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs" for n in nodes)
    return indexes, seq


def time_case(conn: psycopg.Connection[Any], case: Case, runs: int, warmup: int) -> list[float]:
    """Milliseconds per execution (execute + fetch), `runs` of them after `warmup`."""
    out: list[float] = []
    if case.on_drain:  # as the drain's connection runs it
        store.session_limits(conn, 60_000)
    for i in range(warmup + runs):
        if case.writes:
            conn.execute("BEGIN")
        began = time.perf_counter()
        # None: psycopg's own threshold, as a run repeats it; False: once per run, never prepared
        prepare = None if case.prepared else False
        conn.execute(case.statement, case.params, prepare=prepare).fetchall()
        elapsed = time.perf_counter() - began
        if case.writes:
            conn.execute("ROLLBACK")
        if i >= warmup:
            out.append(elapsed * 1000.0)
    if case.on_drain:
        for setting in SESSION_SETTINGS:
            conn.execute(sql.SQL("RESET {}").format(sql.Identifier(setting)))
    return out


def measure(server: Server, runs: int = 25, warmup: int = 6) -> dict[str, Any]:
    """The section's figures: {"rows": {...}, "cases": [{key, version, label, ms, ...}]}."""
    log(f"big table: {FINISHED:,} finished + {QUEUED:,} queued (+{DELAYED_ONLY_JOBS:,} delayed)")
    began = time.monotonic()
    name = template(server)
    build_s = time.monotonic() - began
    log(f"  built in {build_s:.0f} s; timing each statement {runs} times")
    results: list[dict[str, Any]] = []
    dropped = False
    try:
        with psycopg.connect(server.url(name), autocommit=True) as conn:
            # A sequential scan of a big table starts where the last one reported it was
            # (synchronize_seqscans), so right after a scan that stopped among the queued rows
            # at the heap's end the old ready check looks fast. Each scan here starts at the
            # first page, as one does on a table nobody else has just scanned.
            conn.execute("SET synchronize_seqscans = off")
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE status IN ('done', 'failed')),"
                " count(*) FILTER (WHERE status = 'queued'),"
                " count(*) FILTER (WHERE status = 'queued' AND run_at <= now()),"
                " count(*) FILTER (WHERE status = 'running'),"
                # The tables behind the jobs view (active_jobs, finished_jobs' partitions),
                # or the one table before migration 0018.
                " (SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class AS c"
                "  WHERE c.relnamespace = 'pgdrain'::regnamespace AND c.relkind = 'r'"
                "    AND c.relname ~ '^(jobs|active_jobs|finished_jobs_.*)$')"
                " FROM pgdrain.jobs"
            ).fetchone()
            assert row is not None
            rows = {
                "finished": row[0],
                "queued": row[1],
                "ready": row[2],
                "running": row[3],
                "table_mb": float(row[4]) / 1e6,
            }
            for case in cases():
                if case.version == "before" and not dropped:
                    # The statements before it ran on a schema without migration 0005.
                    for index in NEW_INDEXES:
                        conn.execute(sql.SQL("DROP INDEX pgdrain.{}").format(sql.Identifier(index)))
                    dropped = True
                indexes, seq = plan_summary(conn, case)
                ms = time_case(conn, case, runs, warmup)
                median = statistics.median(ms)
                p90 = statistics.quantiles(ms, n=10)[-1]
                results.append(
                    {
                        "key": case.key,
                        "version": case.version,
                        "label": case.label,
                        "median_ms": median,
                        "p90_ms": p90,
                        "values_ms": ms,
                        "indexes": indexes,
                        "seq_scan": seq,
                    }
                )
                scan = "SEQ SCAN" if seq else "no seq scan"
                log(
                    f"  {case.version:>6} {case.key:<16} {median:8.3f} ms (p90 {p90:.3f}); "
                    f"{scan}; {', '.join(indexes)}"
                )
    finally:
        server.drop(name)
    return {"rows": rows, "runs": runs, "warmup": warmup, "build_s": build_s, "cases": results}
