"""Jobs/s of a drain that uses none of sequences and dependencies (the plain drain), and of
one draining 1,000 sequences of 10 jobs each (docs/benchmarks.md, "Sequences"). One drain
process, jobs that take no time, each repetition on a fresh migrated database of its own:

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python -m bench.flow [--plain-only] [--reps 3]

`--plain-only` runs only what every version of pgdrain can: run it with PYTHONPATH pointing at
an older checkout's handler/ to measure the plain drain before and after a change. Prints one
line per figure: the median jobs/s of --reps.

`--triggers PAIRS` measures instead what migration 0021's trigger on finish costs a
completion that uses none of it, on the server alone: 20,000 running rows moved done into
finished_jobs in one statement as a completion moves them (rolled back), with the trigger and
with it dropped in the same transaction, in interleaved pairs."""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from pgdrain import Budget, Job, Registry, Settings, build_job, drain, enqueue_many
from pgdrain.db.migrate import migrate

registry = Registry()


@registry.job("bench.noop")
def noop(job: Job) -> None:
    pass


def _url(admin: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(admin)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@contextmanager
def _database(admin: str) -> Iterator[str]:
    name = f"flowbench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = _url(admin, name)
        with psycopg.connect(url) as conn:
            migrate(conn)
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _once(admin: str, jobs: list[Any], settings: Settings) -> float:
    with _database(admin) as url:
        with psycopg.connect(url) as conn:
            enqueue_many(conn, jobs)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE pgdrain.active_jobs")
        began = time.perf_counter()
        result = drain(settings, Budget.seconds(600), registry, url)
        elapsed = time.perf_counter() - began
        if result.error is not None or result.done != len(jobs):
            raise SystemExit(f"the drain did not finish every job: {result.as_dict()}")
    return len(jobs) / elapsed


COMPLETE_ALL = (
    "WITH ended AS (DELETE FROM pgdrain.active_jobs WHERE status = 'running' RETURNING *)"
    " INSERT INTO pgdrain.finished_jobs (id, queue, kind, payload, status, priority, run_at,"
    " attempts, max_attempts, recovery_policy, reclaim_count, idempotency_key, last_error,"
    " created_at, updated_at, finished_at, completed_token, errors, sequence, depends_on,"
    " has_dependents, output, progress)"
    " SELECT id, queue, kind, payload, 'done', priority, run_at, attempts, max_attempts,"
    " recovery_policy, reclaim_count, idempotency_key, NULL, created_at, now(), now(),"
    " attempt_token, errors, sequence, depends_on, has_dependents, output, progress FROM ended"
)


def triggers(admin: str, pairs: int) -> None:
    with _database(admin) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO pgdrain.active_jobs (kind, status, attempts, lease_expires_at,"
                " leased_by, attempt_token, heartbeat_at) SELECT 'k', 'running', 1,"
                " now() + interval '1 h', 'w', gen_random_uuid(), now()"
                " FROM generate_series(1, 20000)"
            )
            conn.execute("VACUUM ANALYZE pgdrain.active_jobs")
        took: dict[str, list[float]] = {"with": [], "without": []}
        for i in range(pairs):
            for mode in ("with", "without") if i % 2 == 0 else ("without", "with"):
                with psycopg.connect(url) as conn:
                    if mode == "without":
                        conn.execute("DROP TRIGGER jobs_flow_finished ON pgdrain.finished_jobs")
                    began = time.perf_counter()
                    conn.execute(COMPLETE_ALL)
                    took[mode].append(time.perf_counter() - began)
                    conn.rollback()
    ratio = statistics.median(a / b for a, b in zip(took["with"], took["without"], strict=True))
    print(
        f"20,000 rows moved done in one statement: with the trigger"
        f" {statistics.median(took['with']):.3f} s,"
        f" without {statistics.median(took['without']):.3f} s; with/without {ratio:.3f}"
        f" (median of {pairs} pairs)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.flow", description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--plain-only", action="store_true")
    parser.add_argument("--triggers", type=int, metavar="PAIRS")
    args = parser.parse_args(argv)
    admin = _url(os.environ["DATABASE_URL"], "postgres")
    if args.triggers:
        triggers(admin, args.triggers)
        return
    plain = [build_job("bench.noop") for _ in range(args.jobs)]
    cases: list[tuple[str, list[Any], Settings]] = [
        ("plain, batch 10", plain, Settings(batch_size=10, concurrency=10)),
        ("plain, batch 250", plain, Settings(batch_size=250, concurrency=100)),
    ]
    if not args.plain_only:
        # Job j of every sequence before job j + 1 of any: each claim finds one ready job per
        # sequence at most.
        seq = [
            build_job("bench.noop", sequence=f"customer-{s}")
            for _ in range(10)
            for s in range(1000)
        ]
        cases.append(("1,000 sequences x 10, batch 10", seq, Settings()))
        cases.append(
            ("1,000 sequences x 10, batch 250", seq, Settings(batch_size=250, concurrency=100))
        )
    for name, jobs, settings in cases:
        figures = [_once(admin, jobs, settings) for _ in range(args.reps)]
        print(f"{name}: {statistics.median(figures):,.0f} jobs/s (of {figures})", flush=True)


if __name__ == "__main__":
    main()
