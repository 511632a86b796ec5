"""Sequences, dependencies and recorded output (migration 0021, docs/jobs.md) through real
drains on a real database. Each safety test stands beside its control: the same timeline with
the one mechanism switched off."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgdrain.db.sql
from helpers.fixtures import (
    UNREADABLE_JSON,
    claim_batch,
    complete_one,
    job_row,
    unfenced,
    unreadable_job,
    wait_for,
)
from helpers.sql_functions import function_text
from pgdrain import (
    BadInput,
    Budget,
    Discard,
    DrainResult,
    Job,
    Registry,
    RetryIn,
    Settings,
    build_job,
    drain,
    enqueue,
    enqueue_many,
    job_state,
    workflow,
)
from pgdrain.api.registry import MAX_OUTPUT_BYTES
from pgdrain.db import store
from pgdrain.db.session import Session
from pgdrain.db.sql import query
from pgdrain.db.store.operator_commands import READ_MAX_DEPTH

Conn = psycopg.Connection[Any]

jobs = Registry()
ran: list[int] = []  # job ids, in the order their functions started
BARRIER_SECONDS = 3.0  # how long a job waits for a second one of its kind to start beside it


@jobs.job("step")
def step(job: Job) -> dict[str, Any]:
    ran.append(job.id)
    return {"n": job.payload.get("n"), "id": job.id}


@jobs.job("sum_inputs")
def sum_inputs(job: Job) -> int:
    ran.append(job.id)
    with psycopg.connect(job.payload["url"]) as conn:
        outputs = job.dependency_outputs(conn)
    return sum(o["n"] for o in outputs.values())


outputs_read: list[dict[int, Any]] = []  # what each read_outputs attempt read


@jobs.job("read_outputs")
def read_outputs(job: Job) -> None:
    """Reads its dependencies' outputs; its first attempt then asks to be retried an hour on."""
    with psycopg.connect(job.payload["url"]) as conn:
        outputs_read.append(job.dependency_outputs(conn))
    if job.attempt == 1:
        raise RetryIn(3600, "come back later")


@jobs.job("refuse")
def refuse(job: Job) -> None:
    ran.append(job.id)
    raise Discard("nothing to do")


@jobs.job("big_output")
def big_output(job: Job) -> str:
    return "x" * (MAX_OUTPUT_BYTES + 1)


@jobs.job("nothing")
def nothing(job: Job) -> None:
    ran.append(job.id)


progress_seen = threading.Event()


@jobs.job("long_progress")
def long_progress(job: Job) -> None:
    """Records progress, then runs until the test has seen it in the table (or gives up)."""
    job.record_progress(42)
    progress_seen.wait(30)


@jobs.job("progress")
def progress(job: Job) -> str:
    job.record_progress({"done": 3, "of": 3})
    return "finished"


class Meeting:
    """Two jobs of kind "meet" wait for each other at a barrier: both start only if they may
    run at the same time. `met` says whether they did."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2)
        self.met: list[bool] = []


meeting = Meeting()


@jobs.job("meet")
def meet(job: Job) -> None:
    ran.append(job.id)
    try:
        meeting.barrier.wait(BARRIER_SECONDS)
        meeting.met.append(True)
    except threading.BrokenBarrierError:
        meeting.met.append(False)


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    global meeting
    ran.clear()
    meeting = Meeting()
    progress_seen.clear()
    outputs_read.clear()
    yield
    meeting.barrier.abort()


def run(url: str, **settings: Any) -> DrainResult:
    return drain(Settings(**settings), Budget.seconds(30), jobs, url)


# -- dependencies -------------------------------------------------------------------------------


def test_a_dependent_runs_after_its_dependency_in_the_same_run(db_url: str, conn: Conn) -> None:
    with workflow(conn) as wf:
        a = wf.enqueue("step", {"n": 1})
        b = wf.enqueue("step", {"n": 2}, after=[a])
    assert job_row(conn, b)["status"] == "waiting"
    result = run(db_url, concurrency=1)
    assert result.done == 2
    assert ran == [a, b]


def test_control_without_the_made_ready_notice_the_run_leaves_the_dependent(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Session, "take_made_ready", lambda self: False)
    a = enqueue(conn, "step", {"n": 1})
    b = enqueue(conn, "step", {"n": 2}, after=[a])
    assert run(db_url, concurrency=1).done == 1  # B was made ready, but the run stopped
    assert job_row(conn, b)["status"] == "queued"


def test_a_dependent_reads_its_dependencies_outputs(db_url: str, conn: Conn) -> None:
    a = enqueue(conn, "step", {"n": 2})
    b = enqueue(conn, "step", {"n": 5})
    c = enqueue(conn, "sum_inputs", {"url": db_url}, after=[a, b])
    assert run(db_url).done == 3
    assert job_state(conn, c)["output"] == 7  # type: ignore[index]
    assert job_state(conn, a)["output"] == {"n": 2, "id": a}  # type: ignore[index]


def test_a_dependency_purged_before_its_dependent_runs_again_reads_as_none(
    db_url: str, conn: Conn
) -> None:
    with workflow(conn) as wf:
        a = wf.enqueue("step", {"n": 2})
        b = wf.enqueue("read_outputs", {"url": db_url}, after=[a])
    run(db_url, concurrency=1)
    assert store.job_purge_finished(conn, 0) == 1  # pgdrain purge --older-than-days 0
    conn.execute("UPDATE pgdrain.jobs SET run_at = now() WHERE id = %s", (b,))  # retry due
    run(db_url)
    # Every dependency keeps its key: one whose row is gone reads None, as one not done.
    assert outputs_read == [{a: {"n": 2, "id": a}}, {a: None}]


def test_a_failed_dependency_cancels_its_dependents_recursively(db_url: str, conn: Conn) -> None:
    a = enqueue(conn, "refuse")
    b = enqueue(conn, "step", after=[a])
    c = enqueue(conn, "step", after=[b])
    result = run(db_url)
    assert (result.done, result.failed) == (0, 1)
    assert ran == [a]
    assert job_row(conn, b)["status"] == "cancelled"
    assert job_row(conn, b)["last_error"] == f"cancelled: job {a}, which it depends on, failed"
    assert job_row(conn, c)["last_error"] == (
        f"cancelled: job {b}, which it depends on, was cancelled"
    )


def test_depending_on_a_done_job_is_queued_at_once(db_url: str, conn: Conn) -> None:
    a = enqueue(conn, "step")
    run(db_url)
    b = enqueue(conn, "step", after=[a])
    assert job_row(conn, b)["status"] == "queued"


def _released_at_now(conn: Conn) -> None:
    """jobs_flow_finished as it was before migration 0031: the job it releases queued at now()."""
    text = function_text(conn, "pgdrain.jobs_flow_finished()")
    for kept, at_now in (
        ("run_at = greatest(j.run_at, held_until),", "run_at = now(),"),  # 0034, 0042, 0045
        (
            "SET status = 'queued', updated_at = now()",
            "SET status = 'queued', run_at = now(), updated_at = now()",
        ),
    ):
        assert text.count(kept) == 1, kept
        text = text.replace(kept, at_now)
    conn.execute(text.encode())


@pytest.mark.parametrize("waits", [True, False], ids=["waits-for-the-lease", "control-at-once"])
def test_the_next_job_of_a_sequence_waits_for_a_cancelled_heads_lease(
    conn: Conn, waits: bool
) -> None:
    """A red team's report: the running head of a sequence cancelled, its code still running
    until its next heartbeat, and the next job of the sequence released beside it."""
    if not waits:  # jobs_flow_finished as before migration 0034
        text = function_text(conn, "pgdrain.jobs_flow_finished()")
        lease = ", NEW.cancelled_lease_expires_at"
        assert text.count(lease) == 1
        conn.execute(text.replace(lease, "").encode())
    head = enqueue(conn, "step", sequence="s1")
    following = enqueue(conn, "step", sequence="s1")
    [claimed] = claim_batch(conn, ["default"], 1, "a-run", 300.0, None)
    assert claimed.id == head
    lease_end = job_row(conn, head)["lease_expires_at"]
    store.job_cancel(conn, [head])
    assert job_row(conn, following)["status"] == "queued"
    again = claim_batch(conn, ["default"], 1, "another-run", 300.0, None)
    if waits:
        assert (again, job_row(conn, following)["run_at"]) == ([], lease_end)
    else:
        assert [j.id for j in again] == [following]  # beside the head's cancelled attempt


def _enqueue_function_without(conn: Conn, part: str, instead: str = "") -> None:
    """jobs_flow_enqueued with `part` of its definition (there once) replaced: as it was."""
    text = function_text(conn, "pgdrain.jobs_flow_enqueued()")
    assert text.count(part) == 1, part
    conn.execute(text.replace(part, instead).encode())


def _cancel_a_running_head(conn: Conn, sequence: str) -> dt.datetime:
    """A sequence's only job, claimed then cancelled while it runs; its lease's end."""
    head = enqueue(conn, "step", sequence=sequence)
    [claimed] = claim_batch(conn, ["default"], 1, "a-run", 300.0, None)
    assert claimed.id == head
    lease_end: dt.datetime = job_row(conn, head)["lease_expires_at"]
    store.job_cancel(conn, [head])
    return lease_end


LEASE_WAIT = (
    "(SELECT s.lease_until FROM pgdrain.sequences AS s\n"
    "                                                WHERE s.sequence = NEW.sequence)"
)


@pytest.mark.parametrize("waits", [True, False], ids=["waits-for-the-lease", "control-at-once"])
def test_a_job_enqueued_after_its_sequences_last_job_was_cancelled_running_waits_for_it(
    conn: Conn, waits: bool
) -> None:
    """A red team's report: the sequence's only job cancelled while it ran (its code runs on
    until its lease ends), then a job enqueued into the sequence: queued at once, beside it.
    Migration 0038 queues it for the end of that lease."""
    if not waits:  # jobs_flow_enqueued as before migration 0038
        _enqueue_function_without(conn, LEASE_WAIT, "NULL")
    lease_end = _cancel_a_running_head(conn, "s1")
    following = enqueue(conn, "step", sequence="s1")
    again = claim_batch(conn, ["default"], 1, "another-run", 300.0, None)
    if waits:
        assert (again, job_row(conn, following)["run_at"]) == ([], lease_end)
    else:
        assert [j.id for j in again] == [following]  # beside the cancelled head's code


@pytest.mark.parametrize("refused", [True, False], ids=["serialization-failure", "control-stuck"])
def test_an_enqueue_into_a_sequence_from_a_snapshot_older_than_its_last_finish(
    db_url: str, conn: Conn, refused: bool
) -> None:
    """A red team's report: an application's REPEATABLE READ transaction took its snapshot
    while the sequence's last job ran; that job finished; the transaction then enqueued into
    the sequence. Its snapshot saw the job running, so the new one was made `waiting`, and no
    finish was left to queue it. It now fails with a serialization failure, and the
    transaction run again queues the job."""
    if not refused:  # jobs_flow_enqueued as before migration 0038
        _enqueue_function_without(
            conn, "IF made AND current_setting", "IF false AND current_setting"
        )
    head = enqueue(conn, "step", sequence="s1")
    with psycopg.connect(db_url) as app:
        app.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        app.execute("SELECT count(*) FROM pgdrain.jobs")  # the snapshot: the head unfinished
        run(db_url)  # the head runs and finishes
        assert ran == [head]
        if refused:
            with pytest.raises(psycopg.errors.SerializationFailure, match="run the transaction"):
                enqueue(app, "step", sequence="s1")
            app.rollback()
            following = enqueue(app, "step", sequence="s1")  # the transaction run again
            app.commit()
            assert job_row(conn, following)["status"] == "queued"
        else:
            following = enqueue(app, "step", sequence="s1")
            app.commit()
            run(db_url)
            assert job_row(conn, following)["status"] == "waiting"  # for good
            assert ran == [head]


@pytest.mark.parametrize("carried", [True, False], ids=["carried", "control-dropped"])
def test_a_sequences_kept_lease_outlives_a_cancel_of_the_job_behind_it(
    conn: Conn, carried: bool
) -> None:
    """A review's finding: the lease of a sequence's last job, cancelled while it ran, was kept
    for the next job enqueued (0038), but cancelling that job released the one behind it at
    once, beside the cancelled job's code. Migration 0042 carries the kept lease on."""
    if not carried:  # jobs_flow_finished as 0038 made it: the row's lease not read
        text = function_text(conn, "pgdrain.jobs_flow_finished()")
        kept = "RETURNING s.lease_until INTO held_until;"
        assert text.count(kept) == 1
        conn.execute(text.replace(kept, ";").encode())
    lease_end = _cancel_a_running_head(conn, "s1")
    queued_behind = enqueue(conn, "step", sequence="s1")
    assert job_row(conn, queued_behind)["run_at"] == lease_end
    after_it = enqueue(conn, "step", sequence="s1")
    store.job_cancel(conn, [queued_behind])
    run_at = job_row(conn, after_it)["run_at"]
    assert (run_at == lease_end) is carried


KEPT_ONLY_WHEN_NONE_RELEASED = "IF held_until > now() THEN"


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "control-0042"])
def test_a_cancelled_heads_lease_outlives_a_cancel_of_the_job_it_released(
    conn: Conn, kept: bool
) -> None:
    """A red team's finding: the running head of a sequence cancelled released the next job
    for the end of its lease, but cancelling that job released the third at once, beside the
    head's code: the lease was kept on the sequence only when no job was released. Migration
    0045 keeps it whenever it has not ended. The control: jobs_flow_finished as 0042 made it."""
    if not kept:
        text = function_text(conn, "pgdrain.jobs_flow_finished()")
        assert text.count(KEPT_ONLY_WHEN_NONE_RELEASED) == 1
        conn.execute(
            text.replace(
                KEPT_ONLY_WHEN_NONE_RELEASED, "IF n = 0 AND held_until > now() THEN"
            ).encode()
        )
    head = enqueue(conn, "step", sequence="acct")
    released, third = (enqueue(conn, "step", sequence="acct") for _ in range(2))
    [claimed] = claim_batch(conn, ["default"], 1, "a-run", 300.0, None)
    assert claimed.id == head
    lease_end = job_row(conn, head)["lease_expires_at"]
    store.job_cancel(conn, [head])
    assert job_row(conn, released)["run_at"] == lease_end
    store.job_cancel(conn, [released])
    again = claim_batch(conn, ["default"], 1, "another-run", 300.0, None)
    if kept:
        assert (again, job_row(conn, third)["run_at"]) == ([], lease_end)
    else:
        assert [j.id for j in again] == [third]  # beside the head's cancelled attempt


RETRY_IN_ID_ORDER = (
    "IF current_setting('pgdrain.queued_again', true) = 'on' THEN\n                -- Queued again"
)


@pytest.mark.parametrize("ordered", [True, False], ids=["in-id-order", "control-as-read"])
def test_a_retry_of_a_sequences_jobs_puts_them_back_in_id_order(conn: Conn, ordered: bool) -> None:
    """A red team's report: `pgdrain retry 1 2 3` of a sequence's jobs queued the one its
    statement read first (3, the first to finish), and the sequence ran 3, 1, 2."""
    if not ordered:  # jobs_flow_enqueued as before migration 0041
        _enqueue_function_without(
            conn, RETRY_IN_ID_ORDER, "IF false THEN\n                -- Queued again"
        )
    first, second, third = (enqueue(conn, "step", sequence="k") for _ in range(3))
    for job in (third, first, second):  # each cancelled in turn: 3 (waiting), 1, then 2
        store.job_cancel(conn, [job])
    store.job_retry(conn, [first, second, third])
    statuses = {j: job_row(conn, j)["status"] for j in (first, second, third)}
    if ordered:
        assert statuses == {first: "queued", second: "waiting", third: "waiting"}
    else:
        assert statuses == {first: "waiting", second: "waiting", third: "queued"}


@pytest.mark.parametrize("kept", [True, False], ids=["keeps-its-delay", "control-at-now"])
@pytest.mark.parametrize("flow", ["sequence", "dependency"])
def test_a_delayed_job_released_by_its_flow_keeps_its_delay(
    db_url: str, conn: Conn, flow: str, kept: bool
) -> None:
    if not kept:
        _released_at_now(conn)
    first = enqueue(conn, "step", sequence="s1" if flow == "sequence" else None)
    later = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    held = {"sequence": "s1"} if flow == "sequence" else {"after": [first]}
    delayed = enqueue(conn, "step", run_at=later, **held)
    assert job_row(conn, delayed)["status"] == "waiting"
    run(db_url)
    if kept:  # queued when the first finished, due an hour from its enqueue, as asked
        assert ran == [first]
        assert (job_row(conn, delayed)["status"], job_row(conn, delayed)["run_at"]) == (
            "queued",
            later,
        )
    else:  # run at once
        assert ran == [first, delayed]


def _released_at_now_or_later(conn: Conn) -> None:
    """jobs_flow_finished as 0045 left it: the job it releases queued at now() or later."""
    text = function_text(conn, "pgdrain.jobs_flow_finished()")
    for kept, as_0045 in (
        (
            "run_at = greatest(j.run_at, held_until),",
            "run_at = greatest(j.run_at, now(), held_until),",
        ),
        (
            "SET status = 'queued', updated_at = now()",
            "SET status = 'queued', run_at = greatest(d.run_at, now()), updated_at = now()",
        ),
    ):
        assert text.count(kept) == 1, kept
        text = text.replace(kept, as_0045)
    conn.execute(text.encode())


@pytest.mark.parametrize("flow", ["sequence", "after"])
@pytest.mark.parametrize("kept", [True, False], ids=["keeps-its-place", "control-at-now"])
def test_a_released_job_keeps_its_place_ahead_of_a_later_backlog(
    conn: Conn, flow: str, kept: bool
) -> None:
    """A red team's finding: a job released by its sequence or dependencies was queued at
    now(), behind every job enqueued since, and each step of a chain waited for the queue's
    whole backlog. The control: the release as 0045 made it."""
    if not kept:
        _released_at_now_or_later(conn)
    first = enqueue(conn, "step", sequence="s1" if flow == "sequence" else None)
    held = {"sequence": "s1"} if flow == "sequence" else {"after": [first]}
    second = enqueue(conn, "step", **held)
    with conn.transaction():
        enqueue_many(conn, [build_job("step") for _ in range(20)])  # the backlog, later
    [head] = claim_batch(conn, ["default"], 1, "a-run", 300.0, None)
    assert head.id == first
    assert complete_one(conn, head.held)
    [next_claimed] = claim_batch(conn, ["default"], 1, "a-run", 300.0, None)
    assert (next_claimed.id == second) is kept  # the control: a job of the backlog first


def test_a_missing_dependency_is_refused_and_nothing_is_written(conn: Conn) -> None:
    with pytest.raises(BadInput, match=r"job 999999 \(a dependency\) does not exist"):
        with workflow(conn) as wf:
            a = wf.enqueue("step")
            wf.enqueue("step", after=[a, 999999])
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)


def test_enqueue_many_takes_sequences_and_dependencies(db_url: str, conn: Conn) -> None:
    a = enqueue(conn, "step")
    ids = enqueue_many(
        conn,
        [
            build_job("step", {"n": 1}, sequence="k"),
            build_job("step", {"n": 2}, sequence="k"),
            build_job("step", {"n": 3}, after=[a]),
        ],
    )
    assert [job_row(conn, i)["status"] for i in ids] == ["queued", "waiting", "waiting"]
    assert run(db_url, concurrency=1).done == 4
    assert ran.index(ids[0]) < ran.index(ids[1]) and ran.index(a) < ran.index(ids[2])


def test_a_sequence_and_dependencies_on_one_job_are_refused(conn: Conn) -> None:
    with pytest.raises(BadInput, match="not both"):
        enqueue(conn, "step", sequence="k", after=[1])


# -- sequences --------------------------------------------------------------------------------


def _two_runs(url: str) -> None:
    """Two concurrent runs, each free to take one job at a time."""
    threads = [threading.Thread(target=run, args=(url,), kwargs={"concurrency": 2}) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_jobs_of_one_sequence_never_run_at_once_across_runs(db_url: str, conn: Conn) -> None:
    first = enqueue(conn, "meet", sequence="customer-42")
    second = enqueue(conn, "meet", sequence="customer-42")
    _two_runs(db_url)
    assert meeting.met == [False, False]  # each waited alone for the other
    assert ran == [first, second]


def test_control_without_a_sequence_the_two_jobs_overlap(db_url: str, conn: Conn) -> None:
    enqueue(conn, "meet")
    enqueue(conn, "meet")
    _two_runs(db_url)
    assert meeting.met == [True, True]


def test_other_sequences_keep_flowing(db_url: str, conn: Conn) -> None:
    enqueue(conn, "meet", sequence="customer-1")
    enqueue(conn, "meet", sequence="customer-2")
    _two_runs(db_url)
    assert meeting.met == [True, True]


def test_a_sequence_runs_in_enqueue_order(db_url: str, conn: Conn) -> None:
    ids = [enqueue(conn, "step", {"n": i}, sequence="s", priority=-i) for i in range(5)]
    others = [enqueue(conn, "step", {"n": i}, sequence="t") for i in range(5)]
    assert run(db_url, concurrency=4).done == 10
    assert [i for i in ran if i in ids] == ids  # priority does not reorder a sequence
    assert [i for i in ran if i in others] == others


def test_a_retried_job_holds_its_sequence_a_discarded_one_frees_it(db_url: str, conn: Conn) -> None:
    a = enqueue(conn, "refuse", sequence="s")
    b = enqueue(conn, "step", sequence="s")
    [claimed] = claim_batch(conn, ["default"], 10, "w", 300, None)
    assert claimed.id == a
    store.job_fail(conn, claimed.held, "RuntimeError: later", 0.0)  # retryable: held
    assert (job_row(conn, a)["status"], job_row(conn, b)["status"]) == ("queued", "waiting")
    run(db_url)
    assert ran == [a, b]  # discarded: b runs


MIGRATION = (
    Path(pgdrain.db.sql.__file__).parent / "migrations/0021_sequences_dependencies_output.sql"
)
UPSERT = (
    "        INSERT INTO pgdrain.sequences AS s (sequence) VALUES (NEW.sequence)\n"
    "        ON CONFLICT (sequence) DO UPDATE SET touched_at = now();\n"
)


def _enqueue_trigger_without_the_sequence_row(conn: Conn) -> None:
    """The control: the enqueue trigger's function as migrated, without its upsert of the
    sequence's row (the one line pair that makes two enqueues of a key wait for each other)."""
    text = MIGRATION.read_text(encoding="utf-8")
    start = text.index("CREATE FUNCTION pgdrain.jobs_flow_enqueued()")
    function = text[start : text.index("$$;", start) + 3]
    assert function.count(UPSERT) == 1
    conn.execute(
        function.replace(UPSERT, "").replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    )


def _two_enqueues_at_once(url: str, conn: Conn) -> list[str]:
    """The first transaction enqueues key "same" and stays open while the second enqueues it
    too; the first commits once the second has enqueued or waits for a lock."""
    first, second = psycopg.connect(url), psycopg.connect(url)
    ids: list[int] = []
    try:
        ids.append(enqueue(first, "step", sequence="same"))
        pid = second.info.backend_pid

        def enqueue_second() -> None:
            ids.append(enqueue(second, "step", sequence="same"))

        thread = threading.Thread(target=enqueue_second)
        thread.start()
        wait_for(
            lambda: (
                len(ids) == 2
                or conn.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                == (True,)
            ),
            what="the second enqueue to finish or wait for a lock",
        )
        first.commit()
        thread.join(30)
        second.commit()
        return sorted(job_row(conn, i)["status"] for i in ids)
    finally:
        first.close()
        second.close()


def test_concurrent_enqueues_of_one_key_leave_one_queued(db_url: str, conn: Conn) -> None:
    assert _two_enqueues_at_once(db_url, conn) == ["queued", "waiting"]


def test_control_without_the_sequence_row_both_are_queued(db_url: str, conn: Conn) -> None:
    _enqueue_trigger_without_the_sequence_row(conn)
    assert _two_enqueues_at_once(db_url, conn) == ["queued", "queued"]


def test_an_operators_cancel_of_the_head_lets_the_next_run(conn: Conn) -> None:
    head = enqueue(conn, "step", sequence="s")
    nxt = enqueue(conn, "step", sequence="s")
    assert [c.id for c in store.job_cancel(conn, [head])] == [head]
    assert job_row(conn, nxt)["status"] == "queued"


def test_a_retried_job_of_a_busy_sequence_waits_behind_its_holder(conn: Conn) -> None:
    first = enqueue(conn, "step", sequence="s")
    store.job_cancel(conn, [first])  # the sequence is free: the next one is the holder
    holder = enqueue(conn, "step", sequence="s")
    assert job_row(conn, holder)["status"] == "queued"
    assert [r.retried for r in store.job_retry(conn, [first])] == [True]
    assert job_row(conn, first)["status"] == "waiting"
    store.job_cancel(conn, [holder])
    assert job_row(conn, first)["status"] == "queued"


def test_a_waiting_job_holds_its_idempotency_key(conn: Conn) -> None:
    enqueue(conn, "step", sequence="s")
    second = enqueue(conn, "step", sequence="s", idempotency_key="k")
    assert job_row(conn, second)["status"] == "waiting"
    assert enqueue(conn, "step", sequence="s", idempotency_key="k") == second


# -- the fence ------------------------------------------------------------------------------


def _stale_head(conn: Conn) -> tuple[store.Held, store.Held, int]:
    """A sequence's head whose first attempt lost its lease and was claimed again, and the
    job waiting behind it."""
    head = enqueue(conn, "step", sequence="s")
    nxt = enqueue(conn, "step", sequence="s")
    [first] = claim_batch(conn, ["default"], 10, "w", 300, None)
    conn.execute(
        "UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
        (head,),
    )
    assert [r.id for r in store.job_reclaim_expired(conn, 10)] == [head]
    [second] = claim_batch(conn, ["default"], 10, "w", 300, None)
    assert second.id == head
    return first.held, second.held, nxt


def test_a_stale_attempt_cannot_complete_a_head_nor_release_its_sequence(conn: Conn) -> None:
    stale, _current, nxt = _stale_head(conn)
    assert store.job_complete_many(conn, [stale]).lost_attempts == {stale}
    assert job_row(conn, nxt)["status"] == "waiting"
    assert store.job_record_many(conn, [(stale, '"stale"', None)]).lost_attempts == {stale}


def test_control_unfenced_a_stale_attempt_releases_the_sequence(conn: Conn) -> None:
    stale, _current, nxt = _stale_head(conn)
    conn.execute(
        unfenced("job_complete_many"),
        {"ids": [stale.id], "tokens": [stale.token], "keep_done": True},
    )
    assert job_row(conn, nxt)["status"] == "queued"  # while the current attempt runs


# -- recorded output ------------------------------------------------------------------------


def test_an_output_too_large_fails_the_job_with_a_clear_error(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "big_output")
    assert run(db_url).failed == 1
    row = job_row(conn, job_id)
    assert row["status"] == "failed"
    assert row["output"] is None
    assert (
        f"output is {MAX_OUTPUT_BYTES + 3} bytes; the limit is {MAX_OUTPUT_BYTES}"
        in (row["last_error"])
    )


def test_progress_and_output_are_recorded(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "progress")
    assert run(db_url).done == 1
    state = job_state(conn, job_id)
    assert state is not None
    assert (state["output"], state["progress"]) == ("finished", {"done": 3, "of": 3})


def test_progress_is_written_with_the_heartbeat_while_the_job_runs(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "long_progress")
    thread = threading.Thread(target=run, args=(db_url,), kwargs={"lease_seconds": 1})
    thread.start()
    try:
        wait_for(lambda: job_row(conn, job_id)["progress"] == 42, 20, "the progress written")
        assert job_row(conn, job_id)["status"] == "running"
    finally:
        progress_seen.set()
        thread.join(30)
    assert job_row(conn, job_id)["status"] == "done"


@pytest.mark.parametrize("bad", ["1", 1.0, True, None])
def test_job_state_refuses_an_id_that_is_not_a_whole_number(conn: Conn, bad: object) -> None:
    enqueue(conn, "nothing")  # job 1 exists: "1" read as "no such job" would mislead
    with pytest.raises(BadInput, match="job_id must be a whole number"):
        job_state(conn, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("job_id", [0, -1, 2**63, 10**30])
def test_job_state_of_an_id_no_job_can_have_is_none(conn: Conn, job_id: int) -> None:
    assert job_state(conn, job_id) is None


def test_a_job_without_output_records_none(db_url: str, conn: Conn) -> None:
    job_id = enqueue(conn, "nothing")
    assert run(db_url).done == 1
    assert job_row(conn, job_id)["output"] is None


@pytest.mark.parametrize("kind", sorted(UNREADABLE_JSON))
def test_values_python_cannot_hold_are_read_as_their_json_text(conn: Conn, kind: str) -> None:
    text = UNREADABLE_JSON[kind]
    job_id = unreadable_job(conn, text)
    state = job_state(conn, job_id)
    assert state is not None and (state["id"], state["kind"]) == (job_id, "k")  # the rest reads
    assert set(state["undecoded"]) == {"payload", "output", "progress", "errors"}
    assert (state["payload"], state["output"], state["progress"]) == (text, text, text)
    assert state["errors"] == f"[{text}]"
    why = "nests deeper than 64 levels" if kind == "deep" else "cannot be read in Python"
    assert state["undecoded"]["payload"].startswith(why)
    [listed] = store.job_list(conn, ["queued"], 10)
    assert listed.id == job_id and (listed.output, listed.progress) == (text, text)
    assert listed.undecoded is not None and set(listed.undecoded) == {"output", "progress"}


@pytest.mark.parametrize("kind", sorted(UNREADABLE_JSON))
def test_control_read_as_one_document_the_job_raises(conn: Conn, kind: str) -> None:
    """job_show as it was: the whole row as one jsonb, which psycopg decodes with json.loads."""
    job_id = unreadable_job(conn, UNREADABLE_JSON[kind])
    cur = conn.execute("SELECT to_jsonb(j) FROM pgdrain.jobs AS j WHERE j.id = %s", (job_id,))
    with pytest.raises((RecursionError, ValueError)):
        cur.fetchone()


@pytest.mark.parametrize("depth", [READ_MAX_DEPTH, READ_MAX_DEPTH + 1])
def test_a_payload_nested_to_the_limit_is_decoded_one_past_it_is_not(
    conn: Conn, depth: int
) -> None:
    text = "[" * depth + "]" * depth
    job_id = enqueue(conn, "k")
    conn.execute("UPDATE pgdrain.jobs SET payload = %s::jsonb WHERE id = %s", (text, job_id))
    state = job_state(conn, job_id)
    assert state is not None
    if depth == READ_MAX_DEPTH:
        assert "undecoded" not in state and state["payload"] == json.loads(text)
    else:
        assert state["undecoded"] == {"payload": "nests deeper than 64 levels"}
        assert state["payload"] == text


# -- the documentation's example ---------------------------------------------------------------


def test_the_runnable_example_in_jobs_md_runs(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(__file__).parents[2] / "docs/jobs.md").read_text(encoding="utf-8")
    section = text[text.index("## Recorded output") :]
    start = section.index("```python\nimport os")
    block = section[start + len("```python\n") : section.index("```", start + 10)]
    monkeypatch.setenv("DATABASE_URL", db_url)
    exec(compile(block, "docs/jobs.md", "exec"), {"__name__": "jobs_md_example"})


# -- the split jobs table (migration 0018): finishing is a move into finished_jobs -------------


def _move_done(conn: Conn, job_id: int, finished_at: str) -> None:
    """Finish a job as every completion does since 0018: out of active_jobs and into
    finished_jobs in one statement, here with the given finished_at (which picks the partition)."""
    conn.execute(
        "WITH ended AS (DELETE FROM pgdrain.active_jobs WHERE id = %s RETURNING *)"
        " INSERT INTO pgdrain.finished_jobs (id, queue, kind, payload, status, priority, run_at,"
        " attempts, max_attempts, recovery_policy, reclaim_count, created_at, updated_at,"
        " finished_at, errors, sequence, depends_on, has_dependents)"
        " SELECT id, queue, kind, payload, 'done', priority, run_at, attempts, max_attempts,"
        " recovery_policy, reclaim_count, created_at, now(), CAST(%s AS timestamptz), errors,"
        " sequence, depends_on, has_dependents FROM ended",
        (job_id, finished_at),
    )


@pytest.mark.parametrize(
    "finished_at",
    [
        "now",  # today's partition
        "2001-01-01 12:00+00",  # no partition for that day: the default one
        "later",  # a day partition finished_jobs_partition_ensure makes after the migration
    ],
)
def test_a_finish_in_any_partition_of_the_history_queues_what_waited(
    conn: Conn, finished_at: str
) -> None:
    if finished_at == "later":
        conn.execute(
            "SELECT pgdrain.finished_jobs_partition_ensure(current_date + 40, current_date + 40)"
        )
        [(finished_at,)] = conn.execute(
            "SELECT ((current_date + 40)::timestamp AT TIME ZONE 'UTC' + interval '1 hour')::text"
        ).fetchall()
    a = enqueue(conn, "step")
    b = enqueue(conn, "step", after=[a])
    head = enqueue(conn, "step", sequence="s")
    nxt = enqueue(conn, "step", sequence="s")
    _move_done(conn, a, finished_at)
    _move_done(conn, head, finished_at)
    assert (job_row(conn, b)["status"], job_row(conn, nxt)["status"]) == ("queued", "queued")


def test_every_partition_of_the_history_has_the_finish_trigger(conn: Conn) -> None:
    conn.execute(
        "SELECT pgdrain.finished_jobs_partition_ensure(current_date + 41, current_date + 41)"
    )
    rows = conn.execute(
        "SELECT p.relid::text, EXISTS (SELECT 1 FROM pg_trigger AS t WHERE t.tgrelid = p.relid"
        "   AND t.tgname = 'jobs_flow_finished')"
        " FROM pg_partition_tree('pgdrain.finished_jobs') AS p WHERE p.isleaf"
    ).fetchall()
    assert {"pgdrain.finished_jobs_failed", "pgdrain.finished_jobs_done_default"} <= {
        r[0] for r in rows
    }
    assert all(has for _, has in rows), rows


def test_cancelled_jobs_leave_active_jobs(db_url: str, conn: Conn) -> None:
    """Dependents cancelled by a failed dependency, and a job enqueued after it (cancelled at
    once), are in the history, as every finished job is."""
    a = enqueue(conn, "refuse")
    b = enqueue(conn, "step", after=[a])
    c = enqueue(conn, "step", after=[b])
    run(db_url)
    late = enqueue(conn, "step", after=[a])
    assert job_row(conn, late)["last_error"] == f"cancelled: job {a}, which it depends on, failed"
    ids = [b, c, late]
    assert conn.execute(
        "SELECT count(*) FROM pgdrain.active_jobs WHERE id = ANY(%s)", (ids,)
    ).fetchone() == (0,)
    assert conn.execute(
        "SELECT array_agg(status ORDER BY id) FROM pgdrain.finished_jobs_failed WHERE id = ANY(%s)",
        (ids,),
    ).fetchone() == (["cancelled"] * 3,)


def _complete_while_a_dependent_is_enqueued(url: str, conn: Conn, statement: str) -> str:
    """A runs; a transaction enqueues B after A and stays open while A's completion (the
    statement given) waits for A's row; then it commits. Returns B's status after both."""
    a = enqueue(conn, "step")
    [claimed] = claim_batch(conn, ["default"], 10, "w", 300, None)
    enqueuer, completer = psycopg.connect(url), psycopg.connect(url, autocommit=True)
    try:
        b = enqueue(enqueuer, "step", after=[a])
        pid = completer.info.backend_pid
        thread = threading.Thread(
            target=lambda: completer.execute(
                statement, {"ids": [a], "tokens": [claimed.held.token], "keep_done": True}
            )
        )
        thread.start()
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                == (True,)
            ),
            what="the completion to wait for the enqueue's lock on A",
        )
        enqueuer.commit()
        thread.join(30)
        assert job_row(conn, a)["status"] == "done"
        return str(job_row(conn, b)["status"])
    finally:
        enqueuer.close()
        completer.close()


def test_a_completion_behind_an_enqueue_carries_has_dependents(db_url: str, conn: Conn) -> None:
    assert _complete_while_a_dependent_is_enqueued(db_url, conn, query("job_complete_many")) == (
        "queued"
    )


def test_control_a_move_that_drops_has_dependents_strands_the_dependent(
    db_url: str, conn: Conn
) -> None:
    statement = query("job_complete_many")
    carried = "j.sequence, j.depends_on, j.has_dependents, j.output, j.progress"
    assert statement.count(carried) == 1
    statement = statement.replace(carried, "j.sequence, j.depends_on, false, j.output, j.progress")
    assert _complete_while_a_dependent_is_enqueued(db_url, conn, statement) == "waiting"


def _retry_without_judging_dependencies(conn: Conn, ids: list[int]) -> list[store.Retry]:
    """job_retry as it was before migration 0029: not judging the dependencies itself, and not
    marking its transaction as a retry's."""
    statement = query("job_retry")
    assert statement.count("AND r.dependency IS NULL") == 1
    statement = statement.replace("AND r.dependency IS NULL", "")
    with conn.transaction():
        rows = conn.execute(statement, {"ids": ids}).fetchall()
    return [store.Retry(r[0], r[1], r[2], r[4], r[3]) for r in rows]


def _dependent_of_a_failed_job(db_url: str, conn: Conn) -> tuple[int, int]:
    """A job that failed for good, and its dependent, cancelled by that."""
    a = enqueue(conn, "refuse")
    b = enqueue(conn, "step", after=[a])
    run(db_url)
    return a, b


def test_a_dependent_cancelled_by_a_failed_job_is_not_retried_and_says_why(
    db_url: str, conn: Conn
) -> None:
    a, b = _dependent_of_a_failed_job(db_url, conn)
    before = job_row(conn, b)
    [retry] = store.job_retry(conn, [b])
    assert not retry.retried
    assert retry.why_not() == f"job {a}, which it depends on, failed"
    assert job_row(conn, b) == before  # untouched
    assert ran == [a]


def test_control_unjudged_a_retried_dependent_is_said_queued_and_cancelled_again(
    db_url: str, conn: Conn
) -> None:
    a, b = _dependent_of_a_failed_job(db_url, conn)
    assert [r.retried for r in _retry_without_judging_dependencies(conn, [b])] == [True]
    assert job_row(conn, b)["status"] == "cancelled"
    assert conn.execute("SELECT count(*) FROM pgdrain.active_jobs").fetchone() == (0,)
    assert ran == [a]


def test_a_dependent_retried_after_its_dependency_waits_for_it(db_url: str, conn: Conn) -> None:
    a, b = _dependent_of_a_failed_job(db_url, conn)
    assert [r.retried for r in store.job_retry(conn, [a])] == [True]
    assert [r.retried for r in store.job_retry(conn, [b])] == [True]
    assert job_row(conn, b)["status"] == "waiting"


def _failed_dependent_of_a_deleted_job(db_url: str, conn: Conn) -> tuple[int, int, int]:
    """A done job, its dependent failed, and a failed job besides; then the done job deleted,
    as retention deletes it after 7 days (the failed ones are kept 30)."""
    a = enqueue(conn, "step")
    b = enqueue(conn, "refuse", after=[a])
    other = enqueue(conn, "refuse")
    run(db_url)
    assert [job_row(conn, j)["status"] for j in (a, b, other)] == ["done", "failed", "failed"]
    conn.execute("DELETE FROM pgdrain.finished_jobs WHERE id = %s", (a,))
    return a, b, other


def test_a_failed_dependent_is_retried_once_retention_deleted_its_dependency(
    db_url: str, conn: Conn
) -> None:
    a, b, other = _failed_dependent_of_a_deleted_job(db_url, conn)
    found = store.job_retry_matching(conn, ["failed"])
    assert sorted(r.id for r in found if r.retried) == [b, other]
    assert job_row(conn, b)["status"] == "queued"  # it ran once: its dependency was done
    with pytest.raises(BadInput, match="a dependency"):  # an enqueue is judged as before
        enqueue(conn, "step", after=[a])


def test_control_unmarked_a_deleted_dependency_fails_the_whole_retry(
    db_url: str, conn: Conn
) -> None:
    a, b, other = _failed_dependent_of_a_deleted_job(db_url, conn)
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match=f"job {a} \\(a dependency\\)"):
        _retry_without_judging_dependencies(conn, [b, other])
    assert [job_row(conn, j)["status"] for j in (b, other)] == ["failed", "failed"]


def test_a_cancelled_dependent_of_a_deleted_job_is_not_retried(db_url: str, conn: Conn) -> None:
    a = enqueue(conn, "step")
    b = enqueue(conn, "step", after=[a])
    store.job_cancel(conn, [b])
    run(db_url)
    conn.execute("DELETE FROM pgdrain.finished_jobs WHERE id = %s", (a,))
    [retry] = store.job_retry(conn, [b])
    assert (retry.retried, retry.dependency, retry.dependency_status) == (False, a, None)
    assert retry.why_not() == f"job {a}, which it depends on, is no longer kept"


def _enqueued_before_0036(conn: Conn) -> None:
    """jobs_flow_enqueued as migration 0029 made it: a mark and a touch for every job."""
    text = (
        Path(pgdrain.db.sql.__file__).parent
        / "migrations"
        / "0029_retry_past_deleted_dependencies.sql"
    ).read_text()
    conn.execute(text[text.index("CREATE OR REPLACE FUNCTION") :].encode())


def _rows_written(conn: Conn, table: str) -> int:
    """Rows this transaction has updated in `table` so far (new versions it wrote)."""
    row = conn.execute("SELECT pg_stat_get_xact_tuples_updated(%s::regclass)", (table,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("once", [True, False], ids=["written-once", "control-written-each-time"])
def test_jobs_enqueued_behind_one_job_in_one_transaction_write_its_row_once(
    conn: Conn, once: bool
) -> None:
    """A red team's report: 20,000 jobs enqueued in one transaction after the same job took 24
    times as long as plain ones, 20,000 into one sequence 7 times: each wrote a new version of
    the dependency's row (or the sequence's), which every later lookup walked. Counted, not
    timed: the new versions this transaction wrote."""
    if not once:
        _enqueued_before_0036(conn)
    first = enqueue(conn, "step")
    with conn.transaction():
        enqueue_many(conn, [build_job("step", after=[first]) for _ in range(50)])
        marks = _rows_written(conn, "pgdrain.active_jobs")
        enqueue_many(conn, [build_job("step", sequence="tenant-1") for _ in range(50)])
        touches = _rows_written(conn, "pgdrain.sequences")
    assert (marks, touches) == ((1, 0) if once else (50, 49))
    assert [job_row(conn, first)["has_dependents"]] == [True]
