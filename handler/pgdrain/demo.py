"""`pgdrain demo`: migrate, enqueue a mix of the example jobs, drain them the way the deployed
function does (the scheduled event through `pgdrain invoke`), print what happened."""

from __future__ import annotations

import dataclasses
import io
import json
import tempfile
from collections.abc import Iterable
from pathlib import Path

from pgdrain import store
from pgdrain.budget import Budget
from pgdrain.db import connect
from pgdrain.drain import DrainResult, drain
from pgdrain.enqueue import build_job
from pgdrain.errors import PgdrainError
from pgdrain.migrate import migrate
from pgdrain.registry import load_registry
from pgdrain.report import format_result, format_stats
from pgdrain.settings import Settings

DEMO_QUEUE = "demo"
TEMPLATE = Path("template.yaml")
SCHEDULE_EVENT = Path("infra/events/schedule.json")


def demo_jobs(count: int) -> list[store.NewJob]:
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
    with connect(conninfo, settings, Budget.seconds(settings.connect_timeout)) as conn:
        applied = migrate(conn).applied
        print(f"migrate: {', '.join(applied) or 'up to date'}")
        with conn.transaction():
            ids = store.job_insert_many(conn, demo_jobs(count))
        print(f"enqueued {len(ids)} jobs on queue {DEMO_QUEUE!r}")

    if TEMPLATE.is_file() and SCHEDULE_EVENT.is_file():
        result = _drain_through_invoke()
    else:  # run outside the repository: no template to invoke
        print("drain: no template.yaml here; draining directly")
        settings = dataclasses.replace(settings, queues=(DEMO_QUEUE,))
        registry = load_registry(settings.jobs_module)
        result = drain(settings, Budget.seconds(budget), registry, conninfo)
    print(f"drain: {format_result(result)}")

    with connect(conninfo, settings, Budget.seconds(settings.connect_timeout)) as conn:
        print(format_stats(store.queue_stats(conn)))
    return 0 if result.stop_reason != "error" else 1


def _drain_through_invoke() -> DrainResult:
    """`pgdrain invoke -e infra/events/schedule.json --env-vars <demo env.json>`, in-process:
    the function's handler, settings and timeout from template.yaml, the scheduled event."""
    from pgdrain.aws import local_invoke

    # The database comes from this process's DATABASE_URL (the CLI exports the embedded one's),
    # which fills the template's empty DATABASE_URL.
    overrides = {"Parameters": {"PGDRAIN_QUEUES": DEMO_QUEUE}}
    with tempfile.TemporaryDirectory(prefix="pgdrain-demo-") as folder:
        env_json = Path(folder) / "env.json"
        env_json.write_text(json.dumps(overrides), encoding="utf-8")
        print(
            f"drain: pgdrain invoke -e {SCHEDULE_EVENT} --env-vars <env.json: "
            f"PGDRAIN_QUEUES={DEMO_QUEUE}>  (the scheduled event, handler from {TEMPLATE})"
        )
        output = io.StringIO()
        invoked = local_invoke.invoke(
            template=TEMPLATE,
            event_path=str(SCHEDULE_EVENT),
            env_vars_path=str(env_json),
            output=output,
        )
    payload = invoked.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), dict):
        raise PgdrainError(f"the handler failed: {json.dumps(payload)}")
    print(_digest(output.getvalue().splitlines()))
    return DrainResult(**payload["result"])


def _digest(lines: Iterable[str]) -> str:
    """One line on what the function printed: its log lines by level and its metrics."""
    levels: dict[str, int] = {}
    totals: dict[str, float] = {}
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        if "_aws" in record:
            for directive in record["_aws"].get("CloudWatchMetrics", []):
                for metric in directive.get("Metrics", []):
                    values = record.get(metric["Name"], [])
                    values = values if isinstance(values, list) else [values]
                    totals[metric["Name"]] = totals.get(metric["Name"], 0) + sum(values)
        elif "level" in record:
            levels[record["level"]] = levels.get(record["level"], 0) + 1
    logs = ", ".join(f"{n} {level}" for level, n in sorted(levels.items())) or "none"
    metrics = ", ".join(f"{name}={value:g}" for name, value in totals.items()) or "none"
    return f"function output: log lines {logs}; metrics {metrics}"
