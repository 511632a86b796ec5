"""One benchmark worker process: `python -m bench.worker KIND --url URL ...`.

It imports and sets up, prints {"event": "ready"}, waits for a `go` line on stdin (so that
several workers start together and no import is timed), runs, and prints {"event":
"result", "start": ..., "end": ..., ...} with wall-clock times the orchestrator compares."""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext


def emit(event: str, **fields: Any) -> None:
    """One protocol line. Libraries may print JSON on stdout too (Powertools' logs and
    metrics do): the orchestrator reads only lines that carry this key."""
    print(json.dumps({"bench_event": event, **fields}), flush=True)


def wait_go() -> None:
    emit("ready")
    sys.stdin.readline()


def peak_rss_mb() -> float:
    """This process's peak resident set. getrusage's ru_maxrss survives exec on Linux, so a
    worker started by a bigger parent would report the parent's peak: read the kernel's
    high-water mark of this address space (VmHWM) instead, where there is one."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _cpu_seconds() -> float:
    """CPU time (user + system) of this whole process, every thread included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_pgdrain(args: argparse.Namespace) -> None:
    from pgdrain import Budget, Settings
    from pgdrain.api.registry import load_registry
    from pgdrain.controls import Controls
    from pgdrain.runner.drain import drain_with

    registry = load_registry("jobs")  # handler/jobs.py, the example kinds (noop)
    concurrency = args.concurrency or Settings().concurrency
    settings = Settings(
        batch_size=args.batch, concurrency=concurrency, retain_done_days=args.retain_done
    )
    profiler: Any = None
    if args.pyinstrument:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)
    wait_go()
    if profiler is not None:
        profiler.start()
    start = time.time()
    cpu_start = _cpu_seconds()
    result = drain_with(
        Controls(pipelining=not args.no_pipelining),
        settings,
        Budget.seconds(args.budget),
        registry,
        args.url,
    )
    cpu_s = _cpu_seconds() - cpu_start
    end = time.time()
    if profiler is not None:
        profiler.stop()
        Path(args.pyinstrument).write_text(profiler.output_text(unicode=False, show_all=False))
    emit(
        "result",
        start=start,
        end=end,
        done=result.done,
        claimed=result.claimed,
        stop_reason=result.stop_reason,
        error=result.error,
        rss_mb=peak_rss_mb(),
        cpu_s=cpu_s,
    )


def run_pgqueuer(args: argparse.Namespace) -> None:
    from bench import peers

    async def go() -> None:
        emit("ready")
        await peers.stdin_go()()

    async def main() -> dict[str, Any]:
        return await peers.pgqueuer_worker(args.url, args.driver, args.batch, go)

    result = asyncio.run(main())
    emit("result", **result, rss_mb=peak_rss_mb())


def run_procrastinate(args: argparse.Namespace) -> None:
    from bench import peers

    async def go() -> None:
        emit("ready")
        await peers.stdin_go()()

    result = asyncio.run(peers.procrastinate_worker(args.url, args.concurrency, go))
    emit("result", **result, rss_mb=peak_rss_mb())


FUNCTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:pgdrain-bench-drain"
REQUEST_ID = "00000000-0000-4000-8000-000000000000"


SCHEDULED_EVENT = {
    "version": "0",
    "id": "d167b752-343a-4b28-afd6-d4de056319e8",
    "detail-type": "Scheduled Event",
    "source": "aws.scheduler",
    "account": "123456789012",
    "time": "2026-01-15T10:30:00Z",
    "region": "us-east-1",
    "resources": ["arn:aws:scheduler:us-east-1:123456789012:schedule/default/pgdrain-bench"],
    "detail": "{}",
}


def run_empty(args: argparse.Namespace) -> None:
    """One scheduled run that finds nothing to do, instrumented: the connect is timed, and
    every protocol message after it is traced by libpq; each ReadyForQuery the server sends
    closes one request/response round trip. With --via handler the run goes through
    handler/app.py's lambda_handler with an EventBridge Scheduler event (imported before the
    clock starts); with --via drain, through pgdrain.drain with default settings."""
    import os

    import psycopg

    from pgdrain.db import connection

    trace = Path(tempfile.mkstemp(prefix="pgdrain-bench-trace-")[1])
    timings: dict[str, float] = {}
    original = connection.connect

    def traced_connect(*a: Any, **kw: Any) -> psycopg.Connection[Any]:
        began = time.perf_counter()
        conn = original(*a, **kw)
        timings["connect_s"] = timings.get("connect_s", 0.0) + time.perf_counter() - began
        handle = trace.open("a")
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        plain_close = conn.close

        def close() -> None:
            conn.pgconn.untrace()  # flushes libpq's trace buffer
            handle.close()
            plain_close()

        conn.close = close  # type: ignore[method-assign]
        return conn

    connection.connect = traced_connect
    run: Any
    if args.via == "handler":
        os.environ.update(
            DATABASE_URL=args.url,
            PGDRAIN_JOBS="jobs",
            POWERTOOLS_METRICS_NAMESPACE="pgdrain-bench",
            POWERTOOLS_SERVICE_NAME="pgdrain",
            AWS_DEFAULT_REGION="us-east-1",
        )
        import app
        from pgdrain.aws.context import FakeContext

        def run() -> tuple[bool, str, int]:
            fake = FakeContext(60.0, FUNCTION_ARN, request_id=REQUEST_ID, log_stream="bench")
            context = cast("LambdaContext", fake)  # it has the attributes the handler reads
            out = app.lambda_handler(dict(SCHEDULED_EVENT), context)
            result = out.get("result") or {}
            return (
                bool(out.get("ok")),
                str(result.get("stop_reason")),
                int(result.get("claimed", -1)),
            )
    else:
        from pgdrain import Budget, Settings, drain
        from pgdrain.api.registry import load_registry

        registry = load_registry("jobs")

        def run() -> tuple[bool, str, int]:
            result = drain(Settings(), Budget.seconds(60), registry, args.url)
            return result.error is None, result.stop_reason, result.claimed

    wait_go()
    start = time.time()
    began = time.perf_counter()
    ok, stop_reason, claimed = run()
    total = time.perf_counter() - began
    end = time.time()
    lines = trace.read_text().splitlines()
    trace.unlink()
    messages = [line.split("\t")[:3] for line in lines]
    round_trips = sum(1 for m in messages if m[0] == "B" and m[2:] == ["ReadyForQuery"])
    statements = sum(1 for m in messages if m[0] == "F" and m[2:] in (["Execute"], ["Query"]))
    emit(
        "result",
        start=start,
        end=end,
        total_ms=total * 1000.0,
        connect_ms=timings.get("connect_s", float("nan")) * 1000.0,
        round_trips=round_trips,
        statements=statements,
        ok=ok,
        claimed=claimed,
        stop_reason=stop_reason,
    )


def run_connect(args: argparse.Namespace) -> None:
    """Connect the way a run does, and close: the baseline of the server's own work."""
    from pgdrain import Budget, Settings
    from pgdrain.db import connection

    wait_go()
    start = time.time()
    conn = connection.connect(args.url, Settings(), Budget.seconds(60))
    conn.close()
    emit("result", start=start, end=time.time())


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.worker")
    sub = parser.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("pgdrain")
    p.add_argument("--url", required=True)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=0, help="0: pgdrain's default")
    p.add_argument("--retain-done", type=float, default=7.0, help="PGDRAIN_RETAIN_DONE, days")
    p.add_argument("--budget", type=float, default=600.0)
    p.add_argument("--pyinstrument", default="")
    p.add_argument(
        "--no-pipelining",
        action="store_true",
        help="each claim's reply read before the next claim goes out (the pipelining control)",
    )
    p = sub.add_parser("pgqueuer")
    p.add_argument("--url", required=True)
    p.add_argument("--driver", choices=("asyncpg", "psycopg"), default="asyncpg")
    p.add_argument("--batch", type=int, default=10)
    p = sub.add_parser("procrastinate")
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p = sub.add_parser("empty")
    p.add_argument("--url", required=True)
    p.add_argument("--via", choices=("handler", "drain"), default="drain")
    p = sub.add_parser("connect")
    p.add_argument("--url", required=True)
    return parser.parse_args(argv)


RUNNERS = {
    "pgdrain": run_pgdrain,
    "pgqueuer": run_pgqueuer,
    "procrastinate": run_procrastinate,
    "empty": run_empty,
    "connect": run_connect,
}


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    RUNNERS[args.kind](args)


if __name__ == "__main__":
    main()
