"""A claim whose reply is lost after the server committed it: a proxy lets the transaction
commit, then closes the connection instead of passing the answer on. The run reconnects and
asks what its claim id already took, instead of claiming a second batch and orphaning the
first; the control repeats the claim as if nothing had happened."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from helpers.fixtures import job_row, statuses, wait_for
from helpers.lossy_proxy import CLAIM, LossyProxy, losing_the_second_claims_reply
from pgdrain import Budget, DrainResult, Job, Registry, Settings, enqueue
from pgdrain.controls import Controls
from pgdrain.db import store
from pgdrain.runner.deadline import Deadline
from pgdrain.runner.drain import drain_with

Conn = psycopg.Connection[Any]

registry = Registry()


@registry.job("quick")
def quick(job: Job) -> None:
    pass


@pytest.mark.parametrize("recover", [True, False], ids=["taken-up", "claimed-again"])
def test_a_first_claim_whose_reply_was_lost_is_taken_up_not_made_again(
    conn: Conn, proxy: LossyProxy, recover: bool
) -> None:
    for _ in range(4):
        enqueue(conn, "quick")
    proxy.drop_commit_reply(CLAIM)
    result = drain_with(
        Controls(recover_lost_replies=recover),
        Settings(concurrency=4, batch_size=4),
        Budget.seconds(30),
        registry,
        proxy.url,
    )
    assert proxy.dropped.is_set() and proxy.connections == 2  # one reply lost, one reconnect
    if recover:
        assert (result.claimed, result.done, result.lease_lost) == (4, 4, 0)
        assert statuses(conn) == [("done", 1, 4)]
    else:
        # The repeat found nothing ready: the first batch is orphaned, its attempts spent,
        # `running` until its leases end, and the run reports an empty queue.
        assert (result.claimed, result.done, result.stop_reason) == (0, 0, "empty")
        assert statuses(conn) == [("running", 1, 4)]


@pytest.mark.parametrize("recover", [True, False], ids=["taken-up", "claimed-again"])
def test_a_claim_carrying_completions_whose_reply_was_lost_counts_them_done(
    conn: Conn, proxy: LossyProxy, recover: bool
) -> None:
    first, second = enqueue(conn, "quick"), enqueue(conn, "quick")
    result = drain_with(
        Controls(recover_lost_replies=recover),
        Settings(concurrency=1, batch_size=1),
        Budget.seconds(30),
        registry,
        proxy.url,
        observer=losing_the_second_claims_reply(proxy),
    )
    assert proxy.dropped.is_set()
    rows = dict(conn.execute("SELECT id, status FROM pgdrain.jobs").fetchall())
    if recover:
        assert (result.claimed, result.done, result.lease_lost) == (2, 2, 0)
        assert rows == {first: "done", second: "done"}
        assert statuses(conn) == [("done", 1, 2)]
    else:
        # The repeat's completion found the job done already and called the lease lost; its
        # claim found nothing ready: the second job is orphaned.
        assert (result.claimed, result.done, result.lease_lost) == (1, 0, 1)
        assert rows == {first: "done", second: "running"}


# -- item 7: the heartbeat cannot run while the run reconnects ------------------------------


@pytest.mark.parametrize("bounded", [True, False], ids=["within-leases", "whole-budget"])
def test_a_reconnect_that_would_outlast_the_leases_tells_the_jobs_before_another_run_can_start_them(
    conn: Conn, proxy: LossyProxy, bounded: bool
) -> None:
    job_id = enqueue(conn, "held")
    started, release = threading.Event(), threading.Event()
    seen: list[Job] = []
    held_registry = Registry()

    @held_registry.job("held")
    def held(job: Job) -> None:
        seen.append(job)
        started.set()
        assert release.wait(60)

    results: list[DrainResult] = []
    settings = Settings(lease_seconds=3, reserve_seconds=0.5, connect_timeout=2)
    # The lease lapse, the other way a job hears of it, is off in both: this is the reconnect's.
    switches = Controls(reconnect_within_leases=bounded, tell_jobs_of_a_lapsed_lease=False)
    thread = threading.Thread(
        target=lambda: results.append(
            drain_with(switches, settings, Budget.seconds(40), held_registry, proxy.url)
        ),
        daemon=True,
    )
    thread.start()
    assert started.wait(30)
    proxy.refuse()  # the database goes away: the next heartbeat breaks, every connect fails

    # Another run takes the job back as soon as the database says its lease is over.
    [reclaimed] = wait_for(lambda: store.job_reclaim_expired(conn, 10), what="lease expiry")
    assert reclaimed.id == job_id
    [job] = seen
    # With the bound, the run gave up its reconnect before the lease ended and told the job;
    # without it, the job still believes it holds the lease while the job is up for grabs.
    assert job.lease_lost() is bounded

    proxy.accept()
    release.set()
    thread.join(60)
    [result] = results
    row = job_row(conn, job_id)
    assert row["completed_token"] != job.attempt_token  # the stale result is never recorded
    if bounded:
        assert (result.stop_reason, result.error_kind) == ("error", "unavailable")
        assert row["status"] == "queued"


@pytest.mark.parametrize("send_ahead", [True, False], ids=["pipeline", "cursor"])
def test_jobs_taken_up_after_a_reconnect_that_used_up_the_time_are_given_back_unstarted(
    conn: Conn, proxy: LossyProxy, send_ahead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim's reply is lost and, by the time the reconnect has taken up what it claimed,
    the run is below its reserve (here: from the moment the reply is lost, the injected
    deadline says so). The job it took is given back unstarted, its attempt returned, whether
    the claim went through the pipeline (PipelinedClaims.claim_now, at concurrency 1) or psycopg's
    cursor. Before the pipeline's take-up did this, it started the job with no time left."""
    first, second = enqueue(conn, "quick"), enqueue(conn, "quick")
    monkeypatch.setattr(Deadline, "below_reserve", lambda self: proxy.dropped.is_set())
    result = drain_with(
        Controls(pipelining=send_ahead),
        Settings(concurrency=1, batch_size=1),
        Budget.seconds(30),
        registry,
        proxy.url,
        observer=losing_the_second_claims_reply(proxy),
    )

    assert proxy.dropped.is_set() and proxy.connections == 2
    assert (result.claimed, result.done, result.released, result.lease_lost) == (2, 1, 1, 0)
    assert job_row(conn, first)["status"] == "done"
    assert (job_row(conn, second)["status"], job_row(conn, second)["attempts"]) == ("queued", 0)
