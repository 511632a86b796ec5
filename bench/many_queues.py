"""A drain across many queues: jobs/s by how many queues hold the same jobs, and with queues
that once held jobs and hold none now (their floors' marks stay until raises fold them in).

`python -m bench.many_queues [--jobs 20000] [--queues 1 100 1000 5000] [--empty 5000]
[--budget 60]`

Each shape on a fresh database migrated by pgdrain: `--jobs` no-op jobs spread evenly over Q
queues, drained by one run of every queue at the defaults (batch 10, concurrency 10) for at
most `--budget` seconds; then `--jobs` jobs in one queue beside `--empty` queues whose jobs
were deleted. Prints jobs/s and the ratio to one queue, measured in this run. A red team found
a claim of every queue costing O(queues²) (issue 43's lifecycle, decision 0017's floors).

Uses DATABASE_URL if set, else the embedded server."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import psycopg

from bench.common import Server, log, resolve_server
from pgdrain import Budget, Settings
from pgdrain.api.enqueue import build_job, enqueue_many
from pgdrain.api.registry import load_registry
from pgdrain.controls import ALL_ON
from pgdrain.db.migrate import migrate
from pgdrain.runner.drain import drain_with


def _database(server: Server, jobs: int, queues: int, empty: int) -> str:
    """A migrated database: `jobs` jobs over `queues` queues, and `empty` queues whose one job
    each was deleted (their marks left behind)."""
    name = server.create()
    url = server.url(name)
    with psycopg.connect(url) as conn:
        migrate(conn)
        enqueue_many(
            conn, [build_job("noop", {"n": n}, queue_name=f"q{n % queues}") for n in range(jobs)]
        )
        if empty:
            enqueue_many(conn, [build_job("noop", queue_name=f"gone{n}") for n in range(empty)])
            conn.execute("DELETE FROM pgdrain.active_jobs WHERE queue LIKE 'gone%%'")
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    server.checkpoint()
    return name


def _drain(url: str, jobs: int, budget: float) -> tuple[int, float]:
    """One run of every queue at the defaults; (jobs done, jobs/s)."""
    registry = load_registry("jobs")
    start = time.perf_counter()
    result = drain_with(ALL_ON, Settings(), Budget.seconds(budget), registry, url)
    seconds = time.perf_counter() - start
    return result.done, result.done / seconds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 100, 1000, 5000])
    parser.add_argument("--empty", type=int, default=5000)
    parser.add_argument("--budget", type=float, default=60.0)
    args = parser.parse_args(argv)
    admin_url, _ = resolve_server()
    server = Server(admin_url)
    shapes = [(f"{q} queue{'s' if q > 1 else ''}", q, 0) for q in args.queues]
    shapes.append((f"1 queue, {args.empty} empty", 1, args.empty))
    rows = []
    try:
        for label, queues, empty in shapes:
            name = _database(server, args.jobs, queues, empty)
            done, rate = _drain(server.url(name), args.jobs, args.budget)
            server.drop(name)
            log(f"{label}: {done} done, {rate:,.0f} jobs/s")
            rows.append((label, done, rate))
    finally:
        server.drop_all()
    base = rows[0][2]
    print(f"| shape ({args.jobs:,} jobs, batch 10) | done | jobs/s | vs 1 queue |")
    print("|---|---:|---:|---:|")
    for label, done, rate in rows:
        print(f"| {label} | {done:,} | {rate:,.0f} | {rate / base:.2f} |")


if __name__ == "__main__":
    main()
