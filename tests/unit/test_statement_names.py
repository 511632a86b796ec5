"""One name per statement: each statement in queries.sql is run by the pgdrain.store function of
the same name, that function reads the result the way the statement's shape tag says, every
statement is used, and every name the code asks for exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pgdrain.sql import query_names, statements

HANDLER = Path(__file__).resolve().parents[2] / "handler"
STORE = HANDLER / "pgdrain" / "store.py"
QUERY_CALL = re.compile(r"""\bquery\(\s*["'](\w+)["']\s*\)""")


def _query_calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    calls = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "query"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            calls.append((node.args[0].value, node))
    return calls


def _store_functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(STORE.read_text(encoding="utf-8"))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_only_the_store_runs_named_statements() -> None:
    outside = []
    for path in sorted(HANDLER.rglob("*.py")):
        if path == STORE:
            continue
        names = QUERY_CALL.findall(path.read_text(encoding="utf-8"))
        outside += [f"{path.relative_to(HANDLER)}: {name}" for name in names]
    assert outside == []


def test_each_statement_is_run_by_the_store_function_of_the_same_name() -> None:
    functions = _store_functions()
    misplaced = []
    for function in functions.values():
        for name, _call in _query_calls(function):
            if name != function.name:
                misplaced.append(f"{function.name}() runs {name}")
    assert misplaced == []
    missing = sorted(set(query_names()) - set(functions))
    assert missing == [], f"statements no store function runs: {missing}"


def test_every_name_the_code_asks_for_exists() -> None:
    known = set(query_names())
    asked = set()
    for path in [*HANDLER.rglob("*.py"), *(HANDLER.parent / "tests").rglob("*.py")]:
        asked |= set(QUERY_CALL.findall(path.read_text(encoding="utf-8")))
    assert sorted(asked - known) == []


def _shape_read_by(function: ast.FunctionDef) -> str:
    """How a store function reads its statement's result."""
    source = ast.unparse(function)
    if ".fetchone()" in source:
        return "one"
    if ".fetchall()" in source or "_fenced(" in source:
        return "many"
    if ".rowcount" in source:
        return "rowcount"
    return "exec"


def test_each_store_function_reads_the_shape_its_statement_declares() -> None:
    functions = _store_functions()
    wrong = {
        name: (statement.shape, _shape_read_by(functions[name]))
        for name, statement in statements().items()
        if _shape_read_by(functions[name]) != statement.shape
    }
    assert wrong == {}, "statement: (declared shape, shape the store function reads)"
