"""The chaos soak: many jobs drained by concurrent `pgdrain drain` processes that are killed at
random, while the database server itself is restarted once; then an audit of the ledger that
every job function writes (soak.soak_jobs) against what pgdrain recorded.

    PYTHONPATH=handler:tests python -m soak.chaos --jobs 2000

The faults of the drain loop (docs/reliability.md), each switched on by its SoakConfig field
(the soak turns them all on, the controls none): drains connect through a loopback proxy that
loses the reply of a committed claim every `lost_reply_interval` seconds and stalls all
traffic now and then (`pauses`); a share of the kills are SIGTERM, which a drain answers by
stopping (`sigterm_share`); a share of the drains run several drains in one process, as a
warm Lambda container does (`warm_share`); and the server's default_transaction_isolation is
serializable (`serializable`).

The pytest entry points are in test_soak.py (`make soak`). The audit's rules:

- every job ends `done`, or `failed` by policy (its attempts spent); nothing is left running;
- a done job holds exactly one accepted completion: the ledger `return` row whose token is the
  job's completed_token, and it belongs to the last attempt that started (a result accepted
  from an earlier attempt, after a later one had started, is a stale completion accepted);
- every other `return` row is an attempt that its run said, by token, it had lost (the heartbeat
  found the lease gone, or the fence refused its result), or one that never reached the
  database (its process was killed, or its run was past the deadline or lost the database); a
  process that exited normally names each of its own, but those it abandoned at its end, which
  it counts.

With done jobs not kept (`keep_done=False`: the drains run with PGDRAIN_RETAIN_DONE=0, and a
completion deletes the job), no row says which attempt's result was accepted. A trigger the
soak adds to pgdrain.active_jobs (soak.deleted, not pgdrain's) keeps each deleted row as it
was, with the time: a job deleted while running was completed under the attempt whose token it
held, and that attempt must have returned before the deletion (a result taken from another
attempt while the holder still ran is a stale completion accepted)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from helpers.lossy_proxy import LossyProxy
from helpers.restartable_pg import RestartableServer
from pgdrain import build_job
from pgdrain.db import store
from pgdrain.db.migrate import migrate
from soak import soak_jobs

TESTS_DIR = Path(__file__).resolve().parent.parent
REFUSED_LINE = "its result was not recorded"
CLAIM_MARKER = b"pgdrain_job_complete_and_claim_"  # the name a claim is prepared under
LEASE_LOST_LINE = "lease lost:"
# The attempt each "lease lost" line names: the heartbeat found it, or the fence refused it.
LOST_ATTEMPT = re.compile(r"lease lost: .*? attempt_token=([0-9a-f-]{36})")
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class SoakConfig:
    jobs: int = 20_000
    drains: int = 4
    min_budget: float = 2.0
    max_budget: float = 10.0
    min_kill_interval: float = 0.5
    max_kill_interval: float = 2.0
    kills: bool = True
    restart_database: bool = True
    restart_at_fraction: float = 0.4  # of the jobs finished
    restart_downtime: float = 2.0  # seconds the server stays down
    lease_seconds: float = 3.0
    reserve_seconds: float = 1.0
    min_nap_ms: int = 5
    max_nap_ms: int = 100
    mix: tuple[tuple[str, float], ...] = (("noop", 0.5), ("nap", 0.35), ("flaky", 0.15))
    concurrency: int | None = None  # PGDRAIN_CONCURRENCY of each drain (None: the default)
    heartbeat: bool = True  # False and fenced=False: the controls
    fenced: bool = True
    # False: the audit reads no drain's "lease lost" lines, as if the runs had dropped those
    # results without a word (the control of the audit's accounting rule).
    read_lost_lines: bool = True
    chaos_min_seconds: float = 0.0  # keep the chaos phase going at least this long
    final_drains: int = 4  # concurrent drains once the chaos is over
    final_phase_seconds: float = 600.0  # the queue must be empty by then
    seed: int = 20261130
    # The drain loop's faults (off by default: the controls keep the timeline they were built
    # on).
    lost_reply_interval: float | None = None  # seconds between lost claim replies
    pauses: bool = False  # stall all traffic for 0.2-2 s every 2-5 s
    sigterm_share: float = 0.0  # of the kills
    warm_share: float = 0.0  # of the drains: several drains in one process
    warm_runs: int = 3
    serializable: bool = False  # the server's default_transaction_isolation
    # Each drain starts with a limit of its own on the busy queue (none, 8, 16 or 32), so its
    # start creates, changes or drops the limit row while other drains claim and complete.
    limit_changes: bool = False
    # False: the drains run with PGDRAIN_RETAIN_DONE=0 (a completion deletes the job), and the
    # audit reads the accepted completions from soak.deleted.
    keep_done: bool = True


# The soak with all of the drain loop's faults on.
FAULTS = {
    "lost_reply_interval": 1.0,
    "pauses": True,
    "sigterm_share": 0.3,
    "warm_share": 0.25,
    "serializable": True,
    "limit_changes": True,
}


# Every job and how it ended, done jobs kept: the attempt whose completion was accepted is
# completed_token (no time: a kept row's finish is checked by the attempt alone).
JOBS_KEPT = """
SELECT id, status, attempts, max_attempts, completed_token, reclaim_count, NULL::timestamptz
FROM pgdrain.jobs ORDER BY id"""

# Not kept: a job deleted while running is done, under the token it held, at deleted_at.
JOBS_NOT_KEPT = """
SELECT id, status, attempts, max_attempts, completed_token, reclaim_count, NULL::timestamptz
FROM pgdrain.jobs
UNION ALL
SELECT d.id, 'done', d.attempts, d.max_attempts, d.attempt_token, d.reclaim_count, d.deleted_at
FROM soak.deleted AS d
WHERE d.status = 'running' AND NOT EXISTS (SELECT 1 FROM pgdrain.jobs AS j WHERE j.id = d.id)
ORDER BY 1"""

# The soak's own record of what left active_jobs by DELETE (a completion, or a failure's move to
# finished_jobs), as it was, and when: with done jobs not kept, no pgdrain row says it.
DELETED_DDL = """
CREATE TABLE soak.deleted (
    LIKE pgdrain.active_jobs,
    deleted_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION soak.record_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO soak.deleted SELECT (OLD).*;
    RETURN NULL;
END
$$;
CREATE TRIGGER soak_record_deleted AFTER DELETE ON pgdrain.active_jobs
    FOR EACH ROW EXECUTE FUNCTION soak.record_deleted();
"""


@dataclass
class DrainRun:
    number: int
    pid: int
    budget: float
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    phase: str
    fate: str = "running"  # killed | exited | stopped (SIGTERM) | error
    warm: bool = False
    result: dict[str, Any] | None = None
    refused_lines: int = 0
    lease_lost_lines: int = 0
    said_lost: set[str] = field(default_factory=set)  # the attempt tokens of those lines


@dataclass
class Figures:
    jobs: int = 0
    done: int = 0
    failed_by_policy: int = 0
    drain_runs: int = 0
    killed: int = 0
    terminated: int = 0  # SIGTERM: stopped claiming, ended the leases of what still ran
    warm_processes: int = 0  # processes that ran several drains, as a warm container
    lost_replies: int = 0  # claim replies the proxy dropped after the commit
    pauses: int = 0  # traffic stalls
    serializable_default: bool = False
    exited_normally: int = 0
    exited_with_error: int = 0
    database_restarts: int = 0
    lease_lost_reported: int = 0  # sum of DrainResult.lease_lost of the runs that exited
    lease_lost_log_lines: int = 0  # every "lease lost" line of every run, killed ones included
    reclaims: int = 0  # sum of reclaim_count over the jobs
    refused_stale_completions: int = 0  # "its result was not recorded" lines
    stale_returns: int = 0  # ledger returns that are not the accepted completion
    accepted_stale_completions: int = 0
    attempts_started: int = 0
    retried_failures: int = 0
    chaos_seconds: float = 0.0
    wall_seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [(k, v) for k, v in asdict(self).items() if k != "violations"]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines.append(f"{'violations':<{width}}  {len(self.violations)}")
        lines.extend(f"  - {v}" for v in self.violations[:20])
        return "\n".join(lines)


class Soak:
    def __init__(self, config: SoakConfig, server: RestartableServer, workdir: Path) -> None:
        self.config = config
        self.server = server
        self.url = server.url()
        self.workdir = workdir
        self.random = random.Random(config.seed)
        self.runs: list[DrainRun] = []
        self.live: list[DrainRun] = []
        self.restarts = 0
        self.pauses = 0
        self._monitor: psycopg.Connection[Any] | None = None
        faulty = config.lost_reply_interval is not None or config.pauses
        self.proxy = LossyProxy(self.url) if faulty else None
        self.drain_url = self.proxy.url if self.proxy else self.url

    # -- setup ---------------------------------------------------------------------------

    def prepare(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            migrate(conn)
            conn.execute(soak_jobs.LEDGER_DDL)
            if not self.config.keep_done:
                conn.execute(DELETED_DDL)
            if self.config.serializable:
                # New sessions (every drain's) default to serializable; pgdrain pins its own.
                conn.execute(
                    sql.SQL(
                        "ALTER DATABASE {} SET default_transaction_isolation = serializable"
                    ).format(sql.Identifier(conn.info.dbname))
                )
            jobs = [self._job(i) for i in range(self.config.jobs)]
            for start in range(0, len(jobs), 5000):
                with conn.transaction():
                    store.job_insert_many(conn, jobs[start : start + 5000])

    def _job(self, i: int) -> store.NewJob:
        kinds, weights = zip(*self.config.mix, strict=True)
        kind = self.random.choices(kinds, weights)[0]
        if kind == "nap":
            payload: dict[str, Any] = {
                "ms": self.random.randint(self.config.min_nap_ms, self.config.max_nap_ms)
            }
        elif kind == "flaky":
            payload = {"failures": self.random.choice((1, 2))}
        else:
            payload = {}
        return build_job(kind, {"n": i, **payload})

    # -- the drain processes -------------------------------------------------------------

    def _command(self, budget: float, warm: bool = False) -> list[str]:
        drain_args = ["drain", "--budget", f"{budget:.2f}", "--json"]
        if warm:
            runs = str(self.config.warm_runs)
            return [sys.executable, "-m", "soak.warm_drain", runs, "--", *drain_args]
        if self.config.heartbeat and self.config.fenced:
            return [sys.executable, "-m", "pgdrain.cli", *drain_args]
        switches = [] if self.config.heartbeat else ["--no-heartbeat"]
        switches += [] if self.config.fenced else ["--unfenced"]
        return [sys.executable, "-m", "soak.control_drain", *switches, "--", *drain_args]

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PGDRAIN_")}
        handler = TESTS_DIR.parent / "handler"
        env.update(
            DATABASE_URL=self.drain_url,
            PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(handler)]),
            PGDRAIN_JOBS="soak.soak_jobs",
            PGDRAIN_LEASE_SECONDS=str(self.config.lease_seconds),
            PGDRAIN_RESERVE_SECONDS=str(self.config.reserve_seconds),
            PGDRAIN_CONNECT_TIMEOUT="5",
        )
        if not self.config.keep_done:
            env["PGDRAIN_RETAIN_DONE"] = "0"
        if self.config.concurrency is not None:
            env["PGDRAIN_CONCURRENCY"] = str(self.config.concurrency)
        if self.config.limit_changes:
            limit = self.random.choice((None, 8, 16, 32))
            if limit is not None:
                env["PGDRAIN_QUEUE_LIMITS"] = f"default={limit}"
        return env

    def start_drain(self, phase: str, budget: float | None = None) -> DrainRun:
        if budget is None:
            budget = self.random.uniform(self.config.min_budget, self.config.max_budget)
        number = len(self.runs)
        warm = phase == "chaos" and self.random.random() < self.config.warm_share
        stdout = self.workdir / f"drain-{number:05d}.out"
        stderr = self.workdir / f"drain-{number:05d}.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(
                self._command(budget, warm),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=self._environment(),
                cwd=TESTS_DIR.parent,
            )
        run = DrainRun(number, process.pid, budget, process, stdout, stderr, phase, warm=warm)
        self.runs.append(run)
        self.live.append(run)
        return run

    def kill_one(self) -> None:
        if not self.live:
            return
        run = self.random.choice(self.live)
        if self.random.random() < self.config.sigterm_share:
            # A deploy: the run stops claiming, finishes or gives up its jobs within its grace
            # and exits 143; reap() collects it when it has.
            if run.process.poll() is None:
                run.process.send_signal(signal.SIGTERM)
            return
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGKILL)
        run.process.wait()
        self._finish(run)

    def reap(self) -> None:
        for run in list(self.live):
            if run.process.poll() is not None:
                self._finish(run)

    def _finish(self, run: DrainRun) -> None:
        self.live.remove(run)
        code = run.process.returncode
        if code in (-signal.SIGKILL, -signal.SIGTERM):  # SIGTERM before the CLI took it: a kill
            run.fate = "killed"
        else:
            run.fate = {0: "exited", 128 + signal.SIGTERM: "stopped"}.get(code, "error")
            run.result = _combined(run.stdout.read_text(errors="replace"))
        log = run.stderr.read_text(errors="replace")
        run.refused_lines = log.count(REFUSED_LINE)
        run.lease_lost_lines = log.count(LEASE_LOST_LINE)
        run.said_lost = set(LOST_ATTEMPT.findall(log)) if self.config.read_lost_lines else set()

    def close(self) -> None:
        if self._monitor is not None:
            self._monitor.close()
        if self.proxy is not None:
            self.proxy.close()

    def stop_all(self) -> None:
        for run in list(self.live):
            if run.process.poll() is None:
                run.process.send_signal(signal.SIGKILL)
            run.process.wait()
            self._finish(run)

    # -- observing the queue -------------------------------------------------------------

    def _query(self, statement: str) -> tuple[Any, ...]:
        """One row from the monitor connection, reconnecting after the restart broke it."""
        for _ in range(50):
            try:
                if self._monitor is None or self._monitor.broken or self._monitor.closed:
                    self._monitor = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
                row = self._monitor.execute(statement).fetchone()
                assert row is not None
                return tuple(row)
            except psycopg.OperationalError:
                time.sleep(POLL_SECONDS)
        raise RuntimeError("the soak's monitor lost the database for good")

    def progress(self) -> tuple[int, int, int, int]:
        """(finished, ready, running, expired leases). Finished: every job enqueued but those
        still in active_jobs (a done job not kept is in no table)."""
        row = self._query(
            "SELECT count(*) FILTER (WHERE status NOT IN ('done', 'failed', 'cancelled')),"
            " count(*) FILTER (WHERE status = 'queued' AND run_at <= now()),"
            " count(*) FILTER (WHERE status = 'running'),"
            " count(*) FILTER (WHERE status = 'running' AND lease_expires_at < now())"
            " FROM pgdrain.jobs"
        )
        return self.config.jobs - int(row[0]), int(row[1]), int(row[2]), int(row[3])

    # -- the phases ----------------------------------------------------------------------

    def chaos_phase(self) -> None:
        """Keep `drains` processes running, kill one every 0.5-2 s, restart the database once;
        until nothing is ready (and the restart has happened, and chaos_min_seconds passed)."""
        next_kill = time.monotonic() + self._kill_interval()
        next_drop = time.monotonic() + (self.config.lost_reply_interval or 0.0)
        next_pause, pause_until = time.monotonic() + self.random.uniform(2, 5), None
        next_look = 0.0
        chaos_until = time.monotonic() + self.config.chaos_min_seconds
        while True:
            self.reap()
            while len(self.live) < self.config.drains:
                self.start_drain("chaos")
            now = time.monotonic()
            if self.config.kills and now >= next_kill:
                self.kill_one()
                self.start_drain("chaos")
                next_kill = now + self._kill_interval()
            if self.proxy is not None and self.config.lost_reply_interval and now >= next_drop:
                if not self.proxy.armed():
                    self.proxy.drop_commit_reply(CLAIM_MARKER)
                next_drop = now + self.config.lost_reply_interval
            if self.proxy is not None and self.config.pauses:
                if pause_until is None and now >= next_pause:
                    self.proxy.pause()
                    self.pauses += 1
                    pause_until = now + self.random.uniform(0.2, 2.0)
                elif pause_until is not None and now >= pause_until:
                    self.proxy.resume()
                    pause_until, next_pause = None, now + self.random.uniform(2, 5)
            if now >= next_look:
                next_look = now + 0.5
                finished, ready, _running, _expired = self.progress()
                restart_due = (
                    self.config.restart_database
                    and self.restarts == 0
                    and finished >= self.config.restart_at_fraction * self.config.jobs
                )
                if restart_due:
                    self.server.stop("fast")
                    time.sleep(self.config.restart_downtime)  # the outage is the workload
                    self.server.start()
                    self.restarts += 1
                restarted = self.restarts > 0 or not self.config.restart_database
                if ready == 0 and restarted and now >= chaos_until:
                    if self.proxy is not None:
                        self.proxy.resume()
                    return
            time.sleep(POLL_SECONDS)

    def final_phase(self) -> None:
        """No more chaos: run drains until every job is done or failed. A drain starts when a
        job is ready or a lease has expired (reclaim brings back the jobs of killed runs)."""
        deadline = time.monotonic() + self.config.final_phase_seconds
        while True:
            self.reap()
            finished, ready, running, expired = self.progress()
            if finished == self.config.jobs and not self.live:
                return
            if time.monotonic() > deadline:
                self.stop_all()
                raise AssertionError(
                    f"the queue did not empty: {self.config.jobs - finished} jobs unfinished "
                    f"({ready} ready, {running} running) {self.config.final_phase_seconds}s "
                    "after the chaos ended"
                )
            if (ready or expired) and len(self.live) < self.config.final_drains:
                self.start_drain("final", budget=self.config.max_budget)
            time.sleep(POLL_SECONDS)

    def _kill_interval(self) -> float:
        return self.random.uniform(self.config.min_kill_interval, self.config.max_kill_interval)

    # -- the audit -----------------------------------------------------------------------

    def audit(self, figures: Figures) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            self._audit(conn, figures)

    def _audit(self, conn: psycopg.Connection[Any], figures: Figures) -> None:
        violations = figures.violations
        jobs = conn.execute(JOBS_KEPT if self.config.keep_done else JOBS_NOT_KEPT).fetchall()
        if not self.config.keep_done:
            # Deleted not as a completion (not running), or deleted twice: a job lost.
            for job_id, status, times in conn.execute(
                "SELECT id, min(status), count(*) FROM soak.deleted GROUP BY id"
                " HAVING count(*) > 1 OR min(status) <> 'running'"
            ).fetchall():
                violations.append(f"job {job_id} deleted {times} times, from {status}")
            kept = conn.execute("SELECT count(*) FROM pgdrain.finished_jobs WHERE status = 'done'")
            if kept_done := int(kept.fetchone()[0]):  # type: ignore[index]
                violations.append(f"{kept_done} done jobs kept with PGDRAIN_RETAIN_DONE=0")
        starts: dict[int, int] = {}
        for job_id, attempt in conn.execute(
            "SELECT job_id, max(attempt) FROM soak.ledger WHERE phase = 'start' GROUP BY job_id"
        ).fetchall():
            starts[job_id] = attempt
        returns: dict[int, list[tuple[Any, int, int, Any]]] = {}
        for job_id, token, attempt, pid, at in conn.execute(
            "SELECT job_id, token, attempt, pid, at FROM soak.ledger WHERE phase = 'return'"
        ).fetchall():
            returns.setdefault(job_id, []).append((token, attempt, pid, at))
        started = conn.execute("SELECT count(*) FROM soak.ledger WHERE phase = 'start'")
        figures.attempts_started = int(started.fetchone()[0])  # type: ignore[index]

        figures.jobs = len(jobs)
        if figures.jobs != self.config.jobs:
            violations.append(f"{self.config.jobs} jobs enqueued, {figures.jobs} in the table")
        statuses = Counter(row[1] for row in jobs)
        figures.done = statuses["done"]
        figures.failed_by_policy = statuses["failed"]
        figures.reclaims = sum(row[5] for row in jobs)
        for status in ("queued", "running"):
            if statuses[status]:
                violations.append(f"{statuses[status]} jobs left {status}")
        # A limit's running count must be exact (issue 47): a count left too high stops its
        # queue for good.
        for queue, counted, running in conn.execute(
            "SELECT l.queue, l.running, (SELECT count(*) FROM pgdrain.jobs AS j"
            " WHERE j.status = 'running' AND j.queue = l.queue) FROM pgdrain.queue_limits AS l"
        ).fetchall():
            if counted != running:
                violations.append(f"queue {queue}'s limit counts {counted} running, not {running}")

        stale_by_pid: dict[int, list[str]] = {}  # the tokens of returns not accepted
        for job_id, status, attempts, max_attempts, completed, _reclaims, ended_at in jobs:
            job_returns = returns.get(job_id, [])
            if status == "failed" and attempts < max_attempts:
                violations.append(f"job {job_id} failed with attempts left ({attempts})")
            if status == "done":
                accepted = [r for r in job_returns if r[0] == completed]
                if len(accepted) != 1:
                    violations.append(
                        f"job {job_id}: {len(accepted)} ledger returns match its completed_token"
                    )
                elif accepted[0][1] != starts.get(job_id):
                    figures.accepted_stale_completions += 1
                    violations.append(
                        f"job {job_id}: the completion of attempt {accepted[0][1]} was accepted "
                        f"after attempt {starts.get(job_id)} had started (a stale completion)"
                    )
                elif ended_at is not None and accepted[0][3] > ended_at:
                    figures.accepted_stale_completions += 1
                    violations.append(
                        f"job {job_id}: deleted as done under attempt {accepted[0][1]} before "
                        "that attempt returned (a stale completion)"
                    )
            for token, _attempt, pid, _at in job_returns:
                if status != "done" or token != completed:
                    figures.stale_returns += 1
                    stale_by_pid.setdefault(pid, []).append(str(token))

        for run in self.runs:
            figures.refused_stale_completions += run.refused_lines
            figures.lease_lost_log_lines += run.lease_lost_lines
            if run.fate == "killed":
                continue
            result = run.result or {}
            figures.lease_lost_reported += int(result.get("lease_lost", 0))
            figures.retried_failures += int(result.get("retried", 0))
            if run.fate == "error" or result.get("stop_reason") == "error" or result.get("errors"):
                continue  # it lost the database: its unwritten results are left to reclaim
            # Each result it returned and pgdrain did not accept: an attempt the run said it had
            # lost (the heartbeat found it, or the fence refused its result), or one it
            # abandoned at its end (counted, not named).
            stale = stale_by_pid.get(run.pid, [])
            unsaid = [token for token in stale if token not in run.said_lost]
            abandoned = int(result.get("abandoned", 0))
            if len(unsaid) > abandoned:
                violations.append(
                    f"drain run {run.number} (pid {run.pid}) returned {len(stale)} results that "
                    f"were not accepted, {len(unsaid)} of them not said lost, and abandoned "
                    f"{abandoned}"
                )

        figures.drain_runs = len(self.runs)
        fates = Counter(run.fate for run in self.runs)
        figures.killed = fates["killed"]
        figures.terminated = fates["stopped"]
        figures.warm_processes = sum(1 for run in self.runs if run.warm)
        figures.lost_replies = self.proxy.drops if self.proxy is not None else 0
        figures.pauses = self.pauses
        figures.serializable_default = self.config.serializable
        figures.exited_normally = fates["exited"]
        figures.exited_with_error = fates["error"]
        figures.database_restarts = self.restarts


def _combined(stdout: str) -> dict[str, Any] | None:
    """The result of a drain process: its JSON line, or the sum of a warm process's lines
    (`errors` counts the runs among them that ended in an error)."""
    results = []
    for line in stdout.strip().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            parsed = json.loads(line)
            if isinstance(parsed, dict):
                results.append(parsed)
    if not results:
        return None
    combined: dict[str, Any] = dict(results[-1])
    for key in ("lease_lost", "retried", "abandoned"):
        combined[key] = sum(int(r.get(key, 0)) for r in results)
    combined["errors"] = sum(1 for r in results if r.get("stop_reason") == "error")
    return combined


def run_soak(config: SoakConfig, workdir: Path | None = None) -> Figures:
    """Run one soak on a database server of its own and return its figures (with any
    violation of the rules above in figures.violations)."""
    figures = Figures()
    began = time.monotonic()
    with _workdir(workdir) as folder, RestartableServer() as server:
        soak = Soak(config, server, folder)
        soak.prepare()
        chaos_began = time.monotonic()
        try:
            soak.chaos_phase()
            figures.chaos_seconds = round(time.monotonic() - chaos_began, 1)
            soak.final_phase()
        finally:
            soak.stop_all()
            soak.close()
        soak.audit(figures)
    figures.wall_seconds = round(time.monotonic() - began, 1)
    return figures


@contextlib.contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="pgdrain-soak-") as folder:
        yield Path(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=SoakConfig.jobs)
    parser.add_argument("--seed", type=int, default=SoakConfig.seed)
    args = parser.parse_args()
    figures = run_soak(SoakConfig(jobs=args.jobs, seed=args.seed, **FAULTS))  # type: ignore[arg-type]
    print(figures.table())
    raise SystemExit(1 if figures.violations else 0)


if __name__ == "__main__":
    main()
