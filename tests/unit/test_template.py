"""template.yaml, read the way `pgdrain invoke` (and sam) read it: it declares every setting,
its defaults make valid settings with time to spare, and its IAM names exact actions on exact
resources. Also the reader itself: intrinsics, Globals, env.json overrides, the context."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Metrics

from helpers.aws import emf_records
from helpers.metric_names import emitted_metrics
from pgdrain.aws import local_invoke
from pgdrain.aws.fanout import SPAWN_FAILED_METRIC, SPAWNED_METRIC
from pgdrain.aws.metrics import (
    AGE_METRIC,
    COUNT_METRICS,
    DELETED_METRIC,
    DEPTH_METRIC,
    ProgressMetrics,
    metrics_namespace,
)
from pgdrain.aws.safety_net import SAFETY_SCHEDULE
from pgdrain.aws.wake import WAKE_CREATED_METRIC, WAKE_FAILED_METRIC
from pgdrain.errors import BadInput
from pgdrain.settings import ENV_VARIABLES, Settings, parse_duration

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return local_invoke.load_template(TEMPLATE)


@pytest.fixture(scope="module")
def spec() -> local_invoke.FunctionSpec:
    return local_invoke.read_function(TEMPLATE)


def test_the_function_declares_every_setting(spec: local_invoke.FunctionSpec) -> None:
    declared = set(spec.environment)
    missing = set(ENV_VARIABLES) - declared
    assert not missing, f"template.yaml does not declare {sorted(missing)}"
    assert {"POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE"} <= declared
    assert spec.environment["POWERTOOLS_METRICS_NAMESPACE"] == "pgdrain"


def test_the_defaults_are_valid_settings_and_leave_time_after_the_reserve(
    spec: local_invoke.FunctionSpec,
) -> None:
    settings = Settings.from_env(spec.environment)
    assert spec.timeout > settings.reserve_seconds
    assert spec.timeout > settings.reserve_seconds + settings.connect_timeout
    assert settings.max_chain < 16  # Lambda stops pure Lambda loops at about 16 hops


def test_the_function_is_what_sam_builds(
    template: dict[str, Any], spec: local_invoke.FunctionSpec
) -> None:
    props = template["Resources"]["DrainFunction"]["Properties"]
    assert (props["Runtime"], props["Architectures"], props["CodeUri"]) == (
        "python3.12",
        ["arm64"],
        "handler/",
    )
    assert spec.handler == "app.lambda_handler"
    assert (spec.code_dir / "app.py").is_file()
    assert (spec.code_dir / "pgdrain" / "__init__.py").is_file()
    # What sam build installs: the lock (tests/unit/test_locked_dependencies.py), made from
    # these ranges; boto3 comes with the runtime.
    text = (spec.code_dir / "requirements.in").read_text()
    requirements = [line.strip() for line in text.splitlines() if not line.startswith("#")]
    names = {line.split(">")[0].split("=")[0].split("[")[0] for line in requirements if line}
    assert names == {"psycopg", "aws-lambda-powertools"}
    assert any(line.startswith("psycopg[binary]") for line in requirements)
    assert (spec.code_dir / "requirements.txt").is_file()
    for name in ("Timeout", "MemorySize"):
        assert props[name] == {"Ref": name}
    (event,) = props["Events"].values()
    assert event["Type"] == "ScheduleV2"
    assert event["Properties"]["ScheduleExpression"] == {"Fn::Sub": "rate(${ScheduleRate})"}


def test_a_failed_run_is_retried_once_and_failures_are_kept(template: dict[str, Any]) -> None:
    config = template["Resources"]["DrainFunction"]["Properties"]["EventInvokeConfig"]
    # A run killed by its timeout is a function error: one retry, about a minute later,
    # reclaims its jobs (tests/integration/test_recovery.py shows that retry at work).
    assert config["MaximumRetryAttempts"] == 1
    age = template["Parameters"][config["MaximumEventAgeInSeconds"]["Ref"]]
    assert 60 <= age["Default"] <= age["MaxValue"] <= 21600
    on_failure = config["DestinationConfig"]["OnFailure"]
    assert on_failure["Type"] == "SQS"
    assert template["Resources"][on_failure["Destination"]["Fn::GetAtt"][0]]["Type"] == (
        "AWS::SQS::Queue"
    )


def _statements(node: Any) -> Iterator[dict[str, Any]]:
    """Every policy statement written in the template; a conditional one (`!If [C, S,
    !Ref AWS::NoValue]`) as S."""
    if isinstance(node, dict):
        statement = node.get("Statement")
        if isinstance(statement, list):
            for item in statement:
                if isinstance(item, dict) and set(item) == {"Fn::If"}:
                    item = item["Fn::If"][1]
                if isinstance(item, dict):
                    yield item
        for value in node.values():
            yield from _statements(value)
    elif isinstance(node, list):
        for item in node:
            yield from _statements(item)


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


# The wildcards: the names of the wake-up schedules pgdrain makes in the stack's own group (a
# deterministic name per minute), the function's log streams in its own log group, and "*" for
# the actions that take no resource, each only when its setting asks
# (tests/unit/test_template_expanded.py checks them as SAM expands the template).
WAKE_SCHEDULES = (
    "arn:${AWS::Partition}:scheduler:${AWS::Region}:${AWS::AccountId}:"
    "schedule/${AWS::StackName}-wake/pgdrain-wake-*"
)
LOG_GROUPS = "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:"
OWN_LOG_STREAMS = (LOG_GROUPS + "${DrainLogGroup}:*", LOG_GROUPS + "${WebDashboardLogGroup}:*")
ON_ANY_RESOURCE = ("ManageVpcNetworkInterfaces", "WriteTraces")
FUNCTION_ARN_SUB = (
    "arn:${AWS::Partition}:lambda:${AWS::Region}:${AWS::AccountId}:function:${AWS::StackName}-drain"
)


def test_no_policy_has_a_wildcard_action_or_resource(template: dict[str, Any]) -> None:
    statements = list(_statements(template))
    assert len(statements) >= 2
    for statement in statements:
        for key in ("Action", "Resource", "NotAction", "NotResource"):
            for text in _strings(statement.get(key)):
                if key == "Resource" and text in (WAKE_SCHEDULES, *OWN_LOG_STREAMS):
                    continue
                if key == "Resource" and text == "*" and statement["Sid"] in ON_ANY_RESOURCE:
                    continue
                assert "*" not in text, f"{key} {text!r} in {statement.get('Sid')}"
    actions = {a for s in statements for a in _strings(s["Action"])}
    assert actions == {
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "lambda:InvokeFunction",
        "secretsmanager:GetSecretValue",
        "scheduler:CreateSchedule",
        "scheduler:GetSchedule",  # the safety-net schedule only
        "scheduler:UpdateSchedule",
        "iam:PassRole",
        "sqs:SendMessage",
        "sts:AssumeRole",
        "lambda:InvokeFunctionUrl",  # the dashboard's, for the people who may open it
        "ec2:CreateNetworkInterface",  # with SubnetIds only
        "ec2:DescribeNetworkInterfaces",
        "ec2:DescribeSubnets",
        "ec2:DeleteNetworkInterface",
        "ec2:AssignPrivateIpAddresses",
        "ec2:UnassignPrivateIpAddresses",
        "xray:PutTraceSegments",  # with Tracing Active only
        "xray:PutTelemetryRecords",
    }


def test_the_function_may_invoke_itself_by_its_explicit_name(template: dict[str, Any]) -> None:
    props = template["Resources"]["DrainFunction"]["Properties"]
    assert props["FunctionName"] == {"Fn::Sub": "${AWS::StackName}-drain"}
    (invoke,) = [s for s in _statements(template) if s.get("Sid") == "ContinueItself"]
    assert invoke["Action"] == "lambda:InvokeFunction"
    assert invoke["Resource"] == {"Fn::Sub": FUNCTION_ARN_SUB}  # continue, fan-out
    secrets = {
        s["Sid"]: s["Resource"]
        for s in _statements(template)
        if s["Action"] == "secretsmanager:GetSecretValue"
    }
    assert secrets == {  # the dashboard reads its own role's credentials, and its token key
        "ReadDatabaseSecret": {"Ref": "DatabaseSecretArn"},
        "ReadWebDashboardDatabaseSecret": {"Ref": "WebDashboardDatabaseSecretArn"},
        "ReadWebDashboardTokenSecret": {"Ref": "WebDashboardTokenSecret"},
    }


def test_wake_ups_go_through_a_role_that_may_only_invoke_this_function(
    template: dict[str, Any],
) -> None:
    resources = template["Resources"]
    role = resources["WakeSchedulerRole"]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"]["StringEquals"]["aws:SourceArn"] == {
        "Fn::GetAtt": ["WakeScheduleGroup", "Arn"]
    }
    (policy,) = role["Policies"]
    (allowed,) = policy["PolicyDocument"]["Statement"]
    assert allowed == {
        "Effect": "Allow",
        "Action": "lambda:InvokeFunction",
        "Resource": {"Fn::Sub": FUNCTION_ARN_SUB},
    }
    group = resources["WakeScheduleGroup"]
    assert group["Type"] == "AWS::Scheduler::ScheduleGroup"
    assert group["Properties"]["Name"] == {"Fn::Sub": "${AWS::StackName}-wake"}
    by_sid = {s.get("Sid"): s for s in _statements(template)}
    schedule = by_sid["ScheduleWakeUps"]
    assert schedule["Resource"] == [
        {"Fn::Sub": WAKE_SCHEDULES},
        {"Fn::Sub": WAKE_SCHEDULES.replace("pgdrain-wake-*", SAFETY_SCHEDULE)},
    ]
    assert by_sid["PassWakeRole"]["Resource"] == {"Fn::GetAtt": ["WakeSchedulerRole", "Arn"]}
    # The sliding safety net: read and moved, that one schedule only.
    net = by_sid["MoveSafetyNet"]
    assert sorted(net["Action"]) == ["scheduler:GetSchedule", "scheduler:UpdateSchedule"]
    assert net["Resource"] == {"Fn::Sub": WAKE_SCHEDULES.replace("pgdrain-wake-*", SAFETY_SCHEDULE)}
    env = resources["DrainFunction"]["Properties"]["Environment"]["Variables"]
    assert env["PGDRAIN_SCHEDULE_GROUP"] == {"Ref": "WakeScheduleGroup"}
    assert env["PGDRAIN_SCHEDULER_ROLE_ARN"] == {"Fn::GetAtt": ["WakeSchedulerRole", "Arn"]}


def test_the_rate_schedule_is_an_hourly_safety_net(template: dict[str, Any]) -> None:
    # Every tick keeps the database awake for its suspend delay (5 minutes on Neon and Aurora):
    # the runs that matter are kicks, wake-ups and fan-out (docs/lambda.md).
    assert template["Parameters"]["ScheduleRate"]["Default"] == "1 hour"
    assert template["Parameters"]["MaxRuns"]["Default"] == 10
    env = template["Resources"]["DrainFunction"]["Properties"]["Environment"]["Variables"]
    assert env["PGDRAIN_SCHEDULE_RATE"] == {"Ref": "ScheduleRate"}  # the sliding safety net's
    assert parse_duration("ScheduleRate", "1 hour") == 3600


def test_tls_is_required_by_default_and_never_falls_back(template: dict[str, Any]) -> None:
    """PGSSLMODE comes from DatabaseSslMode, `require` unless chosen otherwise, and no value
    that falls back to plaintext silently (`prefer`, the default before, and `allow`)."""
    parameter = template["Parameters"]["DatabaseSslMode"]
    assert parameter["Default"] == "require"
    assert set(parameter["AllowedValues"]) == {"require", "verify-ca", "verify-full", "disable"}
    variables = template["Resources"]["DrainFunction"]["Properties"]["Environment"]["Variables"]
    assert variables["PGSSLMODE"] == {"Ref": "DatabaseSslMode"}


def test_the_vpc_is_optional(template: dict[str, Any]) -> None:
    vpc = template["Resources"]["DrainFunction"]["Properties"]["VpcConfig"]
    condition, _with_vpc, without = vpc["Fn::If"]
    assert condition == "HasVpc" and without == {"Ref": "AWS::NoValue"}
    resolver = local_invoke.Resolver(template)
    assert resolver.condition("HasVpc") is False  # by default
    assert resolver.resolve(vpc) is local_invoke.NO_VALUE


def test_reserved_concurrency_is_unset_unless_given(template: dict[str, Any]) -> None:
    """A new account's limit is 10 and 10 must stay unreserved: any reservation fails there."""
    parameter = template["Parameters"]["ReservedConcurrentExecutions"]
    assert (parameter["Type"], parameter["Default"]) == ("String", "")
    reserved = template["Resources"]["DrainFunction"]["Properties"]["ReservedConcurrentExecutions"]
    assert reserved == {
        "Fn::If": [
            "HasReservedConcurrency",
            {"Ref": "ReservedConcurrentExecutions"},
            {"Ref": "AWS::NoValue"},
        ]
    }
    resolver = local_invoke.Resolver(template)
    assert resolver.resolve(reserved) is local_invoke.NO_VALUE  # by default
    resolver.parameters["ReservedConcurrentExecutions"] = "3"
    assert resolver.resolve(reserved) == "3"


def test_tracing_logging_and_retention_are_parameters(template: dict[str, Any]) -> None:
    props = template["Resources"]["DrainFunction"]["Properties"]
    parameters = template["Parameters"]
    assert props["Tracing"] == {"Ref": "Tracing"}
    assert parameters["Tracing"]["AllowedValues"] == ["Active", "PassThrough"]
    assert parameters["Tracing"]["Default"] == "PassThrough"  # off unless asked for
    logging_config = props["LoggingConfig"]
    assert logging_config["LogFormat"] == "JSON"
    assert logging_config["ApplicationLogLevel"] == {"Ref": "LogLevel"}
    # EMF lines carry no "level": Lambda files them as INFO, so a stricter filter drops metrics.
    assert parameters["LogLevel"]["AllowedValues"] == ["DEBUG", "INFO"]
    assert logging_config["LogGroup"] == {"Ref": "DrainLogGroup"}
    log_group = template["Resources"]["DrainLogGroup"]["Properties"]
    assert log_group["RetentionInDays"] == {"Ref": "LogRetentionInDays"}
    assert log_group["LogGroupName"] == {"Fn::Sub": "/aws/lambda/${AWS::StackName}-drain"}


def test_the_kick_policy_is_an_output_granting_one_action_on_the_function(
    template: dict[str, Any],
) -> None:
    policy = template["Resources"]["KickPolicy"]
    assert policy["Type"] == "AWS::IAM::ManagedPolicy"
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Action"] == "lambda:InvokeFunction"
    assert statement["Resource"] == {"Fn::GetAtt": ["DrainFunction", "Arn"]}
    assert template["Outputs"]["KickPolicyArn"]["Value"] == {"Ref": "KickPolicy"}


ALARMS = {
    "OldestReadyAgeAlarm": AGE_METRIC,
    "FailedJobsAlarm": COUNT_METRICS["failed"],
    "LostLeasesAlarm": COUNT_METRICS["lease_lost"],
    # Control-plane calls that failed without failing the run (counted only when they fail).
    "WakeFailedAlarm": WAKE_FAILED_METRIC,
    "SpawnFailedAlarm": SPAWN_FAILED_METRIC,
}
COUNT_ALARMS = ("FailedJobsAlarm", "LostLeasesAlarm", "WakeFailedAlarm", "SpawnFailedAlarm")


def _emitted_dimensions(environment: dict[str, str]) -> dict[str, str]:
    """The dimensions of what the function prints, built as handler/app.py builds Metrics."""
    metrics = Metrics(namespace=metrics_namespace(environment))
    metrics.clear_metrics()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        progress = ProgressMetrics(metrics, interval=3600)
        progress.observe("failed", 1)
        progress.close()
    metrics.clear_metrics()
    (record,) = emf_records(out.getvalue())
    (directive,) = record["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "pgdrain"
    (names,) = directive["Dimensions"]
    return {name: record[name] for name in names}


def test_the_alarms_watch_what_the_function_emits(
    template: dict[str, Any], spec: local_invoke.FunctionSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in spec.environment.items():
        monkeypatch.setenv(name, value)
    emitted = _emitted_dimensions(spec.environment)
    assert emitted == {"service": "local"}  # the stack's name (`local` under pgdrain invoke)
    resolver = local_invoke.Resolver(template)
    resources = template["Resources"]
    for alarm, metric in ALARMS.items():
        props = resources[alarm]["Properties"]
        assert (props["Namespace"], props["MetricName"]) == ("pgdrain", metric)
        dimensions = {d["Name"]: resolver.resolve(d["Value"]) for d in props["Dimensions"]}
        assert dimensions == emitted, alarm
    failed_events = resources["FailedEventsAlarm"]["Properties"]
    assert failed_events["Namespace"] == "AWS/SQS"
    assert failed_events["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["FailedEventsQueue", "QueueName"]}}
    ]
    alarms = {name for name, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    assert alarms == {*ALARMS, "FailedEventsAlarm"}
    for alarm in alarms:
        props = resources[alarm]["Properties"]
        assert props["AlarmActions"] == [{"Ref": "AlarmTopic"}], alarm
        assert props["OKActions"] == [{"Ref": "AlarmTopic"}], alarm  # and when it clears
        assert props["TreatMissingData"] == "notBreaching", alarm  # no run is not a breach
    for alarm in COUNT_ALARMS:  # any one in five minutes
        props = resources[alarm]["Properties"]
        assert (props["Statistic"], props["Period"], props["EvaluationPeriods"]) == ("Sum", 300, 1)
        assert (props["Threshold"], props["ComparisonOperator"]) == (0, "GreaterThanThreshold")


def test_the_dashboard_graphs_every_metric_the_function_emits(template: dict[str, Any]) -> None:
    body, variables = template["Resources"]["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    assert set(variables) == {"FunctionName", "QueueName"}
    text = re.sub(r"\$\{[^}]+\}", "X", body)  # every ${...} substituted, as CloudFormation does
    widgets = json.loads(text)["widgets"]
    graphed = set()
    for widget in widgets:
        for row in widget["properties"].get("metrics", []):
            if row[0] == "pgdrain":
                assert row[2] == "service", row
                graphed.add(row[1])
    # Every `*_METRIC` constant in pgdrain.aws and COUNT_METRICS: a new one needs a graph.
    expected = emitted_metrics()
    assert {
        *COUNT_METRICS.values(),
        DEPTH_METRIC,
        AGE_METRIC,
        DELETED_METRIC,
        WAKE_CREATED_METRIC,
        WAKE_FAILED_METRIC,
        SPAWNED_METRIC,
        SPAWN_FAILED_METRIC,
    } <= expected  # the constants are found (the scan is not vacuous)
    assert graphed == expected
    assert "${AWS::StackName}" in body
    (alarms,) = [w for w in widgets if w["type"] == "alarm"]
    resources = template["Resources"]
    every_alarm = {n for n, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    assert len(alarms["properties"]["alarms"]) == len(every_alarm)
    assert set(re.findall(r"\$\{(\w+)\.Arn\}", body)) == every_alarm


DASHBOARD_RESOURCES = {
    "WebDashboardFunction",
    "WebDashboardFunctionRole",
    "WebDashboardTokenSecret",
    "WebDashboardLogGroup",
    "WebDashboardInvokePolicy",
}


def test_the_dashboard_is_off_unless_asked_for_and_behind_iam(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    resolver = local_invoke.Resolver(template)
    assert template["Parameters"]["WebDashboard"]["Default"] == "false"
    assert resolver.condition("HasWebDashboard") is False
    assert {n for n, r in resources.items() if r.get("Condition") == "HasWebDashboard"} == (
        DASHBOARD_RESOURCES
    )
    props = resources["WebDashboardFunction"]["Properties"]
    assert props["FunctionUrlConfig"] == {"AuthType": "AWS_IAM"}
    module, function = props["Handler"].rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), function))
    env = props["Environment"]["Variables"]
    # Its own credentials (a role of dashboard_role.sql), not the drain's; read-only by default.
    assert env["DATABASE_URL"] == {"Ref": "WebDashboardDatabaseUrl"}
    assert env["PGDRAIN_DB_SECRET_ARN"] == {"Ref": "WebDashboardDatabaseSecretArn"}
    assert env["PGDRAIN_UI_ACTIONS"] == {"Ref": "WebDashboardActions"}
    assert template["Parameters"]["WebDashboardActions"]["Default"] == "false"
    # The token key is read at cold start, not put in the configuration that
    # lambda:GetFunctionConfiguration shows (a red team's report): no dynamic reference.
    assert env["PGDRAIN_UI_SECRET_ARN"] == {
        "Fn::If": [
            "HasWebDashboardActions",
            {"Ref": "WebDashboardTokenSecret"},
            {"Ref": "AWS::NoValue"},
        ]
    }
    assert "resolve:secretsmanager" not in json.dumps(props)
    statements = resources["WebDashboardFunctionRole"]["Properties"]["Policies"][0][
        "PolicyDocument"
    ]["Statement"]
    (only_with_actions,) = [
        s["Fn::If"]
        for s in statements
        if "Fn::If" in s and s["Fn::If"][1].get("Sid") == "ReadWebDashboardTokenSecret"
    ]
    assert only_with_actions[0] == "HasWebDashboardActions"
    reads_key = only_with_actions[1]
    assert (reads_key["Action"], reads_key["Resource"]) == (
        "secretsmanager:GetSecretValue",
        {"Ref": "WebDashboardTokenSecret"},
    )
    (opener,) = resources["WebDashboardInvokePolicy"]["Properties"]["PolicyDocument"]["Statement"]
    assert opener["Action"] == "lambda:InvokeFunctionUrl"
    assert opener["Resource"] == {"Fn::GetAtt": ["WebDashboardFunction", "Arn"]}
    assert opener["Condition"] == {"StringEquals": {"lambda:FunctionUrlAuthType": "AWS_IAM"}}


def test_pgdrain_invoke_still_finds_the_drain_function_alone() -> None:
    """The dashboard's function is off by default: `pgdrain invoke` without a name picks the
    drain function, as before; named, the dashboard's is found too."""
    assert local_invoke.read_function(TEMPLATE).logical_id == "DrainFunction"
    dashboard = local_invoke.read_function(TEMPLATE, "WebDashboardFunction")
    assert dashboard.handler == "pgdrain.ui.lambda_entry.lambda_handler"


def test_control_two_functions_without_a_condition_must_be_named(tmp_path: Path) -> None:
    text = (
        "Resources:\n"
        "  A: {Type: AWS::Serverless::Function, Properties: {Handler: a.h, CodeUri: .}}\n"
        "  B: {Type: AWS::Serverless::Function, Properties: {Handler: b.h, CodeUri: .}}\n"
    )
    (tmp_path / "template.yaml").write_text(text)
    with pytest.raises(BadInput, match="name the function to invoke"):
        local_invoke.read_function(tmp_path / "template.yaml")


# -- the reader -------------------------------------------------------------------------------

SMALL_TEMPLATE = """
Transform: AWS::Serverless-2016-10-31
Parameters:
  Stage: {Type: String, Default: dev}
  Subnets: {Type: CommaDelimitedList, Default: "a,b"}
Conditions:
  IsProd: !Equals [!Ref Stage, prod]
Globals:
  Function:
    Timeout: 42
    Environment:
      Variables:
        SHARED: from-globals
        OVERRIDDEN: from-globals
Resources:
  Worker:
    Type: AWS::Serverless::Function
    Properties:
      FunctionName: !Sub "${AWS::StackName}-${Stage}-worker"
      CodeUri: src/
      Handler: main.handle
      Environment:
        Variables:
          OVERRIDDEN: from-function
          STAGE: !Ref Stage
          MODE: !If [IsProd, strict, relaxed]
          SUBNETS: !Join [",", !Ref Subnets]
          QUEUE_URL: !GetAtt Queue.QueueUrl
          REGION: !Sub "${AWS::Region}"
          EMPTY: ""
          PORT: 5432
          ENABLED: true
  Other:
    Type: AWS::Serverless::Function
    Properties: {Handler: other.handle, CodeUri: other/}
  Queue:
    Type: AWS::SQS::Queue
"""


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "template.yaml"
    path.write_text(SMALL_TEMPLATE)
    return path


def test_the_reader_resolves_what_sam_resolves_locally(small: Path) -> None:
    spec = local_invoke.read_function(small, "Worker")
    assert (spec.function_name, spec.handler, spec.timeout, spec.memory_size) == (
        "local-dev-worker",
        "main.handle",
        42,  # from Globals
        128,  # sam's default
    )
    assert spec.code_dir == (small.parent / "src").resolve()
    assert spec.environment == {
        "SHARED": "from-globals",
        "OVERRIDDEN": "from-function",
        "STAGE": "dev",
        "MODE": "relaxed",
        "SUBNETS": "a,b",
        "QUEUE_URL": "",  # needs a deployed stack
        "REGION": local_invoke.local_region(),
        "EMPTY": "",
        "PORT": "5432",
        "ENABLED": "true",
    }


def test_the_reader_needs_a_name_when_there_are_several_functions(small: Path) -> None:
    with pytest.raises(BadInput, match=r"name the function to invoke: .* has Other, Worker"):
        local_invoke.read_function(small)
    with pytest.raises(BadInput, match="has no function 'Nope'"):
        local_invoke.read_function(small, "Nope")


def test_env_json_overrides_declared_variables_only(small: Path, tmp_path: Path) -> None:
    spec = local_invoke.read_function(small, "Worker")
    env_json = tmp_path / "env.json"
    env_json.write_text(
        json.dumps(
            {
                "Parameters": {"STAGE": "test", "MODE": "everywhere", "UNDECLARED": "x"},
                "Worker": {"MODE": "only-worker", "PORT": 6543},
                "Other": {"STAGE": "not-this-function"},
            }
        )
    )
    overrides, ignored = local_invoke.read_overrides(env_json, spec)
    assert overrides == {"STAGE": "test", "MODE": "only-worker", "PORT": "6543"}
    assert ignored == ("UNDECLARED",)

    shell = {"EMPTY": "from-shell", "STAGE": "shell-loses", "UNDECLARED": "ignored"}
    env = local_invoke.function_environment(spec, overrides, shell, "eu-west-1")
    assert (env["STAGE"], env["MODE"], env["EMPTY"]) == ("test", "only-worker", "from-shell")
    assert "UNDECLARED" not in env
    assert (env["AWS_REGION"], env["AWS_SAM_LOCAL"], env["_HANDLER"]) == (
        "eu-west-1",
        "true",
        "main.handle",
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1]", "must be a JSON object"),
        ('{"Parameters": []}', "must be an object"),
        ('{"Parameters": {"STAGE": {"a": 1}}}', "must be a string, a number or a boolean"),
        ("{", "is not valid JSON"),
        # sam would ignore both without a word, and the invoke use another database
        ('{"Workr": {"STAGE": "x"}}', "'Workr' is neither \"Parameters\" nor a function"),
        ('{"STAGE": "x"}', "'STAGE' is neither"),
    ],
)
def test_a_bad_env_json_is_bad_input(
    small: Path, tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "env.json"
    path.write_text(content)
    with pytest.raises(BadInput, match=message):
        local_invoke.read_overrides(path, local_invoke.read_function(small, "Worker"))


def test_a_template_that_is_not_one_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "template.yaml"
    path.write_text("just: words\n")
    with pytest.raises(BadInput, match="has no Resources"):
        local_invoke.read_function(path)
    with pytest.raises(BadInput, match=r"no template .*missing\.yaml: run `pgdrain invoke` in"):
        local_invoke.read_function(tmp_path / "missing.yaml")
    with pytest.raises(BadInput, match="cannot read the template"):
        local_invoke.read_function(tmp_path)  # a folder


def test_the_context_counts_down_from_the_timeout(small: Path) -> None:
    now = [100.0]
    spec = local_invoke.read_function(small, "Worker")
    context = local_invoke.local_context(spec, "us-east-1", clock=lambda: now[0])
    assert context.get_remaining_time_in_millis() == 42_000
    now[0] += 41.5
    assert context.get_remaining_time_in_millis() == 500
    now[0] += 10
    assert context.get_remaining_time_in_millis() == 0
    assert context.invoked_function_arn.endswith(":function:local-dev-worker")


def test_no_event_file_is_an_empty_event_as_with_sam(tmp_path: Path) -> None:
    assert local_invoke.read_event(None) == {}
    path = tmp_path / "event.json"
    path.write_text("not json")
    with pytest.raises(BadInput, match="is not valid JSON"):
        local_invoke.read_event(str(path))
