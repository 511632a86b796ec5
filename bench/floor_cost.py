"""What each queue's floor (migration 0026; docs/decisions/0017) costs its writers: the product's
triggers, on and off (issue 43, item 1).

`python -m bench.floor_cost [--jobs 100000] [--single 5000] [--drain-jobs 20000] [--repeat 3]`

Every statement that writes a queued row runs `queue_floor_lower()` (an AFTER STATEMENT trigger
reading the statement's new rows): per queue, the least priority, run_at and id of its rows, a
shared advisory lock on the queue, and a probe of the queue's marks. Measured on fresh
databases migrated by pgdrain, with the two triggers and without them (disabled, and a mark at
the lowest key so that claims start at each queue's first entry, as before the floors), in turn
`--repeat` times (medians, and the median of each turn's ratio): `enqueue_many` of `--jobs` jobs
in one transaction; `--single` jobs enqueued one per transaction (as an application enqueues);
a drain of `--drain-jobs` at batch 10 and at batch 250 (one process, as `make bench`'s).

Uses DATABASE_URL if set, else the embedded server."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import psycopg

from bench.common import Server, log, resolve_server
from pgdrain import Budget, Settings
from pgdrain.api.enqueue import build_job, enqueue, enqueue_many
from pgdrain.api.registry import load_registry
from pgdrain.controls import ALL_ON
from pgdrain.db.migrate import migrate
from pgdrain.runner.drain import drain_with

# The triggers taken out, and the floor left at the lowest key: claims read the floors as the
# product does, and start each queue at its first entry, as before migration 0026.
WITHOUT = """
ALTER TABLE pgdrain.active_jobs DISABLE TRIGGER jobs_queue_floor_insert,
                                DISABLE TRIGGER jobs_queue_floor_update;
INSERT INTO pgdrain.queue_floor_marks
    VALUES ('default', -2147483648, '-infinity', 0, '-infinity');
"""


def _migrated(server: Server, triggers: bool) -> str:
    name = server.create()
    with psycopg.connect(server.url(name), autocommit=True) as conn:
        migrate(conn)
        if not triggers:
            conn.execute(WITHOUT)
    return name


def _enqueue(url: str, jobs: int) -> float:
    """enqueue_many of `jobs` jobs in one transaction; jobs/s (the jobs are built before)."""
    built = [build_job("noop", {"n": n}) for n in range(jobs)]
    with psycopg.connect(url) as conn:
        start = time.perf_counter()
        enqueue_many(conn, built)
        conn.commit()
        return jobs / (time.perf_counter() - start)


def _enqueue_single(url: str, jobs: int) -> float:
    """`jobs` jobs enqueued one per transaction, as an application enqueues; jobs/s."""
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        for n in range(jobs):
            enqueue(conn, "noop", {"n": n})  # autocommit: a transaction of its own
        return jobs / (time.perf_counter() - start)


def _drain(url: str, jobs: int, batch: int) -> float:
    """One drain at `batch` (threads as make bench runs them); jobs/s."""
    settings = Settings(batch_size=batch, concurrency=min(batch, 250))
    registry = load_registry("jobs")
    start = time.perf_counter()
    result = drain_with(ALL_ON, settings, Budget.seconds(600), registry, url)
    seconds = time.perf_counter() - start
    assert result.done == jobs, result
    return jobs / seconds


def triggers_cost(server: Server, jobs: int, single: int, drain_jobs: int, repeat: int) -> None:
    figures: dict[str, dict[bool, list[float]]] = {}
    for turn in range(repeat):
        for triggers in (False, True) if turn % 2 == 0 else (True, False):
            name = _migrated(server, triggers)
            url = server.url(name)
            figures.setdefault("enqueue_many", {}).setdefault(triggers, []).append(
                _enqueue(url, jobs)
            )
            server.drop(name)
            name = _migrated(server, triggers)
            url = server.url(name)
            figures.setdefault("enqueue, one per transaction", {}).setdefault(triggers, []).append(
                _enqueue_single(url, single)
            )
            server.drop(name)
            for batch in (10, 250):
                name = _migrated(server, triggers)
                url = server.url(name)
                _enqueue(url, drain_jobs)
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE")
                server.checkpoint()
                figures.setdefault(f"drain, batch {batch}", {}).setdefault(triggers, []).append(
                    _drain(url, drain_jobs, batch)
                )
                server.drop(name)
        log(f"turn {turn + 1} of {repeat} done")
    print("| jobs/s | without | with the triggers | ratio (median of the turns') |")
    print("|---|---:|---:|---:|")
    for what, by in figures.items():
        ratios = [w / wo for wo, w in zip(by[False], by[True], strict=True)]
        print(
            f"| {what} | {statistics.median(by[False]):,.0f} | "
            f"{statistics.median(by[True]):,.0f} | {statistics.median(ratios):.2f} |"
        )
    for what, by in figures.items():
        turns = ", ".join(f"{wo:,.0f}/{w:,.0f}" for wo, w in zip(by[False], by[True], strict=True))
        print(f"{what}, each turn (without/with): {turns}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single", type=int, default=5_000)
    parser.add_argument("--drain-jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    admin_url, _ = resolve_server()
    server = Server(admin_url)
    try:
        triggers_cost(server, args.jobs, args.single, args.drain_jobs, args.repeat)
    finally:
        server.drop_all()


if __name__ == "__main__":
    main()
