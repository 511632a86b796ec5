"""A claim and what runs in its place after its reply was lost (runner/claim_statement.py), on a
real database: a claim that committed is recognised (its jobs by its claim id, its completions
by completed_token) and taken as its result, so nothing is claimed twice; a claim that never
committed is made then, once, under the same claim id. The control makes the claim again."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, statuses
from pgdrain import Budget, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.runner.attempts import Attempts
from pgdrain.runner.claim_statement import Claim, ClaimStatements, Result, after_a_lost_reply
from pgdrain.runner.deadline import Deadline

Conn = psycopg.Connection[Any]
WORKER = "w"


def _statements(attempts: Attempts, controls: Controls = ALL_ON) -> ClaimStatements:
    return ClaimStatements(
        attempts,
        Deadline(Budget.seconds(60), 1.0),
        queues=("default",),
        worker_id=WORKER,
        lease_seconds=30.0,
        keep_done=True,
        controls=controls,
    )


def _claim_after_two_finished(conn: Conn, statements: ClaimStatements, attempts: Attempts) -> Claim:
    """The run ran two jobs, and its next claim records them done and asks for three more."""
    for attempt in claim_batch(conn, ["default"], 2, WORKER, 30.0, None):
        attempts.unstarted.append(attempt)
        attempts.finish(attempts.start_next())
    return statements.new(3)


def _enqueue(conn: Conn, n: int) -> None:
    enqueue_many(conn, [build_job("k") for _ in range(n)])


def test_a_claim_records_the_finished_attempts_done_and_claims_under_its_id(conn: Conn) -> None:
    _enqueue(conn, 10)
    attempts = Attempts()
    statements = _statements(attempts)
    claim = _claim_after_two_finished(conn, statements, attempts)
    assert len(claim.finished) == 2 and attempts.finished == []  # taken by the claim

    completed, claimed = statements.operation(claim)(conn)

    assert completed.applied_attempts == frozenset(claim.held) and not completed.lost_attempts
    assert len(claimed) == 3
    assert statuses(conn) == [("done", 1, 2), ("queued", 0, 5), ("running", 1, 3)]
    on_rows = conn.execute(
        "SELECT count(*) FROM pgdrain.jobs WHERE claim_id = %s", (claim.claim_id,)
    ).fetchone()
    assert on_rows == (3,)


def test_a_claim_that_committed_before_its_reply_was_lost_is_taken_as_it_was(conn: Conn) -> None:
    _enqueue(conn, 10)
    attempts = Attempts()
    statements = _statements(attempts)
    claim = _claim_after_two_finished(conn, statements, attempts)
    lost_reply = statements.statement(claim).run(conn)  # committed; the reply never came

    made = statements.recover(claim)(conn)

    assert made == lost_reply  # the same completions, the same jobs and attempt tokens
    assert statuses(conn) == [("done", 1, 2), ("queued", 0, 5), ("running", 1, 3)]


def test_a_claim_that_never_committed_is_made_once_under_its_id(conn: Conn) -> None:
    _enqueue(conn, 10)
    attempts = Attempts()
    statements = _statements(attempts)
    claim = _claim_after_two_finished(conn, statements, attempts)

    made = statements.recover(claim)(conn)
    again = statements.recover(claim)(conn)  # its reply lost once more: recognised now

    assert made[0].applied_attempts == frozenset(claim.held) and len(made[1]) == 3
    assert again == made
    assert statuses(conn) == [("done", 1, 2), ("queued", 0, 5), ("running", 1, 3)]


def test_completions_are_recognised_by_completed_token_when_nothing_was_claimed(
    conn: Conn,
) -> None:
    """A claim that found the queue empty left no row under its claim id: its completions
    alone say that it committed."""
    _enqueue(conn, 2)
    attempts = Attempts()
    statements = _statements(attempts)
    claim = _claim_after_two_finished(conn, statements, attempts)
    statements.statement(claim).run(conn)  # committed: two done, nothing left to claim
    made_again: list[Result] = []

    def make(c: store.Connection) -> Result:
        made_again.append(statements.statement(claim).run(c))
        return made_again[-1]

    completed, claimed = after_a_lost_reply(make, claim.claim_id, claim.held, keep_done=True)(conn)

    assert made_again == []
    assert completed.applied_attempts == frozenset(claim.held) and claimed == []
    assert not completed.lost_attempts  # not counted as leases lost


@pytest.mark.parametrize("recover", [True, False], ids=["recovered", "control: made again"])
def test_control_made_again_a_committed_claim_orphans_its_jobs(conn: Conn, recover: bool) -> None:
    """Made again (recover_lost_replies off), the claim takes three more jobs: the three the
    lost reply carried stay `running`, their attempts spent, until their leases end; and the
    completions it repeats are refused by the fence, counted as leases lost."""
    _enqueue(conn, 10)
    attempts = Attempts()
    statements = _statements(attempts, Controls(recover_lost_replies=recover))
    claim = _claim_after_two_finished(conn, statements, attempts)
    lost_reply = statements.statement(claim).run(conn)

    completed, claimed = statements.recover(claim)(conn)

    if recover:
        assert claimed == lost_reply[1] and not completed.lost_attempts
        assert statuses(conn) == [("done", 1, 2), ("queued", 0, 5), ("running", 1, 3)]
    else:
        assert not {job.id for job in claimed} & {job.id for job in lost_reply[1]}
        assert completed.lost_attempts == frozenset(claim.held)
        assert statuses(conn) == [("done", 1, 2), ("queued", 0, 2), ("running", 1, 6)]
