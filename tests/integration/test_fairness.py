"""Fair across queues: a run draining several queues claims round-robin, so a backlog of older
jobs in one queue cannot make a new job in another wait behind all of it. The control is the
same claim without its turn (the one line of the statement that orders by it): strict
priority-then-age order across queues, as before."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, LiteralString

import psycopg
import pytest

from helpers.fixtures import complete_and_claim, without_line
from pgdrain import enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.db import store
from pgdrain.db.sql import query

Conn = psycopg.Connection[Any]
BACKLOG = 500
BATCH = 10
TURN_LINE = "row_number() OVER (PARTITION BY f.queue"


def _params(queues: list[str]) -> Mapping[str, Any]:
    """A claim of a batch from `queues`, completing nothing, from no position."""
    return store.job_complete_and_claim_statement(
        [], queues, BATCH, "fairness-test", 30, None, None
    ).params


def _claim(conn: Conn, statement: LiteralString) -> list[tuple[int, str]]:
    rows = conn.execute(statement, _params(["default", "emails"])).fetchall()
    return [(int(r[1]), str(r[2])) for r in rows if not r[0]]


@pytest.mark.parametrize("fair", [True, False], ids=["round-robin", "control-strict-order"])
def test_a_new_job_in_another_queue_does_not_wait_for_an_older_backlog(
    conn: Conn, fair: bool
) -> None:
    with conn.transaction():
        enqueue_many(conn, [build_job("noop", {}, queue_name="default") for _ in range(BACKLOG)])
    conn.execute("UPDATE pgdrain.jobs SET run_at = now() - interval '1 hour'")  # older
    with conn.transaction():
        (email,) = enqueue_many(conn, [build_job("noop", {}, queue_name="emails")])

    statement = query("job_complete_and_claim")
    if not fair:
        statement = without_line(statement, TURN_LINE)
    first_batch = _claim(conn, statement)

    assert len(first_batch) == BATCH
    if fair:
        assert (email, "emails") in first_batch
    else:  # the emails job waits until all BACKLOG older jobs are claimed
        assert all(queue == "default" for _id, queue in first_batch)


def test_turns_alternate_between_busy_queues(conn: Conn) -> None:
    with conn.transaction():
        enqueue_many(
            conn,
            [build_job("noop", {}, queue_name=q) for q in ("default", "emails") for _ in range(20)],
        )
    claimed = complete_and_claim(conn, [], ["default", "emails"], 10, "w", 30, None)[1]
    assert sorted(job.queue for job in claimed) == ["default"] * 5 + ["emails"] * 5


SHARE_LINE = "ceil(4.0 * %(limit)s / greatest(1, cardinality(%(queues)s::text[])))::int,"


@pytest.mark.parametrize("shared", [True, False], ids=["a-share-each", "control-a-batch-each"])
def test_a_claim_naming_many_queues_locks_a_share_of_the_batch_in_each(
    db_url: str, conn: Conn, shared: bool
) -> None:
    """A red team's report: a claim of 1,000 queues with jobs locked a batch in each (10,000
    row locks) to keep one batch by round-robin. Named queues each lock a share now; the batch
    still fills, every queue having a job. The control takes a batch in each, as before."""
    queues = [f"tenant{n}" for n in range(50)]
    with conn.transaction():
        enqueue_many(conn, [build_job("noop", queue_name=q) for q in queues for _ in range(BATCH)])
    statement = query("job_complete_and_claim")
    if not shared:  # each queue's share: the whole batch
        statement = statement.replace(SHARE_LINE, f"{BATCH},")
        assert statement != query("job_complete_and_claim")
    with psycopg.connect(db_url) as claimer:
        rows = claimer.execute(statement, _params(queues)).fetchall()
        assert len([r for r in rows if r[0] is False]) == BATCH  # a full batch either way
        with conn.transaction():  # what the claim holds locked (its transaction still open)
            free = conn.execute(
                "SELECT count(*) FROM (SELECT id FROM pgdrain.active_jobs"
                " WHERE status = 'queued' FOR UPDATE SKIP LOCKED) AS lockable"
            ).fetchone()
        claimer.rollback()
    assert free is not None
    locked_unclaimed = len(queues) * BATCH - BATCH - free[0]
    assert locked_unclaimed == (len(queues) - BATCH if shared else len(queues) * BATCH - BATCH)


SPIN = "f.priority, md5(f.queue || %(claim_id)s::uuid::text), f.run_at, f.id"


@pytest.mark.parametrize("spun", [True, False], ids=["queues-drawn-anew", "control-oldest-heads"])
def test_a_new_job_is_claimed_soon_behind_more_busy_queues_than_a_claim_takes(
    db_url: str, conn: Conn, spun: bool
) -> None:
    """A red team's finding: with more busy queues than a claim takes (5 at the defaults), a
    turn went to the queues with the oldest heads, every claim: a new job in another queue
    waited behind the whole of every older backlog. The claims here take 5 of 12 busy queues
    each time; drawn anew, the new job's queue is missed by 30 claims in a row about once in
    ten million. The control orders a turn by age, as before: 30 claims never reach it."""
    with conn.transaction():
        enqueue_many(
            conn,
            [build_job("noop", queue_name=f"bulk{q}") for q in range(11) for _ in range(30)],
        )
    conn.execute("UPDATE pgdrain.jobs SET run_at = now() - interval '1 hour'")  # older
    with conn.transaction():
        (email,) = enqueue_many(conn, [build_job("noop", {}, queue_name="emails")])
    statement = query("job_complete_and_claim")
    if not spun:
        statement = statement.replace(SPIN, "f.priority, f.run_at, f.id")
        assert statement != query("job_complete_and_claim")
    queues = [f"bulk{q}" for q in range(11)] + ["emails"]
    claimed: list[int] = []
    with psycopg.connect(db_url, autocommit=True) as claimer:
        for _ in range(30):
            params = store.job_complete_and_claim_statement(
                [], queues, 5, "fairness-test", 300, None, uuid.uuid4()
            ).params
            rows = claimer.execute(statement, params).fetchall()
            claimed += [int(r[1]) for r in rows if r[0] is False]
    assert len(claimed) == 150
    assert (email in claimed) is spun


POSITIONED_SHARE = "WHEN pos.queue IS NOT NULL THEN greatest("


@pytest.mark.parametrize("kept", [True, False], ids=["its-share-grows", "control-one-a-claim"])
def test_a_restricted_run_with_jobs_in_one_of_many_queues_claims_full_batches(
    conn: Conn, kept: bool
) -> None:
    """A red team's finding: PGDRAIN_QUEUES naming 40 queues, jobs in one: every claim divided
    its batch among the 40, 1 job each time, and the run drained 5-9 times slower. The first
    claim (no position) still takes 1; from its position on, the queue shares the batch only
    with the queues the run holds a position in. The control shares among all 40, as before."""
    queues = [f"q{n}" for n in range(40)]
    with conn.transaction():
        enqueue_many(conn, [build_job("noop", queue_name="q0") for _ in range(100)])
    statement = query("job_complete_and_claim")
    if not kept:
        statement = statement.replace(POSITIONED_SHARE, "WHEN false THEN greatest(")
        assert statement != query("job_complete_and_claim")

    def claim(positions: dict[str, store.ClaimPosition] | None) -> list[store.ClaimedJob]:
        claim = store.job_complete_and_claim_statement(
            [], queues, BATCH, "w", 30, None, uuid.uuid4(), positions
        )
        return claim.read(conn.execute(statement, claim.params))[1]

    [first] = claim(None)
    last = claim({"q0": store.ClaimPosition(first.priority, first.run_at_us, first.id)})
    assert len(last) == (BATCH if kept else 1)
