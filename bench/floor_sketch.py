"""A sketch, not the product: what the queue half of option 4 would cost the writers (issue 43,
item 1; docs/decisions/0017). The lease half is built (migration 0024).

`python -m bench.floor_sketch [--jobs 100000] [--single 5000] [--drain-jobs 20000] [--repeat 3]`

The queue half keeps, per queue, a floor under every queued job's claim key (priority, run_at,
id) and under its run_at, so that a fresh run's walks start there. Every statement that writes
a queued row lowers it below its rows (an AFTER STATEMENT trigger reading the statement's new
rows), under a shared advisory lock, as the lease floor's writers do. Two choices differ from
the first sketch, each against a cost it measured or a rule the record found:

- the least key of a statement's rows is taken field by field (the least priority, run_at and
  id of each queue's rows, which sorts at or before each of them), a hash aggregate where the
  first sketch sorted every new row (enqueue_many 0.89);
- a writer whose rows fall below the floor appends a row to a table of lowerings, which the
  next raise folds in, instead of updating the floor's row: concurrent first enqueues into an
  empty queue then take no row lock from each other (rule 5).

Measured on fresh databases migrated by pgdrain, with and without these triggers, in turn
`--repeat` times (medians, and the median of each turn's ratio): `enqueue_many` of `--jobs`
jobs in one transaction; `--single` jobs enqueued one per transaction (as an application
enqueues); a drain of `--drain-jobs` at batch 10 and at batch 250 (one process, as `make
bench`'s). The floors start at the lowest key, so no statement lowers one: what is measured is
the trigger, its aggregate and the lock in the common case.

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

# The writers' side of the queue half. The floors start at the lowest key, so no statement
# lowers one: what is measured is the aggregate, the lock and the read each statement adds.
TRIGGERS = """
CREATE TABLE pgdrain.sketch_queue_floors (
    queue text PRIMARY KEY,
    priority int NOT NULL, run_at timestamptz NOT NULL, id bigint NOT NULL,
    ready_at timestamptz NOT NULL
);
INSERT INTO pgdrain.sketch_queue_floors
    VALUES ('default', -2147483648, '-infinity', 0, '-infinity');
CREATE TABLE pgdrain.sketch_queue_lowerings (
    queue text NOT NULL, priority int NOT NULL, run_at timestamptz NOT NULL, id bigint NOT NULL
);

CREATE FUNCTION pgdrain.sketch_lower_queue_floors() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    queues text[]; priorities int[]; run_ats timestamptz[]; ids bigint[];
BEGIN
    SELECT array_agg(n.queue), array_agg(n.priority), array_agg(n.run_at), array_agg(n.id)
    INTO queues, priorities, run_ats, ids
    FROM (SELECT queue, min(priority) AS priority, min(run_at) AS run_at, min(id) AS id
          FROM new_rows WHERE status = 'queued' GROUP BY queue) AS n;
    IF queues IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(20261207, 2);
    INSERT INTO pgdrain.sketch_queue_lowerings
    SELECT l.* FROM unnest(queues, priorities, run_ats, ids) AS l(queue, priority, run_at, id)
    WHERE NOT EXISTS (
        SELECT 1 FROM (SELECT f.queue, f.priority, f.run_at, f.id, f.ready_at
                       FROM pgdrain.sketch_queue_floors AS f
                       UNION ALL
                       SELECT w.queue, w.priority, w.run_at, w.id, w.run_at
                       FROM pgdrain.sketch_queue_lowerings AS w) AS x
        WHERE x.queue = l.queue
          AND (x.priority, x.run_at, x.id) <= (l.priority, l.run_at, l.id)
          AND x.ready_at <= l.run_at);
    RETURN NULL;
END $$;

CREATE TRIGGER sketch_lower_after_insert AFTER INSERT ON pgdrain.active_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.sketch_lower_queue_floors();
CREATE TRIGGER sketch_lower_after_update AFTER UPDATE ON pgdrain.active_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.sketch_lower_queue_floors();
"""


def _migrated(server: Server, triggers: bool) -> str:
    name = server.create()
    with psycopg.connect(server.url(name), autocommit=True) as conn:
        migrate(conn)
        if triggers:
            conn.execute(TRIGGERS)
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
