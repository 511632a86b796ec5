"""Where a drain's time goes, at the default settings. One command, from the repository root:

    make .venv-bench/.installed    # once: the bench virtualenv (py-spy is installed there)
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv-bench/bin/python -m bench.profile --write

Without DATABASE_URL an embedded PostgreSQL is started. Without --write it only prints.
--write stores the figures in docs/benchmarks.json and rewrites docs/benchmarks.md (its
"Where a drain's time goes" section; the other sections are read back from the JSON). Not
part of `make bench`. Each measurement drains --jobs pre-enqueued no-op jobs on a fresh
database copied from one template, at pgdrain's default batch size and concurrency unless
--batch/--concurrency say otherwise:

1. The breakdown, no profiler attached, --reps times (medians): the drain runs in a worker
   process as in `make bench`. Measured: its wall time; its CPU time, every thread (getrusage);
   and, from pg_stat_database of its own database once its backend has exited, the time the
   server spent executing its statements (active_time) and how many it ran (xact_commit: each
   statement is its own transaction). Per job: Python = process CPU / jobs; database =
   active_time / jobs (and per statement, i.e. per batch); the rest = wall - both: neither the
   process's Python nor a statement was running (round-trip latency, waking threads, the
   scheduler of a shared machine).
2. cProfile, in this process: the drain loop's thread and each job thread get a profiler of
   their own; the functions with the most own time, per kind of thread. cProfile slows Python
   down (every call is timed), so its seconds are shares, not costs.
3. py-spy (if installed and allowed to attach): the worker process sampled, only the thread
   holding the GIL, so waiting on the socket or on a queue does not count: the CPU the drain
   spends, by function (self time).
4. The driver's share, --reps times, interleaved with 1. (medians): the same statement cycle
   from pgbench (the SQL ceiling of `make bench`, a C client), from psycopg alone (pgdrain's
   job_complete_and_claim in a loop on a connection set as the drain's, each claim completing
   the jobs the last one took, none run: the most one psycopg connection gives a drain), and
   from the drain (the runs of 1.). Per statement: wall, the backend's active time, and the
   client's CPU (pgbench's from getrusage of this process's children). Then the same three
   at batch 1, concurrency 1, strict ordering's setting (--strict-jobs jobs; not when --batch
   is 1 already)."""

from __future__ import annotations

import argparse
import collections
import cProfile
import itertools
import json
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import ceiling, run
from bench.common import (
    HANDLER,
    REPO,
    Server,
    cpu_seconds_per_1000_jobs,
    log,
    resolve_server,
    run_workers,
)
from pgdrain.settings import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY

# -- 1. the breakdown ----------------------------------------------------------------------------


def _db_counters(server: Server, dbname: str) -> tuple[float, int]:
    """(active_time ms, xact_commit) of one database, once no backend of it is left (a
    backend reports its counts when it exits)."""
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        for _ in range(500):
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)
            ).fetchone()
            if row and row[0] == 0:
                break
            time.sleep(0.01)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT active_time, xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)
        ).fetchone()
    assert row is not None
    return float(row[0]), int(row[1])


def _drain(url: str, batch: int, conc: int) -> tuple[float, float]:
    """A drain in a worker process, as `make bench` runs it: (wall s, its process's CPU s)."""
    argv = ["pgdrain", "--url", url, "--batch", str(batch), "--concurrency", str(conc)]
    wall, (result,) = run_workers(1, argv)
    if result["error"] is not None:
        raise SystemExit(f"the drain stopped with an error: {result['error']}")
    return wall, float(result["cpu_s"])


def breakdown(reps: list[dict[str, Any]], jobs: int) -> dict[str, float]:
    """Medians over the repetitions (run_once's), per job (µs) and per statement."""

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in reps))

    wall, cpu, db, statements = med("wall_s"), med("cpu_s"), med("db_active_s"), med("statements")
    return {
        "jobs_per_s": jobs / wall,
        "wall_us_per_job": wall / jobs * 1e6,
        "python_us_per_job": cpu / jobs * 1e6,
        "db_us_per_job": db / jobs * 1e6,
        "rest_us_per_job": (wall - cpu - db) / jobs * 1e6,
        "statements": statements,
        "jobs_per_statement": jobs / statements,
        "db_us_per_statement": db / statements * 1e6,
        "cpu_ms_per_1000_jobs": cpu_seconds_per_1000_jobs(cpu, jobs) * 1000.0,
    }


# -- 4. the driver's share ---------------------------------------------------------------------


def _claim_loop(url: str, batch: int) -> tuple[float, float]:
    """pgdrain's claim cycle through psycopg and nothing else, until a claim finds nothing:
    each claim completes the jobs the last one took; none is run. The connection is set as a
    drain's: psycopg's default prepare_threshold, the limits and planner
    settings kept by the connection. Returns (wall s, this thread's CPU s)."""
    from pgdrain.db import store
    from pgdrain.runner.claim_statement import UUID_MASK

    conn = psycopg.Connection.connect(url, autocommit=True)
    try:
        store.session_limits(conn, 600_000)
        claim_ids = itertools.count(uuid.uuid4().int)
        held: list[store.Held] = []
        began, cpu = time.perf_counter(), time.thread_time()
        while True:
            _, claimed = store.job_complete_and_claim_statement(
                held,
                ["default"],
                batch,
                "psycopg-alone",
                30.0,
                600.0,
                uuid.UUID(int=next(claim_ids) & UUID_MASK),
            ).run(conn)
            held = [job.held for job in claimed]
            if not held:  # this claim completed the last batch
                return time.perf_counter() - began, time.thread_time() - cpu
    finally:
        conn.close()


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(
    server: Server, template: str, jobs: int, batch: int, conc: int, who: str
) -> dict[str, Any]:
    """The jobs of a fresh copy of `template` completed by `who`: "pgdrain" (a drain, batch and
    concurrency as given), "psycopg" (psycopg alone) or "pgbench" (the ceiling's script, one
    client). Its wall s, the client's CPU s, the backend's active s and the statements."""
    name = server.create(template)
    try:
        url = server.url(name)
        active0, xacts0 = _db_counters(server, name)
        if who == "pgdrain":
            wall, cpu = _drain(url, batch, conc)
        elif who == "psycopg":
            wall, cpu = _claim_loop(url, batch)
        else:
            cpu0 = _children_cpu_s()
            result = ceiling.run(url, jobs, batch, 1)
            wall, cpu = result.transactions / result.tps, _children_cpu_s() - cpu0
        active1, xacts1 = _db_counters(server, name)
        ok, detail = run.verify_pgdrain(url, jobs)
    finally:
        server.drop(name)
    if not ok:
        raise SystemExit(f"{who} did not complete every job once: {detail}")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "db_active_s": (active1 - active0) / 1000.0,
        "statements": xacts1 - xacts0,
    }


def per_statement(reps: list[dict[str, Any]], jobs: int) -> dict[str, float]:
    """Medians over the repetitions: jobs/s, and per statement (µs) wall, client CPU, the
    backend's active time and the rest: breakdown's figures per job, times the jobs a
    statement carries."""
    b = breakdown(reps, jobs)
    per = b["jobs_per_statement"]
    return {
        "jobs_per_s": b["jobs_per_s"],
        "wall_us": b["wall_us_per_job"] * per,
        "client_cpu_us": b["python_us_per_job"] * per,
        "db_us": b["db_us_per_job"] * per,
        "rest_us": b["rest_us_per_job"] * per,
        "statements": b["statements"],
    }


def driver_share(
    server: Server, template: str, jobs: int, batch: int, conc: int, reps: int
) -> dict[str, Any]:
    """`reps` rounds of a drain, psycopg alone and pgbench, each on a fresh copy of
    `template`, each round in another order: their runs, and each one's medians per
    statement."""
    runs: dict[str, list[dict[str, Any]]] = {"pgdrain": [], "psycopg": [], "pgbench": []}
    clients = list(runs)
    for rep in range(reps):
        # Each goes first in turn: a statement's commit waits for the disk, and how long that
        # takes drifts from one run to the next (seen here: 290 to 600 µs a statement).
        for who in clients[rep % 3 :] + clients[: rep % 3]:
            runs[who].append(run_once(server, template, jobs, batch, conc, who))
        log(f"  {json.dumps({who: r[-1] for who, r in runs.items()})}")
    figures = {who: per_statement(r, jobs) for who, r in runs.items()}
    log(f"  per statement: {json.dumps(figures)}")
    return {"batch": batch, "concurrency": conc, "jobs": jobs, "runs": runs, "figures": figures}


# -- 2. cProfile -------------------------------------------------------------------------------


def cprofile_drain(url: str, batch: int, conc: int) -> tuple[pstats.Stats, pstats.Stats | None]:
    """Drain in this process with a profiler on the drain's thread and one on each job thread
    (a thread's first profile event swaps in a cProfile of its own). Returns (drain thread,
    job threads merged)."""
    if str(HANDLER) not in sys.path:
        sys.path.insert(0, str(HANDLER))
    from pgdrain import Budget, Settings, drain
    from pgdrain.api.registry import load_registry

    registry = load_registry("jobs")
    settings = Settings(batch_size=batch, concurrency=conc)
    thread_profiles: list[cProfile.Profile] = []

    def start_thread_profile(frame: Any, event: str, arg: Any) -> None:
        sys.setprofile(None)
        profile = cProfile.Profile()
        thread_profiles.append(profile)
        profile.enable()

    main = cProfile.Profile()
    threading.setprofile(start_thread_profile)
    try:
        main.enable()
        drain(settings, Budget.seconds(600.0), registry, url)
        main.disable()
    finally:
        threading.setprofile(None)
    jobs_stats = pstats.Stats(*thread_profiles) if thread_profiles else None
    return pstats.Stats(main), jobs_stats


# Calls in which a thread waits (for the database, for work, for an outcome): their own time
# is not work, so the tables rank the rest.
WAITS = (
    "wait (psycopg/connection.py",
    "<method 'get' of '_queue.SimpleQueue' objects>",
    "<method 'acquire' of '_thread.lock' objects>",
    "<built-in method time.sleep>",
    "<built-in method select.select>",
)


def top_functions(stats: pstats.Stats, top: int) -> dict[str, Any]:
    """The thread's profiled seconds, the share of them spent waiting, and the functions with
    the most own time among the rest, as shares of the rest."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values()) or 1.0
    named = [(_function_name(key), entry[2]) for key, entry in raw.items()]
    waiting = sum(t for name, t in named if name.startswith(WAITS))
    working = [(name, t) for name, t in named if not name.startswith(WAITS)]
    busy = sum(t for _, t in working) or 1.0
    rows = sorted(working, key=lambda nt: nt[1], reverse=True)[:top]
    return {
        "total_s": total,
        "waiting_share": waiting / total,
        "top": [(name, t / busy) for name, t in rows],
    }


def _function_name(key: tuple[str, int, str]) -> str:
    path, line, name = key
    if path == "~":
        return name  # a built-in: "<method 'get' of '_queue.SimpleQueue' objects>"
    parts = Path(path).parts
    return f"{name} ({'/'.join(parts[-2:])}:{line})"


# -- 3. py-spy ---------------------------------------------------------------------------------


def pyspy_path() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


def pyspy_top(raw: Path, top: int) -> tuple[int, list[tuple[str, float]]]:
    """(samples, the functions with the most self samples and their share) of a py-spy raw
    (collapsed stacks) file, the imports left out (they happen before the clock starts)."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("thread (", "process "))]
        if not frames or any("importlib._bootstrap" in f for f in frames):
            continue
        count = int(count_text)
        total += count
        own[_short(frames[-1])] += count
    return total, [(name, n / total) for name, n in own.most_common(top)]


def _short(frame: str) -> str:
    """`fn (path/to/module.py:123)` -> `fn (to/module.py)`: one entry per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(path).parts[-2:])})"


def pyspy_drain(
    server: Server, template: str, spy: str, jobs: int, batch: int, conc: int, top: int
) -> tuple[int, list[tuple[str, float]], float]:
    raw = Path(tempfile.mkstemp(prefix="pgdrain-profile-", suffix=".txt")[1])
    try:
        with server.fresh(template) as url:
            prefix = [spy, "record", "--format", "raw", "--threads", "--gil", "--rate", "1000"]
            prefix += ["--nonblocking", "--output", str(raw), "--"]
            argv = ["pgdrain", "--url", url, "--batch", str(batch), "--concurrency", str(conc)]
            wall, _ = run_workers(1, argv, prefix=prefix)
            ok, detail = run.verify_pgdrain(url, jobs)
        if not ok:
            raise SystemExit(f"the drain under py-spy did not process every job once: {detail}")
        samples, rows = pyspy_top(raw, top)
        return samples, rows, jobs / wall
    finally:
        raw.unlink(missing_ok=True)


# -- the report --------------------------------------------------------------------------------


def _table(rows: list[tuple[str, float]]) -> list[str]:
    out = ["| function | share |", "|---|---:|"]
    out += [f"| `{name}` | {share:.1%} |" for name, share in rows]
    return out


def markdown(prof: dict[str, Any]) -> list[str]:
    b, env = prof["breakdown"], prof["env"]
    out = ["## Where a drain's time goes (default settings)", ""]
    out.append(
        f"Measured at pgdrain {env['pgdrain']} on {env['date']} ({env['server']}; load "
        f"{env['load_start']}; {env.get('commit', '')}) by `python -m bench.profile --write` "
        "(the command and what it "
        "measures: the top of `bench/profile.py`). A drain of "
        f"{prof['jobs']:,} pre-enqueued no-op jobs at batch {prof['batch']}, concurrency "
        f"{prof['concurrency']}, in its own process; medians of {prof['reps']} runs with no "
        "profiler attached."
    )
    out.append("")
    out.append("| per job | µs | share |")
    out.append("|---|---:|---:|")
    wall = b["wall_us_per_job"]
    for label, key in (
        ("Python: the drain process's CPU, all threads (getrusage)", "python_us_per_job"),
        (
            "database: its backend active (pg_stat_database.active_time)",
            "db_us_per_job",
        ),
        ("the rest: waiting (round trips, waking threads, the scheduler)", "rest_us_per_job"),
        ("wall", "wall_us_per_job"),
    ):
        out.append(f"| {label} | {b[key]:.1f} | {b[key] / wall:.0%} |")
    out.append("")
    out.append(
        f"{b['jobs_per_s']:,.0f} jobs/s; {b['statements']:,.0f} statements "
        f"({b['jobs_per_statement']:.1f} jobs each: one `job_complete_and_claim` per batch, "
        f"and the run's few others), {b['db_us_per_statement']:.0f} µs of database time "
        f"each. CPU per 1,000 no-op jobs: **{b['cpu_ms_per_1000_jobs']:.0f} ms** of the "
        "drain process (the database's own CPU not included). "
        + (
            "Python and the database overlap: their times add up to the wall time or more "
            "(the job threads run what was claimed ahead while a statement is out, and the "
            "drain's thread waits for it on the socket). "
            if b["rest_us_per_job"] <= 0
            else "The drain's thread and the database take turns: while a statement is out "
            "the drain's thread waits for it (the job threads run what was claimed ahead "
            "meanwhile), and while the drain's Python runs (outcomes, the next statement's "
            "parameters, the last one's rows) the database waits. "
        )
        + "Each statement goes alone, its own implicit transaction on a connection "
        "that keeps its limits (a refresh every 0.5 s adds BEGIN, the limits and COMMIT to "
        "one of them); what its backend spends outside the "
        "active state (the commit's flush, the messages) falls in the rest."
    )
    out.append("")
    if prof.get("drivers"):
        out += _drivers_markdown(prof["drivers"], prof["reps"])
    for key, who in (
        ("cprofile_main", "the drain's own thread (the loop that talks to the database)"),
        ("cprofile_jobs", f"the {prof['concurrency']} job threads together"),
    ):
        cp = prof.get(key)
        if not cp:
            continue
        out.append(
            f"cProfile, {who}: {cp['waiting_share']:.0%} of its profiled time is spent "
            "waiting (on the socket for a statement's result, or on a queue for work or "
            "outcomes); the functions with the most own time in the rest, as shares of it:"
        )
        out.append("")
        out += _table([(n, s) for n, s in cp["top"]])
        out.append("")
    if prof.get("pyspy"):
        spy = prof["pyspy"]
        out.append(
            f"py-spy, the thread holding the GIL only ({spy['samples']:,} samples at 1 kHz; "
            f"{spy['jobs_per_s']:,.0f} jobs/s under it): where the drain process spends its "
            "CPU, by function (self time)."
        )
        out.append("")
        out += _table([(n, s) for n, s in spy["top"]])
        out.append("")
    return out


def _drivers_markdown(shares: list[dict[str, Any]], reps: int) -> list[str]:
    out = [
        "The driver's share: the same statement cycle from three clients, one connection each, "
        "on fresh copies of the same database, each repetition beside a drain (medians of "
        f"{reps}; the first table's drains are those above): pgbench, the SQL ceiling of `make "
        "bench` (a C client); *psycopg alone*, pgdrain's `job_complete_and_claim` in a loop on "
        "a connection set as the drain's, each claim completing the jobs the last one took, "
        "none run (`bench/profile.py` `_claim_loop`); and the drain.",
        "",
    ]
    for share in shares:
        out += _driver_table(share)
    out.append(
        "Per statement, psycopg alone's CPU against pgbench's is the driver's own work (the "
        "parameters dumped, the message sent, the reply read and its rows loaded), in series "
        "with the round trip: psycopg alone and pgbench carry one statement at a time on "
        "their connection. The drain sends its next claim before it reads the last one's reply "
        "(`handler/pgdrain/db/pipeline.py`), so its own work overlaps the database's; not at batch "
        "1, concurrency 1 (strict ordering holds one job at a time). pgbench's CPU includes its "
        "start and its connect."
    )
    out.append("")
    return out


def _driver_table(share: dict[str, Any]) -> list[str]:
    figures = share["figures"]
    pgbench, alone, drain = figures["pgbench"], figures["psycopg"], figures["pgdrain"]
    setting = f"batch {share['batch']}, concurrency {share['concurrency']}"
    out = [
        f"| per statement, {setting} ({share['jobs']:,} jobs) | pgbench | psycopg alone | "
        "pgdrain |",
        "|---|---:|---:|---:|",
    ]
    rows = (
        ("jobs/s", "jobs_per_s", "{:,.0f}"),
        ("wall, µs", "wall_us", "{:.0f}"),
        (
            "the client's CPU, µs (pgbench's process; psycopg alone's thread; the drain's "
            "process, every thread)",
            "client_cpu_us",
            "{:.0f}",
        ),
        ("the backend active, µs", "db_us", "{:.0f}"),
        ("the rest (wall less both; below 0 where they overlap), µs", "rest_us", "{:.0f}"),
    )
    for label, key, fmt in rows:
        cells = " | ".join(fmt.format(x[key]) for x in (pgbench, alone, drain))
        out.append(f"| {label} | {cells} |")
    of = [x["jobs_per_s"] / pgbench["jobs_per_s"] for x in (pgbench, alone, drain)]
    out.append("| jobs/s, of pgbench's | " + " | ".join(f"{r:.2f}" for r in of) + " |")
    out.append("")
    out.append(
        f"At {setting}, psycopg alone gets **{of[1]:.2f}x** pgbench's jobs/s from one "
        f"connection, the drain **{of[2]:.2f}x**: {of[2] / of[1]:.2f}x of psycopg alone. "
        f"psycopg alone spends {alone['client_cpu_us']:.0f} µs of CPU a statement where "
        f"pgbench spends {pgbench['client_cpu_us']:.0f}."
    )
    out.append("")
    return out


def _show(url: str, setting: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
    return str(row[0]) if row else "?"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3, help="runs of the breakdown")
    parser.add_argument(
        "--strict-jobs",
        type=int,
        default=5_000,
        help="jobs for the driver's share at batch 1, concurrency 1 too (0: not measured)",
    )
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--no-py-spy", action="store_true")
    parser.add_argument("--write", action="store_true", help="into docs/benchmarks.md")
    parser.add_argument("--json", type=Path, default=REPO / "docs" / "benchmarks.json")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    admin, source = resolve_server()
    server = Server(admin)
    env = run.environment(server, source)
    # A statement's database time includes its commit: what that costs depends on these.
    env["commit"] = ", ".join(
        f"{name} {_show(admin, name)}"
        for name in ("synchronous_commit", "fsync", "wal_sync_method")
    )
    prof: dict[str, Any] = {
        "env": env,
        "jobs": args.jobs,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "reps": args.reps,
    }
    try:
        template = run.pgdrain_template(server, args.jobs)
        log(f"breakdown: {args.reps} drains of {args.jobs:,} no-op jobs, no profiler")
        log("  each beside psycopg alone and pgbench (the driver's share)")
        share = driver_share(server, template, args.jobs, args.batch, args.concurrency, args.reps)
        reps = share["runs"]["pgdrain"]
        prof["breakdown_runs"] = reps
        prof["breakdown"] = breakdown(reps, args.jobs)
        log(f"  per job: {json.dumps(prof['breakdown'])}")
        prof["drivers"] = [share]
        if args.batch != 1 and args.strict_jobs:
            log(f"the driver's share at batch 1, concurrency 1 ({args.strict_jobs:,} jobs)")
            strict = run.pgdrain_template(server, args.strict_jobs)
            prof["drivers"].append(driver_share(server, strict, args.strict_jobs, 1, 1, args.reps))

        log("cProfile: one drain in this process")
        with server.fresh(template) as url:
            main_stats, job_stats = cprofile_drain(url, args.batch, args.concurrency)
            ok, detail = run.verify_pgdrain(url, args.jobs)
        if not ok:
            raise SystemExit(f"the profiled drain did not process every job once: {detail}")
        prof["cprofile_main"] = top_functions(main_stats, args.top)
        prof["cprofile_jobs"] = top_functions(job_stats, args.top) if job_stats else None

        spy = None if args.no_py_spy else pyspy_path()
        if spy is not None:
            log("py-spy: one drain in a worker process")
            try:
                samples, rows, rate = pyspy_drain(
                    server, template, spy, args.jobs, args.batch, args.concurrency, args.top
                )
                prof["pyspy"] = {"samples": samples, "top": rows, "jobs_per_s": rate}
            except (subprocess.SubprocessError, RuntimeError, TimeoutError) as exc:
                log(f"  py-spy did not run here: {exc}")
    finally:
        server.drop_all()

    prof["markdown"] = markdown(prof)
    print("\n".join(prof["markdown"]))
    if args.write:
        from bench import report

        res = run.load(args.json)
        res.info["profile"] = prof
        run.save(res, args.json)
        report.write(res, args.out)
        log(f"wrote {args.out} (its profile section; the rest from {args.json})")


if __name__ == "__main__":
    main()
