"""The shape of the package: the layers import only the layers below them, the core imports no
AWS code, AWS lives in pgdrain.aws, and the import graph between pgdrain's modules has no cycle
(function-level imports included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "handler" / "pgdrain"
AWS_MODULES = ("boto3", "botocore", "aws_lambda_powertools", "mypy_boto3_lambda", "pgdrain.aws")
# The commands and the demo are applications of the library: they may reach the edge (`pgdrain
# invoke`, a secret's ARN), and so may the dashboard (Powertools' event handler routes its
# requests). Everything else is the core and must run under any trigger.


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# scaffold/ holds the files `pgdrain init` writes into a user's project (its Lambda entry point
# and jobs module): data the package ships, never imported as part of it.
SCAFFOLD = PACKAGE / "scaffold"
MODULES = {
    _module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if not p.is_relative_to(SCAFFOLD)
}
CORE = sorted(
    m
    for m in MODULES
    if not m.startswith(("pgdrain.aws", "pgdrain.cli", "pgdrain.ui")) and m != "pgdrain"
)


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
            # `from pgdrain.db import store` imports pgdrain.db.store; the package's own
            # __init__ only for a name that is not a module of it.
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= submodules
            if not submodules <= set(MODULES):
                found.add(node.module)
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
    graph = {
        "pgdrain.cli.commands": {"pgdrain.cli.demo"},
        "pgdrain.cli.demo": {"pgdrain.cli.commands"},
        "x": set(),
    }
    assert _cycle(graph) == ["pgdrain.cli.commands", "pgdrain.cli.demo", "pgdrain.cli.commands"]


# The import contract, layer by layer (docs/architecture.md): a layer may import itself and
# those listed. The foundation is the few modules every layer shares.
LAYER_MAY_IMPORT = {
    "foundation": {"foundation"},
    "db": {"foundation", "db"},
    "api": {"foundation", "db", "api"},
    "runner": {"foundation", "db", "api", "runner"},
    "aws": {"foundation", "db", "api", "runner", "aws"},
    # The dashboard reads and acts through the store; on AWS it reads its secret at the edge.
    "ui": {"foundation", "db", "aws", "ui"},
    "cli": {"foundation", "db", "api", "runner", "aws", "ui", "cli"},
    # pgdrain.kick is public and lives at the edge: the facade loads it on first use.
    "facade": {"foundation", "api", "runner", "aws", "facade"},
}
FOUNDATION = {
    "pgdrain.errors",
    "pgdrain.settings",
    "pgdrain.budget",
    "pgdrain.controls",
    "pgdrain._moved",
}


def _layer(module: str) -> str:
    if module in ("pgdrain", "pgdrain.outcomes"):  # the package's API, and DESIGN.md's name
        return "facade"
    if module in FOUNDATION:
        return "foundation"
    layer = module.split(".")[1]
    assert layer in LAYER_MAY_IMPORT, f"{module} belongs to no layer"
    return layer


def _crossings(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a layer its importer may not import."""
    return sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        for imported in imports
        if _layer(imported) not in LAYER_MAY_IMPORT[_layer(module)]
    )


def test_each_layer_imports_only_the_layers_below_it() -> None:
    assert _crossings({m: _internal_edges(m) for m in MODULES}) == []


def test_control_a_crossing_is_found() -> None:
    graph = {
        "pgdrain.db.session": {"pgdrain.runner.summary"},  # the database reaching up
        "pgdrain.runner.drain": {"pgdrain.cli.report"},  # anything importing the CLI
        "pgdrain.aws.run": {"pgdrain.runner.drain"},  # allowed
        "pgdrain.ui.app": {"pgdrain.cli.report"},  # the dashboard reaching for the CLI's code
        "pgdrain.aws.control": {"pgdrain.ui.pages"},  # a run depending on the dashboard
        "pgdrain.cli.commands": {"pgdrain.ui.local"},  # allowed: `pgdrain ui`
    }
    assert _crossings(graph) == [
        "pgdrain.aws.control -> pgdrain.ui.pages",
        "pgdrain.db.session -> pgdrain.runner.summary",
        "pgdrain.runner.drain -> pgdrain.cli.report",
        "pgdrain.ui.app -> pgdrain.cli.report",
    ]


def test_every_module_lies_in_a_layer_that_ls_shows() -> None:
    top = sorted(p.name for p in PACKAGE.iterdir() if not p.name.startswith("__"))
    assert top == [
        "_moved.py",
        "api",
        "aws",
        "budget.py",
        "cli",
        "controls.py",
        "db",
        "errors.py",
        "outcomes.py",  # the facade's: DESIGN.md's name for the job outcomes
        "py.typed",
        "runner",
        "scaffold",  # not a layer: the files `pgdrain init` writes
        "settings.py",
        "ui",
    ]
