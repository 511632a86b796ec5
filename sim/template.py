"""What the simulator takes from template.yaml: the function's environment, timeout, retry
policy, reserved concurrency and schedule rate, all read from the template as it is at HEAD, so a
new setting or default in the template is simulated without changing the simulator.

Durations are scaled here: every PGDRAIN_* variable whose name ends in _SECONDS (and
PGDRAIN_CONNECT_TIMEOUT, and PGDRAIN_SCHEDULE_RATE, written as ScheduleRate is) is divided by
the factor before the function sees it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgdrain.aws.local_invoke import (
    LOCAL_ACCOUNT,
    NO_VALUE,
    FunctionSpec,
    Resolver,
    Unresolved,
    load_template,
    read_function,
)
from pgdrain.settings import parse_duration

REGION = "us-east-1"
# A new AWS account's concurrent-execution limit, until it asks for more (docs/lambda.md).
DEFAULT_ACCOUNT_CONCURRENCY = 10
# Lambda's defaults when the template says nothing: two retries, events kept six hours.
LAMBDA_DEFAULT_RETRIES = 2
LAMBDA_DEFAULT_EVENT_AGE_SECONDS = 21600
# Variables that hold durations in seconds but whose names do not end in _SECONDS.
EXTRA_DURATION_VARIABLES = ("PGDRAIN_CONNECT_TIMEOUT",)
# A duration with its unit ("1 hour"): scaled to "N seconds".
RATE_VARIABLE = "PGDRAIN_SCHEDULE_RATE"
WAKE_PRECISION_VARIABLE = "PGDRAIN_WAKE_PRECISION_SECONDS"
WAKE_PRECISION_SECONDS = 60.0  # EventBridge Scheduler's one-shot precision: one minute
RATE = re.compile(r"^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$")
UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


@dataclass(frozen=True)
class FunctionModel:
    """The drain function as template.yaml deploys it (simulated units: seconds)."""

    name: str
    arn: str
    timeout_s: float
    environment: dict[str, str] = field(default_factory=dict)  # unscaled
    max_retry_attempts: int = LAMBDA_DEFAULT_RETRIES
    max_event_age_s: float = LAMBDA_DEFAULT_EVENT_AGE_SECONDS
    reserved_concurrency: int | None = None
    schedule_rate_s: float | None = None  # the ScheduleV2 rate; None when there is none


def read(path: Path) -> FunctionModel:
    spec = read_function(path)
    template = load_template(path)
    resolver = Resolver(template, REGION)
    resource = template["Resources"][spec.logical_id]
    props: dict[str, Any] = resource.get("Properties") or {}
    invoke_config = resolver.resolve(props.get("EventInvokeConfig") or {})
    retries = invoke_config.get("MaximumRetryAttempts", LAMBDA_DEFAULT_RETRIES)
    age = invoke_config.get("MaximumEventAgeInSeconds", LAMBDA_DEFAULT_EVENT_AGE_SECONDS)
    reserved = resolver.resolve(props.get("ReservedConcurrentExecutions"))
    return FunctionModel(
        name=spec.function_name,
        arn=f"arn:aws:lambda:{REGION}:{LOCAL_ACCOUNT}:function:{spec.function_name}",
        timeout_s=float(spec.timeout),
        environment=_environment(spec, template, props, resolver),
        max_retry_attempts=int(retries),
        max_event_age_s=float(age),
        reserved_concurrency=_optional_int(reserved),
        schedule_rate_s=_schedule_rate(props, resolver),
    )


def scaled_environment(env: dict[str, str], factor: float) -> dict[str, str]:
    """The function's variables with every duration divided by the factor, plus the one-shot
    schedule precision (which the control plane may read; harmless if it does not)."""
    out = dict(env)
    for name, value in env.items():
        if name == RATE_VARIABLE and value.strip():
            seconds = parse_duration(name, value) / factor
            out[name] = f"{_seconds_text(seconds)} seconds"
            continue
        if not _is_duration(name) or not value.strip():
            continue
        try:
            out[name] = _seconds_text(float(value) / factor)
        except ValueError:
            continue  # not a number: leave it for Settings to reject, as it would in AWS
    out[WAKE_PRECISION_VARIABLE] = _seconds_text(WAKE_PRECISION_SECONDS / factor)
    return out


def parse_rate(expression: str) -> float:
    """Seconds between firings of `rate(N unit)`."""
    match = RATE.match(expression.strip())
    if match is None:
        raise ValueError(f"not a rate expression: {expression!r}")
    count, unit = int(match.group(1)), match.group(2).rstrip("s")
    return float(count * UNIT_SECONDS[unit])


def _is_duration(name: str) -> bool:
    return name.startswith("PGDRAIN_") and (
        name.endswith("_SECONDS") or name in EXTRA_DURATION_VARIABLES
    )


def _seconds_text(value: float) -> str:
    return f"{value:.6g}"


def _optional_int(value: object) -> int | None:
    if value is None or value is NO_VALUE or isinstance(value, Unresolved):
        return None
    return int(str(value))


def _schedule_rate(props: dict[str, Any], resolver: Resolver) -> float | None:
    for event in (props.get("Events") or {}).values():
        if not isinstance(event, dict) or event.get("Type") not in ("ScheduleV2", "Schedule"):
            continue
        expression = resolver.resolve((event.get("Properties") or {}).get("ScheduleExpression"))
        if isinstance(expression, str) and expression.startswith("rate("):
            return parse_rate(expression)
    return None


def _environment(
    spec: FunctionSpec, template: dict[str, Any], props: dict[str, Any], resolver: Resolver
) -> dict[str, str]:
    """The declared variables; a reference to a resource of the stack (a role's or a schedule
    group's ARN, which only a deployed stack knows) becomes a plausible stand-in ARN."""
    env = dict(spec.environment)
    raw = ((props.get("Environment") or {}).get("Variables")) or {}
    resources = template.get("Resources") or {}
    for name, value in raw.items():
        if env.get(str(name)):
            continue
        target = _referenced_resource(value, resources, resolver)
        if target is not None:
            env[str(name)] = target
    return env


def _referenced_resource(
    value: object, resources: dict[str, Any], resolver: Resolver
) -> str | None:
    if not isinstance(value, dict) or len(value) != 1:
        return None
    ((key, arg),) = value.items()
    if key == "Fn::GetAtt" and isinstance(arg, list) and len(arg) == 2 and arg[1] == "Arn":
        return _fake_arn(str(arg[0]), resources)
    if key == "Ref" and str(arg) in resources:
        return _resource_name(str(arg), resources, resolver)
    return None


def _resource_name(logical_id: str, resources: dict[str, Any], resolver: Resolver) -> str:
    props = resources[logical_id].get("Properties") or {}
    for key in ("Name", "RoleName", "FunctionName", "QueueName"):
        value = resolver.resolve(props.get(key))
        if isinstance(value, str) and value:
            return value
    return logical_id


def _fake_arn(logical_id: str, resources: dict[str, Any]) -> str:
    kind = str((resources.get(logical_id) or {}).get("Type", ""))
    account = LOCAL_ACCOUNT
    if kind == "AWS::IAM::Role":
        return f"arn:aws:iam::{account}:role/{logical_id}"
    if kind == "AWS::Scheduler::ScheduleGroup":
        return f"arn:aws:scheduler:{REGION}:{account}:schedule-group/{logical_id}"
    if kind == "AWS::SQS::Queue":
        return f"arn:aws:sqs:{REGION}:{account}:{logical_id}"
    service = kind.split("::")[1].lower() if kind.count("::") == 2 else "unknown"
    return f"arn:aws:{service}:{REGION}:{account}:{logical_id}"
