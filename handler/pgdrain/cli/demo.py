"""`pgdrain demo`: migrate, enqueue a mix of the example jobs, drain them the way the deployed
function does (the scheduled event through `pgdrain invoke`), print what happened, and the
commands to look further. Every command it prints runs as printed (a test runs each).

Bad input writes nothing: the jobs module that will run the demo's jobs is loaded and checked
for their kinds (load_jobs) before the database is touched."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shlex
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from pgdrain.api.enqueue import build_job
from pgdrain.api.registry import Registry, load_registry, on_sys_path
from pgdrain.budget import Budget
from pgdrain.cli import embedded
from pgdrain.cli.report import format_migrated, format_result, format_stats, plural
from pgdrain.db import store
from pgdrain.db.connection import connect
from pgdrain.db.migrate import migrate
from pgdrain.errors import ConfigError, PgdrainError
from pgdrain.runner.drain import DrainResult, drain
from pgdrain.settings import Settings

DEMO_QUEUE = "demo"
TEMPLATE = Path("template.yaml")
SCHEDULE_EVENT = Path("infra/events/schedule.json")
DEMO_ENV = Path("infra/env.demo.json")  # {"Parameters": {"PGDRAIN_QUEUES": "demo"}}
DEMO_KINDS_COUNT = 50  # demo_jobs(50) holds every kind the demo enqueues


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


def through_invoke() -> bool:
    """In the repository: drain through `pgdrain invoke` and the template's function."""
    return TEMPLATE.is_file() and SCHEDULE_EVENT.is_file() and DEMO_ENV.is_file()


def load_jobs(settings: Settings, environ: Mapping[str, str]) -> Registry:
    """The registry that will run the demo's jobs, checked for their kinds: the function's
    (the template's PGDRAIN_JOBS under its code directory) in the repository, else the module
    PGDRAIN_JOBS names, else the demo's own (pgdrain.cli.demo_kinds). Called before anything is
    migrated or enqueued, so that a missing or broken module is one line and exit 2 with
    nothing written."""
    if through_invoke():
        module_name, code_dir = _function_jobs_module()
        with on_sys_path(code_dir):
            registry = load_registry(module_name)
    elif environ.get("PGDRAIN_JOBS"):
        module_name = settings.jobs_module
        registry = load_registry(module_name)
    else:
        from pgdrain.cli import demo_kinds

        return demo_kinds.jobs
    kinds = sorted({job.kind for job in demo_jobs(DEMO_KINDS_COUNT)})
    missing = [kind for kind in kinds if kind not in registry]
    if missing:
        raise ConfigError(
            f"PGDRAIN_JOBS: module {module_name!r} does not register "
            f"{', '.join(map(repr, missing))}: the demo enqueues the kinds {', '.join(kinds)} "
            "(unset PGDRAIN_JOBS: the demo brings its own)"
        )
    return registry


def run(
    settings: Settings,
    conninfo: str,
    *,
    registry: Registry,
    count: int,
    budget: float,
    embedded_dir: Path | None,
) -> int:
    """registry: from load_jobs, called first. embedded_dir: where the embedded PostgreSQL
    keeps its data, when the demo uses it."""
    *jobs, failing = demo_jobs(count)
    with connect(conninfo, settings, Budget.seconds(settings.connect_timeout)) as conn:
        print(format_migrated(migrate(conn).applied))  # as `pgdrain migrate` says it
        with conn.transaction():
            ids = store.job_insert_many(conn, jobs)
            failed_id, _ = store.job_insert(conn, failing)  # its own insert: its id, for sure
        flaky = sum(1 for j in jobs if j.kind == "flaky")
        print(
            f"enqueued {len(ids) + 1} jobs on queue {DEMO_QUEUE!r}: {len(ids) - flaky} quick, "
            f"{flaky} flaky (fail once, then succeed), 1 that always fails"
        )

    pgdrain = program()
    drain_with = f"{_own_kinds_setting(registry)}{pgdrain} drain --queues {DEMO_QUEUE}"
    if through_invoke():
        print(
            f"drain: {pgdrain} invoke -e {SCHEDULE_EVENT} --env-vars {DEMO_ENV}"
            f"    # the scheduled event, the handler and settings from {TEMPLATE}"
        )
        result, warnings = _drain_through_invoke()
    else:  # run outside the repository: no template to invoke
        print(f"drain: {drain_with} --budget {budget:g}")
        settings = dataclasses.replace(settings, queues=(DEMO_QUEUE,))
        result = drain(settings, Budget.seconds(budget), registry, conninfo)
        warnings = result.retried + result.failed  # one warning line each (pgdrain.runner.claiming)
    print(f"drain: {format_result(result)}")
    print(explain_warnings(warnings, retried=result.retried, failed=result.failed))

    with connect(conninfo, settings, Budget.seconds(settings.connect_timeout)) as conn:
        print(format_stats(store.queue_stats(conn)))
    print("look further:")
    for command, why in (
        (f"{pgdrain} jobs --queue {DEMO_QUEUE} --status failed", "the job that failed, and why"),
        (f"{pgdrain} jobs show {failed_id}", "every field of it"),
        (
            f"{pgdrain} retry --failed --queue {DEMO_QUEUE} --dry-run",
            "what a retry would queue again",
        ),
        (f"{drain_with} --budget 30", "once the retries' backoff has passed"),
        (f"{pgdrain} stats", "the counts again"),
        (
            f"{pgdrain} cancel --queued --queue {DEMO_QUEUE}",
            "done with it: a drain of your own jobs here serves every queue, the demo's too",
        ),
    ):
        print(f"  {command}    # {why}")
    if embedded_dir is not None:
        print(
            f"The embedded PostgreSQL (data in {embedded_dir}) keeps running for these "
            f"commands; stop it with: {pgdrain} server stop"
        )
    return 0 if result.stop_reason != "error" else 1


def _own_kinds_setting(registry: Registry) -> str:
    """What a printed drain needs before it to run the demo's own kinds (no jobs module of the
    user's names them); nothing when the jobs module that ran them is the one a drain finds."""
    from pgdrain.cli import demo_kinds

    return "PGDRAIN_JOBS=pgdrain.cli.demo_kinds " if registry is demo_kinds.jobs else ""


def explain_warnings(warnings: int, *, retried: int, failed: int) -> str:
    """The demo's warnings are expected: say where each comes from."""
    if warnings == 0:
        return "warnings: none"
    parts = []
    if retried:
        parts.append(
            f"{plural(retried, 'flaky job')} failed an attempt and will be retried after a "
            "backoff ('delayed' below)"
        )
    if failed:
        parts.append(f"{plural(failed, 'job')} failed for good (the 'fail' kind; 'failed' below)")
    expected = retried + failed
    text = f"warnings: {warnings}, as the demo intends: " + "; ".join(parts)
    if warnings > expected:
        others = warnings - expected
        text += f"; {others} {'other' if others == 1 else 'others'}: see the function's log"
        text += " (the invoke above)"
    return text


def program() -> str:
    """How to run this same `pgdrain` again from this directory, as the user typed it or on
    PATH: the commands the demo prints must run as printed."""
    argv0 = Path(sys.argv[0])
    if argv0.name != "pgdrain":  # python -m pgdrain.cli
        return f"{shlex.quote(sys.executable)} -m pgdrain.cli"
    on_path = shutil.which("pgdrain")
    if on_path and Path(on_path).resolve() == argv0.resolve():
        return "pgdrain"
    path = Path(os.path.relpath(argv0.resolve()))
    text = str(path if path.parts[0] == ".." or path.is_absolute() else Path(".") / path)
    if not text.startswith(("/", ".")):
        text = "./" + text
    return shlex.quote(text)


def _drain_through_invoke() -> tuple[DrainResult, int]:
    """`pgdrain invoke -e infra/events/schedule.json --env-vars infra/env.demo.json`,
    in-process: the function's handler, settings and timeout from template.yaml, the scheduled
    event. The database comes from this process's DATABASE_URL (the CLI exports the embedded
    one's), which fills the template's empty DATABASE_URL. Returns the result and how many
    warnings the function logged."""
    from pgdrain.aws import local_invoke

    output = io.StringIO()
    invoked = local_invoke.invoke(
        template=TEMPLATE,
        event_path=str(SCHEDULE_EVENT),
        env_vars_path=str(DEMO_ENV),
        output=output,
        resolve_database=embedded.start,
    )
    payload = invoked.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), dict):
        raise PgdrainError(f"the handler failed: {json.dumps(payload)}")
    lines = output.getvalue().splitlines()
    print(_digest(lines))
    return DrainResult(**payload["result"]), _count_level(lines, "WARNING")


def _function_jobs_module() -> tuple[str, Path]:
    """The jobs module the template's function loads at its cold start under `pgdrain invoke
    --env-vars DEMO_ENV`, and the code directory it is found in."""
    from pgdrain.aws import local_invoke

    spec = local_invoke.read_function(TEMPLATE)
    overrides, _ignored = local_invoke.read_overrides(DEMO_ENV, spec)
    env = local_invoke.function_environment(
        spec, overrides, os.environ, local_invoke.local_region()
    )
    return Settings.from_env(env).jobs_module, spec.code_dir


def _count_level(lines: Iterable[str], level: str) -> int:
    count = 0
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("level") == level:
            count += 1
    return count


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
