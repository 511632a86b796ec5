"""Flat at scale (issue 43, item 5): throughput over a long run and claim latency against a long
history, on a server of the benchmark's own with autovacuum on, configured as production.

`python -m bench.scale [--jobs 1000000] [--window 50000] [--history 10000000] [--write]`, or
`make bench-scale` (with --write; SCALE_ARGS passes options). Prints a table; --json FILE
writes the result there; --write stores it in docs/benchmarks.json as info.scale.<--label>
("now" by default; "before" holds the baseline measured before the table split) and writes
docs/benchmarks.md again. About 15 minutes at the defaults on a shared 2-core machine; 7 with
--history 2000000.

The server: the machine's PostgreSQL binaries (/usr/lib/postgresql/<newest>/bin, or --pg-bin),
initdb into a temporary folder (as the `postgres` user when run as root: PostgreSQL refuses
root), on a port of its own, removed afterwards. Its settings (PRODUCTION below) are what an
operator would give a queue's database on a 24 GiB machine, not the defaults:

- autovacuum on, and made to keep up with a queue: autovacuum_naptime 10 s (a queue turns over
  its rows in seconds, the default minute lets dead rows pile up); vacuum and analyze at 1% /
  2% of the table changed rather than 20% / 10% (with a long history in the table, 20% is
  millions of dead rows in front of the claim), the insert-triggered vacuum likewise; the
  cost limit raised to 2,000 (the default 200 throttles a worker to a few MB/s of reading);
  512 MiB of maintenance memory so a vacuum sorts its dead tuples in one pass.
- shared_buffers 4 GiB: a sixth of the RAM rather than the usual quarter, since the machine is
  shared with other servers; effective_cache_size 12 GiB.
- durability as production: fsync on, synchronous_commit on, full_page_writes on. WAL sized
  so checkpoints come from checkpoint_timeout (15 min), not from filling max_wal_size every few
  seconds: max_wal_size 16 GiB, checkpoint_completion_target 0.9.

Throughput at scale: one fresh database; per window, enqueue `--window` no-op jobs (timed on
its own), then drain them at the defaults (batch 10, concurrency 10, one process: pgdrain's
drain() in this process) until the queue is empty; the drain's jobs/s is the window's figure.
Enqueue-then-drain (not both at once): on a 2-core machine an enqueuer running beside the
drain would take its CPU, and the figure would measure the split. Autovacuum runs whenever it
decides to, during a drain or between. Finished jobs stay where the schema keeps them (today:
pgdrain.jobs, until retention after 7 days), so the last window claims beside `--jobs` of
history. Reported: jobs/s per window, last/first and min/first (the goal: both >= 0.9).

Claim latency against history: another fresh database. With no finished job in it, then after
`--history` finished rows are added in one INSERT ... SELECT generate_series (into
pgdrain.finished_jobs if the schema has one, else pgdrain.jobs: read from the catalog, so this
runs on the schema before and after the table split) and VACUUM ANALYZE (the state autovacuum
leaves such a table in): `--claim-jobs` jobs are enqueued and claimed by job_complete_and_claim
at batch 10, one statement after another on one connection as a run sends it (the previous
batch completed in the same statement), each timed from the client: p50 and p99. That
connection alone commits with synchronous_commit off: the wait for the WAL flush is the disk's,
the same with history or without, and on this machine's shared disk it is most of a claim's
time, so it would hide what history costs the statement. Then as many again are drained at the
defaults (synchronous_commit on): jobs/s. The ratio with history / without is the figure
(the goal: 1.0)."""

from __future__ import annotations

import argparse
import json
import math
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.common import REPO, Server, cpu_ticks, load_average, log, stolen_share
from pgdrain import Budget, Settings
from pgdrain.api.enqueue import build_job, enqueue_many
from pgdrain.api.registry import load_registry
from pgdrain.db import store
from pgdrain.db.migrate import migrate
from pgdrain.runner.drain import drain

PRODUCTION: dict[str, str] = {
    "autovacuum": "on",
    "autovacuum_naptime": "10s",
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_vacuum_insert_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_analyze_threshold": "1000",
    "autovacuum_vacuum_cost_limit": "2000",
    "autovacuum_vacuum_cost_delay": "2ms",
    "autovacuum_max_workers": "3",
    "maintenance_work_mem": "512MB",
    "shared_buffers": "4GB",
    "effective_cache_size": "12GB",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "wal_level": "replica",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "15min",
    "checkpoint_completion_target": "0.9",
    "max_connections": "100",
    # What managed services load by default: the benchmark reads each statement's blocks.
    "shared_preload_libraries": "pg_stat_statements",
}
BATCH = 10
CONCURRENCY = 10
HISTORY_QUEUES = ["default", "email", "reports", "webhooks"]
GOAL = 0.9  # each window within 10% of the first


# -- pure arithmetic (tests/unit/test_bench_scale.py) --------------------------------------


def window_sizes(total: int, window: int) -> list[int]:
    """`total` jobs in windows of `window`, the last one what is left."""
    if total <= 0 or window <= 0:
        raise ValueError("jobs and window must be positive")
    full, rest = divmod(total, window)
    return [window] * full + ([rest] if rest else [])


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def window_summary(rates: Sequence[float]) -> dict[str, float | bool]:
    """The windows' jobs/s against the first: last/first, min/first, whether every window
    stayed within 10% of the first (min/first >= 0.9); and, less at the mercy of one noisy
    window on a shared machine, the median of the last three windows over that of the first
    three (fewer when there are fewer than six)."""
    if not rates:
        raise ValueError("no windows")
    first = rates[0]
    low = ratio(min(rates), first)
    k = max(1, min(3, len(rates) // 2))
    return {
        "tail_over_head": ratio(statistics.median(rates[-k:]), statistics.median(rates[:k])),
        "first": first,
        "last": rates[-1],
        "min": min(rates),
        "max": max(rates),
        "last_over_first": ratio(rates[-1], first),
        "min_over_first": low,
        "flat": low >= GOAL,
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100), nearest rank: a value that was measured."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def history_table(tables: set[str]) -> str:
    """Where finished jobs live: pgdrain.finished_jobs once the schema splits the table, else
    pgdrain.jobs. `tables` holds the pgdrain schema's tables (plain or partitioned)."""
    if "finished_jobs" in tables:
        return "finished_jobs"
    if "jobs" in tables:
        return "jobs"
    raise RuntimeError("the pgdrain schema holds neither finished_jobs nor jobs")


def active_table(tables: set[str]) -> str:
    """Where queued and running jobs live: pgdrain.active_jobs once the table is split (then
    pgdrain.jobs is a view, which ANALYZE skips), else pgdrain.jobs."""
    return "active_jobs" if "active_jobs" in tables else "jobs"


@dataclass(frozen=True)
class Column:
    name: str
    not_null: bool
    has_default: bool  # a default or an identity: the insert may leave it out


# The value of each column the generator sets, when the table has it. `g` runs 1..n: the
# oldest first, finished over the last day (inside the default 7 days of retention, and in
# the partitions of the last day where the history is partitioned by day).
HISTORY_VALUES: dict[str, str] = {
    "queue": "(%(queues)s::text[])[1 + mod(g, 4)]",
    "kind": "'noop'",
    "status": "CASE WHEN mod(g, 20) = 0 THEN 'failed' ELSE 'done' END",
    "attempts": "1",
    "finished_at": "now() - interval '1 hour' - (%(n)s - g) * (interval '23 hours' / %(n)s)",
    "run_at": "now() - interval '1 hour' - (%(n)s - g) * (interval '23 hours' / %(n)s)",
    "created_at": "now() - interval '1 hour' - (%(n)s - g) * (interval '23 hours' / %(n)s)",
    "updated_at": "now() - interval '1 hour' - (%(n)s - g) * (interval '23 hours' / %(n)s)",
}


# A required column's value where the table gives it no default (finished_jobs takes every
# value from the row it moves).
REQUIRED_VALUES: dict[str, str] = {
    "payload": "'{}'::jsonb",
    "priority": "0",
    "max_attempts": "5",
    "recovery_policy": "'auto'",
    "reclaim_count": "0",
    "errors": "'[]'::jsonb",
    "has_dependents": "false",
}


def history_insert(table: str, columns: Sequence[Column], id_sequence: str | None) -> str:
    """The INSERT ... SELECT generate_series that adds %(n)s finished jobs to pgdrain.`table`.
    An id without a default (a history table whose rows keep the id they were claimed with)
    is drawn from the jobs' own sequence, `id_sequence`, so later jobs never collide with it.
    Refuses a NOT NULL column it has no value for."""
    names: list[str] = []
    values: list[str] = []
    for column in columns:
        if column.name in HISTORY_VALUES:
            names.append(column.name)
            values.append(HISTORY_VALUES[column.name])
        elif column.name == "id" and not column.has_default:
            if id_sequence is None:
                raise RuntimeError(f"pgdrain.{table}.id has no default and no sequence found")
            names.append("id")
            values.append(f"nextval('{id_sequence}'::regclass)")
        elif column.not_null and not column.has_default and column.name in REQUIRED_VALUES:
            names.append(column.name)
            values.append(REQUIRED_VALUES[column.name])
        elif column.not_null and not column.has_default:
            raise RuntimeError(f"no value for pgdrain.{table}.{column.name} (NOT NULL)")
    return (
        f'INSERT INTO pgdrain."{table}" ({", ".join(names)})\n'
        f"SELECT {', '.join(values)}\n"
        "FROM generate_series(1, %(n)s) AS g"
    )


# -- the server ----------------------------------------------------------------------------


def postgres_bin(given: str | None) -> Path:
    """--pg-bin, else the newest /usr/lib/postgresql/<version>/bin with initdb."""
    if given:
        return Path(given)
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if not found:
        raise SystemExit("no /usr/lib/postgresql/*/bin/initdb: pass --pg-bin")
    return found[-1].parent


# Trust on 127.0.0.1 only: the server lives as long as the benchmark, in a folder of its own.
INITDB = ["--auth=trust", "-E", "UTF8", "--no-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def own_server(
    bindir: Path, settings: Mapping[str, str], keep: bool = False
) -> Iterator[tuple[str, Path]]:
    """A PostgreSQL server of our own with `settings`: yields (admin URL, data folder); stopped
    and removed afterwards (kept with `keep`). As root, it runs as `postgres`."""
    user = "postgres" if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp(prefix="pgdrain-scale-"))
    data = base / "data"
    if user is not None:
        account = pwd.getpwnam(user)
        os.chown(base, account.pw_uid, account.pw_gid)
    port = _free_port()
    options = " ".join(f"-c {k}={v}" for k, v in settings.items())
    options += f" -c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={base}"
    started = False
    pg_ctl = [str(bindir / "pg_ctl"), "-D", str(data), "-w"]
    try:
        subprocess.run(
            [*(str(bindir / "initdb"), "-D", str(data), "-U", "postgres"), *INITDB],
            user=user,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [*pg_ctl, "-l", str(base / "log"), "-o", options, "start"],
            user=user,
            check=True,
            capture_output=True,
        )
        started = True
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", data
    finally:
        if started:
            subprocess.run(
                [*pg_ctl, "-m", "fast", "stop"],
                user=user,
                check=False,
                capture_output=True,
            )
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


# -- throughput over many windows ---------------------------------------------------------

TABLE_STATS = """
SELECT coalesce(sum(s.n_dead_tup), 0)::bigint, coalesce(sum(s.autovacuum_count), 0)::bigint,
       coalesce(sum(s.autoanalyze_count), 0)::bigint,
       coalesce(sum(pg_total_relation_size(s.relid)), 0)::bigint
FROM pg_stat_user_tables s WHERE s.schemaname = 'pgdrain'
"""


# The claim statement among pg_stat_statements' entries (its text as hot_path.sql has it).
CLAIM_TEXT = "%served AS MATERIALIZED%"


class Blocks:
    """Shared buffer blocks touched (hit or read) per statement, from pg_stat_statements:
    the work a statement does, whatever else the shared machine is running."""

    def __init__(self, admin_url: str) -> None:
        self.conn = psycopg.connect(admin_url, autocommit=True)
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def reset(self) -> None:
        self.conn.execute("SELECT pg_stat_statements_reset()")

    def total(self, dbname: str, like: str = "%") -> tuple[int, int]:
        """(blocks, calls) of `dbname`'s statements whose text is like `like`."""
        row = self.conn.execute(
            "SELECT coalesce(sum(s.shared_blks_hit + s.shared_blks_read), 0)::bigint,"
            " coalesce(sum(s.calls), 0)::bigint"
            " FROM pg_stat_statements AS s JOIN pg_database AS d ON d.oid = s.dbid"
            " WHERE d.datname = %(db)s AND s.query LIKE %(like)s",
            {"db": dbname, "like": like},
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def per_call(self, dbname: str, like: str) -> float:
        used, calls = self.total(dbname, like)
        return ratio(used, calls)

    def close(self) -> None:
        self.conn.close()


def _table_stats(conn: psycopg.Connection[Any]) -> dict[str, float]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(TABLE_STATS).fetchone()
    assert row is not None
    return {
        "dead_rows": int(row[0]),
        "autovacuums": int(row[1]),
        "autoanalyzes": int(row[2]),
        "schema_mib": int(row[3]) / 2**20,
    }


def _drain(url: str, seconds: float) -> tuple[int, float, str]:
    """Drain at the defaults until nothing is ready: (done, seconds, stop reason)."""
    start = time.perf_counter()
    result = drain(
        Settings(batch_size=BATCH, concurrency=CONCURRENCY),
        Budget.seconds(seconds),
        load_registry("jobs"),
        url,
    )
    return result.done, time.perf_counter() - start, str(result.stop_reason)


def _enqueue(url: str, n: int) -> float:
    start = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        enqueue_many(conn, (build_job("noop") for _ in range(n)))
    return time.perf_counter() - start


def throughput(
    server: Server, jobs: int, window: int, window_seconds: float, blocks: Blocks
) -> dict[str, Any]:
    name = server.create()
    url = server.url(name)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
    windows: list[dict[str, Any]] = []
    drained = 0
    with psycopg.connect(url, autocommit=True) as stats:
        for number, size in enumerate(window_sizes(jobs, window), start=1):
            enqueue_s = _enqueue(url, size)
            blocks.reset()
            ticks = cpu_ticks()
            done, seconds, reason = _drain(url, window_seconds)
            stolen = stolen_share(ticks, cpu_ticks())
            used, _ = blocks.total(name)
            if done != size:
                raise RuntimeError(f"window {number}: {done:,} of {size:,} jobs drained ({reason})")
            drained += done
            figure: dict[str, Any] = {
                "window": number,
                "jobs": size,
                "drained_total": drained,
                "jobs_per_s": done / seconds,
                "drain_s": seconds,
                "enqueue_per_s": size / enqueue_s,
                "blocks_per_job": used / done,
                "claim_blocks": blocks.per_call(name, CLAIM_TEXT),
                "load": load_average(),  # the machine is shared: who else ran
                "stolen": stolen,  # and how much of its CPU the host gave others meanwhile
                **_table_stats(stats),
            }
            windows.append(figure)
            log(
                f"window {number}: {figure['jobs_per_s']:,.0f} jobs/s "
                f"(enqueue {figure['enqueue_per_s']:,.0f}/s), {figure['blocks_per_job']:.1f} "
                f"blocks/job, {drained:,} drained, "
                f"{figure['dead_rows']:,} dead rows, {figure['autovacuums']} autovacuums, "
                f"schema {figure['schema_mib']:,.0f} MiB; load {figure['load']}"
                + (f", {stolen:.0%} of the CPU stolen" if stolen is not None else "")
            )
        row = stats.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FROM pgdrain.jobs"
        ).fetchone()
    assert row is not None
    if row[0] != jobs:
        raise RuntimeError(f"{row[0]:,} jobs done at the end, {jobs:,} enqueued")
    server.drop(name)
    rates = [w["jobs_per_s"] for w in windows]
    return {"windows": windows, "summary": window_summary(rates), "done_verified": row[0]}


# -- claim latency against history ---------------------------------------------------------


def _columns(conn: psycopg.Connection[Any], table: str) -> list[Column]:
    rows = conn.execute(
        """SELECT a.attname, a.attnotnull, a.atthasdef OR a.attidentity <> ''
           FROM pg_attribute a
           WHERE a.attrelid = format('pgdrain.%%I', %(t)s::text)::regclass
             AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
           ORDER BY a.attnum""",
        {"t": table},
    ).fetchall()
    return [Column(str(r[0]), bool(r[1]), bool(r[2])) for r in rows]


def _id_sequence(conn: psycopg.Connection[Any]) -> str | None:
    """The sequence behind the jobs' ids: the active table's once the table is split."""
    for table in ("pgdrain.active_jobs", "pgdrain.jobs"):
        row = conn.execute(
            "SELECT CASE WHEN to_regclass(%(t)s) IS NOT NULL"
            " THEN pg_get_serial_sequence(%(t)s, 'id') END",
            {"t": table},
        ).fetchone()
        if row and row[0]:
            return str(row[0])
    return None


def _tables(conn: psycopg.Connection[Any]) -> set[str]:
    """The pgdrain schema's tables, plain or partitioned (not its views)."""
    return {
        str(r[0])
        for r in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace"
            " WHERE s.nspname = 'pgdrain' AND c.relkind IN ('r', 'p')"
        )
    }


def add_history(url: str, n: int) -> dict[str, Any]:
    """`n` finished jobs into the table that holds finished jobs, then VACUUM ANALYZE."""
    with psycopg.connect(url, autocommit=True) as conn:
        table = history_table(_tables(conn))
        statement = history_insert(table, _columns(conn, table), _id_sequence(conn))
        start = time.perf_counter()
        conn.execute(statement.encode(), {"n": n, "queues": HISTORY_QUEUES})
        insert_s = time.perf_counter() - start
        conn.execute(sql.SQL("VACUUM ANALYZE pgdrain.{}").format(sql.Identifier(table)))
        vacuum_s = time.perf_counter() - start - insert_s
        row = conn.execute(
            "SELECT coalesce((SELECT sum(pg_total_relation_size(p.relid))"
            " FROM pg_partition_tree(r) AS p), pg_total_relation_size(r))::bigint"
            " FROM (SELECT format('pgdrain.%%I', %(t)s::text)::regclass AS r) AS t",
            {"t": table},
        ).fetchone()
    assert row is not None
    log(
        f"history: {n:,} finished jobs into pgdrain.{table} in {insert_s:.0f} s, "
        f"VACUUM ANALYZE {vacuum_s:.0f} s"
    )
    return {
        "table": table,
        "rows": n,
        "insert_s": insert_s,
        "vacuum_analyze_s": vacuum_s,
        "table_mib": int(row[0]) / 2**20,
    }


def claim_latencies(url: str, jobs: int) -> list[float]:
    """Claim (and complete) `jobs` queued jobs at batch 10 on one connection, as a run sends
    job_complete_and_claim: milliseconds per statement, the first 20 (warming up: psycopg
    prepares the statement at its sixth) left out."""
    out: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn:
        store.session_limits(conn, 60_000)
        # The statement's own time: the commit's wait for the WAL flush is the disk's, the
        # same with or without history, and on this shared disk it is most of a claim.
        conn.execute("SET synchronous_commit = off")
        held: list[store.Held] = []
        claimed_total = 0
        while True:
            statement = store.job_complete_and_claim_statement(
                held, None, BATCH, "bench-scale", 30.0, None, uuid.uuid4()
            )
            began = time.perf_counter()
            fenced, claimed = statement.run(conn)
            out.append((time.perf_counter() - began) * 1000.0)
            if fenced.lost_attempts:
                raise RuntimeError(f"{len(fenced.lost_attempts)} completions refused by the fence")
            held = [job.held for job in claimed]
            claimed_total += len(claimed)
            if not claimed:
                break
    if claimed_total != jobs:
        raise RuntimeError(f"{claimed_total:,} jobs claimed, {jobs:,} enqueued")
    return out[20:-1]  # the last, empty claim only completes


STATES = ("none", "with_history")


def paired_median(a: Sequence[float], b: Sequence[float]) -> float:
    """Median over rounds of a[i] / b[i]: the two ran next to each other in each round, so a
    burst of load on the shared machine falls on both."""
    ratios = [x / y for x, y in zip(a, b, strict=True) if y]
    return statistics.median(ratios) if ratios else float("nan")


def _claim_round(url: str, dbname: str, jobs: int, blocks: Blocks) -> tuple[list[float], float]:
    """Enqueue `jobs`, ANALYZE, claim them all: (ms per claim, blocks per claim)."""
    _enqueue(url, jobs)
    with psycopg.connect(url, autocommit=True) as conn:
        table = active_table(_tables(conn))
        conn.execute(sql.SQL("ANALYZE pgdrain.{}").format(sql.Identifier(table)))
    blocks.reset()
    ms = claim_latencies(url, jobs)
    return ms, blocks.per_call(dbname, CLAIM_TEXT)


def latency(
    server: Server, history: int, jobs: int, rounds: int, drain_seconds: float, blocks: Blocks
) -> dict[str, Any]:
    """Two databases, one without finished jobs and one with `history` of them, measured in
    turns: each round claims jobs // rounds jobs in each (the order alternating), then drains
    as many in each at the defaults."""
    names = {state: server.create() for state in STATES}
    urls = {state: server.url(name) for state, name in names.items()}
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
    added = add_history(urls["with_history"], history)
    per_round = max(1, jobs // rounds)
    ms: dict[str, list[float]] = {state: [] for state in STATES}
    p50s: dict[str, list[float]] = {state: [] for state in STATES}
    per_claim: dict[str, list[float]] = {state: [] for state in STATES}
    rates: dict[str, list[float]] = {state: [] for state in STATES}
    for number in range(rounds):
        order = STATES if number % 2 == 0 else STATES[::-1]
        for state in order:
            times, used = _claim_round(urls[state], names[state], per_round, blocks)
            ms[state] += times
            p50s[state].append(percentile(times, 50))
            per_claim[state].append(used)
        for state in order:
            _enqueue(urls[state], per_round)
            done, seconds, reason = _drain(urls[state], drain_seconds)
            if done != per_round:
                raise RuntimeError(f"{done:,} of {per_round:,} jobs drained ({reason})")
            rates[state].append(done / seconds)
        log(
            f"round {number + 1}: claim p50 {p50s['none'][-1]:.3f} / "
            f"{p50s['with_history'][-1]:.3f} ms, {per_claim['none'][-1]:.0f} / "
            f"{per_claim['with_history'][-1]:.0f} blocks; drain {rates['none'][-1]:,.0f} / "
            f"{rates['with_history'][-1]:,.0f} jobs/s (none / with history)"
        )
    for name in names.values():
        server.drop(name)
    figures: dict[str, dict[str, Any]] = {
        state: {
            "claims": len(ms[state]),
            "p50_ms": percentile(ms[state], 50),
            "p99_ms": percentile(ms[state], 99),
            "mean_ms": statistics.fmean(ms[state]),
            "round_p50_ms": p50s[state],
            "blocks_per_claim": statistics.fmean(per_claim[state]),
            "drain_jobs_per_s": statistics.median(rates[state]),
            "round_drain_jobs_per_s": rates[state],
        }
        for state in STATES
    }
    none, full = figures["none"], figures["with_history"]
    return {
        "claim_jobs": per_round * rounds,
        "rounds": rounds,
        "history": added,
        **figures,
        "p50_ratio": paired_median(full["round_p50_ms"], none["round_p50_ms"]),
        "p99_ratio": ratio(full["p99_ms"], none["p99_ms"]),
        "blocks_ratio": ratio(full["blocks_per_claim"], none["blocks_per_claim"]),
        "drain_ratio": paired_median(
            full["round_drain_jobs_per_s"], none["round_drain_jobs_per_s"]
        ),
    }


# -- the report ----------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    lines: list[str] = []
    if "throughput" in result:
        t = result["throughput"]
        lines += [
            "window   drained     jobs/s  vs first  blocks/job  dead rows  autovacuums  schema MiB"
        ]
        first = t["windows"][0]["jobs_per_s"]
        for w in t["windows"]:
            lines.append(
                f"{w['window']:>6} {w['drained_total']:>9,} {w['jobs_per_s']:>10,.0f} "
                f"{w['jobs_per_s'] / first:>9.2f} {w['blocks_per_job']:>11.1f} "
                f"{w['dead_rows']:>10,} {w['autovacuums']:>12} "
                f"{w['schema_mib']:>11,.0f}"
            )
        s = t["summary"]
        lines.append(
            f"last/first {s['last_over_first']:.2f}, min/first {s['min_over_first']:.2f} "
            f"(goal >= {GOAL}: {'met' if s['flat'] else 'NOT met'})"
        )
    if "latency" in result:
        c = result["latency"]
        lines += [
            "",
            f"history: {c['history']['rows']:,} finished jobs in pgdrain.{c['history']['table']}",
            "              claim p50 ms  claim p99 ms  blocks/claim  drain jobs/s",
        ]
        for label, key in (("no history", "none"), ("with history", "with_history")):
            f = c[key]
            lines.append(
                f"{label:<13} {f['p50_ms']:>12.3f} {f['p99_ms']:>13.3f} "
                f"{f['blocks_per_claim']:>13.1f} {f['drain_jobs_per_s']:>13,.0f}"
            )
        lines.append(
            f"{'ratio':<13} {c['p50_ratio']:>12.2f} {c['p99_ratio']:>13.2f} "
            f"{c['blocks_ratio']:>13.2f} {c['drain_ratio']:>13.2f}"
        )
    return "\n".join(lines)


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return done.stdout.strip() or "?"


def write(result: dict[str, Any], label: str, json_path: Path, out: Path) -> None:
    """Store `result` as docs/benchmarks.json's info.scale[label] and write docs/benchmarks.md
    again from it (the other sections as saved; its plots unchanged: their figures are)."""
    from bench import report, run

    res = run.load(json_path)
    res.info.setdefault("scale", {})[label] = result
    run.save(res, json_path)
    out.write_text(report.markdown(res, out.with_suffix(".png").name))
    log(f"wrote {out} (its scale section, {label!r}; the rest from {json_path})")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs over the whole run")
    parser.add_argument("--window", type=int, default=50_000, help="jobs per window")
    parser.add_argument("--history", type=int, default=10_000_000, help="finished jobs added")
    parser.add_argument("--claim-jobs", type=int, default=20_000, help="jobs claimed per state")
    parser.add_argument("--rounds", type=int, default=4, help="turns of the two states")
    parser.add_argument("--window-seconds", type=float, default=600.0, help="a drain's budget")
    parser.add_argument("--skip", choices=["throughput", "latency"], default=None)
    parser.add_argument("--pg-bin", default=None, help="PostgreSQL's bin folder")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    parser.add_argument(
        "--write", action="store_true", help="into docs/benchmarks.json and .md, as --label"
    )
    parser.add_argument(
        "--label", default="now", help="the schema measured: 'before' (the table split) or 'now'"
    )
    parser.add_argument("--note", default="", help="a sentence the report prints with it")
    parser.add_argument("--bench-json", type=Path, default=REPO / "docs" / "benchmarks.json")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args(argv)
    bindir = postgres_bin(args.pg_bin)
    began = time.monotonic()
    result: dict[str, Any] = {
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "settings": PRODUCTION,
        "batch": BATCH,
        "concurrency": CONCURRENCY,
        "jobs": args.jobs,
        "window": args.window,
        "load_before": load_average(),
        "note": args.note,
    }
    with own_server(bindir, PRODUCTION) as (admin_url, _):
        server = Server(admin_url)
        result["server"] = server.version()
        log(f"own server {result['server']} ({bindir}), autovacuum on; commit {result['commit']}")
        blocks = Blocks(admin_url)
        try:
            if args.skip != "throughput":
                result["throughput"] = throughput(
                    server, args.jobs, args.window, args.window_seconds, blocks
                )
            if args.skip != "latency":
                result["latency"] = latency(
                    server, args.history, args.claim_jobs, args.rounds, args.window_seconds, blocks
                )
        finally:
            blocks.close()
            server.drop_all()
    result["load_after"] = load_average()
    result["seconds"] = time.monotonic() - began
    print(table(result))
    print(f"took {result['seconds'] / 60:.1f} min; load {result['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.write:
        write(result, args.label, args.bench_json, args.out)


if __name__ == "__main__":
    main()
