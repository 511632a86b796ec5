"""Load the named statements of sql/*.sql once (hot_path, control_plane, operator_commands,
worker) and the migration files in order.

Each statement stands under `-- name: NAME :SHAPE`; SHAPE says what it gives back (one row at
most, many rows, a row count, nothing), as River's `:one`/`:many` tags do."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Literal, LiteralString, NamedTuple, cast, get_args

Shape = Literal["one", "many", "rowcount", "exec"]
SHAPES: tuple[str, ...] = get_args(Shape)

_NAME_LINE = re.compile(r"^-- name: (\w+)(?: :(\w+))?[ \t]*$", re.MULTILINE)
# A bound parameter, as psycopg writes it: %(name)s, or %(name)b where the value is sent in
# binary (the hot path's arrays of ids and tokens: no quoting, no parsing of text).
PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


class Statement(NamedTuple):
    name: str
    shape: Shape
    text: str


def parse_statements(text: str) -> dict[str, Statement]:
    """Split a queries file into {name: Statement}; a statement runs to the next name line."""
    parts = _NAME_LINE.split(text)
    statements: dict[str, Statement] = {}
    for name, shape, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if name in statements:
            raise ValueError(f"the statement files name {name!r} twice")
        if shape not in SHAPES:
            raise ValueError(
                f"{name!r} needs a shape after its name, one of "
                + ", ".join(f":{s}" for s in SHAPES)
            )
        text = _without_comment_lines(body).strip().rstrip(";").strip()
        statements[name] = Statement(name, cast(Shape, shape), text)
    return statements


def _without_comment_lines(body: str) -> str:
    """The statement as it is sent: the comments stay in the .sql files. Shorter to send and to
    parse, and psycopg caches its conversion of a statement only up to 4 KB: the claim, with
    its comments, is longer than that."""
    return "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))


def parse_queries(text: str) -> dict[str, str]:
    """{name: statement text} of a queries file."""
    return {name: s.text for name, s in parse_statements(text).items()}


# The statement files, by what they serve (as db/store/ is split).
QUERY_FILES = ("hot_path.sql", "control_plane.sql", "operator_commands.sql", "worker.sql")


def queries_text() -> str:
    """Every statement file, one after the other."""
    folder = resources.files("pgdrain.db").joinpath("sql")
    return "\n".join(folder.joinpath(name).read_text(encoding="utf-8") for name in QUERY_FILES)


@cache
def statements() -> dict[str, Statement]:
    return parse_statements(queries_text())


def query(name: str) -> LiteralString:
    """The statement named `name`. The text comes from our own packaged file, never from input,
    which is why it may be passed to psycopg as a literal query."""
    return statements()[name].text  # type checkers see str; the text is our own packaged file


def name_of(text: str) -> str | None:
    """The name of the statement whose text this is (None: not one of ours)."""
    return _names_by_text().get(text)


@cache
def _names_by_text() -> dict[str, str]:
    return {s.text: name for name, s in statements().items()}


def query_names() -> list[str]:
    return sorted(statements())


class Migration(NamedTuple):
    version: str  # "0001"
    name: str  # "0001_init.sql"
    sql: str


def migrations() -> list[Migration]:
    folder = resources.files("pgdrain.db").joinpath("sql/migrations")
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
