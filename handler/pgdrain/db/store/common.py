"""What every part of the store shares: the connection type, one_statement, Statement (a
statement built to be sent with another), and the records a run holds and gets back."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, LiteralString, NamedTuple, TypeVar

import psycopg

Connection = psycopg.Connection[Any]
Operation = TypeVar("Operation", bound=Callable[..., Any])
T = TypeVar("T")

# Reads one JSON document at the start of a text (ClaimedJob.payload).
_decode_json_document = json.JSONDecoder().raw_decode


def one_statement(operation: Operation) -> Operation:
    """Mark an operation that executes exactly one statement, once, and then reads its result:
    a Session sends that statement together with its transaction's BEGIN, limits and COMMIT,
    in one round trip (session.py). Called with a plain connection it runs as ever."""
    operation.one_statement = True  # type: ignore[attr-defined]
    return operation


@dataclass(frozen=True)
class Statement(Generic[T]):
    """One named statement, its parameters, and how its result is read: what a Session sends
    in the round trip of another statement and reads when that round trip is back
    (Session.read_with_next), so that one reply carries both results."""

    text: LiteralString  # query(name): built by the function `<name>_statement`
    params: Mapping[str, Any]
    read: Callable[[psycopg.Cursor[Any]], T]

    def send(self, conn: Connection) -> psycopg.Cursor[Any]:
        return conn.execute(self.text, self.params)

    def run(self, conn: Connection) -> T:
        return self.read(self.send(conn))


def queue_names(queues: Sequence[str] | None) -> list[str] | None:
    """A statement's %(queues)s: the names, or NULL for every queue (the statements find every
    queue with queued jobs themselves, from the queues' floors: migration 0026)."""
    return None if queues is None else list(queues)


# The job states and recovery policies the schema's CHECK constraints allow.
Status = Literal["queued", "running", "done", "failed", "parked", "cancelled", "waiting"]
STATUSES: tuple[Status, ...] = (
    "queued",
    "running",
    "done",
    "failed",
    "parked",
    "cancelled",
    "waiting",
)
FinishedStatus = Literal["done", "failed", "cancelled"]  # what purge and retention delete
FINISHED: tuple[FinishedStatus, ...] = ("done", "failed", "cancelled")
RecoveryPolicy = Literal["auto", "manual"]


@dataclass(frozen=True, slots=True)
class Held:
    """A job this run holds: the id and the token that proves the lease is still ours."""

    id: int
    token: uuid.UUID

    def __hash__(self) -> int:
        # By id alone: a run's attempts are dict keys and set members at every stage, and a
        # UUID hashes in Python (uuid.UUID.__hash__). Two attempts of one job share a hash
        # and are told apart by equality, which compares the token too.
        return hash(self.id)


# Not frozen, unlike the other results here: a frozen dataclass's __init__ sets each field
# through object.__setattr__, and a claim makes one per job on the drain's thread between a
# reply and the next claim (docs/decisions/0004). Nothing assigns to it.
@dataclass(slots=True)
class ClaimedJob:
    """A job this run claimed: the row's fields the job needs, and its attempt's token."""

    id: int
    queue: str
    kind: str
    payload_json: str  # parsed by `payload`, in the thread that runs the job
    attempt: int
    max_attempts: int
    attempt_token: uuid.UUID
    priority: int  # with run_at_us and id, its place in the claim's order (ClaimPosition)
    # run_at as exact microseconds since the epoch: no session setting changes how it is read
    # (a timestamptz is read in the session's DateStyle, which a role may set for itself).
    run_at_us: int
    # Made once per attempt: the run keys its bookkeeping by it at every stage, and the same
    # object found again is found by identity, without comparing tokens.
    held: Held = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.held = Held(self.id, self.attempt_token)

    @property
    def payload(self) -> Any:
        # The text is jsonb's output: one JSON document, nothing around it. raw_decode reads
        # that without json.loads's two whitespace scans and wrappers (about 4x cheaper, in
        # the job's thread, which shares the interpreter with the run's). Text with anything
        # around the document goes through json.loads, which reads or refuses it.
        text = self.payload_json
        try:
            value, end = _decode_json_document(text)
            if end == len(text):
                return value
        except ValueError:
            pass
        return json.loads(text)


class ClaimPosition(NamedTuple):
    """Where a run's next claim of a queue starts: after this job (the last it claimed there),
    in the claim's order."""

    priority: int
    run_at_us: int  # microseconds since the epoch, as the claim's reply gives run_at
    id: int


@dataclass(frozen=True)
class Fenced:
    """The result of a fenced statement over several attempts, each told apart by its token:
    one run may hold two attempts of the same job (its lease expired, another run reclaimed
    it, this run claimed it again), and only the current one may be applied."""

    applied_attempts: frozenset[Held]
    lost_attempts: frozenset[Held]  # the fence matched nothing: another attempt owns the job
    # Queues a claim found paused: the run gives back unstarted what it holds of them.
    paused_queues: frozenset[str] = frozenset()

    @property
    def applied(self) -> frozenset[int]:
        return frozenset(h.id for h in self.applied_attempts)

    @property
    def lost(self) -> frozenset[int]:
        return frozenset(h.id for h in self.lost_attempts)


@dataclass(frozen=True)
class Failed:
    """job_fail's result: the attempt recorded as failed, and whether (and when) it retries."""

    id: int
    status: Literal["queued", "failed", "cancelled"]  # queued: retried at run_at
    attempt: int
    run_at: dt.datetime


@dataclass(frozen=True)
class LeaseLost:
    """A fenced statement matched no row: another attempt owns the job now."""

    id: int


@dataclass(frozen=True)
class Reclaimed:
    """A job whose lease had expired, taken back: queued again, failed or parked."""

    id: int
    status: Literal["queued", "failed", "parked"]  # parked: recovery_policy manual
    reclaim_count: int


@dataclass(frozen=True)
class NewJob:
    """A job to enqueue, as build_job checked it."""

    kind: str
    payload: Any = None
    queue: str = "default"
    priority: int = 0
    run_at: dt.datetime | None = None
    delay_seconds: float = 0.0
    max_attempts: int = 5
    recovery_policy: RecoveryPolicy = "auto"
    idempotency_key: str | None = None
    # Runs one at a time with the other jobs of this key, in enqueue order (migration 0021).
    sequence: str | None = None
    # Runs once these jobs are done; cancelled if one fails for good or is cancelled.
    after: tuple[int, ...] | None = None


def _fenced(
    conn: Connection, statement: LiteralString, held: Sequence[Held], **extra: Any
) -> Fenced:
    """Run a fenced statement over `held`; it returns the (id, token) of each attempt whose
    fence matched."""
    if not held:
        return Fenced(frozenset(), frozenset())
    params = {"ids": [h.id for h in held], "tokens": [h.token for h in held], **extra}
    rows = conn.execute(statement, params).fetchall()
    applied = frozenset(Held(int(r[0]), r[1]) for r in rows)
    return Fenced(applied, frozenset(held) - applied)
