"""A per-queue limit's running count stays exact however its row is created (migration 0012),
and is corrected when it holds back ready jobs.

The count trigger moves a queue's count from each statement's changes; a statement that ran it
before the queue's row existed moved nothing. A row counted from a snapshot taken before such
a statement committed was wrong for good: an attempt that ended made it too high (the queue
claims nothing once it reaches its limit, while jobs wait), one claimed made it too low (the
limit is exceeded). Each interleaving is set up with a transaction held open on a second
connection, the wait seen in pg_stat_activity: a completion or a claim in flight when the row
is created, and one that comes while the creation is not committed. The control runs the same
timeline with the two table locks taken out of the trigger and the sync (in the test's own
database: the functions as the migrations define them, less the LOCK line), which is 0006's
behaviour."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from helpers.fixtures import claim_batch, complete_one, wait_for, without_line
from helpers.lock_waits import waits_on_a_lock
from helpers.sql_functions import function_text
from pgdrain import Budget, Settings, enqueue_many, pause_queue, resume_queue
from pgdrain.api.enqueue import build_job
from pgdrain.api.registry import Registry
from pgdrain.aws import events
from pgdrain.aws.control import RunControl
from pgdrain.aws.wake import Waker
from pgdrain.controls import Controls
from pgdrain.db import store
from pgdrain.db.sql import migrations, query
from pgdrain.db.store import control_plane, operator_commands
from pgdrain.runner.drain import drain_with

Conn = psycopg.Connection[Any]
QUEUE = "emails"
LIMIT = 1
TRIGGER_LOCK = "LOCK TABLE pgdrain.queue_limits IN ROW SHARE MODE;"
CREATION_LOCK = "LOCK TABLE pgdrain.queue_limits IN EXCLUSIVE MODE;"


def _enqueue(conn: Conn, n: int) -> None:
    with conn.transaction():
        enqueue_many(conn, [build_job("noop", queue_name=QUEUE) for _ in range(n)])


def _counts(conn: Conn) -> tuple[int, int | None]:
    """(the queue's running jobs, its limit row's running count; None without a row)."""
    jobs = conn.execute(
        "SELECT count(*) FROM pgdrain.jobs WHERE status = 'running' AND queue = %s", (QUEUE,)
    ).fetchone()
    row = conn.execute(
        "SELECT running FROM pgdrain.queue_limits WHERE queue = %s", (QUEUE,)
    ).fetchone()
    assert jobs is not None
    return int(jobs[0]), None if row is None else int(row[0])


def _claim(conn: Conn, n: int = 10) -> list[store.ClaimedJob]:
    return claim_batch(conn, [QUEUE], n, "test", 30.0, None)


def _claim_as_a_drain_does(conn: Conn) -> int:
    """The claim as a drain sends it: prepared, on its generic plan, made once before (on an
    empty queue), so that this execution reuses the plan and takes its locks at bind time."""
    conn.execute("SET plan_cache_mode = force_generic_plan")
    for queues in (["nothing-here"], [QUEUE]):
        statement = store.job_complete_and_claim_statement(
            [], queues, 10, "drain", 30.0, None, None
        )
        rows = conn.execute(statement.text, statement.params, prepare=True).fetchall()
    return len(store.complete_and_claim_result(rows, [])[1])


def _sync(conn: Conn) -> None:
    store.queue_limit_sync(conn, [QUEUE], [(QUEUE, LIMIT)])


def _wait_until(condition: Callable[[], bool]) -> None:
    wait_for(condition, what="the statement to wait on the held transaction's lock")


def _function(name: str) -> str:
    """A function as the latest migration that defines it left it (0012, 0018 for the count
    trigger, which counts deleted rows too, or 0020), as CREATE OR REPLACE."""
    for migration in reversed(list(migrations())):
        found = re.search(
            rf"CREATE (?:OR REPLACE )?FUNCTION pgdrain\.{name}\(.*?\n\$\$;", migration.sql, re.S
        )
        if found is not None:
            return re.sub(r"^CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", found.group(0))
    raise AssertionError(name)


def switch_off_the_creation_lock(conn: Conn) -> None:
    """The control: the trigger and the sync without their table locks (this database only)."""
    conn.execute(without_line(_function("queue_limits_count"), TRIGGER_LOCK))
    conn.execute(without_line(_function("queue_limits_sync"), CREATION_LOCK))


class Held:
    """A second connection whose transaction the test keeps open, and a third that runs a
    statement in a thread (it may wait on the held one's locks)."""

    def __init__(self, db_url: str) -> None:
        self.holder = psycopg.connect(db_url, autocommit=True)
        self.other = psycopg.connect(db_url, autocommit=True)
        self.thread: threading.Thread | None = None
        self.errors: list[BaseException] = []
        self.result: Any = None

    def start(self, call: Callable[[Conn], Any]) -> None:
        def run() -> None:
            try:
                self.result = call(self.other)
            except BaseException as exc:  # reported by join()
                self.errors.append(exc)

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def join(self) -> Any:
        assert self.thread is not None
        self.thread.join(30)
        assert not self.thread.is_alive() and self.errors == []
        return self.result

    def close(self) -> None:
        self.holder.close()
        self.other.close()


IN_FLIGHT = ["completion-before", "claim-before", "completion-during", "claim-during"]


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "control-no-lock"])
@pytest.mark.parametrize("case", IN_FLIGHT)
def test_a_limit_created_while_jobs_move_counts_them_exactly(
    db_url: str, conn: Conn, case: str, locked: bool
) -> None:
    """`before`: the completion or claim has run (its trigger found no row) and is not committed
    when the row is created. `during`: the creation is not committed when it runs."""
    if not locked:
        switch_off_the_creation_lock(conn)
    _enqueue(conn, 3)
    if case.startswith("completion"):
        [job] = _claim(conn, 1)  # running before any limit exists: nothing counted it
    held = Held(db_url)
    try:
        with held.holder.transaction():
            if case == "completion-before":
                assert complete_one(held.holder, job.held)
            elif case == "claim-before":
                assert len(_claim(held.holder)) == 3
            else:
                _sync(held.holder)  # the row, counted, and not committed
            if case.endswith("before"):
                held.start(_sync)
            elif case == "completion-during":
                held.start(lambda c: complete_one(c, job.held))
            else:
                held.start(_claim_as_a_drain_does)
            pid = held.other.info.backend_pid
            if locked:  # it waits for the held transaction, seen waiting
                _wait_until(lambda: waits_on_a_lock(conn, pid))
            else:  # nothing makes it wait
                assert held.thread is not None
                held.thread.join(30)
        result = held.join()
    finally:
        held.close()

    exact = {
        "completion-before": (0, 0),
        "claim-before": (3, 3),  # claimed before the limit was known: counted, not lost
        "completion-during": (0, 0),
        "claim-during": (1, 1),  # it saw the new row: the limit holds
    }[case]
    if locked:
        assert _counts(conn) == exact
        if case == "claim-during":
            assert result == LIMIT
    else:
        # 0006: the count drifted, high (the queue stops) or low (the limit is exceeded).
        drifted = {
            "completion-before": (0, 1),
            "claim-before": (3, 0),
            "completion-during": (0, 1),
            "claim-during": (3, 0),
        }[case]
        assert _counts(conn) == drifted


@pytest.mark.parametrize("locked", [True, False], ids=["locked", "control-no-lock"])
def test_a_count_left_too_high_stops_the_queue_for_good_without_the_lock(
    db_url: str, conn: Conn, locked: bool
) -> None:
    """The issue's timeline: a job finishes while the limit's row is being created; then three
    jobs are ready and every claim after it takes none (without the lock), or one."""
    if not locked:
        switch_off_the_creation_lock(conn)
    _enqueue(conn, 1)
    [job] = _claim(conn, 1)
    held = Held(db_url)
    try:
        with held.holder.transaction():
            assert complete_one(held.holder, job.held)
            held.start(_sync)
            if locked:
                _wait_until(lambda: waits_on_a_lock(conn, held.other.info.backend_pid))
            else:
                assert held.thread is not None
                held.thread.join(30)
        held.join()
    finally:
        held.close()
    _enqueue(conn, 3)
    claims = [len(_claim(conn)) for _ in range(3)]
    assert claims == ([LIMIT, 0, 0] if locked else [0, 0, 0])


def test_a_creation_that_cannot_get_its_lock_in_time_leaves_the_row_to_the_next_run(
    db_url: str, conn: Conn
) -> None:
    """While the creation waits for its lock every statement that moves jobs waits behind it,
    so it waits at most QUEUE_LIMIT_CREATE_WAIT_MS (here the caller's shorter lock_timeout):
    then it creates nothing and the next sync does. The rows there are changed all the same
    (a review found 0047's first form leaving a lowered limit as it was)."""
    store.queue_limit_sync(conn, ["other"], [("other", 5)])
    _enqueue(conn, 1)
    [job] = _claim(conn, 1)
    with psycopg.connect(db_url, autocommit=True) as holder, holder.transaction():
        assert complete_one(holder, job.held)  # holds ROW SHARE on pgdrain.queue_limits
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '200ms'")
            store.queue_limit_sync(conn, [QUEUE, "other"], [(QUEUE, LIMIT), ("other", 2)])
        assert _counts(conn) == (1, None)  # not created
        other = conn.execute("SELECT max_running FROM pgdrain.queue_limits WHERE queue = 'other'")
        assert other.fetchone() == (2,)
    _sync(conn)
    assert _counts(conn) == (0, 0)


SYNC = "pgdrain.queue_limits_sync(text[],text[],integer[],integer[],integer[],integer)"


@pytest.mark.parametrize("rechecked", [True, False], ids=["rechecked", "control-no-recheck"])
def test_a_resume_committed_while_the_sync_waits_leaves_the_limit_in_place(
    db_url: str, conn: Conn, rechecked: bool
) -> None:
    """A queue paused without a limit has a row, which a resume deletes. A run's sync that
    found the row waits for the resume's commit, reads again, and creates the row under its
    lock (migration 0047). The control takes out the second read: the sync's update passes
    over the deleted row, and the queue claims with no limit."""
    if not rechecked:
        read_again = "IF missing THEN  -- a row went while this waited for it"
        text = function_text(conn, SYNC)
        assert read_again in text
        conn.execute(text.replace(read_again, "missing := false; IF false THEN"))
    pause_queue(conn, QUEUE)
    _enqueue(conn, 3)
    held = Held(db_url)
    try:
        with held.holder.transaction():
            assert resume_queue(held.holder, QUEUE)
            held.start(_sync)
            _wait_until(lambda: waits_on_a_lock(conn, held.other.info.backend_pid))
        held.join()
    finally:
        held.close()
    claims = [len(_claim(conn)) for _ in range(2)]
    assert claims == ([LIMIT, 0] if rechecked else [3, 0])


CHANGE = "pgdrain.queue_limits_change(text[],text[],integer[],integer[],integer[])"
# (the new limits, and the queues whose limits the sync manages: None, every one with a row)
SYNCS = {
    "change": ([("a", 6), ("b", 6)], ["a", "b"]),
    "change-and-drop": ([("b", 6)], None),  # a's limit taken out, as a deploy does
}


@pytest.mark.parametrize("sync", SYNCS)
@pytest.mark.parametrize("ordered", [True, False], ids=["claims-order", "control-reversed"])
def test_a_sync_changing_limits_beside_a_claim_never_deadlocks(
    db_url: str, conn: Conn, ordered: bool, sync: str
) -> None:
    """A claim locks its queues' limit rows by queue (hot_path.sql); a sync locks every row it
    changes, deletes or clears in that order too (migration 0047), so it waits behind the
    claim, which goes on to its next row. Two reviews found 0047's first forms deadlocking
    beside a claim: every row locked in scan order, then a row dropped after the rows changed.
    The control locks in the reverse order."""
    if not ordered:
        text = function_text(conn, CHANGE)
        assert text.count("ORDER BY l.queue\n") == 1
        conn.execute(text.replace("ORDER BY l.queue\n", "ORDER BY l.queue DESC\n"))
    store.queue_limit_sync(conn, ["a", "b"], [("a", 5), ("b", 5)])
    limits, queues = SYNCS[sync]
    held = Held(db_url)
    try:
        with held.holder.transaction():  # a claim, halfway through its rows: a locked
            held.holder.execute(
                "SELECT 1 FROM pgdrain.queue_limits WHERE queue = 'a' FOR UPDATE"
            ).fetchall()
            held.start(lambda c: store.queue_limit_sync(c, queues, limits))
            _wait_until(lambda: waits_on_a_lock(conn, held.other.info.backend_pid))
            try:  # its next row, then its commit lets the sync go on
                held.holder.execute(
                    "SELECT 1 FROM pgdrain.queue_limits WHERE queue = 'b' FOR UPDATE"
                ).fetchall()
            except psycopg.errors.DeadlockDetected as exc:
                held.errors.append(exc)  # the claim was the one ended
        assert held.thread is not None
        held.thread.join(30)
    finally:
        held.close()
    # The server ends one of the two (the one whose deadlock check runs first).
    deadlocked = [type(e) for e in held.errors]
    assert deadlocked == ([] if ordered else [psycopg.errors.DeadlockDetected]), held.errors
    if ordered:
        rows = conn.execute("SELECT queue, max_running FROM pgdrain.queue_limits ORDER BY 1")
        assert rows.fetchall() == sorted(limits)


def _drift_high(conn: Conn) -> None:
    """A count left too high (as a running job deleted by hand, or the trigger off in a
    restore, would leave it): the row says the queue is full, and nothing runs."""
    _sync(conn)
    conn.execute("UPDATE pgdrain.queue_limits SET running = max_running WHERE queue = %s", (QUEUE,))


@pytest.mark.parametrize("recount", [True, False], ids=["recount", "control-no-recount"])
def test_the_next_run_recounts_a_count_left_too_high_and_drains_the_queue(
    db_url: str, conn: Conn, recount: bool, caplog: pytest.LogCaptureFixture
) -> None:
    _drift_high(conn)
    _enqueue(conn, 3)
    registry = Registry()
    registry.job("noop")(lambda job: None)
    settings = Settings(queues=(QUEUE,), concurrency=2, reserve_seconds=0.5)
    with caplog.at_level(logging.WARNING, logger="pgdrain.runner.limits"):
        result = drain_with(
            Controls(recount_full_limits=recount), settings, Budget.seconds(30), registry, db_url
        )
    assert result.error is None
    if recount:
        assert result.done == 3
        assert _counts(conn) == (0, 0)
        [record] = [r for r in caplog.records if "drifted" in r.getMessage()]
        assert (record.queue, record.counted, record.running) == (QUEUE, LIMIT, 0)  # type: ignore[attr-defined]
    else:  # every run claims none of the three ready jobs
        assert (result.claimed, result.stop_reason) == (0, "empty")
        assert _counts(conn) == (0, LIMIT)


@pytest.mark.parametrize("recount", [True, False], ids=["recount", "control-no-recount"])
def test_a_run_whose_exit_check_finds_the_count_too_high_recounts_and_drains_again(
    db_url: str, conn: Conn, recount: bool
) -> None:
    """The count drifts while the run works (its start found it right): the exit check's round
    trip recounts, so the run claims the jobs instead of exiting with them ready and no
    wake-up."""
    _sync(conn)
    registry = Registry()
    registry.job("noop")(lambda job: None)
    settings = Settings(queues=(QUEUE,), concurrency=1, reserve_seconds=0.5)
    budget = Budget.seconds(30)
    drifted: list[bool] = []

    def drift_once() -> None:
        if not drifted:
            drifted.append(True)
            _enqueue(conn, 2)
            conn.execute("UPDATE pgdrain.queue_limits SET running = max_running")

    control = RunControl(
        events.Trigger("enqueue", (QUEUE,)),
        "run-1",
        budget,
        waker=Waker(settings, None),
        queue_limits=((QUEUE, LIMIT),),
        before_exit_check=drift_once,
        controls=Controls(recount_full_limits=recount),
    )
    _enqueue(conn, 1)
    result = drain_with(
        Controls(recount_full_limits=recount), settings, budget, registry, db_url, hooks=control
    )
    assert result.error is None
    if recount:
        assert (result.done, control.drained_again) == (3, 1)
        assert _counts(conn) == (0, 0)
    else:
        assert (result.done, control.drained_again) == (1, 0)
        assert _counts(conn) == (0, LIMIT)


def test_the_recount_calls_nothing_when_no_limit_holds_work_back(conn: Conn) -> None:
    """What every run sends with its first claim costs one probe of pgdrain.queue_limits in the
    common case: the recount function is not called."""
    _sync(conn)
    _enqueue(conn, 3)  # ready, but the limit is not full
    [plan] = conn.execute(
        "EXPLAIN (ANALYZE, FORMAT JSON) " + query("queue_limit_recount"), {"queues": [QUEUE]}
    ).fetchone()[0]  # type: ignore[index]
    scans = _nodes(plan["Plan"], "Function Scan")
    assert [n["Actual Loops"] for n in scans] == [0]


def _nodes(plan: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    found = [plan] if plan.get("Node Type") == kind else []
    for child in plan.get("Plans", []):
        found += _nodes(child, kind)
    return found


def test_the_depth_left_at_an_empty_exit_counts_only_what_a_full_limit_holds_back(
    conn: Conn,
) -> None:
    _sync(conn)
    _enqueue(conn, 3)

    def held() -> tuple[int, float]:
        row = conn.execute(query("queue_depth_held"), {"queues": [QUEUE, "other"]}).fetchone()
        assert row is not None
        return int(row[0]), float(row[1])

    assert held() == (0, 0.0)  # ready, but a claim may take them: not held back
    _claim(conn, 1)
    ready, age = held()
    assert ready == 2 and age > 0


def test_the_depth_left_at_an_empty_exit_counts_what_a_used_up_rate_holds_back(
    conn: Conn,
) -> None:
    """A red team's finding: a queue out of starts for its rate window held its ready jobs
    back, and the depth a run left said 0."""
    store.queue_limit_sync(conn, [QUEUE], [], [(QUEUE, 1, 3600)])
    _enqueue(conn, 3)

    def held() -> int:
        row = conn.execute(query("queue_depth_held"), {"queues": [QUEUE]}).fetchone()
        assert row is not None
        return int(row[0])

    assert held() == 0  # its window has a start left: a run may claim one
    _claim(conn, 3)  # the window's one start
    assert held() == 2


def test_the_depth_left_at_an_empty_exit_counts_a_paused_queues_ready_jobs(conn: Conn) -> None:
    """A queue paused and forgotten holds its backlog back as a full limit does: the depth a run
    leaves counts it (the alarms on QueueDepth then fire), and stops counting it on resume."""
    _enqueue(conn, 3)

    def held() -> int:
        row = conn.execute(query("queue_depth_held"), {"queues": None}).fetchone()
        assert row is not None
        return int(row[0])

    assert held() == 0  # no limit, not paused: a run may claim them
    pause_queue(conn, QUEUE)
    assert held() == 3
    resume_queue(conn, QUEUE)
    assert held() == 0


@pytest.mark.parametrize("held", [True, False], ids=["slot-held", "control-slot-freed"])
def test_a_job_cancelled_while_running_holds_its_slot_until_its_lease_ends(
    conn: Conn, held: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's finding: queue limited to 1, its job running, `pgdrain cancel` of it: the
    count fell to 0 at once and another run started a job of the queue while the cancelled
    one's code still ran (until its lease ends or its next heartbeat). Now the slot comes back
    when that lease ends: the recount of a limit that says full counts the lease until then."""
    if not held:  # the cancel as it was: its transaction unmarked
        monkeypatch.setattr(operator_commands, "job_cancel_mark", lambda _conn, _on: None)
    _sync(conn)
    _enqueue(conn, 2)
    [first] = _claim(conn, 1)
    store.job_cancel(conn, [first.id])
    beside = _claim(conn, 1)
    if not held:
        assert len(beside) == 1  # two jobs of a queue limited to 1 may now run at once
        return
    assert beside == [] and _counts(conn) == (0, 1)
    recount = query("queue_limit_recount")
    assert conn.execute(recount, {"queues": [QUEUE]}).fetchall() == []  # its lease still runs
    conn.execute(
        "UPDATE pgdrain.finished_jobs SET cancelled_lease_expires_at = now() - interval '1 s'"
        " WHERE id = %s",
        (first.id,),
    )
    assert conn.execute(recount, {"queues": [QUEUE]}).fetchall() == [(QUEUE, 1, 0)]
    assert len(_claim(conn, 1)) == 1


@pytest.mark.parametrize("woken", [True, False], ids=["woken-at-the-lease", "control-not-woken"])
def test_a_run_wakes_when_a_cancelled_jobs_slot_comes_back(
    conn: Conn, woken: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review's finding: the slot a job cancelled while running holds came back only at a
    run's recount, and the exit check woke no run for the lease's end: a queue limited to 1
    with a job ready waited for the next kick or the hourly schedule. It wakes then now."""
    if not woken:  # the exit check as before: leases of running jobs only
        real = query("run_exit")
        start = real.index("(SELECT min(f.cancelled_lease_expires_at)")
        end = real.index(") AS due_at")
        before = real[:start].rstrip().rstrip(",") + "\n"
        monkeypatch.setattr(
            control_plane,
            "query",
            lambda name: before + real[end:] if name == "run_exit" else query(name),
        )
    _sync(conn)
    _enqueue(conn, 2)
    [first] = _claim(conn, 1)
    store.job_cancel(conn, [first.id])
    lease_end = conn.execute(
        "SELECT cancelled_lease_expires_at FROM pgdrain.finished_jobs WHERE id = %s", (first.id,)
    ).fetchone()
    assert lease_end is not None
    check = store.run_exit(conn, "a-run", [QUEUE])
    assert check.ready is False  # the slot is held
    assert (check.due_at == lease_end[0]) is woken
