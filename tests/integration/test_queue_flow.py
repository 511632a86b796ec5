"""Pausing a queue and rate-limiting one (pgdrain.queue_limits, migration 0020), each beside its
control on the same timeline: a paused queue is not claimed (not paused: claimed); jobs a run
claimed ahead are given back unstarted when their queue is paused (not paused: kept); two
claims at once never take more than a window's rate (the limit row's lock taken out: twice
the rate); a rate-limited run with work left ends and wakes the function when the next window
opens, not before (no rate: it drains everything and needs no wake-up)."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, job_row, wait_for, without_line
from helpers.ledger_jobs import jobs as registry
from pgdrain import (
    BadInput,
    Budget,
    Settings,
    drain,
    enqueue_many,
    pause_queue,
    resume_queue,
)
from pgdrain.api.enqueue import build_job
from pgdrain.aws import events
from pgdrain.aws.control import RunControl
from pgdrain.aws.wake import Waker, wake_time
from pgdrain.db import store
from pgdrain.db.sql import query
from pgdrain.db.store.hot_path import PAUSED_FLAG
from pgdrain.errors import ConfigError
from pgdrain.runner.attempts import RunState
from pgdrain.runner.claiming import Claims
from pgdrain.runner.completer import Completer
from pgdrain.runner.prefetch import Prefetch
from pgdrain.settings import parse_queue_limits, parse_queue_rates

Conn = psycopg.Connection[Any]
RATE = 3
HOUR = 3600
LOCK_LINE = "FOR UPDATE OF l"


def _enqueue(conn: Conn, n: int, queue: str = "emails", kind: str = "noop") -> list[int]:
    with conn.transaction():
        return enqueue_many(conn, [build_job(kind, {}, queue_name=queue) for _ in range(n)])


def _count(conn: Conn, status: str, queue: str = "emails") -> int:
    row = conn.execute(
        "SELECT count(*) FROM pgdrain.jobs WHERE status = %s AND queue = %s", (status, queue)
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_setting_says_both_limits() -> None:
    raw = "emails=2, api=10+100/1m, reports=5/60s, hourly=1/h"
    assert parse_queue_limits(raw) == (("api", 10), ("emails", 2))
    assert parse_queue_rates(raw) == (("api", 100, 60), ("hourly", 1, 3600), ("reports", 5, 60))
    settings = Settings.from_env({"PGDRAIN_QUEUE_LIMITS": raw})
    assert settings.queue_limits == (("api", 10), ("emails", 2))
    assert settings.queue_rates == (("api", 100, 60), ("hourly", 1, 3600), ("reports", 5, 60))


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("api=3,api=100/1m", "named twice"),  # was: the rate alone, no concurrency limit
        ("api=100/1m, api=3", "named twice"),  # was: the limit alone, no rate
        ("api=1/m+100/s", "two rates"),  # was: 100/s alone
        ("api=2+3", "two concurrency limits"),
    ],
)
def test_a_queue_given_twice_is_refused_not_half_kept(raw: str, said: str) -> None:
    """A red team's finding: a later entry for the same queue replaced the first's limits in
    silence, so a team that wrote its limit and its rate apart hammered its partner's API."""
    with pytest.raises(ConfigError, match=f"PGDRAIN_QUEUE_LIMITS: .*{said}"):
        Settings.from_env({"PGDRAIN_QUEUE_LIMITS": raw})


@pytest.mark.parametrize("queue", [None, 5], ids=["none", "int"])
def test_a_queue_name_that_is_not_text_is_refused(conn: Conn, queue: Any) -> None:
    """A red team's report: a TypeError from the name's pattern."""
    with pytest.raises(BadInput, match="is not a queue name"):
        pause_queue(conn, queue)
    with pytest.raises(BadInput, match="is not a queue name"):
        resume_queue(conn, queue)


@pytest.mark.parametrize("paused", [True, False], ids=["paused", "control-not-paused"])
@pytest.mark.parametrize("queues", [["emails", "sms"], None], ids=["named", "every-queue"])
def test_a_paused_queue_is_not_claimed(conn: Conn, paused: bool, queues: list[str] | None) -> None:
    _enqueue(conn, 4)
    _enqueue(conn, 2, "sms")
    if paused:
        pause_queue(conn, "emails")
    claimed = claim_batch(conn, queues, 10, "w", 30, None)  # type: ignore[arg-type]
    by_queue = sorted(job.queue for job in claimed)
    if paused:  # the other queue flows
        assert by_queue == ["sms", "sms"]
        assert _count(conn, "queued") == 4
        resume_queue(conn, "emails")
        assert len(claim_batch(conn, queues, 10, "w", 30, None)) == 4  # type: ignore[arg-type]
    else:
        assert by_queue == ["emails"] * 4 + ["sms"] * 2


def test_pause_and_resume_are_safe_to_repeat(conn: Conn) -> None:
    first = pause_queue(conn, "emails")
    assert pause_queue(conn, "emails") == first  # the first pause's time: nothing changed
    assert [q.queue for q in store.queue_stats(conn) if q.paused] == ["emails"]
    assert resume_queue(conn, "emails") is True
    assert resume_queue(conn, "emails") is False
    # No limit left: the row goes, and the claim reads nothing for the queue again.
    assert conn.execute("SELECT count(*) FROM pgdrain.queue_limits").fetchone() == (0,)


def test_a_pause_outlives_the_limit_sync(conn: Conn) -> None:
    """The run's sync of PGDRAIN_QUEUE_LIMITS drops the limits the setting no longer names, not
    an operator's pause."""
    store.queue_limit_sync(conn, ["emails"], [("emails", 2)], [("emails", 5, 60)])
    pause_queue(conn, "emails")
    store.queue_limit_sync(conn, None, [])
    row = conn.execute(
        "SELECT max_running, rate_limit, paused_at IS NOT NULL FROM pgdrain.queue_limits"
    ).fetchone()
    assert row == (None, None, True)


@pytest.mark.parametrize("paused", [True, False], ids=["paused", "control-not-paused"])
def test_jobs_claimed_ahead_are_given_back_when_their_queue_is_paused(
    conn: Conn, run_state: RunState, paused: bool
) -> None:
    """A run holds claimed jobs that have not started (prefetch); its next claim finds their
    queue paused and releases them, the attempt given back; the other queue's stay."""
    _enqueue(conn, 3)
    _enqueue(conn, 2, "sms")
    claims = Claims(
        run_state,
        queues=None,
        lease_seconds=30.0,
        keep_done=True,
        reclaim_limit=10,
        prefetch=Prefetch(10, 10),
        completer=Completer(run_state, keep_done=True),
    )
    assert claims.complete_and_claim(10) == 5  # every job: none left queued
    if paused:
        pause_queue(conn, "emails")
    claims.complete_and_claim(10)  # the next claim (it finds nothing more)
    held = sorted(a.queue for a in run_state.attempts.unstarted)
    if paused:
        assert held == ["sms", "sms"]
        assert (_count(conn, "queued"), _count(conn, "running")) == (3, 0)
        row = conn.execute(
            "SELECT max(attempts) FROM pgdrain.jobs WHERE queue = 'emails'"
        ).fetchone()
        assert row == (0,)  # released: no attempt spent
        assert run_state.counters.values["released"] == 3
    else:
        assert held == ["emails"] * 3 + ["sms"] * 2
        assert _count(conn, "running") == 3


def test_a_claim_flags_a_paused_queue_it_does_not_name(conn: Conn) -> None:
    """A run of every queue names the queues it found queued jobs in; a queue whose last jobs it
    claimed ahead is not among them, and is flagged all the same when paused."""
    _enqueue(conn, 1)
    pause_queue(conn, "emails")
    params = {**_claim_params("w"), "queues": ["sms"]}
    rows = conn.execute(query("job_complete_and_claim"), params).fetchall()
    assert [r[2] for r in rows if r[0] is None and r[3] == PAUSED_FLAG] == ["emails"]


def _claim_params(worker: str) -> dict[str, Any]:
    return {
        "done_ids": [],
        "done_tokens": [],
        "queues": ["emails"],
        "limit": 10,
        "worker": worker,
        "lease_seconds": 30,
        "cap_seconds": None,
        "claim_id": None,
        "keep_done": True,
        "position_queue": [],
        "position_priority": [],
        "position_run_at_us": [],
        "position_id": [],
    }


def _waits(conn: Conn, pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("locked", [True, False], ids=["row-lock", "control-no-lock"])
def test_two_claims_at_once_keep_the_rate(db_url: str, conn: Conn, locked: bool) -> None:
    """The second claim comes while the first, which used the window up, is not committed."""
    store.queue_limit_sync(conn, ["emails"], [], [("emails", RATE, HOUR)])
    _enqueue(conn, 10)
    statement = query("job_complete_and_claim")
    if not locked:
        statement = without_line(statement, LOCK_LINE)
    first = psycopg.connect(db_url, autocommit=True)
    second = psycopg.connect(db_url, autocommit=True)
    second_pid = second.info.backend_pid
    claimed: dict[str, int] = {}
    barrier = threading.Barrier(2)

    def claim_second() -> None:
        barrier.wait()
        rows = second.execute(statement, _claim_params("second")).fetchall()
        claimed["second"] = sum(1 for r in rows if r[0] is False)

    thread = threading.Thread(target=claim_second)
    thread.start()
    try:
        with first.transaction():
            rows = first.execute(statement, _claim_params("first")).fetchall()
            claimed["first"] = sum(1 for r in rows if r[0] is False)
            barrier.wait()  # the second claim goes out now
            if locked:  # it waits on the queue's limit row
                wait_for(lambda: _waits(conn, second_pid), what="the second claim to wait")
            else:
                thread.join(10)
        thread.join(10)
    finally:
        first.close()
        second.close()

    assert claimed["first"] == RATE
    if locked:
        assert claimed["second"] == 0
        assert _count(conn, "running") == RATE
    else:  # both read a window with nothing started: twice the rate
        assert claimed["second"] == RATE
        assert _count(conn, "running") == 2 * RATE


@pytest.mark.parametrize("queues", [["emails", "sms"], None], ids=["named", "every-queue"])
def test_fan_out_counts_only_what_runs_may_claim_now(conn: Conn, queues: list[str] | None) -> None:
    """Fan-out sizes its runs by the ready count: a rate-limited queue counts the starts its
    window has left, a paused one nothing; extra runs for the rest would claim nothing."""
    _enqueue(conn, 10)
    _enqueue(conn, 4, "sms")
    assert store.queue_ready_count(conn, queues, 1000) == 14  # the control: no limit, no pause
    store.queue_limit_sync(conn, ["emails"], [], [("emails", RATE, HOUR)])
    assert store.queue_ready_count(conn, queues, 1000) == RATE + 4
    claim_batch(conn, ["emails"], 10, "w", 30, None)  # the window's starts, all of them
    assert store.queue_ready_count(conn, queues, 1000) == 4
    pause_queue(conn, "sms")
    assert store.queue_ready_count(conn, queues, 1000) == 0
    assert store.queue_ready_count(conn, queues, 2) == 0
    resume_queue(conn, "sms")
    assert store.queue_ready_count(conn, queues, 2) == 2  # counted up to the limit asked


@pytest.mark.parametrize("rated", [True, False], ids=["rate", "control-no-rate"])
def test_two_drains_at_once_never_start_more_than_the_rate(
    ledger_url: str, conn: Conn, rated: bool
) -> None:
    rates = (("emails", RATE, HOUR),) if rated else ()
    store.queue_limit_sync(conn, ["emails"], [], rates)
    _enqueue(conn, 12, kind="ledger")
    settings = Settings(queues=("emails",), concurrency=4, reserve_seconds=0.5)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    done: list[int] = []
    windows = []

    def one(name: str) -> None:
        try:
            budget = Budget.seconds(60)
            control = RunControl(
                events.Trigger("enqueue", ("emails",)),
                name,
                budget,
                waker=Waker(settings, None),
                queue_rates=rates,
            )
            barrier.wait()
            result = drain(settings, budget, registry, ledger_url, worker_id=name, hooks=control)
            done.append(result.done)
        except BaseException as exc:
            errors.append(exc)

    windows.append(_window(conn))
    threads = [threading.Thread(target=one, args=(f"run-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    windows.append(_window(conn))

    assert errors == []
    if rated:  # at most RATE per window the runs spanned (one, unless an hour began meanwhile)
        assert sum(done) <= RATE * len(set(windows))
        assert sum(done) >= RATE
        assert _count(conn, "queued") == 12 - sum(done)
    else:
        assert sum(done) == 12


def _window(conn: Conn) -> dt.datetime:
    row = conn.execute("SELECT pgdrain.rate_window(%s)", (HOUR,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("rated", [True, False], ids=["rate", "control-no-rate"])
def test_a_rate_limited_run_ends_and_wakes_when_the_next_window_opens(
    db_url: str, conn: Conn, rated: bool
) -> None:
    rates = (("emails", RATE, HOUR),) if rated else ()
    ids = _enqueue(conn, RATE + 2)
    settings = Settings(queues=("emails",))
    budget = Budget.seconds(30)
    control = RunControl(
        events.Trigger("enqueue", ("emails",)),
        "rated",
        budget,
        waker=Waker(settings, None),  # no schedule here: the wake time is reported
        queue_rates=rates,
    )
    before = _window(conn)
    result = drain(settings, budget, registry, db_url, hooks=control)
    after = _window(conn)
    assert result.stop_reason == "empty", result.error
    if rated:
        assert result.done <= RATE * len({before, after})
        assert job_row(conn, ids[-1])["status"] == "queued"
        # The next window's start, not before: the moment the next job may start.
        expected = {
            wake_time(w + dt.timedelta(seconds=HOUR), settings.wake_precision_seconds)
            for w in (before, after)
        }
        assert control.wake.action == "reported"
        assert control.wake.wake_at in expected
    else:
        assert result.done == RATE + 2
        assert (control.wake.wake_at, control.wake.action) == (None, "none")


@pytest.mark.parametrize("paused", [True, False], ids=["paused", "control-not-paused"])
def test_the_exit_and_the_kick_pass_over_a_paused_queue(conn: Conn, paused: bool) -> None:
    """A run's exit check finds nothing claimable in a paused queue, and wakes nobody for its
    delayed jobs; a kick of it is recorded and invokes nothing."""
    _enqueue(conn, 1)
    with conn.transaction():
        enqueue_many(conn, [build_job("noop", {}, queue_name="emails", delay=600)])
    if paused:
        pause_queue(conn, "emails")
    check = store.run_exit(conn, "r", ["emails"], may_stay=True, clear_kicks=False)
    decision = store.kick_debounce(conn, ["emails"], 10.0)
    requested = conn.execute("SELECT requested_at FROM pgdrain.kicks").fetchone()
    assert requested is not None and requested[0] is not None  # recorded either way
    if paused:
        assert (check.ready, check.due_at) == (False, None)
        assert (decision.invoke, decision.paused) == ([], ["emails"])
    else:
        assert check.ready and check.due_at is not None
        assert (decision.invoke, decision.paused) == (["emails"], [])


@pytest.mark.parametrize("paused", [True, False], ids=["paused", "control-not-paused"])
def test_a_run_names_the_paused_queues_it_serves(db_url: str, conn: Conn, paused: bool) -> None:
    """A red team's report: a drain over a paused queue said "stopped: empty" with its jobs
    ready. Its result names the paused queues it serves and took nothing of; a run that does
    not serve the queue does not name it."""
    _enqueue(conn, 2)
    _enqueue(conn, 1, "sms")
    if paused:
        pause_queue(conn, "emails")
    only_sms = drain(Settings(queues=("sms",)), Budget.seconds(30), registry, db_url)
    assert (only_sms.done, only_sms.paused) == (1, [])
    every = drain(Settings(), Budget.seconds(30), registry, db_url)
    assert every.stop_reason == "empty", every.error
    assert (every.done, every.paused) == ((0, ["emails"]) if paused else (2, []))


def test_the_example_of_docs_jobs_md_runs(db_url: str, conn: Conn) -> None:
    from helpers.docs import DOCS, fences, section
    from pgdrain import Registry

    text = (DOCS / "jobs.md").read_text(encoding="utf-8")
    assert "tests/integration/test_queue_flow.py" in section(
        text, "Pausing a queue, and rate limits"
    )
    [example] = [
        f for f in fences(text) if f.marker == "run by tests/integration/test_queue_flow.py"
    ]
    jobs = Registry()
    jobs.job("send_email")(lambda job: None)
    exec(example.body, {"DATABASE_URL": db_url, "jobs": jobs})
    assert _count(conn, "queued") == 1  # resumed, not kicked here: it waits for a run
    assert store.queue_stats(conn)[0].paused is False


@pytest.mark.parametrize("rated", [True, False], ids=["rate", "control-no-rate"])
def test_a_kick_of_a_used_up_rate_asks_for_a_wake_up_at_the_next_window(
    conn: Conn, rated: bool
) -> None:
    """Jobs ready, the window used up: a run now would find nothing, so the kick asks for a
    wake-up when the next window opens instead of invoking (each kick would start a run)."""
    store.queue_limit_sync(conn, ["emails"], [], [("emails", RATE, HOUR)] if rated else [])
    _enqueue(conn, RATE + 1)
    assert len(claim_batch(conn, ["emails"], 10, "w", 30, None)) == (RATE if rated else RATE + 1)
    _enqueue(conn, 1)
    decision = store.kick_debounce(conn, ["emails"], 10.0)
    if rated:
        row = conn.execute("SELECT window_start + interval '1 hour' FROM pgdrain.queue_limits")
        assert (decision.invoke, decision.later) == ([], {"emails": row.fetchone()[0]})  # type: ignore[index]
    else:
        assert (decision.invoke, decision.later) == (["emails"], {})
