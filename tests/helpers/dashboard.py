"""The dashboard function as a Function URL invokes it: its handler built from an environment,
and the event of a request from an IAM caller."""

from __future__ import annotations

from typing import Any

from pgdrain.ui import lambda_entry, local

ADA = "arn:aws:iam::123456789012:user/ada"
SECRET = "s" * 40


def dashboard_event(method: str, target: str, form: str = "", caller: str = ADA) -> dict[str, Any]:
    host = "abc123.lambda-url.eu-west-1.on.aws"
    headers = {"host": host, "origin": f"https://{host}"}
    event = local.to_event(method, target, headers, form.encode(), "203.0.113.9")
    event["requestContext"]["authorizer"] = {"iam": {"userArn": caller}}
    return event


def dashboard_function(url: str, actions: bool = True) -> Any:
    env = {"DATABASE_URL": url, "PGDRAIN_UI_SECRET": SECRET}
    if actions:
        env["PGDRAIN_UI_ACTIONS"] = "true"
    return lambda_entry._build(env)
