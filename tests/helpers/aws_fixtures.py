"""Fixtures for tests that kick the drain function: moto's Lambda with the function in it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from helpers.aws import REGION, InvokeSpy, aws_environment, create_function, mocked_aws


@pytest.fixture
def lambda_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's Lambda with the drain function in it, and a client of it."""
    import boto3

    aws_environment(monkeypatch)
    with mocked_aws():
        create_function()
        yield boto3.client("lambda", region_name=REGION)


@pytest.fixture
def spy(lambda_api: Any) -> InvokeSpy:
    """The Invoke calls made through `lambda_api`."""
    recorder = InvokeSpy()
    recorder.attach(lambda_api)
    return recorder
