"""Does the end of a run fit its reserve? `python -m bench.end_of_run [--runs N]`

Runs the Lambda handler (pgdrain.aws.run.handle, with Powertools and moto's Lambda for the
continuation) against DATABASE_URL, in runs that use their whole budget: jobs that run past
the deadline (they stop when lease_lost() turns True) and more jobs ready, so every run ends
the hard way: final margin, final flush, queue_has_ready, metrics, continuation. For each run
it prints how much of the budget was left when the handler returned (the slack before a
Lambda timeout would have killed it) and how long the end took, from the moment the run gave
up on its jobs. Not part of `make bench`: a measurement for docs/reliability.md."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import statistics
import time
import zipfile

import psycopg

from pgdrain import Job, Registry, Settings, enqueue
from pgdrain.aws.context import FakeContext
from pgdrain.db.migrate import migrate

REGION = "us-east-1"
FUNCTION = "pgdrain-end-of-run"


def _function_arn() -> str:
    import boto3

    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(
        RoleName=f"{FUNCTION}-role",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )["Role"]["Arn"]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("app.py", "def lambda_handler(event, context):\n    return {}\n")
    created = boto3.client("lambda", region_name=REGION).create_function(
        FunctionName=FUNCTION,
        Runtime="python3.12",
        Role=role,
        Handler="app.lambda_handler",
        Code={"ZipFile": archive.getvalue()},
    )
    return str(created["FunctionArn"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--budget", type=float, default=4.0)
    parser.add_argument("--reserve", type=float, default=3.0)
    args = parser.parse_args()
    url = os.environ["DATABASE_URL"]
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "POWERTOOLS_SERVICE_NAME": "pgdrain",
        "POWERTOOLS_METRICS_NAMESPACE": "pgdrain",
    }.items():
        os.environ[name] = value
    from aws_lambda_powertools import Logger, Metrics
    from moto import mock_aws

    from pgdrain.aws import run

    registry = Registry()

    @registry.job("long")
    def long(job: Job) -> None:
        while not job.lease_lost():  # runs past the deadline; stops when the run gives up
            time.sleep(0.01)

    gave_up: list[float] = []

    class Marker(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "deadline reached with jobs still running" in record.getMessage():
                gave_up.append(time.monotonic())

    logging.getLogger("pgdrain").addHandler(Marker())
    settings = Settings(database_url=url, reserve_seconds=args.reserve, concurrency=2, batch_size=2)
    runtime = run.ColdStart(settings=settings, registry=registry)
    logger = Logger(service="pgdrain", stream=io.StringIO())
    metrics = Metrics(namespace="pgdrain")
    slack: list[float] = []
    tail: list[float] = []
    with psycopg.connect(url, autocommit=True) as conn, mock_aws():
        migrate(conn)
        arn = _function_arn()
        for _ in range(args.runs):
            conn.execute("DELETE FROM pgdrain.active_jobs")
            for _ in range(6):
                enqueue(conn, "long")
            context = FakeContext(args.budget, arn, log_stream="bench")
            gave_up.clear()
            summary = run.handle(
                {"source": "aws.events", "detail-type": "Scheduled Event"},
                context,
                runtime,
                logger=logger,
                metrics=metrics,
            )
            ended = time.monotonic()
            assert summary.get("continued"), summary
            slack.append(context.get_remaining_time_in_millis() / 1000)
            tail.append(ended - gave_up[-1] if gave_up else float("nan"))
    print(f"runs: {args.runs}, budget {args.budget} s, reserve {args.reserve} s")
    print(
        "end of run (gave up on jobs -> handler returned):"
        f" p50 {statistics.median(tail) * 1000:.1f} ms, max {max(tail) * 1000:.1f} ms"
    )
    print(
        f"budget left at return (before a timeout): min {min(slack) * 1000:.0f} ms,"
        f" p50 {statistics.median(slack) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
