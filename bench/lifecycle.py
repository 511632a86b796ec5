"""Rounds of enqueue-then-drain, as an operator's queue lives: throughput, WAL and storage per
round, with vacuum keeping up or with a snapshot held open for the whole run.

`python -m bench.lifecycle [--held] [--no-position] [--rounds 6] [--jobs 50000] [--json F]`
(then `--record HELD.json KEEPS_UP.json`: into docs/benchmarks.md): each round
enqueues `--jobs` no-op jobs, drains them at the defaults (batch 10, concurrency 10, one
process), then VACUUMs the database (standing in for autovacuum, which is off on the machine's
server). With `--held`, a REPEATABLE READ transaction on another connection takes its snapshot
before the first round
and keeps it to the end (a report, a pg_dump, a forgotten session): nothing a drain writes
after it can be vacuumed away. A round that has not finished within `--round-seconds` is cut
there; its throughput is what it drained. `--no-position`: every claim reads each queue from
its start (runner/positions.py switched off), as before positions.

Per round: jobs/s, WAL bytes per job drained (pg_current_wal_lsn() around the drain: claim and
complete; the enqueue and the vacuum are outside), and the size of every table and index of the
pgdrain schema after the vacuum. Uses DATABASE_URL if set, else the embedded server."""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import psycopg

from bench.common import REPO, Server, load_average, log, resolve_server
from pgdrain import Budget, Settings
from pgdrain.api.enqueue import build_job, enqueue_many
from pgdrain.api.registry import load_registry
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db.migrate import migrate
from pgdrain.runner.drain import drain_with

SCHEMA_BYTES = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'pgdrain' AND c.relkind IN ('r', 'p')
"""


def wal_lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def one_round(
    url: str,
    admin: psycopg.Connection[Any],
    jobs: int,
    round_seconds: float,
    controls: Controls,
) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            enqueue_many(conn, (build_job("noop") for _ in range(jobs)))
    lsn_before = wal_lsn(admin)
    start = time.perf_counter()
    result = drain_with(
        controls,
        Settings(batch_size=10, concurrency=10),
        Budget.seconds(round_seconds),
        load_registry("jobs"),
        url,
    )
    seconds = time.perf_counter() - start
    wal = wal_lsn(admin) - lsn_before
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")
        row = conn.execute(SCHEMA_BYTES).fetchone()
    assert row is not None
    return {
        "jobs_per_s": result.done / seconds,
        "done": result.done,
        "stop_reason": result.stop_reason,
        "wal_bytes_per_job": wal / max(result.done, 1),
        "schema_mib": int(row[0]) / 2**20,
    }


def run(
    rounds: int, jobs: int, held: bool, round_seconds: float, controls: Controls = ALL_ON
) -> list[dict[str, Any]]:
    admin_url, source = resolve_server()
    server = Server(admin_url)
    position = controls.claim_from_position
    log(f"server: {source}, {server.version()}; held snapshot: {held}; position: {position}")
    name = server.create()
    url = server.url(name)
    figures: list[dict[str, Any]] = []
    try:
        with ExitStack() as stack:
            with psycopg.connect(url, autocommit=True) as conn:
                migrate(conn)
            admin = stack.enter_context(psycopg.connect(url, autocommit=True))
            if held:
                holder = stack.enter_context(psycopg.connect(url))
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT count(*) FROM pg_class")  # takes the snapshot
            for number in range(1, rounds + 1):
                figure = one_round(url, admin, jobs, round_seconds, controls)
                figures.append(figure)
                log(
                    f"round {number}: {figure['jobs_per_s']:,.0f} jobs/s "
                    f"({figure['done']:,} done, {figure['stop_reason']}), "
                    f"WAL {figure['wal_bytes_per_job']:,.0f} B/job, "
                    f"schema {figure['schema_mib']:,.1f} MiB"
                )
    finally:
        server.drop_all()
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs enqueued per round")
    parser.add_argument("--held", action="store_true", help="hold a snapshot for the whole run")
    parser.add_argument("--round-seconds", type=float, default=120.0)
    parser.add_argument(
        "--no-position",
        action="store_true",
        help="claim every queue from its start (Controls(claim_from_position=False))",
    )
    parser.add_argument("--json", default="", help="also write the figures here")
    parser.add_argument(
        "--record",
        nargs=2,
        metavar=("HELD_JSON", "KEEPS_UP_JSON"),
        help="put two runs' --json (with --held, without) in docs/benchmarks.md and stop",
    )
    parser.add_argument("--note", default="", help="with --record: said under the table")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record[0], args.record[1], note=args.note)
        return
    controls = Controls(claim_from_position=not args.no_position)
    figures = run(args.rounds, args.jobs, args.held, args.round_seconds, controls)
    if args.json:
        with open(args.json, "w") as out:
            figure = {"held": args.held, "position": not args.no_position, "jobs": args.jobs}
            json.dump({**figure, **environment(), "rounds": figures}, out, indent=1)


def environment() -> dict[str, str]:
    """What --record names: the commit measured, the server, the date and the load."""
    admin_url, source = resolve_server()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "commit": commit,
        "server": f"PostgreSQL {Server(admin_url).version()} ({source})",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": load_average(),
    }


def record(held_json: str, free_json: str, note: str) -> None:
    """Two runs' figures (a snapshot held, vacuum keeping up) into docs/benchmarks.json's
    lifecycle section, and docs/benchmarks.md rewritten from it."""
    from bench import report, run

    with open(held_json) as f:
        held = json.load(f)
    with open(free_json) as f:
        free = json.load(f)
    assert held["held"] and not free["held"], "--record HELD_JSON KEEPS_UP_JSON"
    assert held["commit"] == free["commit"], "both runs of one commit"
    path = REPO / "docs" / "benchmarks.json"
    res = run.load(path)
    res.info["lifecycle"] = {
        **{k: held[k] for k in ("commit", "server", "date", "load")},
        "note": note,
        "held": held,
        "free": free,
    }
    run.save(res, path)
    # The markdown alone: the plots are make bench's, and unchanged.
    (REPO / "docs" / "benchmarks.md").write_text(report.markdown(res, "benchmarks.png"))
    log(f"wrote docs/benchmarks.md (its lifecycle section; the rest from {path})")


if __name__ == "__main__":
    main()
