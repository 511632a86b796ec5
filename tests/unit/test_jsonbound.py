"""pgdrain.api.jsonbound: JSON from outside is refused past MAX_DEPTH levels, measured without
recursion, before json.loads/json.dumps would raise RecursionError."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgdrain.api import jsonbound
from pgdrain.errors import BadInput

LIMIT = jsonbound.MAX_DEPTH


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ("[]", 1),
        ('{"a": [1, {"b": 2}]}', 3),
        ('{"a": "[[[{{{"}', 1),  # brackets inside a string do not count
        ('["\\"[", [[]]]', 3),  # nor after an escaped quote
        ('"unterminated [[[', 0),
    ],
)
def test_text_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert jsonbound.text_depth(text) == depth


def test_the_limit_itself_is_accepted_one_more_is_refused() -> None:
    assert jsonbound.loads(json.dumps(nested(LIMIT)), "x") == nested(LIMIT)
    with pytest.raises(BadInput, match=f"x nests deeper than {LIMIT} levels"):
        jsonbound.loads(json.dumps(nested(LIMIT + 1)), "x")
    jsonbound.check_value_depth(nested(LIMIT), "x")
    with pytest.raises(BadInput, match=f"x nests deeper than {LIMIT} levels"):
        jsonbound.check_value_depth(nested(LIMIT + 1), "x")


def test_a_hundred_thousand_levels_are_refused_in_one_line() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(BadInput, match="nests deeper"):
        jsonbound.loads(deep, "x")
    with pytest.raises(BadInput, match="nests deeper"):
        jsonbound.check_value_depth(nested(100_000), "x")


def test_control_without_the_bound_json_raises_recursion_error() -> None:
    """The same input with the bound switched off (a limit no input reaches)."""
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(RecursionError):
        jsonbound.loads(deep, "x", limit=10**9)
    with pytest.raises(RecursionError):
        json.dumps(nested(100_000))


def test_a_cycle_ends_the_walk() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(BadInput, match="nests deeper"):
        jsonbound.check_value_depth(cycle, "x")


def test_invalid_json_is_one_line() -> None:
    with pytest.raises(BadInput, match="x is not valid JSON"):
        jsonbound.loads('{"a": ', "x")


HUGE_INTEGER = '{"n": ' + "9" * 5_000 + "}"  # valid JSON; Python converts at most 4300 digits


def test_an_integer_past_pythons_digit_limit_is_one_line() -> None:
    with pytest.raises(BadInput, match="x cannot be read: Exceeds the limit") as refused:
        jsonbound.loads(HUGE_INTEGER, "x")
    assert "\n" not in str(refused.value)


def test_control_json_raises_a_plain_value_error_for_it() -> None:
    """Why `loads` catches ValueError: json.loads raises one that is not a JSONDecodeError, so
    catching only JSONDecodeError and UnicodeError (as before) let it escape as a traceback."""
    with pytest.raises(ValueError, match="integer string conversion") as raised:
        json.loads(HUGE_INTEGER)
    assert not isinstance(raised.value, json.JSONDecodeError | UnicodeError)
