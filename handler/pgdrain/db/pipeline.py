"""Statements sent ahead on the run's connection: the next claim goes out while the reply to the
last one is still on its way, so the database runs one while the run reads the other.

One psycopg connection runs one statement at a time: it sends it, waits for the reply, reads
it. While the run's thread turns a reply into jobs and builds the next claim (mostly
psycopg's CPU), the database has nothing to do, and while the
database runs the claim the run's thread has nothing to do but hand jobs over. libpq's pipeline
mode lets a second statement go out before the first one's reply is read; the database runs
them in order, each in a transaction of its own (a Sync after each), and their replies come
back in order. psycopg's own pipeline reads every reply it is owed whenever one is asked for
(it would wait for the second claim's before returning the first's), so this module drives
libpq's pipeline itself, with psycopg's parts for the rest: its conversion of a statement's
%(name)s parameters (PostgresQuery, from a private module: tests/integration/test_pipelining.py
drains through it, so a psycopg that changes it fails there, not in production), its dumpers
and loaders (Transformer), its generators and its wait. The rows are psycopg's, value for
value, as its cursor returns them.

Only on a connection of its own that keeps its limits (session.py): each statement is prepared
here, under a name of this module's (once per connection and set of parameter types, as
psycopg keys its own: a list of small ids dumps as a smaller integer type), in the round trip
of its first execution. While a statement sent here is unread, nothing else may use the
connection (Session settles them first); once all are read it leaves pipeline mode, and
psycopg's connection is as it was."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import errors, generators
from psycopg._queries import PostgresQuery
from psycopg.adapt import Transformer
from psycopg.pq import ExecStatus, PipelineStatus

Row = tuple[Any, ...]

_READ = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)


class Pipeline:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._transformer = Transformer(conn)
        self._query = PostgresQuery(self._transformer)
        # (statement, parameter types) -> the name it was prepared under on this connection.
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        # Per statement sent and not read: whether a PREPARE went before it in its round trip,
        # and the key to forget if that PREPARE failed.
        self._unread: deque[tuple[tuple[bytes, tuple[int, ...]], bool]] = deque()

    @property
    def unread(self) -> int:
        """Statements sent and not yet read."""
        return len(self._unread)

    def send(self, text: str, params: Mapping[str, Any]) -> None:
        """Send `text` with `params`, in a transaction of its own (its Sync), without waiting
        for its reply."""
        pgconn = self._conn.pgconn
        query = self._query
        query.convert(text, params)
        key = (query.query, tuple(query.types))
        name = self._prepared.get(key)
        prepare = name is None
        if pgconn.pipeline_status == PipelineStatus.OFF:
            pgconn.enter_pipeline_mode()
        if name is None:
            name = self._prepared[key] = b"pgdrain_ahead_%d" % len(self._prepared)
            pgconn.send_prepare(name, query.query, param_types=query.types)
        pgconn.send_query_prepared(name, query.params, param_formats=query.formats)
        pgconn.pipeline_sync()
        self._unread.append((key, prepare))
        self._conn.wait(generators.send(pgconn))

    def read(self) -> list[Row]:
        """The rows of the oldest statement sent and not read. Its error is raised once its
        whole reply is read (the connection is then ready for the next one's)."""
        key, prepared = self._unread.popleft()
        failure: psycopg.Error | None = None
        rows: list[Row] = []
        for expected in ("prepare", "statement") if prepared else ("statement",):
            (result,) = self._conn.wait(generators.fetch_many(self._conn.pgconn))
            if result.status in _READ:
                if expected == "statement":
                    self._transformer.set_pgresult(result)
                    rows = self._transformer.load_rows(0, result.ntuples, tuple)
            elif failure is None:
                if expected == "prepare":
                    self._prepared.pop(key, None)  # prepared again at the next send
                failure = _error(result, self._conn)
        (sync,) = self._conn.wait(generators.fetch_many(self._conn.pgconn))
        assert sync.status == ExecStatus.PIPELINE_SYNC, sync.status
        if failure is not None:
            raise failure
        return rows

    def leave(self) -> None:
        """Leave pipeline mode once every reply is read: the connection is psycopg's again."""
        pgconn = self._conn.pgconn
        if not self._unread and pgconn.pipeline_status != PipelineStatus.OFF:
            pgconn.exit_pipeline_mode()


def _error(result: Any, conn: psycopg.Connection[Any]) -> psycopg.Error:
    if result.status == ExecStatus.PIPELINE_ABORTED:  # skipped after its PREPARE failed
        return psycopg.OperationalError("the statement was not run: the pipeline was aborted")
    return errors.error_from_result(result, encoding=conn.info.encoding)
