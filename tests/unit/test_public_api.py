"""What `pgdrain` exports, pinned as httpx's tests/test_exported_members.py pins its own, so that
no refactor changes it by accident: `__all__` is exactly the list below, each of its names
imports from the package, every `pgdrain.<name>` the README and docs/ show in code exists,
and the module names moved in the layout by layer still import, for one release, as the same
module objects as their new names, with a DeprecationWarning."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import pgdrain
from pgdrain._moved import MOVED

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Changing this list changes the public API: say so in CHANGELOG.md.
EXPORTED = [
    "BadInput",
    "Budget",
    "Cancel",
    "ConfigError",
    "DatabaseUnavailable",
    "Discard",
    "DrainResult",
    "Job",
    "JobOutcome",
    "PgdrainError",
    "Registry",
    "RetryIn",
    "RetryPolicy",
    "Settings",
    "Snooze",
    "Workflow",
    "build_job",
    "drain",
    "enqueue",
    "enqueue_many",
    "enqueue_statement",
    "job_state",
    "kick",
    "next_periodic_slot",
    "outcomes",
    "pause_queue",
    "resume_queue",
    "workflow",
]


def _unpinned(exported: Sequence[str]) -> tuple[list[str], list[str]]:
    """(names exported but not pinned, names pinned but not exported)."""
    return sorted(set(exported) - set(EXPORTED)), sorted(set(EXPORTED) - set(exported))


def test_all_is_the_pinned_list() -> None:
    assert EXPORTED == sorted(EXPORTED)
    assert _unpinned(pgdrain.__all__) == ([], [])
    assert pgdrain.__all__ == EXPORTED  # in that order, once each


def test_control_a_name_added_to_or_removed_from_all_is_caught() -> None:
    assert _unpinned([*pgdrain.__all__, "Worker"]) == (["Worker"], [])
    assert _unpinned([n for n in pgdrain.__all__ if n != "enqueue"]) == ([], ["enqueue"])


@pytest.mark.parametrize("name", EXPORTED)
def test_every_exported_name_imports_from_the_package(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from pgdrain import {name}", namespace)
    assert namespace[name] is getattr(pgdrain, name)


# -- the names the documentation shows -----------------------------------------------------------

CODE_BLOCK = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# Outside Python blocks `pgdrain.<name>` is also a table (`pgdrain.jobs`) or the loggers
# (`pgdrain.*`): a name of the package is one that is called, or a class (capitalised). SQL
# blocks name the schema's tables and functions only.
PACKAGE_NAME = re.compile(r"\bpgdrain\.(\w+\(|[A-Z]\w*)")
FROM_IMPORT = re.compile(r"\bfrom pgdrain import ([\w, ]+)")


def mentioned(markdown: str) -> set[str]:
    """The names of the package a Markdown text shows in code: `pgdrain.<name>` and
    `from pgdrain import <name>, ...`, in its Python blocks, its other blocks and its spans."""
    names: set[str] = set()
    for block in CODE_BLOCK.finditer(markdown):
        if block["lang"] in ("python", "py"):
            names |= _in_python(block["body"])
        elif block["lang"] != "sql":
            names |= _in_text(block["body"])
    for span in CODE_SPAN.findall(CODE_BLOCK.sub("", markdown)):
        names |= _in_text(span)
    return names


def _in_python(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "pgdrain"
        ):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == "pgdrain" and not node.level:
            names |= {alias.name for alias in node.names}
    return names


def _in_text(text: str) -> set[str]:
    names = {m.removesuffix("(") for m in PACKAGE_NAME.findall(text)}
    for imported in FROM_IMPORT.findall(text):
        names |= {n.strip() for n in imported.split(",") if n.strip()}
    return names


def test_the_documentation_shows_the_api_in_code() -> None:
    """The scan finds what the README's quick start uses (else the test below checks nothing)."""
    assert {"Registry", "enqueue", "kick"} <= mentioned((ROOT / "README.md").read_text())


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_name_the_documentation_shows_exists(document: Path) -> None:
    missing = sorted(n for n in mentioned(document.read_text()) if not hasattr(pgdrain, n))
    assert missing == [], f"{document.name} shows pgdrain.{missing[0]}, which does not exist"


def test_control_a_name_the_package_lacks_is_found_and_a_table_is_not() -> None:
    text = (
        "```python\nimport pgdrain\npgdrain.enqueu(conn, 'k')\nfrom pgdrain import Worker\n```\n"
        "Call `pgdrain.kik(conn)` or `pgdrain.Reg`; the rows are in `pgdrain.jobs`.\n"
        "```sql\nSELECT * FROM pgdrain.jobs WHERE run_at < pgdrain.rate_window(60)\n```\n"
    )
    assert mentioned(text) == {"enqueu", "Worker", "kik", "Reg"}
    assert not any(hasattr(pgdrain, n) for n in mentioned(text))


# -- the module names moved in the layout by layer -------------------------------------------------

# Imports each old name in turn (first use in this interpreter) and says what it gave.
IMPORT_OLD_NAMES = """
import importlib, json, sys, warnings
results = {}
for old, new in json.loads(sys.argv[1]).items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    results[old] = {
        "same": module is importlib.import_module(new),
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    }
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def old_names() -> dict[str, dict[str, object]]:
    """What each old module name gave, imported in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_OLD_NAMES, json.dumps(MOVED)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT / "handler")},
    )
    results: dict[str, dict[str, object]] = json.loads(done.stdout)
    return results


@pytest.mark.parametrize(("old", "new"), MOVED.items())
def test_an_old_module_name_gives_the_new_module_and_warns(
    old_names: dict[str, dict[str, object]], old: str, new: str
) -> None:
    # pgdrain.enqueue and pgdrain.drain are functions too: those two module names are
    # registered at import (no warning), so that importing them never rebinds the function.
    shadowed = old.rpartition(".")[2] in ("enqueue", "drain")
    warning = f"DeprecationWarning: {old} is now {new}; the old name goes in the next release"
    assert old_names[old] == {"same": True, "warnings": [] if shadowed else [warning]}


def test_an_old_module_name_leaves_the_functions_of_the_same_name() -> None:
    code = (
        "import pgdrain, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import pgdrain.enqueue, pgdrain.drain\n"
        "print(callable(pgdrain.enqueue), callable(pgdrain.drain))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT / "handler")},
    )
    assert done.stdout.split() == ["True", "True"]


def test_the_outcomes_module_is_public_under_its_design_name() -> None:
    """DESIGN.md names `outcomes` in the package's API: no warning, whichever way imported, and
    a module file of its own, which type checkers find (a review's report)."""
    code = (
        "import pgdrain.outcomes\n"
        "from pgdrain import outcomes\n"
        "from pgdrain.outcomes import RetryIn\n"
        "import pgdrain.api.outcomes as new\n"
        "print(pgdrain.outcomes is outcomes, RetryIn is new.RetryIn)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "handler")},
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "True True\n", "")
    assert (ROOT / "handler" / "pgdrain" / "outcomes.py").is_file()
