"""template.yaml as SAM deploys it (tests/helpers/sam.py: the SAM translator, then the
conditions decided): what the function and the schedules may do, for each setting that changes
it, and what docs/lambda.md says of it. The template's text alone hid what SAM adds: its role
for the function held AWSLambdaBasicExecutionRole (any log group), the VPC access policy even
with no subnets, and X-Ray write access with tracing off; its role for the rate schedule
trusted any schedule."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest

from helpers.sam import (
    MANAGED,
    ROOT,
    TEMPLATE,
    as_list,
    expand,
    resolve,
    role_statements,
    statements,
)
from pgdrain.aws import local_invoke

SUBNETS = ["subnet-0a", "subnet-0b"]
SECRET = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:pgdrain/drain_fn-AbCdEf"
ALWAYS = {
    "WriteOwnLogs",
    "ContinueItself",
    "ScheduleWakeUps",
    "MoveSafetyNet",
    "PassWakeRole",
    "SendFailedEvents",
}
# The only statements on "*": actions that take no resource, each only when its setting asks.
ON_ANY_RESOURCE = {"ManageVpcNetworkInterfaces": "ec2:", "WriteTraces": "xray:"}
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "vpc": {"SubnetIds": SUBNETS, "SecurityGroupIds": ["sg-0a"]},
    "tracing": {"Tracing": "Active"},
    "secret": {"DatabaseSecretArn": SECRET},
}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return local_invoke.load_template(TEMPLATE)


@pytest.fixture(scope="module")
def expanded(template: dict[str, Any]) -> Iterator[dict[str, Any]]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield expand(template)


def _roles(resources: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in resources.items() if v["Type"] == "AWS::IAM::Role"}


def _sids(resources: dict[str, Any]) -> set[str]:
    return {s["Sid"] for s in role_statements(resources["DrainFunctionRole"])}


def _actions(resources: dict[str, Any]) -> set[str]:
    return {
        a for s in role_statements(resources["DrainFunctionRole"]) for a in as_list(s["Action"])
    }


def test_sam_makes_no_role_of_its_own(expanded: dict[str, Any]) -> None:
    for name, parameters in SETTINGS.items():
        resources = resolve(expanded, **parameters)
        assert set(_roles(resources)) == {"DrainFunctionRole", "WakeSchedulerRole"}, name
        function = resources["DrainFunction"]["Properties"]
        assert function["Role"] == {"Fn::GetAtt": ["DrainFunctionRole", "Arn"]}
        for role in _roles(resources).values():
            assert "ManagedPolicyArns" not in role["Properties"], name


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_function_may_do_what_its_settings_need_and_nothing_else(
    expanded: dict[str, Any], setting: str
) -> None:
    resources = resolve(expanded, **SETTINGS[setting])
    expected = set(ALWAYS)
    expected |= {"ManageVpcNetworkInterfaces"} if setting == "vpc" else set()
    expected |= {"WriteTraces"} if setting == "tracing" else set()
    expected |= {"ReadDatabaseSecret"} if setting == "secret" else set()
    assert _sids(resources) == expected
    actions = _actions(resources)
    assert any(a.startswith("ec2:") for a in actions) == (setting == "vpc")
    assert any(a.startswith("xray:") for a in actions) == (setting == "tracing")
    assert ("secretsmanager:GetSecretValue" in actions) == (setting == "secret")
    vpc = resources["DrainFunction"]["Properties"].get("VpcConfig")
    assert (vpc is not None) == (setting == "vpc")


def test_logs_go_to_the_functions_own_group_only(expanded: dict[str, Any]) -> None:
    resources = resolve(expanded)
    (logs,) = [
        s for s in role_statements(resources["DrainFunctionRole"]) if s["Sid"] == "WriteOwnLogs"
    ]
    assert sorted(as_list(logs["Action"])) == ["logs:CreateLogStream", "logs:PutLogEvents"]
    assert logs["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}"
        ":log-group:${DrainLogGroup}:*"
    }
    config = resources["DrainFunction"]["Properties"]["LoggingConfig"]
    assert config["LogGroup"] == {"Ref": "DrainLogGroup"}


@pytest.mark.parametrize("setting", SETTINGS)
def test_no_statement_is_on_every_resource_but_those_whose_actions_take_none(
    expanded: dict[str, Any], setting: str
) -> None:
    resources = resolve(expanded, **SETTINGS[setting])
    for role in _roles(resources).values():
        for statement in role_statements(role):
            actions = as_list(statement["Action"])
            assert all("*" not in a for a in actions), statement
            if "*" in as_list(statement["Resource"]):
                prefix = ON_ANY_RESOURCE.get(statement.get("Sid", ""))
                assert prefix and all(a.startswith(prefix) for a in actions), statement


def test_control_the_role_sam_makes_holds_what_the_function_never_uses(
    template: dict[str, Any],
) -> None:
    """The control: the same template without the function's own role (its Role property
    removed): SAM's generated role holds the VPC access policy with no subnets, X-Ray write
    access with tracing off, and logs on every log group, and the rate schedule gets a role
    of SAM's that trusts every schedule."""
    old = copy.deepcopy(template)
    del old["Resources"]["DrainFunctionRole"]
    function = old["Resources"]["DrainFunction"]["Properties"]
    del function["Role"]
    schedule = function["Events"]["Schedule"]["Properties"]
    for key in ("RoleArn", "GroupName", "Name"):
        del schedule[key]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        resources = resolve(expand(old))  # the defaults: no subnets, tracing PassThrough
    generated = resources["DrainFunctionRole"]["Properties"]
    assert set(generated["ManagedPolicyArns"]) == {
        MANAGED["AWSLambdaBasicExecutionRole"],
        MANAGED["AWSLambdaVPCAccessExecutionRole"],
        MANAGED["AWSXrayWriteOnlyAccess"],
    }
    schedule_role = resources["DrainFunctionScheduleRole"]["Properties"]
    (trust,) = statements(schedule_role["AssumeRolePolicyDocument"])
    assert "Condition" not in trust


DASHBOARD = {"WebDashboard": "true"}
DASHBOARD_SETTINGS: dict[str, dict[str, Any]] = {
    "read-only": DASHBOARD,
    "actions": DASHBOARD | {"WebDashboardActions": "true"},
    "secret": DASHBOARD | {"WebDashboardDatabaseSecretArn": SECRET},
    "vpc": DASHBOARD | SETTINGS["vpc"],
}


@pytest.mark.parametrize("setting", DASHBOARD_SETTINGS)
def test_the_dashboard_may_do_what_its_settings_need_and_nothing_else(
    expanded: dict[str, Any], setting: str
) -> None:
    """A red team's report: the dashboard ran on SAM's role, with logs on every log group."""
    resources = resolve(expanded, **DASHBOARD_SETTINGS[setting])
    assert set(_roles(resources)) == {
        "DrainFunctionRole",
        "WakeSchedulerRole",
        "WebDashboardFunctionRole",
    }
    function = resources["WebDashboardFunction"]["Properties"]
    assert function["Role"] == {"Fn::GetAtt": ["WebDashboardFunctionRole", "Arn"]}
    role = resources["WebDashboardFunctionRole"]
    assert "ManagedPolicyArns" not in role["Properties"]
    sids = {s["Sid"] for s in role_statements(role)}
    expected = {"WriteOwnLogs"}
    expected |= (
        {"KickDrainFunction", "ReadWebDashboardTokenSecret"} if setting == "actions" else set()
    )
    expected |= {"ReadWebDashboardDatabaseSecret"} if setting == "secret" else set()
    expected |= {"ManageVpcNetworkInterfaces"} if setting == "vpc" else set()
    assert sids == expected
    (logs,) = [s for s in role_statements(role) if s["Sid"] == "WriteOwnLogs"]
    assert logs["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}"
        ":log-group:${WebDashboardLogGroup}:*"
    }


def test_the_schedules_role_trusts_the_stacks_group_only(expanded: dict[str, Any]) -> None:
    resources = resolve(expanded)
    role = resources["WakeSchedulerRole"]["Properties"]
    (trust,) = statements(role["AssumeRolePolicyDocument"])
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert trust["Condition"] == {
        "StringEquals": {
            "aws:SourceAccount": {"Ref": "AWS::AccountId"},
            "aws:SourceArn": {"Fn::GetAtt": ["WakeScheduleGroup", "Arn"]},
        }
    }
    schedules = {k: v for k, v in resources.items() if v["Type"] == "AWS::Scheduler::Schedule"}
    (rate,) = schedules.values()
    properties = rate["Properties"]
    assert properties["GroupName"] == {"Ref": "WakeScheduleGroup"}
    assert properties["Target"]["RoleArn"] == {"Fn::GetAtt": ["WakeSchedulerRole", "Arn"]}
    (invoke,) = role_statements(resources["WakeSchedulerRole"])
    assert invoke["Action"] == "lambda:InvokeFunction"


def test_the_function_cannot_touch_the_rate_schedule(expanded: dict[str, Any]) -> None:
    """It creates wake-ups (pgdrain-wake-*) and the safety net, and moves the safety net; the
    rate schedule of the same group (pgdrain-rate) is none of these, and nothing deletes."""
    resources = resolve(expanded)
    scheduler = [
        s for s in role_statements(resources["DrainFunctionRole"])
        if any(a.startswith("scheduler:") for a in as_list(s["Action"]))
    ]  # fmt: skip
    names = [r["Fn::Sub"].rsplit("/", 1)[1] for s in scheduler for r in as_list(s["Resource"])]
    assert sorted(set(names)) == ["pgdrain-safety-net", "pgdrain-wake-*"]
    actions = {a for s in scheduler for a in as_list(s["Action"])}
    assert actions == {
        "scheduler:CreateSchedule",
        "scheduler:GetSchedule",
        "scheduler:UpdateSchedule",
    }
    rate = next(v for v in resources.values() if v["Type"] == "AWS::Scheduler::Schedule")
    assert rate["Properties"]["Name"] == "pgdrain-rate"


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("", True),
        (SECRET, True),
        ("arn:aws-us-gov:secretsmanager:us-gov-west-1:123456789012:secret:db-AbCdEf", True),
        ("*", False),
        ("arn:aws:secretsmanager:eu-west-1:123456789012:secret:*", False),
        ("arn:aws:secretsmanager:*:*:secret:db", False),
        ("my-secret-name", False),
    ],
)
@pytest.mark.parametrize("parameter", ["DatabaseSecretArn", "WebDashboardDatabaseSecretArn"])
def test_the_secret_is_one_whole_arn(
    template: dict[str, Any], parameter: str, value: str, allowed: bool
) -> None:
    pattern = template["Parameters"][parameter]["AllowedPattern"]
    assert (re.fullmatch(pattern, value) is not None) == allowed


def test_the_docs_iam_table_is_the_expanded_roles(expanded: dict[str, Any]) -> None:
    """docs/lambda.md's IAM table names every statement of the function's role, and only
    those; and says nothing of managed policies the role does not hold."""
    text = (ROOT / "docs" / "lambda.md").read_text()
    section = text[text.index("### IAM") : text.index("## Settings")]
    documented = set(re.findall(r"^\| ([A-Z][A-Za-z]+)", section, re.M)) - {"WakeSchedulerRole"}
    every = set().union(*(_sids(resolve(expanded, **p)) for p in SETTINGS.values()))
    assert documented == every
    # The managed policies are named only as what SAM's own role would hold.
    for name in MANAGED:
        assert section.count(name) <= 1, name
