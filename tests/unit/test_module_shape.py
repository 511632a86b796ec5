"""The run's modules stay readable in one sitting: no class in runner/drain.py,
runner/claiming.py or aws/run.py grows past MAX_CLASS_LINES, and no function or method there past
MAX_FUNCTION_LINES (docstrings and comments count: they are read too). A part that outgrows
this belongs in a unit of its own (stop.py, heartbeat.py, attempts.py), not in the loop. And
CONTRIBUTING.md's "where things live" table names every module a newcomer may open, while
docs/architecture.md stays a five-minute read (at most MAX_ARCHITECTURE_WORDS words)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "handler" / "pgdrain"
WATCHED = ("runner/drain.py", "runner/claiming.py", "aws/run.py")
MAX_CLASS_LINES = 160
MAX_FUNCTION_LINES = 60
MAX_ARCHITECTURE_WORDS = 1500  # as `wc -w` counts them


def _too_long(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            limit = MAX_CLASS_LINES
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            limit = MAX_FUNCTION_LINES
        else:
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > limit:
            found.append(f"{node.name}: {lines} lines (at most {limit})")
    return found


@pytest.mark.parametrize("module", WATCHED)
def test_no_class_or_function_outgrows_its_limit(module: str) -> None:
    assert _too_long((PACKAGE / module).read_text(encoding="utf-8")) == []


def test_control_a_long_method_and_a_long_class_are_found() -> None:
    body = "\n".join(f"        x = {i}" for i in range(MAX_FUNCTION_LINES))
    source = f"class Run:\n    def loop(self) -> None:\n{body}\n"
    assert _too_long(source) == [f"loop: {MAX_FUNCTION_LINES + 1} lines (at most 60)"]
    methods = "\n".join(f"    def m{i}(self) -> None:\n        pass" for i in range(80))
    assert _too_long(f"class Run:\n{methods}\n") == ["Run: 161 lines (at most 160)"]


def _section(text: str, heading: str) -> str:
    """The part of a Markdown text under `heading`, up to the next heading of its level."""
    level = heading.split(" ", 1)[0] + " "
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(level)), len(lines))
    return "\n".join(lines[start:end])


def test_contributing_names_every_module_where_things_live() -> None:
    """Every module file but __init__.py is named, in backticks, by its path relative to
    handler/pgdrain, in CONTRIBUTING.md's "where things live" table; the scaffold (the files
    `pgdrain init` writes, not modules of the package) by its folder. Modules the table names
    that do not exist yet are allowed."""
    guide = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    table = _section(guide, "## Where things live")
    modules = [
        p.relative_to(PACKAGE).as_posix()
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py"  # facades
        and not p.is_relative_to(PACKAGE / "scaffold")
    ]
    assert "`scaffold/`" in table
    assert [m for m in modules if f"`{m}`" not in table] == []


def test_the_architecture_stays_a_five_minute_read() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert len(text.split()) <= MAX_ARCHITECTURE_WORDS
