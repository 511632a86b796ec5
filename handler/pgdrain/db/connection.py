"""Connections: opened per run, with a bounded connect timeout. Driver errors are translated
into pgdrain's own here, in two kinds:

- the server is not up yet (connection refused or timed out, "the database system is starting
  up", too many connections, Neon's proxy refusing while its compute starts, an Aurora
  Serverless v2 resume, which holds the connection until it times out): retried with jittered
  exponential backoff inside the time budget;
- the settings cannot work (a bad sslmode or port value, a host name that does not resolve,
  a wrong password, an unknown database or role): DatabaseMisconfigured at once, since
  retrying only spends the budget.

An error of neither kind is not retried either: DatabaseUnavailable at once, with its text."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict

from pgdrain.budget import Budget
from pgdrain.errors import (
    AuthenticationFailed,
    ConfigError,
    DatabaseMisconfigured,
    DatabaseUnavailable,
)
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

APPLICATION_NAME = "pgdrain"
FIRST_RETRY_DELAY_SECONDS = 0.25
MAX_RETRY_DELAY_SECONDS = 4.0
MIN_CONNECT_TIMEOUT_SECONDS = 2  # libpq treats 1 as 2 anyway

# SQLSTATE class 28: invalid authorization (a wrong password, an unknown role). Retrying these
# cannot help. 3D000 (the database does not exist) is no matter of credentials: said apart.
_FATAL_SQLSTATES = ("28000", "28P01")
_MISSING_ROLE = re.compile(r'FATAL:\s+role ".*" does not exist')
_MISSING_DATABASE = re.compile(r'database "(.*)" does not exist')
# A pgdrain relation, function or schema the server does not know (the error names it): the
# database was never migrated, or not since an upgrade. 42P01 undefined_table, 42883
# undefined_function, 3F000 invalid_schema_name.
_MISSING_SCHEMA_SQLSTATES = ("42P01", "42883", "3F000")
# 42703 undefined_column names no schema; but the statements that reach is_schema_missing are
# pgdrain's own (a job's errors are its attempt's), which read pgdrain's tables: a column a
# later migration adds.
_MISSING_COLUMN_SQLSTATE = "42703"
RUN_MIGRATE = "run `pgdrain migrate`"
# 57P03 cannot_connect_now ("the database system is starting up" / "is not yet accepting
# connections" / "is shutting down" during a restart); 53300 too_many_connections; 53400
# configuration_limit_exceeded (a role's CONNECTION LIMIT).
_NOT_UP_YET_SQLSTATES = ("57P03", "53300", "53400")
# libpq reports a failed connection before any SQLSTATE exists: its texts, lower-cased.
_NOT_UP_YET_TEXTS = (
    "connection refused",  # the port is closed: the server is not (yet) listening
    "timeout expired",  # connect_timeout: a resuming Aurora holds the connection this long
    "timed out",
    "the database system is starting up",
    "the database system is not yet accepting connections",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "too many connections",
    "too many clients",
    "failed to acquire permit",  # Neon's proxy while the compute starts (10-40 s)
    "compute is starting",
    "couldn't connect to compute node",
    "server closed the connection unexpectedly",
    "connection reset by peer",
    "no route to host",
    "network is unreachable",
    "temporary failure in name resolution",  # EAI_AGAIN: DNS itself is not up yet
    "ssl syscall error",
)
_MISCONFIGURED_TEXTS = (
    "invalid sslmode value",
    "invalid integer value",  # port=abc and other numeric options
    "invalid port number",
    "could not translate host name",  # older libpq: DNS says the name does not exist
    "name or service not known",
    "nodename nor servname provided",
    "no address associated with hostname",
    "failed to resolve host",
    "invalid connection option",
    "server does not support ssl",
    "could not open certificate file",
    "root certificate file",
    "certificate verify failed",
)


# Where the system's trusted CA roots are, by distribution: libpq's own default for
# verify-ca/verify-full is ~/.postgresql/root.crt, which a Lambda function does not have.
SYSTEM_ROOTS = (
    "/etc/pki/tls/certs/ca-bundle.crt",  # Amazon Linux (Lambda's python3.12), RHEL, Fedora
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine
    "/etc/ssl/cert.pem",  # macOS, the BSDs
)
VERIFYING_SSLMODES = ("verify-ca", "verify-full")


def system_roots(env: Mapping[str, str] = os.environ) -> str:
    """The file of the system's trusted CA roots: SSL_CERT_FILE (OpenSSL's own override), the
    Python ssl module's default, or a distribution's usual place; else libpq's `system`
    (libpq 16 or later asks OpenSSL for its default roots)."""
    candidates = (env.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile, *SYSTEM_ROOTS)
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    return "system"


def tls_kwargs(conninfo: str, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What a verifying sslmode needs and the connection string does not say: the system's
    roots as sslrootcert. The sslmode is the string's, else PGSSLMODE (template.yaml's
    DatabaseSslMode), for a DATABASE_URL and a secret's connection alike."""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return {}  # malformed: connect() says so
    mode = params.get("sslmode") or env.get("PGSSLMODE")
    root = params.get("sslrootcert") or env.get("PGSSLROOTCERT")
    if mode in VERIFYING_SSLMODES and root in (None, "", "system"):
        return {"sslrootcert": system_roots(env)}
    return {}


def connection_kwargs(settings: Settings, timeout: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "autocommit": True,  # no statement may leave a transaction open while a job runs
        "application_name": APPLICATION_NAME,
        # In the startup packet, it wins over a role's own client_encoding.
        "client_encoding": "UTF8",
        "connect_timeout": max(MIN_CONNECT_TIMEOUT_SECONDS, int(timeout)),
        "keepalives": 1,
        "keepalives_idle": 30,
        "keepalives_interval": 10,
        "keepalives_count": 3,
    }
    if settings.pooler == "transaction":
        # PgBouncer in transaction mode cannot keep a prepared statement between transactions.
        kwargs["prepare_threshold"] = None
    return kwargs


# Host names of transaction poolers: Neon's pooled endpoint (ep-...-pooler.REGION...), an RDS
# Proxy's endpoint (NAME.proxy-ID.REGION.rds.amazonaws.com).
POOLER_HOST = re.compile(r"-pooler\.|\.proxy-[a-z0-9]+\.")
_warned_of_pooler: set[str] = set()


def warn_of_a_pooler_in_session_mode(conninfo: str, settings: Settings) -> None:
    """A transaction pooler's host with PGDRAIN_POOLER=session (the default): the run's
    session settings and prepared statements would stay on a server connection the pooler
    then hands to another client. Said once per host and process (a guess from the name)."""
    if settings.pooler != "session":
        return
    try:
        hosts = str(conninfo_to_dict(conninfo).get("host") or "")
    except psycopg.ProgrammingError:
        return  # malformed: said by the connect
    for host in hosts.split(","):
        if POOLER_HOST.search(host) and host not in _warned_of_pooler:
            _warned_of_pooler.add(host)
            log.warning(
                "the database host %s looks like a transaction pooler (Neon's -pooler "
                "endpoint, an RDS Proxy) while PGDRAIN_POOLER is session: set "
                "PGDRAIN_POOLER=transaction (Pooler in the template), or the run's session "
                "settings reach the pooler's other clients",
                host,
            )


def connect(
    conninfo: str,
    settings: Settings,
    budget: Budget,
    *,
    sleep: Callable[[float], None] = time.sleep,
    jitter: Callable[[], float] = random.random,
    retry_log_level: int = logging.WARNING,
    application_name: str = APPLICATION_NAME,
) -> psycopg.Connection[Any]:
    """Connect. While the server is not up yet, retry after a jittered exponential backoff
    (`jitter()` in [0, 1) scales each wait, so that functions started together do not all
    knock on a starting Neon compute at the same moment), as long as the budget less the
    reserve allows. Settings that cannot work fail at once (DatabaseMisconfigured). Connecting
    is safe to repeat: a failed attempt leaves nothing open on the server. Each retry is
    logged at `retry_log_level` (the CLI's operator commands: INFO, so that a database that
    is down costs them one error line). `application_name` names the connection in
    pg_stat_activity (a worker's listening connection has a name of its own)."""
    ceiling = FIRST_RETRY_DELAY_SECONDS
    attempt = 0
    warn_of_a_pooler_in_session_mode(conninfo, settings)
    addresses = _addresses(conninfo)
    while True:
        attempt += 1
        # Within the budget less the reserve, which the run needs to report (libpq's 2 s at
        # least): psycopg tries each address the host names resolve to (two for a dual-stack
        # name) with the whole timeout, so each gets its share.
        left = budget.remaining() - settings.reserve_seconds
        timeout = min(settings.connect_timeout, max(left, MIN_CONNECT_TIMEOUT_SECONDS)) / addresses
        try:
            kwargs = (
                connection_kwargs(settings, timeout)
                | tls_kwargs(conninfo)
                | {"application_name": application_name}
            )
            return psycopg.Connection.connect(conninfo, **kwargs)
        except psycopg.ProgrammingError:
            # libpq quotes a malformed connection string in its message, password included.
            raise ConfigError(
                "the database connection string (DATABASE_URL) is malformed: expected a "
                "postgresql:// URL or key=value pairs (not shown: it may hold a password)"
            ) from None
        except psycopg.OperationalError as exc:
            reason = redact(describe(exc), conninfo)
            if (missing := missing_database(exc)) is not None:
                where = (
                    "the secret's 'dbname' (PGDRAIN_DB_SECRET_ARN)"
                    if settings.db_secret_arn
                    else "DATABASE_URL"
                )
                raise DatabaseMisconfigured(
                    f"the database {redact(missing, conninfo)!r} does not exist on that server: "
                    f"create it (createdb), or name an existing one in {where}"
                ) from None
            if is_authentication_failure(exc):
                raise AuthenticationFailed(f"database refused the credentials: {reason}") from None
            if is_misconfiguration(exc):
                raise DatabaseMisconfigured(
                    f"the database connection settings cannot work: {reason}{_hint(exc)}"
                ) from None
            if not is_not_up_yet(exc):
                raise DatabaseUnavailable(f"database connection failed: {reason}") from None
            # Full jitter: a wait anywhere from 0 to the doubling ceiling.
            delay = ceiling * jitter()
            left = budget.remaining() - settings.reserve_seconds
            # Another attempt may overrun what is left by one address's 2 s, which the reserve
            # takes; at more addresses, their other 2 s must fit.
            if left - delay <= MIN_CONNECT_TIMEOUT_SECONDS * (addresses - 1):
                raise DatabaseUnavailable(
                    f"database unreachable after {attempt} attempt(s): {reason}"
                ) from None
            log.log(
                retry_log_level,
                "database not reachable yet, retrying",
                extra={"attempt": attempt, "retry_in_s": round(delay, 2), "reason": reason},
            )
            sleep(delay)
            ceiling = min(ceiling * 2, MAX_RETRY_DELAY_SECONDS)


def _addresses(conninfo: str) -> int:
    """How many addresses psycopg tries in turn, each with the connect timeout: the hosts the
    string names, each as many times as it resolves to addresses. 1 when it cannot tell
    (connect() then reports why)."""
    try:
        return max(1, len(conninfo_attempts(conninfo_to_dict(conninfo))))
    except (psycopg.Error, OSError):
        return 1


T = TypeVar("T")

REDACTED = "[redacted]"
# Shorter pieces of a password are left: they would hide ordinary words of the message.
MIN_REDACTED_LENGTH = 3


def redact(text: str, conninfo: str) -> str:
    """`text` (a driver error) without the connection string's password: neither as libpq
    read it nor any piece of what the string holds before its host, which libpq takes for the
    host or the database when the password holds an unencoded '@' or '/' and then quotes
    ("failed to resolve host 'tail@db.example'")."""
    secrets: set[str] = set()
    with contextlib.suppress(psycopg.Error):
        password = conninfo_to_dict(conninfo).get("password")
        if isinstance(password, str):
            secrets.add(password)
    prefix = next((p for p in ("postgresql://", "postgres://") if conninfo.startswith(p)), None)
    if prefix is not None:
        rest = conninfo[len(prefix) :]
        credentials = rest[: rest.rfind("@")] if "@" in rest else ""
        _user, _, password_text = credentials.partition(":")
        secrets.add(password_text)
        secrets.update(re.split(r"[@/:]", password_text))
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= MIN_REDACTED_LENGTH:
            text = text.replace(secret, REDACTED)
    return text


def is_not_up_yet(exc: psycopg.Error) -> bool:
    """The server (or its proxy) exists but does not take connections yet: worth a retry."""
    if (exc.sqlstate or _sqlstate_from_diag(exc)) in _NOT_UP_YET_SQLSTATES:
        return True
    text = str(exc).lower()
    return any(fragment in text for fragment in _NOT_UP_YET_TEXTS)


# What to do about a refusal whose fix is not in libpq's words. A server without TLS is the
# usual development server (the postgres image, a local install), and template.yaml requires
# TLS: `pgdrain invoke` there fails on its first connection.
_NO_TLS_HINT = (
    ": the server has no TLS and the connection requires it (the URL's sslmode, else"
    " PGSSLMODE, which template.yaml's DatabaseSslMode sets); for a development server,"
    " end the URL with ?sslmode=disable"
)


def _hint(exc: psycopg.Error) -> str:
    return _NO_TLS_HINT if "server does not support ssl" in str(exc).lower() else ""


def is_misconfiguration(exc: psycopg.Error) -> bool:
    """A setting that cannot work however long we wait (checked after is_not_up_yet's
    SQLSTATEs would not match: these come from libpq before any server answered)."""
    text = str(exc).lower()
    if "temporary failure in name resolution" in text:
        return False  # DNS is not up yet, the name may well exist
    return any(fragment in text for fragment in _MISCONFIGURED_TEXTS)


def is_authentication_failure(exc: psycopg.Error) -> bool:
    state = exc.sqlstate or _sqlstate_from_diag(exc)
    if state in _FATAL_SQLSTATES:
        return True
    # libpq reports a failed login before any result exists, so no SQLSTATE is attached.
    text = str(exc)
    return (
        "password authentication failed" in text
        or "no password supplied" in text
        or _MISSING_ROLE.search(text) is not None  # 28000 by its text
    )


def missing_database(exc: psycopg.Error) -> str | None:
    """The name of the database the server says does not exist (3D000), or None."""
    if (exc.sqlstate or _sqlstate_from_diag(exc)) not in (None, "3D000"):
        return None
    match = _MISSING_DATABASE.search(str(exc))
    return match.group(1) if match else None


def is_schema_missing(exc: BaseException) -> bool:
    """A pgdrain table, column, function or the schema itself is not in the database: never
    migrated, or not since an upgrade. For errors of pgdrain's own statements only."""
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate or _sqlstate_from_diag(exc)
    if state == _MISSING_COLUMN_SQLSTATE:
        return True
    return state in _MISSING_SCHEMA_SQLSTATES and "pgdrain" in str(exc)


def _sqlstate_from_diag(exc: psycopg.Error) -> str | None:
    try:
        return exc.diag.sqlstate
    except Exception:
        return None


def describe(exc: BaseException) -> str:
    """The first line of a driver error, without libpq's multi-line detail; for a database
    without pgdrain's schema, what to do about it."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[0].removeprefix("connection is bad: ")  # psycopg's wrapper adds nothing
    if is_schema_missing(exc):
        return f"this database has no pgdrain schema (or an older one): {RUN_MIGRATE} ({first})"
    return first


def one_line(exc: BaseException) -> str:
    if isinstance(exc, psycopg.Error):
        return describe(exc)
    if isinstance(exc, DatabaseUnavailable):
        return str(exc)
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
