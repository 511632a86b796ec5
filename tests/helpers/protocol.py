"""Round trips counted from libpq's protocol trace: each ReadyForQuery the server sends ends
one request/response exchange."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgdrain.db import connection


@contextlib.contextmanager
def traced_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], list[int]]]:
    """Every connection pgdrain.db.connection makes is traced from the start; the callable
    gives the round trips after connect, one count per connection."""
    traces: list[Path] = []
    plain_connect = connection.connect

    def connect(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = plain_connect(*args, **kwargs)
        handle = tempfile.NamedTemporaryFile("w", prefix="pgdrain-trace-", delete=False)
        traces.append(Path(handle.name))
        conn.pgconn.trace(handle.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        plain_close = conn.close

        def close() -> None:
            if not conn.closed:
                conn.pgconn.untrace()  # flushes libpq's trace buffer
            handle.close()
            plain_close()

        conn.close = close  # type: ignore[method-assign]
        return conn

    def counts() -> list[int]:
        return [
            sum(
                1
                for line in t.read_text().splitlines()
                if line.split("\t")[2:3] == ["ReadyForQuery"]
            )
            for t in traces
        ]

    monkeypatch.setattr(connection, "connect", connect)
    try:
        yield counts
    finally:
        for t in traces:
            t.unlink(missing_ok=True)
