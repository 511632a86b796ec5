"""`make bench`: every figure of docs/benchmarks.md, measured against one PostgreSQL
(DATABASE_URL, else the embedded one) in one run, so that ratios compare like with like.

Each repetition runs on a fresh database copied from a template that holds the schema and the
pre-enqueued jobs (enqueueing is never timed), and is checked afterwards from the database's
own tables: a repetition whose check fails is reported and never counted. Repetitions of
the cells that are compared are interleaved, so a burst of load on this shared machine
falls on both sides of a ratio rather than on one."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import bigtable, ceiling, cost, graphile, peers, report
from bench.common import (
    HANDLER,
    REPO,
    STRICT,
    STRICT_CEILING,
    Figure,
    Server,
    cpu_seconds_per_1000_jobs,
    cpu_ticks,
    load_average,
    log,
    make_sam_compileall_options,
    resolve_server,
    run_processes,
    run_workers,
    stolen_share,
    worker_env,
)
from pgdrain.settings import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY


@dataclass
class Config:
    # Five, not three: on a shared machine one slow repetition moved a median of three (and the
    # paired ratios) by 10-20%; the median of five stays put when one or two are off.
    reps: int = 5
    jobs: int = 20_000
    # 1,000 is larger than the threads (max_concurrency): claims of a whole batch, its jobs
    # waiting in the pool for a thread, pay where the database is the limit (runner/prefetch.py).
    batches: tuple[int, ...] = (10, 50, 100, 250, 1000)
    # issue 15's second one-process target, and the batch the RSS target is set at.
    target_batch: int = 250
    # Threads per process: PGDRAIN_CONCURRENCY allows 256; a round number below it.
    max_concurrency: int = 250
    processes: tuple[int, ...] = (1, 2, 4)
    default_batch: int = DEFAULT_BATCH_SIZE
    default_concurrency: int = DEFAULT_CONCURRENCY
    # Strict ordering: one job claimed and run at a time, in the queue's order.
    strict_batch: int = 1
    strict_concurrency: int = 1
    pgqueuer_jobs: int = 20_000
    pgqueuer_batches: tuple[int, ...] = (100, 250, 500, 1000)
    procrastinate_jobs: int = 2_000
    procrastinate_concurrency: tuple[int, ...] = (10, 30)
    procrastinate_processes: tuple[int, ...] = (1, 3)
    enqueue_jobs: int = 100_000
    empty_runs: int = 5
    import_runs: int = 10
    peers: bool = True
    bigtable_runs: int = 25
    # graphile-worker beside pgdrain (issue 43): pgdrain at these batch sizes, both with these
    # process counts, the same cfg.jobs, interleaved; graphile at its documented tuning.
    graphile_batches: tuple[int, ...] = (10, 250)
    graphile_processes: tuple[int, ...] = (1, 2)
    graphile_not_kept_batches: tuple[int, ...] = (10, 250, 1000)


@dataclass
class Results:
    config: Config
    figures: dict[str, Figure] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def figure(self, key: str, name: str, **params: Any) -> Figure:
        if key not in self.figures:
            self.figures[key] = Figure(name, params)
        return self.figures[key]


# -- templates -------------------------------------------------------------------------------


def _vacuum(url: str) -> None:
    """Leave every table vacuumed and analysed, as autovacuum would: the same for all."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def pgdrain_template(
    server: Server, jobs: int, kind: str = "noop", payload: dict[str, Any] | None = None
) -> str:
    from pgdrain.api.enqueue import build_job, enqueue_many
    from pgdrain.db.migrate import migrate

    name = server.create()
    with psycopg.connect(server.url(name), autocommit=True) as conn:
        migrate(conn)
        if jobs:
            with conn.transaction():
                enqueue_many(conn, (build_job(kind, payload) for _ in range(jobs)))
    _vacuum(server.url(name))
    return name


def pgqueuer_template(server: Server, jobs: int) -> str:
    name = server.create()
    peers.pgqueuer_install(server.url(name))
    peers.pgqueuer_enqueue(server.url(name), jobs)
    _vacuum(server.url(name))
    return name


def procrastinate_template(server: Server, jobs: int) -> str:
    name = server.create()
    peers.procrastinate_install(server.url(name))
    peers.procrastinate_enqueue(server.url(name), jobs)
    _vacuum(server.url(name))
    return name


# -- one repetition of each kind ---------------------------------------------------------------


def verify_pgdrain(url: str, jobs: int) -> tuple[bool, str]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            """SELECT count(*), count(*) FILTER (WHERE status = 'done' AND attempts = 1)
               FROM pgdrain.jobs"""
        ).fetchone()
    assert row is not None
    total, once = int(row[0]), int(row[1])
    return total == jobs and once == jobs, f"{once} of {total} rows done with attempts = 1"


def concurrency_for(cfg: Config, batch: int) -> int:
    """pgdrain claims for its free worker slots and those about to free, so other batch sizes
    than the default run with as many worker threads as jobs per claim (never fewer than the
    default), up to max_concurrency: a larger batch is claimed whole ahead of the threads."""
    if batch == cfg.default_batch:
        return cfg.default_concurrency
    return min(max(batch, cfg.default_concurrency), cfg.max_concurrency)


def verify_pgdrain_not_kept(url: str, jobs: int, claimed: int) -> tuple[bool, str]:
    """With done jobs not kept (PGDRAIN_RETAIN_DONE=0) no row is left to count: the table held
    `jobs` jobs, each needs a claim to be deleted, so `jobs` claims in all and no row left
    means each was claimed once."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone()
    assert row is not None
    left = int(row[0])
    return left == 0 and claimed == jobs, f"{left} rows left, {claimed} claims"


def rep_pgdrain(server: Server, template: str, fig: Figure, cfg: Config) -> None:
    batch, procs = fig.params["batch"], fig.params["processes"]
    argv = ["pgdrain", "--url", "", "--batch", str(batch)]
    argv += ["--concurrency", str(fig.params["concurrency"])]
    kept = fig.params.get("retain_done", 7.0) > 0
    argv += ["--retain-done", str(fig.params.get("retain_done", 7.0))]
    with server.fresh(template) as url:
        argv[2] = url
        wall, results = run_workers(procs, argv)
        done = sum(r["done"] for r in results)
        if kept:
            ok, detail = verify_pgdrain(url, cfg.jobs)
        else:
            ok, detail = verify_pgdrain_not_kept(url, cfg.jobs, sum(r["claimed"] for r in results))
        ok = ok and done == cfg.jobs and all(r["error"] is None for r in results)
    _record(fig, ok, cfg.jobs / wall, f"{detail}; drains counted {done}")
    if ok:
        fig.add_extra("rss_mb", max(r["rss_mb"] for r in results))
        # Every drain process's CPU together: what the jobs cost, however they were spread.
        cpu_s = sum(r["cpu_s"] for r in results)
        fig.add_extra("cpu_s", cpu_s)
        fig.add_extra("cpu_s_per_1000_jobs", cpu_seconds_per_1000_jobs(cpu_s, cfg.jobs))


def rep_ceiling(server: Server, template: str, fig: Figure, cfg: Config) -> None:
    batch, clients = fig.params["batch"], fig.params["processes"]
    per_client = ceiling.transactions_per_client(cfg.jobs, batch, clients)
    with server.fresh(template) as url:
        result = ceiling.run(url, cfg.jobs, batch, clients)
        ok, detail = verify_pgdrain(url, cfg.jobs)
    ok = ok and result.failed == 0 and result.transactions == per_client * clients
    seconds = result.transactions / result.tps
    _record(fig, ok, cfg.jobs / seconds, f"{detail}; {result.transactions} transactions")
    if ok:
        fig.add_extra("tps", result.tps)


def rep_graphile(server: Server, template: str, fig: Figure, cfg: Config) -> None:
    tuning = graphile.Tuning(**fig.params["tuning"])
    with server.fresh(template) as url:
        wall, results = run_processes(fig.params["processes"], graphile.command(url, tuning))
        check = graphile.verify(url, cfg.jobs, results)
    _record(fig, check.ok, cfg.jobs / wall, check.detail)
    if check.ok:
        fig.add_extra("rss_mb", max(r["rss_mb"] for r in results))
        cpu_s = sum(r["cpu_s"] for r in results)
        fig.add_extra("cpu_s_per_1000_jobs", cpu_seconds_per_1000_jobs(cpu_s, cfg.jobs))


def rep_pgqueuer(server: Server, template: str, fig: Figure, cfg: Config) -> None:
    batch, procs, driver = fig.params["batch"], fig.params["processes"], fig.params["driver"]
    argv = ["pgqueuer", "--url", "", "--driver", driver, "--batch", str(batch)]
    with server.fresh(template) as url:
        argv[2] = url
        wall, results = run_workers(procs, argv)
        executed = sum(r["executed"] for r in results)
        check = peers.pgqueuer_verify(url, cfg.pgqueuer_jobs, executed)
    _record(fig, check.ok, cfg.pgqueuer_jobs / wall, check.detail)


def rep_procrastinate(server: Server, template: str, fig: Figure, cfg: Config) -> None:
    conc, procs = fig.params["concurrency"], fig.params["processes"]
    with server.fresh(template) as url:
        wall, results = run_workers(
            procs, ["procrastinate", "--url", url, "--concurrency", str(conc)]
        )
        executed = sum(r["executed"] for r in results)
        check = peers.procrastinate_verify(url, cfg.procrastinate_jobs, executed)
    _record(fig, check.ok, cfg.procrastinate_jobs / wall, check.detail)


def _record(fig: Figure, ok: bool, value: float, detail: str) -> None:
    if ok:
        fig.add(value)
        log(f"  {fig.name} {fig.params}: {value:,.0f} jobs/s ({detail})")
    else:
        fig.rejected += 1
        fig.notes.append(f"rejected repetition: {detail}")
        log(f"  {fig.name} {fig.params}: CHECK FAILED, not counted ({detail})")


Step = Callable[[], None]


def interleaved(reps: int, steps: Sequence[Step]) -> None:
    """Repetition-major order: every cell once, then every cell again."""
    for rep in range(reps):
        log(f" repetition {rep + 1}/{reps} (load {load_average()})")
        for step in steps:
            step()


# -- the stages --------------------------------------------------------------------------------


def throughput(server: Server, cfg: Config, res: Results) -> None:
    log(f"templates: pgdrain with {cfg.jobs:,} no-op jobs")
    tpl = pgdrain_template(server, cfg.jobs)
    res.info["ceiling_shape"] = ceiling.shape()
    res.info["ceiling_script"] = ceiling.script()
    res.info["ceiling_arguments"] = {
        b: " ".join(ceiling.arguments(cfg.jobs, b, 1)) for b in cfg.batches
    }

    def pg(batch: int, procs: int, kind: str = "pgdrain", conc: int | None = None) -> Step:
        conc = concurrency_for(cfg, batch) if conc is None else conc
        fig = res.figure(
            f"{kind}/{batch}/{procs}", "pgdrain", batch=batch, processes=procs, concurrency=conc
        )
        return lambda: rep_pgdrain(server, tpl, fig, cfg)

    def ceil(batch: int, procs: int, kind: str = "ceiling") -> Step:
        fig = res.figure(f"{kind}/{batch}/{procs}", "ceiling", batch=batch, processes=procs)
        return lambda: rep_ceiling(server, tpl, fig, cfg)

    # The strict-ordering cell has keys of its own: its concurrency is not the one
    # concurrency_for gives its batch size, and the best batch is chosen among cfg.batches.
    strict = [
        pg(cfg.strict_batch, 1, STRICT, cfg.strict_concurrency),
        ceil(cfg.strict_batch, 1, STRICT_CEILING),
    ]
    log(
        "stage 1: pgdrain and its ceiling at each batch size, one process / client, and at "
        f"batch {cfg.strict_batch}, concurrency {cfg.strict_concurrency}"
    )
    interleaved(cfg.reps, [s for b in cfg.batches for s in (pg(b, 1), ceil(b, 1))] + strict)
    best = max(cfg.batches, key=lambda b: res.figures[f"pgdrain/{b}/1"].value)
    res.info["best_batch"] = best
    log(f"best batch size for pgdrain: {best}")

    more = [p for p in cfg.processes if p != 1]
    batches = sorted({cfg.default_batch, best})
    log(f"stage 2: pgdrain and ceiling with {more} processes at batch {batches}")
    interleaved(cfg.reps, [s for b in batches for p in more for s in (pg(b, p), ceil(b, p))])
    server.drop(tpl)


def peer_throughput(server: Server, cfg: Config, res: Results) -> None:
    res.info["peer_versions"] = peers.versions()
    log(
        f"templates: PgQueuer ({cfg.pgqueuer_jobs:,} jobs), Procrastinate "
        f"({cfg.procrastinate_jobs:,} jobs)"
    )
    pq_tpl = pgqueuer_template(server, cfg.pgqueuer_jobs)
    pr_tpl = procrastinate_template(server, cfg.procrastinate_jobs)

    def pq(driver: str, batch: int, procs: int) -> Step:
        fig = res.figure(
            f"pgqueuer-{driver}/{batch}/{procs}",
            f"PgQueuer ({driver})",
            batch=batch,
            processes=procs,
            driver=driver,
        )
        return lambda: rep_pgqueuer(server, pq_tpl, fig, cfg)

    def pr(conc: int, procs: int) -> Step:
        fig = res.figure(
            f"procrastinate/{conc}/{procs}", "Procrastinate", concurrency=conc, processes=procs
        )
        return lambda: rep_procrastinate(server, pr_tpl, fig, cfg)

    log("stage 3: peers, one process, each setting")
    steps = [pq("asyncpg", b, 1) for b in cfg.pgqueuer_batches]
    steps += [pr(c, 1) for c in cfg.procrastinate_concurrency]
    interleaved(cfg.reps, steps)
    pq_best = max(cfg.pgqueuer_batches, key=lambda b: res.figures[f"pgqueuer-asyncpg/{b}/1"].value)
    pr_best = max(
        cfg.procrastinate_concurrency, key=lambda c: res.figures[f"procrastinate/{c}/1"].value
    )
    res.info["pgqueuer_best_batch"] = pq_best
    res.info["procrastinate_best_concurrency"] = pr_best
    log(f"PgQueuer's best batch: {pq_best}; Procrastinate's best concurrency: {pr_best}")
    log("stage 4: peers at their best setting, more processes and the psycopg driver")
    steps = [pq("asyncpg", pq_best, 2), pq("psycopg", pq_best, 1), pq("psycopg", pq_best, 2)]
    steps += [pr(pr_best, p) for p in cfg.procrastinate_processes if p != 1]
    interleaved(cfg.reps, steps)
    server.drop(pq_tpl)
    server.drop(pr_tpl)


GRAPHILE = "graphile"  # the key prefix of the side-by-side section's figures


def graphile_templates(server: Server, cfg: Config) -> tuple[str, str]:
    """(pgdrain's template, graphile-worker's), each with cfg.jobs no-op jobs."""
    pg = pgdrain_template(server, cfg.jobs)
    gw = server.create()
    graphile.enqueue(server.url(gw), cfg.jobs)
    _vacuum(server.url(gw))
    return pg, gw


def graphile_side_by_side(server: Server, cfg: Config, res: Results, env: dict[str, Any]) -> None:
    """graphile-worker at its documented tuning beside pgdrain at cfg.graphile_batches, with
    cfg.graphile_processes processes each, every cell once per repetition."""
    why = graphile.missing()
    if why is not None:
        log(f"graphile-worker left out: {why}")
        res.info["graphile"] = {"missing": why}
        return
    for key in [k for k in res.figures if k.startswith(f"{GRAPHILE}/")]:
        del res.figures[key]  # --only graphile: the last run's cells are replaced
    log(f"stage: graphile-worker {graphile.version()} beside pgdrain, {cfg.jobs:,} jobs each")
    pg_tpl, gw_tpl = graphile_templates(server, cfg)
    tuning = graphile.DOCUMENTED

    def gw(procs: int) -> Step:
        fig = res.figure(
            f"{GRAPHILE}/graphile-worker/{procs}",
            "graphile-worker",
            processes=procs,
            tuning=dataclasses.asdict(tuning),
        )
        return lambda: rep_graphile(server, gw_tpl, fig, cfg)

    def pg(batch: int, procs: int, retain_done: float = 7.0) -> Step:
        kept = "" if retain_done else "/not-kept"
        fig = res.figure(
            f"{GRAPHILE}/pgdrain/{batch}/{procs}{kept}",
            "pgdrain (beside graphile-worker)",
            batch=batch,
            processes=procs,
            concurrency=concurrency_for(cfg, batch),
            retain_done=retain_done,
        )
        return lambda: rep_pgdrain(server, pg_tpl, fig, cfg)

    # pgdrain's best batch of stage 1 too (best against best), when it is another.
    batches = sorted({*cfg.graphile_batches, res.info.get("best_batch", cfg.default_batch)})
    steps: list[Step] = []
    for procs in cfg.graphile_processes:
        steps += [gw(procs)] + [pg(b, procs) for b in batches]
        # Done jobs not kept (PGDRAIN_RETAIN_DONE=0): what graphile-worker does with its own.
        steps += [pg(b, procs, retain_done=0.0) for b in cfg.graphile_not_kept_batches]
    interleaved(cfg.reps, steps)
    notes = res.info.get("graphile", {}).get("notes", [])  # written by hand: kept
    res.info["graphile"] = {
        "notes": notes,
        "env": env,
        "version": graphile.version(),
        "node": graphile.node_version(),
        "tuning": tuning.label(),
        "jobs": cfg.jobs,
        "reps": cfg.reps,
        "batches": batches,
        "not_kept_batches": list(cfg.graphile_not_kept_batches),
        "processes": list(cfg.graphile_processes),
    }
    server.drop(pg_tpl)
    server.drop(gw_tpl)


def empty_run(server: Server, cfg: Config, res: Results) -> None:
    via = "handler" if (HANDLER / "app.py").exists() else "drain"
    res.info["empty_via"] = via
    log(f"stage 5: empty scheduled run through {via}, {cfg.empty_runs} times")
    tpl = pgdrain_template(server, 0)
    fig = res.figure("empty", "empty run", via=via)
    for _ in range(cfg.empty_runs):
        for kind in ("connect", "empty"):
            name = server.create(tpl)
            url = server.url(name)
            before = server.xact_commit(name)
            argv = [kind, "--url", url] + (["--via", via] if kind == "empty" else [])
            _, (result,) = run_workers(1, argv)
            after = server.xact_commit(name)
            server.drop(name)
            fig.add_extra(f"{kind}_xacts", after - before)
            if kind == "empty":
                ok = result["ok"] and result["stop_reason"] == "empty"
                if ok:
                    fig.add(result["round_trips"])
                else:
                    fig.rejected += 1
                for key in ("round_trips", "statements", "total_ms", "connect_ms"):
                    fig.add_extra(key, result[key])
                fig.add_extra("run_ms", result["total_ms"] - result["connect_ms"])
    log(
        f"  round trips after connect {fig.value:g}, server transactions after connect "
        f"{fig.extra_median('empty_xacts') - fig.extra_median('connect_xacts'):g}, "
        f"{fig.extra_median('total_ms'):.1f} ms with connect, "
        f"{fig.extra_median('run_ms'):.1f} ms without"
    )
    server.drop(tpl)


def cold_start(cfg: Config, res: Results) -> None:
    app = HANDLER / "app.py"
    module = "app" if app.exists() else "pgdrain.runner.drain"
    res.info["import_module"] = module
    log(f"stage 6: cold start, `import {module}` in {cfg.import_runs} fresh processes")
    env = worker_env()
    env.update(
        POWERTOOLS_METRICS_NAMESPACE="pgdrain-bench",
        POWERTOOLS_SERVICE_NAME="pgdrain",
        AWS_DEFAULT_REGION="us-east-1",
        DATABASE_URL="postgresql://bench@127.0.0.1:1/unused",
        PGDRAIN_JOBS="jobs",
    )
    code = (
        f"import time; t, c = time.perf_counter(), time.process_time(); import {module}; "
        "print(time.perf_counter() - t, time.process_time() - c)"
    )
    fig = res.figure("import", f"import {module}")
    # The untimed run writes the bytecode the timed ones read, even where the environment
    # says not to (PYTHONDONTWRITEBYTECODE, set on this machine): else every timed import also
    # compiled the modules whose cached bytecode was missing or stale (10-17 ms here).
    compiling = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", code], env=compiling, check=True, capture_output=True)
    # The same import of the installed packages alone (psycopg, Powertools...), the modules
    # `import app` loads from them in the order it loads them: the part of the figure that
    # pgdrain's own code does not decide. Timed in turn with the whole import, run by run.
    dependencies = [
        name for name, file in loaded_outside_stdlib(compiling) if not file.is_relative_to(HANDLER)
    ]
    floor_code = (
        "import importlib, sys, time; names = sys.argv[1:]; t = time.perf_counter(); "
        "[importlib.import_module(name) for name in names]; print(time.perf_counter() - t)"
    )
    floor = []
    for _ in range(cfg.import_runs):
        began = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
        )
        process = time.perf_counter() - began
        wall, cpu = (float(x) for x in out.stdout.strip().splitlines()[-1].split())
        fig.add(wall * 1000.0)
        fig.add_extra("cpu_ms", cpu * 1000.0)
        fig.add_extra("process_ms", process * 1000.0)
        out = subprocess.run(
            [sys.executable, "-c", floor_code, *dependencies],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        floor.append(float(out.stdout.strip().splitlines()[-1]) * 1000.0)
    for ms in floor:
        fig.add_extra("dependencies_ms", ms)
    res.info["import_dependencies"] = sorted({name.split(".")[0] for name in dependencies})
    whole, cpu = fig.extra_median("process_ms"), fig.extra_median("cpu_ms")
    log(f"  import {module}: {fig.value:.0f} ms, CPU {cpu:.0f} ms (whole process {whole:.0f} ms)")
    log(f"  of which installed packages alone: {fig.extra_median('dependencies_ms'):.0f} ms")
    if module == "app":
        deployed_cold_start(cfg, res, env)


# Every module `import app` loads from outside the standard library, in the order it loads
# them: its name and its file, a line each.
_LOADED_OUTSIDE_STDLIB = """
import sys, sysconfig
stdlib = sysconfig.get_paths()["stdlib"]
import app
for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None) or ""
    if path and not path.startswith(stdlib):
        print(name, path, sep="\\t")
"""


def loaded_outside_stdlib(env: dict[str, str]) -> list[tuple[str, Path]]:
    """(name, file) of each module `import app` loads from outside the standard library
    (handler/'s own and the installed packages'), in the order it loads them."""
    out = subprocess.run(
        [sys.executable, "-c", _LOADED_OUTSIDE_STDLIB],
        env=env,
        cwd=HANDLER,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [(name, Path(path)) for name, path in (line.split("\t") for line in out.splitlines())]


def deployed_layout(env: dict[str, str], into: Path) -> None:
    """Copy into `into` the packages `import app` loads from outside the standard library
    (handler/'s own and the installed ones), as a function's package holds them: sources, no
    bytecode."""
    # What a function's package holds: the top-level packages and modules (SAM copies handler/
    # and installs handler/requirements.txt).
    top_level = [file for name, file in loaded_outside_stdlib(env) if "." not in name]
    for file in top_level:
        # A package is its directory (its __file__ is the __init__), a module its one file.
        if file.stem == "__init__":
            shutil.copytree(
                file.parent, into / file.parent.name, ignore=shutil.ignore_patterns("__pycache__")
            )
            for libs in file.parent.parent.glob(f"{file.parent.name}.libs"):  # a wheel's libpq
                shutil.copytree(libs, into / libs.name)
        else:
            shutil.copy2(file, into / file.name)


def _time_imports(env: dict[str, str], path: Path, runs: int) -> list[float]:
    """`import app` from `path` alone (`python -S`: no site-packages) in fresh processes, ms.
    No bytecode is written, as in a function (/var/task is read-only)."""
    code = "import time; t = time.perf_counter(); import app; print(time.perf_counter() - t)"
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(path), PYTHONDONTWRITEBYTECODE="1")
    times = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-S", "-c", code],
            env=env,
            cwd=path,
            check=True,
            capture_output=True,
            text=True,
        )
        times.append(float(out.stdout.strip().splitlines()[-1]) * 1000.0)
    return times


def deployed_cold_start(cfg: Config, res: Results, env: dict[str, str]) -> None:
    """`import app` as a deployed function runs it: from a package of sources (what `sam
    build` ships), then with the bytecode `make sam` adds (compileall, unchecked-hash)."""
    log("  as deployed: sources only, then with the bytecode `make sam` compiles")
    fig = res.figure("import_deployed", "import app, as deployed")
    with tempfile.TemporaryDirectory(prefix="pgdrain-deployed-") as tmp:
        package = Path(tmp)
        deployed_layout(env, package)
        sources = _time_imports(env, package, cfg.import_runs)
        subprocess.run(
            [sys.executable, "-m", "compileall", *make_sam_compileall_options(), str(package)],
            check=True,
            capture_output=True,
        )
        compiled = _time_imports(env, package, cfg.import_runs)
    for ms in compiled:
        fig.add(ms)
    for ms in sources:
        fig.add_extra("sources_ms", ms)
    log(f"  as deployed: {fig.extra_median('sources_ms'):.0f} ms, with bytecode {fig.value:.0f}")


def enqueue(server: Server, cfg: Config, res: Results) -> None:
    from pgdrain.api.enqueue import build_job, enqueue_many

    log(f"stage 7: enqueue_many of {cfg.enqueue_jobs:,} jobs")
    tpl = pgdrain_template(server, 0)
    fig = res.figure("enqueue", "enqueue_many", jobs=cfg.enqueue_jobs)
    for _ in range(cfg.reps):
        with server.fresh(tpl) as url, psycopg.connect(url, autocommit=True) as conn:
            began = time.perf_counter()
            jobs = [build_job("noop", {"n": i}) for i in range(cfg.enqueue_jobs)]
            built = time.perf_counter() - began
            began = time.perf_counter()
            with conn.transaction():
                ids = enqueue_many(conn, jobs)
            inserted = time.perf_counter() - began
            row = conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone()
            ok = len(ids) == cfg.enqueue_jobs and row is not None and row[0] == cfg.enqueue_jobs
            _record(fig, ok, cfg.enqueue_jobs / inserted, f"{row[0] if row else 0} rows")
            fig.add_extra("build_jobs_per_s", cfg.enqueue_jobs / built)
            fig.add_extra("with_build_jobs_per_s", cfg.enqueue_jobs / (built + inserted))
    server.drop(tpl)


def big_table(server: Server, cfg: Config, res: Results, env: dict[str, Any]) -> None:
    log("stage 8: the big table (2M finished, 200k queued): each end-of-run statement")
    figures = bigtable.measure(server, runs=cfg.bigtable_runs)
    figures["env"] = env  # its own: `--only bigtable` measures it apart from the rest
    res.info["bigtable"] = figures


# -- main ----------------------------------------------------------------------------------------


def environment(server: Server, source: str) -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "handler"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    from importlib.metadata import version

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "server": f"PostgreSQL {server.version()} ({source})",
        "pgbench": ceiling.version(),
        "python": platform.python_version(),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()}",
        "pgdrain": f"{version('pgdrain')} at {commit}{' + uncommitted changes' if dirty else ''}",
        "psycopg": version("psycopg"),
        "load_start": load_average(),
        "ticks_start": cpu_ticks(),
    }


def finish_environment(env: dict[str, Any]) -> None:
    """The load at the end, and the share of the CPU the host took over the run (stolen)."""
    env["load_end"] = load_average()
    start = env.pop("ticks_start", None)
    env["stolen"] = stolen_share(tuple(start) if start else None, cpu_ticks())


def parse(argv: Sequence[str]) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument(
        "--reps", type=int, default=Config.reps, help="repetitions per figure (>= 3)"
    )
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--no-peers", action="store_true", help="pgdrain and its ceiling only")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument(
        "--json",
        type=Path,
        default=REPO / "docs" / "benchmarks.json",
        help="where to write the raw figures (--render reads them back)",
    )
    parser.add_argument(
        "--render", type=Path, default=None, help="only rewrite --out from a --json file"
    )
    parser.add_argument(
        "--only",
        choices=["bigtable", "graphile"],
        default=None,
        help="run this section alone; the other sections' figures are read back from --json",
    )
    parser.add_argument(
        "--bigtable-runs", type=int, default=25, help="timed runs of each big-table statement"
    )
    args = parser.parse_args(argv)
    cfg = Config(
        reps=args.reps,
        jobs=args.jobs,
        peers=not args.no_peers,
        bigtable_runs=args.bigtable_runs,
    )
    return cfg, args


def load(path: Path) -> Results:
    """Results saved with --json."""
    data = json.loads(path.read_text())
    info = data["info"]
    # A field an older run saved that Config no longer has is left out.
    known = {f.name for f in dataclasses.fields(Config)}
    kwargs: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in info["config"].items() if k in known
    }
    config = Config(**kwargs)
    res = Results(config, info=info)
    for key, raw in data["figures"].items():
        fig = Figure(raw["name"], raw["params"], raw["values"], raw["reps"], raw["rejected"])
        fig.extra = {k: v["values"] for k, v in raw["extra"].items()}
        fig.notes = raw["notes"]
        res.figures[key] = fig
    if "ceiling_arguments" in info:
        info["ceiling_arguments"] = {int(k): v for k, v in info["ceiling_arguments"].items()}
    return res


def save(res: Results, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"info": res.info, "figures": {k: f.as_dict() for k, f in res.figures.items()}},
            indent=1,
            default=str,
        )
    )


def only(section: str, cfg: Config, args: argparse.Namespace) -> None:
    """One section alone (bigtable, graphile), merged into the figures of the last whole run.
    Its own settings (runs; jobs and repetitions for graphile) replace the saved ones."""
    if not args.json.exists():
        raise SystemExit(f"--only needs the last whole run's figures in {args.json}")
    res = load(args.json)
    admin_url, source = resolve_server()
    server = Server(admin_url)
    try:
        env = environment(server, source)
        if section == "bigtable":
            res.config.bigtable_runs = cfg.bigtable_runs
            big_table(server, res.config, res, env)
        else:
            # The whole run's jobs and repetitions stay with its own figures.
            section_cfg = dataclasses.replace(res.config, jobs=cfg.jobs, reps=cfg.reps)
            graphile_side_by_side(server, section_cfg, res, env)
            finish_environment(env)
    finally:
        server.drop_all()
    res.info["config"] = dataclasses.asdict(res.config)
    save(res, args.json)
    report.write(res, args.out)
    log(f"wrote {args.out} (the {section} section; the rest from {args.json})")


def main(argv: Sequence[str] | None = None) -> None:
    cfg, args = parse(sys.argv[1:] if argv is None else argv)
    if args.render:
        report.write(load(args.render), args.out)
        return
    if args.only:
        only(args.only, cfg, args)
        return
    began = time.monotonic()
    admin_url, source = resolve_server()
    server = Server(admin_url)
    res = Results(cfg)
    # `python -m bench.profile --write`, `bench.lifecycle --record`, `bench.scale --write` and
    # `bench.queue_flow --write-section` measure their sections apart, with their own date and
    # commit: a whole run keeps them.
    if args.json and args.json.exists():
        kept = json.loads(args.json.read_text()).get("info", {})
        for section in ("profile", "history", "lifecycle", "scale", "queue_flow", "flow"):
            if kept.get(section):
                res.info[section] = kept[section]
        # What the graphile section's notes say was measured apart: kept with the new cells.
        if kept.get("graphile", {}).get("notes"):
            res.info["graphile"] = {"notes": kept["graphile"]["notes"]}
    res.info["env"] = environment(server, source)
    res.info["lambda"] = dataclasses.asdict(cost.template_function(REPO / "template.yaml"))
    log(f"server: {res.info['env']['server']}; load {load_average()}")
    try:
        throughput(server, cfg, res)
        if cfg.peers:
            peer_throughput(server, cfg, res)
            graphile_side_by_side(server, cfg, res, res.info["env"])
        empty_run(server, cfg, res)
        cold_start(cfg, res)
        enqueue(server, cfg, res)
        big_table(server, cfg, res, res.info["env"])
    finally:
        server.drop_all()
    finish_environment(res.info["env"])
    res.info["checkpoint_after_copy"] = server.checkpoints
    res.info["elapsed_s"] = time.monotonic() - began
    res.info["config"] = dataclasses.asdict(cfg)
    if args.json:
        save(res, args.json)
    report.write(res, args.out)
    log(f"wrote {args.out} in {res.info['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
