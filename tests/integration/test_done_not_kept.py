"""Done jobs kept 0 days (PGDRAIN_RETAIN_DONE=0, Settings.keeps_done): a completion deletes the
job instead of moving it to finished_jobs, save a job whose finish releases another; and the
recovery of a lost reply still tells a completion that committed from one that did not, with
no row left to say it. Each safety test stands beside its control."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers.fixtures import claim_batch, job_row, serve_instead, without_line
from helpers.lossy_proxy import LossyProxy, losing_the_second_claims_reply
from pgdrain import Budget, DrainResult, Job, Registry, Settings, drain, enqueue, workflow
from pgdrain.controls import ALL_ON
from pgdrain.db import store
from pgdrain.db.sql import query
from pgdrain.db.store import hot_path
from pgdrain.runner.claim_statement import Result, after_a_lost_reply
from pgdrain.runner.drain import drain_with

Conn = psycopg.Connection[Any]
WORKER = "w"

jobs = Registry()
sums: list[int] = []  # what each sum_inputs returned (its own row is not kept)


@jobs.job("step")
def step(job: Job) -> dict[str, Any]:
    return {"n": job.payload.get("n")}


@jobs.job("sum_inputs")
def sum_inputs(job: Job) -> int:
    with psycopg.connect(job.payload["url"]) as conn:
        outputs = job.dependency_outputs(conn)
    sums.append(sum(o["n"] for o in outputs.values()))
    return sums[-1]


def run(url: str, **settings: Any) -> DrainResult:
    return drain(Settings(**settings), Budget.seconds(30), jobs, url)


def _count(conn: Conn, table: str) -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*)::int FROM pgdrain.{}").format(sql.Identifier(table))
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("days", [0.0, 7.0], ids=["not-kept", "kept"])
def test_a_done_job_kept_0_days_leaves_no_row(db_url: str, conn: Conn, days: float) -> None:
    for n in range(25):
        enqueue(conn, "step", {"n": n})
    result = run(db_url, retain_done_days=days, batch_size=10)
    assert (result.claimed, result.done, result.lease_lost) == (25, 25, 0)
    assert _count(conn, "active_jobs") == 0
    assert _count(conn, "finished_jobs") == (0 if days == 0 else 25)


def test_a_failed_job_is_kept_when_done_jobs_are_not(db_url: str, conn: Conn) -> None:
    failed = enqueue(conn, "no_such_kind", max_attempts=1)
    done = enqueue(conn, "step", {"n": 1})
    run(db_url, retain_done_days=0)
    assert job_row(conn, failed)["status"] == "failed"
    assert conn.execute("SELECT 1 FROM pgdrain.jobs WHERE id = %s", (done,)).fetchone() is None


# -- a finish that releases another is still moved ------------------------------------------------

# The condition without its exceptions: every done job deleted.
EVERY_DONE_DELETED = "WHERE %(keep_done)s OR j.sequence IS NOT NULL OR j.has_dependents"


@pytest.mark.parametrize("moved", [True, False], ids=["moved", "control-deleted"])
def test_a_job_that_releases_others_is_moved_and_they_run(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, moved: bool
) -> None:
    if not moved:
        texts = {
            name: query(name).replace(EVERY_DONE_DELETED, "WHERE %(keep_done)s")
            for name in ("job_complete_and_claim", "job_complete_many")
        }
        assert all(EVERY_DONE_DELETED not in text for text in texts.values())
        serve_instead(monkeypatch, hot_path, texts)
    with workflow(conn) as wf:
        first = wf.enqueue("step", {"n": 1}, sequence="k")
        second = wf.enqueue("step", {"n": 2}, sequence="k")
        a = wf.enqueue("step", {"n": 2})
        b = wf.enqueue("step", {"n": 5})
        total = wf.enqueue("sum_inputs", {"url": db_url}, after=[a, b])

    sums.clear()
    result = run(db_url, retain_done_days=0, concurrency=1)

    if moved:
        assert result.done == 5
        assert sums == [7]  # read from its dependencies' moved rows
        # Moved: the jobs whose finish released another; the last ones are not kept.
        kept = {r[0] for r in conn.execute("SELECT id FROM pgdrain.finished_jobs")}
        assert kept == {first, second, a, b}
    else:
        # Deleted with nothing to say they finished, the next job of the sequence and the
        # dependent wait for good.
        assert result.done == 3
        assert job_row(conn, second)["status"] == "waiting"
        assert job_row(conn, total)["status"] == "waiting"


# -- a lost reply, with no row to tell it ------------------------------------------------------


def _finished_attempts(conn: Conn, n: int) -> list[store.Held]:
    for _ in range(n):
        enqueue(conn, "step")
    return [c.held for c in claim_batch(conn, ["default"], n, WORKER, 30.0, None)]


def _complete(held: list[store.Held], made: list[store.Fenced]) -> Any:
    @store.one_statement
    def complete(conn: store.Connection) -> Result:
        made.append(store.job_complete_many(conn, held, keep_done=False))
        return made[-1], []

    return complete


@pytest.mark.parametrize("told", [True, False], ids=["recovered", "control-as-if-kept"])
def test_a_completion_that_committed_before_its_reply_was_lost_counts_done(
    conn: Conn, told: bool
) -> None:
    """The run's last flush deleted its jobs and committed; its reply never came. Recovery
    finds none of its attempts still holding a job: the completions are counted done, not sent
    again. The control recovers as if done jobs were kept: no row says they were completed, so
    the flush is sent again, its jobs found gone and counted as leases lost."""
    held = _finished_attempts(conn, 3)
    store.job_complete_many(conn, held, keep_done=False)  # committed; the reply was lost
    made_again: list[store.Fenced] = []

    done, _ = after_a_lost_reply(_complete(held, made_again), None, held, keep_done=not told)(conn)

    if told:
        assert made_again == []
        assert done.applied_attempts == frozenset(held) and not done.lost_attempts
    else:
        assert len(made_again) == 1
        assert done.lost_attempts == frozenset(held)
    assert _count(conn, "jobs") == 0


# The guard that tells a statement that did not commit: an attempt still holds its job.
STILL_HELD = "still"


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "control-unguarded"])
def test_a_completion_that_never_committed_is_made_though_another_job_is_gone(
    conn: Conn, monkeypatch: pytest.MonkeyPatch, guarded: bool
) -> None:
    """Two finished attempts; the flush's reply is lost before it ran. Meanwhile the second
    job's lease had been lost, and another attempt completed it (gone). Recovery sees the first
    attempt still holding its job, so the flush did not commit: it is made now, the first job
    done, the second counted lost. The control, without that guard, takes the gone job for the
    flush's own work and does not make it: the first job stays running, to be reclaimed and run
    a second time when its lease ends."""
    if not guarded:
        unguarded = without_line(query("job_claim_recover"), STILL_HELD)
        serve_instead(monkeypatch, hot_path, {"job_claim_recover": unguarded})
    first, second = _finished_attempts(conn, 2)
    conn.execute("DELETE FROM pgdrain.active_jobs WHERE id = %s", (second.id,))  # done elsewhere
    made_again: list[store.Fenced] = []

    done, _ = after_a_lost_reply(
        _complete([first, second], made_again), None, [first, second], keep_done=False
    )(conn)

    if guarded:
        assert len(made_again) == 1
        assert done.applied_attempts == frozenset([first])
        assert done.lost_attempts == frozenset([second])
        assert _count(conn, "jobs") == 0
    else:
        assert made_again == []
        assert job_row(conn, first.id)["status"] == "running"


def test_a_drain_whose_claim_reply_was_lost_counts_its_deleted_completions_done(
    conn: Conn, proxy: LossyProxy
) -> None:
    """Through a proxy that loses the second claim's reply after its commit: that claim deleted
    the first job and claimed the second. The run takes both up: two done, none lost."""
    enqueue(conn, "step")
    enqueue(conn, "step")
    result = drain_with(
        ALL_ON,
        Settings(concurrency=1, batch_size=1, retain_done_days=0),
        Budget.seconds(30),
        jobs,
        proxy.url,
        observer=losing_the_second_claims_reply(proxy),
    )
    assert proxy.dropped.is_set()
    assert (result.claimed, result.done, result.lease_lost) == (2, 2, 0)
    assert _count(conn, "jobs") == 0
