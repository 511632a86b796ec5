"""The shape of the package: the core imports no AWS code, AWS lives in pgdrain.aws, and the
import graph between pgdrain's modules has no cycle (function-level imports included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "handler" / "pgdrain"
AWS_MODULES = ("boto3", "botocore", "aws_lambda_powertools", "mypy_boto3_lambda", "pgdrain.aws")
# The commands and the demo are applications of the library: they may reach the edge (`pgdrain
# invoke`, a secret's ARN). Everything else is the core and must run under any trigger.
APPLICATIONS = {"pgdrain.cli", "pgdrain.demo", "pgdrain"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
CORE = sorted(m for m in MODULES if not m.startswith("pgdrain.aws") and m not in APPLICATIONS)


def _imports(module: str) -> set[str]:
    """Every module `module` imports, anywhere in its body (TYPE_CHECKING blocks excluded:
    they never run)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _internal_edges(module: str) -> set[str]:
    return {m for m in _imports(module) if m in MODULES and m != module and m != "pgdrain"}


def _is_aws(name: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in AWS_MODULES)


@pytest.mark.parametrize("module", CORE)
def test_the_core_imports_no_aws_code(module: str) -> None:
    assert sorted(m for m in _imports(module) if _is_aws(m)) == []


def test_control_the_check_sees_an_aws_import_inside_a_function() -> None:
    # The edge's modules do import AWS code: the same check must find it there.
    assert any(_is_aws(m) for m in _imports("pgdrain.aws.kick"))
    assert any(_is_aws(m) for m in _imports("pgdrain.aws.secrets"))


def test_importing_the_core_loads_no_aws_library() -> None:
    """At run time too: importing every core module (and so the package's facade) leaves
    boto3, botocore, Powertools and pgdrain.aws unloaded (a fresh interpreter, so nothing else
    loaded them first). The facade's pgdrain.kick loads pgdrain.aws.kick on first use only."""
    code = (
        "import importlib, sys\n"
        f"for name in {CORE!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {AWS_MODULES[:3]!r}\n"
        "    or m == 'pgdrain.aws' or m.startswith('pgdrain.aws.')))\n"
    )
    assert _fresh_python(code).strip() == "[]"


def test_control_pgdrain_kick_still_works_and_loads_the_edge_when_used() -> None:
    code = (
        "import sys, pgdrain\n"
        "assert 'pgdrain.aws.kick' not in sys.modules and 'kick' in pgdrain.__all__\n"
        "from pgdrain import kick\n"
        "print(kick.__module__, 'pgdrain.aws.kick' in sys.modules)\n"
    )
    assert _fresh_python(code).split() == ["pgdrain.aws.kick", "True"]


def _fresh_python(code: str) -> str:
    """What `code` prints in a fresh interpreter that finds only the package."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(PACKAGE.parent)},
    ).stdout


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycle({m: _internal_edges(m) for m in MODULES}) is None


def test_control_a_cycle_through_a_function_level_import_is_found() -> None:
    # cli and demo used to import each other inside functions: the shape this test forbids.
    graph = {"pgdrain.cli": {"pgdrain.demo"}, "pgdrain.demo": {"pgdrain.cli"}, "x": set()}
    assert _cycle(graph) == ["pgdrain.cli", "pgdrain.demo", "pgdrain.cli"]
