"""One name per statement: each statement in sql/*.sql is run by the pgdrain.db.store function of
the same name (and that function does run it, itself or through the function `<name>_statement`
that builds it to be sent with another: store.Statement), that function reads the result the way the
statement's shape tag says, every statement is used outside its own definition, and every name
the code asks for exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pgdrain.db.sql import query_names, statements

ROOT = Path(__file__).resolve().parents[2]
HANDLER = ROOT / "handler"
STORE = HANDLER / "pgdrain" / "db" / "store"  # the package: the only code that runs them
STORE_FILES = set(STORE.glob("*.py"))
QUERY_CALL = re.compile(r"""\bquery\(\s*["'](\w+)["']\s*\)""")
# Code whose calls of a store function make its statement used; a test calling it does not
# (it would keep a statement nothing runs alive). The benchmarks, the simulator and the tests
# also run some statements themselves, by name (query("...")), to measure or to race them.
CALLERS = (HANDLER, ROOT / "bench", ROOT / "sim")
BY_NAME = (ROOT / "bench", ROOT / "sim", ROOT / "tests")


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


def _store_functions(source: str | None = None) -> dict[str, ast.FunctionDef]:
    if source is None:
        source = "\n".join(p.read_text(encoding="utf-8") for p in sorted(STORE_FILES))
    tree = ast.parse(source)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _store_names_used(tree: ast.AST) -> set[str]:
    """The store functions code outside store.py calls or passes on: `store.job_fail(...)`,
    `session.run(store.job_fail, ...)`, or imported by name from pgdrain.db.store."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "store"
        ):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == "pgdrain.db.store":
            names |= {alias.name for alias in node.names}
    return names


def _unused(
    names: list[str], functions: dict[str, ast.FunctionDef], outside: set[str]
) -> list[str]:
    """The statements whose store function no other store function and nothing in `outside`
    (the names used beyond store.py) refers to."""
    used = set(outside)
    for function in functions.values():
        used |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name)} - {function.name}
    return sorted(set(names) - used)


def _not_run_by_their_function(
    names: list[str], functions: dict[str, ast.FunctionDef]
) -> list[str]:
    """The statements whose store function never calls query() with its name, itself or
    through its `<name>_statement` builder, and that have no such builder either."""

    def runs(name: str) -> bool:
        builder = _builder(functions, name)
        function = functions.get(name)
        if function is None:
            return builder is not None  # only ever sent as built: the builder is its function
        if name in {n for n, _ in _query_calls(function)}:
            return True
        called = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
        return builder is not None and builder.name in called

    return sorted(name for name in names if not runs(name))


def test_only_the_store_runs_named_statements() -> None:
    outside = []
    for path in sorted(HANDLER.rglob("*.py")):
        if path in STORE_FILES:
            continue
        names = QUERY_CALL.findall(path.read_text(encoding="utf-8"))
        outside += [f"{path.relative_to(HANDLER)}: {name}" for name in names]
    assert outside == []


def test_each_statement_is_run_by_the_store_function_of_the_same_name() -> None:
    functions = _store_functions()
    misplaced = []
    for function in functions.values():
        for name, _call in _query_calls(function):
            if name != function.name.removesuffix("_statement"):
                misplaced.append(f"{function.name}() runs {name}")
    assert misplaced == []
    not_run = _not_run_by_their_function(query_names(), functions)
    assert not_run == [], "statements whose store function of the same name does not run them"


def test_every_statement_is_used_outside_its_own_definition() -> None:
    outside: set[str] = set()
    for path in {p for folder in CALLERS for p in folder.rglob("*.py")} - STORE_FILES:
        outside |= _store_names_used(ast.parse(path.read_text(encoding="utf-8")))
    for path in (p for folder in BY_NAME for p in folder.rglob("*.py")):
        outside |= set(QUERY_CALL.findall(path.read_text(encoding="utf-8")))
    assert _unused(query_names(), _store_functions(), outside) == []


CONTROL_STORE = """
def job_fail(conn):
    return conn.execute(query("job_fail")).fetchone()

def job_retry(conn):
    return None  # named after a statement, runs nothing

def job_show(conn):
    return conn.execute(query("job_show")).fetchone()

def job_find(conn):
    return job_show(conn)
"""


def test_control_a_statement_its_function_never_runs_or_no_one_calls_is_found() -> None:
    # What the checks above would pass without them: job_retry's function runs nothing, and
    # job_fail's is never called; job_show is called by another store function.
    functions = _store_functions(CONTROL_STORE)
    names = ["job_fail", "job_retry", "job_show"]
    assert _not_run_by_their_function(names, functions) == ["job_retry"]
    assert _unused(names, functions, outside=set()) == ["job_fail", "job_retry"]
    assert _unused(names, functions, outside={"job_fail", "job_retry"}) == []


def test_every_name_the_code_asks_for_exists() -> None:
    known = set(query_names())
    asked = set()
    for path in [*HANDLER.rglob("*.py"), *(HANDLER.parent / "tests").rglob("*.py")]:
        asked |= set(QUERY_CALL.findall(path.read_text(encoding="utf-8")))
    assert sorted(asked - known) == []


def _builder(functions: dict[str, ast.FunctionDef], name: str) -> ast.FunctionDef | None:
    """The function `<name>_statement` that builds the statement `name`, if there is one."""
    builder = functions.get(f"{name}_statement")
    if builder is not None and name in {n for n, _ in _query_calls(builder)}:
        return builder
    return None


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
    # A statement built to be sent with another (store.Statement) is read where it is built.
    readers = {name: _builder(functions, name) or functions[name] for name in statements()}
    wrong = {
        name: (statement.shape, _shape_read_by(readers[name]))
        for name, statement in statements().items()
        if _shape_read_by(readers[name]) != statement.shape
    }
    assert wrong == {}, "statement: (declared shape, shape the store function reads)"
