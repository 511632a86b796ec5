"""A sketch, not the product: what floors kept by the writers would cost and buy (issue 43, item
1; docs/decisions/0017, option 4).

`python -m bench.floor_sketch [--jobs 100000] [--drain-jobs 20000] [--repeat 3] [--held 300000]`

Option 4 keeps, per queue, a floor under every queued job's claim key, and one under every
running job's lease. A statement that writes `active_jobs` first takes a shared advisory lock
(a BEFORE STATEMENT trigger), and after its rows are written lowers a floor that one of them
falls below (an AFTER STATEMENT trigger reading the statement's new rows). The floors are
raised only under the exclusive lock, which no writer then holds, from a snapshot taken after
it. So a walk may start at a floor. Two parts, each on fresh databases migrated by pgdrain:

1. **The triggers' cost**, where no floor needs lowering (the common case; the floors are set
   at the lowest key, so each statement reads them and writes nothing): `enqueue_many` of
   `--jobs` jobs, then a drain of `--drain-jobs` at batch 10 and at batch 250 (one process, as
   `make bench`'s), with and without the triggers, in turn `--repeat` times; medians, and the
   median of each turn's ratio.
2. **What a lease floor buys the reclaim** behind a held snapshot: `--held` jobs drained in
   rounds of 50,000 while a REPEATABLE READ transaction holds its snapshot (a VACUUM after each
   round). Then, as if a day later (every lease expired), the reclaim's scan as it is
   (job_reclaim_expired's `expired` CTE: nothing to find, every dead entry walked), against
   what a run would walk with a floor: the raise, from the floor the last round's first claim
   lowered it to (its lease: nothing ran before the round), to the least lease of a running job
   (none). The reclaim itself then starts at that floor. Medians of 20 executions each.

Uses DATABASE_URL if set, else the embedded server."""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from bench.common import Server, log, resolve_server
from pgdrain import Budget, Settings
from pgdrain.api.enqueue import build_job, enqueue_many
from pgdrain.api.registry import load_registry
from pgdrain.controls import ALL_ON
from pgdrain.db.migrate import migrate
from pgdrain.runner.drain import drain_with

# The writers' side of option 4. The floors start at the lowest key, so no statement lowers one:
# what is measured is the lock and the read each statement adds.
TRIGGERS = """
CREATE TABLE pgdrain.sketch_floors (
    queue text PRIMARY KEY,
    priority int NOT NULL, run_at timestamptz NOT NULL, id bigint NOT NULL,
    lease timestamptz NOT NULL
);
INSERT INTO pgdrain.sketch_floors VALUES ('default', -2147483648, '-infinity', 0, '-infinity');

CREATE FUNCTION pgdrain.sketch_writers_share() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(20261207, 1);
    RETURN NULL;
END $$;

CREATE FUNCTION pgdrain.sketch_lower_floors() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgdrain.sketch_floors AS f
    SET priority = n.priority, run_at = n.run_at, id = n.id
    FROM (SELECT DISTINCT ON (queue) queue, priority, run_at, id
          FROM new_rows WHERE status = 'queued'
          ORDER BY queue, priority, run_at, id) AS n
    WHERE f.queue = n.queue AND (n.priority, n.run_at, n.id) < (f.priority, f.run_at, f.id);
    UPDATE pgdrain.sketch_floors AS f
    SET lease = n.lease
    FROM (SELECT min(lease_expires_at) AS lease FROM new_rows WHERE status = 'running') AS n
    WHERE n.lease < f.lease;
    RETURN NULL;
END $$;

CREATE TRIGGER sketch_share BEFORE INSERT OR UPDATE ON pgdrain.active_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.sketch_writers_share();
CREATE TRIGGER sketch_lower_after_insert AFTER INSERT ON pgdrain.active_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.sketch_lower_floors();
CREATE TRIGGER sketch_lower_after_update AFTER UPDATE ON pgdrain.active_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgdrain.sketch_lower_floors();
"""

# job_reclaim_expired's scan (its `expired` CTE) at a given time: every lease before it.
RECLAIM_SCAN = """
SELECT id, attempt_token FROM pgdrain.active_jobs
WHERE status = 'running' AND lease_expires_at < %(at)s
ORDER BY lease_expires_at, id LIMIT 100 FOR UPDATE SKIP LOCKED
"""
# A raise of the lease floor: the least lease of a running job, walked from the old floor.
RAISE_WALK = """
SELECT min(lease_expires_at) FROM pgdrain.active_jobs
WHERE status = 'running' AND lease_expires_at >= %(floor)s
"""

ROUND_JOBS = 50_000


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


def _drain(url: str, jobs: int, batch: int) -> float:
    """One drain at `batch` (threads as make bench runs them); jobs/s."""
    settings = Settings(batch_size=batch, concurrency=min(batch, 250))
    registry = load_registry("jobs")
    start = time.perf_counter()
    result = drain_with(ALL_ON, settings, Budget.seconds(600), registry, url)
    seconds = time.perf_counter() - start
    assert result.done == jobs, result
    return jobs / seconds


def triggers_cost(server: Server, jobs: int, drain_jobs: int, repeat: int) -> None:
    figures: dict[str, dict[bool, list[float]]] = {}
    for turn in range(repeat):
        for triggers in (False, True) if turn % 2 == 0 else (True, False):
            name = _migrated(server, triggers)
            url = server.url(name)
            figures.setdefault("enqueue_many", {}).setdefault(triggers, []).append(
                _enqueue(url, jobs)
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


def reclaim_from_a_floor(server: Server, held: int) -> None:
    """Every job drained after the snapshot leaves a dead entry in the lease index. The scan as
    it is walks all of them; a raise of the floor walks those of the jobs that ran since the
    floor was lowered (here: the last round's), and the reclaim then starts at the floor, the
    least lease of a running job (none runs: nothing to walk)."""
    name = _migrated(server, False)
    url = server.url(name)
    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as conn:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT count(*) FROM pgdrain.active_jobs")  # the snapshot, held
        drained = 0
        last_floor: Any = None
        while drained < held:
            jobs = min(ROUND_JOBS, held - drained)
            # Nothing runs before the round: the floor is then lowered by its first claim, to
            # that claim's lease.
            last_floor = _now(conn) + dt.timedelta(seconds=Settings().lease_seconds)
            _enqueue(url, jobs)
            _drain(url, jobs, 10)
            conn.execute("VACUUM pgdrain.active_jobs")
            drained += jobs
            log(f"{drained:,} drained behind the held snapshot")
        # A day later, every lease written has expired: the walks below see all the entries.
        at = conn.execute("SELECT now() + interval '1 day'").fetchone()[0]  # type: ignore[index]
        timings: dict[str, list[float]] = {"the reclaim's scan as it is": [], "a raise": []}
        for _ in range(20):
            for label, text, params in (
                ("the reclaim's scan as it is", RECLAIM_SCAN, {"at": at}),
                ("a raise", RAISE_WALK, {"floor": last_floor}),
            ):
                with conn.transaction():
                    start = time.perf_counter()
                    conn.execute(text, params).fetchall()
                    timings[label].append(1000 * (time.perf_counter() - start))
        holder.rollback()
    server.drop(name)
    print(f"| after {held:,} jobs drained behind a held snapshot | ms (median of 20) |")
    print("|---|---:|")
    for label, values in timings.items():
        print(f"| {label} | {statistics.median(values):.2f} |")


def _now(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--drain-jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--held", type=int, default=300_000)
    args = parser.parse_args(argv)
    admin_url, _ = resolve_server()
    server = Server(admin_url)
    try:
        if args.repeat:
            triggers_cost(server, args.jobs, args.drain_jobs, args.repeat)
        if args.held:
            reclaim_from_a_floor(server, args.held)
    finally:
        server.drop_all()


if __name__ == "__main__":
    main()
