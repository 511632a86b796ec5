"""What every benchmark shares: the server, fresh databases, worker processes, medians."""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parent.parent
HANDLER = REPO / "handler"


def make_sam_compileall_options() -> list[str]:
    """The compileall options of the Makefile's `sam` recipe, its build directory left out: what
    `make sam` compiles a function's package with (the benchmark compiles its copy the same way)."""
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("\t") and "-m compileall" in line:
            words = shlex.split(line.split("-m compileall", 1)[1])
            return [w for w in words if w != ".aws-sam/build"]
    raise AssertionError("the Makefile's sam recipe compiles no bytecode")


# BENCH_DB_PREFIX: another prefix for the databases the benchmark creates and drops (a server
# shared with other work that keeps a prefix per user).
DB_PREFIX = os.environ.get("BENCH_DB_PREFIX", "pgdrain_bench_")
# The key prefixes of the strict-ordering figures (batch 1, concurrency 1): apart from
# pgdrain/B/P and ceiling/B/P, whose concurrency follows from the batch size.
STRICT = "strict"
STRICT_CEILING = "strict-ceiling"


def log(message: str) -> None:
    """Progress on stderr, flushed at once (make shows it as it comes)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def with_dbname(url: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **params)


def resolve_server() -> tuple[str, str]:
    """(admin URL, where it came from): DATABASE_URL, else pgdrain's embedded PostgreSQL."""
    configured = os.environ.get("DATABASE_URL", "").strip()
    if configured:
        # BENCH_ADMIN_DB: where CREATE DATABASE is issued from, if not `postgres`.
        admin_db = os.environ.get("BENCH_ADMIN_DB", "postgres")
        return with_dbname(configured, admin_db), "DATABASE_URL"
    from pgdrain.cli import embedded

    folder = Path(tempfile.gettempdir()) / "pgdrain-bench" / "pgdata"
    url = embedded.start(folder, keep_running=False)
    return with_dbname(url, "postgres"), "embedded PostgreSQL (pgserver)"


def pgbench_path() -> str:
    """The machine's pgbench, else the one the pgserver wheel ships."""
    found = shutil.which("pgbench")
    if found:
        return found
    try:
        import pgserver
    except ImportError:
        raise SystemExit("pgbench not found: install postgresql-client or pgserver") from None
    bundled = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pgbench"
    if not bundled.exists():
        raise SystemExit(f"pgbench not found on PATH nor at {bundled}")
    return str(bundled)


class Server:
    """One PostgreSQL server; creates and drops the benchmark's own databases on it."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.created: list[str] = []
        self.checkpoints = True  # fresh() checkpoints after each copy (False: the role may not)

    def url(self, dbname: str) -> str:
        return with_dbname(self.admin_url, dbname)

    def create(self, template: str | None = None) -> str:
        name = f"{DB_PREFIX}{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            if template is None:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            else:
                admin.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(name), sql.Identifier(template)
                    )
                )
        self.created.append(name)
        return name

    def drop(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        if name in self.created:
            self.created.remove(name)

    @contextmanager
    def fresh(self, template: str) -> Iterator[str]:
        """A database copied from `template`, dropped afterwards; yields its URL. A checkpoint
        follows the copy, so the run measured on it does not share the disk with the writing
        out of the copy's pages (CREATE DATABASE copies through the WAL and leaves them dirty):
        without it, an A/A comparison of two identical drains at batch 250 spread twice as
        wide (standard deviation of the ratio 0.10 against 0.05, ten pairs each) and both ran
        slower."""
        name = self.create(template)
        self.checkpoint()
        try:
            yield self.url(name)
        finally:
            self.drop(name)

    def checkpoint(self) -> None:
        """CHECKPOINT, where the role may (a superuser or pg_checkpoint); else nothing."""
        if not self.checkpoints:
            return
        try:
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                admin.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            log("no CHECKPOINT between runs: the role may not (superuser or pg_checkpoint)")
            self.checkpoints = False

    def drop_all(self) -> None:
        for name in list(self.created):
            try:
                self.drop(name)
            except psycopg.Error as exc:
                log(f"could not drop {name}: {exc}")

    def version(self) -> str:
        with psycopg.connect(self.admin_url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    def xact_commit(self, dbname: str) -> int:
        """Committed transactions of `dbname` so far, read from another database so the
        reading itself does not count. Waits until no backend of that database is left (a
        backend reports its counts when it exits)."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            for _ in range(200):
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)
                ).fetchone()
                if row and row[0] == 0:
                    break
                time.sleep(0.01)
            time.sleep(0.05)
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)
            ).fetchone()
        return int(row[0]) if row else 0


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def cpu_seconds_per_1000_jobs(cpu_s: float, jobs: int) -> float:
    """The drain process's CPU (user + system, every thread: the `cpu_s` a pgdrain worker
    reports from getrusage around its drain) per 1,000 jobs. `make bench` (its cost) and
    `bench.profile` (its breakdown) both read it this way, so the two figures agree."""
    return cpu_s / jobs * 1000.0 if jobs else float("nan")


def paired_ratio(a: Figure | None, b: Figure | None) -> float:
    """Median over the repetitions both figures have of a's value / b's: the two ran next
    to each other in every repetition, so a burst of load falls on both."""
    if a is None or b is None:
        return float("nan")
    other = dict(zip(b.reps, b.values, strict=True))
    ratios = [v / other[r] for r, v in zip(a.reps, a.values, strict=True) if other.get(r)]
    return median(ratios)


@dataclass
class Figure:
    """One benchmark cell: the repetitions, each with its verification."""

    name: str
    params: dict[str, Any]
    values: list[float] = field(default_factory=list)  # verified repetitions only
    reps: list[int] = field(default_factory=list)  # the repetition each value comes from
    rejected: int = 0  # repetitions whose verification failed: never counted
    extra: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def value(self) -> float:
        return median(self.values)

    def add(self, value: float) -> None:
        """A verified repetition's value (repetitions run in order, rejected ones included)."""
        self.reps.append(len(self.values) + self.rejected)
        self.values.append(value)

    def add_extra(self, key: str, value: float) -> None:
        self.extra.setdefault(key, []).append(value)

    def extra_median(self, key: str) -> float:
        return median(self.extra.get(key, []))

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.params,
            "values": self.values,
            "reps": self.reps,
            "median": self.value,
            "rejected": self.rejected,
            "extra": {k: {"values": v, "median": median(v)} for k, v in self.extra.items()},
            "notes": self.notes,
        }


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HANDLER), str(REPO), env.get("PYTHONPATH", "")) if p
    )
    env.pop("DATABASE_URL", None)  # workers get their database explicitly
    return env


class _Worker:
    """One worker process and a thread that reads its JSON lines onto a queue."""

    def __init__(self, command: Sequence[str]) -> None:
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=worker_env(),
        )
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def expect(self, event: str, deadline: float) -> dict[str, Any]:
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no {event!r} from a worker in time") from None
            if line is None:
                code = self.proc.wait()
                raise RuntimeError(f"a worker exited (code {code}) before sending {event!r}")
            line = line.strip()
            if '"bench_event"' not in line:
                continue  # a library printed something: not ours
            message: dict[str, Any] = json.loads(line)
            if message.get("bench_event") == event:
                return message

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_workers(
    count: int, argv: Sequence[str], timeout: float = 300.0, prefix: Sequence[str] = ()
) -> tuple[float, list[dict[str, Any]]]:
    """Start `count` worker processes (`python -m bench.worker ARGV`), wait until every one
    has imported and set up, start them together, and return (wall seconds from the first
    start to the last finish, each worker's result)."""
    return run_processes(count, [*prefix, sys.executable, "-m", "bench.worker", *argv], timeout)


def run_processes(
    count: int, command: Sequence[str], timeout: float = 300.0
) -> tuple[float, list[dict[str, Any]]]:
    """run_workers for any command that speaks bench/worker.py's protocol (a peer in another
    language: bench/graphile/drain.mjs)."""
    deadline = time.monotonic() + timeout
    workers = [_Worker(command) for _ in range(count)]
    try:
        for worker in workers:
            worker.expect("ready", deadline)
        for worker in workers:
            worker.send("go")
        results = [worker.expect("result", deadline) for worker in workers]
        for worker in workers:
            worker.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for worker in workers:
            worker.stop()
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    return wall, results


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def cpu_ticks() -> tuple[int, int] | None:
    """(stolen, total) CPU ticks of the machine so far (/proc/stat), or None off Linux. A
    virtual machine's stolen time is time its host gave another guest: what the load average
    does not show, and what moves this machine's figures most."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(f) for f in fields]
    stolen = ticks[7] if len(ticks) > 7 else 0
    # guest and guest_nice (fields 9-10) are counted in user and nice already.
    return stolen, sum(ticks[:8])


def stolen_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the CPU time between two cpu_ticks() readings that the host took."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def load_average() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "?"
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"
