"""How every one-statement operation leaves the process: libpq's pipeline mode, driven here.

A group of statements goes out with one Sync: a round trip's worth (a statement with its BEGIN,
limits and COMMIT, and what rides with it). Groups may be sent before the reply to the last
one is read, so that the database runs the next claim while the run reads the last reply and
hands its jobs over; their replies come back in order. psycopg's own pipeline reads every reply
it is owed whenever one is asked for (it would wait for the second claim's before returning
the first's), so this module drives libpq's pipeline itself, with psycopg's parts for the
rest: its conversion of a statement's %(name)s parameters (PostgresQuery, from a private
module: docs/decisions/0002 says which test fails if it changes; check_psycopg tries it at
import and fails the import, in one line, if it changed), its dumpers and loaders
(Transformer), its generators and its wait. The rows are psycopg's, value for value, as its
cursor returns them.

On a connection of its own (`prepare`), each statement with parameters is prepared here, under
its own name (pgdrain_<statement>_<n>), once per connection and set of parameter types, in the
round trip of its first execution; behind a transaction pooler every statement goes unnamed.
While a group is unread nothing else may use the connection (Session settles them first); once
all are read it leaves pipeline mode, and psycopg's connection is as it was."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg import errors, generators
from psycopg.adapt import Transformer
from psycopg.pq import ExecStatus, PipelineStatus

from pgdrain.db import sql

# The psycopg releases whose private parts this module was tested with (handler/requirements.in
# caps psycopg there; docs/decisions/0002).
TESTED_PSYCOPG = ">=3.2,<3.4"


class PsycopgChanged(ImportError):
    """psycopg no longer has the private parts this module drives: raised at import, so that a
    cold start fails at once, naming the cause, not at a run's first statement."""


def _changed(what: str) -> PsycopgChanged:
    return PsycopgChanged(
        f"pgdrain drives psycopg's private parts, tested with psycopg {TESTED_PSYCOPG}; psycopg "
        f"{psycopg.__version__} changed them ({what}): install a tested one (pip install "
        f"'psycopg[binary]{TESTED_PSYCOPG}', as handler/requirements.txt pins it)"
    )


try:
    from psycopg._queries import PostgresQuery
except ImportError as exc:
    raise _changed(f"psycopg._queries.PostgresQuery cannot be imported: {exc}") from None


def check_psycopg() -> None:
    """What this module relies on and psycopg does not promise, tried once: a statement's
    %(name)s parameters converted as its cursor converts them, the generators and the wait it
    drives, the error of a failed result. PsycopgChanged names the first part that differs."""
    try:
        query = PostgresQuery(Transformer())
        query.convert("SELECT %(a)s, %(b)s, %(a)s", {"a": 1, "b": "x"})
        params, formats = query.params or (), query.formats or ()
        converted = (query.query, len(params), len(query.types), len(formats))
    except Exception as exc:  # any change of shape: named, not raised as is
        raise _changed(f"PostgresQuery.convert: {type(exc).__name__}: {exc}") from None
    if converted != (b"SELECT $1, $2, $1", 2, 2, 2):
        raise _changed(f"PostgresQuery.convert made {converted!r}")
    for owner, name in (
        (generators, "send"),
        (generators, "fetch_many"),
        (psycopg.Connection, "wait"),
        (errors, "error_from_result"),
    ):
        if not callable(getattr(owner, name, None)):
            raise _changed(f"{owner.__name__}.{name} is gone")


check_psycopg()

Row = tuple[Any, ...]
Statement = tuple[str, Mapping[str, Any] | None]  # text, and its parameters if any

_READ = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)


class Reply(NamedTuple):
    """One statement's result, read as a cursor's would be."""

    rows: list[Row]
    rowcount: int

    def fetchone(self) -> Row | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Row]:
        return self.rows


class _Sent(NamedTuple):
    key: tuple[bytes, tuple[int, ...]] | None  # the prepared statement's, if one was prepared now
    prepared_now: bool


class Pipeline:
    def __init__(self, conn: psycopg.Connection[Any], *, prepare: bool) -> None:
        self._conn = conn
        self._prepare = prepare
        self._transformer = Transformer(conn)
        self._query = PostgresQuery(self._transformer)
        # (statement, parameter types) -> the name it was prepared under on this connection.
        self._prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = {}
        self._names = itertools.count()  # never a name twice, even after a failed PREPARE
        # Per group sent and not read: what each of its statements sent.
        self._unread: deque[list[_Sent]] = deque()
        # Where in its group the statement that failed the last group read was (read()).
        self.failed_at: int | None = None

    @property
    def unread(self) -> int:
        """Groups sent and not yet read."""
        return len(self._unread)

    def send(self, statements: Sequence[Statement]) -> None:
        """Send `statements` and one Sync after them, without waiting for the reply. They run
        in order; after one fails, those behind it up to the Sync are not run."""
        pgconn = self._conn.pgconn
        if pgconn.pipeline_status == PipelineStatus.OFF:
            pgconn.enter_pipeline_mode()
        group = [self._send_one(text, params) for text, params in statements]
        pgconn.pipeline_sync()
        self._unread.append(group)
        self._conn.wait(generators.send(pgconn))

    def _send_one(self, text: str, params: Mapping[str, Any] | None) -> _Sent:
        pgconn = self._conn.pgconn
        query = self._query
        query.convert(text, params)
        if not self._prepare or params is None:
            pgconn.send_query_params(
                query.query, query.params, param_formats=query.formats, param_types=query.types
            )
            return _Sent(None, False)
        key = (query.query, tuple(query.types))
        name = self._prepared.get(key)
        prepared_now = name is None
        if name is None:
            label = (sql.name_of(text) or "statement").encode()
            name = self._prepared[key] = b"pgdrain_%s_%d" % (label, next(self._names))
            pgconn.send_prepare(name, query.query, param_types=query.types)
        pgconn.send_query_prepared(name, query.params, param_formats=query.formats)
        return _Sent(key, prepared_now)

    def read(self) -> list[Reply]:
        """The replies of the oldest group sent and not read, one per statement. The first
        error is raised once the whole group's reply is read (the connection is then ready for
        the next one's); `failed_at` says which statement raised it."""
        group = self._unread.popleft()
        failure: psycopg.Error | None = None
        self.failed_at = None
        replies: list[Reply] = []
        for at, sent in enumerate(group):
            if sent.prepared_now:
                (result,) = self._conn.wait(generators.fetch_many(self._conn.pgconn))
                if result.status not in _READ:
                    # Not prepared: it failed, or was skipped after an earlier statement of
                    # the group failed. Prepared again at the next send.
                    assert sent.key is not None
                    self._prepared.pop(sent.key, None)
                    if failure is None:
                        failure, self.failed_at = _error(result, self._conn), at
            (result,) = self._conn.wait(generators.fetch_many(self._conn.pgconn))
            if result.status in _READ:
                self._transformer.set_pgresult(result)
                try:
                    rows = self._transformer.load_rows(0, result.ntuples, tuple)
                except psycopg.DataError as exc:  # a value this client cannot hold (a year
                    # past 9999): raised as itself once the group's reply is read, or the
                    # replies left unread would leave the connection busy and unusable
                    replies.append(Reply([], 0))
                    if failure is None:
                        failure, self.failed_at = exc, at
                    continue
                replies.append(Reply(rows, result.command_tuples or 0))
            else:
                replies.append(Reply([], 0))
                if failure is None:
                    failure, self.failed_at = _error(result, self._conn), at
        (sync,) = self._conn.wait(generators.fetch_many(self._conn.pgconn))
        assert sync.status == ExecStatus.PIPELINE_SYNC, sync.status
        if failure is not None:
            raise failure
        return replies

    def leave(self) -> None:
        """Leave pipeline mode once every reply is read: the connection is psycopg's again."""
        pgconn = self._conn.pgconn
        if not self._unread and pgconn.pipeline_status != PipelineStatus.OFF:
            pgconn.exit_pipeline_mode()


def _error(result: Any, conn: psycopg.Connection[Any]) -> psycopg.Error:
    if result.status == ExecStatus.PIPELINE_ABORTED:  # skipped after an earlier one failed
        return psycopg.OperationalError("the statement was not run: the pipeline was aborted")
    return errors.error_from_result(result, encoding=conn.info.encoding)
