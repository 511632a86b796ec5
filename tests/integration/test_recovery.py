"""Recovery after a run dies at its deadline: a job that outlives the run's budget is left
running, its lease ending at the run's deadline (leases are capped there). The run either is
killed by the timeout or returns at its final margin with the job abandoned, and then fails the
invocation on purpose: for Lambda both are function errors, and template.yaml retries a failed
async event once (MaximumRetryAttempts: 1), about a minute later. That retry is the same event
run again: it reclaims the job and runs it. The control is the same timeline without the retry
(MaximumRetryAttempts: 0, as before): nothing runs the job until the next schedule tick, an
hour later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from helpers.aws import FakeContext, aws_environment, mocked_aws
from helpers.fixtures import HANDLER_DIR, TESTS_DIR, job_row, wait_for
from pgdrain import enqueue
from pgdrain.aws import run as lambda_run
from pgdrain.settings import ENV_VARIABLES

Conn = psycopg.Connection[Any]
KILLED_BUDGET_S = 3.0
JOBS_MODULE = "helpers.ledger_jobs"  # "slow": works on, deaf to its lease and the deadline
SCHEDULE_EVENT = {
    "version": "0",
    "id": "7bf73129-1428-4cd3-a780-95db273d1602",
    "detail-type": "Scheduled Event",
    "source": "aws.scheduler",
    "account": "123456789012",
    "time": "2026-12-01T04:00:00Z",
    "region": "us-east-1",
    "resources": ["arn:aws:scheduler:us-east-1:123456789012:schedule/default/pgdrain"],
    "detail": "{}",
}


def _killed_run(db_url: str, event: dict[str, Any]) -> tuple[int, str]:
    """The handler in its own process, killed at its deadline; its exit code and stderr."""
    budget = str(KILLED_BUDGET_S)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ENV_VARIABLES},
        "PYTHONPATH": f"{TESTS_DIR}{os.pathsep}{HANDLER_DIR}",
        "DATABASE_URL": db_url,
        "PGDRAIN_JOBS": JOBS_MODULE,
        "PGDRAIN_RESERVE_SECONDS": "1",
        "AWS_SAM_LOCAL": "true",  # no AWS calls from the process that dies
        "POWERTOOLS_METRICS_NAMESPACE": "pgdrain",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    process = subprocess.run(
        [sys.executable, "-m", "helpers.handler_process", json.dumps(event), "--budget", budget],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return process.returncode, process.stderr


@pytest.mark.parametrize("retried", [True, False], ids=["retried-once", "control-no-retry"])
def test_a_run_killed_at_its_timeout_is_followed_by_a_run_that_reclaims_its_job(
    ledger_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch, retried: bool
) -> None:
    db_url = ledger_url
    with conn.transaction():
        # The first attempt outlives the run's timeout; the retry's attempt is quick.
        job_id = enqueue(conn, "slow", {"seconds": 60, "slow_attempts": [1]})

    code, err = _killed_run(db_url, SCHEDULE_EVENT)
    # It returned at its final margin and failed the invocation (else the timeout kills it).
    assert code == 1 and "JobsAbandoned" in err, err
    killed = job_row(conn, job_id)
    assert (killed["status"], killed["attempts"]) == ("running", 1)
    # Its lease ends at the dead run's deadline: reclaimable from then on.
    wait_for(
        lambda: (
            conn.execute(
                "SELECT lease_expires_at < now() FROM pgdrain.jobs WHERE id = %s", (job_id,)
            ).fetchone()
            == (True,)
        ),
        what="the dead run's lease to end",
    )

    if retried:  # Lambda runs the same event again (MaximumRetryAttempts: 1)
        aws_environment(monkeypatch)
        for name in ENV_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("DATABASE_URL", db_url)
        monkeypatch.setenv("PGDRAIN_JOBS", JOBS_MODULE)
        import app

        with mocked_aws():
            runtime = lambda_run.cold_start(os.environ)
            result = lambda_run.handle(
                SCHEDULE_EVENT, FakeContext(20.0), runtime, logger=app.logger, metrics=app.metrics
            )
        assert result["ok"] is True, result
        assert (result["result"]["reclaimed"], result["result"]["done"]) == (1, 1)

    after = job_row(conn, job_id)
    if retried:
        assert (after["status"], after["attempts"], after["reclaim_count"]) == ("done", 2, 1)
    else:  # nothing runs it: the job waits, its lease expired, for the next schedule tick
        assert (after["status"], after["reclaim_count"]) == ("running", 0)
