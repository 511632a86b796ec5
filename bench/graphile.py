"""graphile-worker (npm), run the way its performance page tunes it: one Node process
(bench/graphile/drain.mjs) per worker, concurrentJobs 24, a pool of 25, a local queue of 500,
completions and failures batched (completeJobBatchDelay / failJobBatchDelay 0), and runOnce(),
which drains until the queue is empty. Its Node packages are pinned by
bench/graphile/package-lock.json and installed by `make bench` (`npm ci`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg

from bench.common import REPO
from bench.peers import Check

DIR = REPO / "bench" / "graphile"
SCRIPT = DIR / "drain.mjs"
PACKAGE = DIR / "node_modules" / "graphile-worker" / "package.json"


@dataclass(frozen=True)
class Tuning:
    """One graphile-worker setting (preset.worker)."""

    concurrency: int = 24  # concurrentJobs
    local_queue: int = 500  # localQueue.size; -1: no local queue
    batch_delay: int = 0  # completeJobBatchDelay and failJobBatchDelay, ms; -1: not batched
    pool: int = 25  # maxPoolSize

    def argv(self) -> list[str]:
        return [str(v) for v in (self.concurrency, self.local_queue, self.batch_delay, self.pool)]

    def label(self) -> str:
        return (
            f"concurrentJobs {self.concurrency}, localQueue.size {self.local_queue}, "
            f"complete/failJobBatchDelay {self.batch_delay}, maxPoolSize {self.pool}"
        )


# The configuration of graphile-worker's performance page (worker.graphile.org/docs/performance).
DOCUMENTED = Tuning()


def missing() -> str | None:
    """Why graphile-worker cannot run here, or None if it can."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not PACKAGE.exists():
        return f"its packages are not installed (`npm ci` in {DIR.relative_to(REPO)})"
    return None


def version() -> str:
    return str(json.loads(PACKAGE.read_text())["version"])


def node_version() -> str:
    out = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().lstrip("v")


def node_url(conninfo: str) -> str:
    """A postgresql:// URL for node-postgres, which reads no libpq `key=value` strings."""
    given = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(given.get("user") or ""), safe="")
    password = given.get("password")
    auth = f"{user}:{quote(str(password), safe='')}@" if password else (f"{user}@" if user else "")
    host = str(given.get("host") or "")
    port = f":{given['port']}" if given.get("port") else ""
    dbname = quote(str(given.get("dbname") or ""), safe="")
    if host.startswith("/"):  # a Unix socket's directory goes in the query
        return f"postgresql://{auth}{port and 'localhost' + port}/{dbname}?host={quote(host)}"
    return f"postgresql://{auth}{host}{port}/{dbname}"


def enqueue(url: str, count: int) -> None:
    """graphile-worker's schema (its own migrations) and `count` no-op jobs (addJobs)."""
    subprocess.run(["node", str(SCRIPT), "enqueue", node_url(url), str(count)], check=True)


def command(url: str, tuning: Tuning) -> list[str]:
    """One drain process, speaking bench/worker.py's protocol (ready, go, result)."""
    return ["node", str(SCRIPT), "drain", node_url(url), *tuning.argv()]


def check(count: int, left: int, results: Sequence[dict[str, Any]]) -> Check:
    """graphile-worker deletes a job it completed and keeps one that failed (to retry it), so
    every job ran exactly once when its table is empty and the tasks counted `count`
    executions of `count` distinct job ids (a job run twice counts twice in `executed`, once
    in `distinct`; the processes share no ids)."""
    executed = sum(int(r["executed"]) for r in results)
    distinct = sum(int(r["distinct"]) for r in results)
    ok = left == 0 and executed == count and distinct == count
    return Check(
        ok,
        f"left in graphile_worker.jobs {left}, executions counted by the tasks {executed} "
        f"({distinct} distinct job ids)",
    )


def verify(url: str, count: int, results: Sequence[dict[str, Any]]) -> Check:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM graphile_worker.jobs").fetchone()
    assert row is not None
    return check(count, int(row[0]), results)
