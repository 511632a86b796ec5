"""The Lambda context, as pgdrain reads it: who is running, and how much time is left."""

from __future__ import annotations

from typing import Protocol

from pgdrain.budget import Budget


class LambdaContextLike(Protocol):
    @property
    def function_name(self) -> str: ...
    @property
    def aws_request_id(self) -> str: ...
    @property
    def invoked_function_arn(self) -> str: ...
    def get_remaining_time_in_millis(self) -> int: ...


def budget_from_context(context: LambdaContextLike) -> Budget:
    """The run's budget: the context's remaining time, read afresh on every call."""
    return Budget(lambda: context.get_remaining_time_in_millis() / 1000.0)
