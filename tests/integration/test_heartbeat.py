"""The heartbeat (runner/heartbeat.py) on a real database: one statement extends the lease of
every attempt a run holds, whatever its stage; an attempt another run has taken since is
reported lost, never started if it had not, told through Job.lease_lost() if it runs; and a
run that stops with jobs running ends their leases, so they are reclaimable at once."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import psycopg
import pytest

from helpers.fixtures import RUN_WORKER, claim_batch, db_now, job_row, wait_for
from pgdrain import Budget, Job, Registry, Settings, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.controls import Controls
from pgdrain.db import store
from pgdrain.db.store import ClaimedJob
from pgdrain.runner.attempts import RunState
from pgdrain.runner.drain import drain_with
from pgdrain.runner.heartbeat import Heartbeat

Conn = psycopg.Connection[Any]
LEASE = 30.0  # what a beat extends a lease to
CLAIMED_LEASE = 10.0  # what the claims made here take: a beat's is told apart


def _enqueue(conn: Conn, n: int) -> None:
    enqueue_many(conn, [build_job("k") for _ in range(n)])


def _held(conn: Conn, run: RunState, *, running: int, unstarted: int, finished: int) -> None:
    """Claim jobs as the run does and put them at each stage of its attempts."""
    n = running + unstarted + finished
    claimed = claim_batch(conn, ["default"], n, RUN_WORKER, CLAIMED_LEASE, None)
    run.attempts.unstarted.extend(claimed)
    started = [run.attempts.start_next() for _ in range(running + finished)]
    for attempt in started[running:]:
        run.attempts.finish(attempt)


def _lease_ends(conn: Conn, job_id: int) -> dt.datetime:
    ends: dt.datetime = job_row(conn, job_id)["lease_expires_at"]
    return ends


def _taken_by_another_run(conn: Conn, attempt: ClaimedJob) -> None:
    """The attempt's lease ran out and another run reclaimed the job and claimed it again."""
    conn.execute("UPDATE pgdrain.jobs SET lease_expires_at = now() WHERE id = %s", (attempt.id,))
    assert [r.id for r in store.job_reclaim_expired(conn, 10)] == [attempt.id]
    (again,) = claim_batch(conn, ["default"], 1, "w-other", LEASE, None)
    assert again.id == attempt.id and again.attempt_token != attempt.attempt_token


def test_a_beat_extends_every_lease_the_run_holds(conn: Conn, run_state: RunState) -> None:
    """Running, claimed and not started, finished and not yet recorded done: all held."""
    _enqueue(conn, 3)
    _held(conn, run_state, running=1, unstarted=1, finished=1)
    before = {h.id: _lease_ends(conn, h.id) for h in run_state.attempts.held()}

    Heartbeat(run_state, lease_seconds=LEASE).beat()

    extended = db_now(conn) + dt.timedelta(seconds=LEASE - 5)
    for job_id, was in before.items():
        assert _lease_ends(conn, job_id) > max(was, extended)
    assert run_state.counters.values["lease_lost"] == 0
    left = run_state.attempts.lease_seconds_left(LEASE)
    assert left is not None and left > LEASE - 5  # counted from the beat, not the claim


def test_a_lease_taken_by_another_run_is_reported_lost(conn: Conn, run_state: RunState) -> None:
    """The running attempt is told (its token among lost_tokens: Job.lease_lost()); the
    unstarted one is forgotten, never started; the rest are extended as ever."""
    _enqueue(conn, 3)
    _held(conn, run_state, running=2, unstarted=1, finished=0)
    running, kept = list(run_state.attempts.running.values())
    (unstarted,) = run_state.attempts.unstarted
    _taken_by_another_run(conn, running)
    _taken_by_another_run(conn, unstarted)
    heartbeat = Heartbeat(run_state, lease_seconds=LEASE)
    heartbeat.due_now()

    heartbeat.beat_if_due()

    assert run_state.counters.values["lease_lost"] == 2
    assert run_state.attempts.lost_tokens == {running.attempt_token}
    assert list(run_state.attempts.unstarted) == []
    assert _lease_ends(conn, kept.id) > db_now(conn) + dt.timedelta(seconds=LEASE - 5)
    # The other run's attempts are its own: their leases are not touched by this one's beat.
    assert job_row(conn, running.id)["leased_by"] == "w-other"


def test_control_without_the_heartbeat_the_leases_run_out(conn: Conn, run_state: RunState) -> None:
    _enqueue(conn, 1)
    _held(conn, run_state, running=1, unstarted=0, finished=0)
    (attempt,) = run_state.attempts.running.values()
    claimed_until = _lease_ends(conn, attempt.id)

    Heartbeat(run_state, lease_seconds=LEASE, controls=Controls(heartbeat=False)).beat()

    assert _lease_ends(conn, attempt.id) == claimed_until


def test_a_beat_is_due_a_third_of_a_lease_after_the_start_or_at_once_after_a_reconnect(
    conn: Conn, run_state: RunState
) -> None:
    _enqueue(conn, 1)
    _held(conn, run_state, running=1, unstarted=0, finished=0)
    (attempt,) = run_state.attempts.running.values()
    claimed_until = _lease_ends(conn, attempt.id)
    heartbeat = Heartbeat(run_state, lease_seconds=LEASE)
    assert heartbeat.interval == pytest.approx(LEASE / 3)

    heartbeat.start()
    heartbeat.beat_if_due()
    assert _lease_ends(conn, attempt.id) == claimed_until  # not due for 10 s

    heartbeat.due_now()  # the connection was replaced
    heartbeat.beat_if_due()
    assert _lease_ends(conn, attempt.id) > claimed_until


@pytest.mark.parametrize("given_back", [True, False], ids=["given-back", "control-spent"])
def test_a_stop_gives_back_the_attempts_it_cuts_short(
    conn: Conn, run_state: RunState, given_back: bool
) -> None:
    """A red team's finding: each stop of a worker (a rolling deploy) ended the running job's
    lease, and the reclaim spent its attempt: after max_attempts stops the job failed for good,
    "lease expired". Queued again at once, the attempt given back; safe to repeat. The control:
    the lease ended as before, the attempt spent."""
    _enqueue(conn, 3)
    _held(conn, run_state, running=2, unstarted=1, finished=0)
    running = sorted(a.id for a in run_state.attempts.running.values())
    controls = Controls(give_back_attempts_a_stop_cuts_short=given_back)
    heartbeat = Heartbeat(run_state, lease_seconds=LEASE, controls=controls)

    heartbeat.end_running_leases()
    heartbeat.end_running_leases()

    reclaimed = sorted(r.id for r in store.job_reclaim_expired(conn, 10))
    rows = [job_row(conn, i) for i in running]
    assert [r["status"] for r in rows] == ["queued", "queued"]
    if given_back:
        assert reclaimed == []
        assert [r["attempts"] for r in rows] == [0, 0]
        assert [r["errors"][-1]["type"] for r in rows] == ["Stopped", "Stopped"]
    else:
        assert reclaimed == running  # at once, not a lease later: but as an attempt lost
        assert [r["attempts"] for r in rows] == [1, 1]
        assert [r["errors"][-1]["type"] for r in rows] == ["LeaseExpired", "LeaseExpired"]
    assert run_state.counters.values["lease_lost"] == 0


def test_a_job_cut_short_by_every_stop_still_ends(conn: Conn, run_state: RunState) -> None:
    """A review's finding: a job longer than every deploy's interval was given back at each
    stop, for ever. Once its reclaims reach its attempts, a stop ends its lease, and the
    reclaim spends the attempt (here its last: failed)."""
    enqueue_many(conn, [build_job("k", max_attempts=1)])
    conn.execute("UPDATE pgdrain.jobs SET reclaim_count = 1")  # one stop given back already
    _held(conn, run_state, running=1, unstarted=0, finished=0)
    [job_id] = [a.id for a in run_state.attempts.running.values()]
    Heartbeat(run_state, lease_seconds=LEASE).end_running_leases()
    assert [r.id for r in store.job_reclaim_expired(conn, 10)] == [job_id]
    assert job_row(conn, job_id)["status"] == "failed"


def test_a_stop_ends_the_lease_of_a_job_whose_recovery_is_manual(
    conn: Conn, run_state: RunState
) -> None:
    """Its attempt's outcome is unknown, and a person decides: the reclaim parks it at once."""
    _enqueue(conn, 1)
    conn.execute("UPDATE pgdrain.jobs SET recovery_policy = 'manual'")
    _held(conn, run_state, running=1, unstarted=0, finished=0)
    [job_id] = [a.id for a in run_state.attempts.running.values()]
    Heartbeat(run_state, lease_seconds=LEASE).end_running_leases()
    assert [r.id for r in store.job_reclaim_expired(conn, 10)] == [job_id]
    assert job_row(conn, job_id)["status"] == "parked"


@pytest.mark.parametrize("told", [True, False], ids=["told", "control-not-told"])
def test_a_job_is_told_while_its_lease_may_have_run_out_unrenewed(
    db_url: str, conn: Conn, told: bool
) -> None:
    """A pooler's red team: behind a busy transaction pooler the heartbeat's statement waited
    in the pooler's queue past the lease; another run reclaimed the job and ran it, while the
    first attempt's lease_lost() said False. Here the beat waits on the job's row, locked by a
    transaction held open (as a queue would hold it), for longer than a lease: the job sees
    lease_lost() once a lease has passed since the last renewal was sent. The control tells it
    only what a beat found."""
    lease = 2.0
    started = threading.Event()
    done = threading.Event()
    seen: list[bool] = []
    registry = Registry()

    @registry.job("watch")
    def watch(job: Job) -> None:
        started.set()
        while not done.is_set():
            seen.append(job.lease_lost())
            time.sleep(0.05)

    [job_id] = enqueue_many(conn, [build_job("watch")])
    settings = Settings(lease_seconds=lease, concurrency=2, reserve_seconds=1.0)
    controls = Controls(tell_jobs_of_a_lapsed_lease=told)
    results: list[Any] = []
    run = threading.Thread(
        target=lambda: results.append(
            drain_with(controls, settings, Budget.seconds(30), registry, db_url)
        )
    )
    run.start()
    try:
        assert started.wait(20)
        with psycopg.connect(db_url) as holder:
            holder.execute("SELECT 1 FROM pgdrain.active_jobs WHERE id = %s FOR UPDATE", (job_id,))
            held_at = time.monotonic()
            wait_for(lambda: time.monotonic() > held_at + 2 * lease, what="two leases to pass")
            during = list(seen)
            holder.rollback()  # the beat goes through: nobody took the job
    finally:
        done.set()
        run.join(30)
    assert any(during) is told
    assert results[0].done == 1 and job_row(conn, job_id)["status"] == "done"
