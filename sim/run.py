"""Orchestration: for each trace, each system gets its own database, its own stand-in and its own
application (driver); the systems of a trace run side by side (the backlog one at a time, as it
loads the machine), from a common simulated time 0, until every job is done and the trace's
minimum duration has passed (or its maximum). Then the figures are read from each database."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgdrain.db.migrate import migrate
from pgdrain.settings import Settings
from sim import measure, report, template, traces
from sim.jobs import ENV_ID_VARIABLE, LEDGER_DDL, LEDGER_VARIABLE, SCALE_VARIABLE
from sim.launcher import Pool
from sim.standin import ControlPlane, PlaneConfig
from sim.timescale import DEFAULT_FACTOR, Scale

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = ("pgdrain", "schedule-5min", "poller")
BASELINE_RATE_S = 300.0  # today's default ScheduleRate
ACCOUNT_CONCURRENCY = template.DEFAULT_ACCOUNT_CONCURRENCY
SIM_QUEUES = ",".join(traces.QUEUES)
KICK_VARIABLES = (
    "PGDRAIN_KICK_DEBOUNCE_SECONDS",
    "PGDRAIN_LEASE_SECONDS",
    "PGDRAIN_WAKE_PRECISION_SECONDS",
)
START_LEAD_S = 0.5  # real seconds between starting the pieces and simulated time 0
CHECK_INTERVAL_S = 0.5  # real


@dataclass
class System:
    name: str
    trace: traces.Trace
    database: str
    url: str
    log: IO[bytes]
    plane: ControlPlane | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    driver: subprocess.Popen[bytes] | None = None


@dataclass(frozen=True)
class Options:
    size: str
    factor: float
    trace_names: tuple[str, ...]
    systems: tuple[str, ...]
    out: Path
    db_prefix: str
    backlog: int | None
    seed: int
    keep_databases: bool
    plot: bool
    logs: Path
    report_from: Path | None = None


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse(argv)
    if options.report_from is not None:
        figures, meta = report.read_json(options.report_from)
        print(report.table(figures))
        report.write_markdown(options.out / "simulate.md", figures, meta)
        if options.plot:
            report.write_plot(options.out / "simulate.png", figures)
        return 0
    started = time.time()
    base_url, cleanup = _server()
    function = template.read(ROOT / "template.yaml")
    size = _size(options)
    built = [traces.build(name, size, options.seed) for name in options.trace_names]
    for trace in built:
        factor = trace.scale or options.factor
        print(
            f"trace {trace.name}: {trace.jobs} jobs, {trace.min_duration_s / 60:g} simulated"
            f" minutes at least ({trace.min_duration_s / factor:.0f} s real)",
            flush=True,
        )
    try:
        # The smoke form runs every trace at once, to be quick; the full form runs them one
        # after the other (they load the machine), except an idle trace, which runs beside them,
        # and then a trace that needs the machine to itself.
        together = [t for t in built if size.traces_in_parallel or t.alongside]
        alone = [t for t in built if t not in together and t.alone]
        in_turn = [t for t in built if t not in together and t not in alone]
        with ThreadPoolExecutor(len(together) + 1) as pool:
            futures = [pool.submit(_run_trace, t, function, base_url, options) for t in together]
            sequence = pool.submit(
                lambda: [_run_trace(t, function, base_url, options) for t in in_turn]
            )
            by_name = {t.name: f.result() for t, f in zip(together, futures, strict=True)}
            by_name |= {t.name: r for t, r in zip(in_turn, sequence.result(), strict=True)}
        by_name |= {t.name: _run_trace(t, function, base_url, options) for t in alone}
        per_trace = [by_name[t.name] for t in built]
    finally:
        cleanup()
    results = [figure for figures in per_trace for figure in figures]
    elapsed = (time.time() - started) / 60
    print()
    print(report.table(results))
    for text, measured, ok in report.targets(results):
        print(f"  {'-' if ok is None else 'ok' if ok else 'MISSED'}: {text}: {measured}")
    meta = {
        "commit": _commit(),
        "size": options.size,
        "scale": options.factor,
        "real_minutes": round(elapsed, 1),
        "machine": f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}",
        "generated": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "sparse_minutes": size.sparse_minutes,
        "traces_doc": _traces_doc(size, options.seed),
        "notes": _notes(results),
    }
    options.out.mkdir(parents=True, exist_ok=True)
    report.write_json(options.out / "simulate.json", results, meta)
    report.write_markdown(options.out / "simulate.md", results, meta)
    plotted = options.plot and report.write_plot(options.out / "simulate.png", results)
    print(
        f"\nwritten to {options.out}/simulate.{{md,json{',png' if plotted else ''}}}"
        f" in {elapsed:.1f} real minutes; logs in {options.logs}"
    )
    return 0


def _parse(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="the small form (< 2 minutes)")
    parser.add_argument(
        "--scale",
        type=float,
        default=DEFAULT_FACTOR,
        help="simulated seconds per real second (default %(default)g)",
    )
    parser.add_argument("--traces", default=",".join(traces.NAMES))
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where simulate.md/.json/.png go (default docs/; smoke: $TMPDIR/pgdrain-sim-smoke)",
    )
    parser.add_argument("--db-prefix", default="pgdrain_sim")
    parser.add_argument("--backlog", type=int, default=None, help="backlog size (jobs)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--keep-databases", action="store_true")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--logs", type=Path, default=None, help="the processes' logs")
    parser.add_argument(
        "--report-from",
        type=Path,
        default=None,
        help="write simulate.md and .png again from this simulate.json, without a run",
    )
    args = parser.parse_args(argv)
    names = tuple(n.strip() for n in args.traces.split(",") if n.strip())
    systems = tuple(n.strip() for n in args.systems.split(",") if n.strip())
    bad = [n for n in names if n not in traces.NAMES] + [s for s in systems if s not in SYSTEMS]
    if bad or not names or not systems or args.scale <= 0:
        parser.exit(2, f"python -m sim: unknown or missing trace/system/scale: {bad or 'none'}\n")
    size = "smoke" if args.smoke else "full"
    smoke_out = Path(tempfile.gettempdir()) / "pgdrain-sim-smoke"
    out = args.out or (smoke_out if args.smoke else ROOT / "docs")
    logs = args.logs or Path(tempfile.mkdtemp(prefix="pgdrain-sim-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    return Options(
        size,
        args.scale,
        names,
        systems,
        out,
        args.db_prefix,
        args.backlog,
        args.seed,
        args.keep_databases,
        not args.no_plot,
        logs,
        args.report_from,
    )


def _size(options: Options) -> traces.Size:
    size = traces.SMOKE if options.size == "smoke" else traces.FULL
    return replace(size, backlog_jobs=options.backlog) if options.backlog else size


def _server() -> tuple[str, Any]:
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        return _without_tls_when_the_server_has_none(url), lambda: None
    from pgdrain.cli import embedded

    folder = Path(tempfile.mkdtemp(prefix="pgdrain-sim-pg-"))
    url = embedded.start(folder, keep_running=False)
    return url, lambda: shutil.rmtree(folder, ignore_errors=True)


def _without_tls_when_the_server_has_none(url: str) -> str:
    """The function runs with template.yaml's PGSSLMODE (require): against a server without
    TLS over TCP, every run would fail to connect and the trace would report its jobs lost.
    The simulator measures the control plane, not TLS, so its URL then says sslmode=disable
    (a sslmode in the URL wins over PGSSLMODE), and it says so. The embedded server is on a
    Unix socket, where libpq uses no TLS at any sslmode."""
    if "sslmode" in conninfo_to_dict(url):
        return url
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW ssl").fetchone()
    if row is None or row[0] == "on":
        return url
    print("DATABASE_URL's server has no TLS: the function connects with sslmode=disable")
    return make_conninfo(url, sslmode="disable")


def _run_trace(
    trace: traces.Trace, function: template.FunctionModel, base_url: str, options: Options
) -> list[measure.Figures]:
    if trace.scale is not None:  # every duration of this trace, its processes' included
        options = replace(options, factor=trace.scale)
    systems = [_setup(trace, name, base_url, options) for name in options.systems]
    groups = [systems] if trace.systems_in_parallel else [[s] for s in systems]
    results: list[measure.Figures] = []
    try:
        for group in groups:
            results.extend(_run_group(trace, group, function, base_url, options))
    finally:
        for system in systems:
            system.log.close()
            if not options.keep_databases:
                _drop(base_url, system.database)
    return results


def _setup(trace: traces.Trace, name: str, base_url: str, options: Options) -> System:
    database = f"{options.db_prefix}_{trace.name}_{name.replace('-', '_')}"
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    url = make_conninfo(base_url, dbname=database)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        for statement in (*LEDGER_DDL, *measure.INSTRUMENT_DDL):
            conn.execute(statement)
    log = open(options.logs / f"{trace.name}-{name}.log", "ab")  # closed after the trace
    return System(name, trace, database, url, log)


def _drop(base_url: str, database: str) -> None:
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


def _base_env(factor: float) -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env |= {
        "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(ROOT)]),
        "AWS_ACCESS_KEY_ID": "sim",
        "AWS_SECRET_ACCESS_KEY": "sim",
        "AWS_REGION": template.REGION,
        "AWS_DEFAULT_REGION": template.REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        SCALE_VARIABLE: f"{factor:g}",
    }
    return env


def _function_env(
    system: System, function: template.FunctionModel, plane_url: str, factor: float
) -> dict[str, str]:
    env = _base_env(factor) | template.scaled_environment(function.environment, factor)
    if system.name == "schedule-5min":
        env["PGDRAIN_MAX_RUNS"] = "1"  # today's single chain, should the handler fan out
        env["PGDRAIN_SCHEDULE_RATE"] = ""  # its fixed 5-minute grid, which nothing moves
    env |= {
        "DATABASE_URL": system.url,
        "PGDRAIN_JOBS": "sim.jobs",
        "PGDRAIN_QUEUES": SIM_QUEUES,
        "AWS_ENDPOINT_URL_LAMBDA": plane_url,
        "AWS_ENDPOINT_URL_SCHEDULER": plane_url,
        "AWS_LAMBDA_FUNCTION_NAME": function.name,
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_FUNCTION_TIMEOUT": f"{function.timeout_s / factor:g}",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
    }
    return env | _ledger_env(system.trace)


def _ledger_env(trace: traces.Trace) -> dict[str, str]:
    return {LEDGER_VARIABLE: "buffered"} if trace.buffered_ledger else {}


def _prepared(system: System, config: PlaneConfig, size: traces.Size) -> int:
    """Environments initialised before the trace: as many as can run at once for pgdrain (the
    smoke form fewer, to start quickly); the single chain runs one at a time."""
    if system.name != "pgdrain":
        return 1
    return min(config.concurrency, size.prepared_environments)


def _plane(system: System, function: template.FunctionModel, options: Options) -> ControlPlane:
    reserved = function.reserved_concurrency or ACCOUNT_CONCURRENCY
    faults = system.trace.faults
    if system.name == "pgdrain":
        config = PlaneConfig(
            function_name=function.name,
            function_arn=function.arn,
            timeout_s=function.timeout_s,
            concurrency=min(reserved, ACCOUNT_CONCURRENCY),
            max_retry_attempts=function.max_retry_attempts,
            max_event_age_s=function.max_event_age_s,
            rate_s=function.schedule_rate_s,
            faults=faults,
        )
    else:  # today's default without kicks: the 5-minute schedule, no retries, no wake-ups
        config = PlaneConfig(
            function_name=function.name,
            function_arn=function.arn,
            timeout_s=function.timeout_s,
            concurrency=min(reserved, ACCOUNT_CONCURRENCY),
            max_retry_attempts=0,
            max_event_age_s=function.max_event_age_s,
            rate_s=BASELINE_RATE_S,
            scheduler_enabled=False,
            faults=faults,  # its continuations call Invoke too; it creates no schedules
        )
    provisional = Scale(options.factor)
    # The pool needs the plane's URL in its environment, the plane needs the pool: the plane
    # is made with an empty pool, which is replaced before it starts.
    plane = ControlPlane(config, provisional, Pool({}, ROOT, system.log, prefix="x", prepared=0))
    env = _function_env(system, function, plane.url, options.factor)
    Settings.from_env(env)  # a scale that takes a setting out of its range fails here, at once
    plane.pool = Pool(
        env,
        ROOT,
        system.log,
        prefix=system.name,
        prepared=_prepared(system, config, _size(options)),
        factor=options.factor,
    )
    plane.pool.start()  # the warm environments, initialised before the trace starts
    return plane


def _run_group(
    trace: traces.Trace,
    group: list[System],
    function: template.FunctionModel,
    base_url: str,
    options: Options,
) -> list[measure.Figures]:
    for system in group:
        if system.name != "poller":
            system.plane = _plane(system, function, options)
    scale = Scale(options.factor, time.time() + START_LEAD_S)
    sampler = measure.Sampler(base_url, [s.database for s in group])
    sampler.start()
    for system in group:
        _start(system, function, scale, options)
    try:
        _wait(trace, group, scale)
    finally:
        for system in group:
            _stop(system)
        sampler.stop()
    results = []
    for system in group:
        with psycopg.connect(system.url, autocommit=True) as conn:
            plane = system.plane
            common: dict[str, Any] = {
                "system": system.name,
                "conn": conn,
                "scale": scale,
                "samples": sampler.samples[system.database],
                "kills": plane.kills if plane else {},
                "invocations": plane.counters.invocations if plane else 0,
                "peak_runs": plane.counters.peak_runs if plane else 1,
            }
            if trace.name == "backlog":
                results.append(measure.figures(trace=trace.name, queue=traces.QUEUE, **common))
                results.append(
                    measure.figures(trace="backlog-trickle", queue=traces.TRICKLE, **common)
                )
            else:
                results.append(measure.figures(trace=trace.name, **common))
        if plane:
            print(f"  {system.name}: {plane.counters}", flush=True)
    return results


def _start(
    system: System, function: template.FunctionModel, scale: Scale, options: Options
) -> None:
    scaled = template.scaled_environment(function.environment, options.factor)
    driver_env = _base_env(options.factor) | {
        "DATABASE_URL": system.url,
        "PGDRAIN_QUEUES": SIM_QUEUES,
        "PGDRAIN_FUNCTION_NAME": function.name if system.name == "pgdrain" else "",
        # Without the function, kick() sends nothing (not a NOTIFY for a worker).
        "PGDRAIN_KICK": "auto" if system.name == "pgdrain" else "off",
    }
    # What kick() reads besides the function's name, scaled as the function's are: the
    # debounce window, the hold (a third of the lease) and the wake-up rounding (a kicked
    # delayed job's wake-up moment is the application's to round).
    for name in KICK_VARIABLES:
        if name in scaled:
            driver_env[name] = scaled[name]
    if system.plane is not None:
        driver_env["AWS_ENDPOINT_URL_LAMBDA"] = system.plane.url
        driver_env["AWS_ENDPOINT_URL_SCHEDULER"] = system.plane.url
        system.plane.start(scale)
    else:
        poller_env = _base_env(options.factor) | template.scaled_environment(
            function.environment, options.factor
        )
        poller_env |= {
            "DATABASE_URL": system.url,
            "PGDRAIN_JOBS": "sim.jobs",
            "PGDRAIN_QUEUES": SIM_QUEUES,
            ENV_ID_VARIABLE: "poller",
        } | _ledger_env(system.trace)
        system.processes.append(_spawn(["-m", "sim.poller"], poller_env, system.log))
    command = [
        "-m",
        "sim.driver",
        "--trace",
        system.trace.name,
        "--size",
        options.size,
        "--seed",
        str(options.seed),
        "--scale",
        f"{options.factor:g}",
        "--origin",
        repr(scale.origin),
    ]
    if options.backlog:
        command += ["--backlog", str(options.backlog)]
    system.driver = _spawn(command, driver_env, system.log)


def _spawn(args: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *args], env=env, cwd=ROOT, stdout=log, stderr=log)


def _wait(trace: traces.Trace, group: list[System], scale: Scale) -> None:
    expected = trace.jobs
    with_conns = [
        (
            s,
            psycopg.connect(
                s.url, autocommit=True, application_name=measure.SAMPLER_APPLICATION_NAME
            ),
        )
        for s in group
    ]
    try:
        while True:
            time.sleep(CHECK_INTERVAL_S)
            now = scale.now()
            if now >= trace.max_duration_s:
                print(
                    f"  stopped at the maximum ({trace.max_duration_s / 60:g} simulated minutes)",
                    flush=True,
                )
                return
            if now < trace.min_duration_s:
                continue
            finished = True
            for system, conn in with_conns:
                driver_done = system.driver is not None and system.driver.poll() is not None
                row = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE status = 'done') FROM pgdrain.jobs"
                ).fetchone()
                assert row is not None
                if not driver_done or row[0] < expected or row[1] < row[0]:
                    finished = False
            if finished:
                return
    finally:
        for _, conn in with_conns:
            conn.close()


def _stop(system: System) -> None:
    if system.driver is not None and system.driver.poll() is None:
        system.driver.kill()
    if system.driver is not None:
        system.driver.wait()
        if system.driver.returncode not in (0, -9):
            print(
                f"  warning: the {system.name} driver exited with {system.driver.returncode}"
                f" (see its log)",
                flush=True,
            )
    for process in system.processes:
        process.kill()
        process.wait()
    if system.plane is not None:
        system.plane.stop()


def _commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "handler", "template.yaml"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def _notes(results: Sequence[measure.Figures]) -> list[str]:
    """What the table needs beside it: how fast the burst really was, how many runs were killed."""
    notes = []
    burst = [f for f in results if f.trace == "burst"]
    if burst:
        spans = ", ".join(f"{f.system} {f.extra.get('enqueue_span_s')}" for f in burst)
        notes.append(
            "burst: the driver's enqueue+kick calls (8 threads, as fast as this machine allows)"
            f" spanned these simulated seconds: {spans}."
        )
    faults = [f for f in results if f.trace == "faults" and f.system != "poller"]
    if faults:
        kills = ", ".join(f"{f.system} {f.extra.get('kills')}" for f in faults)
        notes.append(f"faults: runs killed at their timeout: {kills}.")
    return notes


def _traces_doc(size: traces.Size, seed: int) -> str:
    lines = []
    for name in traces.NAMES:
        trace = traces.build(name, size, seed)
        delayed = sum(1 for b in trace.batches if b.delay_s)
        failing = sum(b.count for b in trace.batches if b.fail_once)
        hanging = sum(b.count for b in trace.batches if b.hang_first)
        faults = trace.faults
        text = (
            f"- **{name}**: {trace.jobs} jobs in {len(trace.batches)} enqueues; "
            f"runs {trace.min_duration_s / 60:g} simulated minutes at least, until every job "
            f"is done (at most {trace.max_duration_s / 60:g})"
        )
        if delayed:
            text += f"; {delayed} enqueues delayed 1 to 60 minutes"
        if failing:
            text += f"; {failing} jobs fail once"
        if hanging:
            text += f"; {hanging} jobs hang on their first attempt until the run is killed"
        if faults.duplicate_every:
            text += f"; every {faults.duplicate_every}rd async event delivered twice"
        if faults.duplicate_fanout:
            text += "; every fan-out event delivered twice"
        for what, windows in (
            ("Invoke fails (HTTP 500)", faults.invoke_fail),
            ("Invoke is throttled (HTTP 429)", faults.invoke_throttle),
            ("CreateSchedule fails (HTTP 500)", faults.create_schedule_fail),
        ):
            for start, end in windows:
                text += f"; {what} from minute {start / 60:.1f} to {end / 60:.1f}"
        if not trace.systems_in_parallel:
            text += "; the systems run one after the other"
        if trace.scale is not None:
            text += f"; at time scale {trace.scale:g}"
            if trace.alongside:
                text += ", beside the other traces"
        lines.append(text + ".")
    return "\n".join(lines)
