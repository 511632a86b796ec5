"""`pgdrain demo`: migrate, enqueue a mix of the example jobs, drain them, print what happened."""

from __future__ import annotations

import dataclasses

from pgdrain import queue
from pgdrain.budget import Budget
from pgdrain.db import connect
from pgdrain.drain import drain
from pgdrain.enqueue import build_job
from pgdrain.migrate import migrate
from pgdrain.registry import load_registry
from pgdrain.settings import Settings

DEMO_QUEUE = "demo"


def demo_jobs(count: int) -> list[queue.NewJob]:
    """Mostly quick jobs, some that write a row, a few flaky ones and one that always fails."""
    jobs = []
    for i in range(count):
        if i % 50 == 49:
            jobs.append(build_job("flaky", {"failures": 1}, queue_name=DEMO_QUEUE))
        elif i % 10 == 0:
            jobs.append(build_job("greet", {"name": f"user {i}"}, queue_name=DEMO_QUEUE))
        else:
            jobs.append(build_job("noop", {"n": i}, queue_name=DEMO_QUEUE))
    jobs.append(build_job("fail", {}, queue_name=DEMO_QUEUE, max_attempts=1))
    return jobs


def run(settings: Settings, conninfo: str, *, count: int, budget: float) -> int:
    from pgdrain.cli import format_result, format_stats

    with connect(conninfo, settings, Budget.seconds(settings.connect_timeout)) as conn:
        applied = migrate(conn).applied
        print(f"migrate: {', '.join(applied) or 'up to date'}")
        with conn.transaction():
            ids = queue.insert_jobs(conn, demo_jobs(count))
        print(f"enqueued {len(ids)} jobs on queue {DEMO_QUEUE!r}")

    settings = dataclasses.replace(settings, queues=(DEMO_QUEUE,))
    result = drain(settings, Budget.seconds(budget), load_registry(settings.jobs_module), conninfo)
    print(f"drain: {format_result(result)}")

    with connect(conninfo, settings, Budget.seconds(settings.connect_timeout)) as conn:
        print(format_stats(queue.stats(conn)))
    return 0 if result.stop_reason != "error" else 1
