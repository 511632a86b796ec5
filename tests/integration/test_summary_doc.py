"""docs/lambda.md's sample summary against a real one: the function's handler, given the rate
schedule's event, drains a ready job, makes the wake-up for a delayed one, runs retention and
moves the safety net (moto's `scheduler`), and its summary has every key the sample has, at
every level, and no other. A field added to the summary without the doc, or a doc naming a
field the summary lacks, fails here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from helpers.aws import REGION, aws_environment, handler_env, invoke_handler, mocked_aws
from helpers.docs import DOCS, fences
from pgdrain import enqueue
from pgdrain.aws import run as lambda_run
from pgdrain.aws.safety_net import forget_last_set
from pgdrain.aws.wake import reset_clients

Conn = psycopg.Connection[Any]
GROUP = "pgdrain-test-summary"
ROLE_ARN = "arn:aws:iam::123456789012:role/pgdrain-test-wake"
TICK = {
    "version": "0",
    "id": "7c2f4a1e-0000-4000-8000-000000000042",
    "detail-type": "Scheduled Event",
    "source": "aws.scheduler",
    "detail": "{}",
}
# Objects whose own keys are part of the summary's shape (`unserved` maps queues to counts).
NESTED = ("result", "retention")


def documented_summary() -> dict[str, Any]:
    """The JSON block that follows "A run returns its summary" in docs/lambda.md."""
    text = (DOCS / "lambda.md").read_text()
    after = text.index("A run returns its summary")
    block = next(f for f in fences(text) if f.start > after)
    assert block.info == "json", block.info
    sample = json.loads(block.body)
    assert isinstance(sample, dict)
    return sample


def shape(summary: dict[str, Any]) -> dict[str, Any]:
    return {
        key: sorted(value) if key in NESTED and isinstance(value, dict) else None
        for key, value in summary.items()
    }


def differences(documented: dict[str, Any], real: dict[str, Any]) -> list[str]:
    said, was = shape(documented), shape(real)
    problems = [f"the summary has no {k!r}" for k in sorted(said.keys() - was.keys())]
    problems += [f"{k!r} is not in the doc" for k in sorted(was.keys() - said.keys())]
    for key in NESTED:
        if key in said and key in was and said[key] != was[key]:
            problems.append(f"{key}: doc {said[key]}, summary {was[key]}")
    return problems


@pytest.fixture
def real_summary(
    db_url: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    import boto3

    aws_environment(monkeypatch)
    monkeypatch.setattr(lambda_run, "_retention_ran_at", None)
    handler_env(
        monkeypatch,
        DATABASE_URL=db_url,
        PGDRAIN_SCHEDULE_GROUP=GROUP,
        PGDRAIN_SCHEDULER_ROLE_ARN=ROLE_ARN,
        PGDRAIN_SCHEDULE_RATE="1 hour",
    )
    forget_last_set()
    with mocked_aws():
        reset_clients()
        boto3.client("scheduler", region_name=REGION).create_schedule_group(Name=GROUP)
        with conn.transaction():
            enqueue(conn, "noop", {})
            enqueue(conn, "noop", {}, delay=600)
        yield invoke_handler(TICK)
        reset_clients()
    forget_last_set()


def test_the_documented_summary_has_the_real_ones_keys(real_summary: dict[str, Any]) -> None:
    # Every optional part is there: the wake-up, retention and the safety net's move.
    assert real_summary["wake"] == "created", real_summary
    assert real_summary["retention"] is not None
    assert real_summary["safety_net"] == "created"
    assert differences(documented_summary(), real_summary) == []


def test_control_a_sample_missing_a_key_or_naming_another_fails(
    real_summary: dict[str, Any],
) -> None:
    sample = documented_summary()
    del sample["lingered"]
    sample["result"]["attempts"] = 0
    assert differences(sample, real_summary) == [
        "'lingered' is not in the doc",
        f"result: doc {sorted(sample['result'])}, summary {sorted(real_summary['result'])}",
    ]
