"""Settings from the environment, validated once at start with messages naming the variable."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgdrain.errors import ConfigError

# PGDRAIN_QUEUES unset: a run serves every queue. A list of queues restricts it (opt-in).
DEFAULT_QUEUES: tuple[str, ...] | None = None
DEFAULT_JOBS_MODULE = "jobs"
DEFAULT_BATCH_SIZE = 10  # at most this many per claim, and never more than free slots
DEFAULT_CONCURRENCY = 10
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_RESERVE_SECONDS = 3.0
# The reserve may not be smaller than the final margin (budget.FINAL_MARGIN_SECONDS): with a
# reserve of 0 the run would claim until the hard kill, with no time left to release or record.
MIN_RESERVE_SECONDS = 0.5
DEFAULT_CONNECT_TIMEOUT_SECONDS = 20.0  # an Aurora Serverless v2 resume takes about 15 s
DEFAULT_RECLAIM_LIMIT = 500
DEFAULT_MAX_CHAIN = 10  # Lambda stops pure Lambda->Lambda loops at about 16 hops
DEFAULT_KICK_DEBOUNCE_SECONDS = 2.0
# The scheduled run deletes finished jobs older than these. Done jobs kept 0 days are not kept
# at all: their completion deletes them (Settings.keeps_done).
DEFAULT_RETAIN_DONE_DAYS = 7.0
DEFAULT_RETAIN_FAILED_DAYS = 30.0  # failed and cancelled: kept longer, to read why
MAX_RETAIN_DAYS = 36_500.0
DEFAULT_MAX_RUNS = 10  # concurrent runs in all, fan-out included: each holds one connection
# A run fans out when its ready work would take it longer than this (or than its budget): long
# enough that a spawned run's start (a cold start and a connect) is a small share of its work.
DEFAULT_FANOUT_SECONDS = 10.0
DEFAULT_WAKE_PRECISION_SECONDS = 60.0  # EventBridge Scheduler's one-shot precision: a minute

PoolerMode = Literal["session", "transaction"]
POOLER_MODES: tuple[str, ...] = get_args(PoolerMode)
# Where kick() goes (PGDRAIN_KICK): the function, a `pgdrain worker` (NOTIFY), nowhere, or
# `auto`: the function when PGDRAIN_FUNCTION_NAME is set (api/kick_target.py says the rest).
KickMode = Literal["auto", "lambda", "worker", "off"]
KICK_MODES: tuple[str, ...] = get_args(KickMode)
QUEUE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}\Z")  # \Z: no "name\n"
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")

# Every variable Settings reads; template.yaml must declare each one (a unit test checks).
ENV_VARIABLES = (
    "DATABASE_URL",
    "PGDRAIN_DB_SECRET_ARN",
    "PGDRAIN_QUEUES",
    "PGDRAIN_JOBS",
    "PGDRAIN_BATCH_SIZE",
    "PGDRAIN_CONCURRENCY",
    "PGDRAIN_LEASE_SECONDS",
    "PGDRAIN_RESERVE_SECONDS",
    "PGDRAIN_POOLER",
    "PGDRAIN_CONNECT_TIMEOUT",
    "PGDRAIN_RECLAIM_LIMIT",
    "PGDRAIN_MAX_CHAIN",
    "PGDRAIN_KICK_DEBOUNCE_SECONDS",
    "PGDRAIN_FUNCTION_NAME",
    "PGDRAIN_RETAIN_DONE",
    "PGDRAIN_RETAIN_FAILED",
    "PGDRAIN_MAX_RUNS",
    "PGDRAIN_FANOUT_SECONDS",
    "PGDRAIN_SCHEDULE_GROUP",
    "PGDRAIN_SCHEDULER_ROLE_ARN",
    "PGDRAIN_WAKE_PRECISION_SECONDS",
    "PGDRAIN_QUEUE_LIMITS",
    "PGDRAIN_SCHEDULE_RATE",
    "PGDRAIN_KICK",
)
# PGDRAIN_SCHEDULE_RATE: the template's ScheduleRate as written ("1 hour"), or seconds.
DURATION = re.compile(r"^(\d+(?:\.\d+)?) *(second|seconds|minute|minutes|hour|hours|day|days)\Z")
UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


def check_queue_name(name: str, source: str = "queue") -> str:
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise ConfigError(
            f"{source}: {name!r} is not a queue name (letters, digits, '_', '.', '-'; "
            "starting with a letter or '_'; at most 63 characters)"
        )
    return name


def parse_queues(raw: str, source: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in raw.split(",") if part.strip())
    if not names:
        raise ConfigError(f"{source} names no queue")
    queues = tuple(dict.fromkeys(check_queue_name(n, source) for n in names))
    if len(queues) > MAX_QUEUES:  # else the function refuses its own continue and wake events
        raise ConfigError(
            f"{source} names {len(queues)} queues; at most {MAX_QUEUES} (the events that carry "
            "them are bounded): unset, a run drains every queue"
        )
    return queues


# The most queues a run may be restricted to: its continue, wake and fan-out events carry
# them, and an event naming more is refused (pgdrain.aws.events).
MAX_QUEUES = 100


def describe_queues(queues: tuple[str, ...] | None) -> str:
    """The queues a run serves, as a person reads them."""
    return "every queue" if queues is None else ",".join(queues)


def serves(queues: Sequence[str] | None, queue: str) -> bool:
    """Does a run of `queues` (None: every queue) serve `queue`? (PGDRAIN_QUEUES, a trigger's
    queues): the one place that says so."""
    return queues is None or queue in queues


def parse_queue_limits(raw: str) -> tuple[tuple[str, int], ...]:
    """The concurrency limits: "emails=2,api=10+100/1m" -> (("api", 10), ("emails", 2))."""
    return tuple(
        (name, running)
        for name, (running, _) in sorted(_queue_limit_entries(raw).items())
        if running is not None
    )


def parse_queue_rates(raw: str) -> tuple[tuple[str, int, int], ...]:
    """The rate limits, (queue, starts, period in seconds): "api=10+100/1m" ->
    (("api", 100, 60),)."""
    return tuple(
        (name, *rate)
        for name, (_, rate) in sorted(_queue_limit_entries(raw).items())
        if rate is not None
    )


# A rate's period: a whole number of seconds, minutes, hours or days ("60s", "1m", "m").
RATE_PERIOD = re.compile(r"^([0-9]*)(s|m|h|d)$")
PERIOD_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_RATE_PERIOD_SECONDS = 86400


def _queue_limit_entries(raw: str) -> dict[str, tuple[int | None, tuple[int, int] | None]]:
    """PGDRAIN_QUEUE_LIMITS: QUEUE=SPEC, comma-separated; SPEC is a concurrency limit (N), a
    rate (N/PERIOD: at most N jobs started per PERIOD), or both joined by "+"."""
    entries: dict[str, tuple[int | None, tuple[int, int] | None]] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name, sep, spec = part.partition("=")
        if not sep or not spec.strip():
            raise ConfigError(
                f"PGDRAIN_QUEUE_LIMITS: {part!r} is not QUEUE=LIMIT, QUEUE=N/PERIOD "
                "or QUEUE=LIMIT+N/PERIOD"
            )
        name = check_queue_name(name.strip(), "PGDRAIN_QUEUE_LIMITS")
        if name in entries:
            # One entry each: a second would silently replace the first's limits.
            raise ConfigError(
                f"PGDRAIN_QUEUE_LIMITS: queue {name!r} is named twice; give both limits in "
                f"one entry, as {name}=LIMIT+N/PERIOD"
            )
        running: int | None = None
        rate: tuple[int, int] | None = None
        for piece in (x.strip() for x in spec.split("+")):
            number, slash, period = piece.partition("/")
            if (running if not slash else rate) is not None:
                raise ConfigError(
                    f"PGDRAIN_QUEUE_LIMITS: {part!r} gives two "
                    f"{'concurrency limits' if not slash else 'rates'}; give one of each at most"
                )
            if not slash:
                running = _integer("PGDRAIN_QUEUE_LIMITS", number.strip())
                continue
            match = RATE_PERIOD.match(period.strip().lower())
            if match is None:
                raise ConfigError(
                    f"PGDRAIN_QUEUE_LIMITS: {piece!r}: the period is a whole number of "
                    "s, m, h or d, as in 100/1m"
                )
            seconds = int(match.group(1) or 1) * PERIOD_SECONDS[match.group(2)]
            rate = (_integer("PGDRAIN_QUEUE_LIMITS", number.strip()), seconds)
        entries[name] = (running, rate)
    return entries


@dataclass(frozen=True)
class Settings:
    """Everything a run is configured by (from_env reads it from the environment)."""

    database_url: str | None = field(default=None, repr=False)  # holds a password
    db_secret_arn: str | None = None
    # The queues a run serves; None: every queue (a job enqueued in any queue is run).
    queues: tuple[str, ...] | None = DEFAULT_QUEUES
    jobs_module: str = DEFAULT_JOBS_MODULE
    batch_size: int = DEFAULT_BATCH_SIZE
    concurrency: int = DEFAULT_CONCURRENCY
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    reserve_seconds: float = DEFAULT_RESERVE_SECONDS
    pooler: PoolerMode = "session"
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS
    reclaim_limit: int = DEFAULT_RECLAIM_LIMIT
    max_chain: int = DEFAULT_MAX_CHAIN
    kick_debounce_seconds: float = DEFAULT_KICK_DEBOUNCE_SECONDS
    function_name: str | None = None
    retain_done_days: float = DEFAULT_RETAIN_DONE_DAYS
    retain_failed_days: float = DEFAULT_RETAIN_FAILED_DAYS
    max_runs: int = DEFAULT_MAX_RUNS
    # Fan-out's horizon: more runs start when this run alone would take longer than this to
    # drain what is ready (0: only when it would not finish within its budget).
    fanout_seconds: float = DEFAULT_FANOUT_SECONDS
    # Where a run creates its one-shot wake-up schedules, and the role they invoke through;
    # without both, the wake-up time is only reported (local runs).
    schedule_group: str | None = None
    scheduler_role_arn: str | None = None
    wake_precision_seconds: float = DEFAULT_WAKE_PRECISION_SECONDS
    # At most this many running jobs per queue across all runs: (("emails", 2),).
    queue_limits: tuple[tuple[str, int], ...] = ()
    # At most this many jobs started per period (seconds) per queue: (("api", 100, 60),).
    queue_rates: tuple[tuple[str, int, int], ...] = ()
    # The safety net's interval (the template's ScheduleRate). Given, a run that ends having
    # found every queue empty moves the next safety-net run to this long after it, and the rate
    # schedule's ticks before then touch no database (pgdrain.aws.safety_net). None: the rate
    # schedule alone.
    schedule_rate_seconds: float | None = None
    # Where kick() sends a kick (read by the application; api/kick_target.py).
    kick: KickMode = "auto"

    def __post_init__(self) -> None:
        if self.database_url is not None:
            _check_conninfo(self.database_url)
        _require(1 <= self.batch_size <= 1000, "PGDRAIN_BATCH_SIZE", "from 1 to 1000")
        _require(1 <= self.concurrency <= 256, "PGDRAIN_CONCURRENCY", "from 1 to 256")
        _require(1 <= self.lease_seconds <= 86400, "PGDRAIN_LEASE_SECONDS", "from 1 to 86400")
        _require(
            MIN_RESERVE_SECONDS <= self.reserve_seconds <= 600,
            "PGDRAIN_RESERVE_SECONDS",
            f"from {MIN_RESERVE_SECONDS} to 600",
        )
        _require(self.pooler in POOLER_MODES, "PGDRAIN_POOLER", "'session' or 'transaction'")
        _require(self.kick in KICK_MODES, "PGDRAIN_KICK", "'auto', 'lambda', 'worker' or 'off'")
        if self.kick == "lambda" and not self.function_name:
            raise ConfigError(
                "PGDRAIN_KICK=lambda needs PGDRAIN_FUNCTION_NAME: the drain function's name or ARN"
            )
        _require(0.5 <= self.connect_timeout <= 120, "PGDRAIN_CONNECT_TIMEOUT", "from 0.5 to 120")
        _require(1 <= self.reclaim_limit <= 100000, "PGDRAIN_RECLAIM_LIMIT", "from 1 to 100000")
        _require(0 <= self.max_chain <= 15, "PGDRAIN_MAX_CHAIN", "from 0 to 15")
        _require(
            0 <= self.kick_debounce_seconds <= 3600,
            "PGDRAIN_KICK_DEBOUNCE_SECONDS",
            "from 0 to 3600",
        )
        for variable, days in (
            ("PGDRAIN_RETAIN_DONE", self.retain_done_days),
            ("PGDRAIN_RETAIN_FAILED", self.retain_failed_days),
        ):
            _require(
                0 <= days <= MAX_RETAIN_DAYS,
                variable,
                f"a number of days from 0 to {MAX_RETAIN_DAYS:g}",
            )
        _require(1 <= self.max_runs <= 1000, "PGDRAIN_MAX_RUNS", "from 1 to 1000")
        _require(0 <= self.fanout_seconds <= 3600, "PGDRAIN_FANOUT_SECONDS", "from 0 to 3600")
        _require(
            1 <= self.wake_precision_seconds <= 3600,
            "PGDRAIN_WAKE_PRECISION_SECONDS",
            "from 1 to 3600",
        )
        if self.schedule_rate_seconds is not None:
            _require(
                1 <= self.schedule_rate_seconds <= 366 * 86400,
                "PGDRAIN_SCHEDULE_RATE",
                "from 1 second to 366 days",
            )
        for name, limit in self.queue_limits:
            check_queue_name(name, "PGDRAIN_QUEUE_LIMITS")
            _require(1 <= limit <= 100000, "PGDRAIN_QUEUE_LIMITS", "limits from 1 to 100000")
        for name, starts, seconds in self.queue_rates:
            check_queue_name(name, "PGDRAIN_QUEUE_LIMITS")
            _require(1 <= starts <= 1000000, "PGDRAIN_QUEUE_LIMITS", "rates from 1 to 1000000 jobs")
            _require(
                1 <= seconds <= MAX_RATE_PERIOD_SECONDS,
                "PGDRAIN_QUEUE_LIMITS",
                "rate periods from 1 second to 1 day",
            )
        if self.queues is not None:
            if not self.queues:
                raise ConfigError("PGDRAIN_QUEUES names no queue")
            for name in self.queues:
                check_queue_name(name, "PGDRAIN_QUEUES")
        if not MODULE_NAME.match(self.jobs_module):
            raise ConfigError(f"PGDRAIN_JOBS: {self.jobs_module!r} is not a module name")

    @property
    def keeps_done(self) -> bool:
        """Whether a done job moves to the history (finished_jobs). PGDRAIN_RETAIN_DONE=0: its
        completion deletes it, as graphile-worker's and PgQueuer's do, unless its finish
        releases another job (a sequence's next, its dependents)."""
        return self.retain_done_days > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        def text(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        kwargs: dict[str, object] = {
            "database_url": text("DATABASE_URL"),
            "db_secret_arn": text("PGDRAIN_DB_SECRET_ARN"),
            "function_name": text("PGDRAIN_FUNCTION_NAME"),
            "schedule_group": text("PGDRAIN_SCHEDULE_GROUP"),
            "scheduler_role_arn": text("PGDRAIN_SCHEDULER_ROLE_ARN"),
        }
        if (raw := text("PGDRAIN_QUEUES")) is not None:
            kwargs["queues"] = parse_queues(raw, "PGDRAIN_QUEUES")
        if (raw := text("PGDRAIN_JOBS")) is not None:
            kwargs["jobs_module"] = raw
        if (raw := text("PGDRAIN_QUEUE_LIMITS")) is not None:
            kwargs["queue_limits"] = parse_queue_limits(raw)
            kwargs["queue_rates"] = parse_queue_rates(raw)
        if (raw := text("PGDRAIN_POOLER")) is not None:
            kwargs["pooler"] = raw.lower()
        if (raw := text("PGDRAIN_KICK")) is not None:
            kwargs["kick"] = raw.lower()
        if (raw := text("PGDRAIN_SCHEDULE_RATE")) is not None:
            kwargs["schedule_rate_seconds"] = parse_duration("PGDRAIN_SCHEDULE_RATE", raw)
        for name, attr in (
            ("PGDRAIN_BATCH_SIZE", "batch_size"),
            ("PGDRAIN_CONCURRENCY", "concurrency"),
            ("PGDRAIN_RECLAIM_LIMIT", "reclaim_limit"),
            ("PGDRAIN_MAX_CHAIN", "max_chain"),
            ("PGDRAIN_MAX_RUNS", "max_runs"),
        ):
            if (raw := text(name)) is not None:
                kwargs[attr] = _integer(name, raw)
        for name, attr in (
            ("PGDRAIN_LEASE_SECONDS", "lease_seconds"),
            ("PGDRAIN_RESERVE_SECONDS", "reserve_seconds"),
            ("PGDRAIN_CONNECT_TIMEOUT", "connect_timeout"),
            ("PGDRAIN_KICK_DEBOUNCE_SECONDS", "kick_debounce_seconds"),
            ("PGDRAIN_WAKE_PRECISION_SECONDS", "wake_precision_seconds"),
            ("PGDRAIN_FANOUT_SECONDS", "fanout_seconds"),
        ):
            if (raw := text(name)) is not None:
                kwargs[attr] = _seconds(name, raw)
        for name, attr in (
            ("PGDRAIN_RETAIN_DONE", "retain_done_days"),
            ("PGDRAIN_RETAIN_FAILED", "retain_failed_days"),
        ):
            if (raw := text(name)) is not None:
                kwargs[attr] = _days(name, raw)
        return cls(**kwargs)  # type: ignore[arg-type]


def _check_conninfo(url: str) -> None:
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        # libpq's message quotes the string, password included: never repeat it.
        raise ConfigError(
            "DATABASE_URL is malformed: expected a postgresql:// URL or key=value pairs "
            "(its text is not shown: it may hold a password)"
        ) from None
    if credentials_ambiguous(url):
        # libpq would take the rest of the password for the host, and name it in its errors.
        raise ConfigError(
            "DATABASE_URL is malformed: its user name or password holds an unencoded '@' or "
            "'/' (percent-encode them: %40, %2F; its text is not shown: it holds a password)"
        )


_URL_PREFIXES = ("postgresql://", "postgres://")


def credentials_ambiguous(url: str) -> bool:
    """A postgresql:// URL whose user name or password holds an unencoded '@' or '/': libpq
    ends them at the first '@' or '/', so the rest of the password becomes the host (or the
    database name), which its connection errors then quote."""
    prefix = next((p for p in _URL_PREFIXES if url[: len(p)].lower() == p), None)
    if prefix is None:
        return False
    rest = url[len(prefix) :].split("?", 1)[0]  # the query may hold an '@' of its own
    at = rest.find("@")
    if at == -1:
        return False
    slash = rest.find("/")
    return (slash != -1 and slash < at) or "@" in rest[at + 1 :]


def _require(ok: bool, variable: str, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{variable} must be {expected}")


def parse_duration(variable: str, raw: str) -> float:
    """ "1 hour", "5 minutes", "2 days" (ScheduleRate's form), "90 seconds" -> seconds."""
    match = DURATION.match(raw.strip().lower())
    if match is None:
        raise ConfigError(
            f"{variable}={raw[:40]!r} is not a duration: a number and a unit "
            "(seconds, minutes, hours or days), as in '1 hour'"
        )
    unit = match.group(2).removesuffix("s")
    return float(match.group(1)) * UNIT_SECONDS[unit]


def _integer(variable: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{variable}={raw!r} is not a whole number") from None


def _seconds(variable: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{variable}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value):
        raise ConfigError(f"{variable}={raw!r} is not a finite number of seconds")
    return value


def _days(variable: str, raw: str) -> float:
    """A number of days (fractions allowed: 0.5 is twelve hours); no other unit."""
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{variable}={raw!r} is not a number of days") from None
    if not math.isfinite(value):
        raise ConfigError(f"{variable}={raw!r} is not a finite number of days") from None
    return value
