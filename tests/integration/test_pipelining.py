"""Claims sent ahead (pipeline.py): while claims come back full, the next claim goes out before
the reply to the last is read. Every job is still done once; a reply lost with two claims on
the wire is taken up claim by claim; and a claim that starts late, behind one that waited on a
lock, still ends by the final margin."""

from __future__ import annotations

import itertools
import time
from typing import Any

import psycopg
import pytest

from helpers.fixtures import statuses
from helpers.lossy_proxy import LossyProxy, losing_the_second_claims_reply
from pgdrain import Budget, Job, Registry, Settings, drain, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.budget import FINAL_MARGIN_SECONDS
from pgdrain.controls import Controls
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.runner.drain import drain_with
from pgdrain.runner.pipelining import PipelinedClaims

Conn = psycopg.Connection[Any]

registry = Registry()


@registry.job("quick")
def quick(job: Job) -> None:
    pass


def _enqueue(conn: Conn, n: int) -> None:
    with conn.transaction():
        enqueue_many(conn, [build_job("quick") for _ in range(n)])


@pytest.mark.parametrize("send_ahead", [True, False], ids=["ahead", "control: one by one"])
def test_claims_go_out_ahead_and_every_job_is_done_once(
    conn: Conn, db_url: str, send_ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _enqueue(conn, 300)
    sent: list[int] = []
    held: list[int] = []
    send = PipelinedClaims.send

    def counting(self: PipelinedClaims, limit: int) -> None:
        sent.append(self.count())  # claims already on the wire as this one goes out
        # The slots held once it is out: never more than the slots, a batch claimed ahead and
        # the batch this claim brings.
        attempts = self._claims._attempts
        held.append(len(attempts.running) + len(attempts.unstarted) + self.slots())
        assert held[-1] + limit <= 10 + 10 + 10
        send(self, limit)

    monkeypatch.setattr(PipelinedClaims, "send", counting)
    result = drain_with(
        Controls(pipelining=send_ahead),
        Settings(batch_size=10, concurrency=10),
        Budget.seconds(60),
        registry,
        db_url,
    )

    assert (result.claimed, result.done, result.error) == (300, 300, None)
    assert statuses(conn) == [("done", 1, 300)]
    if send_ahead:
        assert len(sent) > 10 and max(sent) == 1  # one behind another, never a third
    else:
        assert sent == []


@pytest.mark.parametrize("recover", [True, False], ids=["taken-up", "control: claimed-again"])
def test_a_reply_lost_with_claims_on_the_wire_is_taken_up_claim_by_claim(
    conn: Conn, proxy: LossyProxy, recover: bool
) -> None:
    """The claim after the first (through the pipeline, as every claim after the run's first
    can be) commits and the connection breaks before its reply comes back; the claim behind
    it, if it went out, may have committed too. After the reconnect
    each is asked for what it took, in order: nothing is claimed twice or left orphaned. The
    control makes each claim again as if nothing had happened."""
    _enqueue(conn, 200)
    result = drain_with(
        Controls(recover_lost_replies=recover),
        Settings(batch_size=10, concurrency=10),
        Budget.seconds(60),
        registry,
        proxy.url,
        observer=losing_the_second_claims_reply(proxy),
    )

    assert proxy.dropped.is_set() and proxy.connections == 2  # one reply lost, one reconnect
    if recover:
        assert (result.claimed, result.done, result.lease_lost, result.error) == (200, 200, 0, None)
        assert statuses(conn) == [("done", 1, 200)]
    else:
        # The claim made again took a new batch: the one the lost reply carried is orphaned,
        # its attempts spent, `running` until their leases end.
        orphaned = [n for status, _, n in statuses(conn) if status == "running"]
        assert orphaned and orphaned[0] >= 10
        assert result.done < 200


@pytest.mark.parametrize("halved", [True, False], ids=["halved", "control: whole"])
def test_a_claim_behind_one_that_waits_on_a_lock_still_ends_by_the_final_margin(
    db_url: str, conn: Conn, halved: bool
) -> None:
    """Two claims on the wire while another transaction holds the row lock every claim of a
    limited queue takes: the first waits until its lock timeout, then the second starts and
    waits as long. With the limits the connection keeps halved, both have failed by the final
    margin; with the whole of what is left (the control), the second runs past the deadline."""
    _enqueue(conn, 30)
    store.queue_limit_sync(conn, ["default"], [("default", 1000)])
    budget = Budget.seconds(4.0)
    began = time.monotonic()
    session = Session(
        db_url,
        Settings(),
        budget,
        pipelining=True,
        controls=Controls(halve_limits_when_pipelining=halved),
    )
    session.open()
    locker = psycopg.connect(db_url)  # a transaction of its own, held until the end
    try:
        assert session.run(store.queue_has_ready, ["default"]) is True  # sends the limits
        locker.execute("SELECT 1 FROM pgdrain.queue_limits WHERE queue = 'default' FOR UPDATE")
        for _ in range(2):
            assert session.may_send_ahead()
            session.send_ahead(
                store.job_complete_and_claim_statement([], ["default"], 10, "w", 30.0, 4.0, None)
            )
        failures = []
        for _ in range(2):
            with pytest.raises((psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
                session.read_ahead()  # its lock or statement timeout, the same limit
            failures.append(time.monotonic() - began)
    finally:
        locker.rollback()
        locker.close()
        session.close()

    first, second = failures  # seconds into the budget
    assert first < second
    if halved:
        assert second <= 4.0 - FINAL_MARGIN_SECONDS + 0.2  # the server's own timing, give or take
    else:
        assert second > 4.0  # past the deadline


def test_a_claim_on_the_wire_is_read_before_any_other_statement(
    conn: Conn, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat, a failure to record, a release: whatever the run sends next, the claims on
    the wire are read first (their jobs kept), and the connection is psycopg's again."""
    _enqueue(conn, 5)
    settled: list[int] = []
    session = Session(db_url, Settings(), Budget.seconds(30))
    session.open()
    session.settle_with(lambda: settled.append(len(session.read_ahead())))
    try:
        assert session.run(store.queue_has_ready, ["default"]) is True  # sends the limits
        session.send_ahead(
            store.job_complete_and_claim_statement([], ["default"], 5, "w", 30.0, 30.0, None)
        )
        ready = session.run(store.queue_has_ready, ["default"])
    finally:
        session.close()

    assert settled == [5] and ready is False
    assert statuses(conn) == [("running", 1, 5)]


def test_a_claim_on_the_wire_that_fails_fails_the_run_once_the_rest_are_read(
    conn: Conn, db_url: str
) -> None:
    """The statement error of a claim sent ahead (here a lock timeout) stops the run as a
    claim's own error does; the claims behind it were read first, so the connection was left
    clean, and no job was claimed by a claim nobody read."""
    _enqueue(conn, 400)
    store.queue_limit_sync(conn, ["default"], [("default", 1000)])
    locker = psycopg.connect(db_url)
    taken = itertools.count(1)  # next() is atomic: the jobs run on several threads

    lock_registry = Registry()

    @lock_registry.job("quick")
    def locks_the_queue(job: Job) -> None:
        if next(taken) == 100:  # from now on every claim waits on the queue's row lock
            locker.execute("SELECT 1 FROM pgdrain.queue_limits WHERE queue = 'default' FOR UPDATE")

    began = time.monotonic()
    try:
        result = drain(
            Settings(batch_size=10, concurrency=10),
            Budget.seconds(4.0),
            lock_registry,
            db_url,
        )
    finally:
        locker.rollback()
        locker.close()

    assert result.stop_reason == "error" and result.error_kind is not None
    assert "timeout" in (result.error or "")  # the statement or lock timeout, same limit
    assert time.monotonic() - began < 4.0
    # Every job a claim took was either done or is held by the run's expired attempts: none
    # was taken by a claim whose reply was never read.
    done, running = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'done'),"
        " count(*) FILTER (WHERE status = 'running') FROM pgdrain.jobs"
    ).fetchone() or (0, 0)
    assert done == result.done and done + running == result.claimed


def test_limits_that_go_stale_between_the_check_and_the_send_send_nothing_ahead(
    conn: Conn, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop asks whether a claim may go ahead, then sizes it; by the time it is sent the
    limits the connection keeps may have gone stale (they last KEEP_SECONDS). Then nothing is
    sent and no finished job is taken: the next claim goes in a round trip of its own, which
    sends the limits again. Here every second answer is no: each send finds them stale."""
    _enqueue(conn, 100)
    answers = itertools.cycle([True, False])
    may_send = Session.may_send_ahead
    monkeypatch.setattr(Session, "may_send_ahead", lambda self: may_send(self) and next(answers))
    sent: list[int] = []
    send = PipelinedClaims.send

    def counting(self: PipelinedClaims, limit: int) -> None:
        sent.append(self.count())
        send(self, limit)

    monkeypatch.setattr(PipelinedClaims, "send", counting)
    result = drain(Settings(batch_size=10, concurrency=10), Budget.seconds(60), registry, db_url)

    assert sent and (result.claimed, result.done, result.error) == (100, 100, None)
    assert statuses(conn) == [("done", 1, 100)]


@pytest.mark.parametrize("send_ahead", [True, False], ids=["pipeline", "control: cursor"])
def test_at_concurrency_1_each_claim_goes_alone_and_the_jobs_run_in_queue_order(
    conn: Conn, db_url: str, send_ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Strict ordering (batch 1, concurrency 1): no claim goes ahead, but a claim read at once
    goes through the pipeline whenever one could be sent ahead (PipelinedClaims.claim_now: less of
    the client's CPU than psycopg's cursor). Still nothing else on the wire as it goes out, one
    job at a time, in the queue's order (priority, run_at, id), each done once. The control
    claims through the cursor only."""
    with conn.transaction():
        ids = enqueue_many(conn, [build_job("quick", priority=(i * 7) % 5) for i in range(60)])
    priority = {job_id: (i * 7) % 5 for i, job_id in enumerate(ids)}
    ran: list[int] = []
    ordered_registry = Registry()

    @ordered_registry.job("quick")
    def records_its_turn(job: Job) -> None:
        ran.append(job.id)

    unread_at_send: list[int] = []
    send = Session.send_ahead

    def counting(self: Session, statement: store.Statement[Any]) -> None:
        unread_at_send.append(self.ahead_unread())
        send(self, statement)

    monkeypatch.setattr(Session, "send_ahead", counting)
    result = drain_with(
        Controls(pipelining=send_ahead),
        Settings(batch_size=1, concurrency=1),
        Budget.seconds(60),
        ordered_registry,
        db_url,
    )

    assert (result.claimed, result.done, result.error) == (60, 60, None)
    assert statuses(conn) == [("done", 1, 60)]
    assert ran == sorted(ids, key=lambda job_id: (priority[job_id], job_id))
    if send_ahead:
        assert len(unread_at_send) > 30 and set(unread_at_send) == {0}
    else:
        assert unread_at_send == []
