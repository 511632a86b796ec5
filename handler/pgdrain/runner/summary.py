"""What a run reports: its counters as they grow (to an observer, so progress leaves the
process before a hard kill can lose it) and the DrainResult it returns at the end."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple, get_args

from pgdrain.db.connection import is_schema_missing
from pgdrain.db.store import Held
from pgdrain.errors import AuthenticationFailed, ConfigError, DatabaseUnavailable

log = logging.getLogger(__name__)

# Why a run stopped: nothing was ready, the budget ran out, an error ended it, or it was asked
# to stop (SIGTERM/SIGINT: pgdrain.runner.stop).
# at_cap: the control plane admitted no run (a copy of a fan-out event, PGDRAIN_MAX_RUNS live).
StopReason = Literal["empty", "budget", "error", "stopped", "at_cap"]
# What kind of error ended it: the Lambda edge fetches a rotated secret again on "authentication".
ErrorKind = Literal["authentication", "configuration", "unavailable", "database"]
Counter = Literal[
    "claimed", "done", "retried", "failed", "cancelled", "lease_lost", "reclaimed", "released"
]
COUNTERS: tuple[Counter, ...] = get_args(Counter)

# A restricted run counts the ready jobs of each queue it does not serve up to this (more reads
# as this many): the figure says "some are waiting", not how many to the last.
UNSERVED_COUNT_BOUND = 10_000

# Called with a counter's name and how much it grew, as the run goes: a Lambda timeout kills
# the process, so progress must leave it before the end.
Observer = Callable[[str, int], None]


@dataclass(frozen=True)
class DrainResult:
    """What one run did: its counts, why it stopped, and whether work is still ready."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    # Ended as cancelled: by the job itself (Cancel), or by an operator while it ran. Not
    # counted as failed or as a lost lease, so neither alarm fires for a decision.
    cancelled: int = 0
    lease_lost: int = 0
    reclaimed: int = 0
    released: int = 0
    abandoned: int = 0  # still running when the run had to return; reclaimable at the deadline
    # Job threads abandoned by earlier runs in this process (a warm container) still running
    # when this run started: they overlap whatever attempt comes next for their jobs.
    stale_threads: int = 0
    stop_reason: StopReason = "empty"
    more_ready: bool = False  # ready jobs were left (only looked at when the budget ran out)
    error: str | None = None
    error_kind: ErrorKind | None = None  # set with an error
    elapsed_s: float = 0.0
    # A run restricted to some queues (PGDRAIN_QUEUES, --queues): the other queues with jobs
    # ready as it ended, and how many (up to UNSERVED_COUNT_BOUND). Nothing serves them here.
    unserved: dict[str, int] = field(default_factory=dict)
    # Queues it serves that its claims found paused, and took no job of: their ready jobs wait
    # for `pgdrain resume`, whatever its stop reason says.
    paused: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Ending(NamedTuple):
    """How a run ended, before its counters are read into its DrainResult."""

    stop_reason: StopReason
    more_ready: bool = False
    error: str | None = None
    error_kind: ErrorKind | None = None
    unserved: tuple[tuple[str, int], ...] = ()
    paused: tuple[str, ...] = ()


class Counters:
    """The run's counters; each increment is passed on to the observer at once."""

    def __init__(self, observer: Observer | None) -> None:
        self.values: dict[Counter, int] = dict.fromkeys(COUNTERS, 0)
        self._observer = observer
        self._lost: set[Held] = set()
        self._unsaid: list[tuple[Held, str]] = []  # lost attempts not logged yet, and how

    def add(self, name: Counter, n: int) -> None:
        if n:
            self.values[name] += n
            if self._observer is not None:
                self._observer(name, n)

    def lease_lost(self, held: Held, how: str) -> None:
        """Note an attempt whose lease is gone, once (a heartbeat and its completion may both
        find it). It is counted and said once, by say_lost, at the run's next safe point: why
        (an operator's cancel is not a lost lease) may take a statement, and this may be called
        while a pipelined reply is being read."""
        if held not in self._lost:
            self._lost.add(held)
            self._unsaid.append((held, how))

    @property
    def unsaid(self) -> list[Held]:
        return [held for held, _ in self._unsaid]

    def say_lost(self, statuses: Mapping[int, str], worker: str) -> None:
        """Count and log each lost attempt not said yet, one line each: cancelled when the
        job's status now tells so (`statuses`: an operator cancelled it), else a lost lease,
        with what the run knows (an empty `statuses`: why could not be read)."""
        for held, how in self._unsaid:
            extra = {"job_id": held.id, "attempt_token": str(held.token), "worker": worker}
            if statuses.get(held.id) == "cancelled":
                self.add("cancelled", 1)
                log.warning(
                    "job %d cancelled by an operator: this attempt's outcome will not be recorded",
                    held.id,
                    extra=extra,
                )
            else:
                self.add("lease_lost", 1)
                log.warning("lease lost: another attempt may own this job; %s", how, extra=extra)
        self._unsaid.clear()

    def result(
        self, ending: Ending, *, abandoned: int, stale_threads: int, elapsed_s: float
    ) -> DrainResult:
        return DrainResult(
            **self.values,
            abandoned=abandoned,
            stale_threads=stale_threads,
            stop_reason=ending.stop_reason,
            more_ready=ending.more_ready,
            error=ending.error,
            error_kind=ending.error_kind,
            elapsed_s=round(elapsed_s, 3),
            unserved=dict(ending.unserved),
            paused=list(ending.paused),
        )


def error_kind(exc: BaseException) -> ErrorKind:
    if isinstance(exc, AuthenticationFailed):
        return "authentication"
    # A setting that cannot work, or a database never migrated: retrying will not help.
    if isinstance(exc, ConfigError) or is_schema_missing(exc):
        return "configuration"
    if isinstance(exc, DatabaseUnavailable):
        return "unavailable"
    return "database"
