"""The run's one connection. If it breaks (a restart, a failover), the next statement
reconnects within the budget and is tried once more."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from pgdrain import db
from pgdrain.budget import Budget
from pgdrain.settings import Settings
from pgdrain.summary import one_line

log = logging.getLogger(__name__)

T = TypeVar("T")


class Session:
    def __init__(self, conninfo: str, settings: Settings, budget: Budget) -> None:
        self._conninfo = conninfo
        self._settings = settings
        self._budget = budget
        self._conn: psycopg.Connection[Any] | None = None

    def open(self) -> None:
        self._conn = db.connect(self._conninfo, self._settings, self._budget)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def run(self, operation: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a pgdrain.store operation. A repeat after a reconnect is safe because every
        statement is fenced by attempt tokens or idempotent: it cannot overwrite another
        attempt's work."""
        assert self._conn is not None, "open() the session first"
        try:
            return operation(self._conn, *args, **kwargs)
        except psycopg.OperationalError as exc:
            if not self._conn.closed and not self._conn.broken:
                raise
            log.warning("database connection lost; reconnecting", extra={"reason": one_line(exc)})
            self._conn = db.connect(self._conninfo, self._settings, self._budget)
            return operation(self._conn, *args, **kwargs)
