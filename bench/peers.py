"""The peers, set up the way their documentation says: PgQueuer (QueueManager in drain mode)
and Procrastinate (App.run_worker_async with wait=False). Installing their schema, enqueuing
no-op jobs, one worker run, and the check that every job ran exactly once, from their own
tables."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

NOOP = "noop"
QUEUE = "default"


@dataclass(frozen=True)
class Check:
    ok: bool
    detail: str


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name in ("pgqueuer", "asyncpg", "procrastinate", "psycopg", "psycopg-pool"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


# -- PgQueuer --------------------------------------------------------------------------------


def asyncpg_params(url: str) -> dict[str, Any]:
    """asyncpg takes URIs only; the benchmark's URLs are libpq conninfo strings."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    params: dict[str, Any] = {}
    for ours, theirs in (("host", "host"), ("user", "user"), ("password", "password")):
        if given.get(ours):
            params[theirs] = given[ours]
    if given.get("dbname"):
        params["database"] = given["dbname"]
    if given.get("port"):
        params["port"] = int(str(given["port"]))
    return params


async def _pgqueuer_queries(url: str, driver: str) -> tuple[Any, Any]:
    """(Queries, connection) over the asyncpg or the psycopg driver."""
    from pgqueuer import AsyncpgDriver, PsycopgDriver, Queries

    if driver == "asyncpg":
        import asyncpg

        conn: Any = await asyncpg.connect(**asyncpg_params(url))
        return Queries(AsyncpgDriver(conn)), conn
    aconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return Queries(PsycopgDriver(aconn)), aconn


def pgqueuer_install(url: str) -> None:
    async def main() -> None:
        queries, conn = await _pgqueuer_queries(url, "asyncpg")
        try:
            await queries.install()
        finally:
            await conn.close()

    asyncio.run(main())


def pgqueuer_enqueue(url: str, count: int) -> None:
    async def main() -> None:
        queries, conn = await _pgqueuer_queries(url, "asyncpg")
        try:
            await queries.enqueue([NOOP] * count, [None] * count, [0] * count)
        finally:
            await conn.close()

    asyncio.run(main())


def pgqueuer_verify(url: str, count: int, executed: int) -> Check:
    """A successful job is deleted from `pgqueuer` and logged once in `pgqueuer_log`."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            """SELECT (SELECT count(*) FROM pgqueuer),
                      count(*) FILTER (WHERE status = 'successful'),
                      count(DISTINCT job_id) FILTER (WHERE status = 'successful'),
                      count(*) FILTER (WHERE status NOT IN ('successful', 'queued', 'picked'))
               FROM pgqueuer_log"""
        ).fetchone()
    assert row is not None
    left, successes, distinct, other = (int(v) for v in row)
    ok = left == 0 and successes == count and distinct == count and other == 0
    ok = ok and executed == count
    return Check(
        ok,
        f"left in queue {left}, successful log rows {successes} ({distinct} distinct jobs), "
        f"other outcomes {other}, executions counted by the workers {executed}",
    )


async def pgqueuer_worker(url: str, driver: str, batch_size: int, wait_go: Any) -> dict[str, Any]:
    from pgqueuer import QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    queries, conn = await _pgqueuer_queries(url, driver)
    qm = QueueManager(queries)
    executed = 0

    @qm.entrypoint(NOOP)
    async def noop(job: Any) -> None:
        nonlocal executed
        executed += 1

    await wait_go()
    start = time.time()
    await qm.run(
        batch_size=batch_size,
        mode=QueueExecutionMode.drain,
        # Drain mode exits when the queue is empty; a short dequeue timeout keeps the last
        # batch's in-flight tasks from holding the worker for the default 30 s.
        dequeue_timeout=timedelta(seconds=0.05),
        log_aggregation_interval=timedelta(0),
    )
    end = time.time()
    await conn.close()
    return {"start": start, "end": end, "executed": executed}


# -- Procrastinate ---------------------------------------------------------------------------


def procrastinate_app(url: str, counter: list[int] | None = None) -> tuple[Any, Any]:
    """(App, the no-op task). The counter, if given, counts executions in this process."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name=NOOP, queue=QUEUE)
    async def noop() -> None:
        if counter is not None:
            counter[0] += 1

    return app, noop


def procrastinate_install(url: str) -> None:
    async def main() -> None:
        app, _ = procrastinate_app(url)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(main())


def procrastinate_enqueue(url: str, count: int) -> None:
    async def main() -> None:
        app, noop = procrastinate_app(url)
        async with app.open_async():
            for start in range(0, count, 5000):
                await noop.batch_defer_async(*({} for _ in range(min(5000, count - start))))

    asyncio.run(main())


def procrastinate_verify(url: str, count: int, executed: int) -> Check:
    """Every job `succeeded`, and its events show exactly one start."""
    with psycopg.connect(url) as conn:
        jobs = conn.execute(
            """SELECT count(*), count(*) FILTER (WHERE status = 'succeeded')
               FROM procrastinate_jobs"""
        ).fetchone()
        starts = conn.execute(
            """SELECT count(*), count(DISTINCT job_id) FROM procrastinate_events
               WHERE type = 'started'"""
        ).fetchone()
    assert jobs is not None and starts is not None
    total, succeeded = int(jobs[0]), int(jobs[1])
    started, started_distinct = int(starts[0]), int(starts[1])
    ok = total == count and succeeded == count and started == started_distinct == count
    ok = ok and executed == count
    return Check(
        ok,
        f"jobs {total}, succeeded {succeeded}, start events {started} "
        f"({started_distinct} distinct jobs), executions counted by the workers {executed}",
    )


async def procrastinate_worker(url: str, concurrency: int, wait_go: Any) -> dict[str, Any]:
    counter = [0]
    app, _ = procrastinate_app(url, counter)
    async with app.open_async():
        await wait_go()
        start = time.time()
        await app.run_worker_async(
            queues=[QUEUE],
            wait=False,
            concurrency=concurrency,
            install_signal_handlers=False,
            listen_notify=False,
            delete_jobs="never",
        )
        end = time.time()
    return {"start": start, "end": end, "executed": counter[0]}


def stdin_go() -> Any:
    """An awaitable factory that waits for the orchestrator's `go` line."""

    async def wait() -> None:
        await asyncio.to_thread(sys.stdin.readline)

    return wait
