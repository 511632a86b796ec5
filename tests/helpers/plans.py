"""Reading EXPLAIN (FORMAT JSON) plans in tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, sub-plans and CTEs included."""
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from plan_nodes(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from plan_nodes(value)
