"""Connections: opened per run, with a bounded connect timeout and retries inside the time
budget (a suspended serverless database takes seconds to resume). Driver errors are
translated into pgdrain's own here."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgdrain.budget import Budget
from pgdrain.errors import AuthenticationFailed, ConfigError, DatabaseUnavailable
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

APPLICATION_NAME = "pgdrain"
FIRST_RETRY_DELAY_SECONDS = 0.25
MAX_RETRY_DELAY_SECONDS = 4.0
MIN_CONNECT_TIMEOUT_SECONDS = 2  # libpq treats 1 as 2 anyway

# SQLSTATE class 28: invalid authorization; 3D000: the database does not exist.
# Retrying these cannot help.
_FATAL_SQLSTATES = ("28000", "28P01", "3D000")
_MISSING_ROLE_OR_DATABASE = re.compile(r'FATAL:\s+(role|database) ".*" does not exist')


def connection_kwargs(settings: Settings, timeout: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "autocommit": True,  # no statement may leave a transaction open while a job runs
        "application_name": APPLICATION_NAME,
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


def connect(
    conninfo: str,
    settings: Settings,
    budget: Budget,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> psycopg.Connection[Any]:
    """Connect, retrying with backoff while the budget (less the reserve) allows."""
    delay = FIRST_RETRY_DELAY_SECONDS
    attempt = 0
    while True:
        attempt += 1
        timeout = min(settings.connect_timeout, budget.remaining())
        try:
            return psycopg.connect(conninfo, **connection_kwargs(settings, timeout))
        except psycopg.ProgrammingError:
            # libpq quotes a malformed connection string in its message, password included.
            raise ConfigError(
                "the database connection string (DATABASE_URL) is malformed: expected a "
                "postgresql:// URL or key=value pairs (not shown: it may hold a password)"
            ) from None
        except psycopg.OperationalError as exc:
            reason = describe(exc)
            if is_authentication_failure(exc):
                raise AuthenticationFailed(f"database refused the credentials: {reason}") from exc
            left = budget.remaining() - settings.reserve_seconds
            if left <= delay:
                raise DatabaseUnavailable(
                    f"database unreachable after {attempt} attempt(s): {reason}"
                ) from exc
            log.warning(
                "database not reachable yet, retrying",
                extra={"attempt": attempt, "retry_in_s": round(delay, 2), "reason": reason},
            )
            sleep(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY_SECONDS)


def is_authentication_failure(exc: psycopg.Error) -> bool:
    state = exc.sqlstate or _sqlstate_from_diag(exc)
    if state in _FATAL_SQLSTATES:
        return True
    # libpq reports a failed login before any result exists, so no SQLSTATE is attached.
    text = str(exc)
    return (
        "password authentication failed" in text
        or "no password supplied" in text
        or _MISSING_ROLE_OR_DATABASE.search(text) is not None  # 28000 / 3D000 by their text
    )


def _sqlstate_from_diag(exc: psycopg.Error) -> str | None:
    try:
        return exc.diag.sqlstate
    except Exception:
        return None


def describe(exc: BaseException) -> str:
    """The first line of a driver error, without libpq's multi-line detail."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
