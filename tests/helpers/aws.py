"""What the Lambda tests share: moto's AWS (Lambda without Docker, Secrets Manager), a spy on
Lambda Invoke calls, a fake Lambda context, and readers for the function's output."""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from pgdrain.aws import context as lambda_context
from pgdrain.settings import ENV_VARIABLES

REGION = "us-east-1"
ACCOUNT = "123456789012"
FUNCTION_NAME = "pgdrain-test-drain"
FUNCTION_ARN = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{FUNCTION_NAME}"

METRIC_NAMES = (
    "JobsClaimed",
    "JobsSucceeded",
    "JobsRetried",
    "JobsFailed",
    "JobsCancelled",
    "LeasesLost",
    "Reclaimed",
    "QueueDepth",
    "OldestReadyAgeSeconds",
    "JobsDeleted",  # scheduled runs only
)


def aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a region, so nothing can reach a real account; Powertools' names."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SECURITY_TOKEN": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_REGION": REGION,
        "POWERTOOLS_SERVICE_NAME": "pgdrain",
        "POWERTOOLS_METRICS_NAMESPACE": "pgdrain",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SAM_LOCAL", "POWERTOOLS_DEV", "POWERTOOLS_METRICS_DISABLED"):
        monkeypatch.delenv(name, raising=False)


@contextmanager
def mocked_aws() -> Iterator[None]:
    """moto, with Lambda invocations accepted and not run; pgdrain's and Powertools' cached
    clients forgotten before and after, so none outlives the mock."""
    from aws_lambda_powertools.utilities import parameters
    from moto import mock_aws

    from pgdrain.aws import secrets
    from pgdrain.aws.lambda_api import reset_clients

    reset_clients()
    parameters.clear_caches()
    secrets.clear_cache()
    try:
        with mock_aws(config={"lambda": {"use_docker": False}}):
            yield
    finally:
        reset_clients()
        parameters.clear_caches()
        secrets.clear_cache()


def create_function(name: str = FUNCTION_NAME) -> str:
    """A function in moto's Lambda (its code never runs); returns its ARN."""
    import boto3

    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(
        RoleName=f"{name}-role",
        AssumeRolePolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Principal": {"Service": "lambda.amazonaws.com"},
                        "Action": "sts:AssumeRole",
                    }
                ],
            }
        ),
    )["Role"]["Arn"]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("app.py", "def lambda_handler(event, context):\n    return {}\n")
    function = boto3.client("lambda", region_name=REGION).create_function(
        FunctionName=name,
        Runtime="python3.12",
        Role=role,
        Handler="app.lambda_handler",
        Code={"ZipFile": archive.getvalue()},
    )
    return str(function["FunctionArn"])


@dataclass
class InvokeSpy:
    """Records the parameters of every Lambda Invoke made through a client."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, client: Any) -> Any:
        client.meta.events.register("provide-client-params.lambda.Invoke", self._record)
        return client

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        with self._lock:
            self.calls.append(dict(params))

    def events(self) -> list[Any]:
        with self._lock:
            return [json.loads(call["Payload"]) for call in self.calls]


class FakeContext(lambda_context.FakeContext):
    """pgdrain's fake Lambda context with the tests' defaults: a minute left, moto's function."""

    def __init__(
        self, remaining_s: float = 60.0, arn: str = FUNCTION_ARN, request_id: str | None = None
    ) -> None:
        super().__init__(remaining_s, arn, log_stream="test", request_id=request_id)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among printed lines (the rest is ignored)."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def emf_records(text: str) -> list[dict[str, Any]]:
    """The CloudWatch EMF records among printed lines."""
    return [r for r in json_lines(text) if "_aws" in r]


def metric_totals(records: list[dict[str, Any]]) -> dict[str, float]:
    """Each metric's values summed over every EMF record (a gauge appears once per run)."""
    totals: dict[str, float] = {}
    for record in records:
        for directive in record["_aws"]["CloudWatchMetrics"]:
            assert directive["Namespace"] == "pgdrain"
            for metric in directive["Metrics"]:
                values = record[metric["Name"]]
                values = values if isinstance(values, list) else [values]
                totals[metric["Name"]] = totals.get(metric["Name"], 0.0) + sum(values)
    return totals


def log_records(text: str) -> list[dict[str, Any]]:
    """The structured (Powertools) log lines among printed lines."""
    return [r for r in json_lines(text) if "level" in r and "message" in r]


def handler_env(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Only these of the variables pgdrain reads are set (none left from the machine's)."""
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def invoke_handler(
    event: Any, remaining_s: float = 30.0, request_id: str | None = None
) -> dict[str, Any]:
    """One invocation of the function's handler, cold-started from os.environ (`request_id`:
    Lambda's, as a copy of an event delivered again may carry the first one's)."""
    import app
    from pgdrain.aws import run as lambda_run

    runtime = lambda_run.cold_start(os.environ)
    context = FakeContext(remaining_s, request_id=request_id)
    result: dict[str, Any] = lambda_run.handle(
        event, context, runtime, logger=app.logger, metrics=app.metrics
    )
    return result
