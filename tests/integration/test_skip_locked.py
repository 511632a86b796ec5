"""The published SKIP LOCKED experiment, run with pgdrain's own claim.

The article put 10,000 queued jobs in a table and ran 8 pgbench clients x 1,250 transactions of
the naive claim (`UPDATE ... WHERE id = (SELECT id ... LIMIT 1)`), each claim its own
transaction: about 2,100 jobs ended done, and some job was taken by all 8 workers.

Here 8 processes (not threads: each has its own interpreter and its own connection, as drains
do) take the same 10,000 jobs. With pgdrain's claim (store.job_complete_and_claim, through
helpers.fixtures.claim_batch) and store.job_complete_many every job is done exactly once. The
control changes one variable, the claim statement: the same 8 processes, the same 10,000 jobs,
the same start line, each running exactly 1,250 naive claims in autocommit, as pgbench did,
and jobs are taken more than once.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import queue as stdlib_queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from helpers.fixtures import claim_batch
from pgdrain.db import store

WORKERS = 8
JOBS = 10_000
CLAIMS_PER_WORKER = JOBS // WORKERS  # 1,250, as in the article's pgbench run
START_TIMEOUT_SECONDS = 120.0  # spawning 8 interpreters on a loaded 2-core machine
RUN_TIMEOUT_SECONDS = 300.0

# Test-only: the naive claim of the article, ordered like pgdrain's claim so that the lock is
# the one variable that differs. The subquery runs once and hands its id to the UPDATE; a
# worker that waited on the row lock re-checks only `id = <that id>` once the holder commits,
# which still matches, so it takes the job again. On the table itself: the view pgdrain.jobs
# writes a row only as its statement read it (migration 0018), which would hide the race.
NAIVE_CLAIM = """
UPDATE pgdrain.active_jobs
SET status = 'done', attempts = attempts + 1, finished_at = now(), updated_at = now()
WHERE id = (
    SELECT id FROM pgdrain.active_jobs
    WHERE status = 'queued' AND queue = 'default' AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT 1
)
RETURNING id, attempts
"""


@dataclass(frozen=True)
class Figures:
    done: int
    queued: int
    max_attempts: int
    min_done_attempts: int
    claims_returned: int  # rows handed to workers, counted by the workers


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, application_name="skip-locked-test")


def _pgdrain_worker(url: str, start: multiprocessing.synchronize.Barrier, name: str) -> int:
    """Claim one job at a time and complete it, until a claim finds nothing."""
    taken = 0
    with _connect(url) as conn:
        start.wait(START_TIMEOUT_SECONDS)
        while True:
            claimed = claim_batch(conn, ["default"], 1, name, 300.0, None)
            if not claimed:
                return taken
            result = store.job_complete_many(
                conn, [store.Held(c.id, c.attempt_token) for c in claimed]
            )
            assert result.applied == {c.id for c in claimed}, f"{name} lost {result.lost}"
            taken += len(claimed)


def _naive_worker(url: str, start: multiprocessing.synchronize.Barrier, name: str) -> int:
    """Exactly CLAIMS_PER_WORKER naive claims, each its own (autocommit) transaction."""
    taken = 0
    with _connect(url) as conn:
        start.wait(START_TIMEOUT_SECONDS)
        for _ in range(CLAIMS_PER_WORKER):
            taken += len(conn.execute(NAIVE_CLAIM).fetchall())
    return taken


def _child(
    target: Callable[[str, multiprocessing.synchronize.Barrier, str], int],
    url: str,
    start: multiprocessing.synchronize.Barrier,
    name: str,
    results: multiprocessing.Queue[tuple[str, int]],
) -> None:
    results.put((name, target(url, start, name)))


def _run(url: str, target: Callable[[str, multiprocessing.synchronize.Barrier, str], int]) -> int:
    """Start WORKERS processes; each connects, then all leave the barrier together.
    Returns the number of rows the claims handed out."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(WORKERS)
    results: multiprocessing.Queue[tuple[str, int]] = ctx.Queue()
    processes = [
        ctx.Process(target=_child, args=(target, url, start, f"worker-{i}", results))
        for i in range(WORKERS)
    ]
    for process in processes:
        process.start()
    taken: dict[str, int] = {}
    try:
        for _ in processes:
            name, count = results.get(timeout=START_TIMEOUT_SECONDS + RUN_TIMEOUT_SECONDS)
            taken[name] = count
    except stdlib_queue.Empty:
        codes = [p.exitcode for p in processes]
        raise AssertionError(f"workers did not all report (exit codes {codes})") from None
    finally:
        for process in processes:
            process.join(timeout=RUN_TIMEOUT_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()
    assert [p.exitcode for p in processes] == [0] * WORKERS
    return sum(taken.values())


def _seed(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO pgdrain.jobs (kind, payload, run_at)"
        " SELECT 'send_email', jsonb_build_object('email_id', g), now() - interval '1 minute'"
        " FROM generate_series(1, %s) AS g",
        (JOBS,),
    )
    conn.execute("ANALYZE pgdrain.active_jobs")


def _figures(conn: psycopg.Connection[Any], claims_returned: int) -> Figures:
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'done'),"
        "       count(*) FILTER (WHERE status = 'queued'),"
        "       coalesce(max(attempts), 0),"
        "       coalesce(min(attempts) FILTER (WHERE status = 'done'), 0)"
        " FROM pgdrain.jobs"
    ).fetchone()
    assert row is not None
    return Figures(row[0], row[1], row[2], row[3], claims_returned)


def _report(label: str, figures: Figures) -> None:
    print(
        f"\n{label}: {figures.done} of {JOBS} done, {figures.queued} still queued, "
        f"max attempts {figures.max_attempts}, {figures.claims_returned} rows claimed "
        f"by {WORKERS} processes"
    )


def test_eight_processes_claim_each_job_exactly_once(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    _seed(conn)
    claimed = _run(db_url, _pgdrain_worker)
    figures = _figures(conn, claimed)
    _report("pgdrain claim (FOR UPDATE SKIP LOCKED)", figures)
    assert figures.done == JOBS
    assert figures.queued == 0
    assert (figures.min_done_attempts, figures.max_attempts) == (1, 1)
    assert figures.claims_returned == JOBS  # no job was handed to two workers


def test_control_the_naive_claim_hands_jobs_out_twice(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    _seed(conn)
    claimed = _run(db_url, _naive_worker)
    figures = _figures(conn, claimed)
    _report("control, naive claim (WHERE id = (SELECT ... LIMIT 1))", figures)
    assert figures.max_attempts > 1 or figures.done < JOBS
    # Every claim that found a row counted one; the rows it found were not all distinct.
    assert figures.claims_returned > figures.done
