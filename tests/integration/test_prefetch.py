"""Claim-ahead against a real database: with short jobs a run claims the next batch while the
current one runs; with long jobs (and with claim-ahead off, the control) it holds no more jobs
than it has worker slots. Held = claimed less what was written back, counted as the run
reports each change (its observer)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from helpers import ledger_jobs
from pgdrain import Budget, DrainResult, Settings, enqueue
from pgdrain.controls import Controls
from pgdrain.runner.drain import drain_with

Conn = psycopg.Connection[Any]

WRITTEN_BACK = ("done", "retried", "failed", "released", "lease_lost")


def drain_counting_held(
    url: str, *, claim_ahead: bool, send_ahead: bool = True
) -> tuple[DrainResult, int]:
    held, most = 0, 0

    def observe(counter: str, n: int) -> None:
        nonlocal held, most
        if counter == "claimed":
            held += n
            most = max(most, held)
        elif counter in WRITTEN_BACK:
            held -= n

    result = drain_with(
        Controls(prefetch=claim_ahead, pipelining=send_ahead),
        Settings(concurrency=4, batch_size=4),
        Budget.seconds(60),
        ledger_jobs.jobs,
        url,
        observer=observe,
    )
    return result, most


@pytest.mark.parametrize(
    ("kind", "payload", "claim_ahead", "send_ahead", "most_held"),
    [
        # Short jobs: a batch claimed while the last one runs, and one more on the wire while
        # the reply before it is read (pipeline.py).
        ("noop", {}, True, True, 12),
        ("noop", {}, True, False, 8),  # each reply read before the next claim goes out
        ("noop", {}, False, True, 4),  # the control: claims alternate with the jobs
        ("slow", {"seconds": 0.2}, True, True, 4),  # long jobs: nothing to gain, none ahead
    ],
)
def test_a_run_claims_ahead_only_while_jobs_are_shorter_than_its_round_trips(
    ledger_url: str,
    conn: Conn,
    kind: str,
    payload: dict[str, Any],
    claim_ahead: bool,
    send_ahead: bool,
    most_held: int,
) -> None:
    jobs = 40 if kind == "noop" else 12
    for _ in range(jobs):
        enqueue(conn, kind, payload)
    result, most = drain_counting_held(ledger_url, claim_ahead=claim_ahead, send_ahead=send_ahead)
    assert (result.done, result.stop_reason) == (jobs, "empty")
    assert most == most_held
    statuses = conn.execute("SELECT status, attempts, count(*) FROM pgdrain.jobs GROUP BY 1, 2")
    assert statuses.fetchall() == [("done", 1, jobs)]
