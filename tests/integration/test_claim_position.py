"""A run's claims start from its positions (runner/positions.py, hot_path.sql
job_complete_and_claim), on a real database.

With a snapshot held open on another connection, nothing the run claims can be vacuumed away,
and a claim that reads its queue from the start reads every index entry the run left behind:
its cost grows with what the run claimed. From a position it does not. Costs are counted as
the buffers the claim's scans read (EXPLAIN ANALYZE of the statement the run would send, with
its parameters, rolled back), not timed.

What a position could hide is found again: when the position's range runs out, in the same
claim; otherwise when the positions are dropped, at most POSITION_MAX_AGE later (an injected
clock). Each control is the same timeline with the positions switched off
(Controls(claim_from_position=False)), or the claim's text changed on one line: the range's
bound written as an equality, the range read alone when it runs out.
The plans, on a long history: tests/integration/test_query_plans.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from helpers.fixtures import statuses
from helpers.plans import plan_nodes
from pgdrain import Budget, Job, Registry, Settings, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import Attempts
from pgdrain.runner.claim_statement import ClaimStatements
from pgdrain.runner.deadline import Deadline
from pgdrain.runner.drain import drain_with
from pgdrain.runner.positions import POSITION_MAX_AGE

Conn = psycopg.Connection[Any]

OFF = Controls(claim_from_position=False)
QUEUED_ROWS = ("jobs_ready_idx", "jobs_queued_run_at_idx")  # the claim's partial indexes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Run:
    """A run's claims, one after the other, each completing the jobs of the one before it (as
    the drain's claims do), on `conn`."""

    def __init__(
        self,
        conn: Conn,
        controls: Controls = ALL_ON,
        queues: tuple[str, ...] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.conn = conn
        self.attempts = Attempts()
        self.statements = ClaimStatements(
            self.attempts,
            Deadline(Budget.seconds(600), 1.0),
            queues=queues,
            worker_id="w",
            lease_seconds=600.0,
            keep_done=True,
            controls=controls,
            clock=clock or Clock(),
        )

    def claim(self, limit: int) -> list[ClaimedJob]:
        claim = self.statements.new(limit)
        _, claimed = self.statements.statement(claim).run(self.conn)
        self.statements.received(claim, claimed)
        self.attempts.unstarted.extend(claimed)
        return claimed

    def finish(self) -> None:
        while self.attempts.unstarted:
            self.attempts.finish(self.attempts.start_next())

    def next_claim_cost(self, limit: int, text: Callable[[str], str] = str) -> int:
        """The buffers the run's next claim reads to find its jobs (its scans of the indexes of
        queued rows, and the heap pages they visit), made and rolled back under the drain's
        settings. No completion rides on it: the jobs claimed last are not finished yet."""
        assert not self.attempts.finished
        statement = self.statements.statement(self.statements.new(limit))
        with self.conn.transaction(force_rollback=True):
            store.transaction_limits(self.conn, 60_000)
            row = self.conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text(statement.text), statement.params
            ).fetchone()
        assert row is not None
        return sum(
            int(n["Shared Hit Blocks"] + n["Shared Read Blocks"])
            for n in plan_nodes(row[0])
            if n.get("Index Name") in QUEUED_ROWS
        )


def _ids(jobs: list[ClaimedJob]) -> list[int]:
    return [job.id for job in jobs]


def _enqueue(conn: Conn, n: int, priority: int = 0, queue: str = "default") -> list[int]:
    with conn.transaction():
        jobs = [build_job("k", priority=priority, queue_name=queue) for _ in range(n)]
        return enqueue_many(conn, jobs)


@pytest.fixture
def held(db_url: str) -> Iterator[None]:
    """A snapshot held open on another connection (a report, a pg_dump, a forgotten BEGIN)."""
    with psycopg.connect(db_url) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")  # takes the snapshot
        yield


BATCH = 50
EARLY, LATE = 1000, 5000  # jobs claimed and completed before each measure


# The upper bound of a position's range. Written `priority = p` instead, the scan starts at the
# first entry of the priority (an equality is where a B-tree scan starts), not at the position.
UPPER_BOUND = "AND priority <= q.after_priority"


def _priority_equal(text: str) -> str:
    assert text.count(UPPER_BOUND) == 1
    return text.replace(UPPER_BOUND, "AND priority = q.after_priority")


@pytest.mark.usefixtures("held")
@pytest.mark.parametrize("queues", [None, ("default",)], ids=["every-queue", "queue-named"])
@pytest.mark.parametrize("claim", ["from-position", "control-from-start", "control-priority-equal"])
def test_under_a_held_snapshot_a_claim_does_not_cost_more_as_the_run_goes_on(
    conn: Conn, claim: str, queues: tuple[str, ...] | None
) -> None:
    _enqueue(conn, LATE + 2 * BATCH)
    run = Run(conn, OFF if claim == "control-from-start" else ALL_ON, queues)
    text = _priority_equal if claim == "control-priority-equal" else str
    claimed, costs = 0, []
    for claimed_by_then in (EARLY, LATE):
        while claimed < claimed_by_then:
            run.finish()
            claimed += len(run.claim(BATCH))
        costs.append(run.next_claim_cost(BATCH, text))
    early, late = costs
    if claim == "from-position":
        assert late <= early + 5, costs  # the same few pages, 4,000 jobs later
    else:
        # Each of those jobs' entries read again: from the start, in the index and the heap;
        # from the priority's start, in the index.
        assert late > early + 15, costs


def test_a_more_urgent_job_waits_at_most_the_positions_max_age(conn: Conn) -> None:
    _enqueue(conn, 40, priority=5)
    clock = Clock()
    run = Run(conn, clock=clock)
    run.claim(10)  # from the start: the position is in priority 5
    (urgent,) = _enqueue(conn, 1, priority=0)

    second = run.claim(10)
    assert urgent not in _ids(second)  # the position's range still holds 10 of priority 5
    clock.now += POSITION_MAX_AGE
    third = run.claim(10)
    assert _ids(third)[0] == urgent  # the positions are dropped: read from the start


def test_control_without_positions_the_urgent_job_is_claimed_next(conn: Conn) -> None:
    _enqueue(conn, 40, priority=5)
    run = Run(conn, OFF)
    run.claim(10)
    (urgent,) = _enqueue(conn, 1, priority=0)
    assert _ids(run.claim(10))[0] == urgent


@pytest.mark.parametrize("position", [True, False], ids=["from-position", "control-from-start"])
def test_a_job_committed_late_with_an_earlier_run_at_waits_at_most_the_max_age(
    conn: Conn, db_url: str, position: bool
) -> None:
    """A transaction that enqueued a job (its run_at the transaction's now()) commits after
    later jobs were committed and claimed: the job sorts before the run's position."""
    clock = Clock()
    run = Run(conn, ALL_ON if position else OFF, clock=clock)
    with psycopg.connect(db_url) as slow:
        with slow.transaction():
            (late,) = enqueue_many(slow, [build_job("k")])
            _enqueue(conn, 40)  # committed first, with a later run_at
            run.claim(10)
    second = run.claim(10)
    if not position:
        assert _ids(second)[0] == late
        return
    assert late not in _ids(second)
    clock.now += POSITION_MAX_AGE
    assert _ids(run.claim(10))[0] == late


# The line that makes a claim whose position's range ran out read its queue from the start.
FROM_START_TOO = "WHERE pos.found < q.n"


@pytest.mark.parametrize("from_start", [True, False], ids=["read-from-start", "control-range-only"])
def test_when_the_range_runs_out_the_same_claim_reads_the_queue_from_its_start(
    conn: Conn, from_start: bool
) -> None:
    """The position's priority has 5 jobs left, and a more urgent one and a less urgent batch
    were enqueued since: the claim takes all of them it may, the urgent one first, and comes
    back full. Read from the position's range alone it would come back with 5, and a claim
    of a drained priority with nothing: a run ends on a short claim with nothing running."""
    first = _enqueue(conn, 15, priority=5)
    run = Run(conn, queues=("default",))
    run.claim(10)
    (urgent,) = _enqueue(conn, 1, priority=0)
    lower = _enqueue(conn, 10, priority=9)
    statement = run.statements.statement(run.statements.new(10))
    text = statement.text
    if not from_start:
        assert text.count(FROM_START_TOO) == 1
        text = text.replace(FROM_START_TOO, "WHERE q.after_id IS NULL")  # as first prototyped
    rows = conn.execute(text, statement.params).fetchall()
    _, claimed = store.complete_and_claim_result(rows, [])

    if from_start:
        assert _ids(claimed) == [urgent, *first[10:], *lower[:4]]
    else:
        assert _ids(claimed) == first[10:]


registry = Registry()


@registry.job("k")
def nothing(job: Job) -> None:
    pass


@pytest.mark.usefixtures("held")
@pytest.mark.parametrize("one_at_a_time", [True, False], ids=["batch-1", "defaults"])
def test_a_drain_under_a_held_snapshot_runs_every_job_once(
    conn: Conn, db_url: str, one_at_a_time: bool
) -> None:
    """Priorities interleaved, two queues: every priority range runs out in turn, and the run
    still ends only when nothing is left."""
    with conn.transaction():
        enqueue_many(
            conn,
            [
                build_job("k", priority=n % 3, queue_name=("default", "other")[n % 2])
                for n in range(600)
            ],
        )
    settings = Settings(batch_size=1, concurrency=1) if one_at_a_time else Settings()
    result = drain_with(ALL_ON, settings, Budget.seconds(60), registry, db_url)
    assert (result.stop_reason, result.claimed, result.done) == ("empty", 600, 600)
    assert statuses(conn) == [("done", 1, 600)]


def test_the_reply_carries_each_jobs_place_in_the_claims_order(conn: Conn) -> None:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with conn.transaction():
        (job_id,) = enqueue_many(conn, [build_job("k", priority=3, run_at=when)])
    (job,) = Run(conn).claim(1)
    # run_at as exact microseconds since the epoch (a bigint: no session setting reads it)
    since_epoch = (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    assert (job.id, job.priority, job.run_at_us) == (job_id, 3, since_epoch)
