"""One drain of pre-enqueued no-op jobs, in this process, for the figures of docs/benchmarks.md's
"Queue pause and rate limits": the drain with no per-queue setting (the claim's added work
must be nothing), with a concurrency limit, and with a rate that does not bind (the row lock
and the window's count at every claim). Prints one JSON line: jobs/s.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        PYTHONPATH=handler:. .venv/bin/python -m bench.queue_flow --case plain --batch 250

It uses only what both sides of a before/after comparison have (run it with PYTHONPATH naming
another checkout's handler/ for the before side; `--case rate` needs migration 0020). Each call
makes its own database from a template it builds once per schema (enqueueing is not timed).
The runs of both sides are alternated by hand (ABBA); `--write-section FILE` records the
section written from them (markdown) in docs/benchmarks.json and rewrites docs/benchmarks.md."""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgdrain import Budget, Job, Registry, Settings, build_job, drain, enqueue_many
from pgdrain.db import store
from pgdrain.db.migrate import migrate
from pgdrain.db.sql import migrations

BENCHMARKS_JSON = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.json"
registry = Registry()


@registry.job("bench.noop")
def noop(job: Job) -> None:
    pass


def _url(admin: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(admin, dbname=name)


def _template(admin: str, jobs: int) -> str:
    """A database holding the schema and `jobs` queued jobs, named by the schema's migrations."""
    versions = "".join(m.version[-2:] for m in migrations())
    name = f"qf_bench_tpl_{jobs}_{versions[-12:]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return name
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(_url(admin, name), autocommit=True) as conn:
        migrate(conn)
        with conn.transaction():
            enqueue_many(conn, (build_job("bench.noop") for _ in range(jobs)))
        conn.execute("VACUUM ANALYZE pgdrain.jobs")
    return name


def once(admin: str, jobs: int, batch: int, case: str) -> float:
    template = _template(admin, jobs)
    name = f"qf_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    try:
        url = _url(admin, name)
        with psycopg.connect(url, autocommit=True) as conn:
            if case == "limit":  # a concurrency limit that never binds
                store.queue_limit_sync(conn, ["default"], [("default", 100000)])
            elif case == "rate":  # a rate that never binds
                sync: Any = store.queue_limit_sync
                sync(conn, ["default"], [], [("default", 1000000, 3600)])
        settings = Settings(batch_size=batch)
        began = time.perf_counter()
        result = drain(settings, Budget.seconds(600), registry, url)
        elapsed = time.perf_counter() - began
        if result.done != jobs or result.error is not None:
            raise SystemExit(f"the drain did not finish every job: {result}")
        return jobs / elapsed
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))


def write_section(markdown: str) -> None:
    """Store the section in docs/benchmarks.json and write docs/benchmarks.md from it."""
    from bench import report, run

    res = run.load(BENCHMARKS_JSON)
    res.info["queue_flow"] = {"markdown": markdown.rstrip("\n").splitlines()}
    run.save(res, BENCHMARKS_JSON)
    BENCHMARKS_JSON.with_suffix(".md").write_text(report.markdown(res, "benchmarks.png"))


def main(argv: Sequence[str] | None = None) -> None:
    import os

    parser = argparse.ArgumentParser(prog="python -m bench.queue_flow", description=__doc__)
    parser.add_argument("--case", choices=("plain", "limit", "rate"), default="plain")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--write-section", type=Path, help="record this markdown; measure nothing")
    args = parser.parse_args(argv)
    if args.write_section is not None:
        write_section(args.write_section.read_text(encoding="utf-8"))
        return
    admin = os.environ["DATABASE_URL"]
    rate = once(admin, args.jobs, args.batch, args.case)
    print(json.dumps({"case": args.case, "batch": args.batch, "jobs_per_s": round(rate)}))


if __name__ == "__main__":
    main()
