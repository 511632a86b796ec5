"""JSON from outside (payloads, events) with bounded size and nesting depth.

Python's json module recurses once per nesting level: a few thousand `[` make json.loads and
json.dumps raise RecursionError, a traceback rather than a one-line refusal. So the depth is
measured first without recursion (on the text before parsing, on the value before encoding),
and anything past MAX_DEPTH is refused as bad input."""

from __future__ import annotations

import json
import re
from typing import Any

from pgdrain.errors import BadInput

# Real payloads and events nest a handful of levels; PostgreSQL's jsonb accepts far more, but
# a limit this low keeps every later json.dumps/loads of the value well inside the recursion
# limit too.
MAX_DEPTH = 64

# A JSON string (with its escapes), or one bracket. Strings are matched whole so that the
# brackets inside them are skipped; an unterminated one runs to the end of the text, without
# backtracking (`*+`), so that no text makes the scan quadratic.
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)


def text_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep the brackets of JSON text nest, counting no further than limit + 1. Text
    that is not JSON gets some number: json.loads refuses it afterwards."""
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif token in "]}":
            depth -= 1
    return deepest


def value_depth(value: object, limit: int = MAX_DEPTH) -> int:
    """How deep lists and dicts nest in a Python value, walked with an explicit stack
    (no recursion), counting no further than limit + 1 (so a cycle ends the walk too)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def check_value_depth(value: object, what: str, limit: int = MAX_DEPTH) -> None:
    if value_depth(value, limit) > limit:
        raise BadInput(f"{what} nests deeper than {limit} levels")


def loads(text: str, what: str, limit: int = MAX_DEPTH) -> Any:
    """json.loads, refusing text that nests deeper than `limit`, is not JSON, or holds an
    integer longer than Python converts (sys.get_int_max_str_digits(): 4300 digits by default;
    json.loads raises a plain ValueError for it): BadInput, one line."""
    if text_depth(text, limit) > limit:
        raise BadInput(f"{what} nests deeper than {limit} levels")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeError) as exc:
        raise BadInput(f"{what} is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer past Python's int-string limit (4300 digits)
        raise BadInput(f"{what} cannot be read: {exc}") from None


# JSON's escape of NUL: "\u0000" after an even number of backslashes (an odd number is an
# escaped backslash followed by the text "u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def holds_nul(text: str) -> bool:
    """Whether JSON text (json.dumps') holds a NUL character, which PostgreSQL's jsonb refuses;
    not the six characters \\u0000 of a text that holds a backslash then u0000."""
    return _NUL_ESCAPE.search(text) is not None
