"""The Lambda API: one client per region with short timeouts, and the asynchronous invoke that
kicks, continuations and fan-out use. boto3 is imported on the first call, never at import."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_lambda import LambdaClient

# A kick runs inside the application's request: never let it wait long on the Lambda API.
CONNECT_TIMEOUT_SECONDS = 2
READ_TIMEOUT_SECONDS = 5
MAX_ATTEMPTS = 2

_clients: dict[str | None, LambdaClient] = {}
_clients_lock = threading.Lock()


def lambda_client(region: str | None = None) -> LambdaClient:
    """A Lambda client with short timeouts, made once per region (boto3 is imported here, on the
    first kick or continuation, not when the function or the application starts)."""
    with _clients_lock:  # creating clients from one boto3 session is not thread-safe
        client = _clients.get(region)
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                read_timeout=READ_TIMEOUT_SECONDS,
                retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
            )
            client = boto3.client("lambda", region_name=region, config=config)
            _clients[region] = client
        return client


def reset_clients() -> None:
    """Forget the cached clients (tests, or after changing AWS settings in-process)."""
    with _clients_lock:
        _clients.clear()


def invoke_async(function: str, event: dict[str, Any], client: LambdaClient | None = None) -> None:
    """Invoke `function` (a name or an ARN) asynchronously with `event`. Raises botocore's
    errors; callers decide whether a failure matters."""
    lambda_api = client or lambda_client(region_from_arn(function))
    response = lambda_api.invoke(
        FunctionName=function,
        InvocationType="Event",
        Payload=json.dumps(event).encode("utf-8"),
    )
    status = response.get("StatusCode")
    if status != 202:
        raise RuntimeError(f"asynchronous invoke of {function} returned status {status}")


def region_from_arn(function: str) -> str | None:
    """The region of a function ARN (arn:aws:lambda:REGION:ACCOUNT:function:NAME), else None."""
    parts = function.split(":")
    if len(parts) >= 7 and parts[0] == "arn" and parts[2] == "lambda" and parts[3]:
        return parts[3]
    return None
