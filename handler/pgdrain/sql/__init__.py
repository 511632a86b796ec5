"""Load the named statements of sql/queries.sql once, and the migration files in order."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import LiteralString

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into {name: statement}; a statement runs to the next name line."""
    parts = _NAME_LINE.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"queries.sql names {name!r} twice")
        statement = body.strip().rstrip(";").strip()
        queries[name] = statement
    return queries


@cache
def _queries() -> dict[str, str]:
    text = resources.files("pgdrain").joinpath("sql/queries.sql").read_text(encoding="utf-8")
    return parse_queries(text)


def query(name: str) -> LiteralString:
    """The statement named `name`. The text comes from our own packaged file, never from input,
    which is why it may be passed to psycopg as a literal query."""
    return _queries()[name]  # type checkers see str; the text is our own packaged file


def query_names() -> list[str]:
    return sorted(_queries())


@dataclass(frozen=True)
class Migration:
    version: str  # "0001"
    name: str  # "0001_init.sql"
    sql: str


def migrations() -> list[Migration]:
    folder = resources.files("pgdrain").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = entry.name.split("_", 1)[0]
            found.append(Migration(version, entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"two migrations share a version: {versions}")
    return found
