"""The `pgdrain` command. Exit codes: 0 ok, 1 failure, 2 bad input (one line, nothing written)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import difflib
import importlib.metadata
import inspect
import itertools
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import psycopg

from pgdrain.api import jsonbound, periodic
from pgdrain.api.enqueue import MAX_PAYLOAD_BYTES, build_job, enqueue_many, payload_size
from pgdrain.api.kick_target import LISTENER_APPLICATION_NAME, notify_payload
from pgdrain.api.queues import pause_queue, resume_queue
from pgdrain.api.registry import Registry, load_registry
from pgdrain.budget import Budget
from pgdrain.cli import embedded
from pgdrain.cli.report import (
    format_held,
    format_job,
    format_jobs,
    format_kick,
    format_migrated,
    format_paused,
    format_result,
    format_runs,
    format_stats,
    job_as_dict,
    limits_reached,
    plural,
    printable,
    run_as_dict,
)
from pgdrain.db import connection, retention, store
from pgdrain.db.migrate import migrate
from pgdrain.db.session import ready_queues
from pgdrain.errors import BadInput, JobsModuleNotFound, PgdrainError, UnknownJobKind
from pgdrain.runner.drain import DrainResult, drain
from pgdrain.runner.stop import STOP_GRACE_SECONDS, exit_code, stop_on_signals
from pgdrain.settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CONCURRENCY,
    DEFAULT_JOBS_MODULE,
    QUEUE_NAME,
    Settings,
    describe_queues,
    parse_queues,
    serves,
)

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT = 0, 1, 2
DEFAULT_CLI_BUDGET_SECONDS = 60.0
MAX_NUMBER = 1e9  # seconds (--delay, --budget) or days; larger values overflow in PostgreSQL
MAX_BIGINT = 2**63 - 1
MAX_ENQUEUE_COUNT = 1_000_000
MAX_ENQUEUE_TOTAL_BYTES = 256 * 1024 * 1024  # --count x payload: what one command may add
# A payload file may be pretty-printed or use \u escapes: its text may be larger than the
# payload as stored, which build_job checks against MAX_PAYLOAD_BYTES once it is parsed.
MAX_PAYLOAD_TEXT_BYTES = 4 * MAX_PAYLOAD_BYTES
MAX_PURGE_DAYS = 36_500.0
STATUSES = store.STATUSES
MAX_SINCE_DAYS = 36_500.0
MAX_KIND_LENGTH = 200
# DrainResult.error_kind values that mean the settings are wrong (summary.error_kind).
CONFIG_ERROR_KINDS = ("authentication", "configuration")
# What `enqueue` uses for an option neither the command line nor the kind's decorator gives.
ENQUEUE_DEFAULTS: dict[str, Any] = {
    name: parameter.default
    for name, parameter in inspect.signature(build_job).parameters.items()
    if name in ("queue_name", "priority", "max_attempts", "recovery_policy")
}

log = logging.getLogger("pgdrain")


_STANDARD_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _ReadableFormatter(logging.Formatter):
    """One line per record, with the structured fields (`extra=`) as key=value: the same
    records the Lambda logs as JSON, readable in a terminal. A job's failed attempt is one
    short line (its kind, id, attempt and error); its traceback (in `jobs show ID`) follows,
    indented, only with `verbose` (-v). Messages and fields carry job data (kinds, errors):
    their control characters are escaped."""

    def __init__(self, fmt: str, *, verbose: bool) -> None:
        super().__init__(fmt)
        self.verbose = verbose

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = printable(super().formatMessage(record))
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD_RECORD_FIELDS}
        traceback = fields.pop("traceback", None)
        if _FAILURE_FIELDS <= fields.keys():
            line += ": " + printable(_failure_line(fields))
        elif fields:
            line += " " + " ".join(f"{k}={printable(v)}" for k, v in fields.items())
        if traceback and self.verbose:
            line += "".join(f"\n    {printable(t)}" for t in str(traceback).rstrip().splitlines())
        return line


# The fields of a job's failed attempt as the completer logs them (runner/completer.py).
_FAILURE_FIELDS = frozenset({"job_id", "kind", "attempt", "max_attempts", "error"})


def _failure_line(fields: dict[str, Any]) -> str:
    """ "send_email job 42, attempt 1/5: ValueError: no such user (next attempt in 2.0 s)"."""
    text = (
        f"{fields['kind']} job {fields['job_id']}, attempt {fields['attempt']}/"
        f"{fields['max_attempts']}: {fields['error']}"
    )
    if fields.get("retry_in_s") is not None:
        text += f" (next attempt in {fields['retry_in_s']} s)"
    return text


class _DefaultsFormatter(argparse.HelpFormatter):
    """Every option's --help line ends with its default (argparse's
    ArgumentDefaultsHelpFormatter, also for options without help text), unless the text
    already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and _shows_default(action) and "default" not in text:
            text = f"{text} (default: %(default)s)".strip()
        return text


def _shows_default(action: argparse.Action) -> bool:
    """A default worth printing: not absent, not a flag's False, not argparse's SUPPRESS."""
    return not (
        action.default is None or action.default is False or action.default == argparse.SUPPRESS
    )


_Action = TypeVar("_Action", bound=argparse.Action)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2, and --help shows defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def _add_action(self, action: _Action) -> _Action:
        # argparse prints no help text for an option without any, so its default would not
        # show: give it one that is only the default.
        if action.option_strings and action.help is None and _shows_default(action):
            action.help = "(default: %(default)s)"
        return super()._add_action(action)

    def error(self, message: str) -> NoReturn:
        print(f"pgdrain: error: {printable(message)}", file=sys.stderr)
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


def _purge_days(text: str) -> float:
    """--older-than-days: at most what retention may keep (PGDRAIN_RETAIN_*), said as such."""
    try:
        too_many = float(text) > MAX_PURGE_DAYS
    except ValueError:
        too_many = False  # not a number: said below
    if too_many:
        raise argparse.ArgumentTypeError(f"{text!r} must be at most {MAX_PURGE_DAYS:g} days")
    return _non_negative_float(text)


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


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's, through the package metadata)."""
    try:
        return importlib.metadata.version("pgdrain")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgdrain", description=__doc__)
    parser.add_argument("--version", action="version", version=f"pgdrain {installed_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    commands.add_parser("migrate", help="apply pending schema migrations")

    p = commands.add_parser("enqueue", help="enqueue jobs")
    p.add_argument("kind")
    p.add_argument("--payload", default="{}", help="JSON, or @FILE (@- for stdin); default {}")
    # These four default to the kind's decorator options (PGDRAIN_JOBS), as jobs.enqueue does.
    p.add_argument("--queue", help=_kind_default("queue", "queue_name"))
    p.add_argument("--delay", type=_non_negative_float, default=0.0, help="seconds")
    p.add_argument("--priority", type=_int, help="smaller runs first " + _kind_default("priority"))
    p.add_argument("--max-attempts", type=_int, help=_kind_default("max_attempts"))
    p.add_argument(
        "--recovery-policy", choices=("auto", "manual"), help=_kind_default("recovery_policy")
    )
    p.add_argument("--key", help="idempotency key")
    p.add_argument(
        "--sequence",
        help="jobs of one sequence key run one at a time, in enqueue order (default: none)",
    )
    p.add_argument(
        "--after",
        type=_positive_int,
        action="append",
        metavar="ID",
        help="run once job ID is done (repeat for several; default: at once)",
    )
    p.add_argument("--count", type=_positive_int, default=1)
    p.add_argument(
        "--unregistered",
        action="store_true",
        help="enqueue a kind the jobs module does not register, or without the module "
        "(its options then come from this command alone)",
    )

    p = commands.add_parser("drain", help="drain ready jobs until none is left or time is up")
    p.add_argument("--budget", type=_non_negative_float, default=DEFAULT_CLI_BUDGET_SECONDS)
    p.add_argument(
        "--queues",
        help="comma-separated: only these queues (default: PGDRAIN_QUEUES, else every queue)",
    )
    p.add_argument(
        "--concurrency",
        type=_int_between(1, 256),
        help=f"1 to 256 (default: PGDRAIN_CONCURRENCY, else {DEFAULT_CONCURRENCY})",
    )
    p.add_argument(
        "--batch-size",
        type=_int_between(1, 1000),
        help=f"1 to 1000 (default: PGDRAIN_BATCH_SIZE, else {DEFAULT_BATCH_SIZE})",
    )
    p.add_argument("--json", action="store_true")

    _add_worker_command(commands)
    _add_operator_commands(commands)

    p = commands.add_parser(
        "invoke", help="run the Lambda handler in-process as `sam local invoke` does (no Docker)"
    )
    p.add_argument("function", nargs="?", help="logical id in the template (default: its only one)")
    p.add_argument("-e", "--event", help="JSON event file, or - for stdin (default: {})")
    p.add_argument("-n", "--env-vars", help="env.json overriding the template's variables")
    p.add_argument("-t", "--template", default="template.yaml")

    p = commands.add_parser(
        "init",
        help="write a deployable project (SAM template, function code, events) into DIR",
        description="Write a deployable project into DIR: template.yaml, handler/ (the "
        "function's code: app.py, jobs.py, requirements.txt), infra/ (events, env.json), a "
        "README, and wheels/ (pgdrain's wheel, for sam build). Existing files are not "
        "overwritten without --force.",
    )
    p.add_argument("dir", nargs="?", default=".", help="the project's folder (default: here)")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")

    p = commands.add_parser("ui", help="the web dashboard, on 127.0.0.1 (docs/ui.md)")
    p.add_argument("--port", type=_int_between(0, 65535), default=8080, help="0: any free port")
    p.add_argument("--read-only", action="store_true", help="offer no action (retry, cancel)")

    p = commands.add_parser(
        "demo",
        help="migrate, enqueue demo jobs into queue demo (and a table "
        "public.pgdrain_demo_greetings) of the database, drain them, print stats",
    )
    p.add_argument("--count", type=_positive_int, default=300)
    p.add_argument("--budget", type=_non_negative_float, default=DEFAULT_CLI_BUDGET_SECONDS)
    _verbose_after_the_command(parser)
    return parser


def _verbose_after_the_command(parser: argparse.ArgumentParser) -> None:
    """`-v` after the command too (`pgdrain worker -v`, as the docs write it), as before it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                command.add_argument(
                    "-v",
                    "--verbose",
                    action="store_true",
                    default=argparse.SUPPRESS,  # unset: `pgdrain -v CMD` keeps its own
                    help="log progress (INFO), as `pgdrain -v`",
                )
                _verbose_after_the_command(command)


def _kind_default(option: str, field: str | None = None) -> str:
    fallback = ENQUEUE_DEFAULTS[field or option]
    return f"(default: the kind's {option}= in PGDRAIN_JOBS, else {fallback})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _ReadableFormatter("pgdrain: %(levelname)s %(message)s", verbose=args.verbose)
    )
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    # Job modules (PGDRAIN_JOBS) are found from the current directory, as `python -m` does.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    command: Callable[[argparse.Namespace, Settings], int] = COMMANDS[args.command]
    try:
        settings = Settings.from_env(os.environ)
        return command(args, settings)
    except BadInput as exc:  # printable: the text may hold a job module's control characters
        print(f"pgdrain: error: {printable(exc)}{_code_folder_hint(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PgdrainError as exc:
        print(f"pgdrain: error: {printable(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.Error as exc:
        if connection.is_schema_missing(exc):  # the database was never migrated
            print(f"pgdrain: error: {printable(connection.describe(exc))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"pgdrain: database error: {printable(connection.describe(exc))}", file=sys.stderr)
        return EXIT_FAILURE


def _code_folder_hint(exc: BadInput) -> str:
    """In a project's folder (`pgdrain init`), a jobs module not found here is in handler/, the
    function's code: say so."""
    if not isinstance(exc, JobsModuleNotFound):
        return ""
    module = os.environ.get("PGDRAIN_JOBS") or DEFAULT_JOBS_MODULE
    found = Path("handler", *module.split(".")).with_suffix(".py")
    if not found.is_file() or str(Path("handler").resolve()) in map(_resolved, sys.path):
        return ""
    return f"; {found} is here: export PYTHONPATH=handler"


def _resolved(entry: str) -> str:
    return str(Path(entry or ".").resolve())


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
    # The retries while the database is not up yet are logged at INFO (shown with -v): the
    # command's output on failure is its one error line.
    conn = connection.connect(
        conninfo_or_embedded(settings),
        settings,
        Budget.seconds(settings.connect_timeout),
        retry_log_level=logging.INFO,
    )
    try:
        store.operator_session(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    with _connect(settings) as conn:
        result = migrate(conn)
    print(format_migrated(result.applied))
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace, settings: Settings) -> int:
    if args.count > MAX_ENQUEUE_COUNT:
        raise BadInput(f"--count must be at most {MAX_ENQUEUE_COUNT} (got {args.count})")
    if args.key is not None and args.count > 1:
        raise BadInput("--key names one job; it cannot be combined with --count > 1")
    payload = parse_payload(args.payload)
    given = {
        "queue": args.queue,
        "priority": args.priority,
        "max_attempts": args.max_attempts,
        "recovery_policy": args.recovery_policy,
    }
    registry = Registry() if args.unregistered else _enqueue_registry(settings)
    fields = registry.defaults(args.kind, **given)
    if "queue" in fields:
        fields["queue_name"] = fields.pop("queue")
    job = build_job(
        args.kind,
        payload,
        delay=args.delay,
        idempotency_key=args.key,
        sequence=args.sequence,
        after=args.after,
        **fields,
    )
    if not args.unregistered:  # a kind that is well formed, and is it one of the module's?
        _check_kind(registry, args.kind, settings.jobs_module)
    total = payload_size(payload) * args.count
    if total > MAX_ENQUEUE_TOTAL_BYTES:
        raise BadInput(
            f"--count {args.count} x a payload of {total // args.count} bytes is {total} bytes; "
            f"the limit for one enqueue is {MAX_ENQUEUE_TOTAL_BYTES}"
        )
    with _connect(settings) as conn:
        with conn.transaction():
            if args.count == 1:
                job_id, created = store.job_insert(conn, job)
                said = f"enqueued job {job_id}" if created else f"job {job_id} exists (same key)"
            else:
                # In chunks, one transaction: never all in memory, nor in one message.
                ids = enqueue_many(conn, itertools.repeat(job, args.count))
                created = True
                said = f"enqueued {len(ids)} jobs ({ids[0]}..{ids[-1]})"
        kicked = _kick(conn, settings, [job.queue]) if created else []
    print("\n".join([said, *kicked]))
    return EXIT_OK


def _kick(conn: store.Connection, settings: Settings, queues: Sequence[str]) -> list[str]:
    """After the command's commit, start the drain function for `queues`, as the application
    does with pgdrain.kick() (PGDRAIN_FUNCTION_NAME, debounced); returns the lines saying what
    it did. Without a function configured (local use) it wakes the `pgdrain worker`s of the
    database, as kick() does there, and says nothing: a NOTIFY nobody hears costs nothing, and
    a drain or the schedule takes the jobs. Never fails the command: what it wrote is
    committed."""
    if not queues or settings.kick == "off":
        return []
    lines = []
    unserved = [q for q in queues if not serves(settings.queues, q)]
    if unserved:  # kick() refuses these in an application; here the write is committed
        lines.append(
            f"not kicked for {', '.join(unserved)}: not among PGDRAIN_QUEUES "
            f"({describe_queues(settings.queues)}), so no drain of these settings serves it; "
            "its jobs wait for a drain, worker or function that does"
        )
        queues = [q for q in queues if q not in unserved]
        if not queues:
            return lines
    if not settings.function_name:
        try:
            store.kick_notify(conn, notify_payload(queues), LISTENER_APPLICATION_NAME)
        except psycopg.Error as exc:
            log.warning("could not wake the workers: %s", connection.describe(exc))
        return lines
    from pgdrain.aws.kick import KickOutcome, kick_outcome

    try:
        outcome = kick_outcome(conn, queues, settings=settings)
    except psycopg.Error as exc:  # the kick's own bookkeeping (pgdrain.kicks) failed
        outcome = KickOutcome(settings.function_name, error=connection.describe(exc))
    return lines + format_kick(outcome)


def _enqueue_registry(settings: Settings) -> Registry:
    """The jobs module's registry: it says which kinds exist, and their options fill in what
    the command line leaves out (Registry.defaults), as `jobs.enqueue` does in code. A module
    that cannot be found or fails to import is bad input, as for `drain`: nothing is written
    (--unregistered enqueues without it)."""
    try:
        return load_registry(settings.jobs_module)
    except JobsModuleNotFound as exc:
        raise JobsModuleNotFound(f"{exc}; --unregistered enqueues without it") from None


def _check_kind(registry: Registry, kind: str, module: str) -> None:
    """A kind the jobs module does not register is refused (a typo would be retried and then
    failed by every drain), naming the nearest registered kind."""
    try:
        registry.check_kind(kind, f" in PGDRAIN_JOBS module {module!r}")
    except UnknownJobKind as exc:
        raise UnknownJobKind(f"{exc}; --unregistered enqueues it anyway") from None


def parse_payload(text: str) -> Any:
    """--payload JSON, or @FILE to read the JSON from a file (@- for standard input). A file's
    size is checked before it is read, and at most MAX_PAYLOAD_TEXT_BYTES + 1 bytes are read
    from anything (so /dev/zero, an endless pipe or a huge file costs no memory)."""
    if text.startswith("@"):
        source = text[1:]
        try:
            if source == "-":
                data = sys.stdin.buffer.read(MAX_PAYLOAD_TEXT_BYTES + 1)
            else:
                with open(source, "rb") as handle:
                    size = os.fstat(handle.fileno()).st_size  # 0 for devices and pipes
                    if size > MAX_PAYLOAD_TEXT_BYTES:
                        raise BadInput(_payload_too_big(text, size))
                    data = handle.read(MAX_PAYLOAD_TEXT_BYTES + 1)
        except OSError as exc:
            raise BadInput(f"--payload {text}: cannot read it: {exc.strerror}") from None
        if len(data) > MAX_PAYLOAD_TEXT_BYTES:
            raise BadInput(_payload_too_big(text, None))
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInput(
                f"--payload {text}: cannot read it: not UTF-8 text (offset {exc.start})"
            ) from None
    return jsonbound.loads(text, "--payload")


def _payload_too_big(source: str, size: int | None) -> str:
    what = f"is {size} bytes" if size is not None else "is longer than that"
    return (
        f"--payload {source} {what}; the limit is {MAX_PAYLOAD_TEXT_BYTES} bytes of text "
        f"({MAX_PAYLOAD_BYTES} as stored)"
    )


def _drain_settings(args: argparse.Namespace, settings: Settings) -> Settings:
    changes: dict[str, Any] = {}
    if getattr(args, "queues", None) is not None:  # `--queues ''` names no queue: refused
        changes["queues"] = parse_queues(args.queues, "--queues")
    if getattr(args, "concurrency", None):
        changes["concurrency"] = args.concurrency
    if getattr(args, "batch_size", None):
        changes["batch_size"] = args.batch_size
    return dataclasses.replace(settings, **changes)


def _run_drain(settings: Settings, budget_seconds: float, *, queues_given: bool) -> DrainResult:
    registry = load_registry(settings.jobs_module)  # first: a broken module claims nothing
    if not queues_given:  # `--queues` restricts one run on purpose: no warning for that
        periodic.warn_of_undrained(registry.periodics, settings.queues)
    conninfo = conninfo_or_embedded(settings)
    return drain(settings, Budget.seconds(budget_seconds), registry, conninfo)


# How long the hint a drain ends with (_held_by_limits) may read.
HINT_READ_TIMEOUT_MS = 2000


def _check_budget(budget: float, settings: Settings) -> None:
    """A budget the reserve would swallow claims nothing: bad input, not an empty queue."""
    if budget <= settings.reserve_seconds:
        raise BadInput(
            f"--budget {budget:g} is not above the reserve (PGDRAIN_RESERVE_SECONDS="
            f"{settings.reserve_seconds:g}), the time a run keeps to finish: nothing would be "
            f"claimed; give more than {settings.reserve_seconds:g} seconds"
        )


def cmd_drain(args: argparse.Namespace, settings: Settings) -> int:
    settings = _drain_settings(args, settings)
    _check_budget(args.budget, settings)
    # SIGINT/SIGTERM: stop claiming, let running jobs finish for a short grace, give the rest
    # back (queued at once), print the summary and exit 130/143 (pgdrain.runner.stop).
    with stop_on_signals() as stop:
        result = _run_drain(settings, args.budget, queues_given=args.queues is not None)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(format_result(result))
        if result.stop_reason == "empty" and (held := _held_by_limits(settings)):
            print(held)
    if (code := exit_code(stop)) is not None:
        return code
    if result.stop_reason != "error":
        return EXIT_OK
    # Settings that cannot work (credentials, host, sslmode...) are bad input, not an outage.
    return EXIT_BAD_INPUT if result.error_kind in CONFIG_ERROR_KINDS else EXIT_FAILURE


def _held_by_limits(settings: Settings) -> str | None:
    """After a drain that found nothing more to claim: the line naming the queues it serves
    whose ready jobs a concurrency limit or a used-up rate window holds back ("empty" alone
    would read as drained). None when there are none, or the database cannot be read now."""
    try:
        with _connect(settings) as conn:
            limits = [
                q
                for q in store.queue_limit_list(conn)
                if serves(settings.queues, q.queue) and q.paused_at is None and limits_reached(q)
            ]
            if not limits:  # the common case: one read of the small queue_limits table
                return None
            with conn.transaction():  # bounded: a hint must not hold the command up
                store.operator_read_timeout(conn, HINT_READ_TIMEOUT_MS)
                held = store.queue_depth_held_statement([q.queue for q in limits]).run(conn)
    except (PgdrainError, psycopg.Error, KeyboardInterrupt):
        return None  # the summary above is the drain's answer; this line is a hint
    return format_held(limits, held.ready)


def cmd_invoke(args: argparse.Namespace, settings: Settings) -> int:
    from pgdrain.aws import local_invoke

    with stop_on_signals() as stop:  # the handler's drain obeys it: see cmd_drain
        result = local_invoke.invoke(
            template=Path(args.template),
            function=args.function,
            event_path=args.event,
            env_vars_path=args.env_vars,
            resolve_database=embedded.start,
        )
    if result.ignored_overrides:
        print(
            "pgdrain: not in the template, ignored (as sam does): "
            + ", ".join(result.ignored_overrides),
            file=sys.stderr,
        )
    if result.shell_unused:
        print(
            "pgdrain: set in your shell, but the template gives its own value, which the "
            "function got (give yours with --env-vars): " + ", ".join(result.shell_unused),
            file=sys.stderr,
        )
    print(json.dumps(result.payload))
    if (code := exit_code(stop)) is not None:
        return code
    if isinstance(result.payload, dict) and result.payload.get("error_kind") == "configuration":
        return EXIT_BAD_INPUT  # the function's settings or job module: nothing was run
    return EXIT_FAILURE if result.failed else EXIT_OK


def cmd_init(args: argparse.Namespace, settings: Settings) -> int:
    from pgdrain.cli import init

    print(init.report(init.write(Path(args.dir), force=args.force)))
    return EXIT_OK


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    from pgdrain.ui import local

    conninfo = conninfo_or_embedded(settings)
    return local.run(conninfo, settings, args.port, actions=not args.read_only)


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from pgdrain.cli import demo

    _check_budget(args.budget, settings)
    registry = demo.load_jobs(settings, os.environ)  # first: a bad jobs module writes nothing
    embedded_dir = (
        None if settings.database_url or settings.db_secret_arn else embedded.data_dir_in_use()
    )
    return demo.run(
        settings,
        conninfo_or_embedded(settings),
        registry=registry,
        count=args.count,
        budget=args.budget,
        embedded_dir=embedded_dir,
    )


# -- the worker: drains on kicks and at due times, until stopped (docs/worker.md) ----------


def _add_worker_command(commands: Any) -> None:
    p = commands.add_parser(
        "worker",
        help="drain whenever kicked and when work falls due, until Ctrl-C (a local loop, or a "
        "container for jobs longer than Lambda's 15 minutes)",
        description="Drain whenever pgdrain.kick() wakes it (NOTIFY pgdrain_kick: kick() sends "
        "it when PGDRAIN_FUNCTION_NAME is unset, off AWS, or with PGDRAIN_KICK=worker), and "
        "when a delayed job, a retry or a periodic slot falls due; idle, it sends the database "
        "nothing. Ctrl-C or SIGTERM: no more claims, running jobs get --grace to finish, exit 0. "
        "See docs/worker.md.",
    )
    p.add_argument(
        "--queues",
        help="comma-separated: only these queues (default: PGDRAIN_QUEUES, else every queue)",
    )
    p.add_argument(
        "--concurrency",
        type=_int_between(1, 256),
        help=f"1 to 256 (default: PGDRAIN_CONCURRENCY, else {DEFAULT_CONCURRENCY})",
    )
    p.add_argument(
        "--batch-size",
        type=_int_between(1, 1000),
        help=f"1 to 1000 (default: PGDRAIN_BATCH_SIZE, else {DEFAULT_BATCH_SIZE})",
    )
    p.add_argument(
        "--grace",
        type=_non_negative_float,
        default=STOP_GRACE_SECONDS,
        help="seconds running jobs get to finish after Ctrl-C or SIGTERM",
    )
    p.add_argument("--json", action="store_true", help="a JSON object per drain")


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from pgdrain.cli import worker

    settings = _drain_settings(args, settings)
    worker.check(settings)
    registry = load_registry(settings.jobs_module)  # before connecting: a broken module
    conninfo = conninfo_or_embedded(settings)
    return worker.run(settings, registry, conninfo, grace_s=args.grace, as_json=args.json)


# -- operator commands: see and fix what happened (docs/operations.md) ----------------------


def _add_operator_commands(commands: Any) -> None:
    p = commands.add_parser("stats", help="counts per queue: ready, running, delayed, failed...")
    p.add_argument("--json", action="store_true", help="one JSON array (documented fields)")
    p.add_argument(
        "--watch",
        type=_watch_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS until Ctrl-C (with --json: one array per line)",
    )

    p = commands.add_parser("jobs", help="list recent jobs (newest first), or `jobs show ID`")
    _add_filters(p)
    p.add_argument("--status", action="append", choices=STATUSES, help="repeat for several")
    p.add_argument("--limit", type=_positive_int, default=20, help="at most this many")
    p.add_argument("--json", action="store_true", help="one JSON array (documented fields)")
    shown = p.add_subparsers(dest="jobs_command", parser_class=_Parser)
    show = shown.add_parser("show", help="every field of one job, and its error history")
    show.add_argument("id", type=_positive_int)
    show.add_argument(
        "--json", dest="show_json", action="store_true", help="one JSON object: every column"
    )

    p = commands.add_parser(
        "runs", help="the runs of the drain function that ended, newest first (trigger, counts)"
    )
    p.add_argument(
        "--limit", type=_positive_int, default=store.RUN_HISTORY_ROWS, help="at most this many"
    )
    p.add_argument("--json", action="store_true", help="one JSON array (documented fields)")

    p = commands.add_parser(
        "retry",
        help="queue failed, parked or cancelled jobs again: by id, or by filter",
        description="`retry ID...`, or `retry --failed|--parked [--queue Q] [--kind K] "
        "[--since T]`. A retried job starts again with a fresh set of attempts; one whose "
        "idempotency key another job holds is not retried, and named; so is a cancelled one "
        "whose dependency failed, was cancelled or is no longer kept.",
    )
    p.add_argument("ids", nargs="*", type=_positive_int, help="job ids")
    p.add_argument("--failed", action="store_true", help="every failed job matching the filters")
    p.add_argument("--parked", action="store_true", help="every parked job matching the filters")
    _add_filters(p)
    p.add_argument("--dry-run", action="store_true", help="print what would change; change nothing")
    p.add_argument("--json", action="store_true", help="one JSON object (documented fields)")

    p = commands.add_parser(
        "cancel",
        help="cancel jobs: a queued one never runs, a running one loses its lease; by id, or by "
        "filter",
        description="`cancel ID...`, or `cancel --queued|--running|--parked|--waiting [--queue Q] "
        "[--kind K] [--since T]`. A job already cancelled or finished is left as it is (exit "
        "0): safe to repeat.",
    )
    p.add_argument("ids", nargs="*", type=_positive_int, help="job ids")
    p.add_argument("--queued", action="store_true", help="every queued job matching the filters")
    p.add_argument("--running", action="store_true", help="every running job matching them")
    p.add_argument("--parked", action="store_true", help="every parked job matching them")
    p.add_argument(
        "--waiting",
        action="store_true",
        help="every waiting job matching them (behind its sequence or dependencies)",
    )
    _add_filters(p)
    p.add_argument("--dry-run", action="store_true", help="print what would change; change nothing")
    p.add_argument("--json", action="store_true", help="one JSON object (documented fields)")

    p = commands.add_parser(
        "pause",
        help="stop every run from claiming a queue's jobs (until `resume`)",
        description="No run claims the queue's jobs from now on; a run gives back unstarted "
        "the jobs of it it claimed ahead, and a job already started runs to its end. Kicks of "
        "it are recorded and start no run. Pausing a paused queue changes nothing (exit 0).",
    )
    p.add_argument("queue", type=_queue_name)
    p.add_argument("--json", action="store_true", help="one JSON object (documented fields)")

    p = commands.add_parser(
        "resume",
        help="let runs claim a paused queue's jobs again, and kick the function if any is ready",
        description="Runs claim the queue's jobs again; with jobs ready, the drain function is "
        "kicked (PGDRAIN_FUNCTION_NAME), as after `enqueue`. Resuming a queue that is not "
        "paused changes nothing (exit 0).",
    )
    p.add_argument("queue", type=_queue_name)
    p.add_argument("--json", action="store_true", help="one JSON object (documented fields)")

    p = commands.add_parser(
        "server", help="the embedded PostgreSQL the CLI starts when DATABASE_URL is unset"
    )
    actions = p.add_subparsers(
        dest="server_command", metavar="{status,stop}", required=True, parser_class=_Parser
    )
    actions.add_parser(
        "status", help="is it running, and the URL to connect to it (psql, DATABASE_URL)"
    )
    actions.add_parser(
        "stop",
        help=f"stop it (its data, in ${embedded.DATA_DIR_VARIABLE} or "
        "$XDG_DATA_HOME/pgdrain/pgdata, by default ~/.local/share/pgdrain/pgdata, is kept)",
    )

    p = commands.add_parser(
        "purge", help="delete done, failed and cancelled jobs older than N days"
    )
    p.add_argument("--older-than-days", type=_purge_days, default=7.0)
    p.add_argument("--queue", type=_queue_name, help="only this queue (default: every queue)")
    p.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    p.add_argument("--json", action="store_true", help="one JSON object (documented fields)")


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue", type=_queue_name, help="only this queue")
    p.add_argument("--kind", type=_kind, help="only this job kind")
    p.add_argument(
        "--since",
        type=_since,
        metavar="T",
        help="changed state since T: an ISO 8601 time (UTC unless it says) or an age "
        "such as 90s, 30m, 2h, 7d",
    )


def _watch_seconds(text: str) -> float:
    value = _non_negative_float(text)
    if value < 0.5:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 0.5 seconds")
    return value


def _queue_name(text: str) -> str:
    if not QUEUE_NAME.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a queue name")
    return text


def _kind(text: str) -> str:
    if not text or len(text) > MAX_KIND_LENGTH or not text.isprintable():
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a job kind (printable, 1 to {MAX_KIND_LENGTH} characters)"
        )
    return text


_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])\Z")
_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _since(text: str) -> dt.datetime:
    """An age (`90s`, `30m`, `2h`, `7d`: that long ago) or an ISO 8601 time (naive = UTC)."""
    now = dt.datetime.now(dt.UTC)
    if match := _AGE.match(text):
        seconds = float(match[1]) * _AGE_UNITS[match[2]]
        if seconds > MAX_SINCE_DAYS * 86400:
            raise argparse.ArgumentTypeError(f"{text!r} reaches back more than 100 years")
        return now - dt.timedelta(seconds=seconds)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an age (90s, 30m, 2h, 7d) nor an ISO 8601 time"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


# How soon a watch notices Ctrl-C while it waits for its next redraw.
WATCH_STOP_CHECK_SECONDS = 0.1


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    with _connect(settings) as conn:
        if args.watch is None:
            _print_stats(conn, args.json, clear=False, settings=settings)
            return EXIT_OK
        clear = sys.stdout.isatty() and not args.json
        # Ctrl-C is how a watch ends, a normal exit. It only raises a flag: as an exception it
        # could land inside the driver's wait for a query, which cancels the query and may not
        # hand the interrupt back (seen once in CI: a watch that never ended).
        stopping = False

        def stop(_signum: int, _frame: object) -> None:
            nonlocal stopping
            stopping = True

        previous = signal.signal(signal.SIGINT, stop)
        try:
            while not stopping:
                _print_stats(conn, args.json, clear=clear, settings=settings)
                deadline = time.monotonic() + args.watch
                while not stopping and (left := deadline - time.monotonic()) > 0:
                    time.sleep(min(left, WATCH_STOP_CHECK_SECONDS))
        finally:
            signal.signal(signal.SIGINT, previous)
        return EXIT_OK


def _keeps_done(conn: store.Connection, settings: Settings) -> bool:
    """Whether done jobs are kept: not when this process deletes them, nor when the function's
    runs do (their own PGDRAIN_RETAIN_DONE, recorded on their history lines)."""
    return settings.keeps_done and store.runs_keep_done(conn) is not False


def _no_job(conn: store.Connection, settings: Settings, ids: Sequence[int]) -> str:
    """The error line for ids no job has."""
    return f"pgdrain: error: no job {', '.join(map(str, ids))}{_gone(conn, settings)}"


def _gone(conn: store.Connection, settings: Settings) -> str:
    """Where done jobs are not kept, a job that finished done has no row: said after a line
    about ids that matched nothing, so that they are not taken for wrong ids."""
    if _keeps_done(conn, settings):
        return ""
    return " (done jobs are not kept, PGDRAIN_RETAIN_DONE=0: one that finished done is gone)"


def _print_stats(conn: store.Connection, as_json: bool, *, clear: bool, settings: Settings) -> None:
    rows = store.queue_stats(conn)
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in rows]), flush=True)
        return
    if clear:
        print("\x1b[H\x1b[2J", end="")  # home and clear: the view redraws in place
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    shown = format_stats(rows, settings.queues, keeps_done=_keeps_done(conn, settings))
    print(f"{stamp}\n{shown}", flush=True)


def cmd_jobs(args: argparse.Namespace, settings: Settings) -> int:
    if args.jobs_command == "show":
        return _show_job(args, settings)
    with _connect(settings) as conn:
        rows = store.job_list(
            conn,
            args.status or list(STATUSES),
            args.limit,
            queue=args.queue,
            kind=args.kind,
            since=args.since,
            values=args.json,  # the table shows neither progress nor output
        )
        if not rows:
            _note_unknown_queue(conn, args.queue)
        paused = {q.queue for q in store.queue_limit_list(conn) if q.paused_at is not None}
    if args.json:
        print(json.dumps([{**job_as_dict(r), "queue_paused": r.queue in paused} for r in rows]))
    else:
        print(format_jobs(rows))
        listed = sorted({r.queue for r in rows} & paused)
        if listed:
            print(format_paused([printable(q) for q in listed]))
    return EXIT_OK


def _note_unknown_queue(conn: store.Connection, queue: str | None) -> None:
    """A queue filter that matched nothing is an empty result, an idle queue's as any other's.
    Where the database knows no such queue (no job, no settings, no kick) but one close to it,
    a likely typo, a note on stderr names that one."""
    if queue is not None and (nearest := _nearest_unknown(conn, queue)):
        print(_unknown_queue_note(queue, nearest), file=sys.stderr)


def _nearest_unknown(conn: store.Connection, queue: str) -> str | None:
    """The known queue closest to `queue` when the database knows no queue of that name."""
    known = {r.queue for r in store.queue_stats(conn)}
    known |= {r.queue for r in store.queue_limit_list(conn)}
    known |= {r.queue for r in store.kick_list(conn)}
    if queue in known:
        return None
    nearest = difflib.get_close_matches(queue, sorted(known), n=1)
    return nearest[0] if nearest else None


def _unknown_queue_note(queue: str, nearest: str) -> str:
    return (
        f"pgdrain: note: no job, setting or kick names queue {queue!r} "
        f"(did you mean {printable(nearest)!r}?)"
    )


def _show_job(args: argparse.Namespace, settings: Settings) -> int:
    with _connect(settings) as conn:
        job = store.job_show(conn, args.id)
        if job is None:
            print(_no_job(conn, settings, [args.id]), file=sys.stderr)
            return EXIT_FAILURE
    as_json = args.show_json or args.json
    print(json.dumps(job, sort_keys=True) if as_json else format_job(job))
    return EXIT_OK


def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    """The run history (pgdrain.run_history): what the dashboard's control page lists."""
    with _connect(settings) as conn:
        rows = store.run_history_list(conn, args.limit)
    if args.json:
        print(json.dumps([run_as_dict(r) for r in rows]))
    else:
        print(format_runs(rows))
    return EXIT_OK


RetryStatus = Literal["failed", "parked"]


def _waits_for_lease(until: dt.datetime) -> str:
    """What a retried job waits for: the lease of the attempt its cancel cut short."""
    return (
        f"runs from {until.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC: it was "
        "cancelled while running, and that attempt may run until its lease ends"
    )


def cmd_retry(args: argparse.Namespace, settings: Settings) -> int:
    statuses: list[RetryStatus] = []
    if args.failed:
        statuses.append("failed")
    if args.parked:
        statuses.append("parked")
    filtered = args.queue is not None or args.kind is not None or args.since is not None
    if args.ids and (statuses or filtered):
        raise BadInput("give job ids or a filter (--failed/--parked ...), not both")
    if not args.ids and not statuses:
        raise BadInput("name the jobs: ids, or --failed and/or --parked (with filters)")
    verb = "would queue again" if args.dry_run else "queued again"
    with _connect(settings) as conn:
        # Each try of the retry reads a snapshot of its own (store.job_retry), whatever the
        # server's default isolation.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        with conn.transaction() as tx:
            if args.ids:
                found = store.job_retry(conn, args.ids)
            else:
                found = store.job_retry_matching(
                    conn, statuses, queue=args.queue, kind=args.kind, since=args.since
                )
            if args.dry_run:  # the same statement, rolled back: exactly what a real run does
                raise psycopg.Rollback(tx)
        retried = sorted((r for r in found if r.retried), key=lambda r: r.id)
        refused = sorted((r for r in found if not r.retried and r.why_not()), key=lambda r: r.id)
        if not found and not args.ids:
            _note_unknown_queue(conn, args.queue)
        kicked: list[str] = []
        if retried and not args.dry_run:
            kicked = _kick(conn, settings, store.job_queues(conn, [r.id for r in retried]))
        missing = sorted(set(args.ids) - {r.id for r in (*retried, *refused)})
        # Of those, the ones that will run anyway (queued, running, waiting: a retry whose
        # reply was lost, run again, finds its jobs so): said, not an error.
        now = store.job_status_many(conn, missing) if missing else {}
        pending = {i: now[i] for i in missing if now.get(i) in ("queued", "running", "waiting")}
        missing = [i for i in missing if i not in pending]
        gone = _gone(conn, settings) if missing else ""
    if args.json:
        print(
            json.dumps(
                {
                    "dry_run": args.dry_run,
                    "queued_again": [r.id for r in retried],
                    "key_held": {
                        str(r.id): r.held_by
                        for r in refused
                        if r.held_by is not None and r.dependency is None
                    },
                    "dependency_ended": {
                        str(r.id): {"id": r.dependency, "status": r.dependency_status}
                        for r in refused
                        if r.dependency is not None
                    },
                    "not_queued_again": missing,
                    "already_pending": {str(i): status for i, status in pending.items()},
                    "waits_for_lease": {
                        str(r.id): r.lease_wait_until.isoformat()
                        for r in retried
                        if r.lease_wait_until is not None
                    },
                }
            )
        )
    elif args.ids:
        print(f"{verb}: {[r.id for r in retried] or 'none'}")
        for r in refused:
            print(f"not retried: {r.id} ({r.why_not()})")
        for r in retried:
            if r.lease_wait_until is not None:
                print(f"job {r.id} {_waits_for_lease(r.lease_wait_until)}")
    else:
        print(f"{verb}: {plural(len(retried), 'job')}")
        for r in retried:
            print(f"{r.id:>8} {printable(r.queue):<12} {printable(r.kind)}")
        if refused:
            print(f"not retried: {plural(len(refused), 'job')}")
            for r in refused:
                print(f"{r.id:>8} {printable(r.queue):<12} {printable(r.kind)} ({r.why_not()})")
    if not args.json:
        for job_id, status in pending.items():
            print(f"job {job_id} is already {status}: nothing to retry")
        for line in kicked:
            print(line)
    if missing:
        print(
            f"pgdrain: error: not failed, parked or cancelled (or unknown): {missing}{gone}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    # Not an error: a job whose key is held (the holder does the work), or whose dependency
    # ended (said on its line).
    return EXIT_OK


CancelStatus = Literal["queued", "running", "parked", "waiting"]


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel by id or by filter. A job already cancelled or finished is said and left as it
    is (exit 0: safe to repeat); only an unknown id is an error (exit 1)."""
    statuses: list[CancelStatus] = [
        status for status in ("queued", "running", "parked", "waiting") if getattr(args, status)
    ]
    filtered = args.queue is not None or args.kind is not None or args.since is not None
    if args.ids and (statuses or filtered):
        raise BadInput("give job ids or a filter (--queued/--running/--parked ...), not both")
    if not args.ids and not statuses:
        raise BadInput(
            "name the jobs: ids, or --queued, --running, --parked and/or --waiting (with filters)"
        )
    made_ready: set[str] = set()  # queues of jobs the cancel let run (sequences: docs/jobs.md)
    with _connect(settings) as conn:
        conn.add_notice_handler(lambda diag: made_ready.update(ready_queues(diag)))
        # A job changed under the cancel is cancelled by its next try, which reads a snapshot
        # of its own (store.job_cancel), whatever the server's default isolation.
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        with conn.transaction() as tx:
            if args.ids:
                cancelled = [
                    store.CancelledMatch(c.id, "", "", c.was)
                    for c in store.job_cancel(conn, args.ids)
                ]
            else:
                cancelled = store.job_cancel_matching(
                    conn, statuses, queue=args.queue, kind=args.kind, since=args.since
                )
            if args.dry_run:  # the same statement, rolled back: exactly what a real run does
                raise psycopg.Rollback(tx)
        left = sorted(set(args.ids) - {c.id for c in cancelled})
        found = store.job_status_many(conn, left) if left else {}
        if not cancelled and not args.ids:
            _note_unknown_queue(conn, args.queue)
        kicked: list[str] = []
        if made_ready and not args.dry_run:
            kicked = _kick(conn, settings, sorted(made_ready))
        unknown = [i for i in left if i not in found]
        error = _no_job(conn, settings, unknown) if unknown else ""
    _print_cancelled(args, cancelled, {i: found[i] for i in left if i in found}, unknown)
    if not args.json:
        for line in kicked:
            print(line)
    if unknown:
        print(error, file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def _print_cancelled(
    args: argparse.Namespace,
    cancelled: Sequence[store.CancelledMatch],
    already: dict[int, str],
    unknown: list[int],
) -> None:
    if args.json:
        jobs: list[dict[str, Any]] = [{"id": c.id, "was": c.was} for c in cancelled]
        if not args.ids:
            jobs = [{"id": c.id, "queue": c.queue, "kind": c.kind, "was": c.was} for c in cancelled]
        print(
            json.dumps(
                {
                    "dry_run": args.dry_run,
                    "cancelled": jobs,
                    "already_finished": [{"id": i, "status": s} for i, s in already.items()],
                    "unknown": unknown,
                }
            )
        )
        return
    verb = "would cancel" if args.dry_run else "cancelled"
    if not args.ids:
        print(f"{verb}: {plural(len(cancelled), 'job')}")
    for c in cancelled:
        where = f" {printable(c.queue)} {printable(c.kind)}" if c.queue else ""
        note = (
            ": its run loses the lease, and its outcome will be refused"
            if c.was == "running"
            else ""
        )
        print(f"{verb} {c.id}{where} (was {c.was}){note}")
    for job_id, status in already.items():
        state = "already cancelled" if status == "cancelled" else f"already finished ({status})"
        print(f"job {job_id} is {state}: nothing to cancel")


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    """Pause; a queue the database knows nothing of is paused ahead of its jobs, with a note
    when its name is close to a known queue's (a typo pauses nothing that runs)."""
    with _connect(settings) as conn:
        nearest = _nearest_unknown(conn, args.queue)
        paused_at = pause_queue(conn, args.queue)
    if nearest:
        print(_unknown_queue_note(args.queue, nearest), file=sys.stderr)
    if args.json:
        print(json.dumps({"queue": args.queue, "paused_at": paused_at.isoformat()}))
    else:
        print(f"paused {printable(args.queue)} (since {paused_at.isoformat()})")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume, then (committed) kick the queue as an enqueue does: a run when a job is ready, a
    wake-up when one is due later (a kick held while paused set none). Each is a statement of
    its own, so a second resume finds it resumed and kicks again at worst."""
    with _connect(settings) as conn:
        was_paused = resume_queue(conn, args.queue)
        ready = store.queue_has_ready(conn, [args.queue])
        kicked = _kick(conn, settings, [args.queue])
    if args.json:
        print(json.dumps({"queue": args.queue, "was_paused": was_paused, "ready": ready}))
    else:
        state = "resumed" if was_paused else "not paused: nothing changed for"
        print("\n".join([f"{state} {printable(args.queue)}", *kicked]))
    return EXIT_OK


def cmd_server(args: argparse.Namespace, settings: Settings) -> int:
    folder = embedded.data_dir_in_use()
    if args.server_command == "status":
        return _server_status(folder, settings)
    if embedded.stop(folder):
        print(f"stopped the embedded PostgreSQL in {folder}")
    else:
        print(f"the embedded PostgreSQL in {folder} is not running")
    return EXIT_OK


def _server_status(folder: Path, settings: Settings) -> int:
    url = embedded.running_url(folder)
    if url is None:
        print(
            f"the embedded PostgreSQL in {folder} is not running "
            "(the next pgdrain command that needs it starts it)"
        )
    else:
        print(f"the embedded PostgreSQL in {folder} is running")
        print(f"connect: psql '{url}'")
        print(f"or, for other tools: export DATABASE_URL='{url}'")
    if settings.database_url or settings.db_secret_arn:
        print("(DATABASE_URL or PGDRAIN_DB_SECRET_ARN is set: the CLI uses that database instead)")
    return EXIT_OK


PURGE_BATCH = 5000


def cmd_purge(args: argparse.Namespace, settings: Settings) -> int:
    where = f" in queue {args.queue!r}" if args.queue else ""
    with _connect(settings) as conn:
        if args.dry_run:
            deleted = store.job_count_finished(conn, args.older_than_days, queue=args.queue)
        else:
            # Whole days of done jobs first, as retention drops them; then the rest by rows.
            # With --queue only rows: a day's partition holds every queue's jobs.
            deleted = 0 if args.queue else retention.purge_whole_days(conn, args.older_than_days)
            while True:  # batches, each its own short statement (autocommit)
                batch = store.job_purge_finished(
                    conn, args.older_than_days, PURGE_BATCH, queue=args.queue
                )
                deleted += batch
                if batch < PURGE_BATCH:
                    break
        if not deleted:
            _note_unknown_queue(conn, args.queue)
    if args.json:
        print(
            json.dumps(
                {
                    "dry_run": args.dry_run,
                    "deleted": deleted,
                    "older_than_days": args.older_than_days,
                    "queue": args.queue,
                }
            )
        )
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {plural(deleted, 'finished job')}{where}")
    return EXIT_OK


COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "migrate": cmd_migrate,
    "enqueue": cmd_enqueue,
    "drain": cmd_drain,
    "stats": cmd_stats,
    "jobs": cmd_jobs,
    "runs": cmd_runs,
    "retry": cmd_retry,
    "purge": cmd_purge,
    "cancel": cmd_cancel,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "server": cmd_server,
    "demo": cmd_demo,
    "invoke": cmd_invoke,
    "init": cmd_init,
    "worker": cmd_worker,
    "ui": cmd_ui,
}


if __name__ == "__main__":
    raise SystemExit(main())
