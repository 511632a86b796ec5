"""The `pgdrain` command. Exit codes: 0 ok, 1 failure, 2 bad input (one line, nothing written)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import psycopg

from pgdrain import db, embedded, store
from pgdrain.budget import Budget
from pgdrain.drain import DrainResult, drain
from pgdrain.enqueue import build_job
from pgdrain.errors import BadInput, PgdrainError
from pgdrain.migrate import migrate
from pgdrain.registry import load_registry
from pgdrain.report import format_result, format_stats
from pgdrain.settings import Settings, parse_queues
from pgdrain.stop import exit_code, stop_on_signals

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
DEFAULT_CLI_BUDGET_SECONDS = 60.0
MAX_NUMBER = 1e9  # seconds (--delay, --budget) or days; larger values overflow in PostgreSQL
MAX_BIGINT = 2**63 - 1
MAX_ENQUEUE_COUNT = 1_000_000
MAX_PURGE_DAYS = 36_500.0
STATUSES = ("queued", "running", "done", "failed")

log = logging.getLogger("pgdrain")


_STANDARD_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _ReadableFormatter(logging.Formatter):
    """One line per record, with the structured fields (`extra=`) as key=value: the same
    records the Lambda logs as JSON, readable in a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD_RECORD_FIELDS}
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"pgdrain: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number, not negative")
    if value > MAX_NUMBER:  # past this, PostgreSQL's timestamps and intervals overflow
        raise argparse.ArgumentTypeError(f"{text!r} must be at most {MAX_NUMBER:g}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    if value > MAX_BIGINT:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most {MAX_BIGINT}")
    return value


def _int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} must be from {low} to {high}")
        return value

    return parse


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgdrain", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    commands.add_parser("migrate", help="apply pending schema migrations")

    p = commands.add_parser("enqueue", help="enqueue jobs")
    p.add_argument("kind")
    p.add_argument("--payload", default="{}", help="JSON, or @FILE (@- for stdin); default {}")
    p.add_argument("--queue", default="default")
    p.add_argument("--delay", type=_non_negative_float, default=0.0, help="seconds")
    p.add_argument("--priority", type=_int, default=0, help="smaller runs first")
    p.add_argument("--max-attempts", type=_int, default=5)
    p.add_argument("--recovery-policy", choices=("auto", "manual"), default="auto")
    p.add_argument("--key", help="idempotency key")
    p.add_argument("--count", type=_positive_int, default=1)

    p = commands.add_parser("drain", help="drain ready jobs until none is left or time is up")
    p.add_argument("--budget", type=_non_negative_float, default=DEFAULT_CLI_BUDGET_SECONDS)
    p.add_argument("--queues", help="comma-separated (default PGDRAIN_QUEUES)")
    p.add_argument("--concurrency", type=_int_between(1, 256), help="1 to 256")
    p.add_argument("--batch-size", type=_int_between(1, 1000), help="1 to 1000")
    p.add_argument("--json", action="store_true")

    p = commands.add_parser("stats", help="counts per queue and status")
    p.add_argument("--json", action="store_true")

    p = commands.add_parser("jobs", help="list recent jobs")
    p.add_argument("--status", action="append", choices=STATUSES)
    p.add_argument("--limit", type=_positive_int, default=20)

    p = commands.add_parser("retry", help="put failed jobs back in the queue")
    p.add_argument("ids", nargs="+", type=_positive_int)

    p = commands.add_parser("purge", help="delete done/failed jobs older than N days")
    p.add_argument("--older-than-days", type=_non_negative_float, default=7.0)

    p = commands.add_parser(
        "invoke", help="run the Lambda handler in-process as `sam local invoke` does (no Docker)"
    )
    p.add_argument("function", nargs="?", help="logical id in the template (default: its only one)")
    p.add_argument("-e", "--event", help="JSON event file, or - for stdin (default: {})")
    p.add_argument("-n", "--env-vars", help="env.json overriding the template's variables")
    p.add_argument("-t", "--template", default="template.yaml")

    p = commands.add_parser("demo", help="migrate, enqueue demo jobs, drain them, print stats")
    p.add_argument("--count", type=_positive_int, default=300)
    p.add_argument("--budget", type=_non_negative_float, default=DEFAULT_CLI_BUDGET_SECONDS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ReadableFormatter("pgdrain: %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    # Job modules (PGDRAIN_JOBS) are found from the current directory, as `python -m` does.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    command: Callable[[argparse.Namespace, Settings], int] = COMMANDS[args.command]
    try:
        settings = Settings.from_env(os.environ)
        return command(args, settings)
    except BadInput as exc:
        print(f"pgdrain: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PgdrainError as exc:
        print(f"pgdrain: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.Error as exc:
        print(f"pgdrain: database error: {db.describe(exc)}", file=sys.stderr)
        return EXIT_FAILURE


def conninfo_or_embedded(settings: Settings) -> str:
    """The configured database (DATABASE_URL or the secret), else the embedded PostgreSQL
    (exported as DATABASE_URL for job code)."""
    if settings.database_url or settings.db_secret_arn:
        from pgdrain.aws.secrets import resolve_conninfo

        return resolve_conninfo(settings)
    url = embedded.start()
    os.environ["DATABASE_URL"] = url
    return url


def _connect(settings: Settings) -> store.Connection:
    return db.connect(
        conninfo_or_embedded(settings), settings, Budget.seconds(settings.connect_timeout)
    )


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    with _connect(settings) as conn:
        result = migrate(conn)
    if result.applied:
        print("applied: " + ", ".join(result.applied))
    else:
        print("nothing to apply: the schema is up to date")
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    payload = parse_payload(args.payload)
    if args.count > MAX_ENQUEUE_COUNT:
        raise BadInput(f"--count must be at most {MAX_ENQUEUE_COUNT} (got {args.count})")
    if args.key is not None and args.count > 1:
        raise BadInput("--key names one job; it cannot be combined with --count > 1")
    job = build_job(
        args.kind,
        payload,
        queue_name=args.queue,
        delay=args.delay,
        priority=args.priority,
        max_attempts=args.max_attempts,
        recovery_policy=args.recovery_policy,
        idempotency_key=args.key,
    )
    with _connect(settings) as conn, conn.transaction():
        if args.count == 1:
            job_id, created = store.job_insert(conn, job)
            print(f"enqueued job {job_id}" if created else f"job {job_id} exists (same key)")
        else:
            ids = store.job_insert_many(conn, [job] * args.count)
            print(f"enqueued {len(ids)} jobs ({ids[0]}..{ids[-1]})")
    return EXIT_OK


def parse_payload(text: str) -> Any:
    """--payload JSON, or @FILE to read the JSON from a file (@- for standard input)."""
    if text.startswith("@"):
        source = text[1:]
        try:
            if source == "-":
                text = sys.stdin.read()
            else:
                with open(source, encoding="utf-8") as handle:
                    text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise BadInput(f"--payload {text}: cannot read it: {exc}") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeError) as exc:
        raise BadInput(f"--payload is not valid JSON: {exc}") from None


def _drain_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    changes: dict[str, Any] = {}
    if getattr(args, "queues", None):
        changes["queues"] = parse_queues(args.queues, "--queues")
    if getattr(args, "concurrency", None):
        changes["concurrency"] = args.concurrency
    if getattr(args, "batch_size", None):
        changes["batch_size"] = args.batch_size
    return dataclasses.replace(settings, **changes)


def _run_drain(settings: Settings, budget_seconds: float) -> DrainResult:
    conninfo = conninfo_or_embedded(settings)
    registry = load_registry(settings.jobs_module)
    return drain(settings, Budget.seconds(budget_seconds), registry, conninfo)


def cmd_drain(args: argparse.Namespace, settings: Settings) -> int:
    settings = _drain_settings(args, settings)
    # SIGINT/SIGTERM: stop claiming, let running jobs finish for a short grace, end the leases
    # of the rest (reclaimable at once), print the summary and exit 130/143 (pgdrain.stop).
    with stop_on_signals() as stop:
        result = _run_drain(settings, args.budget)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(format_result(result))
    if (code := exit_code(stop)) is not None:
        return code
    return EXIT_FAILURE if result.stop_reason == "error" else EXIT_OK


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    with _connect(settings) as conn:
        rows = store.queue_stats(conn)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows]))
        return EXIT_OK
    print(format_stats(rows))
    return EXIT_OK


def cmd_jobs(args: argparse.Namespace, settings: Settings) -> int:
    with _connect(settings) as conn:
        rows = store.job_list(conn, args.status or list(STATUSES), args.limit)
    for r in rows:
        error = f"  {r.last_error}" if r.last_error else ""
        print(
            f"{r.id:>8} {r.queue:<12} {r.kind:<14} {r.status:<8} "
            f"attempt {r.attempts}/{r.max_attempts} reclaims {r.reclaim_count}{error}"
        )
    return EXIT_OK


def cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    with _connect(settings) as conn:
        retried = store.job_retry(conn, args.ids)
    missing = sorted(set(args.ids) - set(retried))
    print(f"queued again: {retried or 'none'}")
    if missing:
        print(f"pgdrain: error: not failed (or unknown): {missing}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def cmd_purge(args: argparse.Namespace, settings: Settings) -> int:
    if args.older_than_days > MAX_PURGE_DAYS:
        raise BadInput(f"--older-than-days must be at most {MAX_PURGE_DAYS:g}")
    with _connect(settings) as conn:
        deleted = store.job_purge_finished(conn, args.older_than_days)
    print(f"deleted {deleted} finished jobs")
    return EXIT_OK


def cmd_invoke(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from pgdrain.aws import local_invoke

    with stop_on_signals() as stop:  # the handler's drain obeys it: see cmd_drain
        result = local_invoke.invoke(
            template=Path(args.template),
            function=args.function,
            event_path=args.event,
            env_vars_path=args.env_vars,
        )
    if result.ignored_overrides:
        print(
            "pgdrain: not in the template, ignored (as sam does): "
            + ", ".join(result.ignored_overrides),
            file=sys.stderr,
        )
    print(json.dumps(result.payload))
    if (code := exit_code(stop)) is not None:
        return code
    return EXIT_FAILURE if result.failed else EXIT_OK


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from pgdrain import demo

    return demo.run(settings, conninfo_or_embedded(settings), count=args.count, budget=args.budget)


COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "migrate": cmd_migrate,
    "enqueue": cmd_enqueue,
    "drain": cmd_drain,
    "stats": cmd_stats,
    "jobs": cmd_jobs,
    "retry": cmd_retry,
    "purge": cmd_purge,
    "demo": cmd_demo,
    "invoke": cmd_invoke,
}


if __name__ == "__main__":
    raise SystemExit(main())
