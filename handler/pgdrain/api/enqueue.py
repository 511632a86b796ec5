"""The application's side: put jobs in the queue inside the caller's own transaction, so a job
is enqueued together with the data it belongs to (and not at all if that rolls back)."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

import psycopg
from psycopg import pq

from pgdrain.api import jsonbound
from pgdrain.db import store
from pgdrain.errors import BadInput
from pgdrain.settings import QUEUE_NAME

if TYPE_CHECKING:
    from pgdrain.api.registry import Registry

MAX_PAYLOAD_BYTES = 256 * 1024  # jobs carry ids, not blobs
# enqueue_many sends at most this many rows, and about this much payload, per statement.
CHUNK_ROWS = 5000
CHUNK_BYTES = 8 * 1024 * 1024
MAX_KIND_LENGTH = 200
MAX_KEY_LENGTH = 500
RECOVERY_POLICIES: tuple[str, ...] = get_args(store.RecoveryPolicy)
INT32_MAX = 2**31 - 1
MAX_DELAY_SECONDS = 100 * 365 * 86400.0  # a century: beyond, timestamps overflow soon
MAX_DEPENDENCIES = 100  # jobs one job may wait for (migration 0021's CHECK)
# The run_at every client can read back (migration 0025's CHECK): Python's datetime ends at 9999.
RUN_AT_AFTER = dt.datetime(1, 1, 2, tzinfo=dt.UTC)
RUN_AT_BEFORE = dt.datetime(9999, 12, 30, tzinfo=dt.UTC)


# What a function given another driver's connection says to do instead (docs/jobs.md).
FOR_OTHER_DRIVERS = "on another driver, run pgdrain.enqueue_statement()'s SQL in your transaction"


def check_connection(conn: object, what: str, instead: str = FOR_OTHER_DRIVERS) -> None:
    """BadInput unless `conn` is a synchronous psycopg 3 Connection, which pgdrain's functions
    run on: an AsyncConnection, another driver's connection or None is named, not met by an
    AttributeError deep inside."""
    if not isinstance(conn, psycopg.Connection):
        got = "None" if conn is None else f"{type(conn).__module__}.{type(conn).__qualname__}"
        raise BadInput(
            f"{what}: needs a synchronous psycopg 3 Connection, got {got}; {instead} (docs/jobs.md)"
        )


def build_job(
    kind: str,
    payload: Any = None,
    *,
    queue_name: str = "default",
    run_at: dt.datetime | None = None,
    delay: float = 0.0,
    priority: int = 0,
    max_attempts: int = 5,
    recovery_policy: str = "auto",
    idempotency_key: str | None = None,
    sequence: str | None = None,
    after: Iterable[int] | None = None,
) -> store.NewJob:
    """Validate one job's fields; raises BadInput with a one-line reason."""
    if not isinstance(kind, str) or not kind.strip():
        raise BadInput("job kind must be a non-empty string")
    if len(kind) > MAX_KIND_LENGTH or not is_kind_text(kind):
        raise BadInput(f"job kind must be at most {MAX_KIND_LENGTH} {KIND_TEXT}: got {kind!r:.60}")
    if not isinstance(queue_name, str) or not QUEUE_NAME.match(queue_name):
        raise BadInput(f"queue {queue_name!r:.80} is not a plain queue name ({QUEUE_NAME_RULE})")
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not _finite(delay):
        raise BadInput("delay must be a finite number of seconds")
    if not 0 <= delay <= MAX_DELAY_SECONDS:
        raise BadInput(f"delay must be from 0 to {MAX_DELAY_SECONDS:g} seconds (got {delay})")
    if run_at is not None and not isinstance(run_at, dt.datetime):
        raise BadInput(f"run_at must be a datetime (got {type(run_at).__name__})")
    if run_at is not None and (run_at.tzinfo is None or delay):
        raise BadInput("run_at must be timezone-aware, and not combined with delay")
    if run_at is not None and not _readable(run_at):
        raise BadInput("run_at must be after 0001-01-02 and before 9999-12-30 UTC")
    _check_int("priority", priority, -INT32_MAX, INT32_MAX)
    _check_int("max_attempts", max_attempts, 1, 1000)
    if recovery_policy not in RECOVERY_POLICIES:
        raise BadInput(f"recovery_policy must be one of {RECOVERY_POLICIES}")
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str)
        or not idempotency_key
        or len(idempotency_key) > MAX_KEY_LENGTH
        or not _is_clean_text(idempotency_key)
    ):
        raise BadInput(f"idempotency key must be 1 to {MAX_KEY_LENGTH} characters, without NUL")
    _check_payload(payload)
    depends_on = _check_flow(sequence, after)
    return store.NewJob(
        kind=kind,
        payload=payload,
        queue=queue_name,
        priority=priority,
        run_at=run_at,
        delay_seconds=float(delay),
        max_attempts=max_attempts,
        recovery_policy=cast(store.RecoveryPolicy, recovery_policy),  # checked above
        idempotency_key=idempotency_key,
        sequence=sequence,
        after=depends_on,
    )


# What QUEUE_NAME takes, for a person.
QUEUE_NAME_RULE = "a letter or _, then letters, digits, '_', '.' or '-'; at most 63 characters"


def _check_flow(sequence: object, after: Iterable[int] | None) -> tuple[int, ...] | None:
    """A sequence key (as an idempotency key), or 1 to MAX_DEPENDENCIES job ids: not both."""
    if sequence is not None and (
        not isinstance(sequence, str)
        or not sequence
        or len(sequence) > MAX_KEY_LENGTH
        or not _is_clean_text(sequence)
    ):
        raise BadInput(f"sequence must be 1 to {MAX_KEY_LENGTH} characters, without NUL")
    if after is None:
        return None
    if isinstance(after, str | bytes) or not isinstance(after, Iterable):
        raise BadInput("after must be a list of job ids")
    ids = tuple(after)
    for job_id in ids:
        _check_int("a job id in after", job_id, 1, 2**63 - 1)
    if not 1 <= len(ids) <= MAX_DEPENDENCIES:
        raise BadInput(f"after must name 1 to {MAX_DEPENDENCIES} jobs (got {len(ids)})")
    if sequence is not None:
        raise BadInput("a job takes a sequence or dependencies (after), not both")
    return ids


def enqueue(
    conn: store.Connection,
    kind: str,
    payload: Any = None,
    *,
    queue: str = "default",
    run_at: dt.datetime | None = None,
    delay: float = 0.0,
    priority: int = 0,
    max_attempts: int = 5,
    recovery_policy: str = "auto",  # checked: "auto" or "manual"
    idempotency_key: str | None = None,
    sequence: str | None = None,
    after: Iterable[int] | None = None,
) -> int:
    """Enqueue one job on `conn`, in whatever transaction the caller has open; the caller
    commits. Returns the job id.

    idempotency_key: while a job of the same `queue` with this key is queued, running or
    parked (waiting, retrying after a failure, being worked, or waiting for a person after its
    run died), enqueueing the key again inserts nothing and returns that job's id (whatever the
    new kind and payload). Once that job is done, failed or cancelled, the key is free: the
    same key enqueues a new job. Keys of different queues never collide. (As River's unique
    jobs ByQueue with a ByState of the unfinished states, which leaves out cancelled and
    discarded jobs, and Procrastinate's queueing_lock, which holds only while a job waits.)

    sequence: jobs with the same key (across all queues) run one at a time, in enqueue order;
    a job that fails and will be retried keeps its sequence, one done, failed for good or
    cancelled lets the next one run. after: job ids this job waits for; it runs once all are
    done, and is cancelled if one fails for good or is cancelled; a job id that does not
    exist raises BadInput. docs/jobs.md has the rules."""
    check_connection(conn, "enqueue")
    job = build_job(
        kind,
        payload,
        queue_name=queue,
        run_at=run_at,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
        recovery_policy=cast(store.RecoveryPolicy, recovery_policy),  # checked above
        idempotency_key=idempotency_key,
        sequence=sequence,
        after=after,
    )
    job_id, _created = store.job_insert(conn, job)
    return job_id


# How each driver writes a bound parameter (PEP 249's paramstyle, and asyncpg's own).
ParamStyle = Literal["pyformat", "named", "dollar"]
PARAMSTYLES: tuple[str, ...] = get_args(ParamStyle)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def enqueue_statement(
    kind: str,
    payload: Any = None,
    *,
    paramstyle: ParamStyle = "pyformat",
    queue: str = "default",
    run_at: dt.datetime | None = None,
    delay: float = 0.0,
    priority: int = 0,
    max_attempts: int = 5,
    recovery_policy: str = "auto",
    idempotency_key: str | None = None,
    sequence: str | None = None,
    after: Iterable[int] | None = None,
) -> tuple[str, dict[str, Any] | list[Any]]:
    """The insert of one job as (sql, params), for the application to run on its own driver
    inside its own transaction; validated as enqueue() validates. It returns the new job's
    `id` as one row, or no row when the idempotency key exists already. Paramstyles:

    - "pyformat": `%(name)s` and a dict: psycopg 3 (sync and async), psycopg2, Django's
      `connection.cursor()`.
    - "named": `:name` and a dict: SQLAlchemy's `text()` (`session.execute(text(sql), params)`).
    - "dollar": `$1, $2, ...` and a list: asyncpg (`await conn.fetchval(sql, *params)`).

    The payload travels as JSON text (cast to jsonb by the statement); every value is bound.
    docs/jobs.md has an example per driver."""
    if paramstyle not in PARAMSTYLES:
        raise BadInput(f"paramstyle must be one of {PARAMSTYLES}")
    job = build_job(
        kind,
        payload,
        queue_name=queue,
        run_at=run_at,
        delay=delay,
        priority=priority,
        max_attempts=max_attempts,
        recovery_policy=recovery_policy,
        idempotency_key=idempotency_key,
        sequence=sequence,
        after=after,
    )
    text, params = store.job_insert_statement(job)
    if paramstyle == "pyformat":
        return text, params
    if paramstyle == "named":
        return _PLACEHOLDER.sub(lambda m: f":{m.group(1)}", text), params
    order: list[str] = []  # "dollar": numbered by first appearance; a repeated name reuses it

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    text = _PLACEHOLDER.sub(number, text)
    return text, [params[name] for name in order]


@contextmanager
def _all_or_none(conn: store.Connection) -> Iterator[None]:
    """A savepoint in the caller's transaction, begun if none is open yet, which the caller
    commits or rolls back; on an autocommit connection, a transaction of its own, committed as
    the block ends. (psycopg's conn.transaction() alone would begin and COMMIT a transaction of
    its own on a connection that is not autocommit and has none open.)"""
    if not conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
        store.transaction_open(conn)
    with conn.transaction():
        yield


def enqueue_many(conn: store.Connection, jobs: Iterable[store.NewJob]) -> list[int]:
    """Enqueue many jobs (built with build_job) all or none: in a savepoint inside the caller's
    transaction (on a connection that is not autocommit, psycopg's default, one is begun if
    none is open, and the caller commits it), or in a transaction of its own, committed, on an
    autocommit connection. Returns the ids created. `jobs` is consumed lazily
    and sent in chunks of at most CHUNK_ROWS rows and about CHUNK_BYTES of payload, so a
    generator of a million jobs never sits in memory, nor in one message to the server. Each
    payload is encoded as its job is taken from `jobs`, and one payload object repeated only
    once: do not change a payload object after handing it over."""
    check_connection(conn, "enqueue_many")
    if not isinstance(jobs, Iterable):
        raise BadInput(f"enqueue_many takes a list of jobs made by {BUILD_JOB}")
    ids: list[int] = []
    with _all_or_none(conn):
        for chunk, payloads_json in _chunks(jobs):
            ids.extend(store.job_insert_many(conn, chunk, payloads_json))
    return ids


BUILD_JOB = "pgdrain.build_job(kind, payload, ...)"


def _chunks(jobs: Iterable[store.NewJob]) -> Iterator[tuple[list[store.NewJob], list[str]]]:
    """The jobs in chunks, each with its jobs' payloads encoded (store.payload_json): each
    payload is encoded once, here, to size the chunk, and that text is what is sent."""
    chunk: list[store.NewJob] = []
    texts: list[str] = []
    chunk_bytes = 0
    last_payload: object = object()
    last_text, last_size = "", 0
    for job in jobs:
        if not isinstance(job, store.NewJob):
            raise BadInput(f"enqueue_many takes jobs made by {BUILD_JOB}, not {job!r:.60}")
        if job.payload is not last_payload:  # the same payload repeated is encoded once
            last_payload, last_text, last_size = job.payload, *_encoded(job.payload)
            _check_encoded_payload(last_text, last_size)
        _check_fields(job)
        if chunk and (len(chunk) >= CHUNK_ROWS or chunk_bytes + last_size > CHUNK_BYTES):
            yield chunk, texts
            chunk, texts, chunk_bytes = [], [], 0
        chunk.append(job)
        texts.append(last_text)
        chunk_bytes += last_size
    if chunk:
        yield chunk, texts


def _encoded(payload: Any) -> tuple[str, int]:
    """A NewJob's payload made without build_job, as sent (store.payload_json) and its size:
    what cannot be stored is BadInput, as build_job says it."""
    try:
        text = store.payload_json(payload)
        return text, len(text.encode())
    except UnicodeEncodeError:
        raise BadInput("payload text is not valid UTF-8 (it holds a lone surrogate)") from None
    except RecursionError:
        raise BadInput("payload is nested too deep to encode") from None
    except (TypeError, ValueError) as exc:
        raise BadInput(f"payload is not JSON-serialisable: {exc}") from None


def _check_encoded_payload(text: str, size: int) -> None:
    """build_job's payload limits, for a NewJob made without it (enqueue_many takes any)."""
    if size > MAX_PAYLOAD_BYTES:
        raise BadInput(
            f"payload is {size} bytes; the limit is {MAX_PAYLOAD_BYTES} "
            "(store the data in a table and pass its id)"
        )
    if jsonbound.holds_nul(text):
        raise BadInput("payload contains a NUL character, which PostgreSQL jsonb cannot store")


def _check_fields(job: store.NewJob) -> None:
    """build_job's checks of the short fields, for a NewJob made without it: the table holds
    rows to the same limits (migration 0015), and a one-line BadInput here beats the
    database's CheckViolation after earlier chunks went out."""
    kind, queue, key = job.kind, job.queue, job.idempotency_key
    if (
        not isinstance(kind, str)
        or not kind.strip()
        or len(kind) > MAX_KIND_LENGTH
        or not is_kind_text(kind)
    ):
        raise BadInput(f"job kind must be 1 to {MAX_KIND_LENGTH} {KIND_TEXT}: got {kind!r:.60}")
    if not isinstance(queue, str) or not QUEUE_NAME.match(queue):
        raise BadInput(f"queue {queue!r:.80} is not a plain queue name ({QUEUE_NAME_RULE})")
    if key is not None and (
        not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_LENGTH or not _is_clean_text(key)
    ):
        raise BadInput(f"idempotency key must be 1 to {MAX_KEY_LENGTH} characters, without NUL")
    if job.sequence is not None or job.after is not None:
        _check_flow(job.sequence, job.after)


def _readable(run_at: dt.datetime) -> bool:
    try:
        return RUN_AT_AFTER < run_at < RUN_AT_BEFORE
    except OverflowError:  # its UTC offset carries it past the calendar's end
        return False


def payload_size(payload: Any) -> int:
    """Bytes of the payload as stored (UTF-8 JSON); build_job has checked it encodes."""
    return len(store.payload_json(payload).encode())


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name} must be a whole number")
    if not low <= value <= high:
        raise BadInput(f"{name} must be from {low} to {high} (got {value})")


def _check_payload(payload: Any) -> None:
    jsonbound.check_value_depth(payload, "payload")  # before json.dumps, which would recurse
    try:
        # Measured as stored: UTF-8, non-ASCII characters not escaped.
        encoded = json.dumps(payload, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates (undecodable bytes, or a "\ud800" escape)
        raise BadInput("payload text is not valid UTF-8 (it holds a lone surrogate)") from None
    except (TypeError, ValueError) as exc:
        raise BadInput(f"payload is not JSON-serialisable: {exc}") from None
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise BadInput(
            f"payload is {len(encoded)} bytes; the limit is {MAX_PAYLOAD_BYTES} "
            "(store the data in a table and pass its id)"
        )
    if jsonbound.holds_nul(encoded.decode("utf-8")):
        raise BadInput("payload contains a NUL character, which PostgreSQL jsonb cannot store")


def _finite(number: float) -> bool:
    """A finite number; an int too large for a float (10**400) is finite, but more than any
    bound, which the caller's range check then says."""
    return isinstance(number, int) or math.isfinite(number)


# What a kind may hold, for a person: what `--kind` filters take (cli `_kind`, the dashboard's).
KIND_TEXT = "printable UTF-8 characters (no control characters or NUL)"


def is_kind_text(kind: str) -> bool:
    """Storable, and printable (no control or format characters): a kind the commands' --kind
    filters accept, and one no listing has to escape."""
    return _is_clean_text(kind) and kind.isprintable()


def _is_clean_text(text: str) -> bool:
    """Storable in a PostgreSQL text column: valid UTF-8 (no lone surrogates, which is how
    Python carries undecodable command-line bytes) and no NUL."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Workflow:
    """Jobs enqueued together, in one transaction, where later ones wait for earlier ones
    (`after=[id, ...]`): see workflow()."""

    def __init__(self, conn: store.Connection, enqueue_one: Callable[..., int]) -> None:
        self._conn = conn
        self._enqueue = enqueue_one
        self.ids: list[int] = []

    def enqueue(
        self, kind: str, payload: Any = None, *, after: Iterable[int] | None = None, **options: Any
    ) -> int:
        """Enqueue one job of the workflow (enqueue()'s options); returns its id, for the
        `after` of later ones."""
        job_id = self._enqueue(self._conn, kind, payload, after=after, **options)
        self.ids.append(job_id)
        return job_id


@contextmanager
def workflow(conn: store.Connection, registry: Registry | None = None) -> Iterator[Workflow]:
    """Enqueue several jobs all or none, as enqueue_many does: in a savepoint inside the
    caller's transaction (begun if none is open; the caller commits it), or in a transaction of
    its own on an autocommit connection. With a registry, each kind's decorator options are
    the defaults.

        with pgdrain.workflow(conn) as wf:
            fetch = wf.enqueue("fetch", {"url": url})
            parse = wf.enqueue("parse", after=[fetch])
            wf.enqueue("notify", after=[parse])
    """
    check_connection(conn, "workflow")
    one: Callable[..., int] = enqueue if registry is None else registry.enqueue
    with _all_or_none(conn):
        yield Workflow(conn, one)
