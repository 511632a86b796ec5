"""Rounds of enqueue-then-drain, as an operator's queue lives: throughput, WAL and storage per
round, with vacuum keeping up or with a snapshot held open for the whole run.

`python -m bench.lifecycle [--held] [--no-position] [--rounds 6] [--jobs 50000] [--batch 10]
[--concurrency 10] [--short-runs 10] [--json F]` (then `--record HELD.json KEEPS_UP.json`: into
docs/benchmarks.md): each round enqueues `--jobs` no-op jobs, drains them (by default at the
defaults: batch 10, concurrency 10, one process), then VACUUMs the database (standing in for
autovacuum, which is off on the machine's server). Then `--short-runs` fresh runs, one after
another, each of `--short-jobs` jobs enqueued then drained by a run of its own (as kicks start
Lambda runs): a fresh run holds no claim position, so its claims start each queue from its
start, behind every dead entry the rounds left. With `--held`, a REPEATABLE READ transaction
on another connection takes its snapshot before the first round and keeps it to the end (a
report, a pg_dump, a forgotten session): nothing a drain writes after it can be vacuumed away. A
round that has not finished within `--round-seconds` is cut there; its throughput is what it
drained. `--no-position`: every claim reads each queue from its start (runner/positions.py
switched off), as before positions.

Per round: jobs/s, WAL bytes per job drained (pg_current_wal_lsn() around the drain: claim and
complete; the enqueue and the vacuum are outside), and the size of every table and index of the
pgdrain schema after the vacuum, with the schema's bytes per million finished jobs. With
`--wal-dir` (the server's pg_wal, readable here), the WAL of this database alone, by record type
and relation (pg_waldump): the server may be shared. Uses DATABASE_URL if set, else the embedded
server."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

import psycopg

from bench.common import REPO, Server, load_average, log, median, resolve_server
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

# Each relation of the queue's tables (heap or index; a partitioned table's partitions each),
# by name: where the bytes of a round sit.
RELATION_BYTES = """
SELECT c.relname, pg_relation_size(c.oid)::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'pgdrain' AND c.relkind IN ('r', 'i')
  AND (c.relname LIKE 'jobs%' OR c.relname LIKE 'active_jobs%' OR c.relname LIKE 'finished_jobs%')
  AND pg_relation_size(c.oid) > 0
ORDER BY 2 DESC
"""


def wal_lsn(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


_RECORD = re.compile(
    r"^rmgr: (\S+)\s+len \(rec/tot\):\s+\d+/\s*(\d+), tx:\s+(\d+), .*?desc: (\S+)(.*)$"
)
_BLOCK = re.compile(r"blkref #0: rel \d+/(\d+)/(\d+)")


def wal_of_database(
    conn: psycopg.Connection[Any], waldump: str, wal_dir: str, start: int, end: int
) -> tuple[int, Counter[str]]:
    """The WAL bytes of this database's records between two LSNs, and where they went (record
    type and relation): pg_current_wal_lsn() counts every database's writes, and the server may
    be shared. A commit record counts when its transaction wrote a block of this database."""
    row = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    assert row is not None
    db = str(row[0])
    names = {
        str(node): name
        for node, name in conn.execute(
            "SELECT pg_relation_filenode(oid), relname FROM pg_class "
            "WHERE pg_relation_filenode(oid) IS NOT NULL"
        )
    }
    done = subprocess.run(
        [waldump, "-p", wal_dir, "-s", lsn_text(start), "-e", lsn_text(end)],
        capture_output=True,
        text=True,
        check=False,
    )
    dump = done.stdout
    if done.returncode != 0:
        log(f"pg_waldump: {done.stderr.strip()[:300]}")
    ours: set[str] = set()
    where: Counter[str] = Counter()
    commits: list[tuple[str, str, int]] = []
    for line in dump.splitlines():
        match = _RECORD.match(line)
        if match is None:
            continue
        rmgr, total, tx, kind, rest = match.groups()
        block = _BLOCK.search(rest)
        if block is not None and block.group(1) == db:
            ours.add(tx)
            fpw = " FPW" if "FPW" in rest else ""
            where[f"{rmgr} {kind}{fpw} {names.get(block.group(2), block.group(2))}"] += int(total)
        elif rmgr == "Transaction":
            commits.append((tx, kind, int(total)))
    for tx, kind, total in commits:
        if tx in ours:
            where[f"Transaction {kind}"] += total
    return sum(where.values()), where


def one_round(
    url: str,
    admin: psycopg.Connection[Any],
    jobs: int,
    round_seconds: float,
    settings: Settings,
    wal_dir: str,
    waldump: str,
    controls: Controls,
    short_runs: int = 0,
    short_jobs: int = 50,
) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            enqueue_many(conn, (build_job("noop") for _ in range(jobs)))
    lsn_before = wal_lsn(admin)
    start = time.perf_counter()
    result = drain_with(
        controls,
        settings,
        Budget.seconds(round_seconds),
        load_registry("jobs"),
        url,
    )
    seconds = time.perf_counter() - start
    lsn_after = wal_lsn(admin)
    wal = lsn_after - lsn_before
    ours: tuple[int, Counter[str]] | None = None
    if wal_dir:
        ours = wal_of_database(admin, waldump, wal_dir, lsn_before, lsn_after)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")
        row = conn.execute(SCHEMA_BYTES).fetchone()
        relations = {name: int(size) for name, size in conn.execute(RELATION_BYTES)}
    assert row is not None
    short = [
        fresh_run(url, short_jobs, round_seconds, settings, controls) for _ in range(short_runs)
    ]
    return {
        "short_run_ms": median(short) * 1000 if short else None,
        "jobs_per_s": result.done / seconds,
        "done": result.done,
        "stop_reason": result.stop_reason,
        "wal_bytes_per_job": wal / max(result.done, 1),
        "schema_mib": int(row[0]) / 2**20,
        "relations": relations,
        "wal_bytes_per_job_this_database": None if ours is None else ours[0] / max(result.done, 1),
        "wal_by_record": {} if ours is None else dict(ours[1].most_common(12)),
    }


def fresh_run(
    url: str, jobs: int, budget_seconds: float, settings: Settings, controls: Controls
) -> float:
    """Enqueue `jobs` no-op jobs, then drain them in a run of its own: its seconds."""
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            enqueue_many(conn, (build_job("noop") for _ in range(jobs)))
    start = time.perf_counter()
    result = drain_with(
        controls, settings, Budget.seconds(budget_seconds), load_registry("jobs"), url
    )
    seconds = time.perf_counter() - start
    assert result.done == jobs, f"a fresh run drained {result.done} of {jobs} jobs"
    return seconds


def run(
    rounds: int,
    jobs: int,
    held: bool,
    round_seconds: float,
    settings: Settings,
    wal_dir: str = "",
    waldump: str = "pg_waldump",
    controls: Controls = ALL_ON,
    short_runs: int = 0,
    short_jobs: int = 50,
) -> list[dict[str, Any]]:
    admin_url, source = resolve_server()
    server = Server(admin_url)
    log(
        f"server: {source}, {server.version()}; held snapshot: {held}; "
        f"batch {settings.batch_size}, concurrency {settings.concurrency}; "
        f"position: {controls.claim_from_position}"
    )
    name = server.create()
    url = server.url(name)
    figures: list[dict[str, Any]] = []
    try:
        with ExitStack() as stack:
            with psycopg.connect(url, autocommit=True) as conn:
                migrate(conn)
            admin = stack.enter_context(psycopg.connect(url, autocommit=True))
            if wal_dir:
                # A temporary slot (dropped with this session) keeps the server from recycling
                # the segments of a round before pg_waldump reads them.
                admin.execute(
                    "SELECT pg_create_physical_replication_slot(%s, true, true)",
                    (f"bench_lifecycle_{name}",),
                )
            if held:
                holder = stack.enter_context(psycopg.connect(url))
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT count(*) FROM pg_class")  # takes the snapshot
            for number in range(1, rounds + 1):
                figure = one_round(
                    url,
                    admin,
                    jobs,
                    round_seconds,
                    settings,
                    wal_dir,
                    waldump,
                    controls,
                    short_runs,
                    short_jobs,
                )
                finished = sum(f["done"] for f in figures) + figure["done"]
                figure["schema_mib_per_million"] = figure["schema_mib"] * 1e6 / max(finished, 1)
                figures.append(figure)
                log(
                    f"round {number}: {figure['jobs_per_s']:,.0f} jobs/s "
                    f"({figure['done']:,} done, {figure['stop_reason']}), "
                    f"WAL {figure['wal_bytes_per_job']:,.0f} B/job, "
                    f"schema {figure['schema_mib']:,.1f} MiB "
                    f"({figure['schema_mib_per_million']:,.0f} MiB per million finished)"
                    + (
                        f"; a fresh run of {short_jobs} jobs: {figure['short_run_ms']:,.1f} ms"
                        if short_runs
                        else ""
                    )
                )
                log(
                    "  "
                    + ", ".join(
                        f"{name} {size / 2**20:,.1f}"
                        for name, size in figure["relations"].items()
                        if size >= 2**16
                    )
                    + " (MiB)"
                )
                if figure["wal_bytes_per_job_this_database"] is not None:
                    log(
                        f"  WAL of this database: "
                        f"{figure['wal_bytes_per_job_this_database']:,.0f} B/job; "
                        + ", ".join(
                            f"{what} {size / max(figure['done'], 1):,.0f}"
                            for what, size in figure["wal_by_record"].items()
                        )
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
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--retain-done",
        type=float,
        default=7.0,
        help="PGDRAIN_RETAIN_DONE, in days (0: a done job is deleted, not kept)",
    )
    parser.add_argument(
        "--wal-dir",
        default="",
        help="the server's pg_wal directory, readable here: count this database's WAL alone",
    )
    parser.add_argument("--pg-waldump", default="pg_waldump")
    parser.add_argument(
        "--no-position",
        action="store_true",
        help="claim every queue from its start (Controls(claim_from_position=False))",
    )
    parser.add_argument(
        "--short-runs",
        type=int,
        default=0,
        help="after each round, this many fresh runs of --short-jobs jobs each (median time)",
    )
    parser.add_argument("--short-jobs", type=int, default=50)
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
    settings = Settings(
        batch_size=args.batch, concurrency=args.concurrency, retain_done_days=args.retain_done
    )
    figures = run(
        args.rounds,
        args.jobs,
        args.held,
        args.round_seconds,
        settings,
        args.wal_dir,
        args.pg_waldump,
        controls,
        args.short_runs,
        args.short_jobs,
    )
    if args.json:
        with open(args.json, "w") as out:
            figure = {
                "held": args.held,
                "position": not args.no_position,
                "jobs": args.jobs,
                "batch": args.batch,
                "retain_done": args.retain_done,
                "short_runs": args.short_runs,
                "short_jobs": args.short_jobs,
            }
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
